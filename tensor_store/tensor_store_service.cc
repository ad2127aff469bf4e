#include "tensor_store/tensor_store_service.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/authz.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "ptc/region_proto.h"

namespace ptc {
namespace {

Counter& requests_total = GetCounter("ptc_store_requests_total");
Counter& errors_total = GetCounter("ptc_store_errors_total");

// Failed calls by status code; every code is exported from the start (at
// 0), so that a rate over it exists before the first error.
Counter& ErrorsByCode(absl::StatusCode code) {
  return GetCounter(absl::StrCat("ptc_store_errors_by_code_total{code=\"",
                                 absl::StatusCodeToString(code), "\"}"));
}
[[maybe_unused]] const bool errors_by_code_exported = [] {
  for (int c = 1; c <= 16; ++c) ErrorsByCode(static_cast<absl::StatusCode>(c));
  return true;
}();

}  // namespace

class TensorStoreService::Call {
 public:
  Call(TensorStoreService* s, const char* method) : s_(s), method_(method) {
    s_->active_calls_.fetch_add(1);
    requests_total.Add();
  }
  ~Call() { s_->active_calls_.fetch_sub(1); }

  grpc::Status Done(const absl::Status& status) {
    if (!status.ok()) {
      errors_total.Add();
      ErrorsByCode(status.code()).Add();
      const bool client_fault =
          status.code() == absl::StatusCode::kInvalidArgument ||
          status.code() == absl::StatusCode::kNotFound ||
          status.code() == absl::StatusCode::kCancelled ||
          status.code() == absl::StatusCode::kAlreadyExists;
      // A caller repeating a failing call does not flood the log.
      const auto level =
          client_fault ? spdlog::level::debug : spdlog::level::warn;
      int64_t held = 0;
      if (Log("rpc")->should_log(level) &&
          LogAllowed(absl::StrCat("failed ", method_), &held)) {
        Log("rpc")->log(level, "{}: {}{}", method_, status.ToString(),
                        SuppressedNote(held));
      }
    }
    return ToGrpcStatus(status);
  }

 private:
  TensorStoreService* s_;
  const char* method_;
};

TensorStoreService::TensorStoreService(Store* store,
                                       std::function<int()> local_clients,
                                       absl::Duration put_timeout,
                                       std::shared_ptr<PeerAdmissions> admissions)
    : store_(store),
      local_clients_(std::move(local_clients)),
      put_timeout_(put_timeout),
      admissions_(std::move(admissions)) {
  watchdog_ = std::thread([this] { WatchPuts(); });
}

TensorStoreService::~TensorStoreService() {
  {
    absl::MutexLock lock(&watch_mu_);
    stop_ = true;
  }
  watchdog_.join();
}

void TensorStoreService::WatchPuts() {
  const absl::Duration tick =
      std::clamp(put_timeout_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  absl::MutexLock lock(&watch_mu_);
  while (!watch_mu_.AwaitWithTimeout(absl::Condition(&stop_), tick)) {
    const absl::Time now = absl::Now();
    for (auto it = puts_.begin(); it != puts_.end();) {
      if (it->second > now) {
        ++it;
        continue;
      }
      // Under watch_mu_: the call is still running (its handler erases
      // it under the same lock before returning).
      it->first->TryCancel();
      expired_.insert(it->first);
      it = puts_.erase(it);
    }
  }
}

absl::Status TensorStoreService::CheckHostAdmitted(
    const grpc::ServerContext& ctx, const char* rpc, const std::string& job) {
  if (!TlsEnabled()) return absl::OkStatus();
  const std::string caller = CallerName(ctx);
  if (CallerKind(caller) != kHost) return absl::OkStatus();
  if (admissions_ == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(rpc, " is not served to hosts here"));
  }
  return admissions_->Check(job, 0, caller, rpc);
}

absl::StatusOr<ClientCalls::Slot> TensorStoreService::EnterClientCall(
    const grpc::ServerContext& ctx, const char* rpc, bool writes) {
  if (TlsEnabled()) {
    if (CallerKind(CallerName(ctx)) != kClient) return ClientCalls::Slot();
    PTC_ASSIGN_OR_RETURN(std::optional<std::string> job, ClientJob(ctx));
    return client_calls_.Enter(ctx.peer(), job.value_or(""), rpc);
  }
  // Without TLS nobody is known: calls that only clients make (writes;
  // peers read, the coordinator commits) are counted as clients'.
  if (!writes) return ClientCalls::Slot();
  return client_calls_.Enter(ctx.peer(), "", rpc);
}

grpc::Status TensorStoreService::DeclareTensors(
    grpc::ServerContext* ctx, const proto::DeclareTensorsRequest* req,
    proto::DeclareTensorsResponse* resp) {
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "DeclareTensors", req);
      !denied.ok())
    return denied;
  Call call(this, "DeclareTensors");
  auto slot = EnterClientCall(*ctx, "DeclareTensors", /*writes=*/true);
  if (!slot.ok()) return call.Done(slot.status());
  std::vector<TensorDecl> decls;
  for (const proto::TensorDecl& d : req->tensors()) {
    auto decl = TensorDeclFromProto(d);
    if (!decl.ok()) return call.Done(decl.status());
    decls.push_back(*std::move(decl));
  }
  auto added = store_->DeclareTensors(req->job(), decls);
  if (added.ok()) resp->set_declared(*added);
  return call.Done(added.status());
}

