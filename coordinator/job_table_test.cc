#include "coordinator/job_table.h"

#include <google/protobuf/descriptor.h>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"

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

TEST_CASE("a host's ranks come from an index that follows the placement") {
  auto job = NewJob("j");
  job->Derive();
  REQUIRE(job->ranks == 2);
  REQUIRE(job->RanksOn("a") != nullptr);
  CHECK(*job->RanksOn("a") == std::vector<int32_t>{0});
  CHECK(*job->RanksOn("b") == std::vector<int32_t>{1});
  CHECK(job->RanksOn("c")->empty());

  // A commit moves the ranks with a new layout epoch.
  job->state.set_rank_hosts(0, "c");
  job->state.set_rank_hosts(1, "c");
  job->state.set_layout_epoch(2);
  CHECK(*job->RanksOn("c") == std::vector<int32_t>{0, 1});
  CHECK(job->RanksOn("a")->empty());

  // A placement changed without its epoch (no coordinator path does): an
  // answer naming a rank that moved away is indexed again.
  job->state.set_rank_hosts(1, "b");
  CHECK(*job->RanksOn("c") == std::vector<int32_t>{0});
  CHECK(*job->RanksOn("b") == std::vector<int32_t>{1});

  // A record that does not place every rank has no index (the coordinator
  // derives the placement then).
  job->state.mutable_rank_devices()->RemoveLast();
  CHECK(job->RanksOn("b") == nullptr);
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

TEST_CASE(
    "the brief status carries the change but not its plan or hosts' "
    "progress; the whole status carries all of it") {
  auto job = NewJob("j");
  // Every field of the event set (by reflection: a field added later
  // that Brief leaves out fails here), the plan and progress long.
  proto::ReconfigureEvent& e = job->event;
  const auto* d = proto::ReconfigureEvent::descriptor();
  const auto* refl = e.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const auto* f = d->field(i);
    if (f->is_repeated()) continue;
    using T = google::protobuf::FieldDescriptor;
    switch (f->cpp_type()) {
      case T::CPPTYPE_INT32:
        refl->SetInt32(&e, f, 3 + i);
        break;
      case T::CPPTYPE_INT64:
        refl->SetInt64(&e, f, 5 + i);
        break;
      case T::CPPTYPE_DOUBLE:
        refl->SetDouble(&e, f, 0.5 + i);
        break;
      case T::CPPTYPE_BOOL:
        refl->SetBool(&e, f, true);
        break;
      case T::CPPTYPE_STRING:
        refl->SetString(&e, f, f->name());
        break;
      case T::CPPTYPE_ENUM:
        refl->SetEnumValue(&e, f, f->enum_type()->value_count() - 1);
        break;
      default:
        break;  // the plan, below
    }
  }
  for (int r = 0; r < 1000; ++r) e.mutable_plan()->add_rank_hosts("a");
  e.mutable_plan()->set_cross_host_bytes(7);
  for (int h = 0; h < 100; ++h) e.add_host_progress()->set_host("a");

  proto::JobStatus brief;
  job->Brief(false, &brief);
  proto::ReconfigureEvent expected = e;
  expected.clear_plan();
  expected.clear_host_progress();
  CHECK(brief.reconfiguration().SerializeAsString() ==
        expected.SerializeAsString());
  CHECK(brief.ByteSizeLong() < 1000);

  proto::JobStatus whole;
  job->Describe(false, &whole);
  CHECK(whole.reconfiguration().SerializeAsString() == e.SerializeAsString());
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

  // A save changes the job's small record only; a placement its other.
  jobs.Find("j")->state.set_committed_version(3);
  writes.clear();
  records = jobs.Writes(&writes);
  REQUIRE(writes.size() == 1);
  CHECK(writes.count(JobRecord("j")));
  CHECK(writes.at(JobRecord("j"))->size() < 200);
  Apply(writes, &stored);
  jobs.Persisted(records);
  jobs.Find("j")->state.set_rank_hosts(1, "c");
  writes.clear();
  records = jobs.Writes(&writes);
  REQUIRE(writes.size() == 1);
  CHECK(writes.count(LayoutRecord("j")));
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
  CHECK(j->state.rank_hosts(1) == "c");
  CHECK(j->state.has_layout() == jobs.Find("j")->state.has_layout());
  CHECK(loaded.Known("nope").status().code() == absl::StatusCode::kNotFound);

  // A record from before the split holds the placement itself: it loads,
  // and the next write splits it.
  proto::CoordinatorState::Job whole = jobs.Find("j")->state;
  CHECK(whole.placement_apart());  // written split
  whole.clear_placement_apart();
  std::map<std::string, std::string> old_format = {
      {JobRecord("j"), whole.SerializeAsString()}};
  JobTable from_old;
  REQUIRE(from_old.Load(old_format, "test").ok());
  CHECK(from_old.Find("j")->state.rank_hosts(1) == "c");
  writes.clear();
  from_old.Writes(&writes);
  CHECK(writes.count(JobRecord("j")));
  CHECK(writes.count(LayoutRecord("j")));
  // Both: the placement's fields come from the placement's record.
  old_format[LayoutRecord("j")] = stored.at(LayoutRecord("j"));
  JobTable both;
  REQUIRE(both.Load(old_format, "test").ok());
  CHECK(both.Find("j")->state.rank_hosts_size() == 2);
  // A split job record whose placement record is missing stops the
  // coordinator rather than load the job without its placement.
  std::map<std::string, std::string> no_placement = stored;
  no_placement.erase(LayoutRecord("j"));
  JobTable missing;
  const absl::Status lost = missing.Load(no_placement, "test");
  CHECK(lost.code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(lost.message()).find("layouts/j") != std::string::npos);
  // A placement record of no job is deleted; an unreadable one stops the
  // coordinator (it holds the job's placement).
  stored[LayoutRecord("gone")] = stored.at(LayoutRecord("k"));
  JobTable stray;
  CHECK_FALSE(stray.Load(stored, "test").ok());  // named k, keyed gone
  proto::CoordinatorState::Job gone;
  gone.set_job("gone");
  stored[LayoutRecord("gone")] = gone.SerializeAsString();
  REQUIRE(stray.Load(stored, "test").ok());
  writes.clear();
  stray.Writes(&writes);
  CHECK(writes.at(LayoutRecord("gone")) == std::nullopt);
}

