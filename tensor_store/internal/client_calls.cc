#include "tensor_store/internal/client_calls.h"

#include "absl/strings/str_cat.h"

namespace ptc {

ClientCalls::Slot& ClientCalls::Slot::operator=(Slot&& o) noexcept {
  if (this != &o) {
    if (calls_ != nullptr) calls_->Leave(connection_, job_);
    calls_ = o.calls_;
    connection_ = std::move(o.connection_);
    job_ = std::move(o.job_);
    o.calls_ = nullptr;
  }
  return *this;
}

ClientCalls::Slot::~Slot() {
  if (calls_ != nullptr) calls_->Leave(connection_, job_);
}

absl::StatusOr<ClientCalls::Slot> ClientCalls::Enter(
    const std::string& connection, const std::string& job, const char* rpc) {
  absl::MutexLock lock(&mu_);
  const char* bound = nullptr;
  int limit = 0;
  if (connections_[connection] >= bounds_.per_connection) {
    bound = "this connection holds";
    limit = bounds_.per_connection;
  } else if (!job.empty() && jobs_[job] >= bounds_.per_job) {
    bound = "this job's clients hold";
    limit = bounds_.per_job;
  } else if (all_ >= bounds_.all) {
    bound = "all jobs' clients hold";
    limit = bounds_.all;
  }
  if (bound != nullptr) {
    if (connections_[connection] == 0) connections_.erase(connection);
    if (!job.empty() && jobs_[job] == 0) jobs_.erase(job);
    return absl::ResourceExhaustedError(absl::StrCat(
        rpc, " refused: ", bound, " ", limit,
        " calls on this ptcd already, the most allowed; end some (an idle "
        "Put stream holds a server thread) or retry later"));
  }
  ++connections_[connection];
  if (!job.empty()) ++jobs_[job];
  ++all_;
  Slot slot;
  slot.calls_ = this;
  slot.connection_ = connection;
  slot.job_ = job;
  return slot;
}

void ClientCalls::Leave(const std::string& connection, const std::string& job) {
  absl::MutexLock lock(&mu_);
  if (--connections_[connection] <= 0) connections_.erase(connection);
  if (!job.empty() && --jobs_[job] <= 0) jobs_.erase(job);
  --all_;
}

int ClientCalls::active() const {
  absl::MutexLock lock(&mu_);
  return all_;
}

}  // namespace ptc
