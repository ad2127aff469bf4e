#include "tensor_store/local_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_token.h"
#include "common/limits.h"
#include "common/local_peer.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "ptc/region_proto.h"
#include "tensor_store/internal/unix_socket.h"

namespace ptc {
namespace {

using store_internal::ReceivePacket;
using store_internal::SendPacket;

Counter& local_puts_total = GetCounter("ptc_store_local_puts_total");
Counter& local_maps_total = GetCounter("ptc_store_local_maps_total");
Counter& local_bytes_in_total = GetCounter("ptc_store_local_bytes_in_total");

// When each of a connection's pending puts must be committed by, in that
// order: a request looks at the expired ones only. (Walking every pending
// put at every request made a save of N regions cost N^2 steps: the
// largest part of a hollow host's own CPU at a save after zeroing
// buffers.)
class PutDeadlines {
 public:
  void Set(uint64_t handle, absl::Time at) {
    Erase(handle);
    at_.emplace(handle, at);
    order_.emplace(at, handle);
  }
  void Erase(uint64_t handle) {
    auto it = at_.find(handle);
    if (it == at_.end()) return;
    order_.erase({it->second, handle});
    at_.erase(it);
  }
  // Removes and returns the puts due by `now`.
  std::vector<uint64_t> TakeExpired(absl::Time now) {
    std::vector<uint64_t> due;
    while (!order_.empty() && order_.begin()->first <= now) {
      due.push_back(order_.begin()->second);
      at_.erase(order_.begin()->second);
      order_.erase(order_.begin());
    }
    return due;
  }

 private:
  std::map<uint64_t, absl::Time> at_;
  std::set<std::pair<absl::Time, uint64_t>> order_;
};

}  // namespace

// A pack's puts are committed in one CommitPuts.
static_assert(kMaxPackRegions <= store_internal::kMaxCommitPuts);

struct LocalServer::Connection {
  uint64_t id = 0;
  int fd = -1;
  uid_t uid = 0;
  pid_t pid = 0;
  // With require_job_token: the job this connection's token allows (set
  // by its Hello); empty until then.
  std::string job;
  // Why this connection is refused (empty: it is not), and the code it is
  // told.
  std::string refusal;
  absl::StatusCode refusal_code = absl::StatusCode::kPermissionDenied;
  // Only the connection's own thread touches these.
  std::map<uint64_t, std::unique_ptr<PendingPut>> puts;
  PutDeadlines put_deadlines;
  std::map<uint64_t, std::shared_ptr<RegionBuffer>> leases;
  // Puts allocated together (AllocatePuts) share a pack, sealed whole by
  // the first commit of any of them: handle -> pack, pack -> its puts
  // still pending.
  std::map<uint64_t, uint64_t> pack_of;
  std::map<uint64_t, int> pack_pending;

  // Forgets a put that is pending no more (committed, aborted, expired).
  void ErasePut(uint64_t handle) {
    puts.erase(handle);
    put_deadlines.Erase(handle);
    auto p = pack_of.find(handle);
    if (p == pack_of.end()) return;
    if (--pack_pending[p->second] == 0) pack_pending.erase(p->second);
    pack_of.erase(p);
  }
  // FAILED_PRECONDITION unless every pending put of each pack among
  // `handles` (pending puts of this connection) is among them: a pack is
  // sealed whole, so none of its puts may be left to be written after.
  absl::Status CheckWholePacks(const std::vector<uint64_t>& handles) const {
    std::map<uint64_t, int> named;
    for (uint64_t h : handles) {
      auto p = pack_of.find(h);
      if (p != pack_of.end()) ++named[p->second];
    }
    for (const auto& [pack, n] : named) {
      const int pending = pack_pending.at(pack);
      if (n != pending) {
        return absl::FailedPreconditionError(absl::StrCat(
            "a pack of regions allocated together (AllocatePuts) is sealed "
            "whole at its first commit; commit all ",
            pending, " of its pending puts in one CommitPuts (", n,
            " were named)"));
      }
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<LocalServer>> LocalServer::Start(
    Store* store, LocalServerOptions options) {
  PTC_ASSIGN_OR_RETURN(const int fd,
                       ListenLocal(options.socket_path, SOCK_SEQPACKET,
                                   {.allowed_uids = options.allowed_uids,
                                    .allowed_gid = options.allowed_gid}));
  std::unique_ptr<LocalServer> server(
      new LocalServer(store, std::move(options), fd));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  Log("tensor_store")
      ->info("local socket {} ready", server->options_.socket_path);
  return server;
}

LocalServer::~LocalServer() { Stop(); }

void LocalServer::Stop() {
  if (stopping_.exchange(true)) return;
  shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  std::map<uint64_t, std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, conn] : connections_) shutdown(conn->fd, SHUT_RDWR);
    threads.swap(threads_);
  }
  for (auto& [id, t] : threads) t.join();
  unlink(options_.socket_path.c_str());
}

void LocalServer::ReapFinished() {
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : finished_) {
      auto it = threads_.find(id);
      if (it != threads_.end()) {
        done.push_back(std::move(it->second));
        threads_.erase(it);
      }
    }
    finished_.clear();
  }
  for (std::thread& t : done) t.join();
}