grpc::Status TensorStoreService::Put(
    grpc::ServerContext* ctx, grpc::ServerReader<proto::PutRequest>* reader,
    proto::PutResponse* resp) {
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "Put", nullptr);
      !denied.ok())
    return denied;
  Call call(this, "Put");
  auto slot = EnterClientCall(*ctx, "Put", /*writes=*/true);
  if (!slot.ok()) return call.Done(slot.status());
  return call.Done(DoPut(ctx, reader, resp));
}

grpc::Status TensorStoreService::Read(
    grpc::ServerContext* ctx, const proto::ReadRequest* req,
    grpc::ServerWriter<proto::ReadResponse>* writer) {
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "Read", req);
      !denied.ok())
    return denied;
  if (absl::Status denied = CheckHostAdmitted(*ctx, "Read", req->job());
      !denied.ok())
    return ToGrpcStatus(denied);
  Call call(this, "Read");
  auto slot = EnterClientCall(*ctx, "Read", /*writes=*/false);
  if (!slot.ok()) return call.Done(slot.status());
  return call.Done(DoRead(ctx, *req, writer));
}

grpc::Status TensorStoreService::List(grpc::ServerContext* ctx,
                                      const proto::ListRequest* req,
                                      proto::ListResponse* resp) {
  // A job's client lists its own job only.
  std::string job;
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "List", req, &job);
      !denied.ok())
    return denied;
  Call call(this, "List");
  auto slot = EnterClientCall(*ctx, "List", /*writes=*/false);
  if (!slot.ok()) return call.Done(slot.status());
  *resp = store_->List(job);
  if (!req->job().empty() && resp->jobs().empty()) {
    return call.Done(absl::NotFoundError(
        absl::StrCat("job '", req->job(), "' is unknown to this ptcd")));
  }
  return call.Done(absl::OkStatus());
}

grpc::Status TensorStoreService::Stat(grpc::ServerContext* ctx,
                                      const proto::StatRequest* req,
                                      proto::StatResponse* resp) {
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "Stat", req);
      !denied.ok())
    return denied;
  Call call(this, "Stat");
  auto slot = EnterClientCall(*ctx, "Stat", /*writes=*/false);
  if (!slot.ok()) return call.Done(slot.status());
  auto stat = store_->Stat(req->job(), req->version(), req->tensor());
  if (stat.ok()) *resp = std::move(*stat);
  return call.Done(stat.status());
}

