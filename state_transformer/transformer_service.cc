#include "state_transformer/transformer_service.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/authz.h"
#include "common/channel.h"
#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/scratch_buffers.h"
#include "common/status_macros.h"
#include "ptc/region_proto.h"
#include "snapshot/snapshot_dir.h"
#include "state_transformer/fragment_executor.h"
#include "state_transformer/snapshot_transport.h"
#include "state_transformer/ucx_transport.h"

namespace ptc {

TransformerService::TransformerService(
    Store* store, TransformerOptions options,
    std::shared_ptr<PeerAdmissions> admissions)
    : store_(store),
      options_(options),
      admissions_(admissions != nullptr ? std::move(admissions)
                                        : std::make_shared<PeerAdmissions>()) {
  // A hollow store has no bytes to register or send: its peers pull over
  // gRPC, where a read stands for the bytes it does not carry.
  if (!options_.use_ucx || store_->hollow()) return;
  auto worker = UcxWorker::Create();
  if (worker.ok()) {
    ucx_ = std::move(*worker);
  } else {
    Log("transformer")
        ->warn("no UCX worker ({}); peers will use the gRPC transport",
               worker.status().ToString());
  }
}

TransformerService::~TransformerService() = default;

absl::Status TransformerService::CheckEpoch(const std::string& job,
                                            int64_t epoch, EpochUse use) {
  if (epoch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan epoch ", epoch, " must be positive"));
  }
  absl::MutexLock lock(&mu_);
  auto it = epochs_.find(job);
  const int64_t newest = it == epochs_.end() ? 0 : it->second.newest;
  if (epoch < newest || (use == EpochUse::kCommit && epoch != newest)) {
    return absl::AbortedError(
        absl::StrCat("plan epoch ", epoch, " of job '", job,
                     "' is stale: this host is at epoch ", newest,
                     "; restart from the current plan"));
  }
  if (it != epochs_.end() && it->second.aborted.count(epoch)) {
    return absl::AbortedError(
        absl::StrCat("plan epoch ", epoch, " of job '", job,
                     "' was aborted on this host; plan the change again"));
  }
  if (use == EpochUse::kFragment) epochs_[job].newest = epoch;
  return absl::OkStatus();
}

absl::StatusOr<FragmentJob> FragmentJobFromRequest(
    const proto::ExecuteFragmentRequest& req) {
  if (req.fragment().host() != req.host()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the fragment is for host ", req.fragment().host(),
                     " but the request says host ", req.host()));
  }
  FragmentJob job;
  job.job = req.job();
  job.source_version = req.source_version();
  job.target_version = req.target_version();
  job.plan_epoch = req.plan_epoch();
  job.host = req.host();
  job.parallel_pulls = req.parallel_pulls() != 0 ? req.parallel_pulls() : 4;
  for (const proto::TensorDecl& d : req.tensors()) {
    PTC_ASSIGN_OR_RETURN(TensorDecl decl, TensorDeclFromProto(d));
    job.tensors.push_back(std::move(decl));
  }
  for (const proto::HeldRegion& h : req.fragment().holds()) {
    PTC_ASSIGN_OR_RETURN(Region r, RegionFromProto(h.region()));
    job.holds.push_back({h.tensor(), std::move(r)});
  }
  for (const proto::Transfer& x : req.fragment().transfers()) {
    PTC_ASSIGN_OR_RETURN(Region r, RegionFromProto(x.region()));
    if (x.alternate_sources_size() > 16) {
      return absl::InvalidArgumentError(
          absl::StrCat("a piece names ", x.alternate_sources_size(),
                       " alternate sources; at most 16"));
    }
    FragmentPiece& piece = job.pieces.emplace_back();
    piece.tensor = x.tensor();
    piece.region = std::move(r);
    piece.source_host = x.source_host();
    piece.target_host = req.host();
    piece.alternates.assign(x.alternate_sources().begin(),
                            x.alternate_sources().end());
  }
  for (const proto::SmallObjectMove& m : req.small_objects()) {
    if (m.target_host() != req.host()) {
      return absl::InvalidArgumentError(
          absl::StrCat("small object '", m.name(), "' is for host ",
                       m.target_host(), ", not this host ", req.host()));
    }
    if (m.alternate_ranks_size() != m.alternate_hosts_size() ||
        m.alternate_ranks_size() > kMaxSmallObjectAlternates) {
      return absl::InvalidArgumentError(absl::StrCat(
          "small object '", m.name().substr(0, 256), "' lists ",
          m.alternate_ranks_size(), " alternate ranks and ",
          m.alternate_hosts_size(), " hosts; give one host per rank, at most ",
          kMaxSmallObjectAlternates));
    }
    SmallObjectMove& o = job.small_objects.emplace_back(SmallObjectMove{
        m.name(), m.target_rank(), m.source_rank(), m.source_host(),
        m.target_host(), m.derive_from().substr(0, 1024)});
    for (int i = 0; i < m.alternate_ranks_size(); ++i)
      o.alternates.push_back({m.alternate_ranks(i), m.alternate_hosts(i)});
    o.derive_fallback = m.derive_fallback().substr(0, 1024);
    if (static_cast<int64_t>(m.kept().size()) > kMaxSmallObjectBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("small object '", m.name().substr(0, 256),
                       "' comes with a kept copy of ", m.kept().size(),
                       " bytes; at most ", kMaxSmallObjectBytes));
    }
    if (m.has_kept()) {
      o.kept_rank = m.kept_rank();
      o.kept = m.kept();
    }
    if (m.source_host() == kFromCoordinator && !o.kept.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "small object '", m.name().substr(0, 256), "' for rank ",
          m.target_rank(),
          " is to come from the coordinator's copy, but none is attached"));
    }
  }
  PTC_RETURN_IF_ERROR(ValidateFragment(job));
  return job;
}

