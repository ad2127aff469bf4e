#include "tensor_store/local_client.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/status_macros.h"
#include "ptc/region_proto.h"
#include "tensor_store/internal/unix_socket.h"
#include "tensor_store/region_buffer.h"

namespace ptc {

namespace {

// Maps `size` bytes of a received memfd with `prot`, advising huge pages,
// and maps its pages at once (unless `populate` is false): a put's buffer
// is written whole, a load's region read whole.
absl::StatusOr<void*> MapShared(int fd, int64_t size, int prot,
                                bool populate = true, int64_t offset = 0) {
  void* p = mmap(nullptr, size, prot, MAP_SHARED, fd, offset);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "mapping ", size, " bytes of shared memory: ", std::strerror(errno)));
  }
  AdviseHugePages(p, size);
  if (populate) PrefaultPages(p, size, /*for_write=*/(prot & PROT_WRITE) != 0);
  return p;
}

// A ptcd older than a request reads it as naming no operation (its oneof
// case is unknown to it): the caller falls back to the older requests.
bool UnknownToDaemon(const proto::LocalResponse& resp) {
  return resp.code() == static_cast<int>(absl::StatusCode::kInvalidArgument) &&
         resp.message() == "local request names no operation";
}

absl::Status StatusOf(const proto::LocalResponse& resp) {
  return absl::Status(static_cast<absl::StatusCode>(resp.code()),
                      resp.message());
}

// AllocatePutOp and MapOp name a region of a tensor of a version alike.
template <typename Op>
void NameRegion(const std::string& job, int64_t version,
                const std::string& tensor, const Region& region, Op* op) {
  op->set_job(job);
  op->set_version(version);
  op->set_tensor(tensor);
  RegionToProto(region, op->mutable_region());
}

}  // namespace

LocalClient::Pack::~Pack() {
  Unmap();
  if (fd >= 0) close(fd);
}

absl::Status LocalClient::Pack::Map(bool populate) {
  if (data != nullptr) return absl::OkStatus();
  PTC_ASSIGN_OR_RETURN(void* p,
                       MapShared(fd, size, PROT_READ | PROT_WRITE, populate));
  data = static_cast<uint8_t*>(p);
  return absl::OkStatus();
}

void LocalClient::Pack::Unmap() {
  if (data != nullptr) munmap(data, static_cast<size_t>(size));
  data = nullptr;
}

LocalClient::PutBuffer& LocalClient::PutBuffer::operator=(
    PutBuffer&& o) noexcept {
  if (this != &o) {
    Drop();
    handle_ = o.handle_;
    data_ = o.data_;
    size_ = o.size_;
    fd_ = o.fd_;
    hollow_ = o.hollow_;
    pack_ = std::move(o.pack_);
    offset_ = o.offset_;
    o.data_ = nullptr;
    o.fd_ = -1;
    o.pack_.reset();
  }
  return *this;
}

void LocalClient::PutBuffer::Unmap() {
  if (pack_) {
    pack_->Unmap();
    return;
  }
  Drop();
}

void LocalClient::PutBuffer::Drop() {
  pack_.reset();
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  fd_ = -1;
}

namespace {
absl::Status HollowError() {
  return absl::FailedPreconditionError(
      "this ptcd is hollow (a scale test's: it keeps no bytes); there is no "
      "memory to map, write or read");
}
}  // namespace

absl::Status LocalClient::PutBuffer::Map(bool populate) {
  if (hollow_) return HollowError();
  if (pack_) return pack_->Map(populate);
  if (data_ != nullptr) return absl::OkStatus();
  if (fd_ < 0)
    return absl::FailedPreconditionError("the put buffer is already unmapped");
  PTC_ASSIGN_OR_RETURN(void* p,
                       MapShared(fd_, size_, PROT_READ | PROT_WRITE, populate));
  data_ = static_cast<uint8_t*>(p);
  return absl::OkStatus();
}

