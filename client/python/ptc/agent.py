"""ptc-agent: starts a live job's processes on one host.

Run one per host next to ptcd (under systemd, like ptcd). It follows the
job's placement at the coordinator and keeps one process on every GPU of
this host that the placement gives a rank: a process it started stays
while its GPU keeps a rank (the process itself follows changes,
ptc.torch.elastic); a GPU that gains a rank in a new layout gets a new
process. A process that ends while its GPU keeps its rank (the job
finished, or the process crashed) is not started again under the same
layout: the job's other processes are not waiting for it; the next
change brings it back. Each
process gets the job, the coordinator, this host's ptcd socket, the host's
name and its GPU (PTC_JOB, PTC_COORDINATOR, PTC_SOCKET, PTC_HOST,
PTC_DEVICE, CUDA_VISIBLE_DEVICES is left alone) on top of the agent's own
environment (the job's token PTC_JOB_TOKEN and TLS settings pass through),
and glibc's malloc backs their large allocations with transparent huge
pages (with_huge_pages; --no-huge-pages leaves that out).

    python3 -m ptc.agent --job gpt --host gpu-node-7 --coordinator coord:7000 \\
        --socket /run/ptcd/ptcd.sock [--status FILE] [--log-dir DIR] -- \\
        python3 train.py --my-flags

It reports what it runs on stdout (one line per start and exit) and, with
--status, as JSON in FILE (rewritten atomically on every change). SIGTERM
or SIGINT stops its processes (SIGTERM, then SIGKILL after 10 s) and it.
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


class Agent:
    def __init__(self, args, command):
        self.args = args
        self.command = command
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

    def say(self, msg):
        print(f"[ptc-agent {self.args.host} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def wanted(self):
        """(layout epoch, {GPU: rank}) of this host under the job's placement
        now (None: the coordinator could not be asked)."""
        try:
            placed = _capi.ranks_on_host(self.args.coordinator, self.args.job, self.args.host)
        except _capi.Error as e:
            if not getattr(self, "_warned", False):
                self.say(f"asking the coordinator: {e}")
                self._warned = True
            return None
        self._warned = False
        return placed["layout_epoch"], {r["gpu"]: r["rank"] for r in placed["ranks"]}

    def epoch_file(self, gpu):
        return self.epochs / f"gpu{gpu}"

    def start(self, gpu, rank, epoch):
        self.epoch_file(gpu).write_text(str(epoch))
        env = dict(os.environ, PTC_JOB=self.args.job, PTC_COORDINATOR=self.args.coordinator,
                   PTC_SOCKET=self.args.socket, PTC_HOST=self.args.host, PTC_DEVICE=str(gpu),
                   PTC_AGENT_EPOCH_FILE=str(self.epoch_file(gpu)))
        if not self.args.no_huge_pages:
            env = with_huge_pages(env)
        log = None
        out = None
        if self.args.log_dir:
            d = pathlib.Path(self.args.log_dir)
            d.mkdir(parents=True, exist_ok=True)
            log = open(d / f"{self.args.job}-{self.args.host}-gpu{gpu}-{int(time.time() * 1e3)}"
                       ".log", "w")
            out = log
        p = subprocess.Popen(self.command, env=env, stdout=out,
                             stderr=subprocess.STDOUT if out else None)
        self.children[gpu] = (p, time.time(), log)
        self.say(f"started pid {p.pid} on GPU {gpu} (rank {rank} of the placement now)")

    def reap(self, placed=None):
        for gpu, (p, started, log) in list(self.children.items()):
            code = p.poll()
            if code is None:
                continue
            if log:
                log.close()
            del self.children[gpu]
            self.exited.append({"pid": p.pid, "gpu": gpu, "exit_code": code,
                                "seconds": round(time.time() - started, 3)})
            self.say(f"pid {p.pid} on GPU {gpu} exited with {code}")
            if code != 0 and not self.stopping and placed and gpu in placed[1]:
                self.report_exit(gpu, code, max(placed[0], self.ran_under(gpu)))

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
        changes on) and the new layout starts it again here."""
        try:
            changing = _capi.report_process_exit(self.args.coordinator, self.args.job,
                                                self.args.host, gpu, code, epoch)
        except _capi.Error as e:
            self.say(f"could not report the exit to the coordinator: {e}")
            return
        self.say("the coordinator " + ("changes the job" if changing else
                                       "has automatic changes off for the job"))

    def write_status(self):
        if not self.args.status:
            return
        path = pathlib.Path(self.args.status)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({
            "job": self.args.job, "host": self.args.host,
            "running": [{"pid": p.pid, "gpu": g, "since": s}
                        for g, (p, s, _) in sorted(self.children.items())],
            "exited": self.exited}))
        tmp.rename(path)

    def run(self):
        last = None
        wanted = None
        while not self.stopping:
            # Exits are reported under the last look, when the process was
            # alive: if the job has moved on since, the look below starts
            # its GPU's process anew under the new layout instead.
            self.reap(wanted)
            wanted = self.wanted()
            if wanted is not None:
                epoch, ranks = wanted
                for gpu in self.children:
                    self.covered[gpu] = epoch
                for gpu, rank in sorted(ranks.items()):
                    if gpu not in self.children and self.covered.get(gpu) != epoch:
                        self.start(gpu, rank, epoch)
                        self.covered[gpu] = epoch
            state = (sorted(self.children), len(self.exited))
            if state != last:
                self.write_status()
                last = state
            time.sleep(self.args.interval)
        self.stop_children()
        self.write_status()
        shutil.rmtree(self.epochs, ignore_errors=True)

    def stop_children(self):
        for p, _, _ in self.children.values():
            if p.poll() is None:
                p.terminate()
        deadline = time.time() + 10
        for p, _, _ in self.children.values():
            try:
                p.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.reap()


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        sys.exit("usage: python3 -m ptc.agent --job J --host H --coordinator C --socket S "
                 "-- COMMAND ...")
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="ptc-agent", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", required=True)
    ap.add_argument("--host", required=True, help="this host's name, as its ptcd registered")
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--socket", required=True, help="this host's ptcd socket")
    ap.add_argument("--status", help="write what runs here to this JSON file")
    ap.add_argument("--log-dir", help="each process's output goes to a file here")
    ap.add_argument("--no-huge-pages", action="store_true",
                    help="do not ask glibc to back the processes' large allocations with "
                         "transparent huge pages (GLIBC_TUNABLES glibc.malloc.hugetlb=1)")
    ap.add_argument("--interval", type=float, default=0.1,
                    help="seconds between looks at the placement")
    args = ap.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not command:
        sys.exit("ptc-agent: give the command that runs one process after --")
    agent = Agent(args, command)

    def stop(*_):
        agent.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run()


if __name__ == "__main__":
    main()
