#include "tensor_store/store_client.h"

#include <grpc/support/time.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "ptc/region_proto.h"

namespace ptc {
namespace {

void SetDeadline(grpc::ClientContext* ctx, int64_t bytes) {
  ctx->set_deadline(
      absl::ToChronoTime(absl::Now() + StoreClient::DeadlineFor(bytes)));
}

// ptcd's message size.
grpc::ChannelArguments ClientArgs() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  args.SetMaxSendMessageSize(16 << 20);
  return args;
}

}  // namespace

template <typename Request, typename Response>
absl::StatusOr<Response> StoreClient::Unary(
    grpc::Status (proto::TensorStore::Stub::*method)(grpc::ClientContext*,
                                                     const Request&, Response*),
    const Request& req, int64_t bytes, grpc::ClientContext* context) {
  grpc::ClientContext own;
  grpc::ClientContext* ctx = context != nullptr ? context : &own;
  // A deadline the caller set stands (unset, it is the infinite future).
  const gpr_timespec set = ctx->raw_deadline();
  if (gpr_time_cmp(set, gpr_inf_future(set.clock_type)) == 0)
    SetDeadline(ctx, bytes);
  Response resp;
  PTC_RETURN_IF_ERROR(FromGrpcStatus((stub_.get()->*method)(ctx, req, &resp)));
  return resp;
}

absl::Duration StoreClient::DeadlineFor(int64_t bytes) {
  return absl::Seconds(30) + absl::Seconds(static_cast<double>(bytes) / 100e6);
}

StoreClient::StoreClient(std::shared_ptr<grpc::Channel> channel)
    : stub_(proto::TensorStore::NewStub(channel)) {}

std::unique_ptr<StoreClient> StoreClient::Connect(
    const std::string& address, const std::string& expected_name) {
  return std::make_unique<StoreClient>(
      OpenChannel(address, ClientArgs(), expected_name));
}

std::unique_ptr<StoreClient> StoreClient::ConnectKept(
    const std::string& address, const std::string& expected_name) {
  return std::make_unique<StoreClient>(
      HostChannel(address, /*patient=*/false, expected_name));
}

std::unique_ptr<StoreClient> StoreClient::ConnectApart(
    const std::string& address, const std::string& expected_name) {
  grpc::ChannelArguments args = ClientArgs();
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return std::make_unique<StoreClient>(
      OpenChannel(address, args, expected_name));
}

absl::Status StoreClient::Declare(const std::string& job,
                                  const std::vector<TensorDecl>& tensors) {
  proto::DeclareTensorsRequest req;
  req.set_job(job);
  for (const TensorDecl& t : tensors) {
    proto::TensorDecl* d = req.add_tensors();
    d->set_key(t.key);
    d->set_dtype(std::string(DTypeName(t.dtype)));
    for (int64_t e : t.shape) d->add_shape(e);
  }
  return Unary(&proto::TensorStore::Stub::DeclareTensors, req).status();
}

absl::StatusOr<uint64_t> StoreClient::PutWith(
    const std::string& job, int64_t version, const std::string& tensor,
    const Region& region, int64_t bytes, const Producer& produce,
    int64_t chunk_bytes) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, bytes);
  proto::PutResponse resp;
  std::unique_ptr<grpc::ClientWriter<proto::PutRequest>> writer =
      stub_->Put(&ctx, &resp);
  proto::PutRequest msg;
  proto::PutHeader* h = msg.mutable_header();
  h->set_job(job);
  h->set_version(version);
  h->set_tensor(tensor);
  RegionToProto(region, h->mutable_region());
  bool ok = writer->Write(msg);
  msg.Clear();
  StreamingChecksum checksum;
  for (int64_t off = 0; ok && off < bytes; off += chunk_bytes) {
    const int64_t n = std::min(chunk_bytes, bytes - off);
    std::string* data = msg.mutable_data();
    data->resize(n);
    produce(off, data->data(), n);
    checksum.Update(data->data(), n);
    if (off + n >= bytes) msg.set_checksum(checksum.Digest());
    ok = writer->Write(msg);
  }
  writer->WritesDone();
  PTC_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  return resp.checksum();
}

absl::StatusOr<uint64_t> StoreClient::Put(const std::string& job,
                                          int64_t version,
                                          const std::string& tensor,
                                          const Region& region,
                                          const void* data, int64_t bytes) {
  const char* src = static_cast<const char*>(data);
  return PutWith(job, version, tensor, region, bytes,
                 [src](int64_t off, char* dst, int64_t n) {
                   std::memcpy(dst, src + off, n);
                 });
}

