"""Reconfiguration with the real binaries as separate processes: the whole
flow, clear errors that change nothing, a ptcd SIGKILLed in the middle of
a transfer, and a coordinator SIGKILLed and restarted in the middle of a
plan."""
import json
import random
import re
import subprocess
import time

import pytest

from cluster import LocalCluster

MODEL = "gpt:layers=4,hidden=512,heads=8,ffn=2048,vocab=8192,positions=512"


@pytest.fixture
def cluster(bin_dir, tmp_path):
    c = LocalCluster(bin_dir, tmp_path)
    yield c
    c.stop()


def start_job(c, config="tp=2,pp=1,dp=2", hosts=("host0", "host1")):
    c.ptcctl("register", "--job", "j", "--model", MODEL, "--config", config,
             "--hosts", ",".join(hosts), check=True)
    for h in hosts:
        c.save("j", h, 1)
    assert c.job("j")["committed_version"] == 1


def test_reconfigure_commits_and_every_element_is_exact(cluster):
    start_job(cluster)
    code, report = cluster.ptcctl_json("reconfigure", "--job", "j", "--to", "tp=1,pp=2,dp=2",
                                       "--hosts", "host1,host2,host3")
    assert code == 0, report
    assert report["phase"] == "committed"
    assert report["tensors_verified"] > 0
    assert report["bytes_from_peers"] == report["plan"]["cross_host_bytes"]
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stderr
    assert "every element exact" in v.stdout
    # Every host holds only the committed version 2 (or nothing).
    for h in ("host0", "host1", "host2", "host3"):
        assert cluster.store_versions(h, "j") in ([], [(2, True)])


def test_bad_requests_get_clear_errors_and_change_nothing(cluster):
    start_job(cluster)
    r = cluster.ptcctl("reconfigure", "--job", "nojob", "--to", "tp=2")
    assert r.returncode == 1 and "job 'nojob' is unknown" in r.stderr
    r = cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=2,dp=4", "--hosts", "host0")
    assert r.returncode == 1 and "needs 8 GPUs" in r.stderr
    r = cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=3", "--hosts", "host0,host1")
    assert r.returncode == 1 and "does not divide" in r.stderr
    r = cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=2", "--hosts", "host9")
    assert r.returncode == 1 and "host 'host9' is not registered" in r.stderr
    assert cluster.job("j")["committed_version"] == 1
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stderr


def test_a_change_before_the_first_save_names_the_flag_that_waits_for_it(cluster):
    cluster.ptcctl("register", "--job", "j", "--model", MODEL, "--config", "tp=2",
                   "--hosts", "host0", check=True)
    r = cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=1")
    assert r.returncode == 1 and "has no committed state yet" in r.stderr, r.stderr
    assert "--after-save" in r.stderr, r.stderr


def test_ptcctl_help_lists_every_command(bin_dir):
    """Every command the cluster commands' usage shows is in the top-level
    help."""
    top = subprocess.run([str(bin_dir / "tools/ptcctl"), "--help"], capture_output=True,
                         text=True).stdout
    usage = subprocess.run([str(bin_dir / "tools/ptcctl"), "jobs", "--help"],
                           capture_output=True, text=True).stdout
    commands = set(re.findall(r"^  ptcctl ([a-z]+)", usage, flags=re.M))
    assert {"ranks", "snapshot", "restore", "export", "advise", "auto"} <= commands, usage
    listed = set(re.findall(r"^  ([a-z]+)", top, flags=re.M))
    assert commands <= listed, f"ptcctl --help lacks {sorted(commands - listed)}"


def test_a_region_with_no_surviving_copy_is_refused(cluster):
    # pp=2 without replicas: stage 1 lives only on host1.
    start_job(cluster, config="tp=2,pp=2,dp=1", hosts=("host0", "host1"))
    cluster.kill("host1")
    cluster.wait_dead("host1")
    r = cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=2,pp=2,dp=1",
                       "--hosts", "host2,host3")
    assert r.returncode == 1
    assert "no surviving copy" in r.stderr and "host1" in r.stderr
    assert cluster.job("j")["committed_version"] == 1


