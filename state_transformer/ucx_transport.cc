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
#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "ptc/region.h"
#include "ptc/region_proto.h"

namespace ptc {
namespace {

constexpr int64_t kPartBytes = int64_t{64} << 20;

// Every byte received over UCX, and of those the ones read with gets.
Counter& ucx_bytes_received_total =
    GetCounter("ptc_transformer_ucx_bytes_received_total");
Counter& ucx_get_bytes_total =
    GetCounter("ptc_transformer_ucx_get_bytes_total");
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
// touches (the regions a host holds may overlap).
void CopyToOtherTargets(const PieceTarget& into,
                        absl::Span<const PieceTarget> targets,
                        const Region& region, int64_t element_size) {
  for (const PieceTarget& t : targets) {
    if (&t == &into) continue;
    const Region both = t.region.Intersect(region);
    if (!both.empty()) {
      CopyRegion(into.data, into.region, t.data, t.region, both, element_size);
    }
  }
}

}  // namespace

UcxPieceTransport::UcxPieceTransport(
    int64_t plan_epoch, const std::map<int32_t, std::string>& peers,
    std::map<int32_t, std::string> names)
    : epoch_(plan_epoch),
      addresses_(peers),
      names_(std::move(names)),
      control_(peers, names_) {
  for (const auto& [host, address] : peers) {
    grpc::ChannelArguments args;
    stubs_[host] = proto::Transformer::NewStub(grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args));
  }
}

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxPieceTransport::TakeWorker() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      std::unique_ptr<UcxWorker> w = std::move(idle_.back());
      idle_.pop_back();
      return w;
    }
  }
  return UcxWorker::Create(/*serve=*/false);
}

void UcxPieceTransport::ReturnWorker(std::unique_ptr<UcxWorker> worker) {
  if (worker->broken()) return;  // destroyed here, before the buffers go
  absl::MutexLock lock(&mu_);
  idle_.push_back(std::move(worker));
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
  if (stubs_.find(host) == stubs_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no address for source host ", host));
  }
  // The piece is what this host needs of the tensor from `host`; it may
  // span several staged buffers. Each buffer's share lands in it directly;
  // what an earlier buffer holds as well is copied from there.
  std::vector<std::pair<Region, const PieceTarget*>> landed;
  int64_t volume = 0;
  for (const PieceTarget& t : targets) {
    const Region share = t.region.Intersect(region);
    if (share.empty() || t.data == nullptr) continue;
    const bool elsewhere = std::any_of(
        landed.begin(), landed.end(),
        [&](const auto& l) { return l.second->region.Contains(share); });
    if (elsewhere) continue;
    PTC_RETURN_IF_ERROR(
        FetchShare(host, job, version, tensor, share, element_size, t));
    landed.push_back({share, &t});
    volume += share.volume();
  }
  if (volume < region.volume()) {
    // Not covered by the staged buffers given (a caller without any):
    // stream it to `consume`.
    return Pull(host, job, version, tensor, region, element_size, nullptr,
                consume);
  }
  for (const auto& [share, into] : landed) {
    CopyToOtherTargets(*into, targets, share, element_size);
  }
  return absl::OkStatus();
}

