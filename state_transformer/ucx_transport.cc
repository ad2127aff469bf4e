#include "state_transformer/ucx_transport.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/scratch_buffers.h"
#include "common/status_macros.h"
#include "ptc/fingerprint.h"
#include "ptc/region.h"
#include "ptc/region_proto.h"

namespace ptc {

namespace {
constexpr char kNoUcxWorkerUrl[] = "ptc/no-ucx-worker";
}  // namespace

absl::Status NoUcxWorkerError() {
  absl::Status s = absl::FailedPreconditionError(
      "this ptcd has no UCX worker; ask it over gRPC");
  s.SetPayload(kNoUcxWorkerUrl, absl::Cord("1"));
  return s;
}

bool IsNoUcxWorker(const absl::Status& s) {
  return s.code() == absl::StatusCode::kFailedPrecondition &&
         s.GetPayload(kNoUcxWorkerUrl).has_value();
}
namespace {

constexpr int64_t kPartBytes = int64_t{64} << 20;

// Every byte received over UCX.
Counter& ucx_bytes_received_total =
    GetCounter("ptc_transformer_ucx_bytes_received_total");
Counter& ucx_fallbacks_total =
    GetCounter("ptc_transformer_ucx_fallbacks_total");

uint64_t NewTag() {
  static std::atomic<uint64_t> counter{absl::Uniform<uint64_t>(absl::BitGen())
                                       << 20};
  return counter.fetch_add(1);
}

// The byte offset in a dense row-major buffer of `buffer_box` at which
// elements [first, first + count) of `region` (in its row-major order)
// lie, if they are one contiguous span there.
std::optional<int64_t> SpanOffset(const Region& buffer_box,
                                  const Region& region, int64_t first,
                                  int64_t count, int64_t element_size) {
  std::optional<int64_t> begin;
  int64_t end = 0;
  bool contiguous = true;
  for (const Region& box : FlatRangeOfRegion(region, first, first + count)) {
    ForEachRun(buffer_box, buffer_box, box, element_size,
               [&](int64_t at, int64_t, int64_t n) {
                 if (!begin) {
                   begin = at;
                 } else if (at != end) {
                   contiguous = false;
                 }
                 end = at + n;
               });
  }
  if (!contiguous) return std::nullopt;
  return begin;
}

// Writes `count` elements of `region`, starting at element `first` of its
// row-major order, from dense `data` into `into`, which holds `region`.
void ScatterInto(const PieceTarget& into, const Region& region, int64_t first,
                 const char* data, int64_t count, int64_t element_size) {
  for (const Region& box : FlatRangeOfRegion(region, first, first + count)) {
    CopyRegion(data, box, into.data, into.region, box, element_size);
    data += box.volume() * element_size;
  }
}

// A piece that landed in `into` also goes to the other staged buffers it
// touches (the regions a host holds may overlap), each adding what it got.
void CopyToOtherTargets(const PieceTarget& into,
                        absl::Span<const PieceTarget> targets,
                        const Region& region, int64_t element_size) {
  for (const PieceTarget& t : targets) {
    if (&t == &into) continue;
    const Region both = t.region.Intersect(region);
    if (both.empty()) continue;
    CopyRegion(into.data, into.region, t.data, t.region, both, element_size);
    if (t.sums != nullptr) {
      t.sums->Add(
          FingerprintRegion(t.data, t.region, both, t.shape, element_size),
          both.volume());
    }
  }
}

// The fingerprint of `count` elements of `region` from element `first` of
// its row-major order, read where they lie in the staged buffer `in` (by
// its own geometry, not the offsets the bytes were written at: a part
// placed wrongly does not add up to the right sum).
uint64_t FingerprintStaged(const PieceTarget& in, const Region& region,
                           int64_t first, int64_t count, int64_t element_size) {
  uint64_t sum = 0;
  for (const Region& box : FlatRangeOfRegion(region, first, first + count))
    sum += FingerprintRegion(in.data, in.region, box, in.shape, element_size);
  return sum;
}

}  // namespace

UcxPieceTransport::UcxPieceTransport(
    int64_t plan_epoch, const std::map<int32_t, std::string>& peers,
    std::map<int32_t, std::string> names, absl::Duration peer_timeout)
    : epoch_(plan_epoch),
      peer_timeout_(peer_timeout),
      addresses_(peers),
      names_(std::move(names)),
      control_(peers, names_, peer_timeout) {
  for (const auto& [host, address] : peers) {
    auto name = names_.find(host);
    stubs_[host] = proto::Transformer::NewStub(
        OpenChannel(address, grpc::ChannelArguments(),
                    name != names_.end() ? name->second : ""));
  }
}

namespace {

// The pulling workers of every transport in this process, idle between
// transfers. They outlive the transports (one per staged fragment), so a
// source sees the same few addresses change after change: its check of a
// new address (a child process, ucx_address_check.h) and its endpoint are
// paid once per worker, not once per pulling thread and change (under
// load, checks queued at a source, 4 at once, can hold its sends past the
// targets' deadlines). A worker comes back only after transfers that
// all completed (one that failed is abandoned and destroyed), so nothing
// of an earlier transfer is in flight to it.
struct IdleWorkers {
  absl::Mutex mu;
  std::vector<std::unique_ptr<UcxWorker>> workers ABSL_GUARDED_BY(mu);
};

IdleWorkers& PullingWorkers() {
  static auto* idle = new IdleWorkers;  // never destroyed: used at exit
  static auto* gauge =
      new Gauge("ptc_transformer_ucx_idle_pulling_workers", [] {
        absl::MutexLock lock(&idle->mu);
        return static_cast<double>(idle->workers.size());
      });
  (void)gauge;
  return *idle;
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxPieceTransport::TakeWorker() {
  IdleWorkers& idle = PullingWorkers();
  {
    absl::MutexLock lock(&idle.mu);
    if (!idle.workers.empty()) {
      std::unique_ptr<UcxWorker> w = std::move(idle.workers.back());
      idle.workers.pop_back();
      return w;
    }
  }
  return UcxWorker::Create(/*serve=*/false);
}

void UcxPieceTransport::ReturnWorker(std::unique_ptr<UcxWorker> worker) {
  if (worker->broken()) return;  // destroyed here, before the buffers go
  IdleWorkers& idle = PullingWorkers();
  absl::MutexLock lock(&idle.mu);
  if (static_cast<int>(idle.workers.size()) >= kMaxIdlePullingWorkers) {
    return;  // more than usually pull at once: this one is destroyed
  }
  idle.workers.push_back(std::move(worker));
}

std::string UcxPieceTransport::PeerLabel(int32_t host) {
  const auto name = names_.find(host);
  return absl::StrCat(
      name != names_.end() ? name->second : absl::StrCat("host ", host), " (",
      addresses_[host], ")");
}

absl::Status UcxPieceTransport::FetchInto(
    int32_t host, const std::string& job, int64_t version,
    const std::string& tensor, const Region& region, int64_t element_size,
    absl::Span<const PieceTarget> targets,
    const StoreClient::Consumer& consume) {
  const BatchPiece piece{&tensor, region, element_size, targets, &consume};
  return FetchBatch(host, job, version, absl::MakeConstSpan(&piece, 1));
}

absl::Status UcxPieceTransport::FetchBatch(
    int32_t host, const std::string& job, int64_t version,
    absl::Span<const BatchPiece> pieces) {
  auto stub = stubs_.find(host);
  if (stub == stubs_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no address for source host ", host));
  }
  // A piece is what this host needs of a tensor from `host`; it may span
  // several staged buffers. Each buffer's share lands in it directly; what
  // an earlier buffer holds as well is copied from there afterwards. A
  // piece the staged buffers do not cover (a caller without any) is
  // streamed to its consumer.
  struct Share {
    const BatchPiece* piece;
    Region region;
    const PieceTarget* into;
  };
  std::vector<Share> shares;
  std::vector<Transfer> sends;
  for (const BatchPiece& p : pieces) {
    std::vector<Share> own;
    std::vector<Region> uncovered = {p.region};
    for (const PieceTarget& t : p.targets) {
      const Region share = t.region.Intersect(p.region);
      if (share.empty() || t.data == nullptr) continue;
      const bool elsewhere = std::any_of(own.begin(), own.end(), [&](auto& o) {
        return o.into->region.Contains(share);
      });
      if (elsewhere) continue;
      own.push_back({&p, share, &t});
      std::vector<Region> left;
      for (const Region& u : uncovered) {
        for (Region& d : u.Difference(t.region)) left.push_back(std::move(d));
      }
      uncovered.swap(left);
    }
    if (!uncovered.empty()) {
      AddTransfers(*p.tensor, p.region, p.element_size, nullptr, p.consume,
                   &sends);
    } else {
      shares.insert(shares.end(), own.begin(), own.end());
    }
  }
  // Declared before the worker: a broken worker is destroyed (ending any
  // transfer into the bounce buffer) before the buffer goes back.
  ScratchBuffers::Lease bounce = TransferScratch().Empty();
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<UcxWorker> worker, TakeWorker());
  absl::Cleanup give_back = [&] { ReturnWorker(std::move(worker)); };

  // The source sends every share (from its memory as it is where the share
  // is one span there, else packed); each lands in place where it is one
  // span of its staged buffer, else is scattered here.
  for (const Share& sh : shares) {
    AddTransfers(*sh.piece->tensor, sh.region, sh.piece->element_size,
                 sh.into, nullptr, &sends);
  }
  PTC_RETURN_IF_ERROR(
      SendAll(host, job, version, worker.get(), &bounce, sends));
  for (const Share& sh : shares) {
    CopyToOtherTargets(*sh.into, sh.piece->targets, sh.region,
                       sh.piece->element_size);
  }
  return absl::OkStatus();
}

absl::Status UcxPieceTransport::Fetch(int32_t host, const std::string& job,
                                      int64_t version,
                                      const std::string& tensor,
                                      const Region& region,
                                      int64_t element_size,
                                      const StoreClient::Consumer& consume) {
  const BatchPiece piece{&tensor, region, element_size, {}, &consume};
  return FetchBatch(host, job, version, absl::MakeConstSpan(&piece, 1));
}

void UcxPieceTransport::AddTransfers(const std::string& tensor,
                                     const Region& region, int64_t element_size,
                                     const PieceTarget* into,
                                     const StoreClient::Consumer* consume,
                                     std::vector<Transfer>* out) {
  const int64_t elements = region.volume();
  const int64_t per_part =
      std::max<int64_t>(1, kMaxSendPartsBytes / element_size);
  for (int64_t first = 0; first < elements; first += per_part) {
    const int64_t count = std::min(per_part, elements - first);
    out->push_back({&tensor, region, first, count, element_size, into, consume,
                    first * element_size});
  }
}

absl::Status UcxPieceTransport::SendAll(int32_t host, const std::string& job,
                                        int64_t version, UcxWorker* worker,
                                        ScratchBuffers::Lease* bounce,
                                        absl::Span<const Transfer> transfers) {
  // One call per kMaxSendPartsBytes: what the source may pack, and what
  // lands in this thread's bounce buffer, at most.
  size_t begin = 0;
  int64_t bytes = 0;
  for (size_t i = 0; i < transfers.size(); ++i) {
    const int64_t n = transfers[i].count * transfers[i].element_size;
    if (i > begin && (bytes + n > kMaxSendPartsBytes ||
                      i - begin >= static_cast<size_t>(kMaxPartsPerCall))) {
      PTC_RETURN_IF_ERROR(SendOnce(host, job, version, worker, bounce,
                                   transfers.subspan(begin, i - begin)));
      begin = i;
      bytes = 0;
    }
    bytes += n;
  }
  if (begin < transfers.size()) {
    PTC_RETURN_IF_ERROR(
        SendOnce(host, job, version, worker, bounce, transfers.subspan(begin)));
  }
  return absl::OkStatus();
}

absl::Status UcxPieceTransport::SendOnce(int32_t host, const std::string& job,
                                         int64_t version, UcxWorker* worker,
                                         ScratchBuffers::Lease* bounce_buffer,
                                         absl::Span<const Transfer> transfers) {
  auto stub = stubs_.find(host);
  const std::string peer = PeerLabel(host);
  // Where each part lands: in place when it is one span of its staged
  // buffer, else in this thread's buffer, to be scattered.
  std::vector<char*> land(transfers.size(), nullptr);
  std::vector<bool> bounced(transfers.size(), false);
  int64_t bounce = 0;
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    if (t.into != nullptr) {
      const std::optional<int64_t> at = SpanOffset(
          t.into->region, t.region, t.first, t.count, t.element_size);
      if (at) land[i] = reinterpret_cast<char*>(t.into->data) + *at;
    }
    if (land[i] == nullptr) bounce += t.count * t.element_size;
  }
  bounce_buffer->Reserve(bounce);
  char* next = bounce_buffer->data();
  proto::SendPartsRequest req;
  req.set_job(job);
  req.set_version(version);
  req.set_plan_epoch(epoch_);
  req.set_ucx_address(worker->address());
  std::vector<std::unique_ptr<UcxWorker::Receive>> receives;
  // A receive that is not waited for is cancelled before its buffer goes.
  // If the transfer fails part-way, the worker is abandoned first (its
  // peer may have died writing into it; see UcxWorker::Abandon).
  bool failed = true;
  absl::Cleanup cancel = [&] {
    if (failed) worker->Abandon();
    for (auto& r : receives) worker->Cancel(r.get());
  };
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    const size_t capacity = static_cast<size_t>(t.count * t.element_size);
    if (land[i] == nullptr) {
      land[i] = next;
      next += capacity;
      bounced[i] = true;
    }
    const uint64_t tag = NewTag();
    PTC_ASSIGN_OR_RETURN(auto receive,
                         worker->PostReceive(tag, land[i], capacity));
    receives.push_back(std::move(receive));
    proto::PartToSend* part = req.add_parts();
    part->set_tensor(*t.tensor);
    RegionToProto(t.region, part->mutable_region());
    part->set_first(t.first);
    part->set_count(t.count);
    part->set_tag(tag);
  }
  // The source sends while we wait for its reply; the receiver must keep
  // progressing its worker meanwhile (UCX rendezvous needs both sides),
  // so the call runs on a helper thread.
  // The whole call, and each wait below, within the deadline of all the
  // bytes asked for: a source that goes silent is given up on after about
  // the peer timeout.
  int64_t call_bytes = 0;
  for (const Transfer& t : transfers) call_bytes += t.count * t.element_size;
  const absl::Duration call_timeout = TransferDeadline(peer_timeout_, call_bytes);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + call_timeout));
  proto::SendPartsResponse resp;
  absl::Status sent;
  std::atomic<bool> replied{false};
  std::thread call([&] {
    sent = FromGrpcStatus(stub->second->SendParts(&ctx, req, &resp));
    replied = true;
  });
  std::vector<size_t> got(transfers.size(), 0);
  absl::Status received;
  for (size_t i = 0; i < transfers.size() && received.ok(); ++i) {
    auto n = worker->Wait(receives[i].get(), call_timeout,
                          [&] { return replied.load() && !sent.ok(); });
    if (n.ok()) {
      got[i] = *n;
    } else {
      received = n.status();
    }
  }
  // The sender's requests complete only when our acknowledgements reach
  // it, and this worker is ours alone: keep progressing it until the
  // source has replied (it answers only after its sends completed).
  worker->ProgressUntil([&] { return replied.load(); },
                        absl::Now() + call_timeout);
  call.join();
  failed = !sent.ok() || !received.ok();
  std::move(cancel).Invoke();  // the ones not completed above
  const Transfer& first = transfers.front();
  if (!sent.ok()) {
    return Annotate(
        sent, absl::StrCat("pulling ", transfers.size(), " parts (the first ",
                           first.region.ToString(), " of '", *first.tensor,
                           "') from ", peer, " over UCX"));
  }
  if (!received.ok()) {
    return Annotate(received, absl::StrCat("receiving from ", peer));
  }
  if (resp.parts_size() != static_cast<int>(transfers.size())) {
    return absl::DataLossError(absl::StrCat(peer, " answered for ",
                                            resp.parts_size(), " parts of the ",
                                            transfers.size(), " asked for"));
  }
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    const int64_t capacity = t.count * t.element_size;
    if (static_cast<int64_t>(got[i]) != resp.parts(i).bytes() ||
        resp.parts(i).bytes() != capacity) {
      return absl::DataLossError(
          absl::StrCat("a part of ", t.region.ToString(), " of '", *t.tensor,
                       "' from ", peer, " arrived with ", got[i],
                       " bytes instead of ", capacity, " over UCX"));
    }
    // Checksum, scatter into `into` and fingerprint there (for the proof
    // of the staged version) a few hundred KiB at a time, while in cache.
    // What is scattered before the checksum fails is in staged memory that
    // nobody sees and the failure discards; a consumer gets only verified
    // bytes.
    constexpr int64_t kChunk = int64_t{256} << 10;
    const int64_t chunk =
        std::max<int64_t>(1, kChunk / t.element_size) * t.element_size;
    const bool add_up = t.into != nullptr && t.into->sums != nullptr;
    StreamingChecksum sum;
    uint64_t fingerprint = 0;
    for (int64_t done = 0; done < capacity;) {
      const int64_t n = std::min<int64_t>(chunk, capacity - done);
      const int64_t at = t.first + done / t.element_size;
      sum.Update(land[i] + done, n);
      if (bounced[i] && t.into != nullptr) {
        ScatterInto(*t.into, t.region, at, land[i] + done, n / t.element_size,
                    t.element_size);
      }
      if (add_up) {
        fingerprint += FingerprintStaged(*t.into, t.region, at,
                                         n / t.element_size, t.element_size);
      }
      done += n;
    }
    const uint64_t digest = sum.Digest();
    if (digest != resp.parts(i).checksum()) {
      return absl::DataLossError(
          absl::StrCat("a part of ", t.region.ToString(), " of '", *t.tensor,
                       "' from ", peer, " arrived damaged over UCX"));
    }
    if (add_up) {
      t.into->sums->Add(fingerprint, t.count);
      // The whole staged buffer in its own order: the part's checksum is
      // the buffer's.
      if (t.region == t.into->region && t.first == 0 &&
          t.count == t.region.volume()) {
        t.into->sums->checksum = digest;
        t.into->sums->has_checksum = true;
      }
    }
    if (t.into == nullptr) (*t.consume)(t.offset, land[i], capacity);
    ucx_bytes_received_total.Add(capacity);
  }
  return absl::OkStatus();
}

