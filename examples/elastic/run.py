"""Elastic PyTorch training jobs on a local ptc cluster.

Starts a coordinator and four ptcd "hosts" (2 GPUs each) on loopback,
registers a job with the layout its training script builds (ptc.torch),
and runs it through a sequence of parallel configs: each phase launches
one process per rank, trains, saves to ptc and exits; ptcctl reconfigures
the saved state to the next config; the next phase's processes load it and
go on. After each change it checks:

  1. parameters and optimizer state after the reload are bit-identical to
     the values the old ranks held when they saved (written aside with
     torch.save, assembled across the old layout's shards);
  2. the loss goes on as in an uninterrupted run of the same job (run first,
     at the first config): equal within a relative tolerance, since another
     parallelism sums floating-point partial results in another order;
  3. every sample was consumed exactly once (and the same samples, in the
     same iterations, as the uninterrupted run).

    /usr/bin/python3 examples/elastic/run.py                 # the GPT job
    /usr/bin/python3 examples/elastic/run.py --job mlp
    /usr/bin/python3 examples/elastic/run.py --job gpt-zero   # ZeRO-1 optimizer
    /usr/bin/python3 examples/elastic/run.py --job gpt --phases tp=2,dp=1@host0 \\
        tp=1,pp=2,dp=2@host0,host1 --iterations 4
"""

import argparse
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# Each job: its training script, default phases, model argument and the
# relative loss tolerance against the uninterrupted run.
JOBS = {
    "gpt": {
        "script": "elastic_gpt/train.py",
        "model": "layers=4,hidden=64,heads=4,ffn=256,vocab=500,positions=64",
        "phases": ["tp=2,dp=2@host0,host1", "tp=2,pp=2,dp=2@host0,host1,host2,host3",
                   "tp=1,pp=1,dp=2@host3"],
        "tolerance": 1e-4,
    },
    # The GPT job with a flat-buffer distributed optimizer (ZeRO-1): Adam's
    # state is split over dp in Megatron-core's buckets, and every change
    # of dp re-cuts it.
    "gpt-zero": {
        "script": "elastic_gpt/train.py",
        "args": ["--zero"],
        "model": "layers=4,hidden=64,heads=4,ffn=256,vocab=500,positions=64",
        "phases": ["tp=2,dp=2@host0,host1", "tp=1,pp=2,dp=4@host0,host1,host2,host3",
                   "tp=2,pp=1,dp=1@host3"],
        "tolerance": 1e-4,
    },
    "moe": {
        "script": "elastic_moe/train.py",
        "model": "layers=2,hidden=64,heads=4,ffn=128,experts=4,vocab=500,positions=64",
        "phases": ["ep=2,dp=2@host0,host1", "ep=4,dp=1@host0,host1", "ep=1,dp=2@host2"],
        # ep changes the order of the sums over experts and ranks.
        "tolerance": 1e-3,
    },
    "llama": {
        "script": "elastic_llama/train.py",
        "model": "layers=4,hidden=64,heads=8,groups=4,ffn=96,vocab=500",
        # tp=3 splits the 4 query groups 2, 1, 1.
        "phases": ["tp=2@host0", "tp=3@host1,host2", "tp=1,pp=2@host3"],
        "tolerance": 1e-4,
    },
    "mlp": {
        "script": "elastic_mlp/train.py",
        "model": "",
        "phases": ["dp=2@host0", "dp=4@host0,host1", "dp=1@host2"],
        "tolerance": 1e-4,
    },
}
NOT_AXES = ("zero", "layers", "order")


