// The streaming RPCs of TensorStoreService: Put and Read.
#include <algorithm>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/authz.h"
#include "common/checksum.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "ptc/fingerprint.h"
#include "ptc/region_proto.h"
#include "tensor_store/tensor_store_service.h"

namespace ptc {
namespace {

Counter& bytes_in_total = GetCounter("ptc_store_bytes_in_total");
Counter& bytes_out_total = GetCounter("ptc_store_bytes_out_total");
Counter& puts_total = GetCounter("ptc_store_puts_total");
Counter& reads_total = GetCounter("ptc_store_reads_total");

constexpr int64_t kDefaultChunk = int64_t{1} << 20;
constexpr int64_t kMaxChunk = int64_t{4} << 20;

}  // namespace

absl::Status TensorStoreService::DoPut(
    grpc::ServerContext* ctx, grpc::ServerReader<proto::PutRequest>* reader,
    proto::PutResponse* resp) {
  proto::PutRequest msg;
  if (!reader->Read(&msg)) {
    return absl::InvalidArgumentError("the Put stream ended before its header");
  }
  if (!msg.has_header()) {
    return absl::InvalidArgumentError(
        "the first message of a Put must carry the header");
  }
  const proto::PutHeader& h = msg.header();
  PTC_RETURN_IF_ERROR(
      AuthorizeCall(*ctx, proto::TensorStore::service_full_name(), "Put", &msg));
  PTC_ASSIGN_OR_RETURN(Region region, RegionFromProto(h.region()));
  std::optional<DType> dtype;
  if (!h.dtype().empty()) {
    PTC_ASSIGN_OR_RETURN(dtype, ParseDType(h.dtype()));
  }
  PTC_ASSIGN_OR_RETURN(
      std::unique_ptr<PendingPut> put,
      store_->BeginPut(h.job(), h.version(), h.tensor(), region, dtype));
  // Watched until it returns: past put_timeout the stream is cancelled and
  // the reservation goes with `put`.
  {
    absl::MutexLock lock(&watch_mu_);
    puts_[ctx] = absl::Now() + put_timeout_;
  }
  absl::Cleanup unwatch = [&] {
    absl::MutexLock lock(&watch_mu_);
    puts_.erase(ctx);
    expired_.erase(ctx);
  };
  uint64_t expected = msg.checksum();
  StreamingChecksum checksum;
  int64_t received = 0;
  uint8_t* out = put->buffer->mutable_data();
  while (reader->Read(&msg)) {
    if (msg.has_header()) {
      return absl::InvalidArgumentError(
          "a Put carries exactly one header, in its first message");
    }
    if (msg.checksum() != 0) expected = msg.checksum();
    const std::string& data = msg.data();
    if (received + static_cast<int64_t>(data.size()) > put->bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the Put sent more than the ", put->bytes, " bytes of region ",
          region.ToString(), "; nothing was stored"));
    }
    // A hollow store counts the bytes and drops them.
    if (out != nullptr) std::memcpy(out + received, data.data(), data.size());
    checksum.Update(data.data(), data.size());
    received += data.size();
  }
  if (ctx->IsCancelled()) {
    bool timed_out;
    {
      absl::MutexLock lock(&watch_mu_);
      timed_out = expired_.count(ctx) > 0;
    }
    if (timed_out) {
      return absl::DeadlineExceededError(
          absl::StrCat("the Put of ", region.ToString(), " did not end within ",
                       absl::FormatDuration(put_timeout_),
                       "; it was cancelled and its memory freed"));
    }
    return absl::CancelledError(absl::StrCat("the client cancelled the Put of ",
                                             region.ToString(),
                                             "; nothing was stored"));
  }
  if (received != put->bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the Put ended after ", received, " of the ", put->bytes,
        " bytes of region ", region.ToString(), "; nothing was stored"));
  }
  const int64_t bytes = put->bytes;
  PTC_ASSIGN_OR_RETURN(
      uint64_t sum,
      store_->FinishPut(std::move(put), checksum.Digest(), expected));
  bytes_in_total.Add(bytes);
  puts_total.Add();
  resp->set_checksum(sum);
  resp->set_bytes(bytes);
  return absl::OkStatus();
}

absl::Status TensorStoreService::DoRead(
    grpc::ServerContext* ctx, const proto::ReadRequest& req,
    grpc::ServerWriter<proto::ReadResponse>* writer) {
  PTC_ASSIGN_OR_RETURN(Region region, RegionFromProto(req.region()));
  PTC_ASSIGN_OR_RETURN(ReadView view, store_->OpenRead(req.job(), req.version(),
                                                       req.tensor(), region));
  const int64_t elem = ElementSize(view.decl.dtype);
  int64_t chunk = req.chunk_bytes() > 0
                      ? std::min<int64_t>(req.chunk_bytes(), kMaxChunk)
                      : kDefaultChunk;
  const int64_t per_chunk = std::max<int64_t>(1, chunk / elem);
  const int64_t total = region.volume();
  if (store_->hollow()) {
    // No bytes to send: one message that stands for them all, after the
    // same checks of the region's coverage as a real read.
    PTC_RETURN_IF_ERROR(ForEachCoveringPiece(
        region, view.sources, [](const Region&, const StoredRegionRef&) {}));
    proto::ReadResponse resp;
    resp.set_hollow_bytes(region.volume() * elem);
    resp.set_checksum(HollowFingerprint(region, view.decl.shape, elem));
    resp.set_last(true);
    if (ctx->IsCancelled() || !writer->Write(resp)) {
      return absl::CancelledError("the reader went away");
    }
    reads_total.Add();
    return absl::OkStatus();
  }
  StreamingChecksum checksum;
  proto::ReadResponse resp;
  int64_t done = 0;
  do {
    const int64_t n = std::min(per_chunk, total - done);
    std::string* data = resp.mutable_data();
    data->resize(n * elem);
    char* dst = data->data();
    // The chunk is a flat range of the region: a few boxes, each dense.
    for (const Region& box : FlatRangeOfRegion(region, done, done + n)) {
      PTC_RETURN_IF_ERROR(ForEachCoveringPiece(
          box, view.sources,
          [&](const Region& piece, const StoredRegionRef& s) {
            CopyRegion(s.buffer->data(), s.region, dst, box, piece, elem);
          }));
      dst += box.volume() * elem;
    }
    checksum.Update(data->data(), data->size());
    done += n;
    const bool last = done >= total;
    resp.set_last(last);
    if (last) {
      const uint64_t digest = checksum.Digest();
      if (view.exact && digest != view.sources[0].checksum) {
        return absl::DataLossError(absl::StrCat(
            "stored region ", region.ToString(), " of tensor '", req.tensor(),
            "' no longer matches the checksum taken when it was stored"));
      }
      resp.set_checksum(digest);
    }
    if (ctx->IsCancelled() || !writer->Write(resp)) {
      return absl::CancelledError("the reader went away");
    }
    bytes_out_total.Add(data->size());
  } while (done < total);
  reads_total.Add();
  return absl::OkStatus();
}

}  // namespace ptc