namespace {

// One tensor's answer of a Fingerprint or Fingerprints call: the
// fingerprint of `regions` (all stored elements if none) into `out`.
absl::Status FingerprintInto(
    Store* store, const std::string& job, int64_t version,
    const std::string& tensor,
    const google::protobuf::RepeatedPtrField<proto::Region>& regions,
    proto::FingerprintResponse* out) {
  std::vector<Region> parsed;
  for (const proto::Region& r : regions) {
    auto region = RegionFromProto(r);
    if (!region.ok())
      return Annotate(region.status(), absl::StrCat("tensor '", tensor, "'"));
    parsed.push_back(std::move(*region));
  }
  PTC_ASSIGN_OR_RETURN(auto fp,
                       store->Fingerprint(job, version, tensor, parsed));
  out->set_fingerprint(fp.first);
  out->set_elements(fp.second);
  return absl::OkStatus();
}

}  // namespace

grpc::Status TensorStoreService::Fingerprint(
    grpc::ServerContext* ctx, const proto::FingerprintRequest* req,
    proto::FingerprintResponse* resp) {
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "Fingerprint", req);
      !denied.ok())
    return denied;
  Call call(this, "Fingerprint");
  auto slot = EnterClientCall(*ctx, "Fingerprint", /*writes=*/false);
  if (!slot.ok()) return call.Done(slot.status());
  return call.Done(FingerprintInto(store_, req->job(), req->version(),
                                   req->tensor(), req->regions(), resp));
}

grpc::Status TensorStoreService::Fingerprints(
    grpc::ServerContext* ctx, const proto::FingerprintsRequest* req,
    proto::FingerprintsResponse* resp) {
  if (grpc::Status denied =
          Admit<proto::TensorStore>(*ctx, "Fingerprints", req);
      !denied.ok())
    return denied;
  Call call(this, "Fingerprints");
  if (req->tensors_size() > kMaxFingerprintsPerCall) {
    return call.Done(absl::InvalidArgumentError(absl::StrCat(
        req->tensors_size(), " tensors in one Fingerprints call; at most ",
        kMaxFingerprintsPerCall, " (split the request)")));
  }
  auto slot = EnterClientCall(*ctx, "Fingerprints", /*writes=*/false);
  if (!slot.ok()) return call.Done(slot.status());
  for (const proto::TensorRegions& t : req->tensors()) {
    // A caller that left (or a daemon that drains) stops the hashing.
    if (ctx->IsCancelled()) {
      return call.Done(absl::CancelledError("the caller cancelled the call"));
    }
    if (absl::Status s =
            FingerprintInto(store_, req->job(), req->version(), t.tensor(),
                            t.regions(), resp->add_tensors());
        !s.ok())
      return call.Done(s);
  }
  return call.Done(absl::OkStatus());
}

