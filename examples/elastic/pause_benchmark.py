"""Benchmark: how long a reconfiguration pauses the training job, ptc
against what users do today, side by side in the same run.

For each run, a job of >= 1 GiB of state (fp32 weights + Adam) trains one
iteration at --from, then every rank saves; the state moves to --to, and
new processes load it and train one iteration. The pause is from the save
request to the start of the first iteration in the new config, split into
save, reconfigure and load (the slowest rank of each):

  ptc:      save to ptcd (shared memory, until the version is committed)
            + ptcctl reconfigure + load from ptcd (zero-copy map, copied
            into the model and Adam state);
  baseline: every rank torch.saves its shards to disk (ext4, page cache,
            no fsync: the baseline's best case), and every new rank
            torch.loads the old shards it needs and re-slices them.

Restarting the processes (Python, torch import, gloo, building the model)
costs the same in both and is reported separately, not in the pause; so
is the first iteration, which shows the job goes on.

With --live, each run also measures the same change of a live job in the
same cluster (examples/elastic_live/train.py, processes started by ptc's
agent, ptc.torch.elastic, saving every step): from `ptcctl reconfigure
--after-save`, asked during the step after its second save committed, to the
first step in the new config, nothing restarted (the processes save at
their next step boundary, the store changes, they re-form their groups,
rebuild and load). The restart-based pauses are then also reported with
their restarts, as the job pays them: (1) restart + torch.save/torch.load,
(2) restart + ptc store, (3) live + ptc store; with --hot also (4) live +
hot switch (the processes move the state between themselves over their
process groups, following ptc's plan, and save the new layout's first
version; the target must run on the source's GPUs). (1) and (2) start at
a step boundary (their save); (3) and (4) are compared with (1) both from
the request (which adds the rest of the step in progress) and from the
step boundary at which the processes saw it (like for like).

With --live-only, each run measures (3) alone (no restarts, no baseline):
what two builds of ptc are compared by, alternating them.

With --prepare, the benchmark acts as a scheduler that knows the new
allocation as the job starts: it runs `ptcctl prepare --wait` then, while
the job trains, so that the target hosts (new ones included) have the
memory the change will stage ready; its time is reported, not counted in
the pause (the job is not paused by it).

    /usr/bin/python3 examples/elastic/pause_benchmark.py --runs 3
    /usr/bin/python3 examples/elastic/pause_benchmark.py --runs 3 --job moe
    /usr/bin/python3 examples/elastic/pause_benchmark.py --runs 3 --live --hot \
        --from tp=2,dp=2@host0,host1 --to tp=1,pp=2,dp=2@host0,host1
"""

import argparse
import json
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run as elastic  # noqa: E402

# Jobs of >= 1 GiB of state (fp32 parameters + Adam) and their changes.
BENCHMARKS = {
    "gpt": {"model": "layers=12,hidden=768,heads=12,ffn=3072,vocab=16384,positions=1024",
            "from": "tp=2,dp=2@host0,host1", "to": "tp=2,pp=2,dp=2@host0,host1,host2,host3"},
    "moe": {"model": "layers=5,hidden=512,heads=8,ffn=2048,experts=8,vocab=8192,positions=64",
            "from": "ep=2,dp=2@host0,host1", "to": "ep=4,dp=1@host0,host1"},
}


# Saves a live job makes before the change is asked (one every step).
LIVE_SAVES = 2


def events(run_dir):
    return [json.loads(p.read_text()) for p in (run_dir / "events").glob("*.json")]


def spare_counts(cluster):
    """(spares used, missed) by every ptcd's puts so far, and how many
    spares were refilled from memory just freed."""
    used = missed = refilled = 0
    for port in sorted(cluster.dir.glob("host*.port")):
        out = subprocess.run([str(cluster.bin / "tools/ptcctl"), "store", "stats", "--host",
                              f"127.0.0.1:{port.read_text().strip()}", "--json"],
                             capture_output=True, text=True, check=True).stdout
        counters = json.loads(out)["counters"]
        used += counters.get("ptc_store_spares_used_total", 0)
        missed += counters.get("ptc_store_spares_missed_total", 0)
        refilled += counters.get("ptc_store_spares_refilled_total", 0)
    return used, missed, refilled