absl::StatusOr<int64_t> StoreClient::ReadWith(
    const std::string& job, int64_t version, const std::string& tensor,
    const Region& region, const Consumer& consume, int32_t chunk_bytes,
    absl::Duration timeout, bool hollow) {
  proto::ReadRequest req;
  req.set_job(job);
  req.set_version(version);
  req.set_tensor(tensor);
  req.set_chunk_bytes(chunk_bytes);
  RegionToProto(region, req.mutable_region());
  grpc::ClientContext ctx;
  if (timeout > absl::ZeroDuration()) {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  } else {
    // The size is unknown before the first message; budget for 64 GiB.
    SetDeadline(&ctx, int64_t{64} << 30);
  }
  std::unique_ptr<grpc::ClientReader<proto::ReadResponse>> reader =
      stub_->Read(&ctx, req);
  proto::ReadResponse resp;
  StreamingChecksum checksum;
  int64_t received = 0;
  bool last = false;
  uint64_t sent_checksum = 0;
  bool hollow_read = false;
  while (reader->Read(&resp)) {
    if (resp.hollow_bytes() != 0) {
      if (!hollow || resp.hollow_bytes() < 0 || !resp.data().empty() ||
          resp.hollow_bytes() > (int64_t{1} << 50) - received) {
        ctx.TryCancel();
        while (reader->Read(&resp)) {
        }
        reader->Finish().ok();
        return absl::DataLossError(absl::StrCat(
            "region ", region.ToString(), " of tensor '", tensor,
            "' came from a hollow ptcd (a scale test's, which keeps no "
            "bytes); only a hollow store may read from one"));
      }
      consume(received, nullptr, resp.hollow_bytes());
      received += resp.hollow_bytes();
      hollow_read = true;
      if (resp.last()) {
        last = true;
        sent_checksum = resp.checksum();
      }
      continue;
    }
    consume(received, resp.data().data(), resp.data().size());
    checksum.Update(resp.data().data(), resp.data().size());
    received += resp.data().size();
    if (resp.last()) {
      last = true;
      sent_checksum = resp.checksum();
    }
  }
  PTC_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  if (!last)
    return absl::DataLossError("the read ended without its final message");
  if (!hollow_read && checksum.Digest() != sent_checksum) {
    return absl::DataLossError(
        absl::StrCat("region ", region.ToString(), " of tensor '", tensor,
                     "' arrived with checksum ", checksum.Digest(),
                     " but ptcd sent ", sent_checksum));
  }
  return received;
}