void LocalServer::AcceptLoop() {
  while (!stopping_) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    ReapFinished();
    if (fd < 0) {
      if (stopping_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        // Out of descriptors or memory for now: clients that leave free
        // some; keep serving instead of giving up the socket for good.
        Log("tensor_store")
            ->warn("accept on the local socket: {}; retrying in 100 ms",
                   std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      Log("tensor_store")
          ->error("accept on the local socket: {}", std::strerror(errno));
      return;
    }
    auto conn = std::make_shared<Connection>();
    conn->id = next_id_++;
    conn->fd = fd;
    const LocalPeer peer = IdentifyLocalPeer(fd);
    conn->uid = peer.uid;
    conn->pid = peer.pid;
    std::string refusal = RefusalOf(peer, fd,
                                    {.allowed_uids = options_.allowed_uids,
                                     .allowed_gid = options_.allowed_gid});
    const bool allowed = refusal.empty();
    if (allowed && clients_.load() >= options_.max_clients) {
      conn->refusal_code = absl::StatusCode::kResourceExhausted;
      conn->refusal = absl::StrCat(
          "this ptcd serves ", options_.max_clients,
          " local clients at once; connect again when some have left");
    } else if (!allowed) {
      conn->refusal = std::move(refusal);
      Log("tensor_store")
          ->warn("refused local client pid {} uid {}", conn->pid, conn->uid);
    }
    // Refusals are explained by a short-lived thread each; a flood of them
    // is just closed.
    if (!conn->refusal.empty() && refusing_.fetch_add(1) >= kMaxRefusing) {
      refusing_.fetch_sub(1);
      close(fd);
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    connections_[conn->id] = conn;
    threads_[conn->id] = std::thread([this, conn] { Serve(conn); });
  }
}

void LocalServer::Serve(std::shared_ptr<Connection> conn) {
  if (!conn->refusal.empty()) {
    // Say why, and take the client's first request before closing (closing
    // with it unread would reset the connection and lose the answer).
    proto::LocalResponse denied;
    denied.set_code(static_cast<int>(conn->refusal_code));
    denied.set_answered(true);
    denied.set_message(conn->refusal);
    SendPacket(conn->fd, denied.SerializeAsString()).IgnoreError();
    struct timeval wait = {1, 0};
    setsockopt(conn->fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
    int fd_in = -1;
    ReceivePacket(conn->fd, &fd_in).IgnoreError();
    if (fd_in >= 0) close(fd_in);
    close(conn->fd);
    refusing_.fetch_sub(1);
    absl::MutexLock lock(&mu_);
    connections_.erase(conn->id);
    finished_.push_back(conn->id);
    return;
  }
  clients_.fetch_add(1);
  Log("tensor_store")
      ->debug("local client {} connected (pid {})", conn->id, conn->pid);
  // Wake up now and then to abort puts left uncommitted too long.
  const absl::Duration tick =
      std::min(absl::Seconds(1), options_.put_timeout / 4);
  struct timeval wake = absl::ToTimeval(std::max(tick, absl::Milliseconds(1)));
  setsockopt(conn->fd, SOL_SOCKET, SO_RCVTIMEO, &wake, sizeof(wake));
  while (true) {
    int fd_in = -1;
    auto packet = ReceivePacket(conn->fd, &fd_in);
    if (fd_in >= 0) close(fd_in);  // clients never send descriptors
    AbortExpiredPuts(conn.get());
    if (packet.status().code() == absl::StatusCode::kDeadlineExceeded) {
      continue;  // the wake-up, not a request
    }
    proto::LocalResponse resp;
    std::vector<int> fds_out;
    if (!packet.ok()) {
      if (packet.status().code() == absl::StatusCode::kUnavailable) break;
      resp.set_code(static_cast<int>(packet.status().code()));
      resp.set_message(std::string(packet.status().message()));
    } else {
      proto::LocalRequest req;
      if (!req.ParseFromString(*packet)) {
        resp.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
        resp.set_message("malformed local request: not a LocalRequest message");
      } else {
        resp = Handle(conn.get(), req, &fds_out);
      }
    }
    resp.set_answered(true);
    if (!SendPacket(conn->fd, resp.SerializeAsString(), fds_out).ok()) break;
  }
  const size_t aborted = conn->puts.size(), released = conn->leases.size();
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [h, p] : conn->puts) owners_.erase(h);
    for (const auto& [l, b] : conn->leases) owners_.erase(l);
    connections_.erase(conn->id);
    finished_.push_back(conn->id);
  }
  conn->puts.clear();
  conn->leases.clear();
  close(conn->fd);
  clients_.fetch_sub(1);
  Log("tensor_store")
      ->debug("local client {} left; {} puts aborted, {} mappings released",
              conn->id, aborted, released);
}

void LocalServer::AbortExpiredPuts(Connection* conn) {
  for (const uint64_t handle : conn->put_deadlines.TakeExpired(absl::Now())) {
    Log("tensor_store")
        ->warn(
            "local client {} (pid {}) did not commit put {} within {}; "
            "aborted, its memory freed",
            conn->id, conn->pid, handle,
            absl::FormatDuration(options_.put_timeout));
    conn->ErasePut(handle);
    absl::MutexLock lock(&mu_);
    owners_.erase(handle);
  }
}

absl::Status LocalServer::CheckOwner(uint64_t id, const Connection* conn,
                                     const char* what) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(id);
  if (it == owners_.end()) {
    return absl::NotFoundError(
        absl::StrCat(what, " ", id, " does not exist (or is finished)"));
  }
  if (it->second != conn->id) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " ", id, " belongs to another client connection"));
  }
  return absl::OkStatus();
}