def phase(args, cluster, run_dir, config, hosts, extra, job):
    t0 = time.time()
    args.job_name = job
    # Started here, not by `ptcctl run`: the restart's figures count from
    # the processes' own start, as they were published.
    elastic.run_phase(args, cluster, run_dir, config, elastic.world_size(config),
                      cluster.placement(job), extra, launcher="direct")
    return t0, events(run_dir)


def reform_parts(c):
    """Where the slowest process's time after the commit went: leaving the
    old process groups, meeting and forming the new ones, rebuilding the
    model, loading (empty if its record predates these marks)."""
    if "left" not in c or "met" not in c:
        return ""
    return (f" (leaving the old groups {c['left'] - c['committed']:.2f}, meeting and forming "
            f"{c['formed'] - c['left']:.2f}, rebuilding {c['built'] - c['formed']:.2f}, "
            f"loading {c['resumed'] - c['built']:.2f})")


def staging_parts(lv):
    """The live change's staging and verifying, as the coordinator timed
    them (empty if it recorded none)."""
    if lv.get("staging") is None:
        return ""
    return f" [staging {lv['staging']:.2f}, verifying {lv['verifying']:.2f}]"


def live_pause(args, cluster, work, run, layout, src, dst, hot=False):
    """The change src -> dst of a live job (with `hot`, asked as a hot
    switch): seconds from the request to the first step in the new config,
    from the step boundary that saw it, and the parts."""
    import live as live_job
    job = f"{'hot' if hot else 'live'}-{run}"
    (src_config, src_hosts), (dst_config, dst_hosts) = src, dst
    cluster.ptcctl("register", "--job", job, "--layout", str(layout), "--config", src_config,
                   "--hosts", src_hosts, "--auto", "on", "--live", capture=True)
    run_dir = work / job
    run_dir.mkdir(parents=True, exist_ok=True)
    agents = []
    env = dict(elastic.os.environ, PYTHONPATH=f"{args.bin}/client/python/pkg",
               OMP_NUM_THREADS="1", **cluster.job_env(job))
    hosts = sorted(set(src_hosts.split(",")) | set(dst_hosts.split(",")))
    for h in hosts:
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "ptc.agent", "--job", job, "--host", h, "--coordinator",
             cluster.coordinator, "--socket", cluster.socket(h), "--log-dir",
             str(run_dir / "logs"), "--", sys.executable,
             str(elastic.ROOT / "examples/elastic_live/train.py"), "--model", args.model,
             "--run-dir", str(run_dir), "--iterations", str(LIVE_SAVES + 2), "--save-every", "1",
             "--global-batch", str(args.global_batch)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True))
    spares_before = spare_counts(cluster)
    try:
        losses = run_dir / "losses.jsonl"
        deadline = time.time() + 900
        # A live job saves periodically (what a failure rolls back to, and
        # what a hot switch needs): the change is asked once it has saved
        # LIVE_SAVES times (its steady state: a version deleted after every
        # save), during the next step.
        while len(live_job.read_jsonl(losses)) < LIVE_SAVES or json.loads(cluster.ptcctl(
                "status", job, "--json", capture=True))["jobs"][0]["committed_version"] < \
                LIVE_SAVES:
            if time.time() > deadline:
                raise RuntimeError(f"the live job did not train and save (logs in {run_dir})")
            time.sleep(0.05)
        asked = time.time()
        cluster.ptcctl("reconfigure", "--job", job, "--to", dst_config, "--hosts", dst_hosts,
                       "--after-save", *(["--hot"] if hot else []), capture=True)
        # Every process that ran writes its record when it ends (the job
        # stops one step after the change; one that left writes its record
        # when it leaves).
        ended = max(elastic.world_size(dst_config), elastic.world_size(src_config))
        while len(live_job.read_jsonl(run_dir / "processes.jsonl")) < ended:
            if time.time() > deadline:
                raise RuntimeError(f"the live job did not end (logs in {run_dir})")
            time.sleep(0.1)
        procs = live_job.read_jsonl(run_dir / "processes.jsonl")
        changes = [c for p in procs for c in p["changes"]]
        if not changes:
            raise RuntimeError(f"the live job did not change (logs in {run_dir})")
        first = min(c["noticed"] for c in changes)
        resumed = max(c["resumed"] for c in changes)
        how = sorted({c["how"] for c in changes})
        if hot and how != ["hot switch"]:
            raise RuntimeError(f"the change asked as a hot switch went {how} (logs in {run_dir})")
        moved = max(c.get("moved", first) for c in changes)
        spares = [b - a for a, b in zip(spares_before, spare_counts(cluster))]
        # The store's change as the coordinator timed it (none for a hot
        # switch, whose state moved between the processes).
        status = json.loads(cluster.ptcctl("status", job, "--json", capture=True))["jobs"][0]
        stored = [c for c in [status["reconfiguration"], *status.get("recent_changes", [])]
                  if c.get("phase") == "committed" and c.get("staging_seconds", 0) > 0]
        last = max(stored, key=lambda c: c["plan_epoch"]) if stored else {}
        return {"spares_used": spares[0], "spares_missed": spares[1],
                "spares_refilled": spares[2],"pause": resumed - asked, "from_boundary": resumed - first, "how": how,
                "hot_exchange": moved - first if hot else None,
                "bytes_between_processes": max(c.get("bytes_between_processes", 0)
                                               for c in changes),
                "step_in_progress": first - asked,
                "save": max(c.get("saved", first) for c in changes) - (moved if hot else first),
                "change": max(c["committed"] for c in changes) -
                max(c.get("saved", first) for c in changes),
                "staging": last.get("staging_seconds"),
                "verifying": last.get("verifying_seconds"),
                "reform_and_load": resumed - max(c["committed"] for c in changes),
                "reform_parts": reform_parts(max(changes, key=lambda c: c["resumed"])),
                "processes": len(changes)}
    finally:
        for a in agents:
            if a.poll() is None:
                elastic.os.killpg(a.pid, signal.SIGTERM)
        for a in agents:
            a.wait()
        cluster.ptcctl("forget", job, capture=True)  # its GPUs and memory, for the next job