absl::Status StoreClient::Read(const std::string& job, int64_t version,
                               const std::string& tensor, const Region& region,
                               void* out, int64_t bytes) {
  char* dst = static_cast<char*>(out);
  bool overflow = false;
  PTC_ASSIGN_OR_RETURN(int64_t got,
                       ReadWith(job, version, tensor, region,
                                [&](int64_t off, const char* src, int64_t n) {
                                  if (off + n > bytes) {
                                    overflow = true;
                                    return;
                                  }
                                  std::memcpy(dst + off, src, n);
                                }));
  if (overflow || got != bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("region ", region.ToString(), " of tensor '", tensor,
                     "' has ", got, " bytes but the buffer holds ", bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<proto::ListResponse> StoreClient::List(const std::string& job) {
  proto::ListRequest req;
  req.set_job(job);
  return Unary(&proto::TensorStore::Stub::List, req);
}

absl::StatusOr<proto::StatResponse> StoreClient::Stat(
    const std::string& job, int64_t version, const std::string& tensor) {
  proto::StatRequest req;
  req.set_job(job);
  req.set_version(version);
  req.set_tensor(tensor);
  return Unary(&proto::TensorStore::Stub::Stat, req);
}

absl::StatusOr<proto::FingerprintResponse> StoreClient::Fingerprint(
    const std::string& job, int64_t version, const std::string& tensor,
    const std::vector<Region>& regions, grpc::ClientContext* context) {
  proto::FingerprintRequest req;
  req.set_job(job);
  req.set_version(version);
  req.set_tensor(tensor);
  for (const Region& r : regions) RegionToProto(r, req.add_regions());
  return Unary(&proto::TensorStore::Stub::Fingerprint, req, int64_t{8} << 30,
               context);
}

absl::StatusOr<proto::FingerprintsResponse> StoreClient::Fingerprints(
    const std::string& job, int64_t version,
    const std::vector<std::pair<std::string, std::vector<Region>>>& tensors,
    grpc::ClientContext* context) {
  proto::FingerprintsRequest req;
  req.set_job(job);
  req.set_version(version);
  for (const auto& [tensor, regions] : tensors) {
    proto::TensorRegions* t = req.add_tensors();
    t->set_tensor(tensor);
    for (const Region& r : regions) RegionToProto(r, t->add_regions());
  }
  auto got = Unary(&proto::TensorStore::Stub::Fingerprints, req,
                   int64_t{8} << 30, context);
  if (got.ok() && got->tensors_size() != req.tensors_size()) {
    return absl::DataLossError(absl::StrCat("asked for ", req.tensors_size(),
                                            " fingerprints, got ",
                                            got->tensors_size()));
  }
  return got;
}

absl::StatusOr<int64_t> StoreClient::Commit(const std::string& job,
                                            int64_t version) {
  proto::CommitVersionRequest req;
  req.set_job(job);
  req.set_version(version);
  PTC_ASSIGN_OR_RETURN(auto resp,
                       Unary(&proto::TensorStore::Stub::CommitVersion, req));
  return resp.bytes();
}

absl::StatusOr<proto::CommitVersionResponse> StoreClient::CommitChecked(
    const proto::CommitVersionRequest& req) {
  return Unary(&proto::TensorStore::Stub::CommitVersion, req);
}

absl::Status StoreClient::PutSmallObject(const std::string& job,
                                         int64_t version,
                                         const std::string& name, int32_t rank,
                                         const std::string& bytes) {
  proto::PutSmallObjectRequest req;
  req.set_job(job);
  req.set_version(version);
  req.set_name(name);
  req.set_rank(rank);
  req.set_data(bytes);
  req.set_checksum(Checksum(bytes.data(), bytes.size()));
  return Unary(&proto::TensorStore::Stub::PutSmallObject, req).status();
}

absl::StatusOr<std::string> StoreClient::GetSmallObject(
    const std::string& job, int64_t version, const std::string& name,
    int32_t rank, absl::Duration timeout) {
  proto::GetSmallObjectRequest req;
  req.set_job(job);
  req.set_version(version);
  req.set_name(name);
  req.set_rank(rank);
  grpc::ClientContext ctx;
  if (timeout > absl::ZeroDuration())
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  PTC_ASSIGN_OR_RETURN(
      auto resp,
      Unary(&proto::TensorStore::Stub::GetSmallObject, req, 0, &ctx));
  if (Checksum(resp.data().data(), resp.data().size()) != resp.checksum()) {
    return absl::DataLossError(
        absl::StrCat("small object '", name, "' of rank ", rank,
                     " arrived damaged (checksum mismatch)"));
  }
  return std::move(*resp.mutable_data());
}

absl::StatusOr<std::vector<std::string>> StoreClient::GetSmallObjects(
    const std::string& job, int64_t version,
    const std::vector<std::pair<std::string, int32_t>>& objects,
    absl::Time deadline) {
  std::vector<std::string> got;
  got.reserve(objects.size());
  while (got.size() < objects.size()) {
    proto::GetSmallObjectsRequest req;
    req.set_job(job);
    req.set_version(version);
    const size_t end =
        std::min(objects.size(), got.size() + kMaxSmallObjectsPerCall);
    for (size_t i = got.size(); i < end; ++i) {
      proto::SmallObjectKey* key = req.add_objects();
      key->set_name(objects[i].first);
      key->set_rank(objects[i].second);
    }
    grpc::ClientContext ctx;
    if (deadline != absl::InfiniteFuture())
      ctx.set_deadline(absl::ToChronoTime(deadline));
    PTC_ASSIGN_OR_RETURN(
        auto resp,
        Unary(&proto::TensorStore::Stub::GetSmallObjects, req, 0, &ctx));
    if (resp.objects_size() == 0 ||
        resp.objects_size() > static_cast<int>(end - got.size())) {
      return absl::InternalError(
          absl::StrCat("the daemon answered ", resp.objects_size(),
                       " small objects for ", end - got.size(), " asked"));
    }
    for (proto::GetSmallObjectResponse& o : *resp.mutable_objects()) {
      const auto& [name, rank] = objects[got.size()];
      if (Checksum(o.data().data(), o.data().size()) != o.checksum()) {
        return absl::DataLossError(
            absl::StrCat("small object '", name, "' of rank ", rank,
                         " arrived damaged (checksum mismatch)"));
      }
      got.push_back(std::move(*o.mutable_data()));
    }
  }
  return got;
}

absl::StatusOr<int64_t> StoreClient::DeleteVersion(const std::string& job,
                                                   int64_t version,
                                                   absl::Duration timeout) {
  proto::DeleteVersionRequest req;
  req.set_job(job);
  req.set_version(version);
  grpc::ClientContext ctx;
  if (timeout > absl::ZeroDuration())
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  PTC_ASSIGN_OR_RETURN(
      auto resp, Unary(&proto::TensorStore::Stub::DeleteVersion, req, 0, &ctx));
  return resp.bytes();
}

absl::StatusOr<proto::DeleteJobResponse> StoreClient::DeleteJob(
    const std::string& job) {
  proto::DeleteJobRequest req;
  req.set_job(job);
  return Unary(&proto::TensorStore::Stub::DeleteJob, req);
}

absl::StatusOr<proto::PrepareMemoryResponse> StoreClient::PrepareMemory(
    const std::string& job, int64_t version, const std::vector<int64_t>& sizes,
    absl::Duration timeout) {
  proto::PrepareMemoryRequest req;
  req.set_job(job);
  req.set_version(version);
  for (int64_t s : sizes) req.add_sizes(s);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  proto::PrepareMemoryResponse resp;
  PTC_RETURN_IF_ERROR(FromGrpcStatus(stub_->PrepareMemory(&ctx, req, &resp)));
  return resp;
}

absl::StatusOr<proto::StatsResponse> StoreClient::Stats(
    absl::Duration timeout) {
  grpc::ClientContext ctx;
  if (timeout > absl::ZeroDuration())
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return Unary(&proto::TensorStore::Stub::Stats, proto::StatsRequest(), 0,
               &ctx);
}

}  // namespace ptc
