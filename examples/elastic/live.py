"""A live GPT job on a local ptc cluster: nobody restarts a process and
nobody calls `ptcctl reconfigure`.

Two ptcd "hosts" with 2 GPUs each; a ptc agent per host starts one
process per GPU that the job's placement uses (examples/elastic_live/
train.py, ptc.torch.elastic); the job is registered with automatic, live
changes. Then:

  1. host1 dies (its ptcd, agent and processes SIGKILLed) as the job saves,
     after its processes saved and before host0's did, so that the save
     cannot commit: the coordinator declares host1 dead, picks a config
     for the 2 GPUs left (the advisor), and moves the committed state
     there; host0's processes roll back to it and go on in the new config,
     the same processes (PIDs unchanged);
  2. host1 comes back (a new ptcd and agent) and the scheduler adds it to
     the job's pool (`ptcctl hosts add host1 --job J`): the processes save
     at their next step, the job grows to 4 GPUs, host1's agent starts the
     new processes, and they all go on.

With --scenario requests instead, nobody dies of a host: a scheduler asks
for two changes in a row while the processes are mid-step (`ptcctl
reconfigure --after-save`; the second replaces the first if it has not
started, or is refused if it has), then for a third, and a process is
SIGKILLed while that one is under way: its agent reports it, the
coordinator changes the job from its last committed version, the agent
starts the process again and the job goes on.

With --scenario hot: hot switches (the processes move the state between
themselves, over gloo here) for a tp, a pp and a dp change, a process
SIGKILLed after the tp one committed, right after it met its peers under
the new layout (PTC_TEST_DIE_AFTER_MEETING, a test fault; the others
leave their groups' store as the job changes again), and one during the
pp one; then a hot switch that one process fails to start
(PTC_TEST_HOT_REFUSE, a test fault): the processes save instead and the
change goes through the store at once.

With --scenario stall: host1's ptcd stops (SIGSTOP) as the job saves,
after host1's processes reported the save and before host0's do, with the
job's config pinned to both hosts' 4 GPUs: the coordinator declares host1
dead, the save cannot commit and is deleted, and no change can follow.
host1's ptcd goes on (SIGCONT) as the same process, alive again: every
process learns the save was lost and saves again (no change, no restart),
and the job goes on; then two changes (pinned configs) load the state of
those saves.

With --scenario outage: the coordinator stops (SIGSTOP) for longer than
the processes' patience with it (30 s), with the job's config pinned,
first once every process began a save and before any reported its share,
then between saves: the save whose reports get no answer, and the
periodic saves that cannot begin, are skipped on every rank (the ranks
agree on it), the job trains on, and the first save once it goes on
(SIGCONT) commits. Then it stops
again and a process is SIGKILLed meanwhile: its agent reports the exit
once the coordinator is back, and the job changes and goes on. Then two
changes (pinned configs) load what the processes saved.

Checked at the end: every reload bit-identical to the values its version
was saved from; the loss of every iteration (the last time it ran, after
rollbacks) equal to an uninterrupted run's within the tolerance; the
samples of every iteration the uninterrupted run's, so every sample once;
host0's processes never restarted.

    /usr/bin/python3 examples/elastic/live.py [--scenario host|requests|hot|stall|outage] [--json]
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

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import run as elastic  # noqa: E402  (the cluster and reference-run helpers)

JOB = "live-gpt"
FIRST = "tp=2,dp=2"


def read_jsonl(path):
    """The file's complete records: the training processes append to it
    while this reads, so a last line without its newline is still being
    written and is left for the next read."""
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")[:-1]  # the part after the last newline is unfinished
    return [json.loads(line) for line in lines if line.strip()]


def effective(records):
    """iteration -> the record of the last time it ran (highest layout
    epoch: a rollback replays iterations under a newer one)."""
    out = {}
    for r in records:
        if r["iteration"] not in out or r["epoch"] >= out[r["iteration"]]["epoch"]:
            out[r["iteration"]] = r
    return out


class LiveJob:
    def __init__(self, args, cluster, work):
        self.args, self.cluster, self.work = args, cluster, work
        self.run = work / "live"
        self.run.mkdir(parents=True, exist_ok=True)
        self.agents = {}

    def start_agent(self, host):
        env = dict(os.environ, PYTHONPATH=f"{self.args.bin}/client/python/pkg",
                   OMP_NUM_THREADS="1", **self.cluster.job_env(JOB))
        if self.args.scenario == "hot":
            # This model's pieces are small: from 16 KiB on they travel as
            # messages of their own, so that both of the switch's kinds of
            # messages (own and packed) carry pieces here.
            env["PTC_HOT_DIRECT_BYTES"] = str(16 << 10)
            # The last change: rank 1 fails to start the hot switch to it.
            env["PTC_TEST_HOT_REFUSE"] = f"{REFUSED}:1"
            if host == "host1":
                # The process on GPU 1 dies right after it met its peers
                # under the tp switch's layout (before any group formed).
                env["PTC_TEST_DIE_AFTER_MEETING"] = f"{TP_TARGET}:1"
        cmd = [sys.executable, "-m", "ptc.agent", "--job", JOB, "--host", host,
               "--coordinator", self.cluster.coordinator, "--socket", self.cluster.socket(host),
               "--status", str(self.work / f"agent-{host}.json"),
               "--log-dir", str(self.work / "logs"), "--",
               sys.executable, str(ROOT / "examples/elastic_live/train.py"),
               "--model", self.args.model, "--run-dir", str(self.run),
               "--iterations", str(self.args.iterations), "--save-every",
               str(self.args.save_every), "--global-batch", str(self.args.global_batch),
               "--step-seconds", str(self.args.step_seconds)]
        if getattr(self.args, "check", True):  # every reload compared bit for bit
            cmd.append("--check")
        if self.args.scenario in ("host", "stall"):
            # host0's processes hold their save of this iteration until
            # host1 is dead (host_dies_and_returns, host_stalls).
            cmd += ["--hold-save", f"{self.kill_at()}:host0"]
        if self.args.scenario == "outage":
            # Every process holds its save of this iteration once begun,
            # until the coordinator is stopped (coordinator_out).
            cmd += ["--hold-save", f"{self.kill_at()}:*"]
        if self.args.scenario == "stall":
            # Rank 2 (on host1) gives its save of this iteration up right
            # after it began it, and host0's processes write theirs only
            # after the deletion (host_stalls).
            env["PTC_TEST_GIVE_UP_SAVE"] = f"{self.give_up_at()}:2"
            cmd += ["--hold-save", f"{self.give_up_at()}:host0"]
        log = open(self.work / f"agent-{host}.log", "a")
        # Its own process group: killing the "host" kills the agent and its
        # processes at once.
        self.agents[host] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)

    def kill_at(self):
        """The iteration whose save host1 dies in: the periodic save about a
        quarter in (the first one for a short run)."""
        every = self.args.save_every
        return max(every, self.args.iterations // 4 // every * every)

    def give_up_at(self):
        """The stall scenario's second lost save: two saves after the first."""
        return self.kill_at() + 2 * self.args.save_every

    def ptcd_pid(self, index):
        """host{index}'s ptcd now (the newest started)."""
        pids = [int(line.split()[1]) for line in
                (self.cluster.dir / "pids").read_text().splitlines()
                if line.split()[:1] == [f"host{index}"]]
        if not pids:
            raise SystemExit(f"host{index} has no ptcd in {self.cluster.dir / 'pids'}")
        return pids[-1]

    def coordinator_pid(self):
        pids = [int(line.split()[1]) for line in
                (self.cluster.dir / "pids").read_text().splitlines()
                if line.split()[:1] == ["coordinator"]]
        if not pids:
            raise SystemExit(f"no coordinator in {self.cluster.dir / 'pids'}")
        return pids[-1]

    def logged(self, text):
        """How often the processes' logs say `text`."""
        return sum(f.read_text(errors="replace").count(text)
                   for f in (self.work / "logs").glob("*.log"))

    def alive(self, host):
        hosts = json.loads(self.cluster.ptcctl("hosts", "--json", capture=True))["hosts"]
        return any(h["name"] == host and h["alive"] for h in hosts)

    def kill_host(self, host, index):
        subprocess.run(["bash", str(ROOT / "tools/local_cluster.sh"), "kill-host",
                        str(self.cluster.dir), str(index)], check=True, env=self.cluster.env)
        os.killpg(self.agents[host].pid, signal.SIGKILL)
        self.agents[host].wait()

    def running(self, host):
        path = self.work / f"agent-{host}.json"
        if not path.exists():
            return {}
        return {p["gpu"]: p["pid"] for p in json.loads(path.read_text())["running"]}

    def losses(self):
        return effective(read_jsonl(self.run / "losses.jsonl"))

    def status(self):
        out = self.cluster.ptcctl("status", JOB, "--json", capture=True)
        return json.loads(out)["jobs"][0]

    def pending(self):
        return self.status()["pending_config"]

    def wait(self, what, ready, timeout=300):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if ready():
                return
            for host, agent in self.agents.items():
                if agent.poll() is not None and agent.returncode not in (0, -9):
                    raise SystemExit(f"the agent of {host} exited with {agent.returncode}")
            time.sleep(0.05)
        raise SystemExit(f"waited {timeout} s for {what} (work dir {self.work}); "
                         f"the last of what the agents and processes said:\n"
                         + "\n".join(self.timeline()[-60:]))

    def timeline(self):
        """What the agents and the processes said (their ptc lines, not the
        training's), in the order they said it: where a failed run's
        story is told when its work dir is gone (a CI machine)."""
        said = []
        for path in [*self.work.glob("agent-*.log"), *(self.work / "logs").glob("*.log")]:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("[ptc"):
                    # "[ptc host0:1 12:00:01.234] ..." / "[ptc-agent host1 12:00:01] ..."
                    stamp = line.split("]", 1)[0].rsplit(" ", 1)[-1]
                    said.append((stamp if "." in stamp else stamp + ".000", line))
        return [line for _, line in sorted(said, key=lambda s: s[0])]

    def stop(self):
        for agent in self.agents.values():
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
        for agent in self.agents.values():
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)


