"""The consistency rules as a model, tested at random on a real local
cluster: random sequences of saves (whole, partial, stale), changes,
aborts, ptcd kills, stops and resumes, and coordinator restarts. After
every step the invariant holds:
  - the coordinator and every live host agree on the committed version
    (no host holds another committed version of the job);
  - if every host of its placement is alive and holds its share, the
    committed version reads back exactly (index-encoded values);
  - nothing uncommitted is left that nothing owns (open saves only);
  - the job can be changed again whenever a copy of every region lives.

    PTC_MODEL_SEED=123 PTC_MODEL_STEPS=400 /usr/bin/python3 -m pytest \\
        tests/python/test_invariant_model.py -s

replays one seed for longer (CI runs a short sequence on a random seed,
printed first); docs/consistency.md records the long runs.
"""
import os
import random
import shutil
import signal
import time

import pytest

from cluster import LocalCluster
from ha_cluster import HaCluster

MODEL = "gpt:layers=2,hidden=64,heads=4,ffn=128,vocab=256,positions=32"
HOSTS = [f"host{i}" for i in range(4)]
# (config, number of hosts it needs at 2 GPUs per host)
CONFIGS = [("tp=2,dp=2", 2), ("tp=1,dp=4", 2), ("tp=2,dp=1", 1), ("tp=1,pp=2,dp=2", 2),
           ("tp=2,dp=4", 4), ("tp=1,dp=2", 1)]


class Model:
    def __init__(self, c, rng, log):
        self.c, self.rng, self.log = c, rng, log
        self.step = 0
        self.stopped = set()
        self.outcomes = {}

    def live(self):
        return [h for h in HOSTS if self.c.procs[h].poll() is None and h not in self.stopped]

    def count(self, what):
        self.outcomes[what] = self.outcomes.get(what, 0) + 1

    def fresh_job(self):
        """(Re)starts the job on live hosts with a committed first save."""
        self.c.ptcctl("forget", "j")
        live = [h for h in self.live() if self.c.hosts()[h]["alive"]]
        config, n = self.rng.choice([x for x in CONFIGS if x[1] <= len(live)])
        hosts = self.rng.sample(live, n)
        self.c.ptcctl("register", "--job", "j", "--model", MODEL, "--config", config,
                      "--hosts", ",".join(hosts), check=True)
        self.save_all()
        assert self.c.job("j")["committed_version"] > 0
        self.count("job registered")

    def placement(self):
        return sorted(set(self.c.job("j")["rank_hosts"]))

    def save_all(self, only=None, stale=False, perturb=False):
        self.step += 1
        job = self.c.job("j")
        extra = ["--layout-epoch", str(job["layout_epoch"] - 1)] if stale else []
        hosts = self.placement() if only is None else only
        results = []
        for i, h in enumerate(hosts):
            more = ["--perturb"] if perturb and i == len(hosts) - 1 else []
            results.append(self.c.save("j", h, self.step, *extra, *more, check=False))
        return results

    # The actions.
    def act_save(self):
        before = self.c.job("j")["committed_version"]
        res = self.save_all()
        job = self.c.job("j")
        unhealthy = set(self.placement()) - set(self.live()) or job["lost_hosts"]
        if all(r.returncode == 0 for r in res):
            assert job["committed_version"] > before, (res, job)
            self.count("save committed")
        else:
            assert unhealthy, [r.stderr for r in res]  # only a missing host fails it
            assert job["committed_version"] == before
            self.count("save refused (a host of the placement is gone)")

    def act_partial_save(self):
        hosts = self.placement()
        if len(hosts) > 1:
            self.save_all(only=hosts[:1])
            self.count("partial save")

    def act_stale_save(self):
        if self.c.job("j")["layout_epoch"] > 1:
            res = self.save_all(stale=True)
            assert all(r.returncode != 0 and "stale" in r.stderr for r in res), \
                [r.stderr for r in res]
            self.count("stale save refused")

    def act_diverged_save(self):
        if len(self.placement()) > 1 and not set(self.placement()) - set(self.live()):
            before = self.c.job("j")["committed_version"]
            res = self.save_all(perturb=True)
            if "disagree" in res[-1].stderr:
                self.count("diverged replicas refused")
            assert self.c.job("j")["committed_version"] == before

    def act_change(self, abort=False):
        alive = [h for h in self.live() if self.c.hosts()[h]["alive"]]
        options = [x for x in CONFIGS if x[1] <= len(alive)]
        config, n = self.rng.choice(options)
        hosts = self.rng.sample(alive, n)
        before = self.c.job("j")
        p = self.c.ptcctl_async("reconfigure", "--job", "j", "--to", config,
                                "--hosts", ",".join(hosts), "--json")
        if abort:
            time.sleep(self.rng.random() * 0.3)
            self.c.ptcctl("abort", "j")
        out, err = p.communicate(timeout=120)
        job = self.c.job("j")
        if p.returncode == 0:
            assert job["committed_version"] > before["committed_version"]
            assert job["config"].startswith(config.split(",")[0])
            self.count("change committed")
        else:
            # Refused or aborted: the committed version stays, and the
            # reason is one a person can act on.
            assert job["committed_version"] == before["committed_version"], (out, err)
            reason = out + err
            known = ("no surviving copy", "aborted by request", "went silent",
                     "is dead", "does not divide", "GPUs", "being reconfigured")
            assert abort or any(k in reason for k in known), reason
            self.count("change aborted" if abort else "change refused or aborted")
            if "no surviving copy" in reason:
                self.fresh_job()

    def act_kill_ptcd(self):
        h = self.rng.choice(HOSTS)
        if self.c.procs[h].poll() is None:
            self.resume(h)
            self.c.kill(h)
            self.c.restart_ptcd(HOSTS.index(h))
            self.count("ptcd killed and restarted")

    def act_stop_resume(self):
        h = self.rng.choice(self.live())
        self.c.stop_process(h)
        self.stopped.add(h)
        if self.rng.random() < 0.5:
            self.act_change()  # a change while it is silent
        time.sleep(self.rng.random() * (self.c.host_timeout + 1))
        self.resume(h)
        self.count("ptcd stopped and resumed")

    def resume(self, h):
        if h in self.stopped:
            self.c.resume_process(h)
            self.stopped.discard(h)

    def act_restart_coordinator(self):
        self.c.restart_coordinator()
        self.count("coordinator restarted")

    # The invariant.
    def check(self):
        c = self.c
        deadline = time.time() + 15
        while True:
            job = c.job("j")
            phase = job.get("reconfiguration", {}).get("phase", "")
            problems = []
            if phase not in ("none", "committed", "aborted"):
                problems.append(f"change still in phase {phase}")
            owned = set(job.get("open_saves", []))
            for h in self.live():
                if not c.hosts().get(h, {}).get("alive"):
                    continue
                for v, committed in c.store_versions(h, "j"):
                    if committed and v != job["committed_version"]:
                        problems.append(f"{h} holds committed version {v}, coordinator "
                                        f"{job['committed_version']}")
                    if not committed and v not in owned:
                        problems.append(f"{h} holds uncommitted version {v} nothing owns")
            healthy = (set(self.placement()) <= set(self.live()) and not job["lost_hosts"]
                       and all(c.hosts()[h]["alive"] for h in self.placement()))
            if healthy:
                v = c.job_tool("verify", "--job", "j")
                if v.returncode != 0:
                    problems.append(f"committed version does not read back: {v.stderr}")
            if not problems:
                return
            if time.time() > deadline:
                raise AssertionError(f"invariant violated: {problems}; job {job}")
            time.sleep(0.3)


