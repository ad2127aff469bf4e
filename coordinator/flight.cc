#include "coordinator/flight.h"

#include <algorithm>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ptc {
namespace {

using JobRecord = proto::CoordinatorState::Job;

const char* PhaseName(FlightPhase phase) {
  switch (phase) {
    case FlightPhase::kIdle:
      return "no change in flight";
    case FlightPhase::kStaging:
      return "a change staging";
    case FlightPhase::kDecided:
      return "a decided change";
  }
  return "?";
}

absl::Status NeedPhase(const JobRecord& job, FlightPhase phase,
                       const char* transition) {
  const FlightPhase now = PhaseOf(job);
  if (now == phase) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      transition, " needs ", PhaseName(phase), ", but job '", job.job(),
      "' has ", PhaseName(now),
      now == FlightPhase::kIdle
          ? ""
          : absl::StrCat(" (plan epoch ", job.target_epoch(), ")")));
}

bool Contains(const google::protobuf::RepeatedPtrField<std::string>& v,
              const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Sets a repeated field to `values`.
template <typename Field, typename Values>
void SetAll(Field* field, const Values& values) {
  field->Clear();
  field->Reserve(static_cast<int>(values.size()));
  for (const auto& v : values) *field->Add() = v;
}

// Drops the target fields (after a commit or an abort).
void ClearTarget(JobRecord& job) {
  job.clear_target_config();
  job.clear_target_hosts();
  job.set_target_version(0);
  job.set_target_epoch(0);
  job.set_commit_decided(false);
  job.clear_release_hosts();
  job.set_target_step(0);
  job.clear_acked_hosts();
  job.clear_target_rank_hosts();
  job.clear_target_rank_devices();
  job.clear_restore_dir();
}

}  // namespace

FlightPhase PhaseOf(const JobRecord& job) {
  if (job.target_version() == 0) return FlightPhase::kIdle;
  return job.commit_decided() ? FlightPhase::kDecided : FlightPhase::kStaging;
}

absl::Status StartFlight(const FlightTarget& target, JobRecord& job,
                         proto::ReconfigureEvent& event) {
  if (absl::Status s = NeedPhase(job, FlightPhase::kIdle, "starting a change");
      !s.ok())
    return s;
  if (target.version <= 0 || target.config.empty() ||
      target.rank_hosts.empty() ||
      target.rank_hosts.size() != target.rank_devices.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a change of job '", job.job(), "' needs a config, a version and a ",
        "host and GPU per rank (got version ", target.version, ", ",
        target.rank_hosts.size(), " hosts, ", target.rank_devices.size(),
        " GPUs)"));
  }
  // Rule 1 and the plan's fence: a number never handed out before.
  if (target.epoch <= job.last_epoch()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan epoch ", target.epoch, " of job '", job.job(),
        "' is not above its last epoch ", job.last_epoch(),
        ": the job changed while this change was planned; try again"));
  }
  // The target hosts, each once, in order, and every rank's host among
  // them; looked up in a set of views of `target`'s names (a linear look
  // per rank was 16,384 x 2,048 name comparisons at 2,048 hosts, under
  // the coordinator's lock).
  std::vector<std::string> hosts;
  std::set<std::string_view> named;
  for (const std::string& h :
       target.hosts.empty() ? target.rank_hosts : target.hosts) {
    if (named.insert(h).second) hosts.push_back(h);
  }
  for (const std::string& h : target.rank_hosts) {
    if (named.count(h) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a rank of job '", job.job(), "''s change is placed on host '", h,
          "', which is not one of its target hosts"));
    }
  }
  job.set_target_config(target.config);
  SetAll(job.mutable_target_hosts(), hosts);
  SetAll(job.mutable_target_rank_hosts(), target.rank_hosts);
  SetAll(job.mutable_target_rank_devices(), target.rank_devices);
  job.set_target_version(target.version);
  job.set_target_epoch(target.epoch);
  job.set_last_epoch(target.epoch);
  job.set_target_step(target.step);
  job.set_restore_dir(target.restore_dir);
  job.set_commit_decided(false);
  job.clear_acked_hosts();
  SetAll(job.mutable_release_hosts(), target.release_hosts);
  job.set_target_reason(target.reason);
  const std::string from = job.config();
  event.Clear();
  event.set_plan_epoch(target.epoch);
  event.set_phase(proto::PHASE_STAGING);
  event.set_reason(target.reason);
  event.set_from_config(from);
  event.set_to_config(target.config);
  return absl::OkStatus();
}

absl::Status DecideFlight(JobRecord& job, proto::ReconfigureEvent& event) {
  if (absl::Status s =
          NeedPhase(job, FlightPhase::kStaging, "deciding a commit");
      !s.ok())
    return s;
  job.set_commit_decided(true);
  event.set_phase(proto::PHASE_COMMITTING);
  return absl::OkStatus();
}

absl::Status AcknowledgeFlight(const std::vector<std::string>& hosts,
                               JobRecord& job) {
  if (absl::Status s = NeedPhase(job, FlightPhase::kDecided,
                                 "acknowledging a commit");
      !s.ok())
    return s;
  for (const std::string& h : hosts) {
    if (!Contains(job.target_hosts(), h)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host '", h, "' is not a target of job '", job.job(),
          "''s change (plan epoch ", job.target_epoch(), ")"));
    }
  }
  for (const std::string& h : hosts) {
    if (!Contains(job.acked_hosts(), h)) job.add_acked_hosts(h);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> CommitFlight(
    JobRecord& job, proto::ReconfigureEvent& event) {
  if (absl::Status s =
          NeedPhase(job, FlightPhase::kDecided, "committing a change");
      !s.ok())
    return s;
  // Targets that never acknowledged the decided commit, when some did
  // (rule 5: dead ones are not waited for), do not hold the new version.
  std::vector<std::string> lost;
  if (job.acked_hosts_size() > 0) {
    for (const std::string& h : job.target_hosts()) {
      if (!Contains(job.acked_hosts(), h)) lost.push_back(h);
    }
  }
  job.set_config(job.target_config());
  *job.mutable_hosts() = job.target_hosts();
  *job.mutable_rank_hosts() = job.target_rank_hosts();
  *job.mutable_rank_devices() = job.target_rank_devices();
  job.set_committed_version(job.target_version());
  job.set_committed_step(job.target_step());
  SetAll(job.mutable_lost_hosts(), lost);
  // A new layout (rule 2): saves begun or reported under the old one can
  // never complete, and their versions are reclaimed.
  job.set_layout_epoch(job.layout_epoch() + 1);
  job.clear_open_saves();
  event.set_plan_epoch(job.target_epoch());
  event.set_phase(proto::PHASE_COMMITTED);
  if (!lost.empty()) {
    event.set_error(absl::StrCat(
        "committed without host(s) ", absl::StrJoin(lost, ", "),
        ", which died after the decision; their regions are lost"));
  } else {
    event.clear_error();  // a failed try before the commit finished
  }
  ClearTarget(job);
  return lost;
}

absl::Status AbortFlight(const std::string& why, JobRecord& job,
                         proto::ReconfigureEvent& event) {
  if (absl::Status s =
          NeedPhase(job, FlightPhase::kStaging, "aborting a change");
      !s.ok())
    return s;
  event.set_plan_epoch(job.target_epoch());
  event.set_phase(proto::PHASE_ABORTED);
  event.set_error(why);
  ClearTarget(job);
  return absl::OkStatus();
}

}  // namespace ptc
