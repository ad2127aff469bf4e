"""ptc-agent: starts a job's processes on one host, and again after a change.

Run one per host next to ptcd (under systemd, like ptcd). It follows the
job's placement at the coordinator and runs one process on every GPU of
this host that the placement gives a rank. Two kinds of jobs:

- **Live jobs** (registered or set with `--live`: their processes follow
  changes themselves, ptc.torch.elastic): a process it started stays while
  its GPU keeps a rank; a GPU that gains a rank in a new layout gets a new
  process. A process that ends while its GPU keeps its rank (the job
  finished, or the process crashed) is not started again under the same
  layout: the job's other processes are not waiting for it; the next
  change brings it back.
- **Restart-style jobs** (every other job: processes that load the
  committed version when they start and save as they train, as a script
  written for torchrun does): when a change starts it stops the job's
  processes here (SIGTERM, then SIGKILL after --grace seconds), and once
  the change commits it starts the new layout's ranks, which load what the
  change moved. Each gets the variables torchrun sets: RANK, WORLD_SIZE,
  LOCAL_RANK (the GPU the placement gives the rank, so that
  `torch.cuda.set_device(LOCAL_RANK)` lands on it), LOCAL_WORLD_SIZE (the
  job's ranks on this host), MASTER_ADDR (the address rank 0's host
  registered) and MASTER_PORT (--master-port plus the layout epoch modulo
  1000, a fresh port for each layout), TORCHELASTIC_RUN_ID (the job).

Every process gets the job, the coordinator, this host's ptcd socket, the
host's name, its GPU and the layout epoch it starts under (PTC_JOB,
PTC_COORDINATOR, PTC_SOCKET, PTC_HOST, PTC_DEVICE, PTC_LAYOUT_EPOCH;
CUDA_VISIBLE_DEVICES is left alone) on top of the agent's own environment
(the job's token PTC_JOB_TOKEN and TLS settings pass through), and glibc's
malloc backs their large allocations with transparent huge pages
(with_huge_pages; --no-huge-pages leaves that out).

    python3 -m ptc.agent --job gpt --host gpu-node-7 --coordinator coord:7000 \\
        --socket /run/ptcd/ptcd.sock [--status FILE] [--log-dir DIR] -- \\
        python3 train.py --my-flags

One agent process can serve several hosts of one machine (a local
cluster's): --local HOST=SOCKET for each, instead of --host and --socket.
With --until-done it exits once the job's processes here have finished:
no change in flight, every rank of the current layout on its hosts ran
and exited 0 (exit status 0), or one failed and the coordinator does not
change the job for it (the agent stops the others; the failed process's
status). `ptcctl run` starts it so for every ptcd of this machine.

It reports what it runs on stdout (one line per start and exit) and, with
--status, as JSON in FILE (rewritten atomically on every change). SIGTERM
or SIGINT stops its processes (SIGTERM, then SIGKILL after --grace s) and it.
"""

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import _capi


HUGE_PAGES = "glibc.malloc.hugetlb=1"


def with_huge_pages(env):
    """`env` with glibc's malloc asked to back large allocations (a model's
    parameters, optimizer state, activations) with transparent huge pages
    (GLIBC_TUNABLES glibc.malloc.hugetlb=1; glibc 2.35 or newer, and a no-op
    where the kernel's THP is off). Fresh memory then takes a page fault per
    2 MiB instead of per 4 KiB: the model a process rebuilds after a change,
    and the optimizer state a load creates, are fresh memory. On a VM,
    zeroing 0.19 GiB of new tensor memory took 0.75 s without and 0.02 s
    with. A GLIBC_TUNABLES that already names the tunable is kept."""
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:
        return env
    return dict(env, GLIBC_TUNABLES=f"{tunables}:{HUGE_PAGES}" if tunables else HUGE_PAGES)


# Phases of a change in flight (the others: none, committed, aborted).
_RUNNING = ("staging", "verifying", "committing")


