#!/usr/bin/env python3
"""The control plane at scale: the real coordinator, N hollow hosts and a
hollow process per GPU (tools/hollow.cc: the real ptcd and client code,
over stores that keep no bytes), through a live job's life:

  start     the coordinator and the hosts (groups of --group hosts per
            process; the hosts that will die in a process of their own)
  meet      the job registered (automatic, live changes), its processes
            started: each takes its rank, meets the others and saves
            --saves steps, each until it commits
  steady    --steady seconds of training with no change: heartbeats, and
            every process looking at the job at each step's boundary
  failure   --kill hosts die (SIGKILL, their processes too; with --stop
            they stop instead, SIGSTOP, as behind a cut link: their
            connections stay open and answer nothing); the
            coordinator declares them dead and changes the job by itself
            to --after-kill; every surviving process follows into the new
            layout (rank, meeting, load) or leaves
  scale-up  --add hosts join the job's pool: the coordinator asks the
            processes to save, changes the job to --after-add from that
            save, and the processes on the new hosts take their ranks

Per phase: wall time, the coordinator's CPU seconds, its resident memory
(now and peak), threads, calls per second by RPC (its metrics), and the
bytes it wrote (/proc). The failure phase also reports the control plane's
own time from the moment the hosts were declared dead to the last process
resuming in the new layout. Exits non-zero if a check fails: every
surviving process resumed in the new epoch, the job's committed layout is
the one asked for, the coordinator's threads returned to a fixed bound.

  PTC_BIN_DIR=$(bazel info bazel-bin) /usr/bin/python3 tools/scale_harness.py \\
      --hosts 64 --kill 4 --config tp=2,pp=4,dp=64 --after-kill tp=2,pp=4,dp=60
  (docs/scale.md explains the hollow parts and the phases; docs/benchmarks.md
   has the figures and their commands)
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
# The hollow hosts and processes run at a lower priority than the
# coordinator: on a machine of its own it would not share its cores with
# thousands of them.
NICE = ["nice", "-n", "10"]
# common/limits.h: the threads a server runs calls on.
KMAX_RPC_THREADS = 256


def bin_dir():
    d = os.environ.get("PTC_BIN_DIR")
    return pathlib.Path(d) if d else ROOT / "bazel-bin"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Coordinator:
    """The coordinator process and what /proc and its metrics say."""

    def __init__(self, work, host_timeout, rate, binary):
        self.metrics_port = free_port()
        port_file = work / "coordinator.port"
        self.log = open(work / "coordinator.log", "w")
        self.proc = subprocess.Popen(
            [binary or str(bin_dir() / "coordinator/ptc-coordinator"), "--state-dir",
             str(work / "state"), "--listen", "127.0.0.1:0", "--port-file",
             str(port_file), "--insecure", "--log-level", "info",
             "--host-timeout", str(host_timeout),
             "--metrics-listen", f"127.0.0.1:{self.metrics_port}"]
            + (["--heartbeats-per-second", str(rate)] if rate else []),
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.time() + 60
        while not port_file.exists():
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit("the coordinator did not start; see "
                                 f"{work / 'coordinator.log'}")
            time.sleep(0.05)
        self.port = int(port_file.read_text().strip())
        self.address = f"127.0.0.1:{self.port}"
        # The most threads and connections seen since the last sample
        # (every 0.1 s and 1 s).
        self.peak_threads = 0
        self.peak_connections = 0
        # Past this many connections, the sampler names the processes that
        # hold their other ends (connection_owners); the most seen so far.
        self.connection_alarm = None
        self.over_alarm = None
        self._sampling = threading.Thread(target=self._sample_threads, daemon=True)
        self._sampling.start()

    def _sample_threads(self):
        tick = 0
        while self.proc.poll() is None:
            try:
                status = self.proc_file("status")
            except OSError:
                return
            for line in status.splitlines():
                if line.startswith("Threads:"):
                    self.peak_threads = max(self.peak_threads, int(line.split()[1]))
            tick += 1
            if tick % 10 == 0:
                peers = self.connection_peers()
                self.peak_connections = max(self.peak_connections, len(peers))
                alarm = self.connection_alarm
                if alarm is not None and len(peers) > alarm and (
                        self.over_alarm is None or len(peers) > self.over_alarm[0]):
                    self.over_alarm = (len(peers), self.connection_owners(peers))
            time.sleep(0.1)

    @staticmethod
    def _tcp_sockets():
        """(local port, remote port, state, inode) of every TCP socket of
        this network namespace (/proc/net/tcp and tcp6)."""
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = pathlib.Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                yield (int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16),
                       f[3], f[9])

    def connection_peers(self):
        """The client-side ports of the TCP connections established to the
        coordinator's port (the hosts' and the processes' channels)."""
        return [remote for local, remote, state, _ in self._tcp_sockets()
                if local == self.port and state == "01"]

    def connections(self):
        return len(self.connection_peers())

    def outgoing(self):
        """The coordinator's own connections to other ports (its kept
        channels to the hosts' ptcds, etcd): established sockets it holds
        whose local port is not its serving port."""
        inodes = set()
        try:
            for fd in pathlib.Path(f"/proc/{self.proc.pid}/fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            return 0
        return sum(1 for local, _, state, inode in self._tcp_sockets()
                   if state == "01" and local != self.port and inode in inodes)

    def connection_owners(self, peers):
        """Which processes hold the client ends of connections from
        `peers` (ports): {"PID COMMAND ARGS...": count}, by the sockets'
        inodes in /proc/PID/fd. A connection closed meanwhile is counted
        as "gone"."""
        wanted = set(peers)
        inodes = {inode: local for local, remote, state, inode in self._tcp_sockets()
                  if local in wanted and remote == self.port}
        owners = {}
        found = 0
        for pid_dir in pathlib.Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                fds = list((pid_dir / "fd").iterdir())
                held = 0
                for fd in fds:
                    try:
                        target = os.readlink(fd)
                    except OSError:
                        continue
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        held += 1
                if held:
                    cmd = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ")
                    owners[f"{pid_dir.name} {cmd.decode(errors='replace')[:160]}"] = held
                    found += held
            except OSError:
                continue
        if len(peers) > found:
            owners["gone"] = len(peers) - found
        return owners

    def proc_file(self, name):
        return pathlib.Path(f"/proc/{self.proc.pid}/{name}").read_text()

    def sample(self):
        stat = self.proc_file("stat")
        fields = stat[stat.rindex(")") + 2:].split()
        status = dict(line.split(":", 1) for line in self.proc_file("status").splitlines()
                      if ":" in line)
        io = dict(line.split(": ") for line in self.proc_file("io").splitlines())
        calls = {}
        watch = {"events": 0, "bytes": 0}
        proofs = {"whole": 0, "by_id": 0}
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=30) as r:
            for line in r.read().decode().splitlines():
                m = re.match(r'ptc_rpc_calls_total\{method="([^"]+)"\} (\S+)', line)
                if m:
                    calls[m.group(1)] = float(m.group(2))
                # What the Watch streams wrote (a coordinator from before
                # 2026-11-28 does not count it: 0).
                m = re.match(r'ptc_watch_(events|bytes)_written_total (\S+)', line)
                if m:
                    watch[m.group(1)] = float(m.group(2))
                # A save's proof requests to the hosts: with their
                # expectations, or naming those the host keeps.
                m = re.match(r'ptc_save_proof_requests_total\{expectations="(\w+)"\} (\S+)',
                             line)
                if m:
                    proofs[m.group(1)] = float(m.group(2))
        peak, self.peak_threads = self.peak_threads, 0
        connections = self.connections()
        peak_connections, self.peak_connections = self.peak_connections, 0
        return {
            "connections": connections,
            "peak_connections": max(peak_connections, connections),
            "outgoing": self.outgoing(),
            "time": time.time(),
            "peak_threads": max(peak, int(status["Threads"])),
            "cpu": (int(fields[11]) + int(fields[12])) / TICK,
            "rss": int(status["VmRSS"].split()[0]) * 1024,
            "peak": int(status["VmHWM"].split()[0]) * 1024,
            "threads": int(status["Threads"]),
            "written": int(io["write_bytes"]),
            "calls": calls,
            "watch": watch,
            "proofs": proofs,
        }

    def thread_names(self):
        names = {}
        for task in pathlib.Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
            except OSError:
                continue
            names[name] = names.get(name, 0) + 1
        return dict(sorted(names.items(), key=lambda kv: -kv[1]))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Group:
    """One process of hollow hosts, and one of the processes on their GPUs."""

    def __init__(self, work, coordinator, first, count, gpus, rack, keepalive):
        self.work, self.first, self.count, self.gpus = work, first, count, gpus
        self.coordinator = coordinator
        # --keepalive: ptc-hollow's --keepalive-s (0: the daemons' own).
        self.keepalive = ["--keepalive-s", str(keepalive)] if keepalive else []
        self.hosts_file = work / f"hosts-{first}.txt"
        self.log = open(work / f"hosts-{first}.log", "w")
        self.hosts = subprocess.Popen(
            [*NICE, str(bin_dir() / "tools/ptc-hollow"), "hosts", "--coordinator",
             coordinator, "--count", str(count), "--first", str(first),
             "--dir", str(work), "--gpus", str(gpus), "--rack-size", str(rack),
             *self.keepalive, "--insecure"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.ranks = None
        self.ranks_out = work / f"ranks-{first}.out"
        self.killed = False  # its hosts died on purpose (kill())

    def wait_ready(self, deadline):
        while not self.hosts_file.exists():
            if self.hosts.poll() is not None or time.time() > deadline:
                raise SystemExit(f"hollow hosts from {self.first} did not start; see "
                                 f"{self.work / f'hosts-{self.first}.log'}")
            time.sleep(0.1)
        return [line.split()[0] for line in self.hosts_file.read_text().splitlines()]

    def start_ranks(self, job, saves, step_ms, poll, rpc_timeout, commit_timeout,
                    wait_for_rank=False, direct=False, give_up_save=None):
        args = [*NICE, str(bin_dir() / "tools/ptc-hollow"), "ranks", "--coordinator",
                self.coordinator, "--job", job, "--hosts", str(self.hosts_file),
                "--gpus", str(self.gpus), "--saves", str(saves), "--step-ms",
                str(step_ms), "--rpc-timeout-s", str(rpc_timeout),
                "--commit-timeout-s", str(max(1, int(commit_timeout))), *self.keepalive,
                "--insecure"]
        if wait_for_rank:
            args.append("--wait-for-rank")
        if poll:
            args.append("--poll")
        if give_up_save:
            args += ["--give-up-save", give_up_save]
        # --direct: each process its own connection to the coordinator, not
        # through its host's ptcd.
        env = dict(os.environ, PTC_COORDINATOR_RELAY="0" if direct else "1")
        self.ranks = subprocess.Popen(args, stdout=open(self.ranks_out, "w"),
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env)

    def lines(self):
        try:
            return self.ranks_out.read_text().splitlines()
        except FileNotFoundError:
            return []

    def kill(self, stop=False):
        """SIGKILL, or with `stop` SIGSTOP (killed later, at close)."""
        self.killed = True
        for p in (self.ranks, self.hosts):
            if p is not None and p.poll() is None:
                if stop:
                    p.send_signal(signal.SIGSTOP)
                    continue
                p.kill()
                p.wait()

    def processes(self):
        return [p for p in (self.ranks, self.hosts) if p is not None]


class Harness:
    def __init__(self, opts):
        self.o = opts
        if opts.work:
            os.makedirs(opts.work, exist_ok=True)
        self.work = pathlib.Path(tempfile.mkdtemp(prefix="ptc-scale-", dir=opts.work))
        self.coordinator = None
        self.groups = []
        self.phases = []
        self.failures = []
        self.slow_reads = 0  # ptcctl reads asked again (read())

    def ptcctl(self, *args, check=True):
        r = subprocess.run([str(bin_dir() / "tools/ptcctl"), args[0], "--coordinator",
                            self.coordinator.address, "--insecure", *args[1:]],
                           capture_output=True, text=True, timeout=600)
        if check and r.returncode != 0:
            raise SystemExit(f"ptcctl {' '.join(args)[:200]} failed: {r.stderr[-2000:]}")
        return r

    def pin(self, config):
        self.ptcctl("auto", self.o.job, "on", "--live", "--no-hot", "--pin", config,
                    "--save-timeout", str(self.o.timeout))

    def read(self, *args):
        """ptcctl ARGS --json, a read the harness makes while it watches the
        job: asked again (and said so) while the coordinator, busy with
        thousands of processes, leaves it unanswered within ptcctl's 30 s
        or refuses it for busy threads, for at most --timeout."""
        deadline = time.time() + self.o.timeout
        while True:
            r = self.ptcctl(*args, "--json", check=False)
            if r.returncode == 0:
                return json.loads(r.stdout)
            why = (r.stderr.strip().splitlines() or ["(nothing)"])[-1][:300]
            busy = ("Deadline Exceeded", "UNAVAILABLE", "Threadpool Exhausted",
                    "RESOURCE_EXHAUSTED")
            if not any(b.upper() in why.upper() for b in busy) or time.time() > deadline:
                raise SystemExit(f"ptcctl {' '.join(args)} failed: {why}")
            self.slow_reads += 1
            print(f"  (ptcctl {' '.join(args)}: {why}; asking again)", flush=True)

    def status(self):
        return self.read("status", self.o.job)["jobs"][0]

    @staticmethod
    def same_config(a, b):
        """Whether two configs are the same (the coordinator may name more
        axes, at 1, or order them otherwise)."""
        def parts(c):
            return {k: v for k, _, v in (p.partition("=") for p in c.split(","))
                    if v != "1"}
        return parts(a) == parts(b)

    def check(self, ok, what):
        print(("  ok: " if ok else "  FAILED: ") + what, flush=True)
        if not ok:
            self.failures.append(what)

    def hollow_cpu(self):
        """CPU seconds so far of each hollow process alive ((kind, pid) ->
        s; kind "hosts" or "ranks")."""
        cpu = {}
        for g in self.groups:
            for kind, p in (("hosts", g.hosts), ("ranks", g.ranks)):
                if p is None or p.poll() is not None:
                    continue
                try:
                    fields = pathlib.Path(f"/proc/{p.pid}/stat").read_text() \
                        .rsplit(")", 1)[1].split()
                except OSError:
                    continue
                cpu[kind, p.pid] = (int(fields[11]) + int(fields[12])) / TICK
        return cpu

    def phase(self, name, body):
        print(f"phase {name} ...", flush=True)
        before = self.coordinator.sample()
        hollow_before = self.hollow_cpu()
        extra = body() or {}
        after = self.coordinator.sample()
        hollow_after = self.hollow_cpu()
        wall = after["time"] - before["time"]
        calls = {m: (after["calls"].get(m, 0) - before["calls"].get(m, 0)) / wall
                 for m in after["calls"]}
        row = {"phase": name, "wall_s": wall, "cpu_s": after["cpu"] - before["cpu"],
               "rss": after["rss"], "peak": after["peak"], "threads": after["threads"],
               "peak_threads": after["peak_threads"],
               "connections": after["connections"],
               "peak_connections": after["peak_connections"],
               "outgoing": after["outgoing"],
               "written": after["written"] - before["written"],
               "calls_per_s": {m: round(v, 1) for m, v in sorted(calls.items()) if v > 0},
               "watch_events": after["watch"]["events"] - before["watch"]["events"],
               "watch_bytes": after["watch"]["bytes"] - before["watch"]["bytes"],
               "proofs_whole": after["proofs"]["whole"] - before["proofs"]["whole"],
               "proofs_by_id": after["proofs"]["by_id"] - before["proofs"]["by_id"],
               # The hollow hosts' and processes' own (those alive at the
               # phase's end): what the harness costs the cores it shares.
               **{f"hollow_{kind}_cpu_s": sum(
                   hollow_after[p] - hollow_before.get(p, 0) for p in hollow_after
                   if p[0] == kind) for kind in ("hosts", "ranks")},
               **extra}
        self.phases.append(row)
        busy = ", ".join(f"{m.split('.')[-1]} {v:.0f}/s" for m, v in
                         sorted(row["calls_per_s"].items(), key=lambda kv: -kv[1])[:5])
        print(f"  {wall:.2f} s, coordinator {row['cpu_s']:.2f} CPU-s "
              f"({100 * row['cpu_s'] / wall:.0f}% of a core; hollow hosts "
              f"{row['hollow_hosts_cpu_s']:.1f}, processes {row['hollow_ranks_cpu_s']:.1f} "
              f"CPU-s), rss {row['rss'] / 2**20:.0f} MiB "
              f"(peak {row['peak'] / 2**20:.0f}), {row['threads']} threads "
              f"(at most {row['peak_threads']}), {row['connections']} connections "
              f"(at most {row['peak_connections']}) and {row['outgoing']} of its own, "
              f"wrote {row['written'] / 2**20:.1f} MiB; calls: {busy}; Watch streams "
              f"written {row['watch_events']:.0f} events, "
              f"{row['watch_bytes'] / 2**20:.2f} MiB; save proofs sent whole "
              f"{row['proofs_whole']:.0f}, by id {row['proofs_by_id']:.0f}", flush=True)
        for k, v in extra.items():
            print(f"  {k}: {v}", flush=True)

    def resumed(self, epoch):
        """Ranks that printed 'resumed EPOCH RANK ...', and the lines' errors."""
        ranks, errors = set(), []
        for g in self.groups:
            for line in g.lines():
                f = line.split()
                if f[:1] == ["resumed"] and int(f[1]) == epoch:
                    ranks.add(int(f[2]))
                elif f[:1] == ["error"]:
                    errors.append(line)
        return ranks, errors

    def wait_resumed(self, epoch, world, timeout):
        deadline = time.time() + timeout
        while True:
            ranks, errors = self.resumed(epoch)
            if len(ranks) >= world:
                return time.time()
            if errors:
                raise SystemExit(f"a hollow process failed: {errors[0]}")
            self.check_ranks_running()
            if time.time() > deadline:
                raise SystemExit(f"{len(ranks)} of {world} ranks resumed in layout epoch "
                                 f"{epoch} after {timeout} s")
            time.sleep(0.05)

    def check_ranks_running(self):
        """A process of hollow ranks that exited (a bad flag, a crash) fails
        the run at once, not at the phase's timeout."""
        for g in self.groups:
            if g.ranks is not None and not g.killed and g.ranks.poll() is not None:
                last = (g.lines() or ["(nothing)"])[-1]
                raise SystemExit(f"the hollow ranks of hosts from {g.first} exited with "
                                 f"{g.ranks.returncode}: {last}")

    def wait_saved(self, count, timeout):
        deadline = time.time() + timeout
        while True:
            lines = [line for g in self.groups for line in g.lines()]
            saved = sum(1 for line in lines if line.startswith("saved "))
            if saved >= count:
                return
            errors = [line for line in lines if line.startswith("error ")]
            if errors:
                raise SystemExit(f"a hollow process failed: {errors[0]}")
            self.check_ranks_running()
            if time.time() > deadline:
                raise SystemExit(f"{saved} of {count} saves committed in {timeout} s")
            time.sleep(0.05)

    @staticmethod
    def world(config):
        size = 1
        for part in config.split(","):
            k, _, v = part.partition("=")
            if k in ("tp", "pp", "dp", "cp", "ep"):
                size *= int(v)
        return size

    def run(self):
        o = self.o
        print(f"work directory {self.work}", flush=True)
        self.coordinator = Coordinator(self.work, o.host_timeout,
                                       o.heartbeats_per_second, o.coordinator)
        base = self.coordinator.sample()
        print(f"coordinator at {self.coordinator.address}: {base['threads']} threads",
              flush=True)

        def start():
            deadline = time.time() + o.timeout
            first = 0
            if o.kill and not o.hosts_only:
                self.groups.append(Group(self.work, self.coordinator.address, 0, o.kill,
                                         o.gpus, o.rack, o.keepalive))
                first = o.kill
            while first < o.hosts:
                n = min(o.group, o.hosts - first)
                self.groups.append(Group(self.work, self.coordinator.address, first, n,
                                         o.gpus, o.rack, o.keepalive))
                first += n
            self.names = [n for g in self.groups for n in g.wait_ready(deadline)]
            return {"hosts": len(self.names)}

        self.phase("start", start)
        if o.hosts_only:
            # The hosts' own cost: registrations, then heartbeats.
            self.phase("steady", lambda: time.sleep(o.steady))
            return
        self.ptcctl("register", "--job", o.job, "--model", o.model, "--config", o.config,
                    "--hosts", ",".join(self.names))
        # Pinned to the config it runs (no change now); each phase pins the
        # config it changes to.
        self.pin(o.config)
        world = self.world(o.config)

        def meet():
            for g in self.groups:
                g.start_ranks(o.job, o.saves, o.step_ms, o.poll, o.rpc_timeout, o.timeout,
                              direct=o.direct, give_up_save=o.give_up_save)
            self.wait_resumed(1, world, o.timeout)
            if o.saves:
                self.wait_saved(o.saves, o.timeout)
            if o.give_up_save:
                # The save given up was deleted, every rank learned it and
                # they made the step again (the saves counted above).
                lost = [line for g in self.groups for line in g.lines()
                        if line.startswith("lost ")]
                self.check(len(lost) >= 1, "the save given up (--give-up-save) was deleted "
                           "and made again")
            return {"processes": world}

        # Processes reach the coordinator through their host's ptcd: a
        # connection per host (the relay's; the hollow hosts of one process
        # share their agents'), not one per process.
        bound = len(self.names) + 2 * len(self.groups) + 16
        if not o.direct:
            self.coordinator.connection_alarm = bound
        self.phase("meet", meet)
        if not o.direct:
            most = self.phases[-1]["peak_connections"]
            over = self.coordinator.over_alarm
            self.check(most <= bound,
                       f"the coordinator's connections stayed within one per host and a "
                       f"few ({most} <= {bound}) for {world} processes"
                       + (f"; at {over[0]}, held by: {over[1]}" if over else ""))
            direct = sum(1 for g in self.groups for line in g.lines()
                         if line.startswith("direct "))
            self.check(direct == 0,
                       f"every process reached the coordinator through its host's relay "
                       f"({direct} on a connection of their own)")
        self.check(self.status()["committed_version"] >= o.saves,
                   f"{o.saves} saves of {world} processes committed")
        self.phase("steady", lambda: time.sleep(o.steady))
        steady_threads = self.phases[-1]["threads"]

        if o.kill:
            def failure():
                victims = self.groups[0]
                epoch_before = self.status()["reconfiguration"]["plan_epoch"]
                victims.kill(stop=o.stop)
                killed = time.time()
                names = set(self.names[:o.kill])
                # The config to change to is pinned once they are in doubt
                # (heartbeats late, not yet declared dead), when the
                # coordinator holds every change back: the change that
                # follows is the one for their deaths.
                while True:
                    rows = self.read("hosts")["hosts"]
                    if all(h["seconds_since_heartbeat"] > 2.5 or not h["alive"]
                           for h in rows if h["name"] in names):
                        break
                    time.sleep(0.1)
                self.pin(o.after_kill)
                while True:
                    rows = self.read("hosts")["hosts"]
                    dead = [h for h in rows if h["name"] in names and not h["alive"]]
                    if dead:
                        break
                    time.sleep(0.1)
                declared = time.time()  # the first of them
                every = None  # the last of them
                while (st := self.status())["layout_epoch"] < 2:
                    if time.time() > declared + o.timeout:
                        raise SystemExit("the automatic change did not commit")
                    if every is None and not any(
                            h["alive"] for h in self.read("hosts")["hosts"]
                            if h["name"] in names):
                        every = time.time()
                    time.sleep(0.1)
                committed = time.time()
                if every is None:
                    every = committed  # (no later than the commit: it left them out)
                # The change that committed, as the status that saw it
                # said (read later, it may be a newer one).
                change = st["reconfiguration"]
                after = self.world(o.after_kill)
                resumed = self.wait_resumed(2, after, o.timeout)
                # Of "declared dead -> committed": the change's own run (its
                # start to its commit, as the coordinator timed it) and what
                # came before it (the deaths' wait for late hosts, changes
                # planned or started and aborted).
                took = change.get("seconds", 0.0)
                staging = change.get("staging_seconds", 0.0)
                verifying = change.get("verifying_seconds", 0.0)
                aborted = sum(1 for c in st.get("recent_changes", [])
                              if c["plan_epoch"] > epoch_before and c["phase"] == "aborted")
                return {"first declared dead after kill": f"{declared - killed:.2f} s",
                        "last declared dead after kill": f"{every - killed:.2f} s",
                        "declared dead -> the change committed": f"{committed - declared:.2f} s",
                        "of it, before the change started":
                            f"{max(0.0, committed - declared - took):.2f} s "
                            f"({aborted} changes aborted)",
                        "of it, the change (staging, verifying, the rest)":
                            f"{took:.2f} s ({staging:.2f}, {verifying:.2f}, "
                            f"{max(0.0, took - staging - verifying):.2f})",
                        "declared dead -> every process resumed": f"{resumed - declared:.2f} s",
                        "change": f"{change['phase']}, {change['reason']}"}

            self.phase("failure", failure)
            st = self.status()
            self.check(self.same_config(st["config"], o.after_kill),
                       f"the job runs {st['config']} (asked: {o.after_kill})")
            self.check(st["layout_epoch"] == 2, f"layout epoch {st['layout_epoch']} (2)")
            ranks, _ = self.resumed(2)
            self.check(len(ranks) == self.world(o.after_kill),
                       f"{len(ranks)} processes resumed in the new layout")

        if o.add:
            def scale_up():
                first = o.hosts
                g = Group(self.work, self.coordinator.address, first, o.add, o.gpus, o.rack,
                          o.keepalive)
                self.groups.append(g)
                added = g.wait_ready(time.time() + o.timeout)
                g.start_ranks(o.job, o.saves, o.step_ms, o.poll, o.rpc_timeout, o.timeout,
                              wait_for_rank=True, direct=o.direct)
                started = time.time()
                self.ptcctl("hosts", "add", ",".join(added), "--job", o.job)
                self.pin(o.after_add)
                epoch = 3 if o.kill else 2
                resumed = self.wait_resumed(epoch, self.world(o.after_add), o.timeout)
                return {"hosts added -> every process resumed": f"{resumed - started:.2f} s"}

            self.phase("scale-up", scale_up)
            st = self.status()
            self.check(self.same_config(st["config"], o.after_add),
                       f"the job runs {st['config']} (asked: {o.after_add})")

        # The RPC threads a burst of calls started end when idle.
        deadline = time.time() + 30
        while True:
            end = self.coordinator.sample()
            if end["threads"] <= steady_threads + 16 or time.time() > deadline:
                break
            time.sleep(0.5)
        self.check(end["threads"] <= steady_threads + 16,
                   f"coordinator threads {end['threads']} once idle after the changes, "
                   f"{steady_threads} before: {self.coordinator.thread_names()}")
        most = max(p["peak_threads"] for p in self.phases)
        self.check(most <= KMAX_RPC_THREADS + 64,
                   f"coordinator threads at most {most} (bound: {KMAX_RPC_THREADS} RPC "
                   f"threads and 64 more)")
        # The coordinator's kept channels (HostChannel): two per host, one
        # for short calls and one for a change's staging streams; and a
        # host whose heartbeats came late has a probe's connection of its
        # own (HostProbes).
        outgoing = max(p["outgoing"] for p in self.phases)
        self.check(outgoing <= 3 * len(self.names) + 8,
                   f"the coordinator's own connections at most {outgoing} at a phase's "
                   f"end (bound: 3 per host and 8 more: two kept, a probe's)")

    def close(self):
        """Stops every hollow process (SIGTERM to all at once, then SIGKILL
        to those still running a minute later), then the coordinator."""
        procs = [p for g in self.groups for p in g.processes()]
        for g in self.groups:
            if g.killed:  # stopped (--stop): a stopped process waits out SIGTERM
                for p in g.processes():
                    if p.poll() is None:
                        p.kill()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 60
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.coordinator:
            self.coordinator.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=64)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--kill", type=int, default=4)
    p.add_argument("--stop", action="store_true",
                   help="the --kill hosts stop (SIGSTOP) instead of dying, as hosts "
                   "behind a cut link: the coordinator's questions to them wait out "
                   "their deadlines")
    p.add_argument("--add", type=int, default=0)
    p.add_argument("--group", type=int, default=128, help="hosts per process")
    p.add_argument("--rack", type=int, default=0, help="hosts per failure domain")
    p.add_argument("--model", default="gpt:layers=8,hidden=64,heads=4,vocab=512,positions=64")
    p.add_argument("--config", default="tp=2,pp=4,dp=64")
    p.add_argument("--after-kill", default="tp=2,pp=4,dp=60")
    p.add_argument("--after-add", default="")
    p.add_argument("--job", default="scale")
    p.add_argument("--saves", type=int, default=2)
    p.add_argument("--step-ms", type=int, default=200)
    p.add_argument("--poll", action="store_true",
                   help="rank 0 follows the Watch stream and the others poll, as "
                   "ptc.elastic's processes did before 2026-11-28 (default: every "
                   "process follows its stream, as they do now)")
    p.add_argument("--direct", action="store_true",
                   help="every process connects to the coordinator itself, as before "
                   "2026-11-30 (default: through its host's ptcd, one connection per host)")
    p.add_argument("--give-up-save", default=None, metavar="SAVE:RANK",
                   help="a test fault: the process on rank RANK gives up the SAVE-th "
                        "save it begins; its peers learn the loss and the step is "
                        "saved again")
    p.add_argument("--steady", type=float, default=10)
    p.add_argument("--host-timeout", type=float, default=5)
    p.add_argument("--heartbeats-per-second", type=float, default=None,
                   help="the coordinator's --heartbeats-per-second (default: its own)")
    p.add_argument("--coordinator", default=None,
                   help="this coordinator binary (to compare two builds)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--rpc-timeout", type=int, default=30,
                   help="each hollow process's deadline for a call, in seconds (ptc's "
                        "default: 30; longer where thousands of them share this "
                        "machine's cores with the coordinator)")
    p.add_argument("--keepalive", type=int, default=0,
                   help="the hollow processes' channels and servers ping every this many "
                        "seconds and wait as long (0: as ptcd's do). Longer at 2,048 hosts: "
                        "gRPC 1.51 can crash when a ping's answer and its watchdog race "
                        "(grpc/grpc#32085) at a load average in the thousands")
    p.add_argument("--work", default=None)
    p.add_argument("--json", default=None, help="write the phases here")
    p.add_argument("--hosts-only", action="store_true",
                   help="no job: the hosts start and heartbeat (--kill is ignored)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    o = p.parse_args()
    if o.add and not o.after_add:
        p.error("--add needs --after-add")
    h = Harness(o)
    stopped = None
    try:
        h.run()
    except BaseException as e:
        # Said before the processes are stopped, which can take a minute.
        stopped = repr(e)
        print(f"stopping: {stopped}", flush=True)
        raise
    finally:
        h.close()
        # Saves deleted as they committed (a host of the placement declared
        # dead, and back, with no change to follow): the ranks saved again.
        lost = [line.split()[1] for g in h.groups for line in g.lines()
                if line.startswith("lost ")]
        if lost:
            print(f"saves lost and made again: versions {', '.join(lost)}", flush=True)
        # The phases measured, also those of a run that stopped.
        if o.json:
            pathlib.Path(o.json).write_text(json.dumps(
                {"options": vars(o), "phases": h.phases, "failures": h.failures,
                 "saves_lost": len(lost), "slow_reads": h.slow_reads,
                 "stopped": stopped}, indent=1))
        if not o.keep:
            shutil.rmtree(h.work, ignore_errors=True)
    if h.failures:
        print(f"{len(h.failures)} checks failed", flush=True)
        sys.exit(1)
    print("every check passed", flush=True)


if __name__ == "__main__":
    main()