def host_dies_and_returns(args, cluster, job, results, say):
    """host1 dies as the job saves (host1's processes have saved, host0's
    hold their save until host1 is dead, so that the save cannot commit
    before the coordinator knows host1 is gone); later host1 comes back and
    joins the job's pool. Returns host0's processes before and after the
    death."""
    kill_at = job.kill_at()
    held = job.run / f"held-{kill_at}"
    job.wait(f"the save of iteration {kill_at}",
             lambda: len(list(held.glob("rank*"))) == 4)
    time.sleep(1.0)  # host1's processes write and report their shares
    before = job.running("host0")
    epoch0 = max(r["epoch"] for r in job.losses().values())
    say(f"   trained to iteration {max(job.losses())}; host0 runs PIDs "
        f"{sorted(before.values())}")

    say(f"\n== host1 dies as the job saves iteration {kill_at}: its ptcd, agent and "
        "processes SIGKILLed, then host0's processes save")
    t_kill = time.time()
    job.kill_host("host1", 1)
    (held / "release").touch()
    job.wait("the job to go on without host1", lambda: any(
        r["epoch"] > epoch0 for r in job.losses().values()))
    after = job.losses()
    resumed = min(r["time"] for r in after.values() if r["epoch"] > epoch0)
    small = next(r for r in after.values() if r["epoch"] > epoch0)
    status = job.status()["reconfiguration"]
    say(f"   the coordinator changed it by itself ({status['reason']}) to {small['config']}; "
        f"training went on {resumed - t_kill:.1f} s after the kill")
    results["events"].append({"what": "host1 died", "config": small["config"],
                              "reason": status["reason"],
                              "seconds_to_resume": resumed - t_kill})
    epoch1 = small["epoch"]
    grow_at = max(after) + 4
    job.wait(f"iteration {grow_at}", lambda: max(job.losses()) >= grow_at)
    during = job.running("host0")

    say("\n== host1 comes back, and the scheduler adds it to the job "
        "(ptcctl hosts add host1 --job ...)")
    subprocess.run(["bash", str(ROOT / "tools/local_cluster.sh"), "start-host",
                    str(cluster.dir), "1"], check=True, env=cluster.env)
    job.start_agent("host1")
    t_add = time.time()
    cluster.ptcctl("hosts", "add", "host1", "--job", JOB, capture=True)

    def grew():
        return any(r["epoch"] > epoch1 for r in job.losses().values())

    job.wait("the job to grow onto host1",
             lambda: grew() or max(job.losses()) >= args.iterations)
    if not grew():
        raise SystemExit(f"the job trained its {args.iterations} iterations before it grew "
                         f"onto host1 (work dir {job.work})")
    grown = next(r for r in job.losses().values() if r["epoch"] > epoch1)
    resumed = min(r["time"] for r in job.losses().values() if r["epoch"] > epoch1)
    status = job.status()["reconfiguration"]
    say(f"   it grew by itself ({status['reason']}) to {grown['config']}; host1's agent "
        f"started PIDs {sorted(job.running('host1').values())}; training went on "
        f"{resumed - t_add:.1f} s after the request")
    results["events"].append({"what": "host1 added", "config": grown["config"],
                              "reason": status["reason"],
                              "seconds_to_resume": resumed - t_add})
    return before, during


