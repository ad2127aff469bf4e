"""Benchmark: a data-parallel replica is lost and replaced while the job
trains, ptc against torchft, side by side in the same run.

The job is the same in both: the >= 1 GiB GPT (fp32 weights + Adam) at
dp=2, one process per replica, 1 CPU thread each, gloo, the same steps.
After a few steps the process of replica 1 is SIGKILLed mid-training and
started again at once (ptc's agent does this for ptc; the benchmark does
it for torchft, as torchelastic or a scheduler would):

  ptc:     examples/elastic_live/train.py under ptc.torch.elastic, saving
           every --save-every steps into ptcd; the agent reports the death,
           the coordinator changes the job from its committed version, the
           survivor re-forms its groups and reloads, and the new process
           loads its rank from its host's ptcd;
  torchft: the same model and step under torchft's Manager (lighthouse,
           per-replica manager, fault-tolerant allreduce, Optimizer
           wrapper committing each step): the survivor drops the failed
           step and trains on alone; the new process joins the quorum and
           heals from the survivor's state (torchft's HTTP checkpoint
           transport).

Reported per system, min/median/max over --runs (alternating which runs
first): the job's longest stall (no step committed) around the death,
from the death until a step commits with both replicas again, the steps
thrown away (ptc: those since the last save, done again; torchft: the
failed step), and the steps the survivor committed alone meanwhile
(torchft: at half the global batch). The normal step time is given too.

Runs in the Python that has torchft and PyTorch 2.x (tools/venv_check.sh
makes such a venv; `pip install torchft` into it), with ptc's client from
bazel-bin:

    VENV=~/.cache/ptc/venv-3.11.7-torch__2.11.0
    $VENV/bin/python examples/elastic/replica_loss_benchmark.py --runs 3
"""

import argparse
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "elastic_gpt"))
import live as live_example  # noqa: E402  (the live job's launcher)
from live import read_jsonl  # noqa: E402
import run as elastic  # noqa: E402  (the local cluster)

MODEL = "layers=12,hidden=768,heads=12,ffn=3072,vocab=16384,positions=1024"
LR, WARMUP = 3e-3, 4


def stats(xs):
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def figures(times, killed):
    """From the times the job committed its steps: the median step (every
    gap but the stall's: ptc's include its periodic saves), and the
    longest gap from the last step before the kill on (the stall)."""
    times = sorted(times)
    gaps = [b - a for a, b in zip(times, times[1:])]
    last = max(i for i, t in enumerate(times) if t < killed)
    stall = max(gaps[last:])
    rest = list(gaps)
    rest.remove(stall)
    return statistics.median(rest), stall


# ---------------------------------------------------------------- torchft

def torchft_replica(args):
    """One torchft replica (run as a process of its own)."""
    import datetime
    import torch
    import torchft
    import gpt
    import harness

    torch.set_num_threads(1)
    store = torch.distributed.TCPStore("127.0.0.1", args.store_port, is_master=True,
                                       wait_for_workers=False)
    arch = gpt.Arch(args.model)
    data = harness.tokens(arch.vocab)
    model = gpt.Stage(arch, seed=1234)
    inner = torch.optim.Adam(model.parameters(), lr=LR, eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lambda it: min(1.0, (it + 1) / WARMUP))

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict(),
                "sched": sched.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])
        sched.load_state_dict(sd["sched"])

    manager = torchft.Manager(
        pg=torchft.ProcessGroupGloo(timeout=datetime.timedelta(seconds=30)),
        load_state_dict=load_state_dict, state_dict=state_dict, min_replica_size=1,
        timeout=datetime.timedelta(seconds=30), lighthouse_addr=args.lighthouse,
        replica_id=f"replica{args.replica}", store_addr="127.0.0.1",
        store_port=args.store_port, rank=0, world_size=1)
    opt = torchft.Optimizer(manager, inner)
    out = pathlib.Path(args.out)
    half = args.global_batch // 2
    while manager.current_step() < args.iterations:
        step = manager.current_step()
        opt.zero_grad(set_to_none=False)  # starts the quorum
        ids = [(step * args.global_batch + args.replica * half + i) % harness.SAMPLES
               for i in range(half)]
        batch = data[ids]
        total = 0.0
        for mb in batch.chunk(args.micro_batches):
            loss = model.loss(model(mb[:, :-1]), mb[:, 1:]) / args.micro_batches
            loss.backward()
            total += float(loss)
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        manager.allreduce(flat).wait()  # the average over the replicas in the quorum
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()
        opt.step()  # commits only if every replica's step succeeded
        committed = manager.current_step() > step
        if committed:
            sched.step()
        with open(out, "a") as f:
            f.write(json.dumps({"replica": args.replica, "step": step, "time": time.time(),
                                "committed": bool(committed), "loss": total,
                                "participants": manager.num_participants(),
                                "pid": os.getpid()}) + "\n")
    manager.shutdown(wait=False)
    del store


