#include "state_transformer/ucx_worker.h"

#include <ucp/api/ucp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace ptc {
namespace {

ucp_context_h Ctx(void* p) { return static_cast<ucp_context_h>(p); }
ucp_worker_h Wkr(void* p) { return static_cast<ucp_worker_h>(p); }

absl::Status UcxError(const char* what, ucs_status_t s) {
  return absl::UnavailableError(
      absl::StrCat("UCX ", what, ": ", ucs_status_string(s)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create() {
  std::unique_ptr<UcxWorker> w(new UcxWorker);
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcxError("reading its configuration", s);
  ucp_params_t params = {};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG;
  params.mt_workers_shared = 1;
  ucp_context_h ctx;
  s = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (s != UCS_OK) return UcxError("init", s);
  w->context_ = ctx;
  ucp_worker_params_t wp = {};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_MULTI;
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
  return w;
}

UcxWorker::~UcxWorker() {
  {
    absl::MutexLock lock(&mu_);
    for (auto& [peer, ep] : endpoints_) {
      ucp_request_param_t p = {};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(static_cast<ucp_ep_h>(ep), &p);
      if (UCS_PTR_IS_PTR(r)) {
        while (ucp_request_check_status(r) == UCS_INPROGRESS)
          ucp_worker_progress(Wkr(worker_));
        ucp_request_free(r);
      }
    }
    endpoints_.clear();
  }
  if (worker_) ucp_worker_destroy(Wkr(worker_));
  if (context_) ucp_cleanup(Ctx(context_));
}

absl::Status UcxWorker::Progress(void* request, absl::Time deadline,
                                 const char* what,
                                 const std::function<bool()>& give_up) {
  int idle = 0;
  while (ucp_request_check_status(request) == UCS_INPROGRESS) {
    if (ucp_worker_progress(Wkr(worker_)) != 0) {
      idle = 0;
    } else {
      // Spin briefly, then back off: a waiting thread must not starve the
      // threads (or the peer daemon) that produce what it waits for.
      if (++idle > 256) absl::SleepFor(absl::Microseconds(20));
      if (give_up && give_up())
        return absl::CancelledError(absl::StrCat("UCX ", what, " given up"));
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("UCX ", what, " did not complete in time"));
      }
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

void UcxWorker::Cancel(Receive* receive) {
  if (receive->request == nullptr) return;
  ucp_request_cancel(Wkr(worker_), receive->request);
  while (ucp_request_check_status(receive->request) == UCS_INPROGRESS) {
    ucp_worker_progress(Wkr(worker_));
  }
  ucp_request_free(receive->request);
  receive->request = nullptr;
}

absl::Status UcxWorker::Send(const std::string& peer, uint64_t tag,
                             const void* buffer, size_t size,
                             absl::Duration timeout) {
  ucp_ep_h ep;
  {
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(peer);
    if (it == endpoints_.end()) {
      ucp_ep_params_t ep_params = {};
      ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                             UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      ep_params.address = reinterpret_cast<const ucp_address_t*>(peer.data());
      ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ucp_ep_h created;
      const ucs_status_t s = ucp_ep_create(Wkr(worker_), &ep_params, &created);
      if (s != UCS_OK) return UcxError("connecting to a peer", s);
      it = endpoints_.emplace(peer, created).first;
    }
    ep = static_cast<ucp_ep_h>(it->second);
  }
  ucp_request_param_t p = {};
  void* r = ucp_tag_send_nbx(ep, buffer, size, tag, &p);
  if (UCS_PTR_IS_ERR(r)) {
    absl::MutexLock lock(&mu_);
    endpoints_.erase(peer);  // a broken endpoint is not reused
    return UcxError("sending", UCS_PTR_STATUS(r));
  }
  if (r == nullptr) return absl::OkStatus();  // done at once
  absl::Status s = Progress(r, absl::Now() + timeout, "send");
  if (!s.ok()) {
    ucp_request_cancel(Wkr(worker_), r);
    while (ucp_request_check_status(r) == UCS_INPROGRESS)
      ucp_worker_progress(Wkr(worker_));
    absl::MutexLock lock(&mu_);
    endpoints_.erase(peer);
  }
  ucp_request_free(r);
  return s;
}

}  // namespace ptc