absl::Status AutoTransport::WithFallback(
    int32_t host, const std::function<absl::Status()>& ucx,
    const std::function<absl::Status()>& grpc) {
  bool use_grpc = ucx_ == nullptr;
  if (!use_grpc) {
    absl::MutexLock lock(&mu_);
    use_grpc = grpc_only_.count(host) > 0;
  }
  if (!use_grpc) {
    // A retry over gRPC rewrites the same offsets of the same staged
    // buffer with the same bytes, so a partly written piece is safe.
    const absl::Status s = ucx();
    if (s.ok() || s.code() == absl::StatusCode::kAborted ||
        s.code() == absl::StatusCode::kCancelled) {
      return s;
    }
    const bool peer_has_no_ucx = IsNoUcxWorker(s);
    if (peer_has_no_ucx) {
      Log("transformer")
          ->warn("host {} has no UCX worker; using the gRPC transport for it",
                 host);
    } else {
      Log("transformer")
          ->warn(
              "UCX transfer from host {} failed ({}); fetching the piece "
              "again over gRPC and using gRPC for that host from now on",
              host, s.ToString());
      ucx_fallbacks_total.Add();
    }
    absl::MutexLock lock(&mu_);
    grpc_only_.insert(host);
  }
  return grpc();
}

absl::Status AutoTransport::Fetch(int32_t host, const std::string& job,
                                  int64_t version, const std::string& tensor,
                                  const Region& region, int64_t element_size,
                                  const StoreClient::Consumer& consume) {
  return WithFallback(
      host,
      [&] {
        return ucx_->Fetch(host, job, version, tensor, region, element_size,
                           consume);
      },
      [&] {
        return grpc_->Fetch(host, job, version, tensor, region, element_size,
                            consume);
      });
}

absl::Status AutoTransport::FetchBatch(int32_t host, const std::string& job,
                                       int64_t version,
                                       absl::Span<const BatchPiece> pieces) {
  return WithFallback(
      host, [&] { return ucx_->FetchBatch(host, job, version, pieces); },
      [&] { return grpc_->FetchBatch(host, job, version, pieces); });
}

absl::Status AutoTransport::FetchInto(int32_t host, const std::string& job,
                                      int64_t version,
                                      const std::string& tensor,
                                      const Region& region,
                                      int64_t element_size,
                                      absl::Span<const PieceTarget> targets,
                                      const StoreClient::Consumer& consume) {
  return WithFallback(
      host,
      [&] {
        return ucx_->FetchInto(host, job, version, tensor, region, element_size,
                               targets, consume);
      },
      [&] {
        return grpc_->Fetch(host, job, version, tensor, region, element_size,
                            consume);
      });
}

}  // namespace ptc
