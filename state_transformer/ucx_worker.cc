#include "state_transformer/ucx_worker.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "state_transformer/ucx_address_check.h"

namespace ptc {
namespace {

ucp_context_h Ctx(void* p) { return static_cast<ucp_context_h>(p); }
ucp_worker_h Wkr(void* p) { return static_cast<ucp_worker_h>(p); }

Counter& endpoints_closed_total =
    GetCounter("ptc_transformer_ucx_endpoints_closed_total");

absl::Status UcxError(const char* what, ucs_status_t s) {
  return absl::UnavailableError(
      absl::StrCat("UCX ", what, ": ", ucs_status_string(s)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(
    bool serve, int max_endpoints) {
  std::unique_ptr<UcxWorker> w(new UcxWorker);
  w->max_endpoints_ = std::max(1, max_endpoints);
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcxError("reading its configuration", s);
  ucp_params_t params = {};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // Tagged messages only: with UCP_FEATURE_RMA, UCX would serve any peer's
  // get or put in software at any address it names (see the header).
  params.features = UCP_FEATURE_TAG;
  params.mt_workers_shared = serve ? 1 : 0;
  ucp_context_h ctx;
  s = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (s != UCS_OK) return UcxError("init", s);
  w->context_ = ctx;
  ucp_worker_params_t wp = {};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = serve ? UCS_THREAD_MODE_MULTI : UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h worker;
  s = ucp_worker_create(ctx, &wp, &worker);
  if (s != UCS_OK) return UcxError("creating a worker", s);
  w->worker_ = worker;
  ucp_address_t* address;
  size_t length;
  s = ucp_worker_get_address(worker, &address, &length);
  if (s != UCS_OK) return UcxError("reading the worker address", s);
  w->address_.assign(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker, address);
  if (serve) {
    w->progress_thread_ = std::thread([p = w.get()] { p->ProgressLoop(); });
    w->endpoints_gauge_ =
        std::make_unique<Gauge>("ptc_transformer_ucx_endpoints",
                                [p = w.get()] { return p->open_endpoints(); });
  }
  return w;
}

void UcxWorker::ProgressLoop() {
  // Peers' rendezvous reads of this worker's sends, and sends whose
  // receiver is not waiting, must complete without a caller driving the
  // worker. Not event-driven: asking UCX for
  // wakeup support drops the shared-memory and CMA transports, which have
  // none. Polls every 10 us while there is traffic, backing off to every
  // 500 us when idle (negligible CPU).
  absl::Duration pause = absl::Microseconds(10);
  while (!stop_.load()) {
    bool busy = false;
    while (ucp_worker_progress(Wkr(worker_)) != 0) busy = true;
    pause = busy ? absl::Microseconds(10)
                 : std::min(pause * 2, absl::Microseconds(500));
    absl::SleepFor(pause);
  }
}

UcxWorker::~UcxWorker() {
  endpoints_gauge_.reset();  // reads endpoints_
  stop_ = true;
  if (progress_thread_.joinable()) progress_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    if (!abandoned_) {  // no graceful close after Abandon: see there
      for (auto& [peer, p] : endpoints_) CloseEndpoint(p->ep);
      for (auto& p : broken_endpoints_) CloseEndpoint(p->ep);
    }
    endpoints_.clear();
    broken_endpoints_.clear();
  }
  if (worker_) ucp_worker_destroy(Wkr(worker_));
  if (context_) ucp_cleanup(Ctx(context_));
}

namespace {

// How a thread waits on a worker: it spins on progress for a while, then
// naps between idle polls, each nap twice the last up to kMaxNap, and
// back to spinning as soon as a poll makes progress. A waiting thread must
// neither starve the threads (or the peer daemon) that produce what it
// waits for, nor wake 50,000 times a second: with a fixed 20 us nap, a
// receiving ptcd spent 12% of its samples in the scheduler during a
// change, while its sources packed the next parts.
class Backoff {
 public:
  // After a poll: `progressed` is what ucp_worker_progress returned.
  void After(unsigned progressed) {
    if (progressed != 0) {
      idle_ = 0;
      nap_ = kFirstNap;
      return;
    }
    if (++idle_ <= kSpins) return;
    absl::SleepFor(nap_);
    nap_ = std::min(nap_ * 2, kMaxNap);
  }
  // Whether the last poll ended in a nap.
  bool napped() const { return idle_ > kSpins; }

 private:
  static constexpr int kSpins = 256;
  static constexpr absl::Duration kFirstNap = absl::Microseconds(20);
  static constexpr absl::Duration kMaxNap = absl::Microseconds(320);
  int idle_ = 0;
  absl::Duration nap_ = kFirstNap;
};

}  // namespace

absl::Status UcxWorker::Progress(void* request, absl::Time deadline,
                                 const char* what,
                                 const std::function<bool()>& give_up) {
  // `give_up` and the deadline are looked at most every kLookEvery, not
  // at every idle poll: a gRPC context's IsCancelled takes a lock, and
  // asked at every poll it took 74% of a sending daemon's CPU samples
  // while it waited for its sends to complete (both cores are busy during
  // a change, so that CPU was the change's time).
  constexpr absl::Duration kLookEvery = absl::Milliseconds(1);
  Backoff backoff;
  uint32_t polls = 0;
  absl::Time next_look = absl::Now() + kLookEvery;
  while (ucp_request_check_status(request) == UCS_INPROGRESS) {
    backoff.After(ucp_worker_progress(Wkr(worker_)));
    // The clock after every nap, and every 256 polls otherwise.
    if (!backoff.napped() && ++polls % 256 != 0) continue;
    const absl::Time now = absl::Now();
    if (now < next_look) continue;
    next_look = now + kLookEvery;
    if (give_up && give_up())
      return absl::CancelledError(absl::StrCat("UCX ", what, " given up"));
    if (now > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("UCX ", what, " did not complete in time"));
    }
  }
  const ucs_status_t s = ucp_request_check_status(request);
  return s == UCS_OK ? absl::OkStatus() : UcxError(what, s);
}

absl::StatusOr<std::unique_ptr<UcxWorker::Receive>> UcxWorker::PostReceive(
    uint64_t tag, void* buffer, size_t size) {
  ucp_request_param_t p = {};
  p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  void* r =
      ucp_tag_recv_nbx(Wkr(worker_), buffer, size, tag, ~ucp_tag_t{0}, &p);
  if (UCS_PTR_IS_ERR(r))
    return UcxError("posting a receive", UCS_PTR_STATUS(r));
  auto receive = std::make_unique<Receive>();
  receive->request = r;
  return receive;
}

absl::StatusOr<size_t> UcxWorker::Wait(Receive* receive, absl::Duration timeout,
                                       const std::function<bool()>& give_up) {
  const absl::Status s =
      Progress(receive->request, absl::Now() + timeout, "receive", give_up);
  if (!s.ok()) {
    Cancel(receive);
    return s;
  }
  ucp_tag_recv_info_t info = {};
  ucp_tag_recv_request_test(receive->request, &info);
  ucp_request_free(receive->request);
  receive->request = nullptr;
  return info.length;
}

void UcxWorker::ProgressUntil(const std::function<bool()>& done,
                              absl::Time deadline) {
  Backoff backoff;
  while (!done() && absl::Now() < deadline)
    backoff.After(ucp_worker_progress(Wkr(worker_)));
}

void UcxWorker::Cancel(Receive* receive) {
  if (receive->request == nullptr) return;
  if (abandoned_) {  // never progressed again; the worker's end frees it
    receive->request = nullptr;
    return;
  }
  ucp_request_cancel(Wkr(worker_), receive->request);
  while (ucp_request_check_status(receive->request) == UCS_INPROGRESS) {
    ucp_worker_progress(Wkr(worker_));
  }
  ucp_request_free(receive->request);
  receive->request = nullptr;
}

void UcxWorker::CloseEndpoint(void* ep) {
  ucp_request_param_t p = {};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* r = ucp_ep_close_nbx(static_cast<ucp_ep_h>(ep), &p);
  if (UCS_PTR_IS_PTR(r)) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS)
      ucp_worker_progress(Wkr(worker_));
    ucp_request_free(r);
  }
  ++closed_;
  endpoints_closed_total.Add();
}

absl::StatusOr<UcxWorker::Peer*> UcxWorker::TakeEndpoint(
    const std::string& peer) {
  // UCX parses a peer's address without its length and aborts the process
  // on one it cannot parse. An address that cannot be one of this UCX's
  // (another header byte: format version and flags; shorter than the
  // worker's 8-byte id) is refused at once; any other new one is parsed
  // first by a child process (CheckUcxAddress).
  if (peer.size() < 9 || peer[0] != address_[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("a peer's UCX worker address (", peer.size(),
                     " bytes) is not one this UCX could have made"));
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(peer);
    if (it != endpoints_.end()) {
      ++it->second->users;
      it->second->last_taken = ++taken_;
      return it->second.get();
    }
  }
  PTC_RETURN_IF_ERROR(CheckUcxAddress(peer));
  absl::MutexLock lock(&mu_);
  auto it = endpoints_.find(peer);
  if (it == endpoints_.end()) {
    // Room first: the least recently used endpoints no send is using are
    // closed (one in use stays, past the bound, until it is given back
    // and another is needed).
    while (static_cast<int>(endpoints_.size()) >= max_endpoints_) {
      auto oldest = endpoints_.end();
      for (auto e = endpoints_.begin(); e != endpoints_.end(); ++e) {
        if (e->second->users == 0 &&
            (oldest == endpoints_.end() ||
             e->second->last_taken < oldest->second->last_taken)) {
          oldest = e;
        }
      }
      if (oldest == endpoints_.end()) break;
      CloseEndpoint(oldest->second->ep);
      endpoints_.erase(oldest);
    }
    ucp_ep_params_t ep_params = {};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(peer.data());
    // No peer-failure mode: UCX has it only for network transports, and
    // asking for it would send even same-machine bytes over TCP instead of
    // shared memory and CMA (measured: 0.2 vs several GB/s). A dead peer
    // is noticed by the deadlines here and by the control plane (its gRPC
    // calls fail; the coordinator aborts the plan).
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    ucp_ep_h created;
    const ucs_status_t s = ucp_ep_create(Wkr(worker_), &ep_params, &created);
    if (s != UCS_OK) return UcxError("connecting to a peer", s);
    auto p = std::make_unique<Peer>();
    p->ep = created;
    it = endpoints_.emplace(peer, std::move(p)).first;
  }
  ++it->second->users;
  it->second->last_taken = ++taken_;
  return it->second.get();
}

void UcxWorker::GiveBack(Peer* peer, bool broken) {
  absl::MutexLock lock(&mu_);
  --peer->users;
  if (broken && !peer->broken) {
    // Not reused: the next send to that address gets a fresh endpoint.
    peer->broken = true;
    for (auto it = endpoints_.begin(); it != endpoints_.end(); ++it) {
      if (it->second.get() != peer) continue;
      broken_endpoints_.push_back(std::move(it->second));
      endpoints_.erase(it);
      break;
    }
  }
  if (!peer->broken || peer->users > 0 || abandoned_) return;
  // The last send using a broken endpoint is done with it.
  CloseEndpoint(peer->ep);
  broken_endpoints_.erase(
      std::find_if(broken_endpoints_.begin(), broken_endpoints_.end(),
                   [&](const auto& p) { return p.get() == peer; }));
}

int UcxWorker::open_endpoints() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(endpoints_.size() + broken_endpoints_.size());
}