absl::Status LocalServer::CheckPut(uint64_t handle, const Connection* conn) {
  PTC_RETURN_IF_ERROR(CheckOwner(handle, conn, "put handle"));
  // Puts and leases share one numbering: a lease is no put handle.
  if (!conn->puts.count(handle)) {
    return absl::NotFoundError(absl::StrCat("put handle ", handle,
                                            " does not exist (", handle,
                                            " is a lease from Map)"));
  }
  return absl::OkStatus();
}

absl::Status LocalServer::CheckLease(uint64_t lease, const Connection* conn) {
  PTC_RETURN_IF_ERROR(CheckOwner(lease, conn, "lease"));
  if (!conn->leases.count(lease)) {
    return absl::NotFoundError(absl::StrCat(
        "lease ", lease, " does not exist (", lease, " is a put handle)"));
  }
  return absl::OkStatus();
}

absl::Status LocalServer::CheckJob(Connection* conn,
                                   const proto::LocalRequest& req) {
  if (!options_.require_job_token) return absl::OkStatus();
  const std::string* job = nullptr;
  switch (req.op_case()) {
    case proto::LocalRequest::kHello: {
      if (req.hello().token().empty()) {
        return absl::UnauthenticatedError(
            "this ptcd admits local clients with a job token only: set "
            "PTC_JOB_TOKEN to the token the job's registration gave (ptcctl "
            "token --job JOB prints it)");
      }
      PTC_ASSIGN_OR_RETURN(std::string allowed,
                           JobOfToken(req.hello().token()));
      if (allowed != req.hello().job()) {
        return absl::PermissionDeniedError(
            absl::StrCat("the token is for job '", allowed, "', not job '",
                         req.hello().job(), "'"));
      }
      if (!conn->job.empty() && conn->job != allowed) {
        return absl::PermissionDeniedError(
            absl::StrCat("this connection acts for job '", conn->job,
                         "'; open another connection for job '", allowed, "'"));
      }
      conn->job = std::move(allowed);
      return absl::OkStatus();
    }
    case proto::LocalRequest::kAllocatePut:
      job = &req.allocate_put().job();
      break;
    case proto::LocalRequest::kAllocatePuts:
      job = &req.allocate_puts().job();
      break;
    case proto::LocalRequest::kMap:
      job = &req.map().job();
      break;
    case proto::LocalRequest::kMapMany:
      job = &req.map_many().job();
      break;
    case proto::LocalRequest::kPutSmallObject:
      job = &req.put_small_object().job();
      break;
    case proto::LocalRequest::kGetSmallObject:
      job = &req.get_small_object().job();
      break;
    case proto::LocalRequest::kDeclare:
      job = &req.declare().job();
      break;
    case proto::LocalRequest::kCommitPut:
    case proto::LocalRequest::kCommitPuts:
    case proto::LocalRequest::kAbortPut:
    case proto::LocalRequest::kRelease:
      // Handles and leases: CheckOwner ties them to this connection.
      return absl::OkStatus();
    case proto::LocalRequest::OP_NOT_SET:
      return absl::OkStatus();  // Handle says it names no operation
      // No default: an operation added later that names a job must be
      // checked here (the compiler warns of a missing case).
  }
  if (job == nullptr) {
    return absl::PermissionDeniedError(
        "this request's job is not checked; refused");
  }
  if (conn->job.empty()) {
    return absl::UnauthenticatedError(
        "say Hello with the job's token first (this ptcd admits local "
        "clients with a job token only)");
  }
  if (*job != conn->job) {
    Log("tensor_store")
        ->warn("refused local client pid {} (job '{}') acting on job '{}'",
               conn->pid, conn->job, *job);
    return absl::PermissionDeniedError(
        absl::StrCat("this connection's token is for job '", conn->job,
                     "', not job '", *job, "'"));
  }
  return absl::OkStatus();
}