@pytest.mark.parametrize("backend", ["state-dir", "etcd"])
def test_random_interleavings_keep_the_invariant(bin_dir, tmp_path, backend):
    """The same model on either control store: one coordinator with its
    state directory (a restart: kill -9 and start again), or two over a
    3-member etcd (a restart: the leader killed, a standby takes over)."""
    if backend == "etcd" and shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (tools/setup.sh installs it)")
    seed = int(os.environ.get("PTC_MODEL_SEED", random.SystemRandom().randrange(1 << 30)))
    steps = int(os.environ.get("PTC_MODEL_STEPS", "25"))
    print(f"\ninvariant model ({backend}): seed {seed}, {steps} steps "
          f"(replay: PTC_MODEL_SEED={seed} PTC_MODEL_STEPS={steps})")
    rng = random.Random(seed)
    if backend == "etcd":
        c = HaCluster(bin_dir, tmp_path, hosts=len(HOSTS), gpus=2, memory="1GiB")
    else:
        c = LocalCluster(bin_dir, tmp_path, hosts=len(HOSTS), gpus=2, memory="1GiB")
    m = Model(c, rng, print)
    try:
        m.fresh_job()
        actions = [(m.act_save, 5), (m.act_partial_save, 2), (m.act_stale_save, 2),
                   (m.act_diverged_save, 1), (m.act_change, 5),
                   (lambda: m.act_change(abort=True), 2), (m.act_kill_ptcd, 1),
                   (m.act_stop_resume, 1), (m.act_restart_coordinator, 1)]
        fns, weights = zip(*actions)
        for i in range(steps):
            act = rng.choices(fns, weights)[0]
            try:
                act()
                m.check()
            except Exception as e:
                raise AssertionError(f"seed {seed}, step {i} "
                                     f"({getattr(act, '__name__', 'abort')}): {e}") from e
        print("outcomes:", dict(sorted(m.outcomes.items())))
    finally:
        for h in list(m.stopped):
            c.procs[h].send_signal(signal.SIGCONT)
        c.stop()