def test_a_stages_replicas_are_spread_so_either_host_can_die(bin_dir, tmp_path):
    # tp=1,pp=2,dp=2 on two hosts of 2 GPUs: placed in rank order, each
    # host would hold both replicas of one stage, and either host's death
    # would lose a stage. Each host holds a whole replica instead.
    c = LocalCluster(bin_dir, tmp_path, hosts=3, domains=["rack1", "rack1", "rack2"])
    try:
        start_job(c, config="tp=1,pp=2,dp=2", hosts=("host0", "host1"))
        code, jobs = c.ptcctl_json("jobs")
        assert code == 0
        job = jobs["jobs"][0]
        assert job["survives_host_loss"], job
        # Both hosts are in rack1: its loss loses everything, and ptcctl
        # says so before it happens.
        assert job["survival"].startswith(
            "survives the loss of any one host; of domain rack1 (tensor '"), job["survival"]
        text = c.ptcctl("jobs").stdout
        assert "survives the loss of any one host" in text, text
        c.kill("host0")
        c.wait_dead("host0")
        code, report = c.ptcctl_json("reconfigure", "--job", "j", "--to", "tp=1,pp=2,dp=1",
                                     "--hosts", "host1,host2")
        assert code == 0, report
        v = c.job_tool("verify", "--job", "j")
        assert v.returncode == 0, v.stdout + v.stderr
    finally:
        c.stop()


def test_a_whole_rack_can_die_and_the_job_recovers_from_the_other_racks_memory(
        bin_dir, tmp_path):
    # Four hosts of one GPU in two racks: each rack gets a whole replica
    # of tp=1,pp=2,dp=2 (not both copies of a stage), so losing either
    # rack loses no region.
    c = LocalCluster(bin_dir, tmp_path, hosts=4, gpus=1,
                     domains=["rack1", "rack1", "rack2", "rack2"])
    try:
        start_job(c, config="tp=1,pp=2,dp=2", hosts=("host0", "host1", "host2", "host3"))
        job = c.ptcctl_json("jobs")[1]["jobs"][0]
        assert job["survival"] == ("survives the loss of any one host; survives the loss of "
                                   "any one domain (rack1, rack2)"), job
        lost, kept = (("host0", "host1"), ("host2", "host3"))
        if random.random() < 0.5:
            lost, kept = kept, lost
        print(f"the rack of {lost} dies")
        for h in lost:
            c.kill(h)
        for h in lost:
            c.wait_dead(h)
        code, report = c.ptcctl_json("reconfigure", "--job", "j", "--to", "tp=1,pp=2,dp=1",
                                     "--hosts", ",".join(kept))
        assert code == 0 and report["phase"] == "committed", report
        v = c.job_tool("verify", "--job", "j")
        assert v.returncode == 0, v.stdout + v.stderr
    finally:
        c.stop()


def test_a_restarted_ptcd_is_not_trusted_as_a_source(cluster):
    # dp=2 across host0 and host1; host1 restarts (empty) and registers again.
    start_job(cluster)
    cluster.kill("host1")
    cluster.wait_dead("host1")
    cluster._start_ptcd(1, "2GiB")
    cluster.wait_alive(4)
    # The plan must take everything from host0; host1 may be a target.
    code, report = cluster.ptcctl_json("reconfigure", "--job", "j", "--to", "tp=2,pp=1,dp=2",
                                       "--hosts", "host1,host2")
    assert code == 0, report
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stderr


def wait_staging(c, job, min_bytes=1):
    for _ in range(2000):
        r = c.job(job)["reconfiguration"]
        if r["phase"] == "staging" and r["bytes_done"] >= min_bytes:
            return True
        if r["phase"] in ("committed", "aborted"):
            return False
        time.sleep(0.005)
    return False