def world_size(config):
    """Processes of a parallel config such as "tp=2,pp=2,dp=2"."""
    world = 1
    for kv in config.split(","):
        k, v = kv.split("=")
        if k not in NOT_AXES:
            world *= int(v)
    return world


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, bin_dir, work, hosts=4, gpus=2, memory="3GiB", spare_pool=None):
        self.dir = work / "cluster"
        self.bin = bin_dir
        env = dict(os.environ, BIN=str(bin_dir))
        if spare_pool:
            env["SPARE_POOL"] = spare_pool
        subprocess.run(["bash", str(ROOT / "tools/local_cluster.sh"), "up", str(self.dir),
                        str(hosts), str(gpus), memory], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        kv = dict(line.split("=", 1) for line in (self.dir / "env").read_text().split())
        self.coordinator = kv["COORDINATOR"]
        # The operator's certificate (or plaintext) for ptcctl and the
        # launcher; the job's processes get the jobs' certificate and their
        # job's token (job_env).
        for key in ("PTC_TLS_CA", "PTC_TLS_CERT", "PTC_TLS_KEY", "PTC_INSECURE"):
            if key in kv:
                os.environ[key] = env[key] = kv[key]
        self.job_certificate = ({"PTC_TLS_CERT": kv["JOB_TLS_CERT"],
                                 "PTC_TLS_KEY": kv["JOB_TLS_KEY"]}
                                if "JOB_TLS_CERT" in kv else {})
        self.tokens = {}
        self.env = env

    def job_env(self, job):
        """What a job's process needs besides the CA: the certificate for
        jobs' processes and the job's token (from the coordinator, as the
        launcher that registered the job holds it); nothing in plaintext."""
        if not self.job_certificate:
            return {}
        if job not in self.tokens:
            self.tokens[job] = json.loads(self.ptcctl("token", job, "--json",
                                                      capture=True))["token"]
        return dict(self.job_certificate, PTC_JOB_TOKEN=self.tokens[job])

    def socket(self, host):
        return str(self.dir / f"{host}.sock")

    def ptcctl(self, *args, capture=False):
        cmd = [str(self.bin / "tools/ptcctl"), *args, "--coordinator", self.coordinator]
        r = subprocess.run(cmd, capture_output=capture, text=True)
        if r.returncode != 0:
            if capture:
                sys.stderr.write(r.stdout + r.stderr)
            raise SystemExit(f"ptcctl {args[0]} failed")
        return r.stdout

    def ptcctl_result(self, *args):
        """A ptcctl command's result, whatever it is (stdout and stderr)."""
        return subprocess.run([str(self.bin / "tools/ptcctl"), *args, "--coordinator",
                               self.coordinator], capture_output=True, text=True)

    def placement(self, job):
        """(host, GPU) of every rank, as each host's launcher learns it from
        the coordinator's placement (`ptcctl ranks`, as ptc.ranks_on_host;
        a ptcctl process, since a process's ptc client keeps the first
        cluster's certificates and a benchmark makes a cluster per run)."""
        hosts = [p.stem for p in sorted(self.dir.glob("host*.port"))]
        placed = {}
        for h in hosts:
            out = json.loads(self.ptcctl("ranks", "--job", job, "--host", h, "--json",
                                         capture=True))
            for r in out["ranks"]:
                placed[r["rank"]] = (h, r["gpu"])
        return [placed[r] for r in range(len(placed))]

    def down(self):
        subprocess.run(["bash", str(ROOT / "tools/local_cluster.sh"), "down", str(self.dir)],
                       env=self.env, stdout=subprocess.DEVNULL)


def run_phase(args, cluster, run_dir, config, world, placement, extra, save_after=None,
              launcher="ptcctl"):
    """Runs one process per rank and waits for all; exits on a failure.
    With `save_after`, asks the job to save (the control file) once it has
    trained that many iterations. On the cluster the processes are started
    by ptc's launcher (`ptcctl run`: the agent for each local ptcd, which
    gives each process its rank, GPU, socket and master port as torchrun
    would); launcher="direct", and the reference run without a cluster,
    start them here."""
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (run_dir / "samples").mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=f"{args.bin}/client/python/pkg", OMP_NUM_THREADS="1")
    # The processes' large allocations on transparent huge pages, as ptc's
    # agent starts them (ptc.agent.with_huge_pages): the same allocator for
    # every launch.
    if "glibc.malloc.hugetlb" not in env.get("GLIBC_TUNABLES", ""):
        env["GLIBC_TUNABLES"] = ":".join(
            t for t in (env.get("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1") if t)
    if cluster:
        env.update(cluster.job_env(args.job_name))
    script = [sys.executable, str(args.script), "--config", config, "--model", args.model,
              "--run-dir", str(run_dir), "--global-batch", str(args.global_batch),
              *args.script_args, *extra]
    port = free_port()
    procs = []
    if cluster and launcher == "ptcctl":
        # MASTER_PORT is the launcher's base plus the layout epoch modulo
        # 1000: a base that makes it the free port found here.
        epoch = json.loads(cluster.ptcctl("status", args.job_name, "--json",
                                          capture=True))["jobs"][0]["layout_epoch"]
        base = port - epoch % 1000
        if base < 1024:
            base += 1000
        phase_logs = logs / config
        log = open(logs / f"{config}_launcher.log", "w")
        cmd = [str(cluster.bin / "tools/ptcctl"), "run", "--job", args.job_name,
               "--coordinator", cluster.coordinator, "--log-dir", str(phase_logs),
               "--master-port", str(base), "--mode", "restart", "--", *script]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                       env=dict(env, PTC_PYTHON=sys.executable)), log))
    else:
        for rank in range(world):
            cmd = [*script, "--rank", str(rank), "--job", args.job_name, "--coordinator",
                   cluster.coordinator if cluster else "", "--master-port", str(port)]
            rank_env = env
            if placement:  # started on its host's ptcd, its GPU the only one it sees
                host, gpu = placement[rank]
                cmd += ["--socket", cluster.socket(host), "--gpu", str(gpu)]
                rank_env = dict(env, CUDA_VISIBLE_DEVICES=str(gpu))
            log = open(logs / f"{config}_rank{rank}.log", "w")
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                           env=rank_env), log))
    if placement:
        (run_dir / "launch").mkdir(exist_ok=True)
        (run_dir / "launch" / f"{config}.json").write_text(json.dumps(
            [{"rank": r, "host": h, "gpu": g} for r, (h, g) in enumerate(placement)]))
    request = run_dir / "save_request"
    deadline = time.time() + 1800
    while any(p.poll() is None for p, _ in procs) and time.time() < deadline:
        if save_after is not None and not request.exists():
            done = losses(run_dir / "losses.jsonl")
            if done and max(done) >= save_after:
                request.touch()
        time.sleep(0.05)
    failed = []
    for i, (p, log) in enumerate(procs):
        if p.poll() is None:
            p.kill()
        if p.wait() != 0:
            failed.append(i)
        log.close()
    request.unlink(missing_ok=True)
    if failed:
        for f in sorted(logs.glob(f"{config}_*.log"))[:2] + sorted(logs.glob(f"{config}/*"))[:2]:
            sys.stderr.write(f"== {f}\n{f.read_text()[-3000:]}")
        raise SystemExit(f"the processes of {config} failed (logs in {logs})")