// Copies kept of `version` of `job`: `n` objects of `bytes` bytes each.
std::shared_ptr<KeptSmallObjects> Kept(int64_t n, size_t bytes) {
  auto plan = std::make_shared<KeepPlan>();
  plan->objects = n;
  auto kept = std::make_shared<KeptSmallObjects>(std::move(plan));
  for (int64_t r = 0; r < n; ++r) {
    REQUIRE(kept->Add("loader", static_cast<int32_t>(r),
                      std::string(bytes, static_cast<char>('a' + r % 26))));
  }
  return kept;
}

TEST_CASE(
    "the committed version's kept copies are written when they change, "
    "and load back") {
  JobTable jobs;
  JobTable::Job& j = jobs.Add(NewJob("j"));
  j.state.set_committed_version(3);
  // An open save's copies are not written: only the committed version's.
  j.kept[4] = Kept(2, 100);
  std::map<std::string, std::string> stored;
  ControlStore::Writes writes;
  auto records = jobs.Writes(&writes);
  CHECK(writes.size() == 2);  // the job's two records
  Apply(writes, &stored);
  jobs.Persisted(records);

  // 40 copies of 16 KiB: three parts of about 256 KiB.
  j.kept[3] = Kept(40, 16 << 10);
  writes.clear();
  records = jobs.Writes(&writes);
  CHECK(writes.size() == 3);
  CHECK(writes.count(KeptRecord("j", 3, 0)));
  CHECK(writes.count(KeptRecord("j", 3, 2)));
  Apply(writes, &stored);
  jobs.Persisted(records);
  writes.clear();
  jobs.Persisted(jobs.Writes(&writes));
  CHECK(writes.empty());  // unchanged: nothing written again

  JobTable loaded;
  REQUIRE(loaded.Load(stored, "test").ok());
  const JobTable::Job* back = loaded.Find("j");
  REQUIRE(back != nullptr);
  REQUIRE(back->kept.count(3));
  const KeptSmallObjects& copies = *back->kept.at(3);
  CHECK(copies.size() == 40);
  CHECK(copies.Complete());
  CHECK(copies.bytes() == 40 * (16 << 10));
  REQUIRE(copies.Find("loader", 27) != nullptr);
  CHECK(*copies.Find("loader", 27) == std::string(16 << 10, 'b'));
  writes.clear();
  loaded.Persisted(loaded.Writes(&writes));
  for (const auto& [key, bytes] : writes)  // the copies as loaded
    CHECK(key.rfind("kept/", 0) != 0);

  SECTION("a new committed version's copies replace the old one's") {
    j.state.set_committed_version(5);
    j.kept[5] = Kept(1, 10);
    j.PruneKept();
    writes.clear();
    jobs.Writes(&writes);
    CHECK(writes.at(KeptRecord("j", 5, 0)).has_value());
    CHECK(writes.at(KeptRecord("j", 3, 0)) == std::nullopt);
    CHECK(writes.at(KeptRecord("j", 3, 1)) == std::nullopt);
    CHECK(writes.at(KeptRecord("j", 3, 2)) == std::nullopt);
  }
  // The stored job record, as if it named `version` as committed.
  auto commit_in_record = [&](int64_t version) {
    proto::CoordinatorState::Job js;
    REQUIRE(js.ParseFromString(stored.at(JobRecord("j"))));
    js.set_committed_version(version);
    stored[JobRecord("j")] = js.SerializeAsString();
  };
  SECTION("copies of a version the job no longer commits are deleted") {
    commit_in_record(5);
    JobTable other;
    REQUIRE(other.Load(stored, "test").ok());
    CHECK(other.Find("j")->kept.empty());
    writes.clear();
    other.Writes(&writes);
    CHECK(writes.count(KeptRecord("j", 3, 0)));
    CHECK(writes.at(KeptRecord("j", 3, 1)) == std::nullopt);
  }
  SECTION(
      "a stale record that the next write puts again is put, not "
      "deleted") {
    // Written, but the job's record still names version 2 (a crash
    // between the copies' transaction and the job's); version 3 then
    // commits again with its copies.
    commit_in_record(2);
    JobTable other;
    REQUIRE(other.Load(stored, "test").ok());
    JobTable::Job& again = *other.Find("j");
    CHECK(again.kept.empty());
    again.state.set_committed_version(3);
    again.kept[3] = Kept(40, 16 << 10);
    writes.clear();
    other.Writes(&writes);
    for (int part = 0; part < 3; ++part)
      CHECK(writes.at(KeptRecord("j", 3, part)).has_value());
  }
  SECTION("an incomplete set (a part missing) is not loaded, and deleted") {
    stored.erase(KeptRecord("j", 3, 1));
    JobTable other;
    REQUIRE(other.Load(stored, "test").ok());
    CHECK(other.Find("j")->kept.empty());
    writes.clear();
    other.Writes(&writes);
    CHECK(writes.at(KeptRecord("j", 3, 0)) == std::nullopt);
    CHECK(writes.at(KeptRecord("j", 3, 2)) == std::nullopt);
  }
  SECTION("a record under another job's key is not taken") {
    stored[KeptRecord("k", 3, 0)] = stored.at(KeptRecord("j", 3, 0));
    JobTable other;
    REQUIRE(other.Load(stored, "test").ok());
    writes.clear();
    other.Writes(&writes);
    CHECK(writes.at(KeptRecord("k", 3, 0)) == std::nullopt);
    CHECK(other.Find("j")->kept.at(3)->size() == 40);
  }
}