def stats(xs):
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", choices=sorted(BENCHMARKS), default="gpt")
    ap.add_argument("--model", help="the model's size (default: the job's, >= 1 GiB of state)")
    ap.add_argument("--from", dest="source", help="CONFIG@HOSTS before the change")
    ap.add_argument("--to", help="CONFIG@HOSTS after it")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--bin", default=str(elastic.ROOT / "bazel-bin"))
    ap.add_argument("--work-dir")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--periodic", action="store_true",
                    help="the job saves once before the measured save (both to ptc and with "
                    "torch.save), as a job that checkpoints periodically does")
    ap.add_argument("--gap", type=float, default=0.0,
                    help="with --periodic: seconds the job trains between that save and the "
                    "measured one (it idles for them), as between real checkpoints")
    ap.add_argument("--spare-pool",
                    help="each ptcd's --spare-pool (memory kept faulted in for the next saves "
                    "of the sizes it saw), e.g. 2GiB; default: ptcd's own")
    ap.add_argument("--hot", action="store_true",
                    help="with --live: also (4) the same change of a live job as a hot switch "
                         "(the processes move the state between themselves; the target's "
                         "GPUs must be the source's)")
    ap.add_argument("--live", action="store_true",
                    help="also the same change of a live job (no restarts), and every pause "
                    "with its restarts")
    ap.add_argument("--live-only", action="store_true",
                    help="only (3), the live job's change through the store (no restarts, no "
                    "baseline): to compare two builds of ptc side by side")
    ap.add_argument("--prepare", action="store_true",
                    help="as a scheduler that knows the new allocation: ptcctl prepare --wait "
                    "while the job trains, before the save request")
    args = ap.parse_args()
    args.bin = pathlib.Path(args.bin)
    bench = BENCHMARKS[args.job]
    if args.live_only and (args.hot or args.live or args.prepare or args.periodic):
        ap.error("--live-only measures (3) alone: without --hot, --live, --prepare or "
                 "--periodic")
    if args.hot and not args.live:
        ap.error("--hot measures a live job's hot switch: add --live")
    args.model = args.model or bench["model"]
    args.source = args.source or bench["from"]
    args.to = args.to or bench["to"]
    args.script = elastic.HERE.parent / elastic.JOBS[args.job]["script"]
    args.script_args = elastic.JOBS[args.job].get("args", [])
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="ptc-pause-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    layout = work / "layout.json"
    subprocess.run([sys.executable, str(args.script), "--config", args.source.split("@")[0],
                    "--model", args.model, *args.script_args, "--layout-out", str(layout)],
                   check=True,
                   env=dict(elastic.os.environ, PYTHONPATH=f"{args.bin}/client/python/pkg"))
    src_config, src_hosts = args.source.split("@")
    dst_config, dst_hosts = args.to.split("@")
    say = (lambda *a: None) if args.json else print
    rows = []
    for run in range(args.runs):
        # A fresh cluster per run: nothing of the previous run stays in memory.
        cluster = elastic.Cluster(args.bin, work / f"cluster-{run}", memory="8GiB",
                                  spare_pool=args.spare_pool)
        if args.live_only:
            try:
                lv = live_pause(args, cluster, work, run, layout, (src_config, src_hosts),
                                (dst_config, dst_hosts))
            finally:
                cluster.down()
            rows.append({"run": run, "live": lv})
            say(f"run {run + 1}: (3) live + ptc store {lv['pause']:.2f} s [waiting for the step "
                f"in progress {lv['step_in_progress']:.2f}, save {lv['save']:.2f}, change "
                f"{lv['change']:.2f}{staging_parts(lv)}, re-form + rebuild + load "
                f"{lv['reform_and_load']:.2f}{lv['reform_parts']}; {lv['from_boundary']:.2f} s "
                f"from the step boundary]")
            continue
        try:
            job = f"pause-{run}"
            out = cluster.ptcctl("register", "--job", job, "--layout", str(layout), "--config",
                                 src_config, "--hosts", src_hosts, capture=True)
            if run == 0:
                say(out.strip())
            state_bytes = next(j["state_bytes"] for j in json.loads(cluster.ptcctl(
                "jobs", "--json", capture=True))["jobs"] if j["job"] == job)
            ckpt = work / f"ckpt-{run}"
            prepared = {}
            if args.prepare:
                def prepare():
                    t = time.time()
                    try:
                        prepared.update(json.loads(cluster.ptcctl(
                            "prepare", "--job", job, "--to", dst_config, "--hosts", dst_hosts,
                            "--wait", "--json", capture=True)))
                    except Exception as e:  # reported below, the run goes on
                        prepared["error"] = str(e)
                    prepared["seconds"], prepared["done_at"] = time.time() - t, time.time()
                preparing = threading.Thread(target=prepare)
                preparing.start()
            _, ev = phase(args, cluster, work / f"a-{run}", src_config, src_hosts,
                          ["--save-at", "2" if args.periodic else "1", "--baseline-save",
                           str(ckpt)] + (["--save-every", "1", "--gap", str(args.gap)]
                                         if args.periodic else []), job)
            ptc_save = max(e["saved"] for e in ev) - min(e["save_start"] for e in ev)
            spares = spare_counts(cluster)  # over both saves with --periodic
            # Of the save: the slowest rank's own writes into ptcd, and how
            # far apart the ranks started (the rest is the commit).
            ptc_write = max(e["written"] - e["save_start"] for e in ev)
            save_skew = max(e["save_start"] for e in ev) - min(e["save_start"] for e in ev)
            base_save = max(e["baseline_save_seconds"] for e in ev)
            if args.prepare:
                preparing.join()
                if "error" in prepared:
                    raise RuntimeError(f"ptcctl prepare failed: {prepared['error']}")
                # Whether the memory was ready before the save request.
                prepared["before_save"] = prepared["done_at"] <= min(e["save_start"] for e in ev)
            t0 = time.time()
            report = json.loads(cluster.ptcctl("reconfigure", "--job", job, "--to", dst_config,
                                               "--hosts", dst_hosts, "--json", capture=True))
            reconf = time.time() - t0
            t0, ev = phase(args, cluster, work / f"b-{run}", dst_config, dst_hosts,
                           ["--load", "--stop-at", "3"], job)
            ptc_restart = max(e["loaded"] - e["load_seconds"] for e in ev) - t0
            ptc_load = max(e["load_seconds"] for e in ev)
            t0, ev = phase(args, cluster, work / f"c-{run}", dst_config, dst_hosts,
                           ["--baseline-load", str(ckpt), "--stop-at", "3"], job)
            base_restart = max(e["loaded"] - e["load_seconds"] for e in ev) - t0
            base_load = max(e["load_seconds"] for e in ev)
            ckpt_bytes = sum(p.stat().st_size for p in ckpt.glob("*.pt"))
            row = {"run": run, "state_bytes": state_bytes, "checkpoint_bytes": ckpt_bytes,
                   "ptc": {"save": ptc_save, "save_write": ptc_write, "save_skew": save_skew,
                           "spares_used": spares[0], "spares_missed": spares[1],
                           "reconfigure": reconf, "staging": report["staging_seconds"],
                           "verifying": report["verifying_seconds"], "load": ptc_load,
                           "pause": ptc_save + reconf + ptc_load, "restart": ptc_restart,
                           "plan": report["plan"],
                           "prepare": ({"seconds": prepared["seconds"],
                                        "bytes": prepared["bytes_prepared"],
                                        "needed": prepared["bytes_needed"],
                                        "before_save": prepared["before_save"]}
                                       if args.prepare else None)},
                   "baseline": {"save": base_save, "load": base_load,
                                "pause": base_save + base_load, "restart": base_restart}}
            row["speedup"] = row["baseline"]["pause"] / row["ptc"]["pause"]
            if args.live:
                cluster.ptcctl("forget", job, capture=True)  # its memory, for the live job
                row["live"] = live_pause(args, cluster, work, run, layout,
                                         (src_config, src_hosts), (dst_config, dst_hosts))
                row["with_restarts"] = {
                    "baseline": base_save + base_load + base_restart,
                    "ptc_restart": row["ptc"]["pause"] + ptc_restart,
                    "ptc_live": row["live"]["pause"]}
                w = row["with_restarts"]
                row["live_speedup"] = w["baseline"] / w["ptc_live"]
                # Like for like: (1) starts at a step boundary too.
                row["live_speedup_from_boundary"] = w["baseline"] / row["live"]["from_boundary"]
                if args.hot:
                    row["hot"] = live_pause(args, cluster, work, run, layout,
                                            (src_config, src_hosts), (dst_config, dst_hosts),
                                            hot=True)
                    w["ptc_hot"] = row["hot"]["pause"]
                    row["hot_speedup"] = w["baseline"] / w["ptc_hot"]
                    row["hot_speedup_from_boundary"] = (w["baseline"] /
                                                        row["hot"]["from_boundary"])
            rows.append(row)
            p, b = row["ptc"], row["baseline"]
            say(f"run {run + 1}: ptc pause {p['pause']:.2f} s (save {p['save']:.2f} [slowest rank's "
                f"writes {p['save_write']:.2f}, ranks started {p['save_skew']:.2f} apart, "
                f"{p['spares_used']} puts into ready memory, {p['spares_missed']} not] + reconfigure "
                f"{p['reconfigure']:.2f} [staging {p['staging']:.2f}, verifying "
                f"{p['verifying']:.2f}] + load {p['load']:.2f}); baseline pause "
                f"{b['pause']:.2f} s (torch.save {b['save']:.2f} + torch.load and re-slice "
                f"{b['load']:.2f}); ptc {row['speedup']:.2f}x shorter [restarts: "
                f"{p['restart']:.1f} / {b['restart']:.1f} s, not counted]"
                + (f" [prepared {p['prepare']['bytes'] / 2**30:.2f} of "
                   f"{p['prepare']['needed'] / 2**30:.2f} GiB in {p['prepare']['seconds']:.1f} s "
                   f"while training, {'before' if p['prepare']['before_save'] else 'NOT before'} "
                   f"the save request]" if p["prepare"] else ""))
            if args.live:
                lv, w = row["live"], row["with_restarts"]
                say(f"       with restarts: (1) restart + torch.save/load {w['baseline']:.2f} s, "
                    f"(2) restart + ptc store {w['ptc_restart']:.2f} s, (3) live + ptc store "
                    f"{w['ptc_live']:.2f} s [waiting for the step in progress "
                    f"{lv['step_in_progress']:.2f}, save {lv['save']:.2f}, change "
                    f"{lv['change']:.2f}{staging_parts(lv)}, re-form + rebuild + load "
                    f"{lv['reform_and_load']:.2f}"
                    f"{lv['reform_parts']}; "
                    f"{lv['from_boundary']:.2f} s from the step boundary; the job's puts: "
                    f"{lv['spares_used']} into ready memory ({lv['spares_refilled']} "
                    f"refilled as memory was freed), {lv['spares_missed']} not]; (3) is "
                    f"{row['live_speedup']:.2f}x shorter than (1) from the request, "
                    f"{row['live_speedup_from_boundary']:.2f}x from the step boundary")
            if args.hot:
                h = row["hot"]
                say(f"       (4) live + hot switch {h['pause']:.2f} s [waiting for the step in "
                    f"progress {h['step_in_progress']:.2f}, plan + exchange "
                    f"{h['hot_exchange']:.2f} ({h['bytes_between_processes'] / 2**20:.0f} MiB "
                    f"between processes), save + commit {h['save']:.2f}, re-form + rebuild + "
                    f"load {h['reform_and_load']:.2f}{h['reform_parts']}; "
                    f"{h['from_boundary']:.2f} s from the step "
                    f"boundary]; (4) is {row['hot_speedup']:.2f}x shorter than (1) from the "
                    f"request, {row['hot_speedup_from_boundary']:.2f}x from the step boundary")
        finally:
            cluster.down()
            shutil.rmtree(work / f"ckpt-{run}", ignore_errors=True)
    if args.live_only:
        summary = {"job": args.job, "model": args.model, "from": args.source, "to": args.to,
                   "runs": rows,
                   "live_from_boundary": stats([r["live"]["from_boundary"] for r in rows])}
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            x = summary["live_from_boundary"]
            print(f"\n{args.source} -> {args.to}: (3) live + ptc store median {x['median']:.2f} s "
                  f"(min {x['min']:.2f}, max {x['max']:.2f}) from the step boundary")
        return
    summary = {"job": args.job, "model": args.model, "from": args.source, "to": args.to,
               "periodic": args.periodic, "prepare": args.prepare, "runs": rows,
               "ptc_pause": stats([r["ptc"]["pause"] for r in rows]),
               "baseline_pause": stats([r["baseline"]["pause"] for r in rows]),
               "speedup": stats([r["speedup"] for r in rows])}
    if args.live:
        for k in ("baseline", "ptc_restart", "ptc_live"):
            summary[f"with_restarts_{k}"] = stats([r["with_restarts"][k] for r in rows])
        summary["live_from_boundary"] = stats([r["live"]["from_boundary"] for r in rows])
        summary["live_speedup"] = stats([r["live_speedup"] for r in rows])
        summary["live_speedup_from_boundary"] = stats(
            [r["live_speedup_from_boundary"] for r in rows])
    if args.hot:
        summary["with_restarts_ptc_hot"] = stats([r["with_restarts"]["ptc_hot"] for r in rows])
        summary["hot_from_boundary"] = stats([r["hot"]["from_boundary"] for r in rows])
        summary["hot_speedup"] = stats([r["hot_speedup"] for r in rows])
        summary["hot_speedup_from_boundary"] = stats(
            [r["hot_speedup_from_boundary"] for r in rows])
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        s, p, b = summary["speedup"], summary["ptc_pause"], summary["baseline_pause"]
        print(f"\n{args.source} -> {args.to}, job state {rows[0]['state_bytes'] / 2**30:.2f} "
              f"GiB{', saved periodically' if args.periodic else ', first save'}"
              f"{', memory prepared while training' if args.prepare else ''}; pause ptc "
              f"median "
              f"{p['median']:.2f} s (min {p['min']:.2f}, max {p['max']:.2f}), baseline median "
              f"{b['median']:.2f} s (min {b['min']:.2f}, max {b['max']:.2f}); ptc shorter by "
              f"{s['median']:.2f}x (min {s['min']:.2f}, max {s['max']:.2f})")
        if args.live:
            m = {k: summary[f"with_restarts_{k}"] for k in ("baseline", "ptc_restart", "ptc_live")}
            fmt = lambda x: f"median {x['median']:.2f} s (min {x['min']:.2f}, max {x['max']:.2f})"  # noqa
            ratio = lambda x: f"{x['median']:.2f}x (min {x['min']:.2f}, max {x['max']:.2f})"  # noqa
            print(f"with restarts: (1) restart + torch.save/load {fmt(m['baseline'])}; "
                  f"(2) restart + ptc store {fmt(m['ptc_restart'])}; (3) live + ptc store "
                  f"{fmt(m['ptc_live'])}, {fmt(summary['live_from_boundary'])} from the step "
                  f"boundary; (3) shorter than (1) by {ratio(summary['live_speedup'])} from the "
                  f"request, by {ratio(summary['live_speedup_from_boundary'])} from the step "
                  f"boundary")
            if args.hot:
                h = summary["with_restarts_ptc_hot"]
                print(f"(4) live + hot switch {fmt(h)}, {fmt(summary['hot_from_boundary'])} "
                      f"from the step boundary; (4) shorter than (1) by "
                      f"{ratio(summary['hot_speedup'])} from the request, by "
                      f"{ratio(summary['hot_speedup_from_boundary'])} from the step boundary")


if __name__ == "__main__":
    main()