def pinned_changes(cluster, job, say):
    """Two changes, to pinned configs (as the processes write them), each
    followed by two iterations in it."""
    for to in (TP_TARGET, "tp=2,pp=1,dp=2"):
        epoch = max(r["epoch"] for r in job.losses().values())
        cluster.ptcctl("auto", JOB, "on", "--live", "--pin", to, capture=True)
        job.wait(f"the change to {to}", lambda: any(
            r["epoch"] > epoch and r["config"] == to for r in job.losses().values())
            and job.pending() == "")
        say(f"   changed to {to} (pinned)")
        at = max(job.losses()) + 2
        job.wait(f"iteration {at}", lambda: max(job.losses()) >= at)


def host_stalls(args, cluster, job, results, say):
    """host1's ptcd stops as the job saves (host1's processes have saved,
    host0's hold their save until host1 is declared dead), so that the
    save cannot commit and is deleted; the config is pinned to the two
    hosts' 4 GPUs, so no change follows. Then host1's ptcd goes on: the job
    must go on by itself, its processes saving again. Then two changes
    (pinned configs) load what they saved. Returns host0's processes
    before the stall and after it."""
    at = job.kill_at()
    held = job.run / f"held-{at}"
    job.wait(f"the save of iteration {at}", lambda: len(list(held.glob("rank*"))) == 4)
    time.sleep(1.0)  # host1's processes write and report their shares
    before, before1 = job.running("host0"), job.running("host1")
    epoch0 = job.status()["layout_epoch"]
    pid = job.ptcd_pid(1)
    say(f"\n== host1's ptcd (pid {pid}) stops (SIGSTOP) as the job saves iteration {at}; "
        f"the job is pinned to {FIRST} on both hosts")
    os.kill(pid, signal.SIGSTOP)
    stopped = time.time()
    try:
        job.wait("the coordinator to declare host1 dead", lambda: not job.alive("host1"))
        (held / "release").touch()  # host0's processes save: it cannot commit
        job.wait("the save to be deleted", lambda: job.status()["dropped_save"] > 0)
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.time()
    dropped = job.status()["dropped_save"]
    say(f"   version {dropped} could not commit and was deleted; host1's ptcd goes on "
        f"(SIGCONT) after {resumed - stopped:.1f} s")
    job.wait("host1 to be alive again", lambda: job.alive("host1"))
    job.wait("a save made again to commit", lambda: job.status()["committed_version"] > dropped)
    trained = max(job.losses())
    job.wait("the job to train on", lambda: max(job.losses()) > trained)
    status = job.status()
    say(f"   version {status['committed_version']} committed {time.time() - resumed:.1f} s "
        f"later; the job trains on at layout epoch {status['layout_epoch']} (it was "
        f"{epoch0}), no process restarted")
    results["events"].append({
        "what": "host1 stalled", "dropped_save": dropped,
        "committed_after": status["committed_version"],
        "layout_epoch_before": epoch0, "layout_epoch_after": status["layout_epoch"],
        "host1_kept": job.running("host1") == before1,
        "saves_lost": sum(f.read_text(errors="replace").count("save lost")
                          for f in (job.work / "logs").glob("*.log"))})
    # A rank gives its save up as it begins (PTC_TEST_GIVE_UP_SAVE); host0's
    # processes write theirs after the deletion (a periodic save begins on
    # every process before any writes): their reports are refused, and
    # they too must learn the save was lost.
    at = job.give_up_at()
    held = job.run / f"held-{at}"
    job.wait(f"the save of iteration {at}", lambda: len(list(held.glob("rank*"))) == 4)
    committed = job.status()["committed_version"]
    job.wait("rank 2 to give its save up", lambda: job.status()["dropped_save"] > committed)
    given_up = job.status()["dropped_save"]
    (held / "release").touch()
    job.wait("a save made again to commit",
             lambda: job.status()["committed_version"] > given_up)
    say(f"   rank 2 gave its save of iteration {at} up (version {given_up}); host0's "
        f"processes wrote theirs after; version {job.status()['committed_version']} "
        "committed when they all saved again")
    results["events"].append({"what": "a save given up", "dropped_save": given_up,
                              "committed_after": job.status()["committed_version"],
                              "layout_epoch": job.status()["layout_epoch"]})
    during = job.running("host0")
    # Two changes: the processes load the state they saved again.
    pinned_changes(cluster, job, say)
    results["saves_lost"] = sum(f.read_text(errors="replace").count("save lost")
                                for f in (job.work / "logs").glob("*.log"))
    return before, during