absl::Status TransformerService::DoExecute(
    grpc::ServerContext* ctx, const proto::ExecuteFragmentRequest& req,
    grpc::ServerWriter<proto::FragmentProgress>* writer) {
  PTC_RETURN_IF_ERROR(
      CheckEpoch(req.job(), req.plan_epoch(), EpochUse::kFragment));
  PTC_ASSIGN_OR_RETURN(const FragmentJob job, FragmentJobFromRequest(req));
  // Fence: staged versions of older plans of this job are work nothing
  // owns any more (the coordinator moved on to this epoch); clean them up
  // before staging.
  if (auto stat = store_->List(req.job()); stat.jobs_size() > 0) {
    for (const auto& v : stat.jobs(0).versions()) {
      if (v.stage_epoch() > 0 && v.stage_epoch() < req.plan_epoch() &&
          store_->DeleteStaged(req.job(), v.version(), req.plan_epoch() - 1)) {
        Log("transformer")
            ->info(
                "job {} epoch {}: deleted version {} left staged by epoch {}",
                req.job(), req.plan_epoch(), v.version(), v.stage_epoch());
      }
    }
  }
  std::map<int32_t, std::string> peers(req.peers().begin(), req.peers().end());
  std::map<int32_t, std::string> names(req.peer_names().begin(),
                                       req.peer_names().end());
  if (req.peer_timeout_ms() < 0 || req.peer_timeout_ms() > 3600 * 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer timeout ", req.peer_timeout_ms(),
                     " ms is out of range; use 1 ms to an hour (0: 60 s)"));
  }
  const absl::Duration peer_timeout =
      req.peer_timeout_ms() > 0 ? absl::Milliseconds(req.peer_timeout_ms())
                                : absl::Seconds(60);
  auto ucx_transport = [&] {
    return std::make_unique<UcxPieceTransport>(req.plan_epoch(), peers, names,
                                               peer_timeout);
  };
  // The coordinator cancels the call when the change aborts.
  auto cancelled_call = [ctx] { return ctx->IsCancelled(); };
  std::unique_ptr<PieceTransport> transport;
  switch (req.transport()) {
    case proto::TRANSPORT_GRPC:
      transport = std::make_unique<GrpcPieceTransport>(
          peers, names, peer_timeout, store_->hollow(), cancelled_call);
      break;
    case proto::TRANSPORT_UCX:
      if (!ucx_) {
        return absl::FailedPreconditionError(
            "the UCX transport was asked for, but this ptcd has no UCX "
            "worker");
      }
      transport = ucx_transport();
      break;
    case proto::TRANSPORT_AUTO:
      transport = std::make_unique<AutoTransport>(
          ucx_ ? ucx_transport() : nullptr,
          std::make_unique<GrpcPieceTransport>(peers, names, peer_timeout,
                                               store_->hollow(),
                                               cancelled_call));
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("transport ", req.transport(),
                       " is unknown; use auto (0), ucx (1) or grpc (2)"));
  }
  // Pieces no live host holds come from the job's snapshot.
  const bool from_snapshot =
      std::any_of(job.pieces.begin(), job.pieces.end(),
                  [](const FragmentPiece& p) {
                    return p.source_host == kFromSnapshot;
                  }) ||
      std::any_of(job.small_objects.begin(), job.small_objects.end(),
                  [](const SmallObjectMove& o) {
                    return o.derive_from.empty() &&
                           o.source_host == kFromSnapshot;
                  });
  SnapshotPieceTransport* snapshot = nullptr;
  if (from_snapshot) {
    PTC_RETURN_IF_ERROR(Annotate(
        CheckSnapshotRoot(req.snapshot().dir(), options_.snapshot_root),
        "the fragment's snapshot"));
    auto t = std::make_unique<SnapshotPieceTransport>(
        std::move(transport), req.snapshot(), job.tensors);
    snapshot = t.get();
    transport = std::move(t);
  }
  fragments_running_.fetch_add(1);
  absl::Cleanup running = [this] { fragments_running_.fetch_sub(1); };
  // Spares wait while this stages, from before CreateStaged gives back the
  // job's (ExecuteFragment holds them too).
  const SparePool::RefillHold no_spares = store_->spares().HoldRefill();
  // The tensors must be declared before the version can be created.
  PTC_RETURN_IF_ERROR(store_->DeclareTensors(job.job, job.tensors).status());
  PTC_RETURN_IF_ERROR(Annotate(
      store_->CreateStaged(job.job, job.target_version, job.plan_epoch),
      "abort it before staging it again"));
  proto::FragmentProgress msg;
  absl::Time last_report = absl::InfinitePast();
  bool reader_gone = false;
  // The coordinator cancels the call when the change aborts: no part
  // starts after that.
  std::atomic<bool> cancelled{false};
  auto report = [&](const FragmentProgress& p) {
    if (ctx->IsCancelled()) cancelled = true;
    msg.set_bytes_done(p.bytes_done);
    msg.set_bytes_total(p.bytes_total);
    msg.set_remote_bytes_done(p.remote_bytes_done);
    msg.set_pieces_done(p.pieces_done);
    msg.set_pieces_total(p.pieces_total);
    if (snapshot != nullptr) msg.set_snapshot_bytes_read(snapshot->bytes_read());
    // At most every 50 ms; the final message below always carries totals.
    if (reader_gone || absl::Now() - last_report < absl::Milliseconds(50))
      return;
    last_report = absl::Now();
    if (ctx->IsCancelled() || !writer->Write(msg)) reader_gone = true;
  };
  // The executor rolls back what it staged; the version this call created
  // goes too, whatever failed.
  if (absl::Status s = ::ptc::ExecuteFragment(store_, job, transport.get(),
                                              report, &cancelled);
      !s.ok()) {
    store_->DeleteStaged(job.job, job.target_version, job.plan_epoch);
    return s;
  }
  if (reader_gone || ctx->IsCancelled()) {
    store_->DeleteStaged(job.job, job.target_version, job.plan_epoch);
    return absl::CancelledError(
        "the coordinator went away; the staged version was deleted");
  }
  msg.set_done(true);
  if (snapshot != nullptr) msg.set_snapshot_bytes_read(snapshot->bytes_read());
  writer->Write(msg);
  return absl::OkStatus();
}

