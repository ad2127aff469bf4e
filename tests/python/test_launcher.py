"""ptc's launcher for restart-style jobs: `ptcctl run` starts the agent for
the machine's ptcds, which runs a script written for torchrun (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT from the environment) once per
rank of the placement, stops it when a change starts and starts the new
layout's ranks after the commit; they load what the change moved."""
import json
import os
import pathlib
import random
import subprocess
import sys
import time

from cluster import LocalCluster, ROOT

SCRIPT = ROOT / "examples" / "torchrun_mlp" / "train.py"


def records(out):
    """Every rank's records, in order of writing per rank."""
    got = []
    for f in sorted(pathlib.Path(out).glob("rank*.jsonl")):
        for line in f.read_text().splitlines(keepends=True):
            if line.endswith("\n"):  # a line being written is read next time
                got.append(json.loads(line))
    return got


def wait_for(what, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what.__doc__ or what}")


def start_job(bin_dir, tmp_path, ptc_module, cluster, job, config, hosts):
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(ptc_module.__file__).parents[1]))
    layout = tmp_path / f"{job}.json"
    subprocess.run([sys.executable, str(SCRIPT), "--layout-out", str(layout)], check=True,
                   env=env, timeout=120)
    r = cluster.ptcctl("register", "--job", job, "--layout", str(layout), "--config", config,
                       "--hosts", hosts)
    assert r.returncode == 0, r.stderr


def launch(cluster, job, out, *script_args, log_dir):
    """`ptcctl run` of the script; the agent runs with this interpreter."""
    out.mkdir(exist_ok=True)
    port = random.Random(os.getpid()).randrange(20000, 40000)  # two suites at once
    return subprocess.Popen(
        [str(cluster.bin / "tools/ptcctl"), "run", "--job", job, "--coordinator",
         cluster.coordinator, "--log-dir", str(log_dir), "--master-port", str(port),
         "--grace", "30", "--", sys.executable, str(SCRIPT), "--record", str(out),
         *script_args],
        env=dict(os.environ, PTC_PYTHON=sys.executable), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True), port