def skipped_while_stopped(job, pid, results, say, what, text, then=None):
    """Stops the coordinator (SIGSTOP; then calls `then`) until the
    processes' logs say `text` once more for each of the 4 processes
    (nothing here asks the coordinator meanwhile) and the job trained on
    after that; then SIGCONT, and waits for the next save's commit, with
    no process restarted."""
    status = job.status()
    committed, epoch0 = status["committed_version"], status["layout_epoch"]
    before = {h: job.running(h) for h in ("host0", "host1")}
    base, trained = job.logged(text), max(job.losses())
    stopped = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        if then:
            then()
        deadline = time.time() + 300
        while job.logged(text) < base + 4 and time.time() < deadline:
            time.sleep(0.2)
        # And trains on while it is still stopped.
        at_skip = max(job.losses())
        deadline = time.time() + 120
        while max(job.losses()) <= at_skip and time.time() < deadline:
            time.sleep(0.1)
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.time()
    skipped, trained = job.logged(text) - base, max(job.losses()) - trained
    say(f"   {skipped} process saves skipped ({text}); the job trained {trained} iterations "
        f"while the coordinator was stopped for {resumed - stopped:.1f} s (SIGCONT)")
    job.wait("a save to commit after the coordinator went on",
             lambda: job.status()["committed_version"] > committed)
    status = job.status()
    say(f"   version {status['committed_version']} (step {status['committed_step']}) "
        f"committed {time.time() - resumed:.1f} s later, at layout epoch "
        f"{status['layout_epoch']} (it was {epoch0}); no process restarted")
    results["events"].append({
        "what": what, "stopped_seconds": resumed - stopped,
        "saves_skipped": skipped, "iterations_while_stopped": trained,
        "committed_before": committed, "committed_after": status["committed_version"],
        "layout_epoch_before": epoch0, "layout_epoch_after": status["layout_epoch"],
        # What became of the skipped save's version at the coordinator.
        "dropped_save_after": int(status.get("dropped_save", 0)),
        "open_saves_after": [int(v) for v in status.get("open_saves", [])],
        "processes_kept": all(job.running(h) == before[h] for h in before)})