absl::Status UcxPieceTransport::FetchShare(int32_t host, const std::string& job,
                                           int64_t version,
                                           const std::string& tensor,
                                           const Region& region,
                                           int64_t element_size,
                                           const PieceTarget& target) {
  const PieceTarget* into = &target;
  auto stub = stubs_.find(host);
  proto::ExposePieceRequest req;
  req.set_job(job);
  req.set_version(version);
  req.set_tensor(tensor);
  RegionToProto(region, req.mutable_region());
  req.set_plan_epoch(epoch_);
  proto::ExposePieceResponse resp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    const absl::Status s =
        FromGrpcStatus(stub->second->ExposePiece(&ctx, req, &resp));
    if (s.code() == absl::StatusCode::kUnimplemented) {
      // The peer cannot expose its memory (or predates gets): it sends.
      return Pull(host, job, version, tensor, region, element_size, into,
                  nullptr);
    }
    if (!s.ok()) {
      return Annotate(s, absl::StrCat("exposing ", region.ToString(), " of '",
                                      tensor, "' on ", PeerLabel(host)));
    }
  }
  // Check what the peer says before reading anything, and count the runs.
  struct Part {
    Region part, stored;
    const proto::ExposedPart* proto;
  };
  std::vector<Part> parts;
  int64_t volume = 0;
  for (const proto::ExposedPart& e : resp.parts()) {
    auto part = RegionFromProto(e.part());
    auto stored = RegionFromProto(e.stored());
    if (!part.ok() || !stored.ok() || !region.Contains(*part) ||
        !stored->Contains(*part) || e.rkey().empty()) {
      return absl::DataLossError(
          absl::StrCat(PeerLabel(host), " exposed a part outside ",
                       region.ToString(), " of '", tensor, "'"));
    }
    volume += part->volume();
    parts.push_back({*std::move(part), *std::move(stored), &e});
  }
  if (volume != region.volume()) {
    return absl::DataLossError(absl::StrCat(
        PeerLabel(host), " exposed ", volume, " of the ", region.volume(),
        " elements of ", region.ToString(), " of '", tensor, "'"));
  }
  // Each part lies in one stored buffer of the source. Parts with long
  // runs are read with gets; others the source sends (from its memory as
  // it is when the part is one span there) and they land in place or are
  // scattered here.
  std::unique_ptr<UcxWorker> worker;
  absl::Cleanup give_back = [&] {
    if (worker) ReturnWorker(std::move(worker));
  };
  // Read a few MiB of runs at a time and checksum them while they are
  // still in cache; runs come in the part's row-major order, which is the
  // order the source checksummed.
  constexpr int64_t kBatchBytes = int64_t{4} << 20;
  std::vector<UcxWorker::GetOp> batch;
  for (const Part& p : parts) {
    int64_t runs = 0;
    ForEachRun(p.stored, into->region, p.part, element_size,
               [&](int64_t, int64_t, int64_t) { ++runs; });
    if (runs == 0) continue;  // an empty part
    if (p.part.volume() * element_size / runs < min_get_run_bytes_) {
      PTC_RETURN_IF_ERROR(Pull(host, job, version, tensor, p.part, element_size,
                               into, nullptr));
      continue;
    }
    if (!worker) {
      PTC_ASSIGN_OR_RETURN(worker, TakeWorker());
    }
    StreamingChecksum sum;
    int64_t batch_bytes = 0;
    absl::Status failed;
    auto flush = [&] {
      if (batch.empty() || !failed.ok()) return;
      failed = worker->Get(resp.ucx_address(), p.proto->rkey(), batch,
                           absl::Seconds(15));
      if (failed.ok()) {
        for (const UcxWorker::GetOp& op : batch) sum.Update(op.local, op.size);
      }
      batch.clear();
      batch_bytes = 0;
    };
    ForEachRun(p.stored, into->region, p.part, element_size,
               [&](int64_t src, int64_t dst, int64_t n) {
                 batch.push_back({into->data + dst, p.proto->address() + src,
                                  static_cast<size_t>(n)});
                 batch_bytes += n;
                 if (batch_bytes >= kBatchBytes) flush();
               });
    flush();
    if (!failed.ok()) {
      return Annotate(
          failed, absl::StrCat("reading ", p.part.ToString(), " of '", tensor,
                               "' from ", PeerLabel(host)));
    }
    if (sum.Digest() != p.proto->checksum()) {
      return absl::DataLossError(absl::StrCat(
          "a part ", p.part.ToString(), " of '", tensor, "' read from ",
          PeerLabel(host), " does not match the checksum its owner computed"));
    }
    ucx_bytes_received_total.Add(p.part.volume() * element_size);
    ucx_get_bytes_total.Add(p.part.volume() * element_size);
  }
  return absl::OkStatus();
}

absl::Status UcxPieceTransport::Fetch(int32_t host, const std::string& job,
                                      int64_t version,
                                      const std::string& tensor,
                                      const Region& region,
                                      int64_t element_size,
                                      const StoreClient::Consumer& consume) {
  return Pull(host, job, version, tensor, region, element_size, nullptr,
              consume);
}