def test_a_ptcd_killed_mid_transfer_is_replaced_by_its_replica(cluster):
    # dp=2: host0 and host1 each hold a whole replica; the target is on
    # host2 and host3, so every byte crosses hosts, half of it from host1.
    # host1 dies while the change stages: its pieces come from host0, its
    # ranks' small objects from their copies there or fresh, and the
    # change commits (a source with the only copy aborts it: see
    # test_interleavings and tests/reconfigure_test).
    start_job(cluster)
    proc = subprocess.Popen(
        [str(cluster.bin / "tools/ptcctl"), "reconfigure", "--job", "j", "--to", "tp=2,pp=1,dp=2",
         "--hosts", "host2,host3", "--parallel-pulls", "1", "--coordinator", cluster.coordinator],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_staging(cluster, "j"), "the transfer ended before it could be interrupted"
    cluster.kill("host1")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert cluster.job("j")["committed_version"] == 2
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stderr
    # The job changes again, onto the surviving source host and a target.
    cluster.wait_dead("host1")
    code, report = cluster.ptcctl_json("reconfigure", "--job", "j", "--to", "tp=2,pp=1,dp=2",
                                       "--hosts", "host0,host2")
    assert code == 0, report
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stderr


def test_a_coordinator_killed_mid_plan_restarts_and_every_host_agrees(cluster):
    start_job(cluster)
    proc = subprocess.Popen(
        [str(cluster.bin / "tools/ptcctl"), "reconfigure", "--job", "j", "--to", "tp=1,pp=2,dp=2",
         "--hosts", "host2,host3", "--parallel-pulls", "1", "--coordinator", cluster.coordinator],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_staging(cluster, "j")
    cluster.restart_coordinator()
    proc.communicate(timeout=60)
    cluster.wait_alive(4)
    job = cluster.job("j")
    assert job["committed_version"] in (1, 2)
    assert job["reconfiguration"]["phase"] in ("committed", "aborted")
    v = job["committed_version"]
    # Every host agrees: the job's hosts hold exactly the committed
    # version, the others nothing; no staged version is left behind.
    for _ in range(200):
        views = {h: cluster.store_versions(h, "j") for h in ("host0", "host1", "host2", "host3")}
        if all(s in ([], [(v, True)]) for s in views.values()):
            break
        time.sleep(0.05)
    assert all(s in ([], [(v, True)]) for s in views.values()), views
    for h in job["hosts"]:
        assert views[h] == [(v, True)]
    check = cluster.job_tool("verify", "--job", "j")
    assert check.returncode == 0, check.stderr
    log = (cluster.dir / "coordinator.log").read_text()
    assert ("aborted epoch" in log) or ("resumed the decided commit" in log) or v == 2


def test_the_tenplex_baseline_plan_runs_on_the_same_engine(cluster):
    # dp=2 on host0/host1 to tp=2,dp=2 on host2/host3: ptc balances the two
    # replicas as senders; the per-rank baseline fetches from replica 0 only.
    start_job(cluster)
    code, base = cluster.ptcctl_json("reconfigure", "--job", "j", "--to", "tp=2,pp=1,dp=2",
                                     "--hosts", "host2,host3", "--strategy", "tenplex")
    assert code == 0, base
    assert base["strategy"] == "tenplex"
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stderr
    code, ours = cluster.ptcctl_json("reconfigure", "--job", "j", "--to", "tp=2,pp=1,dp=2",
                                     "--hosts", "host0,host1")
    assert code == 0, ours
    assert base["bytes_from_peers"] == base["plan"]["cross_host_bytes"]
    assert base["plan"]["max_host_send_bytes"] > base["plan"]["max_host_send_bytes_lower_bound"]
    r = cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=2", "--strategy", "magic")
    assert r.returncode != 0 and "strategy 'magic' is unknown" in r.stderr


def test_prepare_readies_the_target_hosts_memory_and_changes_nothing(cluster):
    start_job(cluster)
    code, out = cluster.ptcctl_json("prepare", "--job", "j", "--to", "tp=1,pp=2,dp=2",
                                    "--hosts", "host1,host2,host3", "--wait")
    assert code == 0, out
    # 4 ranks on hosts of 2 GPUs: host1 (which holds everything) keeps a
    # whole replica, host2 and host3 take a stage each of the other, so
    # that any one host's loss leaves a copy (two hosts could not).
    assert sorted(h["name"] for h in out["hosts"]) == ["host1", "host2", "host3"]
    for h in out["hosts"]:
        # Each ptcd's default pool is 1/16 of its 2 GiB limit.
        assert h["capacity_bytes"] == 128 << 20
        assert 0 < h["bytes_prepared"] <= min(h["bytes_needed"], h["capacity_bytes"])
    assert out["bytes_needed"] == sum(h["bytes_needed"] for h in out["hosts"])
    assert cluster.job("j")["committed_version"] == 1
    assert cluster.store_versions("host2", "j") == []
    r = cluster.ptcctl("prepare", "--job", "nojob", "--to", "tp=2")
    assert r.returncode == 1 and "job 'nojob' is unknown" in r.stderr
    # The change itself then runs as usual, into the prepared memory.
    code, report = cluster.ptcctl_json("reconfigure", "--job", "j", "--to", "tp=1,pp=2,dp=2",
                                       "--hosts", "host1,host2,host3")
    assert code == 0 and report["phase"] == "committed", report
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stderr


def test_forget_removes_a_job_everywhere_and_its_name_can_be_used_again(cluster):
    start_job(cluster)
    code, report = cluster.ptcctl_json("reconfigure", "--job", "j", "--to", "tp=1,pp=2,dp=2",
                                       "--hosts", "host1,host2,host3")
    assert code == 0 and report["phase"] == "committed", report
    code, out = cluster.ptcctl_json("forget", "j")
    assert code == 0, out
    assert out["was_registered"] is True
    assert out["not_cleared"] == []
    # The hosts that hold version 2 (host1, host2 and host3: a replica on
    # host1, the other's stages on host2 and host3) deleted it; no host
    # keeps anything of the job.
    assert sorted(c["host"] for c in out["cleared"]) == ["host1", "host2", "host3"]
    assert out["bytes_deleted"] == sum(c["bytes"] for c in out["cleared"]) > 0
    for h in ("host0", "host1", "host2", "host3"):
        assert cluster.store_versions(h, "j") == []
    assert all(j["job"] != "j" for j in cluster.ptcctl_json("jobs")[1]["jobs"])
    r = cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=2")
    assert r.returncode == 1 and "job 'j' is unknown" in r.stderr
    # Forgotten everywhere: a second forget finds nothing.
    r = cluster.ptcctl("forget", "j")
    assert r.returncode == 1 and "unknown to the coordinator and to every live host" in r.stderr
    # The name can be used again, from scratch.
    start_job(cluster)
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stderr


def test_a_host_failure_with_a_surviving_replica_moves_nothing_across_hosts(cluster):
    # tp=2,pp=2,dp=2 on four 2-GPU hosts: host0 and host1 hold stage 0,
    # host2 and host3 stage 1. host2 dies; the change to dp=1 may use the
    # three survivors: ptc keeps each stage where a replica survives (stage
    # 1 on host3) and releases the spare host, so nothing crosses hosts.
    start_job(cluster, config="tp=2,pp=2,dp=2",
              hosts=("host0", "host1", "host2", "host3"))
    cluster.kill("host2")
    cluster.wait_dead("host2")
    code, report = cluster.ptcctl_json("reconfigure", "--job", "j", "--to", "tp=2,pp=2,dp=1",
                                       "--hosts", "host0,host1,host3")
    assert code == 0, report
    assert report["phase"] == "committed"
    plan = report["plan"]
    assert plan["cross_host_bytes"] == 0
    assert report["bytes_from_peers"] == 0
    placement = plan["placement"]
    assert placement["strategy"] == "ptc"
    # Ranks 0-1 are stage 0, ranks 2-3 stage 1 (tp fastest).
    assert [r["host"] for r in placement["ranks"]] == ["host0", "host0", "host3", "host3"]
    assert placement["released_hosts"] == ["host1"]
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stderr
    assert "every element exact" in v.stdout
    # The same change placed contiguously (stage 1 on host1) moves a stage.
    r = subprocess.run([str(cluster.bin / "tools/ptcctl"), "plan", "--model", MODEL,
                        "--from", "tp=2,pp=2,dp=2", "--to", "tp=2,pp=2,dp=1",
                        "--hosts", "4x2", "--dead-hosts", "host2",
                        "--placement", "contiguous", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["cross_host_bytes"] > 0