def losses(path):
    """Loss by iteration: the complete records of losses.jsonl (a line
    without its newline is still being appended by rank 0; left for the
    next read)."""
    out = {}
    if path.exists():
        for line in path.read_text().split("\n")[:-1]:
            if line.strip():
                rec = json.loads(line)
                out[rec["iteration"]] = rec["loss"]
    return out


def samples(run_dir):
    """iteration -> sorted sample ids consumed in it, over all dp ranks."""
    per_iter = {}
    for f in (run_dir / "samples").glob("*.txt"):
        for line in f.read_text().splitlines():
            it, *ids = map(int, line.split())
            per_iter.setdefault(it, []).extend(ids)
    return {it: sorted(ids) for it, ids in per_iter.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", choices=sorted(JOBS), default="gpt", help="which training job")
    ap.add_argument("--phases", nargs="+",
                    help="CONFIG@HOST,HOST... for each phase, in order (default: the job's)")
    ap.add_argument("--iterations", type=int, default=6, help="iterations per phase")
    ap.add_argument("--model", help="the model's size, as the job's script reads it")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--tolerance", type=float,
                    help="largest relative loss difference to the uninterrupted run")
    ap.add_argument("--bin", default=str(ROOT / "bazel-bin"))
    ap.add_argument("--work-dir", help="keep everything here (default: a temporary dir)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    args.bin = pathlib.Path(args.bin)
    job = JOBS[args.job]
    args.script = HERE.parent / job["script"]
    args.script_args = job.get("args", [])
    args.job_name = f"elastic-{args.job}"
    args.phases = args.phases or job["phases"]
    args.model = job["model"] if args.model is None else args.model
    args.tolerance = job["tolerance"] if args.tolerance is None else args.tolerance

    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="ptc-elastic-"))
    work.mkdir(parents=True, exist_ok=True)
    phases = []
    for p in args.phases:
        config, _, hosts = p.partition("@")
        if not hosts:
            raise SystemExit(f"phase '{p}' needs @HOSTS, e.g. tp=2,dp=2@host0,host1")
        phases.append((config, hosts.split(","), world_size(config)))
    # Saves happen on request (a control file), at the first iteration
    # boundary after the launcher asks: a phase may run some iterations
    # longer than asked (more on a loaded machine: a CI run lost the race
    # with 3), so the reference runs longer too.
    total = args.iterations * len(phases) + 12 * (len(phases) - 1)
    say = (lambda *a: None) if args.json else print

    say(f"== uninterrupted run at {phases[0][0]} for {total} iterations (the reference)")
    ref_dir = work / "reference"
    ref_dir.mkdir(exist_ok=True)
    t0 = time.time()
    run_phase(args, None, ref_dir, phases[0][0], phases[0][2], None, ["--stop-at", str(total)])
    ref_losses = losses(ref_dir / "losses.jsonl")
    ref_samples = samples(ref_dir)
    say(f"   {total} iterations in {time.time() - t0:.1f} s, loss {ref_losses[1]:.4f} -> "
        f"{ref_losses[total]:.4f}")

    cluster = Cluster(args.bin, work)
    results = {"phases": [], "changes": []}
    ok = True
    try:
        run_dir = work / "elastic"
        run_dir.mkdir(exist_ok=True)
        config, hosts, world = phases[0]
        # The job's layout, as its training script builds it (ptc.torch).
        layout = work / "layout.json"
        subprocess.run([sys.executable, str(args.script), "--config", config, "--model",
                        args.model, *args.script_args, "--layout-out", str(layout)], check=True,
                       env=dict(os.environ, PYTHONPATH=f"{args.bin}/client/python/pkg"))
        cluster.ptcctl("register", "--job", args.job_name, "--layout", str(layout), "--config",
                       config, "--hosts", ",".join(hosts), capture=True)
        iteration = 0
        for i, (config, hosts, world) in enumerate(phases):
            last = i == len(phases) - 1
            end = iteration + args.iterations
            extra = []
            if i > 0:  # load what the previous phase saved, and check it
                extra += ["--load", "--check-dir", str(run_dir / "aside" / f"phase{i - 1}")]
            if last:
                extra += ["--stop-at", str(end)]
            else:
                extra += ["--save-check-dir", str(run_dir / "aside" / f"phase{i}")]
            say(f"\n== phase {i + 1}: {world} processes at {config} on {','.join(hosts)}, "
                f"from iteration {iteration + 1}" + (f" to {end}" if last else
                                                     f"; save requested after {end}"))
            t0 = time.time()
            run_phase(args, cluster, run_dir, config, world, cluster.placement(args.job_name), extra,
                      save_after=None if last else end)
            if not last:  # the iteration the job saved at
                end = json.loads((run_dir / "events" / f"{config}_rank0.json").read_text())[
                    "iteration"]
            got = losses(run_dir / "losses.jsonl")
            say(f"   trained in {time.time() - t0:.1f} s, loss at iteration {end}: "
                f"{got[end]:.4f}" + ("" if last else f"; saved to ptc at iteration {end}"))
            results["phases"].append({"config": config, "hosts": hosts, "processes": world,
                                      "iterations": [iteration + 1, end]})
            if i > 0:
                change = results["changes"][-1]
                change.update(check_change(run_dir, iteration, end, world, ref_losses, got,
                                           ref_samples, args, say))
                ok &= change["ok"]
            if last:
                iteration = end
                break
            nxt_config, nxt_hosts, _ = phases[i + 1]
            say(f"\n== reconfigure {config} -> {nxt_config} on {','.join(nxt_hosts)}")
            report = json.loads(cluster.ptcctl("reconfigure", "--job", args.job_name, "--to", nxt_config,
                                               "--hosts", ",".join(nxt_hosts), "--json",
                                               capture=True))
            say(format_report(report))
            results["changes"].append({"from": config, "to": nxt_config, "iteration": end,
                                       "report": report})
            iteration = end
        every, once, same = check_samples(run_dir, iteration, ref_samples, args)
        results["iterations"] = iteration
        results["samples"] = {"consumed": len(every), "distinct": len(set(every)),
                              "expected": iteration * args.global_batch,
                              "same_as_uninterrupted": same}
        ok &= once and same
    finally:
        cluster.down()
    results["ok"] = bool(ok)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        n = len(results["changes"])
        print(f"\n{'PASS' if ok else 'FAIL'}: {n} parallelism changes, {results['iterations']} "
              f"iterations; "
              f"state bit-identical after every reload, loss within {args.tolerance:g} of the "
              f"uninterrupted run, every sample exactly once" if ok else
              f"\nFAIL: see the checks above (work dir {work})")
    if not args.work_dir and ok:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def format_report(r):
    mib, p = 1 << 20, r["plan"]
    return (f"   committed version {r['target_version']} in {r['seconds']:.2f} s: "
            f"{p['kept_in_place_bytes'] / mib:.2f} MiB kept in place (local), "
            f"{p['copied_within_host_bytes'] / mib:.2f} MiB copied within hosts, "
            f"{p['cross_host_bytes'] / mib:.2f} MiB sent across hosts; "
            f"{r['tensors_verified']} tensor fingerprints verified")