absl::Status LocalClient::PutBuffer::Write(int64_t offset, const void* src,
                                           int64_t n) {
  if (hollow_) return HollowError();
  if (fd_ < 0 && !pack_)
    return absl::FailedPreconditionError("the put buffer is already unmapped");
  if (offset < 0 || n < 0 || offset > size_ - n) {
    return absl::OutOfRangeError(absl::StrCat(
        "bytes [", offset, ", +", n, ") are outside the buffer's ", size_));
  }
  if (!pack_) return WriteAt(fd_, offset, src, n);
  // A pack in huge pages maps in a few entries, and copying into the
  // mapping runs at memory speed; in 4 KiB pages the descriptor is faster
  // (each page mapped costs more than copying it, on a VM).
  if (pack_->data == nullptr && pack_->size >= kHugePageBytes &&
      SharedMemoryHugePages()) {
    PTC_RETURN_IF_ERROR(pack_->Map(/*populate=*/true));
  }
  if (pack_->data != nullptr) {
    std::memcpy(pack_->data + offset_ + offset, src, static_cast<size_t>(n));
    return absl::OkStatus();
  }
  return WriteAt(pack_->fd, offset_ + offset, src, n);
}

LocalClient::SharedFd::~SharedFd() {
  if (fd >= 0) close(fd);
}

absl::Status LocalClient::Mapping::MapNow() {
  if (data_ != nullptr) return absl::OkStatus();
  if (hollow_) return HollowError();
  if (!fd_) return absl::FailedPreconditionError("the mapping is released");
  PTC_ASSIGN_OR_RETURN(void* p, MapShared(fd_->fd, size_, PROT_READ,
                                          /*populate=*/true, offset_));
  data_ = static_cast<const uint8_t*>(p);
  return absl::OkStatus();
}

absl::Status LocalClient::Mapping::Read(int64_t offset, void* dst,
                                        int64_t n) const {
  if (hollow_) return HollowError();
  if (!fd_) return absl::FailedPreconditionError("the mapping is released");
  if (offset < 0 || n < 0 || offset > size_ - n) {
    return absl::OutOfRangeError(absl::StrCat(
        "bytes [", offset, ", +", n, ") are outside the region's ", size_));
  }
  return ReadAt(fd_->fd, offset_ + offset, dst, n);
}

LocalClient::Mapping& LocalClient::Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    this->~Mapping();
    client_ = o.client_;
    lease_ = o.lease_;
    data_ = o.data_;
    size_ = o.size_;
    offset_ = o.offset_;
    checksum_ = o.checksum_;
    fd_ = std::move(o.fd_);
    hollow_ = o.hollow_;
    o.client_ = nullptr;
    o.data_ = nullptr;
    o.fd_.reset();
  }
  return *this;
}

LocalClient::Mapping::~Mapping() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
  fd_.reset();
  if (client_ != nullptr) client_->Release(lease_).IgnoreError();
  client_ = nullptr;
  data_ = nullptr;
}

ino_t LocalClient::Mapping::inode() const {
  struct stat st;
  return fd_ && fstat(fd_->fd, &st) == 0 ? st.st_ino : 0;
}

absl::StatusOr<std::unique_ptr<LocalClient>> LocalClient::Connect(
    const std::string& socket_path) {
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path '", socket_path, "' is too long"));
  }
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(std::strerror(errno));
  if (connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) !=
      0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ptcd at ", socket_path, ": ", why,
                     "; is ptcd running on this host?"));
  }
  return std::unique_ptr<LocalClient>(new LocalClient(fd));
}

LocalClient::~LocalClient() { close(fd_); }

absl::StatusOr<proto::LocalResponse> LocalClient::Call(proto::LocalRequest req,
                                                       int* fd_out) {
  std::vector<int> fds;
  absl::StatusOr<proto::LocalResponse> resp = CallWithFds(std::move(req), &fds);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (i == 0 && fd_out != nullptr) {
      *fd_out = fds[0];
    } else {
      close(fds[i]);
    }
  }
  return resp;
}

