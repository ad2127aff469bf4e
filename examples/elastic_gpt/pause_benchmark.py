"""Benchmark: how long a reconfiguration pauses the training job, ptc
against what users do today, side by side in the same run.

For each run, a job of >= 1 GiB of state (fp32 weights + Adam) trains one
iteration at --from, then every rank saves; the state moves to --to, and
new processes load it and train one iteration. The pause is from the save
request to the end of the first iteration in the new config:

  ptc:      save to ptcd (shared memory) + ptcctl reconfigure + restart,
            load from ptcd (zero-copy map, copy into the model) + 1st step;
  baseline: every rank torch.saves its shards to disk (ext4, page cache,
            no fsync: the baseline's best case) + restart, every new rank
            torch.loads the old shards it needs and re-slices them + 1st step.

Process restarts (Python, torch import, gloo init) are in both pauses.

    /usr/bin/python3 examples/elastic_gpt/pause_benchmark.py --runs 3
"""

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run as elastic  # noqa: E402

MODEL = ("gpt:layers=12,hidden=768,heads=12,ffn=3072,vocab=16384,positions=1024,"
         "dtype=fp32")


def events(run_dir):
    return [json.loads(p.read_text()) for p in (run_dir / "events").glob("*.json")]


def phase(args, cluster, run_dir, config, hosts, extra, job):
    world = 1
    for kv in config.split(","):
        k, v = kv.split("=")
        world *= int(v) if k in ("tp", "pp", "dp") else 1
    t0 = time.time()
    elastic.run_phase(args, cluster, run_dir, config, world, cluster.rank_hosts(job), extra,
                      job=job)
    return t0, events(run_dir)


def stats(xs):
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--from", dest="source", default="tp=2,dp=2@host0,host1")
    ap.add_argument("--to", default="tp=2,pp=2,dp=2@host0,host1,host2,host3")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--bin", default=str(elastic.ROOT / "bazel-bin"))
    ap.add_argument("--work-dir")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.bin = pathlib.Path(args.bin)
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="ptc-pause-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    args.data = work / "tokens.npy"
    elastic.make_dataset(args.data, samples=4096, seq=32, vocab=500)
    src_config, src_hosts = args.source.split("@")
    dst_config, dst_hosts = args.to.split("@")
    say = (lambda *a: None) if args.json else print
    cluster = elastic.Cluster(args.bin, work, memory="8GiB")
    rows = []
    try:
        for run in range(args.runs):
            job = f"pause-{run}"
            out = cluster.ptcctl("register", "--job", job, "--model", args.model, "--config",
                                 src_config, "--hosts", src_hosts, capture=True)
            if run == 0:
                say(out.strip())
            ckpt = work / f"ckpt-{run}"
            _, ev = phase(args, cluster, work / f"a-{run}", src_config, src_hosts,
                          ["--save-at", "1", "--baseline-save", str(ckpt)], job)
            ptc_save = max(e["saved"] for e in ev) - min(e["save_start"] for e in ev)
            base_save = max(e["baseline_save_seconds"] for e in ev)
            t0 = time.time()
            report = json.loads(cluster.ptcctl("reconfigure", "--job", job, "--to", dst_config,
                                               "--hosts", dst_hosts, "--json", capture=True))
            reconf = time.time() - t0
            t0, ev = phase(args, cluster, work / f"b-{run}", dst_config, dst_hosts,
                           ["--load", "--stop-at", "2"], job)
            ptc_resume = max(e["first_step"] for e in ev) - t0
            ptc_load = max(e["load_seconds"] for e in ev)
            t0, ev = phase(args, cluster, work / f"c-{run}", dst_config, dst_hosts,
                           ["--baseline-load", str(ckpt), "--stop-at", "2"], job)
            base_resume = max(e["first_step"] for e in ev) - t0
            base_load = max(e["load_seconds"] for e in ev)
            ckpt_bytes = sum(p.stat().st_size for p in ckpt.glob("*.pt"))
            row = {"run": run, "state_bytes": report["plan"]["target_bytes"],
                   "checkpoint_bytes": ckpt_bytes,
                   "ptc": {"save": ptc_save, "reconfigure": reconf, "load": ptc_load,
                           "restart_load_first_step": ptc_resume,
                           "pause": ptc_save + reconf + ptc_resume,
                           "cross_host_bytes": report["plan"]["cross_host_bytes"]},
                   "baseline": {"save": base_save, "load": base_load,
                                "restart_load_first_step": base_resume,
                                "pause": base_save + base_resume}}
            row["speedup"] = row["baseline"]["pause"] / row["ptc"]["pause"]
            rows.append(row)
            p, b = row["ptc"], row["baseline"]
            say(f"run {run + 1}: ptc pause {p['pause']:.2f} s (save {p['save']:.2f}, reconfigure "
                f"{p['reconfigure']:.2f}, restart+load+step {p['restart_load_first_step']:.2f}, "
                f"of which load {p['load']:.2f}); baseline pause {b['pause']:.2f} s (torch.save "
                f"{b['save']:.2f}, restart+load+step {b['restart_load_first_step']:.2f}, of which "
                f"torch.load+re-slice {b['load']:.2f}); ptc {row['speedup']:.2f}x shorter")
    finally:
        cluster.down()
    summary = {"model": args.model, "from": args.source, "to": args.to, "runs": rows,
               "ptc_pause": stats([r["ptc"]["pause"] for r in rows]),
               "baseline_pause": stats([r["baseline"]["pause"] for r in rows]),
               "speedup": stats([r["speedup"] for r in rows])}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        s, p, b = summary["speedup"], summary["ptc_pause"], summary["baseline_pause"]
        print(f"\nstate {rows[0]['state_bytes'] / 2**30:.2f} GiB; pause ptc median "
              f"{p['median']:.2f} s (min {p['min']:.2f}, max {p['max']:.2f}), baseline median "
              f"{b['median']:.2f} s (min {b['min']:.2f}, max {b['max']:.2f}); ptc shorter by "
              f"{s['median']:.2f}x (min {s['min']:.2f}, max {s['max']:.2f})")


if __name__ == "__main__":
    main()
