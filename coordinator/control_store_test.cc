// The local control store: records round-trip, a transaction of several
// records is all or none across a crash (its journal is applied by the
// next reader), and only the coordinator's keys are taken. etcd's options
// are checked before anything is contacted (tests/python/test_ha.py runs
// the etcd store against real etcd members).
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
                            {JobRecord("b c/../d"), "jb"}})
              .ok());
  // Files as coordinators before the interface wrote them: state.pb and
  // jobs/NAME.pb (a name that is not a safe file name in hex).
  CHECK(std::filesystem::exists(dir.path() + "/state.pb"));
  CHECK(std::filesystem::exists(dir.path() + "/jobs/a.pb"));
  CHECK(std::filesystem::exists(dir.path() + "/jobs/x-6220632f2e2e2f64.pb"));
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/commit.pb"));
  auto all = OpenLocalControlStore(dir.path()).value()->ReadAll();
  REQUIRE(all.ok());
  CHECK(*all == std::map<std::string, std::string>{{"cluster", "c1"},
                                                   {"jobs/a", "ja"},
                                                   {"jobs/b c/../d", "jb"}});
  REQUIRE((*store)->Commit({{JobRecord("a"), std::nullopt},
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
  for (const char* key : {"", "jobs/", "../etc/passwd", "hosts"}) {
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

}  // namespace
}  // namespace ptc