absl::StatusOr<proto::LocalResponse> LocalClient::CallWithFds(
    proto::LocalRequest req, std::vector<int>* fds_out) {
  fds_out->clear();
  absl::MutexLock lock(&mu_);
  req.set_request_id(next_request_++);
  if (absl::Status sent =
          store_internal::SendPacket(fd_, req.SerializeAsString());
      !sent.ok()) {
    // A daemon that refused this connection said why before closing it.
    struct pollfd p = {fd_, POLLIN, 0};
    int fd = -1;
    proto::LocalResponse refusal;
    if (poll(&p, 1, 0) == 1) {
      auto packet = store_internal::ReceivePacket(fd_, &fd);
      if (fd >= 0) close(fd);
      if (packet.ok() && refusal.ParseFromString(*packet) &&
          refusal.code() != 0) {
        return absl::Status(static_cast<absl::StatusCode>(refusal.code()),
                            refusal.message());
      }
    }
    return sent;
  }
  PTC_ASSIGN_OR_RETURN(std::string packet,
                       store_internal::ReceivePacket(fd_, fds_out));
  proto::LocalResponse resp;
  if (!resp.ParseFromString(packet)) {
    for (int fd : *fds_out) close(fd);
    fds_out->clear();
    return absl::InternalError("ptcd sent a malformed local response");
  }
  return resp;
}

absl::StatusOr<LocalClient::PutBuffer> LocalClient::AllocatePut(
    const std::string& job, int64_t version, const std::string& tensor,
    const Region& region, bool map) {
  proto::LocalRequest req;
  NameRegion(job, version, tensor, region, req.mutable_allocate_put());
  int fd = -1;
  PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp, Call(std::move(req), &fd));
  PTC_RETURN_IF_ERROR(StatusOf(resp));
  PutBuffer buf;
  buf.handle_ = resp.handle();
  buf.size_ = resp.bytes();
  buf.fd_ = fd;
  buf.hollow_ = resp.hollow();
  if (map && !buf.hollow_) PTC_RETURN_IF_ERROR(buf.Map());
  return buf;
}

absl::StatusOr<std::vector<LocalClient::PutBuffer>> LocalClient::AllocatePuts(
    const std::string& job, int64_t version,
    const std::vector<std::pair<std::string, Region>>& items) {
  std::vector<PutBuffer> out;
  if (!pack_unknown_) {
    proto::LocalRequest req;
    proto::AllocatePutsOp* op = req.mutable_allocate_puts();
    op->set_job(job);
    op->set_version(version);
    for (const auto& [tensor, region] : items) {
      proto::AllocatePutsOp::Item* item = op->add_items();
      item->set_tensor(tensor);
      RegionToProto(region, item->mutable_region());
    }
    int fd = -1;
    PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp, Call(std::move(req), &fd));
    auto pack = std::make_shared<Pack>();
    pack->fd = fd;  // closed with the pack, whatever happens next
    pack_unknown_ = UnknownToDaemon(resp);
    if (!pack_unknown_) {
      PTC_RETURN_IF_ERROR(StatusOf(resp));
      const int n = static_cast<int>(items.size());
      bool fits = resp.handles_size() == n && resp.offsets_size() == n &&
                  resp.sizes_size() == n && (resp.hollow() || fd >= 0);
      for (int i = 0; fits && i < n && !resp.hollow(); ++i) {
        fits = resp.offsets(i) >= 0 && resp.sizes(i) > 0 &&
               resp.offsets(i) <= resp.bytes() - resp.sizes(i);
      }
      if (!fits) {
        return absl::InternalError(absl::StrCat(
            "ptcd answered a pack of ", n, " regions with ",
            resp.handles_size(), " handles, ", resp.offsets_size(),
            " offsets and ", resp.sizes_size(), " sizes within ", resp.bytes(),
            " bytes", fd < 0 ? " and no memory" : ""));
      }
      pack->size = resp.bytes();
      for (int i = 0; i < n; ++i) {
        PutBuffer buf;
        buf.handle_ = resp.handles(i);
        buf.hollow_ = resp.hollow();
        buf.size_ = resp.sizes(i);
        if (!buf.hollow_) {
          buf.pack_ = pack;
          buf.offset_ = resp.offsets(i);
        }
        out.push_back(std::move(buf));
      }
      return out;
    }
  }
  for (const auto& [tensor, region] : items) {
    PTC_ASSIGN_OR_RETURN(PutBuffer buf,
                         AllocatePut(job, version, tensor, region,
                                     /*map=*/false));
    out.push_back(std::move(buf));
  }
  return out;
}

