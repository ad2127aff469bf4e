"""The scale harness at a small size: the real coordinator, 64 hollow hosts
(the real ptcd code over stores that keep no bytes) and 512 hollow
processes following a live job (each told by its Watch stream) through
saves, 4 hosts' deaths and the automatic change that follows, then 4 hosts
joining; and 128 processes that look at their job as ptc.elastic's did
before they followed their own streams (rank 0 follows the stream, the
others poll). Correctness, not
time: every surviving process resumes in the new layout epoch, the job's
committed layout is the one asked for (its regions proven by their
fingerprints, as in a real change), and the coordinator's threads stay
bounded and come back down (tools/scale_harness.py checks them all)."""
import json
import os
import subprocess
import sys

from conftest import ROOT


def run_harness(bin_dir, tmp_path, *args):
    out = tmp_path / "phases.json"
    env = dict(os.environ, PTC_BIN_DIR=str(bin_dir))
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "scale_harness.py"), "--work", str(tmp_path),
         "--json", str(out), "--steady", "2", "--timeout", "300", *args],
        capture_output=True, text=True, env=env, timeout=900, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return json.loads(out.read_text()), r.stdout


def test_a_live_job_of_512_hollow_processes_survives_4_hosts_and_grows(bin_dir, tmp_path):
    result, out = run_harness(
        bin_dir, tmp_path, "--hosts", "64", "--kill", "4", "--add", "4",
        "--config", "tp=2,pp=4,dp=64", "--after-kill", "tp=2,pp=4,dp=60",
        "--after-add", "tp=2,pp=4,dp=64", "--group", "32")
    assert result["failures"] == []
    phases = {p["phase"]: p for p in result["phases"]}
    assert list(phases) == ["start", "meet", "steady", "failure", "scale-up"]
    assert phases["meet"]["processes"] == 512
    # Its processes reach the coordinator through their hosts' ptcds: about
    # a connection per host, not one per process.
    assert phases["meet"]["peak_connections"] <= 64 + 2 * 3 + 16, phases["meet"]
    # The processes on the dead hosts never save: only the change that
    # their deaths start moves the job.
    assert "died (automatic)" in phases["failure"]["change"]
    # Every process asked the coordinator through counted RPCs.
    assert phases["meet"]["calls_per_s"].get("Coordinator.ReportSaved", 0) > 0
    # A save's proof sends each host its expectations once per layout; the
    # later saves name them.
    assert phases["meet"]["proofs_whole"] == 64, phases["meet"]
    assert phases["meet"]["proofs_by_id"] >= 64, phases["meet"]
    assert "every check passed" in out

    # Told, not polling: in steady state only the hosts' heartbeats reach
    # the coordinator, on their streams (a beat whose stream just ended
    # comes as a call), and, on a machine loaded beyond the harness's 5 s
    # host timeout, the registrations of hosts declared dead meanwhile: not
    # a process asking.
    steady = phases["steady"]["calls_per_s"]
    assert set(steady) <= {"Coordinator.Heartbeats", "Coordinator.Heartbeat",
                           "Coordinator.RegisterHost"}, steady
    assert steady.get("Coordinator.Heartbeats", 0) > 0, steady
    # A follower is told a change's phases, not its progress: a few small
    # events per process, however many progress reports the 60 hosts make
    # (each process was written each of them, plan and all, before).
    failure = phases["failure"]
    assert 0 < failure["watch_events"] <= 8 * 512, failure
    assert failure["watch_bytes"] / failure["watch_events"] < 2048, failure


def test_processes_that_poll_follow_a_change(bin_dir, tmp_path):
    result, _ = run_harness(
        bin_dir, tmp_path, "--hosts", "16", "--kill", "2", "--config", "tp=2,pp=4,dp=16",
        "--after-kill", "tp=2,pp=4,dp=14", "--saves", "1", "--poll")
    assert result["failures"] == []
    steady = next(p for p in result["phases"] if p["phase"] == "steady")
    # Each process but rank 0 asks at every step's boundary.
    assert steady["calls_per_s"]["Coordinator.ListJobs"] > 100


def test_a_save_a_hollow_rank_gives_up_is_made_again(bin_dir, tmp_path):
    # Rank 3 gives up the first save it begins (as a process whose part
    # failed to write does): the coordinator deletes the version, every
    # rank learns it (those that began it from their reports or streams,
    # those that had not from the refusal of a save begun unaware), and
    # together they save the step again; then the change after 2 hosts die.
    result, out = run_harness(
        bin_dir, tmp_path, "--hosts", "16", "--kill", "2", "--config", "tp=2,pp=4,dp=16",
        "--after-kill", "tp=2,pp=4,dp=14", "--saves", "2", "--give-up-save", "1:3")
    assert result["failures"] == []
    assert result["saves_lost"] >= 1, out[-3000:]
    assert "saves lost and made again" in out