absl::Status UcxPieceTransport::Pull(int32_t host, const std::string& job,
                                     int64_t version, const std::string& tensor,
                                     const Region& region, int64_t element_size,
                                     const PieceTarget* into,
                                     const StoreClient::Consumer& consume) {
  auto stub = stubs_.find(host);
  if (stub == stubs_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no address for source host ", host));
  }
  const std::string peer = PeerLabel(host);
  const int64_t elements = region.volume();
  const int64_t per_part = std::max<int64_t>(1, kPartBytes / element_size);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<UcxWorker> worker, TakeWorker());
  absl::Cleanup give_back = [&] { ReturnWorker(std::move(worker)); };
  thread_local std::vector<char> buffer;
  int64_t first = 0, offset = 0;
  while (first < elements) {
    const int64_t count = std::min(per_part, elements - first);
    const size_t capacity = static_cast<size_t>(count * element_size);
    // A part that is one span of the staged buffer is received in place;
    // others land in a buffer of this thread's and are scattered.
    char* land = nullptr;
    if (into != nullptr) {
      const std::optional<int64_t> at =
          SpanOffset(into->region, region, first, count, element_size);
      if (at) land = reinterpret_cast<char*>(into->data) + *at;
    }
    const bool in_place = land != nullptr;
    if (!in_place) {
      if (buffer.size() < capacity) buffer.resize(capacity);
      land = buffer.data();
    }
    const uint64_t tag = NewTag();
    PTC_ASSIGN_OR_RETURN(auto receive,
                         worker->PostReceive(tag, land, capacity));
    proto::SendPartRequest req;
    req.set_job(job);
    req.set_version(version);
    req.set_tensor(tensor);
    RegionToProto(region, req.mutable_region());
    req.set_first(first);
    req.set_count(count);
    req.set_plan_epoch(epoch_);
    req.set_tag(tag);
    req.set_ucx_address(worker->address());
    // The source sends while we wait for its reply; the receiver must keep
    // progressing its worker meanwhile (UCX rendezvous needs both sides),
    // so the call runs on a helper thread.
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    proto::SendPartResponse resp;
    absl::Status sent;
    std::atomic<bool> replied{false};
    std::thread call([&] {
      sent = FromGrpcStatus(stub->second->SendPart(&ctx, req, &resp));
      replied = true;
    });
    auto got = worker->Wait(receive.get(), absl::Seconds(120),
                            [&] { return replied.load() && !sent.ok(); });
    // The sender's request completes only when our acknowledgement reaches
    // it, and this worker is ours alone: keep progressing it until the
    // source has replied (it answers only after its send completed).
    worker->ProgressUntil([&] { return replied.load(); },
                          absl::Now() + absl::Seconds(120));
    call.join();
    if (!sent.ok()) {
      return Annotate(sent, absl::StrCat("pulling ", region.ToString(), " of '",
                                         tensor, "' from ", peer, " over UCX"));
    }
    if (!got.ok())
      return Annotate(got.status(), absl::StrCat("receiving from ", peer));
    if (static_cast<int64_t>(*got) != resp.bytes() ||
        resp.bytes() != static_cast<int64_t>(capacity)) {
      return absl::DataLossError(absl::StrCat(
          "a part of ", region.ToString(), " of '", tensor, "' from ", peer,
          " arrived with ", *got, " bytes instead of ", capacity, " over UCX"));
    }
    // Checksum (and scatter into `into`) a few hundred KiB at a time, while
    // in cache. What is scattered before the checksum fails is in staged
    // memory that nobody sees and the failure discards; a consumer gets
    // only verified bytes.
    constexpr int64_t kChunk = int64_t{256} << 10;
    const int64_t chunk =
        std::max<int64_t>(1, kChunk / element_size) * element_size;
    StreamingChecksum sum;
    for (int64_t done = 0; done < static_cast<int64_t>(capacity);) {
      const int64_t n = std::min<int64_t>(chunk, capacity - done);
      sum.Update(land + done, n);
      if (!in_place && into != nullptr) {
        ScatterInto(*into, region, (offset + done) / element_size, land + done,
                    n / element_size, element_size);
      }
      done += n;
    }
    if (sum.Digest() != resp.checksum()) {
      return absl::DataLossError(absl::StrCat("a part of ", region.ToString(),
                                              " of '", tensor, "' from ", peer,
                                              " arrived damaged over UCX"));
    }
    if (into == nullptr) consume(offset, land, capacity);
    ucx_bytes_received_total.Add(*got);
    offset += *got;
    first += count;
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
    const bool peer_has_no_ucx =
        s.code() == absl::StatusCode::kFailedPrecondition &&
        absl::StrContains(s.message(), kNoUcxWorker);
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