def coordinator_out(args, cluster, job, results, say):
    """The coordinator stops once every process began the save of an
    iteration and before any reported its share, until every process
    skipped that save (its report got no answer within the client's
    patience), then goes on: the job trains on meanwhile, no process
    restarts, and the next save commits. Then it stops between saves
    until every process skipped a periodic save (it could not be begun),
    with the same outcome. Then it stops again and a process of host1 is
    killed meanwhile: its agent reports the exit once the coordinator is
    back, the job changes and the agent starts the process again. Then
    two changes (pinned configs) load what was saved. Returns host0's
    processes before and after the first two outages."""
    pid = job.coordinator_pid()
    at = job.kill_at()
    held = job.run / f"held-{at}"
    job.wait(f"every process to begin the save of iteration {at}",
             lambda: len(list(held.glob("rank*"))) == 4)
    before = job.running("host0")
    say(f"\n== the coordinator (pid {pid}) stops (SIGSTOP) once every process began the save "
        f"of iteration {at}, before they write and report it")
    skipped_while_stopped(job, pid, results, say, "the coordinator stopped mid-save",
                          "could report its share", then=(held / "release").touch)
    say(f"\n== the coordinator (pid {pid}) stops (SIGSTOP) between saves, at iteration "
        f"{max(job.losses())}")
    skipped_while_stopped(job, pid, results, say, "the coordinator stopped",
                          "could begin the save")
    during = job.running("host0")
    # Stopped again, and a process dies meanwhile: its agent cannot report
    # it until the coordinator is back, and reports it then.
    epoch1 = job.status()["layout_epoch"]
    victim = job.running("host1")[1]
    say(f"\n== the coordinator stops again, and host1's process on GPU 1 (pid {victim}) "
        "is killed meanwhile")
    os.kill(pid, signal.SIGSTOP)
    try:
        os.kill(victim, signal.SIGKILL)
        deadline = time.time() + 300
        while ("could not report the exit" not in
               (job.work / "agent-host1.log").read_text(errors="replace") and
               time.time() < deadline):
            time.sleep(0.2)
    finally:
        os.kill(pid, signal.SIGCONT)
    again = time.time()
    job.wait("the change the exit starts", lambda: job.status()["layout_epoch"] > epoch1)
    job.wait("host1's GPU 1 to run a process again",
             lambda: job.running("host1").get(1) not in (None, victim))
    status = job.status()
    say(f"   reported once the coordinator went on: layout epoch {status['layout_epoch']} "
        f"{time.time() - again:.1f} s later, a new process on host1's GPU 1")
    results["events"].append({
        "what": "a process killed while the coordinator was stopped",
        "layout_epoch_before": epoch1, "layout_epoch_after": status["layout_epoch"],
        "reason": status.get("reconfiguration", {}).get("reason", ""),
        "host0_kept": job.running("host0") == during})
    # Two changes: the processes load what they saved once it was back.
    pinned_changes(cluster, job, say)
    return before, during