grpc::Status TransformerService::ExecuteFragment(
    grpc::ServerContext* ctx, const proto::ExecuteFragmentRequest* req,
    grpc::ServerWriter<proto::FragmentProgress>* writer) {
  if (grpc::Status denied = Admit<proto::Transformer>(*ctx, "ExecuteFragment", req);
      !denied.ok())
    return denied;
  const absl::Status s = DoExecute(ctx, *req, writer);
  if (!s.ok()) {
    Log("transformer")
        ->warn("job {} epoch {}: fragment for version {} failed: {}",
               req->job(), req->plan_epoch(), req->target_version(),
               s.ToString());
  }
  return ToGrpcStatus(s);
}

grpc::Status TransformerService::AbortStaged(
    grpc::ServerContext* ctx, const proto::AbortStagedRequest* req,
    proto::AbortStagedResponse* resp) {
  if (grpc::Status denied = Admit<proto::Transformer>(*ctx, "AbortStaged", req);
      !denied.ok())
    return denied;
  if (req->plan_epoch() <= 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("plan epoch ", req->plan_epoch(), " must be positive")));
  }
  // A fragment of this epoch that arrives late is refused; other epochs,
  // older or newer, are not fenced by it (only a fragment moves the newest
  // epoch). Only jobs this host knows are remembered.
  const bool known = store_->List(req->job()).jobs_size() > 0;
  {
    absl::MutexLock lock(&mu_);
    if (known || epochs_.count(req->job())) {
      std::set<int64_t>& aborted = epochs_[req->job()].aborted;
      aborted.insert(req->plan_epoch());
      if (aborted.size() > kAbortedEpochsKept) aborted.erase(aborted.begin());
    }
  }
  // An abort deletes only a staged version of its own epoch or an older
  // one: never a save's version, never a committed one.
  resp->set_deleted(
      store_->DeleteStaged(req->job(), req->version(), req->plan_epoch()));
  return grpc::Status::OK;
}

