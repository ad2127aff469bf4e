"""The control plane outlives its coordinators: real etcd members (3, mutual
TLS) and two coordinators on loopback, ptcds and clients given both
coordinators' addresses (ha_cluster.py)."""
import json
import os
import random
import shutil
import subprocess
import time

import pytest

from cluster import ROOT, tls_flags
from ha_cluster import Etcd, HaCluster, Supervised, coordinator_command

MODEL = "gpt:layers=2,hidden=64,heads=4,ffn=128,vocab=256,positions=16,pad=8"

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None,
                                reason="etcd is not installed (tools/setup.sh installs it)")


@pytest.fixture
def ha(bin_dir, tmp_path):
    c = HaCluster(bin_dir, tmp_path)
    yield c
    c.stop()


def committed(ha, job):
    return ha.job(job)["committed_version"]


def test_a_standby_takes_over_with_every_committed_byte(ha):
    ha.ptcctl("register", "--job", "j", "--model", MODEL, "--config", "tp=2", "--hosts",
              "host0", check=True)
    ha.save("j", "host0", 1)
    v = committed(ha, "j")
    leader = ha.leader()
    ha.coordinators[leader].kill()
    took = ha.wait_serving()
    print(f"a coordinator served {took:.2f} s after the leader was killed (lease {ha.lease} s)")
    # The lease runs out, a standby polls every 0.2 s, loads the state and
    # listens; generous for a loaded machine.
    assert took < ha.lease + 10
    # The standby, or the killed one started again (its supervisor), leads.
    new = ha.leader()
    assert committed(ha, "j") == v
    r = ha.job_tool("verify", "--job", "j")
    assert r.returncode == 0, r.stdout + r.stderr
    # The new leader changes the job; the killed one is back, one of the
    # two stands by.
    r = ha.ptcctl("reconfigure", "--job", "j", "--to", "tp=1,dp=2", "--hosts", "host0,host1")
    assert r.returncode == 0, r.stdout + r.stderr
    r = ha.job_tool("verify", "--job", "j")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ha.coordinators[leader].starts == 2
    assert ha.leader() == new
    standby = 1 - new
    log = (ha.dir / f"coordinator{standby}.log").read_text()
    assert f"standing by: the coordinator at {ha.addresses[new]} leads" in log
    # The standby listens: a caller given its address alone is told who
    # leads; one given every address, the standby's first, reaches the
    # leader (the channel asks each one's health service).
    ptcctl = str(ha.bin / "tools/ptcctl")
    r = subprocess.run([ptcctl, "jobs", "--coordinator", ha.addresses[standby]],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout
    assert f"stands by: the coordinator at {ha.addresses[new]} leads" in r.stderr, r.stderr
    r = subprocess.run([ptcctl, "jobs", "--json", "--coordinator",
                        f"{ha.addresses[standby]},{ha.addresses[new]}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "j" in [j["job"] for j in json.loads(r.stdout)["jobs"]], \
        r.stdout + r.stderr


def test_the_leader_killed_at_random_moments_loses_nothing(ha):
    """Saves and changes with the leader killed at a random moment of each
    (seed printed; PTC_HA_TRIALS trials, 4 by default): every job ends at
    its version before or the one after, its bytes exact, and the next
    operation works."""
    seed = int(os.environ.get("PTC_HA_SEED", random.randrange(1 << 30)))
    trials = int(os.environ.get("PTC_HA_TRIALS", "4"))
    print(f"seed {seed}, {trials} trials")
    rng = random.Random(seed)
    ha.ptcctl("register", "--job", "r", "--model", MODEL, "--config", "tp=2", "--hosts",
              "host0", check=True)
    ha.save("r", "host0", 1)
    layouts = [("tp=2,pp=1,dp=1", "host0"), ("tp=1,pp=1,dp=2", "host0,host1"),
               ("tp=2,pp=1,dp=1", "host1")]
    where = 0
    step = 1
    outcomes = []
    for trial in range(trials):
        before = committed(ha, "r")
        job = ha.job("r")
        if rng.random() < 0.5:
            step += 1
            hosts = sorted(set(job["rank_hosts"]))
            what = f"save of step {step}"
            procs = [subprocess.Popen(
                [str(ha.bin / "tools/synthetic_job"), "save", "--job", "r", "--host", h,
                 "--socket", str(ha.dir / f"{h}.sock"), "--step", str(step),
                 "--coordinator", ha.coordinator],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for h in hosts]
        else:
            where = (where + 1) % len(layouts)
            config, hosts = layouts[where]
            what = f"change to {config} on {hosts}"
            procs = [ha.ptcctl_async("reconfigure", "--job", "r", "--to", config, "--hosts",
                                     hosts)]
        delay = rng.uniform(0, 0.4)
        time.sleep(delay)
        leader = ha.leader()
        ha.coordinators[leader].kill()
        t_kill = time.monotonic()
        for p in procs:
            try:
                p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
        ha.wait_serving()
        served = time.monotonic() - t_kill
        # The new leader settles what was in flight (finishes a decided
        # commit, aborts the rest); wait for that, then check.
        deadline = time.time() + 60
        while True:
            job = ha.job("r")
            phase = job.get("reconfiguration", {}).get("phase", "none")
            if phase not in ("staging", "verifying", "committing"):
                break
            assert time.time() < deadline, f"the change is still {phase}"
            time.sleep(0.1)
        after = committed(ha, "r")
        outcomes.append(f"{what}, leader killed after {delay:.2f} s: v{before} -> v{after}, "
                        f"a coordinator served {served:.1f} s after the kill")
        # At v, or at the version the interrupted operation made (version
        # numbers of aborted attempts are never reused, so "v+1" is the
        # operation's own version, not the number after v).
        assert after >= before, outcomes
        if after != before:
            if what.startswith("save"):
                assert job["committed_step"] == step, (outcomes, job)
            else:
                assert job["config"] == config and \
                    set(job["rank_hosts"]) <= set(hosts.split(",")), (outcomes, job)
        r = ha.job_tool("verify", "--job", "r")
        assert r.returncode == 0, "\n".join(outcomes) + "\n" + r.stdout + r.stderr
    print("\n".join(outcomes))
    # Nothing half-done is left: a change and a save go through.
    r = ha.ptcctl("reconfigure", "--job", "r", "--to", "tp=1", "--hosts", "host1")
    assert r.returncode == 0, r.stdout + r.stderr
    ha.save("r", "host1", step + 1)
    r = ha.job_tool("verify", "--job", "r")
    assert r.returncode == 0, r.stdout + r.stderr


def test_one_etcd_member_lost_changes_nothing_and_the_majority_lost_stops_commits(
        bin_dir, tmp_path):
    # A 10 s lease, renewed within 8 s: losing etcd's leader costs an
    # election, which a busy machine (a CI run beside a full optimized
    # build) stretched past the 4 s in which a 5 s lease must be renewed
    # (the coordinator then stops, as it must, and a standby takes over:
    # not "nothing changes").
    ha = HaCluster(bin_dir, tmp_path, lease=10)
    try:
        ha.ptcctl("register", "--job", "m", "--model", MODEL, "--config", "tp=2", "--hosts",
                  "host0", check=True)
        ha.save("m", "host0", 1)
        ha.etcd.kill(0)
        r = ha.ptcctl("reconfigure", "--job", "m", "--to", "tp=1,dp=2", "--hosts", "host0,host1")
        assert r.returncode == 0, r.stdout + r.stderr
        ha.save("m", "host0", 2)
        v = committed(ha, "m")

        # The majority gone: no coordinator commits anything. The leader
        # cannot renew its lease and stops; nobody can take over.
        ha.etcd.kill(1)
        r = ha.ptcctl("register", "--job", "n", "--model", MODEL, "--config", "tp=1", "--hosts",
                      "host1")
        assert r.returncode != 0
        deadline = time.time() + 60
        while ha.ptcctl("jobs", "--json").returncode == 0:
            assert time.time() < deadline, "a coordinator still serves without etcd's majority"
            time.sleep(0.2)
        # The ptcds keep the committed version meanwhile (what the job's
        # processes would load).
        versions = ha.store_versions("host0", "m")
        assert (v, True) in versions, versions

        ha.etcd.start(0)
        ha.etcd.start(1)
        ha.wait_serving(timeout=90)
        assert committed(ha, "m") == v
        r = ha.job_tool("verify", "--job", "m")
        assert r.returncode == 0, r.stdout + r.stderr
        # The registration that failed may still have been written (etcd
        # commits a proposal it took before the majority went away once it
        # returns; the caller was told the outcome is unknown): either way the
        # job is whole, or absent and registers now.
        if "n" not in [j["job"] for j in ha.ptcctl_json("jobs")[1]["jobs"]]:
            ha.ptcctl("register", "--job", "n", "--model", MODEL, "--config", "tp=1", "--hosts",
                      "host1", check=True)
        ha.save("n", "host1", 1)
        r = ha.job_tool("verify", "--job", "n")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        ha.stop()


def etcd_members(ha):
    """(member id in hex, client address, whether it is etcd's raft leader)
    of each member, in the order of ha.etcd.endpoints."""
    r = ha.etcd.ctl("endpoint", "status", "--write-out=json")
    assert r.returncode == 0, r.stderr
    out = []
    for e in json.loads(r.stdout):
        member, leader = e["Status"]["header"]["member_id"], e["Status"]["leader"]
        out.append((f"{member:x}", e["Endpoint"], member == leader))
    return out


def test_a_frozen_etcd_member_is_left_for_another_and_the_leader_keeps_leading(ha):
    # A member whose process is frozen (stopped, swapping, a hung disk)
    # still accepts connections; a coordinator that keeps sending it calls
    # would lose its lease, and so would every standby after it. Each call
    # that it leaves unanswered goes to the next member instead.
    ha.ptcctl("register", "--job", "f", "--model", MODEL, "--config", "tp=2", "--hosts",
              "host0", check=True)
    ha.save("f", "host0", 1)
    leader = ha.leader()
    starts = [c.starts for c in ha.coordinators]
    # The member the leader sends its calls to: the first, or the last one
    # it moved to (at start, members may not have listened yet).
    endpoints = ha.etcd.endpoints.split(",")
    log_path = ha.dir / f"coordinator{leader}.log"
    used = endpoints[0]
    for line in log_path.read_text().splitlines():
        if "did not answer" in line:
            used = line.rsplit("using ", 1)[1].strip()
    frozen = endpoints.index(used)
    # Not etcd's own raft leader, so that etcd itself goes on without an
    # election (what this test is not about).
    members = etcd_members(ha)
    if members[frozen][2]:
        other = members[(frozen + 1) % len(members)][0]
        r = subprocess.run(
            ["etcdctl", "--endpoints", used, "--cacert", str(ha.etcd.certs / "ca.pem"),
             "--cert", str(ha.etcd.certs / "etcd-client-coordinator.pem"),
             "--key", str(ha.etcd.certs / "etcd-client-coordinator.key"),
             "move-leader", other],
            capture_output=True, text=True, timeout=30, env={**os.environ, "ETCDCTL_API": "3"})
        assert r.returncode == 0, r.stdout + r.stderr
    ha.etcd.pause(frozen)
    try:
        # Longer than the lease: the leader renews it through another member.
        time.sleep(2 * ha.lease)
        r = ha.ptcctl("reconfigure", "--job", "f", "--to", "tp=1,dp=2", "--hosts",
                      "host0,host1")
        assert r.returncode == 0, r.stdout + r.stderr
        ha.save("f", "host0", 2)
        v = committed(ha, "f")
        r = ha.job_tool("verify", "--job", "f")
        assert r.returncode == 0, r.stdout + r.stderr
        assert [c.starts for c in ha.coordinators] == starts
        log = log_path.read_text()
        assert "lost the lead" not in log, log
        assert f"etcd member {used} did not answer" in log, log
    finally:
        ha.etcd.resume(frozen)
    assert ha.leader() == leader and committed(ha, "f") == v


def log_times(path, text):
    """The times (seconds of the day) of the log lines of `path` that hold
    `text` (spdlog's "[YYYY-MM-DD HH:MM:SS.mmm]" prefix)."""
    times = []
    if not path.exists():
        return times
    for line in path.read_text().splitlines():
        if text in line:
            h, m, sec = line[12:24].split(":")
            times.append(int(h) * 3600 + int(m) * 60 + float(sec))
    return times


def test_a_leader_cut_off_from_etcd_stops_before_a_standby_takes_over(bin_dir, tmp_path,
                                                                      network_namespaces):
    """Coordinator A in a network namespace leads; B (root namespace) stands
    by. A's route to etcd is blackholed (A still reaches and is reached by
    everyone else): A cannot commit a registration sent to it, and stops
    (its lease unrenewed) before B leads; B commits it."""
    net, bridge, made = network_namespaces(["ca"])
    ns_a, ip_a, _ = made[0]
    etcd_ip = f"{net}.2"
    subprocess.run(["ip", "addr", "add", f"{etcd_ip}/24", "dev", bridge], check=True)
    etcd = Etcd(tmp_path, host=etcd_ip, also=[f"{net}.1"])
    a_address, b_address = f"{ip_a}:7000", f"{net}.1:7000"
    lease = 3
    coordinators = [
        Supervised(["ip", "netns", "exec", ns_a,
                    *coordinator_command(bin_dir, etcd, a_address, lease)],
                   tmp_path / "a.log"),
    ]
    ptcd = None
    both = f"{a_address},{b_address}"

    def ptcctl(*args):
        return subprocess.run([str(bin_dir / "tools/ptcctl"), *args, "--coordinator", both],
                              capture_output=True, text=True, timeout=120)

    def leader():
        return etcd.ctl("get", "/ptc/leader", "--print-value-only").stdout.strip()

    try:
        deadline = time.time() + 60
        while leader() != a_address:
            assert time.time() < deadline, (tmp_path / "a.log").read_text()
            time.sleep(0.1)
        coordinators.append(Supervised(coordinator_command(bin_dir, etcd, b_address, lease),
                                       tmp_path / "b.log"))
        while not log_times(tmp_path / "b.log", f"the coordinator at {a_address} leads"):
            assert time.time() < deadline, (tmp_path / "b.log").read_text()
            time.sleep(0.1)
        ptcd = subprocess.Popen(
            [str(bin_dir / "ptcd/ptcd"), "--listen", "127.0.0.1:0", "--socket",
             str(tmp_path / "host0.sock"), "--memory-limit", "1GiB", "--coordinator", both,
             "--name", "host0", "--gpus", "4", *tls_flags("host0")],
            stdout=open(tmp_path / "host0.log", "w"), stderr=subprocess.STDOUT)
        while '"alive": true' not in ptcctl("hosts", "--json").stdout:
            assert time.time() < deadline, (tmp_path / "host0.log").read_text()
            time.sleep(0.1)
        r = ptcctl("register", "--job", "before", "--model", MODEL, "--config", "tp=2",
                   "--hosts", "host0")
        assert r.returncode == 0, r.stdout + r.stderr

        subprocess.run(["ip", "-n", ns_a, "route", "add", "blackhole", f"{etcd_ip}/32"],
                       check=True)
        r = ptcctl("register", "--job", "during", "--model", MODEL, "--config", "tp=2",
                   "--hosts", "host0")
        assert r.returncode != 0, r.stdout
        deadline = time.time() + 60
        while not log_times(tmp_path / "b.log", "leading: holds /ptc/leader"):
            assert time.time() < deadline, (tmp_path / "b.log").read_text()
            time.sleep(0.1)
        lost = log_times(tmp_path / "a.log", "lost the lead")
        took = log_times(tmp_path / "b.log", "leading: holds /ptc/leader")
        assert lost and lost[0] < took[0], (lost, took)
        assert leader() == b_address

        # B serves, holds what A committed and not what it could not, and
        # commits.
        deadline = time.time() + 60
        while True:
            r = ptcctl("jobs", "--json")
            if r.returncode == 0:
                break
            assert time.time() < deadline, r.stderr
            time.sleep(0.1)
        jobs = [j["job"] for j in json.loads(r.stdout)["jobs"]]
        assert jobs == ["before"], jobs
        r = ptcctl("register", "--job", "during", "--model", MODEL, "--config", "tp=2",
                   "--hosts", "host0")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        for c in coordinators:
            c.stop()
        if ptcd is not None:
            ptcd.terminate()
            ptcd.wait(timeout=15)
        etcd.stop()


def test_the_local_cluster_script_runs_the_ha_shape(bin_dir, tmp_path):
    """tools/local_cluster.sh up DIR --ha: three etcd members and two
    coordinators; kill-leader, and a standby serves; down stops all."""
    script = str(ROOT / "tools/local_cluster.sh")
    d = tmp_path / "cluster"
    env = {**os.environ, "BIN": str(bin_dir)}
    r = subprocess.run([script, "up", str(d), "--ha", "2", "2", "1GiB"], capture_output=True,
                       text=True, timeout=180, env=env, stdin=subprocess.DEVNULL)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        settings = dict(line.split("=", 1) for line in (d / "env").read_text().splitlines())
        coordinator = settings["COORDINATOR"]
        assert coordinator.count(",") == 1, coordinator
        tls = {k: settings[k] for k in ("PTC_TLS_CA", "PTC_TLS_CERT", "PTC_TLS_KEY")}

        def hosts():
            return subprocess.run([str(bin_dir / "tools/ptcctl"), "hosts", "--json"],
                                  capture_output=True, text=True, timeout=60,
                                  env={**os.environ, **tls, "PTC_COORDINATOR": coordinator})

        first = hosts()
        assert first.returncode == 0 and first.stdout.count('"alive": true') == 2, first
        r = subprocess.run([script, "kill-leader", str(d)], capture_output=True, text=True,
                           timeout=60, env=env)
        assert r.returncode == 0 and "killed the leader" in r.stdout, r.stdout + r.stderr
        deadline = time.time() + 60
        while hosts().returncode != 0:
            assert time.time() < deadline, "no coordinator served after the leader was killed"
            time.sleep(0.2)
    finally:
        pids = [int(line.split()[1]) for line in (d / "pids").read_text().splitlines()] \
            if (d / "pids").exists() else []
        pids += [int(p.read_text()) for p in d.glob("coordinator*.pid")]
        subprocess.run([script, "down", str(d)], capture_output=True, timeout=120, env=env)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().split()[2] == "Z", f"process {pid} still runs"
