// A scheduler's Prepare before a change: the coordinator plans it and the
// target hosts prepare the memory they will stage, so that the change
// writes into ready memory; nothing of the job changes until it runs.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>

#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "common/grpc_status.h"
#include "common/metrics.h"
#include "coordinator/coordinator_server.h"
#include "proto/coordinator.grpc.pb.h"
#include "ptc/layout.h"
#include "ptc/packs.h"
#include "tests/testing.h"

namespace ptc {
namespace {

constexpr char kModel[] =
    "gpt:layers=2,hidden=64,heads=4,ffn=128,vocab=64,positions=8,pad=8";

// A coordinator that knows the cluster's four hosts and job "gpt" at
// version 1 (tp=2 on host0).
proto::CoordinatorState Committed(const testing::DaemonCluster& c) {
  proto::CoordinatorState state = testing::KnownHosts(c, 2);
  auto* j = state.add_jobs();
  j->set_job("gpt");
  j->set_model(kModel);
  j->set_config("tp=2,pp=1,dp=1");
  j->add_hosts("host0");
  j->set_committed_version(1);
  return state;
}

TEST_CASE(
    "prepare: the target hosts of a coming change get its memory ready, and "
    "the change then stages into it",
    "[reconfigure]") {
  testing::DaemonCluster c(4, /*spare_pool=*/64 << 20);
  auto s = MakePlanScenario(kModel, "tp=2,pp=1,dp=1", {0}, "tp=1,pp=2,dp=2",
                            {2, 3}, ptc::Cluster::Uniform(4, 2));
  REQUIRE(s.ok());
  testing::SaveSource(c, "gpt", *s, 1);
  testing::TempDir dir;
  REQUIRE(WriteFileAtomically(dir.path() + "/state.pb",
                              Committed(c).SerializeAsString())
              .ok());
  // Heartbeats are not sent here: a long timeout keeps the hosts alive.
  CoordinatorServerOptions options;
  options.service.state_dir = dir.path();
  options.service.host_timeout = absl::Hours(1);
  auto coordinator = CoordinatorServer::Start(options);
  REQUIRE(coordinator.ok());
  auto stub = proto::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*coordinator)->port()),
                          grpc::InsecureChannelCredentials()));
  proto::ReconfigureRequest req;
  req.set_job("gpt");
  req.set_to("tp=1,pp=2,dp=2");
  req.add_hosts("host2");
  req.add_hosts("host3");

  SECTION("prepared, then reconfigured") {
    proto::PrepareResponse prepared;
    {
      grpc::ClientContext ctx;
      REQUIRE(stub->Prepare(&ctx, req, &prepared).ok());
    }
    // Every byte of the new layout is staged on host2 and host3, and the
    // pools are large enough for all of it.
    REQUIRE(prepared.hosts_size() == 2);
    int64_t needed = 0;
    for (const auto& h : prepared.hosts()) {
      CHECK((h.name() == "host2" || h.name() == "host3"));
      CHECK(h.bytes_needed() > 0);
      CHECK(h.bytes_prepared() == h.bytes_needed());
      CHECK(h.capacity_bytes() == (64 << 20));
      needed += h.bytes_needed();
    }
    CHECK(needed == prepared.plan().target_bytes());
    for (int h : {2, 3}) {
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      while (c.daemons[h]->client->Stats()->spare_queued_bytes() > 0 &&
             absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      CHECK(c.daemons[h]->client->Stats()->spare_bytes() ==
            prepared.hosts(h - 2).bytes_needed());
    }
    // Nothing of the job changed: no version on the targets yet.
    for (int h : {2, 3}) {
      auto list = c.daemons[h]->client->List("gpt");
      REQUIRE(list.ok());
      CHECK((list->jobs_size() == 0 || list->jobs(0).versions_size() == 0));
    }

    const int64_t used_before =
        GetCounter("ptc_store_spares_used_total").value();
    proto::ReconfigureResponse started;
    {
      grpc::ClientContext ctx;
      REQUIRE(stub->Reconfigure(&ctx, req, &started).ok());
    }
    grpc::ClientContext ctx;
    proto::WatchRequest watch;
    watch.set_job("gpt");
    auto reader = stub->Watch(&ctx, watch);
    proto::ReconfigureEvent e;
    while (reader->Read(&e)) {
    }
    REQUIRE(e.phase() == proto::PHASE_COMMITTED);
    testing::VerifyTarget(c, "gpt", *s, 2);
    // Every buffer staged on host2 and host3 was a prepared one.
    int64_t staged = 0;
    for (int h : {2, 3}) {
      auto list = c.daemons[h]->client->List("gpt");
      REQUIRE(list.ok());
      for (const auto& t : list->jobs(0).versions(0).tensors())
        staged += t.regions_size();
    }
    CHECK(GetCounter("ptc_store_spares_used_total").value() - used_before ==
          staged);
  }

  SECTION("a change that waits for the processes' next save prepares its "
          "memory meanwhile") {
    proto::ReconfigureRequest after_save = req;
    after_save.set_after_save(true);
    proto::ReconfigureResponse pending;
    {
      grpc::ClientContext ctx;
      REQUIRE(stub->Reconfigure(&ctx, after_save, &pending).ok());
    }
    // Nothing is stored on host2 and host3: they will stage all of it.
    const int64_t needed = pending.plan().target_bytes();
    REQUIRE(needed > 0);
    int64_t ready = 0;
    for (int h : {2, 3}) {
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      while (c.daemons[h]->client->Stats()->spare_queued_bytes() > 0 &&
             absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      ready += c.daemons[h]->client->Stats()->spare_bytes();
    }
    CHECK(ready == needed);
    // The change itself still waits: no version on the targets yet.
    for (int h : {2, 3}) {
      auto list = c.daemons[h]->client->List("gpt");
      REQUIRE(list.ok());
      CHECK((list->jobs_size() == 0 || list->jobs(0).versions_size() == 0));
    }
  }

  SECTION("a job's hosts prepare its first save when it registers") {
    proto::RegisterJobRequest job;
    job.set_job("fresh");
    job.set_model(kModel);
    job.set_config("tp=2,pp=1,dp=1");
    job.add_hosts("host1");
    proto::RegisterJobResponse registered;
    {
      grpc::ClientContext ctx;
      REQUIRE(stub->RegisterJob(&ctx, job, &registered).ok());
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (c.daemons[1]->client->Stats()->spare_queued_bytes() > 0 &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    // Both ranks put their own copy of each region they share (the norms,
    // replicated across tp): a buffer is ready for every buffer a rank's
    // save asks for, its small regions in packs, as its client makes them
    // from the regions it holds (ptc/packs.h).
    auto layout =
        MakePlanScenario(kModel, "tp=2,pp=1,dp=1", {1}, "tp=2,pp=1,dp=1", {1},
                         ptc::Cluster::Uniform(4, 2));
    REQUIRE(layout.ok());
    auto config = ParallelConfig::Parse("tp=2,pp=1,dp=1");
    REQUIRE(config.ok());
    int64_t puts = 0, region_bytes = 0;
    for (int rank = 0; rank < 2; ++rank) {
      auto mine = BuildRankRegions(layout->spec, *config, rank);
      REQUIRE(mine.ok());
      std::vector<PackCandidate> regions;
      for (size_t t = 0; t < mine->size(); ++t) {
        const TensorSpec& ts = layout->spec.tensors[t];
        for (const Region& r : (*mine)[t]) {
          if (r.empty()) continue;
          regions.push_back({r.volume() * ElementSize(ts.dtype),
                             PackRequestBytes(ts.key, r.rank())});
          region_bytes += regions.back().bytes;
        }
      }
      const std::vector<int64_t> buffers = SaveBufferSizes(regions);
      for (int64_t bytes : buffers) puts += bytes;
      CHECK(buffers.size() < regions.size());  // packed
    }
    CHECK(region_bytes > registered.state_bytes());
    CHECK(puts >= region_bytes);  // each region from a page boundary
    CHECK(c.daemons[1]->client->Stats()->spare_bytes() == puts);
  }

  SECTION("bad requests get clear errors and change nothing") {
    proto::PrepareResponse resp;
    auto call = [&](const proto::ReconfigureRequest& r) {
      grpc::ClientContext ctx;
      return FromGrpcStatus(stub->Prepare(&ctx, r, &resp));
    };
    proto::ReconfigureRequest unknown = req;
    unknown.set_job("nope");
    CHECK(call(unknown).code() == absl::StatusCode::kNotFound);
    proto::ReconfigureRequest too_big = req;
    too_big.set_to("tp=4,pp=2,dp=1");  // 8 ranks on two hosts of 2 GPUs
    const absl::Status s = call(too_big);
    CHECK(!s.ok());
    CHECK(!s.message().empty());
    proto::ReconfigureRequest unregistered = req;
    unregistered.add_hosts("host9");
    CHECK_THAT(std::string(call(unregistered).message()),
               Catch::Contains("host9"));
    for (int h : {2, 3}) {
      CHECK(c.daemons[h]->client->Stats()->spare_queued_bytes() == 0);
      CHECK(c.daemons[h]->client->Stats()->spare_bytes() == 0);
    }
  }
}

}  // namespace
}  // namespace ptc