grpc::Status TransformerService::CommitStaged(
    grpc::ServerContext* ctx, const proto::CommitStagedRequest* req,
    proto::CommitStagedResponse* resp) {
  if (grpc::Status denied = Admit<proto::Transformer>(*ctx, "CommitStaged", req);
      !denied.ok())
    return denied;
  if (absl::Status s =
          CheckEpoch(req->job(), req->plan_epoch(), EpochUse::kCommit);
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  auto bytes = store_->Commit(req->job(), req->version());
  if (bytes.ok()) resp->set_bytes(*bytes);
  return ToGrpcStatus(bytes.status());
}

absl::Status TransformerService::CheckPeerCall(const grpc::ServerContext* ctx,
                                               const std::string& job,
                                               int64_t plan_epoch, int parts,
                                               const char* what) {
  if (!ucx_) return NoUcxWorkerError();
  if (parts > kMaxPartsPerCall) {
    return absl::InvalidArgumentError(
        absl::StrCat(parts, " ", what, " in one call; at most ",
                     kMaxPartsPerCall, " (split the request)"));
  }
  PTC_RETURN_IF_ERROR(CheckEpoch(job, plan_epoch, EpochUse::kPeer));
  if (ctx == nullptr || !TlsEnabled()) return absl::OkStatus();
  return admissions_->Check(job, plan_epoch, PeerName(*ctx), what);
}

grpc::Status TransformerService::AdmitPeers(grpc::ServerContext* ctx,
                                            const proto::AdmitPeersRequest* req,
                                            proto::AdmitPeersResponse*) {
  if (grpc::Status denied = Admit<proto::Transformer>(*ctx, "AdmitPeers", req);
      !denied.ok())
    return denied;
  constexpr int kMaxAdmitted = 100000;
  if (req->hosts_size() > kMaxAdmitted) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        req->hosts_size(), " hosts admitted at once; at most ", kMaxAdmitted)));
  }
  if (absl::Status s =
          CheckEpoch(req->job(), req->plan_epoch(), EpochUse::kFragment);
      !s.ok())
    return ToGrpcStatus(s);
  admissions_->Admit(req->job(), req->plan_epoch(), req->hosts());
  return grpc::Status::OK;
}