absl::Status LocalServer::MapRegions(
    Connection* conn, const std::string& job, int64_t version,
    const std::vector<std::pair<std::string, Region>>& items,
    proto::LocalResponse* resp, std::vector<int>* fds_out) {
  if (conn->leases.size() + items.size() >
      static_cast<size_t>(store_internal::kMaxLeasesPerConnection)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this connection holds ", conn->leases.size(), " leases; at most ",
        store_internal::kMaxLeasesPerConnection,
        " at once: release regions no longer used"));
  }
  std::vector<std::shared_ptr<RegionBuffer>> buffers;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& [tensor, region] = items[i];
    // Which item failed, where there are several.
    const std::string item =
        items.size() == 1 ? "" : absl::StrCat("item ", i, " to map");
    auto view = store_->OpenRead(job, version, tensor, region);
    if (!view.ok())
      return item.empty() ? view.status() : Annotate(view.status(), item);
    if (!view->exact) {
      return absl::FailedPreconditionError(absl::StrCat(
          "region ", region.ToString(), " of tensor '", tensor,
          "' is not one stored region",
          item.empty() ? std::string() : " (" + item + ")",
          "; Map maps stored regions as they are (zero-copy), read other "
          "regions with the gRPC Read"));
    }
    const StoredRegionRef& stored = view->sources[0];
    resp->add_sizes(stored.buffer->size());
    resp->add_checksums(stored.checksum);
    if (stored.buffer->hollow()) {
      resp->set_hollow(true);
      resp->add_offsets(0);
      resp->add_fd_indices(-1);
    } else {
      // Regions of one pack share its descriptor.
      const int fd = stored.buffer->fd();
      auto at = std::find(fds_out->begin(), fds_out->end(), fd);
      if (at == fds_out->end()) at = fds_out->insert(fds_out->end(), fd);
      resp->add_offsets(stored.buffer->offset());
      resp->add_fd_indices(static_cast<int>(at - fds_out->begin()));
    }
    buffers.push_back(stored.buffer);
  }
  std::vector<uint64_t> leases;
  for (std::shared_ptr<RegionBuffer>& buffer : buffers) {
    const uint64_t lease = next_id_++;
    leases.push_back(lease);
    resp->add_handles(lease);
    conn->leases[lease] = std::move(buffer);
  }
  local_maps_total.Add(static_cast<int64_t>(leases.size()));
  absl::MutexLock lock(&mu_);
  for (uint64_t lease : leases) owners_[lease] = conn->id;
  return absl::OkStatus();
}

