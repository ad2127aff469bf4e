// The local control store: records round-trip, a transaction of several
// records is all or none across a crash (its journal is applied by the
// next reader), and only the coordinator's keys are taken. etcd's options
// are checked before anything is contacted (tests/python/test_ha.py runs
// the etcd store against real etcd members).
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "common/atomic_file.h"
#include "coordinator/control_store.h"
#include "coordinator/etcd_control_store.h"
#include "proto/coordinator.pb.h"
#include "tensor_store/internal/testing.h"

namespace ptc {
namespace {

TEST_CASE("the local control store writes, reads and deletes records") {
  testing::TempDir dir;
  auto store = OpenLocalControlStore(dir.path());
  REQUIRE(store.ok());
  REQUIRE((*store)->ReadAll()->empty());
  REQUIRE((*store)->Commit({{kClusterRecord, "c1"},
                            {JobRecord("a"), "ja"},
                            {JobRecord("b c/../d"), "jb"},
                            {HostRecord("gpu-node-7"), "h7"}})
              .ok());
  // Files as coordinators before the interface wrote them: state.pb and
  // jobs/NAME.pb (a name that is not a safe file name in hex).
  CHECK(std::filesystem::exists(dir.path() + "/state.pb"));
  CHECK(std::filesystem::exists(dir.path() + "/jobs/a.pb"));
  CHECK(std::filesystem::exists(dir.path() + "/jobs/x-6220632f2e2e2f64.pb"));
  CHECK(std::filesystem::exists(dir.path() + "/hosts/gpu-node-7.pb"));
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/commit.pb"));
  auto all = OpenLocalControlStore(dir.path()).value()->ReadAll();
  REQUIRE(all.ok());
  CHECK(*all == std::map<std::string, std::string>{{"cluster", "c1"},
                                                   {"hosts/gpu-node-7", "h7"},
                                                   {"jobs/a", "ja"},
                                                   {"jobs/b c/../d", "jb"}});
  REQUIRE((*store)->Commit({{JobRecord("a"), std::nullopt},
                            {HostRecord("gpu-node-7"), std::nullopt},
                            {kClusterRecord, "c2"}})
              .ok());
  all = (*store)->ReadAll();
  CHECK(*all == std::map<std::string, std::string>{{"cluster", "c2"},
                                                   {"jobs/b c/../d", "jb"}});
}

TEST_CASE("a transaction a crash interrupted is finished by the next reader") {
  testing::TempDir dir;
  auto store = OpenLocalControlStore(dir.path()).value();
  REQUIRE(store->Commit({{kClusterRecord, "old"}, {JobRecord("a"), "a1"}}).ok());
  // The journal of {cluster: new, a: deleted, b: b1} was written, and the
  // process died before applying any of it.
  proto::ControlCommit journal;
  (*journal.mutable_put())["cluster"] = "new";
  (*journal.mutable_put())["jobs/b"] = "b1";
  journal.add_deleted("jobs/a");
  REQUIRE(WriteFileAtomically(dir.path() + "/commit.pb",
                              journal.SerializeAsString())
              .ok());
  auto all = OpenLocalControlStore(dir.path()).value()->ReadAll();
  REQUIRE(all.ok());
  CHECK(*all == std::map<std::string, std::string>{{"cluster", "new"},
                                                   {"jobs/b", "b1"}});
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/commit.pb"));
}

TEST_CASE("a damaged journal is reported, not ignored") {
  testing::TempDir dir;
  auto store = OpenLocalControlStore(dir.path()).value();
  std::ofstream(dir.path() + "/commit.pb") << "\xff\xff\xff not a journal";
  auto all = store->ReadAll();
  CHECK(all.status().code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(all.status().message()).find("commit.pb") !=
        std::string::npos);
}

TEST_CASE("the control store takes only the coordinator's records") {
  testing::TempDir dir;
  auto store = OpenLocalControlStore(dir.path()).value();
  for (const char* key : {"", "jobs/", "hosts/", "../etc/passwd", "hosts"}) {
    INFO(key);
    auto s = store->Commit({{key, "x"}});
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(store->ReadAll()->empty());
}

TEST_CASE("a state directory that cannot be written is refused") {
  auto store = OpenLocalControlStore("/proc/ptc-cannot-be-here");
  CHECK(store.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(OpenLocalControlStore("").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("etcd options are checked before anything is contacted") {
  EtcdOptions good;
  good.endpoints = {"127.0.0.1:1"};
  good.identity = "127.0.0.1:7000";
  CHECK(EtcdControlStore::Connect(good).ok());
  auto bad = [&](auto change) {
    EtcdOptions o = good;
    change(o);
    return EtcdControlStore::Connect(o).status().code();
  };
  CHECK(bad([](EtcdOptions& o) { o.endpoints.clear(); }) ==
        absl::StatusCode::kInvalidArgument);
  CHECK(bad([](EtcdOptions& o) { o.prefix = "ptc"; }) ==
        absl::StatusCode::kInvalidArgument);
  CHECK(bad([](EtcdOptions& o) { o.prefix = "/ptc/"; }) ==
        absl::StatusCode::kInvalidArgument);
  CHECK(bad([](EtcdOptions& o) { o.lease = absl::Seconds(1); }) ==
        absl::StatusCode::kInvalidArgument);
  CHECK(bad([](EtcdOptions& o) { o.identity.clear(); }) ==
        absl::StatusCode::kInvalidArgument);
  // A store that never led writes nothing.
  auto store = EtcdControlStore::Connect(good).value();
  CHECK(store->Commit({{kClusterRecord, "x"}}).code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("a 16,384-rank job's record fits one etcd transaction") {
  // 2,048 hosts x 8 GPUs with 16-character names, every host list of the
  // job full (its hosts, pool, a change's targets, releases, acks, lost
  // hosts and a pending change's hosts) and both placements: the largest
  // a job's record gets, whatever its history.
  constexpr int kHosts = 2048, kGpus = 8;
  std::vector<std::string> names;
  for (int h = 0; h < kHosts; ++h) {
    char name[32];
    std::snprintf(name, sizeof(name), "gpu-node-%07d", h);
    names.push_back(name);
  }
  proto::CoordinatorState::Job job;
  job.set_job("llama-405b-pretrain");
  job.set_model("llama3-405b");
  job.set_config("tp=8,pp=16,dp=128");
  job.set_target_config("tp=8,pp=16,dp=120");
  for (auto* list : {job.mutable_hosts(), job.mutable_pool(),
                     job.mutable_target_hosts(), job.mutable_release_hosts(),
                     job.mutable_acked_hosts(), job.mutable_lost_hosts(),
                     job.mutable_pending()->mutable_hosts()}) {
    for (const std::string& n : names) *list->Add() = n;
  }
  for (int r = 0; r < kHosts * kGpus; ++r) {
    job.add_rank_hosts(names[r / kGpus]);
    job.add_rank_devices(r % kGpus);
    job.add_target_rank_hosts(names[r / kGpus]);
    job.add_target_rank_devices(r % kGpus);
  }
  // Each host is a record of its own; a transaction writes the job and
  // at most the hosts that changed with it (here: every one).
  size_t hosts_bytes = 0, largest_host = 0;
  for (const std::string& n : names) {
    proto::HostStatus host;
    proto::HostStatus* h = &host;
    h->set_name(n);
    h->set_address("10.128.255.255:7070");
    h->set_gpus(kGpus);
    h->set_alive(true);
    h->set_memory_bytes(int64_t{2} << 40);
    h->set_gpu_memory_bytes(int64_t{80} << 30);
    h->set_bandwidth(50e9);
    h->set_incarnation(0x7fffffffffffffff);
    // A UCX worker's address (what peers connect to): a few hundred bytes
    // with TCP and shared memory, more with RDMA devices.
    h->set_ucx_address(std::string(512, 'u'));
    hosts_bytes += host.ByteSizeLong();
    largest_host = std::max(largest_host, host.ByteSizeLong());
  }
  WARN("a 16,384-rank job's record: "
       << job.ByteSizeLong() << " bytes; a host's: " << largest_host
       << " bytes (2,048 hosts: " << hosts_bytes << ")");
  // The job with a few hosts (a change that also saw hosts die) fits.
  CHECK(static_cast<int64_t>(job.ByteSizeLong() + 64 * largest_host) <
        kMaxEtcdTransactionBytes);
  // Hosts' records are independent facts: PersistLocked writes many of
  // them (2,048 marked dead at once) in transactions of at most 512 KiB
  // before the rest.
  CHECK(static_cast<int64_t>(hosts_bytes) > 512 * 1024);
}

}  // namespace
}  // namespace ptc