class Agent:
    """The processes of one job on one host."""

    def __init__(self, args, command, host, socket):
        self.args = args
        self.command = command
        self.host = host
        self.socket = socket
        self.children = {}  # GPU -> (Popen, start time, log file)
        # GPU -> the newest layout epoch a process of ours ran under there.
        self.covered = {}
        # Each process writes the layout epoch it runs under to a file of
        # its own here (PTC_AGENT_EPOCH_FILE, written by ptc.elastic when it
        # meets its peers): a live process follows changes in place, so an
        # exit is reported under the epoch it died in, which may be newer
        # than this agent's last look at the placement.
        self.epochs = pathlib.Path(tempfile.mkdtemp(prefix="ptc-agent-epochs-"))
        self.exited = []
        self.stopping = False
        self.look = None  # the job as last seen (ranks_on_host's answer)
        self.failed = None  # (GPU, exit code) of a process the job cannot go on without
        # Exits the coordinator could not be told of (it was out of reach):
        # (GPU, exit code, layout epoch), told at the next looks.
        self.unreported = []
        self._warned = False
        # The job's Watch stream (opened on the first look), and the last
        # answer about this host with the stream's event it answered.
        self.follower = None
        self._answer = None  # (event marker, time asked, look)
        self.asks = 0  # calls to the coordinator for this host's ranks

    def say(self, msg):
        print(f"[ptc-agent {self.host} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def fetch(self):
        """The job as the coordinator has it, with this host's ranks
        ({layout_epoch, world_size, phase, live, rank0_host_address, ranks:
        {GPU: rank}}); None if the coordinator could not be asked. The
        coordinator is asked again only once the job's Watch stream tells
        of a change (a phase, a layout epoch, a version, a pending change),
        or --refresh seconds after its last answer (a stream that broke, a
        policy changed): an idle job costs it one call per host every
        --refresh seconds, not one per --interval."""
        if self.follower is None:
            self.follower = _capi.Follower(self.args.coordinator, self.args.job)
        ev = self.follower.event
        marker = (ev["known"], ev["layout_epoch"], ev["plan_epoch"], ev["phase"],
                  ev["committed_version"], ev["pending_config"], ev["error"])
        if (self._answer is not None and ev["known"] and self._answer[0] == marker and
                time.time() - self._answer[1] < self.args.refresh):
            return self._answer[2]
        self.asks += 1
        try:
            placed = self.follower.ranks_on_host(self.host)
        except _capi.Error as e:
            if not self._warned:
                self.say(f"asking the coordinator: {e}")
                self._warned = True
            return None
        self._warned = False
        placed["ranks"] = {r["gpu"]: r["rank"] for r in placed["ranks"]}
        # Under the event read before asking: one that came meanwhile is
        # asked about at the next look.
        self._answer = (marker, time.time(), placed)
        return placed

    def live(self, look):
        if self.args.mode == "auto":
            return bool(look.get("live"))
        return self.args.mode == "live"

    def epoch_file(self, gpu):
        return self.epochs / f"gpu{gpu}"

    def environment(self, gpu, rank, look):
        epoch = look["layout_epoch"]
        env = dict(os.environ, PTC_JOB=self.args.job, PTC_COORDINATOR=self.args.coordinator,
                   PTC_SOCKET=self.socket, PTC_HOST=self.host, PTC_DEVICE=str(gpu),
                   PTC_LAYOUT_EPOCH=str(epoch),
                   PTC_AGENT_EPOCH_FILE=str(self.epoch_file(gpu)))
        if not self.live(look):
            # What torchrun sets, so that scripts written for it run
            # unchanged; a live process takes its rank from ptc.elastic.
            master = look.get("rank0_host_address", "").rpartition(":")[0].strip("[]")
            env.update(RANK=str(rank), WORLD_SIZE=str(look["world_size"]),
                       LOCAL_RANK=str(gpu), LOCAL_WORLD_SIZE=str(len(look["ranks"])),
                       MASTER_ADDR=master or "127.0.0.1",
                       MASTER_PORT=str(self.args.master_port + epoch % 1000),
                       TORCHELASTIC_RUN_ID=self.args.job, PTC_RANK=str(rank))
        if not self.args.no_huge_pages:
            env = with_huge_pages(env)
        return env

    def start(self, gpu, rank, look):
        epoch = look["layout_epoch"]
        self.epoch_file(gpu).write_text(str(epoch))
        env = self.environment(gpu, rank, look)
        log = None
        if self.args.log_dir:
            d = pathlib.Path(self.args.log_dir)
            d.mkdir(parents=True, exist_ok=True)
            log = open(d / f"{self.args.job}-{self.host}-gpu{gpu}-{int(time.time() * 1e3)}"
                       ".log", "w")
        p = subprocess.Popen(self.command, env=env, stdout=log,
                             stderr=subprocess.STDOUT if log else None)
        self.children[gpu] = (p, time.time(), log)
        self.covered[gpu] = epoch
        self.say(f"started pid {p.pid} on GPU {gpu} (rank {rank} of layout epoch {epoch})")

    def reap(self, look=None):
        for gpu, (p, started, log) in list(self.children.items()):
            code = p.poll()
            if code is None:
                continue
            if log:
                log.close()
            del self.children[gpu]
            self.exited.append({"pid": p.pid, "gpu": gpu, "exit_code": code,
                                "layout_epoch": self.covered.get(gpu, 0),
                                "seconds": round(time.time() - started, 3)})
            self.say(f"pid {p.pid} on GPU {gpu} exited with {code}")
            if look is None or self.live(look):
                # A live process follows changes itself: it ran as far as
                # the layout epoch it last met its peers under, even if this
                # agent did not look while it did (its stream was cut off
                # by a coordinator outage): its GPU is not started again
                # under that layout.
                self.covered[gpu] = max(self.covered.get(gpu, 0), self.ran_under(gpu))
            # A restart-style process that ends while the job changes, or in
            # a layout the job has left, ended by the change (a save
            # refused, a peer stopped): not a failure to report.
            if (code != 0 and not self.stopping and look and gpu in look["ranks"] and
                    (self.live(look) or (look["phase"] not in _RUNNING and
                                         self.covered.get(gpu) == look["layout_epoch"]))):
                self.tell_exit(gpu, code, max(look["layout_epoch"], self.ran_under(gpu)))

    def tell_exit(self, gpu, code, epoch):
        """Reports an exit (one the coordinator could not be told of for
        want of it is told again at the next looks: its peers wait for the
        change it starts)."""
        if self.report_exit(gpu, code, epoch) is False and self.failed is None:
            self.failed = (gpu, code)

    def ran_under(self, gpu):
        """The newest layout epoch the process on `gpu` said it met its
        peers under (0: it said none)."""
        try:
            return int(self.epoch_file(gpu).read_text() or 0)
        except (OSError, ValueError):
            return 0

    def report_exit(self, gpu, code, epoch):
        """A process died while its GPU had a rank: the job's others cannot
        go on without it; the coordinator changes the job (automatic
        changes on) and the new layout starts it again here. Returns
        whether it does (None: it could not be asked; where the coordinator
        was out of reach, it is asked again at the next looks)."""
        try:
            changing = _capi.report_process_exit(self.args.coordinator, self.args.job,
                                                self.host, gpu, code, epoch)
        except _capi.Error as e:
            self.say(f"could not report the exit to the coordinator: {e}")
            if e.unreachable:
                # Out of reach: told again at the next looks.
                self.unreported.append((gpu, code, epoch))
            return None
        self.say("the coordinator " + ("changes the job" if changing else
                                       "has automatic changes off for the job"))
        return changing

    def step(self):
        """One look at the job, and what it asks of this host."""
        look = self.fetch()
        if look is None or self.live(look):
            # A live process follows changes itself: its exit is reported
            # under the last look, when it was alive (if the job has moved
            # on since, the look below starts its GPU's process anew under
            # the new layout instead).
            self.reap(self.look)
        else:
            # Restart-style: under this look, which says whether the job
            # was changing when the process ended.
            self.reap(look)
        if look is None:
            return
        # The coordinator answers again: what it missed is told now (a
        # report under a layout the job has left changes nothing).
        unreported, self.unreported = self.unreported, []
        for gpu, code, epoch in unreported:
            self.tell_exit(gpu, code, epoch)
        self.look = look
        epoch, ranks = look["layout_epoch"], look["ranks"]
        if self.live(look):
            for gpu in self.children:
                self.covered[gpu] = epoch
            for gpu, rank in sorted(ranks.items()):
                if gpu not in self.children and self.covered.get(gpu) != epoch:
                    self.start(gpu, rank, look)
            return
        # Restart-style: nothing runs while a change is in flight or in a
        # layout the job has left; the new layout's ranks start after the
        # commit and load the version it made.
        changing = look["phase"] in _RUNNING
        stale = [g for g in self.children if self.covered.get(g) != epoch]
        if changing or stale:
            why = ("a change of the job started" if changing else
                   f"the job moved on to layout epoch {epoch}")
            self.stop_children(why)
        if changing:
            return
        for gpu, rank in sorted(ranks.items()):
            if gpu not in self.children and self.covered.get(gpu) != epoch:
                self.start(gpu, rank, look)

    def done(self):
        """--until-done: every rank of the current layout on this host ran
        and its process ended, with no change in flight."""
        look = self.look
        if look is None or self.children or look["phase"] in _RUNNING:
            return False
        return all(self.covered.get(g) == look["layout_epoch"] for g in look["ranks"])

    def status(self):
        return {"job": self.args.job, "host": self.host,
                "layout_epoch": self.look["layout_epoch"] if self.look else None,
                "coordinator_asks": self.asks,
                "running": [{"pid": p.pid, "gpu": g, "since": s}
                            for g, (p, s, _) in sorted(self.children.items())],
                "exited": self.exited}

    def stop_children(self, why=None):
        running = [p for p, _, _ in self.children.values() if p.poll() is None]
        if why and running:
            self.say(f"stopping {len(running)} processes: {why}")
        for p in running:
            p.terminate()
        deadline = time.time() + self.args.grace
        for p, _, _ in self.children.values():
            try:
                p.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        stopping, self.stopping = self.stopping, True  # stopped, not failed
        self.reap()
        self.stopping = stopping

    def close(self):
        shutil.rmtree(self.epochs, ignore_errors=True)


class Runner:
    """The agents of one process (one per host it serves), in one loop."""

    def __init__(self, args, agents):
        self.args = args
        self.agents = agents
        self.stopping = False

    def write_status(self):
        if not self.args.status:
            return
        path = pathlib.Path(self.args.status)
        tmp = path.with_suffix(".tmp")
        states = [a.status() for a in self.agents]
        # One host: the document as before; several: one per host.
        tmp.write_text(json.dumps(states[0] if len(states) == 1 else {"hosts": states}))
        tmp.rename(path)

    def run(self):
        """Returns the exit status for --until-done (0 otherwise)."""
        last = None
        code = 0
        while not self.stopping:
            for a in self.agents:
                a.step()
            state = [(sorted(a.children), len(a.exited), a.asks) for a in self.agents]
            if state != last:
                self.write_status()
                last = state
            failed = [a.failed for a in self.agents if a.failed]
            if self.args.until_done and failed:
                gpu, code = failed[0]
                for a in self.agents:
                    a.stop_children(f"a process of the job failed ({code}) and the "
                                    f"coordinator does not change the job for it")
                break
            if self.args.until_done and all(a.done() for a in self.agents):
                bad = [e for a in self.agents for e in a.exited
                       if e["exit_code"] != 0 and a.look and
                       e["layout_epoch"] == a.look["layout_epoch"]]
                code = bad[0]["exit_code"] if bad else 0
                for a in self.agents:
                    a.say("the job's processes here have finished")
                break
            time.sleep(self.args.interval)
        for a in self.agents:
            a.stopping = True
            a.stop_children()
        self.write_status()
        for a in self.agents:
            a.close()
        return code if code >= 0 else 128 - code


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        sys.exit("usage: python3 -m ptc.agent --job J --coordinator C "
                 "(--host H --socket S | --local HOST=SOCKET ...) -- COMMAND ...")
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="ptc-agent", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", required=True)
    ap.add_argument("--host", help="this host's name, as its ptcd registered")
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--socket", help="this host's ptcd socket")
    ap.add_argument("--local", action="append", default=[], metavar="HOST=SOCKET",
                    help="serve this host of the machine too (repeatable; instead of "
                         "--host and --socket)")
    ap.add_argument("--mode", choices=("auto", "live", "restart"), default="auto",
                    help="live: processes follow changes themselves; restart: stopped before "
                         "a change and started after it; auto (default): live if the job's "
                         "policy says so (ptcctl auto --live)")
    ap.add_argument("--master-port", type=int, default=29500,
                    help="restart-style jobs: MASTER_PORT is this plus the layout epoch "
                         "modulo 1000")
    ap.add_argument("--until-done", action="store_true",
                    help="exit once the job's processes here have finished (see above)")
    ap.add_argument("--grace", type=float, default=10.0,
                    help="seconds a process gets to end after SIGTERM before SIGKILL")
    ap.add_argument("--status", help="write what runs here to this JSON file")
    ap.add_argument("--log-dir", help="each process's output goes to a file here")
    ap.add_argument("--no-huge-pages", action="store_true",
                    help="do not ask glibc to back the processes' large allocations with "
                         "transparent huge pages (GLIBC_TUNABLES glibc.malloc.hugetlb=1)")
    ap.add_argument("--interval", type=float, default=0.1,
                    help="seconds between looks at the processes and the job's stream")
    ap.add_argument("--refresh", type=float, default=5.0,
                    help="seconds after which the placement is asked again although the "
                         "job's Watch stream told of no change")
    args = ap.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not command:
        ap.error("give the command that runs one process after --")
    hosts = []
    if args.host or args.socket:
        if not (args.host and args.socket):
            ap.error("--host and --socket go together")
        hosts.append((args.host, args.socket))
    for spec in args.local:
        host, eq, socket = spec.partition("=")
        if not (host and eq and socket):
            ap.error(f"--local takes HOST=SOCKET, not '{spec}'")
        hosts.append((host, socket))
    if not hosts:
        ap.error("name the host to serve: --host and --socket, or --local HOST=SOCKET")
    if len({h for h, _ in hosts}) != len(hosts):
        ap.error("a host is named twice")
    if not 1 <= args.master_port <= 65535 - 999:
        ap.error(f"--master-port {args.master_port}: from 1 to {65535 - 999}")
    if args.grace < 0 or args.interval <= 0 or not args.refresh > 0:
        ap.error("--grace must be >= 0, --interval and --refresh > 0")
    runner = Runner(args, [Agent(args, command, h, s) for h, s in hosts])

    def stop(*_):
        runner.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.exit(runner.run())


if __name__ == "__main__":
    main()
