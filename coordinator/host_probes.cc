// HostProbes: asynchronous direct questions to hosts with late heartbeats.
#include "coordinator/host_probes.h"

#include <algorithm>
#include <utility>

#include "common/channel.h"
#include "common/grpc_status.h"

namespace ptc {

HostProbes::~HostProbes() {
  absl::MutexLock lock(&mu_);
  for (auto& [host, p] : probes_) {
    if (p->in_flight) p->ctx->TryCancel();
  }
  for (auto& p : ending_) {
    if (p->in_flight) p->ctx->TryCancel();
  }
  mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &in_flight_));
}

bool HostProbes::Ask(const std::string& host, const std::string& address,
                     absl::Duration deadline) {
  Probe* p = nullptr;
  {
    absl::MutexLock lock(&mu_);
    CollectEnded();
    std::unique_ptr<Probe>& slot = probes_[host];
    if (slot != nullptr && (slot->in_flight || slot->answered)) return false;
    if (in_flight_ >= max_in_flight_) {
      if (slot == nullptr) probes_.erase(host);
      return false;
    }
    if (slot == nullptr || slot->address != address) {
      slot = std::make_unique<Probe>();
      slot->address = address;
      // A connection of its own (not one a change's calls share: while
      // the host is unreachable, its connection attempts fail seconds
      // each), and the patient keepalive: a host too busy to answer pings
      // within 4 s is slow, not dead; the call's deadline judges it.
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      SetKeepalive(args, /*patient=*/true);
      slot->channel = OpenChannel(address, args, host);
      slot->stub = proto::TensorStore::NewStub(slot->channel);
    }
    p = slot.get();
    p->ctx = std::make_unique<grpc::ClientContext>();
    p->ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    p->resp.Clear();
    p->asked = absl::Now();
    p->in_flight = true;
    ++in_flight_;
  }
  // Started outside the lock: gRPC may run the callback on this thread
  // when the call fails at once. `p` lives until its call ended (Drop
  // keeps it in ending_ until then).
  p->stub->async()->Stats(
      p->ctx.get(), &p->req, &p->resp,
      [this, p, host](grpc::Status status) { Finished(p, host, status); });
  return true;
}

void HostProbes::Finished(Probe* p, const std::string& host,
                          const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  --in_flight_;
  p->in_flight = false;
  if (p->dropped) return;
  Answer a{host, p->asked, absl::UnknownError("")};
  if (status.ok()) {
    a.uptime = absl::Seconds(p->resp.uptime_seconds());
  } else {
    a.uptime = FromGrpcStatus(status);
  }
  p->answered = true;
  answers_.push_back(std::move(a));
}

std::vector<HostProbes::Answer> HostProbes::Take() {
  absl::MutexLock lock(&mu_);
  CollectEnded();
  std::vector<Answer> out;
  out.swap(answers_);
  for (const Answer& a : out) {
    auto it = probes_.find(a.host);
    if (it != probes_.end()) it->second->answered = false;
  }
  return out;
}

void HostProbes::Drop(const std::string& host) {
  absl::MutexLock lock(&mu_);
  CollectEnded();
  answers_.erase(std::remove_if(answers_.begin(), answers_.end(),
                                [&](const Answer& a) { return a.host == host; }),
                 answers_.end());
  auto it = probes_.find(host);
  if (it == probes_.end()) return;
  std::unique_ptr<Probe> p = std::move(it->second);
  probes_.erase(it);
  if (p->in_flight) {
    p->dropped = true;
    p->ctx->TryCancel();
    ending_.push_back(std::move(p));
  }
}

void HostProbes::CollectEnded() {
  ending_.erase(std::remove_if(ending_.begin(), ending_.end(),
                               [](const std::unique_ptr<Probe>& p) {
                                 return !p->in_flight;
                               }),
                ending_.end());
}

int HostProbes::open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(probes_.size() + ending_.size());
}

int HostProbes::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

}  // namespace ptc