def torchft_run(args, work):
    """Two replicas, replica 1 killed after --kill-after steps and started
    again at once; returns the run's figures."""
    lighthouse_port = elastic.free_port()
    exe = pathlib.Path(sys.executable).parent / "torchft_lighthouse"
    lighthouse = subprocess.Popen(
        [str(exe), "--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms",
         str(args.join_timeout_ms), "--bind", f"127.0.0.1:{lighthouse_port}"],
        stdout=open(work / "lighthouse.log", "w"), stderr=subprocess.STDOUT)
    procs = {}

    def start(replica):
        cmd = [sys.executable, __file__, "--torchft-replica", str(replica),
               "--lighthouse", f"http://127.0.0.1:{lighthouse_port}",
               "--store-port", str(elastic.free_port()), "--out", str(work / "steps.jsonl"),
               "--model", args.model, "--iterations", str(args.iterations),
               "--global-batch", str(args.global_batch),
               "--micro-batches", str(args.micro_batches)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        log = open(work / f"replica{replica}.log", "a")
        procs[replica] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

    try:
        start(0)
        start(1)
        steps = lambda: read_jsonl(work / "steps.jsonl")  # noqa: E731
        wait(f"{args.kill_after} committed steps of both replicas", lambda: len(
            [r for r in steps() if r["committed"] and r["participants"] == 2]) >= 2 * args.kill_after,
            procs, args.timeout)
        victim = procs[1].pid
        killed = time.time()
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        start(1)  # as torchelastic or a scheduler would, at once
        wait("a step of both replicas after the kill", lambda: any(
            r["replica"] == 1 and r["pid"] != victim and r["committed"] and
            r["participants"] == 2 for r in steps()), procs, args.timeout)
        for p in procs.values():
            p.wait(args.timeout)
        records = steps()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        lighthouse.kill()
        lighthouse.wait()
    survivor = [r for r in records if r["replica"] == 0]
    step, stall = figures([r["time"] for r in survivor if r["committed"]], killed)
    both = min(r["time"] for r in records if r["replica"] == 1 and r["pid"] != victim and
               r["committed"] and r["participants"] == 2)
    return {"step": step, "stall": stall, "both_again": both - killed,
            "thrown_away": sum(1 for r in survivor if not r["committed"]),
            "alone": sum(1 for r in survivor if r["committed"] and r["participants"] == 1)}


def wait(what, ready, procs, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ready():
            return
        for name, p in procs.items():
            if p.poll() not in (None, 0, -9):
                raise SystemExit(f"{name} exited with {p.returncode} while waiting for {what}")
        time.sleep(0.05)
    raise SystemExit(f"waited {timeout} s for {what}")


# -------------------------------------------------------------------- ptc

def ptc_run(args, work):
    """The live job at dp=2 on two hosts, its process on host1 killed after
    --kill-after steps (its agent starts it again); returns the figures."""
    job_args = argparse.Namespace(bin=args.bin, model=args.model, iterations=args.iterations,
                                  save_every=args.save_every, global_batch=args.global_batch,
                                  step_seconds=0.0, scenario="replica", check=False)
    cluster = elastic.Cluster(args.bin, work, hosts=2, gpus=1, memory=args.memory)
    job = live_example.LiveJob(job_args, cluster, work)
    name = live_example.JOB
    try:
        layout = work / "layout.json"
        subprocess.run([sys.executable, str(HERE.parent / "elastic_gpt/train.py"), "--config",
                        "tp=1,dp=2", "--model", args.model, "--layout-out", str(layout)],
                       check=True, env=dict(os.environ,
                                            PYTHONPATH=f"{args.bin}/client/python/pkg"))
        cluster.ptcctl("register", "--job", name, "--layout", str(layout), "--config",
                       "tp=1,dp=2", "--hosts", "host0,host1", "--auto", "on", "--live",
                       "--global-batch", str(args.global_batch), capture=True)
        for h in ("host0", "host1"):
            job.start_agent(h)
        records = lambda: read_jsonl(job.run / "losses.jsonl")  # noqa: E731
        job.wait(f"{args.kill_after} steps", lambda: len(records()) >= args.kill_after,
                 timeout=args.timeout)
        victim = job.running("host1")[0]
        killed = time.time()
        at_kill = max(r["iteration"] for r in records())
        os.kill(victim, signal.SIGKILL)
        job.wait("a step after the kill", lambda: any(r["time"] > killed for r in records())
                 and job.running("host1").get(0) not in (None, victim), timeout=args.timeout)
        job.wait(f"iteration {args.iterations}", lambda: max(
            r["iteration"] for r in records()) >= args.iterations, timeout=args.timeout)
        out = records()
    finally:
        job.stop()
        cluster.down()
    step, stall = figures([r["time"] for r in out], killed)
    # A step of the job's two processes: the new one has joined.
    first = min((r for r in out if r["time"] > killed), key=lambda r: r["time"])
    return {"step": step, "stall": stall, "both_again": first["time"] - killed,
            "thrown_away": at_kill - first["iteration"] + 1,
            "alone": 0}


# ------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--systems", default="ptc,torchft")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--iterations", type=int, default=14)
    ap.add_argument("--kill-after", type=int, default=5, help="steps before the kill")
    ap.add_argument("--save-every", type=int, default=4, help="ptc's live saves")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--join-timeout-ms", type=int, default=10000,
                    help="torchft lighthouse's wait for stragglers (its README's value)")
    ap.add_argument("--memory", default="6GiB", help="each ptcd's memory")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--bin", default=str(ROOT / "bazel-bin"))
    ap.add_argument("--work-dir")
    ap.add_argument("--json", action="store_true")
    # One torchft replica (the benchmark starts these itself).
    ap.add_argument("--torchft-replica", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--lighthouse", help=argparse.SUPPRESS)
    ap.add_argument("--store-port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torchft_replica is not None:
        args.replica = args.torchft_replica
        return torchft_replica(args)
    if not 1 <= args.kill_after < args.iterations - 2:
        ap.error("--kill-after must be at least 1 and leave 3 iterations after it")
    if args.global_batch % (2 * args.micro_batches):
        ap.error("--global-batch must split into 2 replicas x --micro-batches")
    args.bin = pathlib.Path(args.bin).resolve()
    systems = [s for s in args.systems.split(",") if s]
    if set(systems) - {"ptc", "torchft"}:
        ap.error("--systems takes ptc and torchft")
    if "torchft" in systems:
        try:
            import torchft  # noqa: F401
        except ImportError:
            raise SystemExit(f"{sys.executable} has no torchft: pip install torchft "
                             "(it needs PyTorch 2.x), or --systems ptc")
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="ptc-replica-loss-"))
    results = {s: [] for s in systems}
    for run in range(args.runs):
        order = systems if run % 2 == 0 else systems[::-1]
        for system in order:
            d = work / f"run{run}-{system}"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            r = (ptc_run if system == "ptc" else torchft_run)(args, d)
            results[system].append(r)
            say(f"run {run + 1} {system}: step {r['step']:.2f} s; stall {r['stall']:.2f} s; "
                f"both replicas again {r['both_again']:.2f} s after the kill; "
                f"{r['thrown_away']} steps thrown away, {r['alone']} committed alone")
    summary = {s: {k: stats([r[k] for r in rs]) for k in rs[0]}
               for s, rs in results.items() if rs}
    if args.json:
        print(json.dumps({"runs": results, "summary": summary}, indent=2))
        return
    say(f"\n{'':8} {'step s':>18} {'stall s':>18} {'both again s':>18} {'thrown away':>14} "
        f"{'alone':>8}   (min/median/max of {args.runs})")
    for s, m in summary.items():
        cell = lambda k, f="{:.2f}": "/".join(f.format(m[k][x])  # noqa: E731
                                             for x in ("min", "median", "max"))
        say(f"{s:8} {cell('step'):>18} {cell('stall'):>18} {cell('both_again'):>18} "
            f"{cell('thrown_away', '{:.0f}'):>14} {cell('alone', '{:.0f}'):>8}")


if __name__ == "__main__":
    main()