def test_a_torchrun_script_runs_changes_and_resumes_under_ptcctl_run(bin_dir, tmp_path,
                                                                      ptc_module):
    cluster = LocalCluster(bin_dir, tmp_path, hosts=2, gpus=2)
    run = None
    try:
        start_job(bin_dir, tmp_path, ptc_module, cluster, "mlp", "dp=2", "host0")
        out, stop = tmp_path / "out", tmp_path / "stop"
        run, port = launch(cluster, "mlp", out, "--steps", "100000", "--save-every", "2",
                           "--step-seconds", "0.05", "--stop-file", str(stop),
                           log_dir=tmp_path / "logs")
        # Two processes of layout epoch 1 train and save.
        wait_for(lambda: [r for r in records(out) if r["event"] == "save" and r["step"] >= 4])
        starts = [r for r in records(out) if r["event"] == "start"]
        assert len(starts) == 2
        for r in starts:
            env = r["env"]
            assert env["WORLD_SIZE"] == "2" and env["RANK"] == str(r["rank"])
            assert env["LOCAL_RANK"] == env["PTC_DEVICE"] and env["LOCAL_WORLD_SIZE"] == "2"
            assert env["MASTER_ADDR"] == "127.0.0.1"
            assert env["MASTER_PORT"] == str(port + int(env["PTC_LAYOUT_EPOCH"]) % 1000)
            assert env["TORCHELASTIC_RUN_ID"] == "mlp" and env["PTC_HOST"] == "host0"

        # The scheduler changes the job: the agent stops the processes when
        # the change starts, and starts dp=4 on both hosts after it commits.
        # (A change asked while a save is being committed waits for it:
        # ptcctl asks again.)
        r = cluster.ptcctl("reconfigure", "--job", "mlp", "--to", "dp=4", "--hosts",
                           "host0,host1", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        loads = wait_for(lambda: (lambda got: got if len(got) == 4 else None)(
            [r for r in records(out) if r["event"] == "load" and r["world"] == 4]))
        # Each new rank resumed at the step the change moved (a save of the
        # old layout), with the very parameters the old ranks saved then.
        saving = {r["step"]: r["digest"] for r in records(out)
                  if r["event"] == "saving" and r["world"] == 2}
        assert len({r["step"] for r in loads}) == 1, loads
        step = loads[0]["step"]
        assert step >= 4 and step in saving, (loads, sorted(saving))
        assert {r["digest"] for r in loads} == {saving[step]}
        new_starts = [r for r in records(out) if r["event"] == "start" and r["world"] == 4]
        assert sorted(int(r["env"]["RANK"]) for r in new_starts) == [0, 1, 2, 3]
        assert {r["env"]["PTC_HOST"] for r in new_starts} == {"host0", "host1"}
        for r in new_starts:
            assert r["env"]["MASTER_PORT"] == str(port + int(r["env"]["PTC_LAYOUT_EPOCH"]) % 1000)
            assert r["env"]["PTC_LAYOUT_EPOCH"] != starts[0]["env"]["PTC_LAYOUT_EPOCH"]
        # The old processes were stopped, not left running beside the new.
        old_pids = {r["pid"] for r in starts}
        for pid in old_pids:
            assert not pathlib.Path(f"/proc/{pid}").exists() or \
                "zombie" in pathlib.Path(f"/proc/{pid}/status").read_text()
        # They train on and save in the new layout; then the job ends and
        # so does `ptcctl run`, with status 0.
        wait_for(lambda: [r for r in records(out) if r["event"] == "save" and r["world"] == 4])
        stop.touch()
        output, _ = run.communicate(timeout=180)
        assert run.returncode == 0, output
        # The agent stopped them, or they ended by themselves first (a save
        # refused once the change had started); either way none of the
        # failures counted against the job.
        assert ("stopping 2 processes" in output or output.count("exited with") >= 2), output
        assert "changes the job" not in output and "automatic changes off" not in output, output
        ends = [r for r in records(out) if r["event"] == "end"]
        assert len(ends) == 4 and len({r["step"] for r in ends}) == 1
    finally:
        if run and run.poll() is None:
            run.kill()
            run.wait()
        cluster.stop()


def test_ptcctl_run_ends_with_a_failed_process_status_when_nothing_changes_the_job(
        bin_dir, tmp_path, ptc_module):
    cluster = LocalCluster(bin_dir, tmp_path, hosts=1, gpus=2)
    try:
        start_job(bin_dir, tmp_path, ptc_module, cluster, "mlp", "dp=2", "host0")
        run, _ = launch(cluster, "mlp", tmp_path / "out", "--steps", "100000",
                        "--fail-rank", "1", log_dir=tmp_path / "logs")
        output, _ = run.communicate(timeout=180)
        # Rank 1 exits with 3; automatic changes are off, so the job cannot
        # go on: rank 0 (waiting in a collective) is stopped, and the
        # launcher ends with the failed process's status.
        # (Rank 0 may fail too, its peer gone, and be seen first.)
        assert run.returncode != 0, output
        assert "has automatic changes off for the job" in output, output
        assert "a process of the job failed" in output or "exited with" in output, output
    finally:
        cluster.stop()


def test_ptcctl_run_explains_what_it_needs(bin_dir, tmp_path):
    cluster = LocalCluster(bin_dir, tmp_path, hosts=1, gpus=2)
    try:
        ptcctl = str(cluster.bin / "tools/ptcctl")
        r = subprocess.run([ptcctl, "run", "--job", "mlp", "--coordinator",
                            cluster.coordinator], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "after --" in r.stderr
        r = subprocess.run([ptcctl, "run", "--coordinator", cluster.coordinator, "--",
                            "true"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--job is required" in r.stderr
        r = subprocess.run([ptcctl, "run", "--job", "mlp", "--coordinator",
                            cluster.coordinator, "--python", "/nonexistent/python", "--",
                            "true"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "give --python or PTC_PYTHON" in r.stderr, r.stderr
        # The hosts' sockets as they registered them, which run finds.
        hosts = cluster.ptcctl_json("hosts")[1]["hosts"]
        assert hosts[0]["socket"] == str(tmp_path / "host0.sock")
    finally:
        cluster.stop()
