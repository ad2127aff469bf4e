// ptc-hollow: hollow hosts and hollow ranks, many in one process, for the
// scale harness (tools/scale_harness.py). What they skip is the bytes,
// nothing else.
//
//   ptc-hollow hosts --coordinator ADDR --count N [--first I] [--dir DIR]
//       runs N ptcds in this process, named hollow-00000, hollow-00001, ...
//       from I: each the real daemon (its store, gRPC services, local
//       socket DIR/NAME.sock, state transformer, coordinator agent with
//       its heartbeats and reclaims, coordinator relay
//       DIR/NAME-coordinator.sock unless --relay off) over a hollow store,
//       which keeps every region's metadata and none of its bytes
//       (StoreOptions::hollow). Writes "NAME SOCKET PORT" per host to
//       DIR/hosts-I.txt once all registered, then runs until SIGTERM.
//   ptc-hollow ranks --coordinator ADDR --job J --hosts FILE [--gpus G]
//       runs a process per GPU of every host in FILE (lines "NAME SOCKET"),
//       each a thread with its own client (client/client.h), following
//       the job as a live job's process does (ptc.elastic): take the rank
//       the job places on its GPU, meet the epoch's other ranks
//       (Rendezvous), load the committed version, then step (every
//       --step-ms), looking at the job at every step's boundary, saving
//       the first --saves steps of each layout (and a step a change asks
//       for), each until it commits; when the job changes, follow it into
//       the new layout, or leave if it has no rank there (with
//       --wait-for-rank: wait until it has one). A process looks at the
//       job as ptc.elastic's do: every process follows the coordinator's
//       Watch stream; with --poll only rank 0 does and the others ask
//       (ListJobs) at most every --poll-ms, as ptc.elastic's did before
//       (for comparison). --rpc-timeout-s is each client's deadline for
//       a call (30 s, as ptc's default); --commit-timeout-s the longest
//       a saved version may wait to commit with no change starting (600
//       s; ptc.elastic raises TimeoutError after its timeout, 300 s by
//       default), after which the process fails; a save that fails
//       UNAVAILABLE (a host died as the job saved) waits as long for the
//       change its death starts, as ptc.elastic's processes do. Saves
//       write no bytes (Save::WriteHollow). Prints one line per event:
//       "resumed EPOCH RANK VERSION REGIONS", "saved VERSION", "left
//       EPOCH", "error MESSAGE", and on rank 0 "lost VERSION" for a save
//       deleted before it committed, which the job's ranks then make again
//       (--give-up-save SAVE:RANK, a test fault: the process on rank RANK
//       gives up the SAVE-th save it begins, as a process that failed to
//       write its part does).
//
// Both take --insecure only: one process is many hosts, and a process has
// one TLS identity (ConfigureProcessSecurity); the harness measures the
// control plane, not its handshakes.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/args.h"
#include "common/channel.h"
#include "common/crash.h"
#include "common/local_peer.h"
#include "common/logging.h"
#include "common/mutex_checks.h"
#include "common/open_files.h"
#include "common/status_macros.h"
#include "proto/enum_names.h"
#include "ptcd/coordinator_agent.h"
#include "ptcd/coordinator_relay.h"
#include "state_transformer/transformer_service.h"
#include "tensor_store/tensor_store_server.h"

namespace ptc::tools {
namespace {

constexpr char kUsage[] =
    R"(usage: ptc-hollow hosts --coordinator ADDR --count N [--first I] [--dir DIR]
                        [--gpus G] [--memory-limit BYTES] [--rack-size K]
                        [--relay on|off] [--keepalive-s S] --insecure
       ptc-hollow ranks --coordinator ADDR --job J --hosts FILE [--gpus G]
                        [--step-ms MS] [--poll-ms MS] [--saves N]
                        [--rpc-timeout-s S] [--commit-timeout-s S]
                        [--wait-for-rank] [--poll]
                        [--give-up-save SAVE:RANK]
                        [--keepalive-s S] --insecure
--keepalive-s S: every channel and server of this process pings every S
seconds and waits S for the answer (0, the default: as ptcd's do). gRPC
1.51 can crash in a process holding hundreds of channels when a ping's
answer and its watchdog race at a load average in the thousands; this
instrument then differs from the daemons in that alone.
)";

// Every line printed by a thread is whole.
absl::Mutex out_mu;
void Say(const std::string& line) {
  absl::MutexLock lock(&out_mu);
  std::cout << line << std::endl;
}

absl::StatusOr<int> IntArg(const Args& args, const std::string& name,
                           int fallback, int lo, int hi) {
  int v = fallback;
  if (args.Has(name) && !absl::SimpleAtoi(args.Get(name), &v)) v = lo - 1;
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " needs a number from ", lo, " to ", hi));
  }
  return v;
}

sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// One hollow ptcd: the pieces ptcd's main() starts, over a hollow store.
struct HollowHost {
  std::string name;
  std::string socket;
  std::unique_ptr<CoordinatorRelay> relay;
  std::unique_ptr<TensorStoreServer> server;
  std::unique_ptr<CoordinatorAgent> agent;
};

absl::Status RunHosts(const Args& args) {
  PTC_ASSIGN_OR_RETURN(const std::string coordinator,
                       args.Required("coordinator"));
  PTC_ASSIGN_OR_RETURN(const int count, IntArg(args, "count", 0, 1, 4096));
  PTC_ASSIGN_OR_RETURN(const int first, IntArg(args, "first", 0, 0, 99999));
  PTC_ASSIGN_OR_RETURN(const int gpus, IntArg(args, "gpus", 8, 1, 64));
  PTC_ASSIGN_OR_RETURN(const int rack, IntArg(args, "rack-size", 0, 0, 4096));
  PTC_ASSIGN_OR_RETURN(const int64_t memory,
                       ParseBytes(args.Get("memory-limit", "4TiB")));
  const std::string dir = args.Get("dir", ".");
  const std::string relay_flag = args.Get("relay", "on");
  if (relay_flag != "on" && relay_flag != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--relay is 'on' or 'off', not '", relay_flag, "'"));
  }
  const bool relay = relay_flag == "on";
  std::string short_dir;  // relays' sockets whose path is too long in DIR
  const sigset_t signals = BlockStopSignals();
  // Every hollow host has a listening socket and connections; every
  // hollow rank a local socket and a channel.
  RaiseOpenFilesLimit();
  std::vector<HollowHost> hosts(count);
  for (int i = 0; i < count; ++i) {
    HollowHost& h = hosts[i];
    h.name = absl::StrFormat("hollow-%05d", first + i);
    h.socket = absl::StrCat(dir, "/", h.name, ".sock");
    TensorStoreServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.socket_path = h.socket;
    options.memory_limit_bytes = memory;
    options.spare_pool_bytes = 0;
    options.hollow = true;
    options.host_name = h.name;
    if (relay) {
      // Next to the host's socket, or where a path fits (a deep --dir).
      std::string path = RelaySocketFor(h.socket);
      if (!FitsSocketAddress(path)) {
        if (short_dir.empty()) {
          char name[] = "/tmp/ptc-relays-XXXXXX";
          if (mkdtemp(name) == nullptr)
            return absl::InternalError("cannot make a directory in /tmp");
          short_dir = name;
        }
        path = absl::StrCat(short_dir, "/", h.name, ".sock");
      }
      PTC_ASSIGN_OR_RETURN(
          h.relay, CoordinatorRelay::Start(
                       {.socket_path = path, .coordinator = coordinator}));
      options.coordinator_relay = h.relay->socket_path();
      options.coordinator = coordinator;
    }
    options.services.push_back(
        [admissions = options.peer_admissions](Store* store) {
          return std::make_unique<TransformerService>(
              store, TransformerOptions{}, admissions);
        });
    PTC_ASSIGN_OR_RETURN(h.server, TensorStoreServer::Start(options));
    proto::HostStatus status;
    status.set_name(h.name);
    status.set_address(absl::StrCat("127.0.0.1:", h.server->port()));
    status.set_gpus(gpus);
    status.set_bandwidth(25e9);
    status.set_memory_bytes(memory);
    if (rack > 0) status.set_domain(absl::StrCat("rack", (first + i) / rack));
    status.set_incarnation(absl::Uniform<uint64_t>(absl::BitGen()));
    h.agent = std::make_unique<CoordinatorAgent>(coordinator, status,
                                                 h.server->store());
  }
  // Ready once every host is registered: the harness then places jobs.
  for (HollowHost& h : hosts) {
    while (!h.agent->registered()) absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string file = absl::StrCat(dir, "/hosts-", first, ".txt");
  {
    std::ofstream out(file + ".tmp");
    for (const HollowHost& h : hosts)
      out << h.name << " " << h.socket << " " << h.server->port() << "\n";
  }
  std::rename((file + ".tmp").c_str(), file.c_str());
  Say(absl::StrCat("ready ", count, " hollow hosts in ", file));
  int sig = 0;
  sigwait(&signals, &sig);
  for (HollowHost& h : hosts) h.agent.reset();
  for (HollowHost& h : hosts) h.server->Shutdown(absl::Seconds(1));
  for (HollowHost& h : hosts) h.relay.reset();
  if (!short_dir.empty()) rmdir(short_dir.c_str());
  return absl::OkStatus();
}

// The process on one GPU of a hollow host, as ptc.elastic runs it.
class HollowRank {
 public:
  struct Options {
    std::string coordinator;
    std::string job;
    std::string host;
    std::string socket;
    int gpu = 0;
    absl::Duration step = absl::Milliseconds(200);
    absl::Duration poll = absl::Milliseconds(50);
    // Steps saved in each layout before it only steps.
    int saves = 1 << 30;
    // The client's deadline for a call (ClientOptions::rpc_timeout).
    absl::Duration rpc_timeout = absl::Seconds(30);
    // The longest a saved version may take to commit with no change
    // starting (as ptc.elastic's timeout does): a peer's save lost with no
    // change to follow (its host declared dead and back) ends the process with
    // an error instead of a wait that never ends.
    absl::Duration commit_timeout = absl::Minutes(10);
    // With no rank on this GPU: wait for one (a host added to the job;
    // its launcher would start the process) instead of leaving.
    bool wait_for_rank = false;
    // Every process follows the Watch stream (told, not polling); false:
    // rank 0 only, the others poll.
    bool watch = true;
    // A test fault: the process on this rank gives up the
    // give_up_save-th save it begins (0: none), once.
    int give_up_save = 0;
    int give_up_rank = -1;
    const std::atomic<bool>* stop = nullptr;
  };
  explicit HollowRank(Options o) : o_(std::move(o)) {}

  void Run() {
    const absl::Status s = Loop();
    if (!s.ok() && !Stopping()) {
      Say(absl::StrCat("error ", o_.host, " gpu ", o_.gpu, ": ", s.ToString()));
    }
  }

 private:
  bool Stopping() const { return o_.stop->load(); }

  // The rank the job's layout places on this GPU (-1: none). With a
  // client (after a change), the client becomes that rank from the same
  // answer, as a live process does (Client::RebindToDevice); before, asked
  // through the host's relay with the deadline every call of this process
  // has (RanksOnHost's default, 30 s, is too short where 16,384 processes
  // start at once on two cores).
  absl::StatusOr<int> MyRank() {
    if (client_ != nullptr) return client_->RebindToDevice(o_.gpu);
    PTC_ASSIGN_OR_RETURN(HostRanks placed,
                         RanksOnHost(o_.coordinator, o_.job, o_.host,
                                     o_.rpc_timeout, o_.socket));
    for (const auto& [rank, gpu] : placed.ranks)
      if (gpu == o_.gpu) return rank;
    return -1;
  }

  // The job as this process knows it: what its Watch stream told it
  // (with --poll, rank 0's stream; the others ask at most every poll
  // interval).
  absl::StatusOr<JobEvent> Event() {
    if (client_->rank() == 0 || o_.watch) {
      JobEvent ev = client_->LatestEvent();
      if (ev.known) return ev;
    }
    const absl::Time now = absl::Now();
    if (now - polled_at_ >= o_.poll || !polled_.known) {
      PTC_ASSIGN_OR_RETURN(polled_, client_->FetchEvent());
      polled_at_ = now;
    }
    return polled_;
  }

  // The job once it may have moved on from `ev`: told by the Watch
  // stream (woken by its news, at most `most` later), or with --poll
  // asked again after the poll interval.
  absl::StatusOr<JobEvent> Next(const JobEvent& ev, absl::Duration most) {
    if (client_->rank() == 0 || o_.watch) {
      JobEvent next = client_->WaitEvent(ev.received, most);
      if (next.known) return next;
      return Event();  // the stream has told nothing yet: asked
    }
    absl::SleepFor(std::min(most, o_.poll));
    return Event();
  }

  static bool Running(const JobEvent& ev) {
    return ev.phase != proto::PHASE_NONE && !PhaseEnded(ev.phase);
  }

  absl::Status Loop() {
    while (!Stopping()) {
      // Wait out a change in flight, then take this GPU's rank in the
      // layout it ended in.
      int64_t now_epoch = 0;
      if (client_ != nullptr) {
        PTC_ASSIGN_OR_RETURN(JobEvent ev, Event());
        while (!Stopping()) {
          now_epoch = ev.layout_epoch;
          if (!Running(ev) && ev.pending_config.empty()) break;
          PTC_ASSIGN_OR_RETURN(ev, Next(ev, kQuiet));
        }
      }
      if (client_ != nullptr && now_epoch == met_epoch_ &&
          client_->layout_epoch() == met_epoch_) {
        // The change aborted (the job is still in the layout this process
        // met in): go on in it, asking nothing, as ptc.elastic does. (It
        // asked the coordinator for its rank here: 16,384 questions at
        // 2,048 hosts for every aborted change.)
        PTC_RETURN_IF_ERROR(Train(met_epoch_));
        continue;
      }
      PTC_ASSIGN_OR_RETURN(int rank, MyRank());
      if (rank < 0 && !o_.wait_for_rank) {
        Say(absl::StrCat("left ", client_ ? client_->layout_epoch() : 0, " ",
                         o_.host, " gpu ", o_.gpu));
        return absl::OkStatus();
      }
      while (rank < 0 && !Stopping()) {
        absl::SleepFor(absl::Seconds(2));
        PTC_ASSIGN_OR_RETURN(rank, MyRank());
      }
      if (Stopping()) break;
      if (client_ == nullptr) {
        ClientOptions options;
        options.socket_path = o_.socket;
        options.coordinator = o_.coordinator;
        options.job = o_.job;
        options.rank = rank;
        options.rpc_timeout = o_.rpc_timeout;
        PTC_ASSIGN_OR_RETURN(client_, Client::Connect(options));
        // Not through its host's relay: a connection of its own at the
        // coordinator, for the process's life (the harness counts them).
        if (!client_->relayed())
          Say(absl::StrCat("direct ", o_.host, " gpu ", o_.gpu));
      }
      if (rank == 0 || o_.watch) {
        client_->Follow();
      } else {
        client_->Unfollow();
      }
      polled_ = JobEvent{};
      saves_done_ = 0;
      const int64_t epoch = client_->layout_epoch();
      // Meet: rank 0 offers a (nominal) port, every rank waits for all.
      absl::StatusOr<std::string> met =
          client_->Rendezvous(epoch, rank == 0 ? 1 : 0, absl::Minutes(10));
      if (absl::IsFailedPrecondition(met.status())) continue;  // moved on
      PTC_RETURN_IF_ERROR(met.status());
      int regions = 0;
      if (client_->committed_version() > 0) {
        absl::StatusOr<std::unique_ptr<Client::State>> state = client_->Load();
        if (absl::IsFailedPrecondition(state.status())) continue;
        PTC_RETURN_IF_ERROR(state.status());
        regions = static_cast<int>((*state)->regions().size());
      }
      met_epoch_ = epoch;
      Say(absl::StrCat("resumed ", epoch, " ", rank, " ",
                       client_->committed_version(), " ", regions));
      PTC_RETURN_IF_ERROR(Train(epoch));
    }
    return absl::OkStatus();
  }

  // Steps in layout `epoch` until the job leaves it: at every step's
  // boundary the process looks at the job (a change, or one waiting for
  // a save), and it saves the first --saves steps, each until it commits.
  absl::Status Train(int64_t epoch) {
    int64_t step = client_->committed_step() + 1;
    // Saves lost in a row (deleted by the coordinator: a host of the
    // placement declared dead as it committed), and when the first was.
    int lost = 0;
    absl::Time lost_since = absl::InfiniteFuture();
    while (!Stopping()) {
      absl::SleepFor(o_.step);
      PTC_ASSIGN_OR_RETURN(JobEvent ev, Event());
      if (ev.layout_epoch > epoch || Running(ev)) return absl::OkStatus();
      // The deletions before this process first looked are none of its
      // business; the later ones it acts on, with its peers.
      if (dropped_seen_ < 0) dropped_seen_ = ev.dropped_save;
      const bool asked = !ev.pending_config.empty();
      if (!asked && saves_done_ >= o_.saves) continue;
      int64_t begun = 0;
      absl::StatusOr<int64_t> saved = Save(step, &begun);
      bool deleted = false;
      // Refused: a save was deleted that this rank has not acted on (its
      // peers learned it first and make it again): the same as a loss.
      const bool refused = absl::IsAborted(saved.status()) && begun == 0;
      if (refused) saved = int64_t{0};
      if ((!saved.ok() || *saved == 0) && begun > 0) {
        // Deleted (this rank's report came after, or completed it and its
        // hosts could not prove it, or this rank gave it up)? Asked (the
        // stream may lag); not known if the question fails.
        const absl::StatusOr<JobEvent> now = client_->FetchEvent();
        deleted = now.ok() && now->dropped_save >= begun;
      }
      // UNAVAILABLE otherwise: cut off from the coordinator. As ptc.elastic
      // does, the process waits for a change, or the version's commit or
      // deletion (below).
      if (!saved.ok() && !deleted && !absl::IsUnavailable(saved.status()))
        return saved.status();
      const int64_t version = saved.ok() ? *saved : -1;
      if (version == 0 && !deleted && !refused)
        return absl::OkStatus();  // the layout changed
      // Until the version commits (every rank saved it), or a change
      // starts (a peer died and will never save it), or it is deleted
      // (its ranks save the step again): asleep until the stream tells
      // something new, as ptc.elastic's processes wait.
      PTC_ASSIGN_OR_RETURN(ev, Event());
      const absl::Time deadline = absl::Now() + o_.commit_timeout;
      while (!Stopping() && !deleted) {
        if (begun > 0 && ev.committed_version >= begun) break;
        if (ev.layout_epoch > epoch || Running(ev)) return absl::OkStatus();
        if ((begun > 0 && ev.dropped_save >= begun) ||
            (refused && ev.dropped_save > dropped_seen_)) {
          deleted = true;
          break;
        }
        if (absl::Now() > deadline) {
          const std::string within = absl::FormatDuration(o_.commit_timeout);
          return absl::DeadlineExceededError(
              version < 0 ? absl::StrCat("no change started within ", within,
                                         " after the save of step ", step,
                                         " failed: ", saved.status().ToString())
              : refused
                  ? absl::StrCat("the save of step ", step,
                                 " was refused (a save deleted after version ",
                                 dropped_seen_,
                                 ") and no deletion or change was told within ",
                                 within)
                  : absl::StrCat("version ", version, " did not commit in ",
                                 within,
                                 " and no change started (the job's committed "
                                 "version is ",
                                 ev.committed_version, ")"));
        }
        PTC_ASSIGN_OR_RETURN(ev, Next(ev, kQuiet));
      }
      if (deleted) {
        // Every rank of the job learns it: they save this step again
        // after a pause (doubled each time in a row, at most 16 s) unless
        // a change comes first, and give up after --commit-timeout-s.
        const absl::Time now = absl::Now();
        if (lost++ == 0) lost_since = now;
        if (now - lost_since > o_.commit_timeout) {
          return absl::DeadlineExceededError(absl::StrCat(
              "saves of step ", step, " were deleted for ",
              absl::FormatDuration(o_.commit_timeout),
              " and no change started (the last: version ", begun, ")"));
        }
        const absl::Time until =
            now + std::min(absl::Seconds(1) * (1 << std::min(lost - 1, 4)),
                           absl::Seconds(16));
        if (client_->rank() == 0)
          Say(absl::StrCat("lost ", begun > 0 ? begun : ev.dropped_save));
        dropped_seen_ = std::max({dropped_seen_, ev.dropped_save, begun});
        while (!Stopping() && absl::Now() < until) {
          if (ev.layout_epoch > epoch || Running(ev)) return absl::OkStatus();
          PTC_ASSIGN_OR_RETURN(ev,
                               Next(ev, std::min(kQuiet, until - absl::Now())));
        }
        continue;  // the same step again
      }
      lost = 0;
      dropped_seen_ = std::max(dropped_seen_, ev.dropped_save);
      if (Stopping()) return absl::OkStatus();
      if (!asked) ++saves_done_;
      if (client_->rank() == 0) Say(absl::StrCat("saved ", begun));
      if (asked) return absl::OkStatus();  // the change starts from it
      ++step;
    }
    return absl::OkStatus();
  }

  // Saves `step` with no bytes; 0 if refused as stale (the job's layout
  // changed, or, where `begun` is set, the version was deleted: the
  // caller asks). `begun`: the version the coordinator gave it (0: not
  // begun).
  absl::StatusOr<int64_t> Save(int64_t step, int64_t* begun) {
    // ABORTED (not begun) if a save newer than dropped_seen_ was deleted.
    absl::StatusOr<std::unique_ptr<Client::Save>> save =
        client_->BeginSave(step, 0, dropped_seen_);
    if (absl::IsFailedPrecondition(save.status())) return 0;
    PTC_RETURN_IF_ERROR(save.status());
    *begun = (*save)->version();
    if (++saves_begun_ == o_.give_up_save &&
        client_->rank() == o_.give_up_rank) {
      const std::string why =
          absl::StrCat("--give-up-save ", o_.give_up_save, ":", o_.give_up_rank,
                       " (a test fault)");
      PTC_RETURN_IF_ERROR((*save)->GiveUp(why));
      return absl::AbortedError(absl::StrCat("rank ", client_->rank(),
                                             " gave version ", *begun, " up (",
                                             why, ")"));
    }
    for (size_t i = 0; i < client_->regions().size(); ++i)
      PTC_RETURN_IF_ERROR((*save)->WriteHollow(static_cast<int>(i)));
    for (const SmallObjectSpec& o : client_->spec().small_objects) {
      PTC_RETURN_IF_ERROR((*save)->PutSmallObject(
          o.name, absl::StrCat(o.name, " of rank ", client_->rank(),
                               " at step ", step)));
    }
    absl::StatusOr<bool> committed = (*save)->Commit();
    if (absl::IsFailedPrecondition(committed.status())) return 0;
    PTC_RETURN_IF_ERROR(committed.status());
    return (*save)->version();
  }

  // The longest a waiting rank sleeps without news (its stream went quiet
  // while followed again, or the harness stops it).
  static constexpr absl::Duration kQuiet = absl::Milliseconds(500);

  const Options o_;
  std::unique_ptr<Client> client_;
  JobEvent polled_;
  int saves_done_ = 0;
  int saves_begun_ = 0;  // by this process, in every layout
  // The newest deleted save this process acted on (-1: not yet looked).
  int64_t dropped_seen_ = -1;
  int64_t met_epoch_ = -1;  // the layout epoch this process last met in
  absl::Time polled_at_ = absl::InfinitePast();
};

absl::Status RunRanks(const Args& args) {
  PTC_ASSIGN_OR_RETURN(const std::string coordinator,
                       args.Required("coordinator"));
  PTC_ASSIGN_OR_RETURN(const std::string job, args.Required("job"));
  PTC_ASSIGN_OR_RETURN(const std::string hosts_file, args.Required("hosts"));
  PTC_ASSIGN_OR_RETURN(const int gpus, IntArg(args, "gpus", 8, 1, 64));
  PTC_ASSIGN_OR_RETURN(const int step_ms,
                       IntArg(args, "step-ms", 200, 0, 3600 * 1000));
  PTC_ASSIGN_OR_RETURN(const int poll_ms,
                       IntArg(args, "poll-ms", 50, 1, 60000));
  PTC_ASSIGN_OR_RETURN(const int saves,
                       IntArg(args, "saves", 1 << 30, 0, 1 << 30));
  PTC_ASSIGN_OR_RETURN(const int rpc_timeout_s,
                       IntArg(args, "rpc-timeout-s", 30, 1, 3600));
  PTC_ASSIGN_OR_RETURN(const int commit_timeout_s,
                       IntArg(args, "commit-timeout-s", 600, 1, 24 * 3600));
  std::pair<int, int> give_up = {0, -1};
  if (args.Has("give-up-save")) {
    const std::vector<std::string> f =
        absl::StrSplit(args.Get("give-up-save", ""), ':');
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &give_up.first) ||
        !absl::SimpleAtoi(f[1], &give_up.second) || give_up.first < 1 ||
        give_up.second < 0) {
      return absl::InvalidArgumentError(
          "--give-up-save needs SAVE:RANK (the SAVE-th save, from 1, that the "
          "process on rank RANK begins)");
    }
  }
  const sigset_t signals = BlockStopSignals();
  // Every hollow host has a listening socket and connections; every
  // hollow rank a local socket and a channel.
  RaiseOpenFilesLimit();
  std::vector<std::pair<std::string, std::string>> hosts;
  {
    std::ifstream in(hosts_file);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("cannot read the hosts file ", hosts_file));
    }
    std::string line;
    while (std::getline(in, line)) {
      std::vector<std::string> f =
          absl::StrSplit(line, ' ', absl::SkipWhitespace());
      if (f.size() < 2) continue;
      hosts.emplace_back(f[0], f[1]);
    }
  }
  if (hosts.empty())
    return absl::InvalidArgumentError(
        absl::StrCat(hosts_file, " names no host"));
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<HollowRank>> ranks;
  std::vector<std::thread> threads;
  for (const auto& [name, socket] : hosts) {
    for (int gpu = 0; gpu < gpus; ++gpu) {
      HollowRank::Options o;
      o.coordinator = coordinator;
      o.job = job;
      o.host = name;
      o.socket = socket;
      o.gpu = gpu;
      o.step = absl::Milliseconds(step_ms);
      o.poll = absl::Milliseconds(poll_ms);
      o.saves = saves;
      o.rpc_timeout = absl::Seconds(rpc_timeout_s);
      o.commit_timeout = absl::Seconds(commit_timeout_s);
      o.wait_for_rank = args.Flag("wait-for-rank");
      o.watch = !args.Flag("poll");
      o.give_up_save = give_up.first;
      o.give_up_rank = give_up.second;
      o.stop = &stop;
      ranks.push_back(std::make_unique<HollowRank>(std::move(o)));
    }
  }
  for (auto& r : ranks) threads.emplace_back([&r] { r->Run(); });
  Say(absl::StrCat("started ", ranks.size(), " hollow ranks"));
  int sig = 0;
  sigwait(&signals, &sig);
  stop = true;
  for (std::thread& t : threads) t.join();
  return absl::OkStatus();
}