absl::StatusOr<uint64_t> LocalClient::CommitPut(PutBuffer* buffer,
                                                uint64_t checksum) {
  buffer->Unmap();
  proto::LocalRequest req;
  req.mutable_commit_put()->set_handle(buffer->handle_);
  req.mutable_commit_put()->set_checksum(checksum);
  PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp,
                       Call(std::move(req), nullptr));
  PTC_RETURN_IF_ERROR(StatusOf(resp));
  return resp.checksum();
}

absl::StatusOr<std::vector<LocalClient::PutResult>> LocalClient::CommitPuts(
    const std::vector<PutBuffer*>& buffers,
    const std::vector<uint64_t>& checksums) {
  if (!checksums.empty() && checksums.size() != buffers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(buffers.size(), " buffers and ", checksums.size(),
                     " checksums; give one per buffer or none"));
  }
  auto expected = [&](size_t i) {
    return checksums.empty() ? 0 : checksums[i];
  };
  // The requests: the buffers in order, a pack's together (its first
  // buffer brings the others), and no pack split between two requests.
  std::vector<size_t> order;
  std::vector<size_t> starts = {0};
  {
    std::map<const Pack*, std::vector<size_t>> of_pack;
    for (size_t i = 0; i < buffers.size(); ++i)
      if (buffers[i]->pack_) of_pack[buffers[i]->pack_.get()].push_back(i);
    std::vector<bool> placed(buffers.size());
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (placed[i]) continue;
      std::vector<size_t> group = {i};
      if (buffers[i]->pack_) group = of_pack[buffers[i]->pack_.get()];
      const size_t open = order.size() - starts.back();
      if (open > 0 && open + group.size() >
                          static_cast<size_t>(store_internal::kMaxCommitPuts))
        starts.push_back(order.size());
      // (A pack has at most kMaxCommitPuts buffers.)
      for (size_t g : group) {
        placed[g] = true;
        order.push_back(g);
      }
    }
  }
  std::vector<PutResult> out(buffers.size());
  for (size_t c = 0; c < starts.size() && starts[c] < order.size(); ++c) {
    const size_t first = starts[c];
    const size_t end = c + 1 < starts.size() ? starts[c + 1] : order.size();
    if (!batch_unknown_) {
      proto::LocalRequest req;
      proto::CommitPutsOp* op = req.mutable_commit_puts();
      for (size_t k = first; k < end; ++k) {
        // Unmapped so that the daemon can seal it; its descriptor is kept
        // until the answer (an older daemon's refusal needs it mapped again).
        PutBuffer& b = *buffers[order[k]];
        if (b.pack_) {
          b.pack_->Unmap();
        } else if (b.data_ != nullptr) {
          munmap(b.data_, static_cast<size_t>(b.size_));
        }
        b.data_ = nullptr;
        op->add_handles(b.handle_);
        if (!checksums.empty()) op->add_checksums(checksums[order[k]]);
      }
      PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp,
                           Call(std::move(req), nullptr));
      // A ptcd that predates CommitPuts reads an empty request.
      batch_unknown_ = UnknownToDaemon(resp);
      if (!batch_unknown_) {
        PTC_RETURN_IF_ERROR(StatusOf(resp));
        if (resp.put_results_size() != static_cast<int>(end - first)) {
          return absl::InternalError(
              absl::StrCat("ptcd answered ", resp.put_results_size(), " of ",
                           end - first, " commits"));
        }
        for (size_t k = first; k < end; ++k) {
          const size_t i = order[k];
          const proto::PutResult& r =
              resp.put_results(static_cast<int>(k - first));
          out[i].status = absl::Status(static_cast<absl::StatusCode>(r.code()),
                                       r.message());
          out[i].checksum = r.checksum();
          buffers[i]->Unmap();
        }
        continue;
      }
    }
    for (size_t k = first; k < end; ++k) {
      const size_t i = order[k];
      PutBuffer& b = *buffers[i];
      uint64_t sum = expected(i);
      if (sum == 0 && !b.hollow() && b.size() > 0) {
        PTC_RETURN_IF_ERROR(b.Map());  // unmapped by the batch it refused
        sum = Checksum(b.data(), static_cast<size_t>(b.size()));
      }
      absl::StatusOr<uint64_t> stored = CommitPut(&b, sum);
      out[i].status = stored.status();
      out[i].checksum = stored.ok() ? *stored : sum;
    }
  }
  return out;
}