int64_t UcxWorker::closed_endpoints() {
  absl::MutexLock lock(&mu_);
  return closed_;
}

absl::Status UcxWorker::Send(const std::string& peer,
                             absl::Span<const SendOp> ops,
                             absl::Duration timeout,
                             const std::function<bool()>& give_up) {
  PTC_ASSIGN_OR_RETURN(Peer * taken, TakeEndpoint(peer));
  ucp_ep_h ep = static_cast<ucp_ep_h>(taken->ep);
  // One send at a time. With several in flight, a sender killed while its
  // receiver reads one leaves the others' rendezvous requests queued at
  // the receiver; UCX 1.13 discards the endpoint when the read fails and
  // then trips over the next request for it (seen on one machine: an
  // assertion that aborted the receiving ptcd). Sending in turn costs a
  // handshake per part, small against a part's bytes (measured).
  absl::Status failure;
  for (const SendOp& op : ops) {
    ucp_request_param_t p = {};
    void* r = ucp_tag_send_nbx(ep, op.data, op.size, op.tag, &p);
    if (UCS_PTR_IS_ERR(r)) {
      failure = UcxError("sending", UCS_PTR_STATUS(r));
      break;
    }
    if (r == nullptr) continue;  // done at once
    failure = Progress(r, absl::Now() + timeout, "send", give_up);
    // A send that failed or timed out is released, not waited for: its
    // receiver is gone or has given up (its own deadline is longer), and
    // sends cannot be cancelled.
    ucp_request_free(r);
    if (!failure.ok()) break;
  }
  GiveBack(taken, /*broken=*/!failure.ok());  // a broken one is not reused
  return failure;
}

}  // namespace ptc
