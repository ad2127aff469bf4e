#!/usr/bin/env python3
"""Benchmark (not a test): the control plane over etcd.

1. Failover: the leading coordinator is killed (SIGKILL); measured are the
   time to the first call a coordinator accepts, and, with a change in
   flight when it was killed, the time until that change has ended
   (finished or aborted by the new leader).
2. The cost of etcd on a change's critical path: the same job changed back
   and forth on a cluster with the local state directory and on one over a
   3-member etcd (each write a replicated transaction), interleaved in one
   run; the change's time as the coordinator reports it, and ptcctl's
   wall time.

Real processes on loopback (3 etcd members with mutual TLS, 2 coordinators,
2 ptcds), lease 5 s. min/median/max over RUNS (default 5).

  PTC_BIN_DIR=$(bazel info bazel-bin) /usr/bin/python3 tools/ha_benchmark.py [RUNS]
"""
import json
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
import os  # noqa: E402

from cluster import LocalCluster  # noqa: E402
from ha_cluster import HaCluster  # noqa: E402

MODEL = "gpt:layers=4,hidden=256,heads=4,ffn=1024,vocab=1024,positions=64,pad=8"


def summary(values, unit="s"):
    return (f"min {min(values):.3f} {unit}, median {statistics.median(values):.3f} {unit}, "
            f"max {max(values):.3f} {unit} (n={len(values)})")


def change(c, job, to, hosts):
    start = time.monotonic()
    r = c.ptcctl("reconfigure", "--job", job, "--to", to, "--hosts", hosts, "--json")
    wall = time.monotonic() - start
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["phase"] == "committed", report
    return report["seconds"], wall


def in_flight(c, job):
    return c.job(job).get("reconfiguration", {}).get("phase") in (
        "staging", "verifying", "committing")


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    bin_dir = pathlib.Path(os.environ.get("PTC_BIN_DIR", ROOT / "bazel-bin"))
    layouts = [("tp=2,pp=1,dp=1", "host0"), ("tp=1,pp=1,dp=2", "host0,host1")]
    with tempfile.TemporaryDirectory(prefix="ptc-ha-bench-") as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "ha").mkdir()
        (tmp / "local").mkdir()
        ha = HaCluster(bin_dir, tmp / "ha")
        local = LocalCluster(bin_dir, tmp / "local", hosts=2, gpus=2, memory="1GiB",
                             host_timeout=3)
        try:
            for c in (ha, local):
                c.ptcctl("register", "--job", "b", "--model", MODEL, "--config", "tp=2",
                         "--hosts", "host0", check=True)
                c.save("b", "host0", 1)

            # 2. etcd on the critical path, interleaved.
            times = {"local": [], "etcd": []}
            walls = {"local": [], "etcd": []}
            for i in range(2 + runs):
                to, hosts = layouts[(i + 1) % 2]
                for name, c in (("local", local), ("etcd", ha)):
                    seconds, wall = change(c, "b", to, hosts)
                    if i >= 2:  # the first round trip warms both up
                        times[name].append(seconds)
                        walls[name].append(wall)
            print("A change's time (coordinator's report; 4.6 MiB job, 2 hosts on loopback):")
            for name in ("local", "etcd"):
                print(f"  {name:5}: {summary(times[name])}; ptcctl wall {summary(walls[name])}")
            print(f"  median difference: "
                  f"{1e3 * (statistics.median(times['etcd']) - statistics.median(times['local'])):.1f} ms")

            # 1. Failover.
            first_call, change_done, outcomes = [], [], []
            for _ in range(runs):
                ha.ptcctl("jobs", check=True)
                ha.coordinators[ha.leader()].kill()
                start = time.monotonic()
                ha.wait_serving()
                first_call.append(time.monotonic() - start)
                time.sleep(1.5)  # the killed one is back as a standby
            for _ in range(runs):
                to, hosts = layouts[1] if ha.job("b")["config"] == layouts[0][0] else layouts[0]
                p = ha.ptcctl_async("reconfigure", "--job", "b", "--to", to, "--hosts", hosts)
                while not in_flight(ha, "b") and p.poll() is None:
                    time.sleep(0.005)
                ha.coordinators[ha.leader()].kill()
                start = time.monotonic()
                p.communicate(timeout=120)
                ha.wait_serving()
                while in_flight(ha, "b"):
                    time.sleep(0.02)
                change_done.append(time.monotonic() - start)
                outcomes.append("committed" if ha.job("b")["config"] == to else "aborted")
                time.sleep(1.5)
            print(f"Failover (lease {ha.lease} s), leader killed:")
            print(f"  to the first call a coordinator accepts: {summary(first_call)}")
            print(f"  to the end of the change in flight:      {summary(change_done)} "
                  f"(ended: {', '.join(outcomes)})")
        finally:
            ha.stop()
            local.stop()


if __name__ == "__main__":
    main()