absl::Status LocalClient::AbortPut(PutBuffer* buffer) {
  buffer->Drop();  // a pack's mapping stays for its other buffers
  proto::LocalRequest req;
  req.mutable_abort_put()->set_handle(buffer->handle_);
  PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp,
                       Call(std::move(req), nullptr));
  return StatusOf(resp);
}

absl::StatusOr<LocalClient::Mapping> LocalClient::Map(const std::string& job,
                                                      int64_t version,
                                                      const std::string& tensor,
                                                      const Region& region,
                                                      bool map) {
  proto::LocalRequest req;
  NameRegion(job, version, tensor, region, req.mutable_map());
  int fd = -1;
  PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp, Call(std::move(req), &fd));
  PTC_RETURN_IF_ERROR(StatusOf(resp));
  Mapping m;
  m.client_ = this;
  m.lease_ = resp.handle();
  m.size_ = resp.bytes();
  m.offset_ = resp.offset();
  m.checksum_ = resp.checksum();
  if (fd >= 0) m.fd_ = std::make_shared<SharedFd>(fd);
  m.hollow_ = resp.hollow();
  if (map && !m.hollow_) PTC_RETURN_IF_ERROR(m.MapNow());
  return m;
}

absl::Status LocalClient::PutSmallObject(const std::string& job,
                                         int64_t version,
                                         const std::string& name, int32_t rank,
                                         const std::string& bytes) {
  if (static_cast<int64_t>(bytes.size()) > kMaxSmallObjectBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "small object '", name, "' has ", bytes.size(),
        " bytes; small objects may have at most ", kMaxSmallObjectBytes,
        " (store larger state as a tensor)"));
  }
  proto::LocalRequest req;
  proto::PutSmallObjectOp* op = req.mutable_put_small_object();
  op->set_job(job);
  op->set_version(version);
  op->set_name(name);
  op->set_rank(rank);
  op->set_data(bytes);
  PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp,
                       Call(std::move(req), nullptr));
  return StatusOf(resp);
}

absl::StatusOr<std::string> LocalClient::GetSmallObject(const std::string& job,
                                                        int64_t version,
                                                        const std::string& name,
                                                        int32_t rank) {
  proto::LocalRequest req;
  proto::GetSmallObjectOp* op = req.mutable_get_small_object();
  op->set_job(job);
  op->set_version(version);
  op->set_name(name);
  op->set_rank(rank);
  PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp,
                       Call(std::move(req), nullptr));
  PTC_RETURN_IF_ERROR(StatusOf(resp));
  return std::move(*resp.mutable_data());
}

absl::Status LocalClient::Declare(const std::string& job,
                                  const std::vector<TensorDecl>& tensors) {
  size_t i = 0;
  do {
    proto::LocalRequest req;
    proto::DeclareOp* op = req.mutable_declare();
    op->set_job(job);
    // Keys and shapes are small; stop well below the packet size.
    for (; i < tensors.size() && op->ByteSizeLong() < 48 * 1024; ++i) {
      proto::TensorDecl* d = op->add_tensors();
      d->set_key(tensors[i].key);
      d->set_dtype(std::string(DTypeName(tensors[i].dtype)));
      for (int64_t e : tensors[i].shape) d->add_shape(e);
    }
    PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp,
                         Call(std::move(req), nullptr));
    PTC_RETURN_IF_ERROR(StatusOf(resp));
  } while (i < tensors.size());
  return absl::OkStatus();
}

absl::StatusOr<LocalClient::Hello> LocalClient::SayHello(
    const std::string& job, const std::string& token) {
  proto::LocalRequest req;
  req.mutable_hello()->set_job(job);
  req.mutable_hello()->set_token(token);
  PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp,
                       Call(std::move(req), nullptr));
  PTC_RETURN_IF_ERROR(StatusOf(resp));
  Hello h;
  h.host = resp.host();
  h.coordinator_relay = resp.coordinator_relay();
  h.coordinator = resp.coordinator();
  h.committed_versions.assign(resp.versions().begin(), resp.versions().end());
  return h;
}