proto::LocalResponse LocalServer::Handle(Connection* conn,
                                         const proto::LocalRequest& req,
                                         std::vector<int>* fds_out) {
  proto::LocalResponse resp;
  resp.set_request_id(req.request_id());
  auto fail = [&](const absl::Status& s) {
    resp.set_code(static_cast<int>(s.code()));
    resp.set_message(std::string(s.message()));
    return resp;
  };
  if (absl::Status s = CheckJob(conn, req); !s.ok()) return fail(s);
  switch (req.op_case()) {
    case proto::LocalRequest::kAllocatePut: {
      const proto::AllocatePutOp& op = req.allocate_put();
      auto region = RegionFromProto(op.region());
      if (!region.ok()) return fail(region.status());
      auto put = store_->BeginPut(op.job(), op.version(), op.tensor(), *region,
                                  std::nullopt,
                                  /*map=*/false);
      if (!put.ok()) return fail(put.status());
      const uint64_t handle = next_id_++;
      resp.set_handle(handle);
      resp.set_bytes((*put)->bytes);
      if ((*put)->buffer->hollow()) {
        resp.set_hollow(true);
      } else {
        fds_out->push_back((*put)->buffer->fd());
      }
      conn->puts[handle] = std::move(*put);
      conn->put_deadlines.Set(handle, absl::Now() + options_.put_timeout);
      absl::MutexLock lock(&mu_);
      owners_[handle] = conn->id;
      return resp;
    }
    case proto::LocalRequest::kAllocatePuts: {
      const proto::AllocatePutsOp& op = req.allocate_puts();
      if (op.items_size() == 0 || op.items_size() > kMaxPackRegions) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("AllocatePuts takes 1 to ", kMaxPackRegions,
                         " regions, not ", op.items_size())));
      }
      std::vector<std::pair<std::string, Region>> items;
      for (int i = 0; i < op.items_size(); ++i) {
        auto region = RegionFromProto(op.items(i).region());
        if (!region.ok()) {
          return fail(Annotate(region.status(),
                               absl::StrCat("item ", i, " of the pack")));
        }
        items.emplace_back(op.items(i).tensor(), *std::move(region));
      }
      auto puts = store_->BeginPuts(op.job(), op.version(), items);
      if (!puts.ok()) return fail(puts.status());
      const RegionBuffer& first = *puts->front()->buffer;
      if (first.hollow()) {
        resp.set_hollow(true);
      } else {
        fds_out->push_back(first.fd());
        resp.set_bytes(first.memfd_size());
      }
      const uint64_t pack = next_id_++;
      const absl::Time deadline = absl::Now() + options_.put_timeout;
      std::vector<uint64_t> handles;
      for (std::unique_ptr<PendingPut>& put : *puts) {
        const uint64_t handle = next_id_++;
        handles.push_back(handle);
        resp.add_handles(handle);
        resp.add_offsets(put->buffer->offset());
        resp.add_sizes(put->bytes);
        conn->puts[handle] = std::move(put);
        conn->put_deadlines.Set(handle, deadline);
        conn->pack_of[handle] = pack;
      }
      conn->pack_pending[pack] = static_cast<int>(handles.size());
      absl::MutexLock lock(&mu_);
      for (uint64_t handle : handles) owners_[handle] = conn->id;
      return resp;
    }
    case proto::LocalRequest::kCommitPut: {
      const uint64_t handle = req.commit_put().handle();
      if (absl::Status s = CheckPut(handle, conn); !s.ok()) return fail(s);
      if (absl::Status s = conn->CheckWholePacks({handle}); !s.ok())
        return fail(s);
      auto it = conn->puts.find(handle);
      // Seal first: if the client still maps the buffer writable, the put
      // stays pending and the client may unmap and commit again.
      if (absl::Status s = it->second->buffer->Seal(); !s.ok()) return fail(s);
      std::unique_ptr<PendingPut> put = std::move(it->second);
      conn->ErasePut(handle);
      {
        absl::MutexLock lock(&mu_);
        owners_.erase(handle);
      }
      const int64_t bytes = put->bytes;
      auto sum = store_->FinishPut(std::move(put), std::nullopt,
                                   req.commit_put().checksum());
      if (!sum.ok()) return fail(sum.status());
      local_puts_total.Add();
      local_bytes_in_total.Add(bytes);
      resp.set_checksum(*sum);
      resp.set_bytes(bytes);
      return resp;
    }
    case proto::LocalRequest::kCommitPuts: {
      const proto::CommitPutsOp& op = req.commit_puts();
      const int n = op.handles_size();
      if (n == 0 || n > store_internal::kMaxCommitPuts) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("CommitPuts takes 1 to ",
                         store_internal::kMaxCommitPuts, " handles, not ", n)));
      }
      if (op.checksums_size() != 0 && op.checksums_size() != n) {
        return fail(absl::InvalidArgumentError(absl::StrCat(
            "CommitPuts has ", n, " handles and ", op.checksums_size(),
            " checksums; send one per handle or none")));
      }
      // Every handle this connection's and named once, or nothing is done.
      for (int k = 0; k < n; ++k) {
        const uint64_t handle = op.handles(k);
        if (absl::Status s = CheckPut(handle, conn); !s.ok()) return fail(s);
        for (int e = 0; e < k; ++e) {
          if (op.handles(e) == handle) {
            return fail(absl::InvalidArgumentError(absl::StrCat(
                "put handle ", handle, " is named twice in one CommitPuts")));
          }
        }
      }
      if (absl::Status s =
              conn->CheckWholePacks({op.handles().begin(), op.handles().end()});
          !s.ok()) {
        return fail(s);
      }
      // Sealed first, as CommitPut does: a put whose buffer is still mapped
      // writable stays pending and answers why.
      std::vector<int> taken;
      std::vector<std::unique_ptr<PendingPut>> puts;
      std::vector<uint64_t> expected;
      std::vector<absl::Status> sealed(n);
      for (int k = 0; k < n; ++k) {
        auto it = conn->puts.find(op.handles(k));
        sealed[k] = it->second->buffer->Seal();
        if (!sealed[k].ok()) continue;
        taken.push_back(k);
        puts.push_back(std::move(it->second));
        expected.push_back(op.checksums_size() == 0 ? 0 : op.checksums(k));
        conn->ErasePut(op.handles(k));
        absl::MutexLock lock(&mu_);
        owners_.erase(op.handles(k));
      }
      std::vector<int64_t> bytes;
      for (const auto& p : puts) bytes.push_back(p->bytes);
      const std::vector<Store::PutOutcome> outcomes =
          store_->FinishPuts(std::move(puts), expected);
      std::vector<proto::PutResult> results(n);
      for (int k = 0; k < n; ++k) {
        if (sealed[k].ok()) continue;
        results[k].set_code(static_cast<int>(sealed[k].code()));
        results[k].set_message(std::string(sealed[k].message()));
      }
      for (size_t t = 0; t < taken.size(); ++t) {
        proto::PutResult& r = results[taken[t]];
        r.set_checksum(outcomes[t].checksum);
        r.set_code(static_cast<int>(outcomes[t].status.code()));
        r.set_message(std::string(outcomes[t].status.message()));
        if (outcomes[t].status.ok()) {
          local_puts_total.Add();
          local_bytes_in_total.Add(bytes[t]);
        }
      }
      for (proto::PutResult& r : results) {
        std::string* m = r.mutable_message();
        if (m->size() <= store_internal::kMaxPutResultMessage) continue;
        // Cut on a UTF-8 character's first byte.
        size_t cut = store_internal::kMaxPutResultMessage - 3;
        while (cut > 0 &&
               (static_cast<unsigned char>((*m)[cut]) & 0xC0) == 0x80)
          --cut;
        m->resize(cut);
        m->append("...");
      }
      for (proto::PutResult& r : results)
        *resp.add_put_results() = std::move(r);
      return resp;
    }
    case proto::LocalRequest::kAbortPut: {
      const uint64_t handle = req.abort_put().handle();
      if (absl::Status s = CheckPut(handle, conn); !s.ok()) return fail(s);
      conn->ErasePut(handle);
      absl::MutexLock lock(&mu_);
      owners_.erase(handle);
      return resp;
    }
    case proto::LocalRequest::kMap: {
      const proto::MapOp& op = req.map();
      auto region = RegionFromProto(op.region());
      if (!region.ok()) return fail(region.status());
      proto::LocalResponse many;
      if (absl::Status s =
              MapRegions(conn, op.job(), op.version(),
                         {{op.tensor(), *std::move(region)}}, &many, fds_out);
          !s.ok())
        return fail(s);
      resp.set_handle(many.handles(0));
      resp.set_bytes(many.sizes(0));
      resp.set_checksum(many.checksums(0));
      resp.set_hollow(many.hollow());
      if (!many.hollow()) resp.set_offset(many.offsets(0));
      return resp;
    }
    case proto::LocalRequest::kMapMany: {
      const proto::MapManyOp& op = req.map_many();
      if (op.items_size() == 0 ||
          op.items_size() > store_internal::kMaxMapRegions) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("MapMany takes 1 to ", store_internal::kMaxMapRegions,
                         " regions, not ", op.items_size())));
      }
      std::vector<std::pair<std::string, Region>> items;
      for (int i = 0; i < op.items_size(); ++i) {
        auto region = RegionFromProto(op.items(i).region());
        if (!region.ok()) {
          return fail(
              Annotate(region.status(), absl::StrCat("item ", i, " to map")));
        }
        items.emplace_back(op.items(i).tensor(), *std::move(region));
      }
      if (absl::Status s =
              MapRegions(conn, op.job(), op.version(), items, &resp, fds_out);
          !s.ok())
        return fail(s);
      return resp;
    }
    case proto::LocalRequest::kRelease: {
      const proto::ReleaseOp& op = req.release();
      std::vector<uint64_t> leases(op.leases().begin(), op.leases().end());
      if (op.lease() != 0 || leases.empty()) leases.push_back(op.lease());
      if (leases.size() >
          static_cast<size_t>(store_internal::kMaxReleaseLeases)) {
        return fail(absl::InvalidArgumentError(absl::StrCat(
            "Release takes at most ", store_internal::kMaxReleaseLeases,
            " leases, not ", leases.size())));
      }
      // All or none: each is checked before any is released.
      std::set<uint64_t> seen;
      for (uint64_t lease : leases) {
        if (!seen.insert(lease).second) {
          return fail(absl::InvalidArgumentError(absl::StrCat(
              "lease ", lease, " is named twice; nothing released")));
        }
        if (absl::Status s = CheckLease(lease, conn); !s.ok()) return fail(s);
      }
      for (uint64_t lease : leases) conn->leases.erase(lease);
      absl::MutexLock lock(&mu_);
      for (uint64_t lease : leases) owners_.erase(lease);
      return resp;
    }
    case proto::LocalRequest::kPutSmallObject: {
      const proto::PutSmallObjectOp& op = req.put_small_object();
      if (absl::Status s = store_->PutSmallObject(
              op.job(), op.version(), op.name(), op.rank(), op.data());
          !s.ok())
        return fail(s);
      resp.set_bytes(static_cast<int64_t>(op.data().size()));
      return resp;
    }
    case proto::LocalRequest::kGetSmallObject: {
      const proto::GetSmallObjectOp& op = req.get_small_object();
      auto ref =
          store_->GetSmallObject(op.job(), op.version(), op.name(), op.rank());
      if (!ref.ok()) return fail(ref.status());
      resp.set_data(*ref->bytes);
      resp.set_checksum(ref->checksum);
      resp.set_bytes(static_cast<int64_t>(ref->bytes->size()));
      return resp;
    }
    case proto::LocalRequest::kDeclare: {
      std::vector<TensorDecl> decls;
      for (const proto::TensorDecl& d : req.declare().tensors()) {
        auto decl = TensorDeclFromProto(d);
        if (!decl.ok()) return fail(decl.status());
        decls.push_back(*std::move(decl));
      }
      auto added = store_->DeclareTensors(req.declare().job(), decls);
      if (!added.ok()) return fail(added.status());
      resp.set_handle(static_cast<uint64_t>(*added));
      return resp;
    }
    case proto::LocalRequest::kHello: {
      resp.set_host(options_.host_name);
      resp.set_coordinator_relay(options_.coordinator_relay);
      resp.set_coordinator(options_.coordinator);
      const proto::ListResponse list = store_->List(req.hello().job());
      for (const proto::JobInfo& j : list.jobs()) {
        if (j.job() != req.hello().job()) continue;
        for (const proto::VersionInfo& v : j.versions())
          if (v.committed()) resp.add_versions(v.version());
      }
      return resp;
    }
    case proto::LocalRequest::OP_NOT_SET:
      break;
  }
  return fail(absl::InvalidArgumentError("local request names no operation"));
}

}  // namespace ptc
