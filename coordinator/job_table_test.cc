#include "coordinator/job_table.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

constexpr char kModel[] =
    "gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8";

std::unique_ptr<JobTable::Job> NewJob(const std::string& name) {
  auto job = std::make_unique<JobTable::Job>();
  job->state.set_job(name);
  job->state.set_model(kModel);
  job->state.set_config("tp=1,pp=2,dp=1");
  job->state.add_hosts("a");
  job->state.add_hosts("b");
  job->state.add_rank_hosts("a");
  job->state.add_rank_hosts("b");
  job->state.add_rank_devices(0);
  job->state.add_rank_devices(0);
  job->state.set_layout_epoch(1);
  job->state.set_next_version(1);
  job->spec = *JobSpec(kModel, nullptr);
  return job;
}

// The records a transaction of `writes` leaves in `stored`.
void Apply(const ControlStore::Writes& writes,
           std::map<std::string, std::string>* stored) {
  for (const auto& [key, bytes] : writes) {
    if (bytes) {
      (*stored)[key] = *bytes;
    } else {
      stored->erase(key);
    }
  }
}

TEST_CASE("versions: one counter, and what a job owns") {
  auto job = NewJob("j");
  CHECK(job->NewVersion() == 1);
  CHECK(job->NewVersion() == 2);
  job->state.set_committed_version(7);  // a state from before the counter
  CHECK(job->NewVersion() == 8);
  CHECK(job->OwnsVersion(7));  // committed
  CHECK(job->OwnsVersion(9));  // not handed out yet
  CHECK_FALSE(job->OwnsVersion(8));
  job->state.add_open_saves()->set_version(8);
  CHECK(job->OwnsVersion(8));
  CHECK(job->Names("b"));
  CHECK_FALSE(job->Names("c"));
}

TEST_CASE("a write holds the job records that changed, and loads back") {
  JobTable jobs;
  jobs.Add(NewJob("j"));
  jobs.Add(NewJob("k"));
  std::map<std::string, std::string> stored;
  ControlStore::Writes writes;
  auto records = jobs.Writes(&writes);
  CHECK(writes.count(JobRecord("j")));
  CHECK(writes.count(JobRecord("k")));
  CHECK_FALSE(writes.count(kClusterRecord));  // nothing retired: empty
  Apply(writes, &stored);
  jobs.Persisted(records);

  writes.clear();
  jobs.Persisted(jobs.Writes(&writes));
  CHECK(writes.empty());

  jobs.Find("j")->state.set_committed_version(3);
  writes.clear();
  records = jobs.Writes(&writes);
  REQUIRE(writes.size() == 1);
  CHECK(writes.count(JobRecord("j")));
  Apply(writes, &stored);
  jobs.Persisted(records);

  JobTable loaded;
  REQUIRE(loaded.Load(stored, "test").ok());
  REQUIRE(loaded.size() == 2);
  const JobTable::Job* j = loaded.Find("j");
  REQUIRE(j != nullptr);
  CHECK(j->state.committed_version() == 3);
  CHECK(j->ranks == 2);  // derived from the record
  CHECK(j->host_bytes.size() == 2);
  CHECK(j->state.pool_size() == 2);  // a record from before pools: its hosts
  CHECK(loaded.Known("nope").status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a forgotten job's plan epochs are retired, and undone with it") {
  JobTable jobs;
  JobTable::Job& j = jobs.Add(NewJob("j"));
  j.state.set_last_epoch(5);
  ControlStore::Writes first;
  jobs.Persisted(jobs.Writes(&first));

  SECTION("a name registered again continues after them") {
    REQUIRE(jobs.Remove("j") != nullptr);
    ControlStore::Writes writes;
    jobs.Persisted(jobs.Writes(&writes));
    CHECK(writes.at(JobRecord("j")) == std::nullopt);
    REQUIRE(writes.at(kClusterRecord).has_value());
    proto::CoordinatorState cluster;
    REQUIRE(cluster.ParseFromString(*writes.at(kClusterRecord)));
    CHECK(cluster.retired_epochs().at("j") == 5);
    CHECK(jobs.Add(NewJob("j")).state.last_epoch() == 5);
  }
  SECTION("a removal that could not be persisted is put back") {
    auto gone = jobs.Remove("j");
    jobs.Put(std::move(gone));
    ControlStore::Writes writes;
    jobs.Writes(&writes);
    CHECK(writes.empty());  // as persisted: nothing retired
    CHECK(jobs.Find("j") != nullptr);
  }
}

TEST_CASE("records a coordinator cannot read stop it from starting") {
  std::map<std::string, std::string> stored;
  SECTION("not a job's state") {
    stored[JobRecord("x")] = "not a record";
    JobTable jobs;
    CHECK(jobs.Load(stored, "test").code() == absl::StatusCode::kDataLoss);
  }
  SECTION("a layout this version cannot read") {
    proto::CoordinatorState::Job js = NewJob("j")->state;
    js.set_model("no-such-model");
    stored[JobRecord("j")] = js.SerializeAsString();
    JobTable jobs;
    absl::Status s = jobs.Load(stored, "test");
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(s.message()).find("job 'j'") != std::string::npos);
  }
  SECTION("jobs inside the cluster record move to records of their own") {
    proto::CoordinatorState cluster;
    *cluster.add_jobs() = NewJob("old")->state;
    stored[kClusterRecord] = cluster.SerializeAsString();
    JobTable jobs;
    REQUIRE(jobs.Load(stored, "test").ok());
    CHECK(jobs.Find("old") != nullptr);
    ControlStore::Writes writes;
    jobs.Writes(&writes);
    CHECK(writes.count(JobRecord("old")));
    REQUIRE(writes.count(kClusterRecord));
    proto::CoordinatorState rewritten;
    REQUIRE(rewritten.ParseFromString(*writes.at(kClusterRecord)));
    CHECK(rewritten.jobs().empty());
  }
}

}  // namespace
}  // namespace ptc