def requests_and_a_kill(args, cluster, job, results, say):
    """Two changes asked in a row mid-step, then a third with a process
    killed while it is under way. Returns host0's processes at the start
    and after the first changes (host0's are never killed here)."""
    ask_at = args.iterations // 5
    job.wait(f"iteration {ask_at}", lambda: len(job.losses()) >= ask_at)
    before = job.running("host0")
    epoch0 = max(r["epoch"] for r in job.losses().values())
    answers = []
    for to in ("tp=1,pp=2,dp=2", "tp=1,pp=1,dp=4"):
        r = cluster.ptcctl_result("reconfigure", "--job", JOB, "--to", to, "--hosts",
                                  "host0,host1", "--after-save")
        answers.append({"to": to, "accepted": r.returncode == 0,
                        "answer": (r.stdout + r.stderr).strip().splitlines()[-1:]})
    say("\n== two changes asked in a row, mid-step: " + "; ".join(
        f"{a['to']} {'accepted' if a['accepted'] else 'refused'}" for a in answers))
    job.wait("the change", lambda: max(r["epoch"] for r in job.losses().values()) > epoch0
             and job.pending() == "")
    settled = max(job.losses().values(), key=lambda r: (r["epoch"], r["iteration"]))
    say(f"   the job runs {settled['config']} (layout epoch {settled['epoch']})")
    results["events"].append({"what": "two requests", "answers": answers,
                              "config": settled["config"]})
    during = job.running("host0")
    epoch1 = settled["epoch"]
    ask_at = max(job.losses()) + 3
    job.wait(f"iteration {ask_at}", lambda: max(job.losses()) >= ask_at)
    victim = job.running("host1")[1]
    cluster.ptcctl_result("reconfigure", "--job", JOB, "--to", "tp=2,pp=1,dp=2", "--hosts",
                          "host0,host1", "--after-save")
    time.sleep(0.05)
    os.kill(victim, signal.SIGKILL)
    say(f"\n== a third change asked, and the process on host1 GPU 1 (pid {victim}) killed "
        "while it is under way")
    job.wait("the job to go on", lambda: any(
        r["epoch"] > epoch1 for r in job.losses().values()) and job.running("host1").get(1)
        not in (None, victim) and job.pending() == "")
    last = max(job.losses().values(), key=lambda r: (r["epoch"], r["iteration"]))
    status = job.status()["reconfiguration"]
    say(f"   it goes on at {last['config']} (layout epoch {last['epoch']}; the last change: "
        f"{status['reason']}); host1's agent started pid {job.running('host1')[1]} for GPU 1")
    results["events"].append({"what": "process killed during a change",
                              "config": last["config"], "reason": status["reason"]})
    return before, during


# The hot scenario's last change, which rank 1 fails to start as a hot
# switch (PTC_TEST_HOT_REFUSE): the processes save, and it goes through
# the store.
REFUSED = "tp=2,pp=1,dp=1"
# The first: host1 GPU 1's process dies after it met its peers there.
TP_TARGET = "tp=1,pp=1,dp=4"


def hot_switches(args, cluster, job, results, say):
    """Hot switches (the processes move the state between themselves) for
    a tp, a pp and a dp change, each asked by pinning the config; a
    process is SIGKILLed after the tp change committed, right after it met
    its peers under the new layout (PTC_TEST_DIE_AFTER_MEETING, a test
    fault: the others wait for it in the groups' store), and during the pp
    change. Then a
    hot switch one process fails to start: with a save timeout longer
    than the wait, it ends only if the processes turn it into a change
    through the store at once."""
    at = args.iterations // 6
    job.wait(f"iteration {at}", lambda: len(job.losses()) >= at)
    before = during = job.running("host0")
    steps = (("tp", TP_TARGET, "met"), ("pp", "tp=1,pp=2,dp=2", "during"),
             ("dp", "tp=1,pp=2,dp=1", None), ("refused", REFUSED, None))
    for axis, to, kill in steps:
        epoch = max(r["epoch"] for r in job.losses().values())
        victim = job.running("host1").get(1) if kill else None
        plan_epoch = job.status()["reconfiguration"]["plan_epoch"]
        asked = time.time()
        # A hot switch waits for every process's next step boundary: on a
        # machine running two test suites a step can take a minute.
        cluster.ptcctl("auto", JOB, "on", "--live", "--hot", "--pin", to, "--save-timeout",
                       "900" if axis == "refused" else "180", capture=True)
        switched = None
        if kill == "during":
            time.sleep(0.3)
        elif kill == "met":  # PTC_TEST_DIE_AFTER_MEETING: it kills itself
            job.wait(f"the {axis} change to commit",
                     lambda: job.status()["layout_epoch"] > epoch, timeout=120)
            # The first change committed since it was asked, from the
            # job's recent changes: by now the kill may have started (or
            # ended) the next one, on a busy machine.
            status = job.status()
            switched = min((c for c in [status["reconfiguration"], *status["recent_changes"]]
                            if c["plan_epoch"] > plan_epoch and c["phase"] == "committed"),
                           key=lambda c: c["plan_epoch"])
        if kill == "during":
            os.kill(victim, signal.SIGKILL)
        say(f"\n== a {axis} change to {to} (hot switch)" +
            (f"; the process on host1 GPU 1 (pid {victim}) SIGKILLed "
             f"{'during it' if kill == 'during' else 'after it met its peers there'}"
             if kill else "")
            + ("; rank 1 fails to start it" if axis == "refused" else ""))
        job.wait(f"the {axis} change", lambda: any(
            r["epoch"] > epoch and r["config"] == to for r in job.losses().values())
            and job.pending() == "" and (not kill or job.running("host1").get(1)
                                         not in (None, victim)))
        status = job.status()["reconfiguration"]
        last = max(job.losses().values(), key=lambda r: (r["epoch"], r["iteration"]))
        say(f"   it goes on at {last['config']} (layout epoch {last['epoch']}); the last "
            f"change went through the {status['path'] or '?'} ({status['reason']})")
        event = {"what": f"{axis} change" + {None: "", "during": " with a kill",
                                             "met": " with a kill after it"}[kill],
                 "config": last["config"], "path": status["path"],
                 "reason": status["reason"], "seconds": round(time.time() - asked, 1)}
        if switched is not None:
            # The change itself, and the one the kill started after it.
            event.update(path=switched["path"], reason=switched["reason"],
                         recovery={"path": status["path"], "reason": status["reason"]})
        results["events"].append(event)
        if axis == "tp":
            during = job.running("host0")
        at = max(job.losses()) + 3
        job.wait(f"iteration {at}", lambda: max(job.losses()) >= at)
    return before, during