def check_samples(run_dir, end, ref_samples, args):
    """The samples consumed in iterations 1..end (logged as 0..end-1), whether
    each was consumed once, and whether they match the uninterrupted run."""
    seen = samples(run_dir)
    every = [s for it in sorted(seen) if it < end for s in seen[it]]
    once = len(every) == len(set(every)) == end * args.global_batch
    same = all(seen.get(it) == ref_samples.get(it) for it in range(end))
    return every, once, same


def check_change(run_dir, version, end, world, ref_losses, got, ref_samples, args, say):
    """The three checks of the change that produced `version`, after the
    next phase trained to iteration `end`."""
    checks = [json.loads(p.read_text())
              for p in (run_dir / "checks").glob(f"load_it{version}_rank*.json")]
    elements = sum(c["elements"] for c in checks)
    bad = sum(c["mismatched"] for c in checks)
    identical = len(checks) == world and bad == 0
    after = [it for it in sorted(got) if version < it <= end]
    worst = max(abs(got[it] - ref_losses[it]) / max(1.0, abs(ref_losses[it])) for it in after)
    loss_ok = worst <= args.tolerance
    every, once, same = check_samples(run_dir, end, ref_samples, args)
    say(f"   check 1, state after reload: {elements} elements on {len(checks)} ranks, "
        f"{bad} differ -> {'bit-identical' if identical else 'MISMATCH'}")
    say(f"   check 2, loss: iteration {after[0]} {got[after[0]]:.6f} vs uninterrupted "
        f"{ref_losses[after[0]]:.6f}; largest relative difference over iterations "
        f"{after[0]}..{after[-1]}: {worst:.1e} (tolerance {args.tolerance:g}) -> "
        f"{'ok' if loss_ok else 'TOO LARGE'}")
    say(f"   check 3, samples: {len(every)} consumed in iterations 1..{end}, "
        f"{len(set(every))} distinct, {end * args.global_batch} expected, same as the "
        f"uninterrupted run: {'yes' if same else 'NO'} -> "
        f"{'exactly once' if once and same else 'WRONG'}")
    return {"elements_checked": elements, "elements_differing": bad, "bit_identical": identical,
            "max_relative_loss_difference": worst, "loss_ok": loss_ok,
            "samples_exactly_once": once and same, "ok": identical and loss_ok and once and same}


if __name__ == "__main__":
    sys.exit(main())
