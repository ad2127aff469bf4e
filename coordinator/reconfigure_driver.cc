#include "coordinator/reconfigure_driver.h"

#include <grpcpp/grpcpp.h>

#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/internal/cover.h"
#include "coordinator/plan_proto.h"
#include "proto/transformer.grpc.pb.h"
#include "tensor_store/store_client.h"

namespace ptc {
namespace {

std::string HostLabel(const ReconfigureRequest& r, int32_t host) {
  auto it = r.addresses.find(host);
  return absl::StrCat(r.input->cluster->hosts[host].name, " (",
                      it == r.addresses.end() ? "no address" : it->second, ")");
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

proto::ExecuteFragmentRequest FragmentRequest(const ReconfigureRequest& r,
                                              const HostFragment& f) {
  proto::ExecuteFragmentRequest req;
  req.set_job(r.job);
  req.set_source_version(r.source_version);
  req.set_target_version(r.target_version);
  req.set_plan_epoch(r.plan_epoch);
  req.set_host(f.host);
  req.set_parallel_pulls(r.parallel_pulls);
  for (const TensorSpec& t : r.input->spec->tensors) {
    proto::TensorDecl* d = req.add_tensors();
    d->set_key(t.key);
    d->set_dtype(std::string(DTypeName(t.dtype)));
    for (int64_t e : t.shape) d->add_shape(e);
  }
  Plan one;
  one.fragments.push_back(f);
  *req.mutable_fragment() = PlanToProto(one).fragments(0);
  for (const Transfer& x : f.transfers) {
    auto it = r.addresses.find(x.source_host);
    if (it != r.addresses.end()) (*req.mutable_peers())[x.source_host] = it->second;
  }
  return req;
}

// Stages the target version on every target host, in parallel.
absl::Status StageAll(const ReconfigureRequest& r,
                      const std::function<void(const ReconfigureProgress&)>& progress,
                      ReconfigureReport* report) {
  const int n = static_cast<int>(r.plan->fragments.size());
  absl::Mutex mu;
  ReconfigureProgress total;
  total.hosts_total = n;
  std::vector<int64_t> done(n, 0), remote(n, 0);
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (const HostFragment& f : r.plan->fragments) {
    for (const Transfer& x : f.transfers) {
      total.bytes_total += x.region.volume() * ElementSize(r.input->spec->tensors[x.tensor].dtype);
    }
  }
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const HostFragment& f = r.plan->fragments[i];
      auto it = r.addresses.find(f.host);
      if (it == r.addresses.end()) {
        status[i] = absl::InvalidArgumentError("no address for this target host");
        return;
      }
      auto stub = proto::Transformer::NewStub(Channel(it->second));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Hours(2)));
      auto reader = stub->ExecuteFragment(&ctx, FragmentRequest(r, f));
      proto::FragmentProgress p;
      bool finished = false;
      while (reader->Read(&p)) {
        absl::MutexLock lock(&mu);
        total.bytes_done += p.bytes_done() - done[i];
        done[i] = p.bytes_done();
        remote[i] = p.remote_bytes_done();
        if (p.done()) {
          finished = true;
          ++total.hosts_done;
        }
        if (progress) progress(total);
      }
      status[i] = FromGrpcStatus(reader->Finish());
      if (status[i].ok() && !finished) {
        status[i] = absl::UnavailableError("the fragment's stream ended before it was done");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    report->bytes_moved += done[i];
    report->bytes_from_peers += remote[i];
  }
  for (int i = 0; i < n; ++i) {
    if (!status[i].ok()) {
      return Annotate(status[i], absl::StrCat("staging version ", r.target_version, " on ",
                                              HostLabel(r, r.plan->fragments[i].host)));
    }
  }
  return absl::OkStatus();
}

// Sum of the fingerprints of every tensor, each element once, over the
// hosts of one side.
absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> Fingerprints(
    const ReconfigureRequest& r, const Layout& layout, const Placement& placement, int64_t version,
    std::map<int32_t, std::unique_ptr<StoreClient>>* clients) {
  const PlanInput& in = *r.input;
  std::vector<std::pair<uint64_t, int64_t>> out;
  for (int t = 0; t < static_cast<int>(in.spec->tensors.size()); ++t) {
    std::vector<std::pair<int32_t, Region>> held;
    for (const Shard& s : layout.shards(t)) {
      const int h = placement.host[s.rank];
      if (in.IsAlive(h)) held.push_back({h, s.region});
    }
    uint64_t sum = 0;
    int64_t elements = 0;
    const int rank = static_cast<int>(in.spec->tensors[t].shape.size());
    for (const auto& [host, regions] : coordinator_internal::DisjointCover(rank, held)) {
      auto& client = (*clients)[host];
      if (!client) {
        auto it = r.addresses.find(host);
        if (it == r.addresses.end()) {
          return absl::InvalidArgumentError(absl::StrCat("no address for host ", host));
        }
        client = StoreClient::Connect(it->second);
      }
      auto fp = client->Fingerprint(r.job, version, in.spec->tensors[t].key, regions);
      if (!fp.ok()) {
        return Annotate(fp.status(), absl::StrCat("fingerprinting version ", version, " on ",
                                                  HostLabel(r, host)));
      }
      sum += fp->fingerprint();
      elements += fp->elements();
    }
    out.push_back({sum, elements});
  }
  return out;
}

void AbortAll(const ReconfigureRequest& r) {
  for (const HostFragment& f : r.plan->fragments) {
    auto it = r.addresses.find(f.host);
    if (it == r.addresses.end()) continue;
    auto stub = proto::Transformer::NewStub(Channel(it->second));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    proto::AbortStagedRequest req;
    req.set_job(r.job);
    req.set_version(r.target_version);
    req.set_plan_epoch(r.plan_epoch);
    proto::AbortStagedResponse resp;
    const grpc::Status s = stub->AbortStaged(&ctx, req, &resp);
    if (!s.ok()) {
      Log("coordinator")->warn("job {} epoch {}: aborting version {} on {}: {}", r.job,
                               r.plan_epoch, r.target_version, HostLabel(r, f.host),
                               s.error_message());
    }
  }
}

}  // namespace