absl::StatusOr<std::vector<LocalClient::Mapping>> LocalClient::MapMany(
    const std::string& job, int64_t version,
    const std::vector<std::pair<std::string, Region>>& items) {
  std::vector<Mapping> out;
  out.reserve(items.size());
  size_t i = 0;
  while (i < items.size() && !many_unknown_) {
    proto::LocalRequest req;
    proto::MapManyOp* op = req.mutable_map_many();
    op->set_job(job);
    op->set_version(version);
    // Names are short; stop well below the packet size.
    const size_t first = i;
    for (; i < items.size() &&
           op->items_size() < store_internal::kMaxMapRegions &&
           op->ByteSizeLong() < 48 * 1024;
         ++i) {
      proto::AllocatePutsOp::Item* item = op->add_items();
      item->set_tensor(items[i].first);
      RegionToProto(items[i].second, item->mutable_region());
    }
    std::vector<int> fds;
    PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp,
                         CallWithFds(std::move(req), &fds));
    std::vector<std::shared_ptr<SharedFd>> shared;
    for (int fd : fds) shared.push_back(std::make_shared<SharedFd>(fd));
    if (UnknownToDaemon(resp)) {
      many_unknown_ = true;  // an older ptcd: one Map each, below
      i = first;
      break;
    }
    PTC_RETURN_IF_ERROR(StatusOf(resp));
    many_known_ = true;
    const int n = static_cast<int>(i - first);
    bool fits = resp.handles_size() == n && resp.sizes_size() == n &&
                resp.offsets_size() == n && resp.checksums_size() == n &&
                resp.fd_indices_size() == n;
    for (int k = 0; fits && k < n && !resp.hollow(); ++k) {
      fits = resp.fd_indices(k) >= 0 &&
             resp.fd_indices(k) < static_cast<int>(shared.size()) &&
             resp.offsets(k) >= 0 && resp.sizes(k) >= 0;
    }
    // Leases taken before the answer is judged, so that none is kept.
    for (int k = 0; k < n && k < resp.handles_size(); ++k) {
      Mapping m;
      m.client_ = this;
      m.lease_ = resp.handles(k);
      m.hollow_ = resp.hollow();
      if (fits) {
        m.size_ = resp.sizes(k);
        m.offset_ = resp.offsets(k);
        m.checksum_ = resp.checksums(k);
        if (!m.hollow_) m.fd_ = shared[resp.fd_indices(k)];
      }
      out.push_back(std::move(m));
    }
    if (!fits) {
      Release(&out).IgnoreError();
      return absl::InternalError(absl::StrCat(
          "ptcd answered a map of ", n, " regions with ", resp.handles_size(),
          " leases, ", resp.sizes_size(), " sizes, ", resp.offsets_size(),
          " offsets, ", resp.checksums_size(), " checksums and ",
          resp.fd_indices_size(), " descriptor indices (", fds.size(),
          " descriptors)"));
    }
  }
  for (; i < items.size(); ++i) {
    PTC_ASSIGN_OR_RETURN(Mapping m, Map(job, version, items[i].first,
                                        items[i].second, /*map=*/false));
    out.push_back(std::move(m));
  }
  return out;
}

absl::Status LocalClient::Release(std::vector<Mapping>* mappings) {
  std::vector<uint64_t> leases;
  for (Mapping& m : *mappings) {
    if (m.client_ != this) continue;
    leases.push_back(m.lease_);
    m.client_ = nullptr;
  }
  absl::Status first;
  if (!many_known_) {
    // A ptcd that may predate Release of several leases.
    for (uint64_t lease : leases) first.Update(Release(lease));
    return first;
  }
  for (size_t i = 0; i < leases.size();) {
    proto::LocalRequest req;
    const size_t end =
        std::min(leases.size(),
                 i + static_cast<size_t>(store_internal::kMaxReleaseLeases));
    for (; i < end; ++i) req.mutable_release()->add_leases(leases[i]);
    auto resp = Call(std::move(req), nullptr);
    first.Update(resp.ok() ? StatusOf(*resp) : resp.status());
  }
  return first;
}

absl::Status LocalClient::Release(uint64_t lease) {
  proto::LocalRequest req;
  req.mutable_release()->set_lease(lease);
  PTC_ASSIGN_OR_RETURN(proto::LocalResponse resp,
                       Call(std::move(req), nullptr));
  return StatusOf(resp);
}

}  // namespace ptc