def reference(args, work):
    """The same job uninterrupted at FIRST: losses and samples per iteration."""
    ref = work / "reference"
    ref.mkdir(parents=True, exist_ok=True)
    ns = argparse.Namespace(bin=args.bin, script=HERE.parent / "elastic_gpt/train.py",
                            model=args.model, job_name=JOB, global_batch=args.global_batch,
                            script_args=[])
    elastic.run_phase(ns, None, ref, FIRST, elastic.world_size(FIRST), None,
                      ["--stop-at", str(args.iterations)])
    return elastic.losses(ref / "losses.jsonl"), elastic.samples(ref)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=("host", "requests", "hot", "stall", "outage"),
                    default="host")
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--save-every", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--step-seconds", type=float, default=0.05,
                    help="each step sleeps this long too (room for the changes)")
    ap.add_argument("--model", default=elastic.JOBS["gpt"]["model"])
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--bin", default=str(ROOT / "bazel-bin"))
    ap.add_argument("--work-dir")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.save_every < 1:
        ap.error("--save-every must be at least 1: a live job rolls back to its last save")
    args.bin = pathlib.Path(args.bin)
    say = (lambda *a: None) if args.json else print
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="ptc-live-"))
    work.mkdir(parents=True, exist_ok=True)

    say(f"== uninterrupted run at {FIRST} for {args.iterations} iterations (the reference)")
    ref_losses, ref_samples = reference(args, work)

    cluster = elastic.Cluster(args.bin, work, hosts=2, gpus=2)
    job = LiveJob(args, cluster, work)
    results = {"events": []}
    try:
        layout = work / "layout.json"
        subprocess.run([sys.executable, str(HERE.parent / "elastic_gpt/train.py"), "--config",
                        FIRST, "--model", args.model, "--layout-out", str(layout)], check=True,
                       env=dict(os.environ, PYTHONPATH=f"{args.bin}/client/python/pkg"))
        pin = ["--pin", FIRST] if args.scenario in ("stall", "outage") else []
        cluster.ptcctl("register", "--job", JOB, "--layout", str(layout), "--config", FIRST,
                       "--hosts", "host0,host1", "--auto", "on", "--live", *pin,
                       "--global-batch", str(args.global_batch), capture=True)
        say(f"\n== job {JOB} registered at {FIRST} on host0,host1 with automatic, live "
            "changes; an agent per host starts its processes")
        for h in ("host0", "host1"):
            job.start_agent(h)
        if args.scenario == "host":
            before, during = host_dies_and_returns(args, cluster, job, results, say)
        elif args.scenario == "hot":
            before, during = hot_switches(args, cluster, job, results, say)
        elif args.scenario == "stall":
            before, during = host_stalls(args, cluster, job, results, say)
        elif args.scenario == "outage":
            before, during = coordinator_out(args, cluster, job, results, say)
        else:
            before, during = requests_and_a_kill(args, cluster, job, results, say)
        job.wait(f"iteration {args.iterations}",
                 lambda: max(job.losses()) >= args.iterations)
        job.wait("the processes to finish", lambda: not job.running("host0") and
                 not job.running("host1"))
        if args.scenario == "hot":
            for p in read_jsonl(job.run / "processes.jsonl"):
                for c in p["changes"]:
                    if c.get("how", "").startswith("store (the hot switch"):
                        results["hot_refused"] = results.get("hot_refused", 0) + 1
                    if c.get("how") == "hot switch":
                        results.setdefault("hot_switches", []).append(
                            {k: c.get(k) for k in ("from", "to", "rank", "pause_seconds",
                                                   "hot_seconds", "bytes_sent",
                                                   "bytes_received")})
            # Processes that left their groups' store as the epoch ended
            # (they waited there for the peer that died after the meeting).
            results["formations_left"] = sum(
                f.read_text(errors="replace").count("ended while its processes formed")
                for f in (work / "logs").glob("*.log"))
    finally:
        job.stop()
        cluster.down()

    ok, checks = check(job, args, ref_losses, ref_samples, before, during, say)
    results.update(checks, ok=ok)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        what = {"host": "a host died and came back; the job changed twice by itself",
                "requests": "changes asked in a row and a process killed during one",
                "hot": "hot switches for a tp, a pp and a dp change, a process killed "
                       "after one committed and during another, one that a process "
                       "failed to start",
                "stall": "a host stalled as the job saved, with no change to follow: "
                         "the processes saved again and went on",
                "outage": "the coordinator stopped for longer than the processes' "
                          "patience: their saves were skipped, the job trained on, "
                          "and saved once it was back"}[args.scenario]
        print(f"\nPASS: {what}; host0's processes never restarted; every reload "
              "bit-identical, loss and samples as uninterrupted" if ok else
              f"\nFAIL (work dir {work})")
    if ok and not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def check(job, args, ref_losses, ref_samples, before, during, say):
    run = job.run
    procs = read_jsonl(run / "processes.jsonl")
    # 1. host0's processes: the same PIDs before the death, after it, at the end.
    host0_pids = sorted(before.values())
    kept = sorted(during.values()) == host0_pids and all(
        p["pid"] in host0_pids for p in procs if p["host"] == "host0")
    changes = {p["pid"]: len(p["changes"]) for p in procs if p["host"] == "host0"}
    say(f"   check 1, host0's processes: PIDs {host0_pids} before, {sorted(during.values())} "
        f"after the first change, changes followed {changes} -> "
        f"{'never restarted' if kept else 'RESTARTED'}")
    # 2. Every load bit-identical to its save.
    loads = read_jsonl(run / "checks.jsonl")
    bad = sum(c["mismatched"] for c in loads)
    epochs = sorted({c["layout_epoch"] for c in loads})
    identical = bad == 0 and len(epochs) >= 2 and all(c["files"] > 0 for c in loads)
    say(f"   check 2, state after every reload: {len(loads)} loads under layout epochs "
        f"{epochs}, {sum(c['elements'] for c in loads)} elements, {bad} differ -> "
        f"{'bit-identical' if identical else 'MISMATCH'}")
    # 3. Loss of every iteration as in the uninterrupted run.
    got = job.losses()
    its = [it for it in range(1, args.iterations + 1)]
    missing = [it for it in its if it not in got]
    worst = max((abs(got[it]["loss"] - ref_losses[it]) / max(1.0, abs(ref_losses[it]))
                 for it in its if it in got), default=float("inf"))
    loss_ok = not missing and worst <= args.tolerance
    say(f"   check 3, loss: iterations 1..{args.iterations}, largest relative difference to "
        f"the uninterrupted run {worst:.1e} (tolerance {args.tolerance:g})"
        f"{f', missing {missing[:5]}' if missing else ''} -> {'ok' if loss_ok else 'WRONG'}")
    # 4. Samples: each iteration's, the last time it ran, as uninterrupted.
    per_it = {}
    for r in read_jsonl(run / "samples.jsonl"):
        per_it.setdefault(r["iteration"], {}).setdefault(r["epoch"], []).extend(r["ids"])
    seen = {it: sorted(by_epoch[max(by_epoch)]) for it, by_epoch in per_it.items()}
    every = [s for it in range(args.iterations) for s in seen.get(it, [])]
    same = all(seen.get(it) == ref_samples.get(it) for it in range(args.iterations))
    once = len(every) == len(set(every)) == args.iterations * args.global_batch
    say(f"   check 4, samples: {len(every)} consumed in iterations 1..{args.iterations}, "
        f"{len(set(every))} distinct, same as the uninterrupted run: "
        f"{'yes' if same else 'NO'} -> {'exactly once' if once and same else 'WRONG'}")
    pauses = [c["pause_seconds"] for p in procs for c in p["changes"]]
    return kept and identical and loss_ok and once and same, {
        "host0_pids": host0_pids, "host0_kept": kept, "loads_checked": len(loads),
        "elements_differing": bad, "bit_identical": identical,
        "max_relative_loss_difference": worst, "loss_ok": loss_ok,
        "samples_exactly_once": once and same,
        "process_pauses_seconds": sorted(pauses)}


if __name__ == "__main__":
    sys.exit(main())