absl::StatusOr<ReconfigureReport> RunReconfiguration(
    const ReconfigureRequest& r, const std::function<void(const ReconfigureProgress&)>& progress) {
  if (r.input == nullptr || r.plan == nullptr || r.job.empty() || r.plan_epoch <= 0 ||
      r.target_version == r.source_version) {
    return absl::InvalidArgumentError(
        "a reconfiguration needs an input, a plan, a job, a positive epoch and a new version");
  }
  if (r.plan->per_rank) {
    return absl::InvalidArgumentError("per-rank (baseline) plans are for comparison only");
  }
  const absl::Time start = absl::Now();
  ReconfigureReport report;
  absl::Status staged = StageAll(r, progress, &report);
  std::map<int32_t, std::unique_ptr<StoreClient>> clients;
  if (staged.ok()) {
    auto before = Fingerprints(r, *r.input->source, *r.input->source_placement, r.source_version, &clients);
    auto after = Fingerprints(r, *r.input->target, *r.input->target_placement, r.target_version, &clients);
    if (!before.ok()) staged = before.status();
    if (staged.ok() && !after.ok()) staged = after.status();
    for (size_t t = 0; staged.ok() && t < before->size(); ++t) {
      if ((*before)[t] != (*after)[t]) {
        staged = absl::DataLossError(absl::StrCat(
            "tensor '", r.input->spec->tensors[t].key, "' differs after the reconfiguration: ",
            (*after)[t].second, " elements with fingerprint ", (*after)[t].first, " vs ",
            (*before)[t].second, " elements with fingerprint ", (*before)[t].first, " before"));
      }
      ++report.tensors_verified;
    }
  }
  if (!staged.ok()) {
    AbortAll(r);
    Log("coordinator")->error("job {} epoch {}: reconfiguration aborted, version {} intact: {}",
                              r.job, r.plan_epoch, r.source_version, staged.ToString());
    return staged;
  }
  // Commit everywhere. From here the decision is made: a host that does
  // not acknowledge is retried, never rolled back.
  for (const HostFragment& f : r.plan->fragments) {
    absl::Status s;
    for (int attempt = 0; attempt < 5; ++attempt) {
      auto stub = proto::Transformer::NewStub(Channel(r.addresses.at(f.host)));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      proto::CommitStagedRequest req;
      req.set_job(r.job);
      req.set_version(r.target_version);
      req.set_plan_epoch(r.plan_epoch);
      proto::CommitStagedResponse resp;
      s = FromGrpcStatus(stub->CommitStaged(&ctx, req, &resp));
      if (s.ok() || s.code() != absl::StatusCode::kUnavailable) break;
      absl::SleepFor(absl::Milliseconds(200 << attempt));
    }
    if (!s.ok()) {
      return Annotate(s, absl::StrCat("version ", r.target_version,
                                      " is decided committed but not acknowledged by ",
                                      HostLabel(r, f.host), "; retry the commit"));
    }
  }
  if (!r.keep_source) {
    std::set<int32_t> sources;
    for (int32_t h : r.input->source_placement->host) {
      if (r.input->IsAlive(h)) sources.insert(h);
    }
    for (int32_t h : sources) {
      auto& client = clients[h];
      if (!client) client = StoreClient::Connect(r.addresses.at(h));
      auto deleted = client->DeleteVersion(r.job, r.source_version);
      if (!deleted.ok() && deleted.status().code() != absl::StatusCode::kNotFound) {
        Log("coordinator")->warn("job {}: releasing version {} on {}: {}", r.job, r.source_version,
                                 HostLabel(r, h), deleted.status().ToString());
      }
    }
  }
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Log("coordinator")->info("job {} epoch {}: version {} committed ({} bytes, {} from peers, {:.2f} s)",
                           r.job, r.plan_epoch, r.target_version, report.bytes_moved,
                           report.bytes_from_peers, report.seconds);
  return report;
}

}  // namespace ptc