// The control store in memory, whose `refuse_at`th transaction (from 1)
// is refused as etcd refuses one past its space quota.
class MemoryStore final : public ControlStore {
 public:
  std::map<std::string, std::string> records;
  int commits = 0;
  int refuse_at = 0;

  absl::StatusOr<std::map<std::string, std::string>> ReadAll() override {
    return records;
  }
  absl::Status Commit(const Writes& writes) override {
    if (writes.size() > kMaxRecordsPerCommit)
      return TooManyRecords(writes.size());
    if (++commits == refuse_at)
      return absl::ResourceExhaustedError("space quota used up");
    Apply(writes, &records);
    return absl::OkStatus();
  }
  std::string Describe() const override { return "memory"; }
};

TEST_CASE(
    "a write refused after some of its transactions committed leaves the "
    "table knowing what the store holds") {
  // 200 jobs; job7 has version 3 committed and kept copies of it (three
  // records).
  JobTable jobs;
  for (int i = 0; i < 200; ++i) jobs.Add(NewJob(absl::StrCat("job", i)));
  JobTable::Job& j7 = *jobs.Find("job7");
  j7.state.set_committed_version(3);
  j7.kept[3] = Kept(40, 16 << 10);
  MemoryStore store;
  ControlStore::Writes writes;
  JobTable::Records records = jobs.Writes(&writes);
  REQUIRE(CommitRecords(store, std::move(writes)).status.ok());
  jobs.Persisted(std::move(records));
  const std::map<std::string, std::string> before = store.records;

  // Every job commits version 4: 200 job records, job7's copies of 4 put
  // and those of 3 deleted. Written as: the copies' puts (two
  // transactions: at most 512 KiB each), 128 jobs, 72 jobs, the deletes;
  // the fourth transaction is refused.
  for (int i = 0; i < 200; ++i)
    jobs.Find(absl::StrCat("job", i))->state.set_committed_version(4);
  j7.kept[4] = Kept(40, 16 << 10);
  j7.kept.erase(3);
  writes.clear();
  records = jobs.Writes(&writes);
  REQUIRE(writes.size() == 200 + 3 + 3);
  store.refuse_at = 4;
  store.commits = 0;
  CommittedRecords done = CommitRecords(store, std::move(writes));
  REQUIRE(done.status.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(done.written.size() == 3 + 128);
  CHECK(store.records.count(KeptRecord("job7", 4, 0)));
  CHECK(store.records.count(KeptRecord("job7", 3, 0)));
  jobs.PartlyPersisted(done.written);
  store.refuse_at = 0;

  SECTION("undone in memory, the next write puts back what was written") {
    for (int i = 0; i < 200; ++i)
      jobs.Find(absl::StrCat("job", i))->state.set_committed_version(0);
    j7.state.set_committed_version(3);
    j7.kept.erase(4);
    j7.kept[3] = Kept(40, 16 << 10);
    writes.clear();
    records = jobs.Writes(&writes);
    // The 128 jobs' records written, job7's copies of 3 put again and
    // those of 4 deleted.
    CHECK(writes.size() == 128 + 3 + 3);
    REQUIRE(CommitRecords(store, std::move(writes)).status.ok());
    jobs.Persisted(std::move(records));
    CHECK(store.records == before);
  }
  SECTION("kept in memory, the next write puts the rest") {
    writes.clear();
    records = jobs.Writes(&writes);
    // The 72 jobs refused, job7's copies of 4 put again and those of 3
    // deleted.
    CHECK(writes.size() == 72 + 3 + 3);
    REQUIRE(CommitRecords(store, std::move(writes)).status.ok());
    jobs.Persisted(std::move(records));
    CHECK_FALSE(store.records.count(KeptRecord("job7", 3, 0)));
    JobTable loaded;
    REQUIRE(loaded.Load(store.records, "test").ok());
    for (int i = 0; i < 200; ++i) {
      const JobTable::Job* j = loaded.Find(absl::StrCat("job", i));
      REQUIRE(j != nullptr);
      CHECK(j->state.committed_version() == 4);
    }
    CHECK(loaded.Find("job7")->kept.at(4)->size() == 40);
  }
  // The table is told the store holds it all now: nothing to write.
  writes.clear();
  jobs.Writes(&writes);
  CHECK(writes.empty());
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