absl::StatusOr<ReadView> TransformerService::OpenForPeer(
    const std::string& job, int64_t version, const std::string& tensor,
    const proto::Region& region) {
  PTC_ASSIGN_OR_RETURN(Region r, RegionFromProto(region));
  return store_->OpenRead(job, version, tensor, r);
}

absl::Status TransformerService::DoSendParts(grpc::ServerContext* ctx,
                                             const proto::SendPartsRequest& req,
                                             proto::SendPartsResponse* resp) {
  PTC_RETURN_IF_ERROR(CheckPeerCall(ctx, req.job(), req.plan_epoch(),
                                    req.parts_size(), "parts"));
  if (req.parts_size() > 0 && req.ucx_address().empty()) {
    return absl::InvalidArgumentError(
        "SendParts needs the caller's UCX worker address to send to");
  }
  // The job's layout is changing: the spares its saves asked for here are
  // of the old layout's sizes, and preparing them would take CPU from the
  // change (a source that is no target had no fragment to drop them).
  store_->spares().ForgetSaves(req.job());
  // A run of a part's bytes in stored memory.
  struct Run {
    const uint8_t* data;
    int64_t bytes;
    const StoredRegionRef* stored;
  };
  // Each part's runs in its row-major order; a part of one run is sent
  // from the store's memory as it is, others are packed.
  struct Part {
    ReadView view;
    std::vector<Run> runs;
    int64_t bytes = 0;
  };
  std::vector<Part> parts(req.parts_size());
  int64_t total = 0, packed = 0;
  for (int i = 0; i < req.parts_size(); ++i) {
    const proto::PartToSend& want = req.parts(i);
    Part& part = parts[i];
    PTC_ASSIGN_OR_RETURN(part.view, OpenForPeer(req.job(), req.version(),
                                                want.tensor(), want.region()));
    const Region& region = part.view.region;
    const int64_t elem = ElementSize(part.view.decl.dtype);
    if (want.first() < 0 || want.count() < 1 ||
        want.count() > region.volume() - want.first()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "part [", want.first(), ", +", want.count(), ") is outside region ",
          region.ToString(), " of '", want.tensor(), "'"));
    }
    part.bytes = want.count() * elem;
    total += part.bytes;
    if (total > kMaxSendPartsBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("parts of more than ", kMaxSendPartsBytes,
                       " bytes asked in one call (split the request)"));
    }
    for (const Region& box :
         FlatRangeOfRegion(region, want.first(), want.first() + want.count())) {
      std::vector<std::pair<int64_t, Run>> box_runs;  // (offset in box, run)
      PTC_RETURN_IF_ERROR(ForEachCoveringPiece(
          box, part.view.sources,
          [&](const Region& piece, const StoredRegionRef& s) {
            ForEachRun(
                s.region, box, piece, elem,
                [&](int64_t src, int64_t dst, int64_t n) {
                  box_runs.push_back({dst, {s.buffer->data() + src, n, &s}});
                });
          }));
      std::sort(box_runs.begin(), box_runs.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& entry : box_runs) {  // they tile the box
        const Run& run = entry.second;
        std::vector<Run>& runs = part.runs;
        if (!runs.empty() && runs.back().stored == run.stored &&
            runs.back().data + runs.back().bytes == run.data) {
          runs.back().bytes += run.bytes;
        } else {
          runs.push_back(run);
        }
      }
    }
    if (part.runs.size() > 1) packed += part.bytes;
  }
  // Short runs (a column slice) are packed into one message per part,
  // checksummed a few hundred KiB at a time while in cache.
  ScratchBuffers::Lease pack = TransferScratch().Take(packed);
  char* dst = pack.data();
  std::vector<UcxWorker::SendOp> sends;
  for (int i = 0; i < req.parts_size(); ++i) {
    const Part& part = parts[i];
    proto::SentPart* sent = resp->add_parts();
    sent->set_bytes(part.bytes);
    if (part.runs.size() == 1) {
      // One span of one stored buffer (a whole region, or rows of one).
      // UCX's rendezvous lets the receiver read it straight into its
      // buffer (RDMA on a cluster, CMA here).
      const Run& run = part.runs.front();
      const bool whole = run.data == run.stored->buffer->data() &&
                         run.bytes == run.stored->buffer->size();
      sent->set_checksum(whole ? run.stored->checksum
                               : Checksum(run.data, run.bytes));
      sends.push_back(
          {req.parts(i).tag(), run.data, static_cast<size_t>(run.bytes)});
      continue;
    }
    char* begin = dst;
    const char* hashed = dst;
    StreamingChecksum sum;
    for (const Run& run : part.runs) {
      std::memcpy(dst, run.data, run.bytes);
      dst += run.bytes;
      if (dst - hashed >= (256 << 10)) {
        sum.Update(hashed, dst - hashed);
        hashed = dst;
      }
    }
    sum.Update(hashed, dst - hashed);
    sent->set_checksum(sum.Digest());
    sends.push_back(
        {req.parts(i).tag(), begin, static_cast<size_t>(dst - begin)});
  }
  // Never past the caller's deadline (which follows the coordinator's host
  // timeout and the bytes asked for); a cancelled call (the caller left, or
  // this daemon drains) stops waiting at once. A call without a deadline
  // gets the one a target would have set with a minute's peer timeout.
  absl::Duration timeout = TransferDeadline(absl::Seconds(60), total);
  if (ctx != nullptr &&
      ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    timeout = absl::FromChrono(ctx->deadline()) - absl::Now();
  }
  absl::Status sent = ucx_->Send(req.ucx_address(), sends, timeout, [ctx] {
    return ctx != nullptr && ctx->IsCancelled();
  });
  // A peer that gave up may still read the packed bytes: not reused.
  if (!sent.ok()) pack.Discard();
  return sent;
}

grpc::Status TransformerService::ExposePieces(
    grpc::ServerContext* ctx, const proto::ExposePiecesRequest* req,
    proto::ExposePiecesResponse*) {
  if (grpc::Status denied = Admit<proto::Transformer>(*ctx, "ExposePieces", req);
      !denied.ok())
    return denied;
  // Kept so that a ptcd of an older release, which asks before it reads,
  // hears this and has every part sent instead.
  return ToGrpcStatus(absl::UnimplementedError(
      "this ptcd serves no one-sided reads of its memory; ask it to send the "
      "parts (SendParts)"));
}

grpc::Status TransformerService::SendParts(grpc::ServerContext* ctx,
                                           const proto::SendPartsRequest* req,
                                           proto::SendPartsResponse* resp) {
  if (grpc::Status denied = Admit<proto::Transformer>(*ctx, "SendParts", req);
      !denied.ok())
    return denied;
  const absl::Status s = DoSendParts(ctx, *req, resp);
  if (!s.ok() && s.code() != absl::StatusCode::kFailedPrecondition) {
    Log("transformer")
        ->warn("SendParts ({} parts) for job {}: {}", req->parts_size(),
               req->job(), s.ToString());
  }
  return ToGrpcStatus(s);
}

}  // namespace ptc