absl::Status Run(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::cout << kUsage;
    return argc < 2 ? absl::InvalidArgumentError("a mode is needed")
                    : absl::OkStatus();
  }
  const std::string mode = argv[1];
  PTC_ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argc, argv, 2,
                  {"coordinator", "count", "first", "dir", "gpus",
                   "memory-limit", "rack-size", "job", "hosts", "step-ms",
                   "poll-ms", "saves", "rpc-timeout-s", "commit-timeout-s",
                   "log-level", "relay", "keepalive-s", "give-up-save"},
                  {"insecure", "wait-for-rank", "poll"}));
  if (!args.Flag("insecure")) {
    return absl::InvalidArgumentError(
        "ptc-hollow runs with --insecure only (one process is many hosts; a "
        "process has one TLS identity)");
  }
  PTC_RETURN_IF_ERROR(SetLogLevel(args.Get("log-level", "warn")));
  PTC_ASSIGN_OR_RETURN(const int keepalive_s,
                       IntArg(args, "keepalive-s", 0, 0, 3600));
  if (keepalive_s > 0) SlowKeepalivesForProcess(keepalive_s * 1000);
  SecurityOptions security;
  security.insecure = true;
  PTC_RETURN_IF_ERROR(ConfigureProcessSecurity(security, "ptc-hollow"));
  if (mode == "hosts") return RunHosts(args);
  if (mode == "ranks") return RunRanks(args);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown mode '", mode, "'; use hosts or ranks"));
}

}  // namespace
}  // namespace ptc::tools

int main(int argc, char** argv) {
  ptc::InstallCrashHandler(argv[0]);
  ptc::ConfigureMutexChecks();
  const absl::Status status = ptc::tools::Run(argc, argv);
  if (!status.ok()) {
    std::cerr << "ptc-hollow: " << status.message() << "\n";
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