grpc::Status TensorStoreService::CommitVersion(
    grpc::ServerContext* ctx, const proto::CommitVersionRequest* req,
    proto::CommitVersionResponse* resp) {
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "CommitVersion", req);
      !denied.ok())
    return denied;
  Call call(this, "CommitVersion");
  constexpr int kMaxExpectations = 1000000;
  if (req->expect_regions_size() > kMaxExpectations ||
      req->expect_small_objects_size() > kMaxExpectations) {
    return call.Done(absl::InvalidArgumentError(absl::StrCat(
        "a commit may expect at most ", kMaxExpectations,
        " regions and small objects; got ", req->expect_regions_size(), " and ",
        req->expect_small_objects_size())));
  }
  const bool by_id = req->expectations_id() != 0 &&
                     req->expect_regions().empty() &&
                     req->expect_small_objects().empty();
  std::shared_ptr<const VersionExpectation> expect;
  if (by_id) {
    absl::MutexLock lock(&kept_mu_);
    auto it = kept_.find(req->job());
    if (it == kept_.end() || it->second.id != req->expectations_id()) {
      resp->set_expectations_unknown(true);
      return call.Done(absl::OkStatus());
    }
    expect = it->second.expect;
  } else {
    auto given = std::make_shared<VersionExpectation>();
    given->regions.reserve(req->expect_regions_size());
    for (const proto::ExpectedRegion& e : req->expect_regions()) {
      auto r = RegionFromProto(e.region());
      if (!r.ok()) return call.Done(r.status());
      given->regions.emplace_back(e.tensor(), *std::move(r));
    }
    for (const proto::ExpectedSmallObject& e : req->expect_small_objects())
      given->small_objects.emplace_back(e.name(), e.rank());
    expect = std::move(given);
  }
  auto result = store_->CommitChecked(req->job(), req->version(), *expect,
                                      req->check_only());
  if (!by_id && req->expectations_id() != 0 && !expect->empty() &&
      result.ok()) {
    // Kept for the job's next commits (one list per job, replaced).
    absl::MutexLock lock(&kept_mu_);
    kept_[req->job()] = {req->expectations_id(), std::move(expect)};
  }
  if (result.ok()) {
    resp->set_bytes(result->bytes);
    for (uint64_t c : result->checksums) resp->add_checksums(c);
  }
  return call.Done(result.status());
}

grpc::Status TensorStoreService::PutSmallObject(
    grpc::ServerContext* ctx, const proto::PutSmallObjectRequest* req,
    proto::PutSmallObjectResponse* resp) {
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "PutSmallObject", req);
      !denied.ok())
    return denied;
  Call call(this, "PutSmallObject");
  auto slot = EnterClientCall(*ctx, "PutSmallObject", /*writes=*/true);
  if (!slot.ok()) return call.Done(slot.status());
  absl::Status s =
      store_->PutSmallObject(req->job(), req->version(), req->name(),
                             req->rank(), req->data(), req->checksum());
  if (s.ok()) {
    auto ref = store_->GetSmallObject(req->job(), req->version(), req->name(),
                                      req->rank());
    if (ref.ok()) resp->set_checksum(ref->checksum);
  }
  return call.Done(s);
}

grpc::Status TensorStoreService::GetSmallObject(
    grpc::ServerContext* ctx, const proto::GetSmallObjectRequest* req,
    proto::GetSmallObjectResponse* resp) {
  if (grpc::Status denied =
          Admit<proto::TensorStore>(*ctx, "GetSmallObject", req);
      !denied.ok())
    return denied;
  if (absl::Status denied =
          CheckHostAdmitted(*ctx, "GetSmallObject", req->job());
      !denied.ok())
    return ToGrpcStatus(denied);
  Call call(this, "GetSmallObject");
  auto slot = EnterClientCall(*ctx, "GetSmallObject", /*writes=*/false);
  if (!slot.ok()) return call.Done(slot.status());
  auto ref = store_->GetSmallObject(req->job(), req->version(), req->name(),
                                    req->rank());
  if (ref.ok()) {
    resp->set_data(*ref->bytes);
    resp->set_checksum(ref->checksum);
  }
  return call.Done(ref.status());
}

grpc::Status TensorStoreService::GetSmallObjects(
    grpc::ServerContext* ctx, const proto::GetSmallObjectsRequest* req,
    proto::GetSmallObjectsResponse* resp) {
  if (grpc::Status denied =
          Admit<proto::TensorStore>(*ctx, "GetSmallObjects", req);
      !denied.ok())
    return denied;
  if (absl::Status denied =
          CheckHostAdmitted(*ctx, "GetSmallObjects", req->job());
      !denied.ok())
    return ToGrpcStatus(denied);
  Call call(this, "GetSmallObjects");
  if (req->objects_size() == 0 ||
      req->objects_size() > kMaxSmallObjectsPerCall) {
    return call.Done(absl::InvalidArgumentError(absl::StrCat(
        "asked for ", req->objects_size(), " small objects; ask for 1 to ",
        kMaxSmallObjectsPerCall, " a call")));
  }
  auto slot = EnterClientCall(*ctx, "GetSmallObjects", /*writes=*/false);
  if (!slot.ok()) return call.Done(slot.status());
  int64_t bytes = 0;
  for (const proto::SmallObjectKey& key : req->objects()) {
    auto ref = store_->GetSmallObject(req->job(), req->version(), key.name(),
                                      key.rank());
    if (!ref.ok()) return call.Done(ref.status());  // all or an error
    // The first always; the rest while the answer stays within its
    // budget (the caller asks again for what did not fit).
    bytes += static_cast<int64_t>(ref->bytes->size()) + 32;  // and framing
    if (resp->objects_size() > 0 && bytes > kSmallObjectsAnswerBytes) break;
    proto::GetSmallObjectResponse* o = resp->add_objects();
    o->set_data(*ref->bytes);
    o->set_checksum(ref->checksum);
  }
  return call.Done(absl::OkStatus());
}

grpc::Status TensorStoreService::DeleteVersion(
    grpc::ServerContext* ctx, const proto::DeleteVersionRequest* req,
    proto::DeleteVersionResponse* resp) {
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "DeleteVersion", req);
      !denied.ok())
    return denied;
  Call call(this, "DeleteVersion");
  auto bytes = store_->DeleteVersion(req->job(), req->version());
  if (bytes.ok()) resp->set_bytes(*bytes);
  return call.Done(bytes.status());
}

grpc::Status TensorStoreService::DeleteJob(grpc::ServerContext* ctx,
                                           const proto::DeleteJobRequest* req,
                                           proto::DeleteJobResponse* resp) {
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "DeleteJob", req);
      !denied.ok())
    return denied;
  Call call(this, "DeleteJob");
  auto deleted = store_->DeleteJob(req->job());
  if (admissions_ != nullptr) admissions_->Forget(req->job());
  {
    absl::MutexLock lock(&kept_mu_);
    kept_.erase(req->job());
  }
  if (deleted.ok()) {
    resp->set_versions(deleted->first);
    resp->set_bytes(deleted->second);
  }
  return call.Done(deleted.status());
}

grpc::Status TensorStoreService::PrepareMemory(
    grpc::ServerContext* ctx, const proto::PrepareMemoryRequest* req,
    proto::PrepareMemoryResponse* resp) {
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "PrepareMemory", req);
      !denied.ok())
    return denied;
  Call call(this, "PrepareMemory");
  auto queued = store_->PrepareMemory(
      req->job(), req->version(), {req->sizes().begin(), req->sizes().end()});
  if (queued.ok()) {
    resp->set_covered_bytes(*queued);
    resp->set_capacity_bytes(store_->spare_capacity());
  }
  return call.Done(queued.status());
}

grpc::Status TensorStoreService::Stats(grpc::ServerContext* ctx,
                                       const proto::StatsRequest* req,
                                       proto::StatsResponse* resp) {
  if (grpc::Status denied = Admit<proto::TensorStore>(*ctx, "Stats", req);
      !denied.ok())
    return denied;
  Call call(this, "Stats");
  auto slot = EnterClientCall(*ctx, "Stats", /*writes=*/false);
  if (!slot.ok()) return call.Done(slot.status());
  store_->FillStats(resp);
  resp->set_local_clients(local_clients_ ? local_clients_() : 0);
  resp->set_active_calls(active_calls_.load());
  resp->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  for (const auto& [name, value] : CounterValues()) {
    if (!absl::StartsWith(name, "ptc_")) continue;
    proto::Counter* c = resp->add_counters();
    c->set_name(name);
    c->set_value(value);
  }
  return call.Done(absl::OkStatus());
}

}  // namespace ptc
