"""What the example training scripts share with their launcher (run.py):
the command line, the save request, the loss and sample logs, and the
bit-identity check of every reload. None of it is needed to use ptc; it is
how the launcher proves each change.

A script calls, in order:

    args = harness.parse(__doc__)            # --rank --config --job ... --load
    if args.layout_out: write the layout and return
    harness.init_dist(args, world_size)
    ... build, pt.load(...) when args.load, then harness.check_reload(...)
    while not harness.stop(args, iteration): train one step; harness.log_*(...)
    pt.save(...); harness.write_aside(...) before it; harness.finish(...)
"""

import argparse
import json
import os
import pathlib
import time

import numpy as np
import torch
import torch.distributed as dist

import ptc
import ptc.torch as pt


def parse(description, more=None):
    """The common command line; `more(parser)` adds a script's own flags."""
    ap = argparse.ArgumentParser(description=description)
    # Started by ptc's launcher (ptcctl run, the agent), a process finds its
    # rank, job, socket, GPU and master port in the environment, as under
    # torchrun; the flags override it.
    env = os.environ.get
    ap.add_argument("--rank", type=int, default=int(env("RANK", "0")))
    ap.add_argument("--config", required=True)
    ap.add_argument("--job", default=env("PTC_JOB", ""))
    ap.add_argument("--coordinator", default=env("PTC_COORDINATOR", ""))
    ap.add_argument("--socket", default=env("PTC_SOCKET"),
                    help="this rank's host's ptcd socket (none: no ptc)")
    ap.add_argument("--gpu", type=int, default=int(env("PTC_DEVICE", "-1")),
                    help="the GPU the job's placement gives this rank (its launcher's word)")
    ap.add_argument("--master-port", type=int, default=int(env("MASTER_PORT", "0")))
    ap.add_argument("--run-dir", default=".")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--model", default="", help="the model's size, as the script reads it")
    ap.add_argument("--stop-at", type=int, default=0, help="exit at this iteration, no save")
    ap.add_argument("--load", action="store_true", help="resume from the job's state in ptc")
    ap.add_argument("--check-dir", help="where the old ranks wrote their values aside")
    ap.add_argument("--save-check-dir", help="where to write this rank's values aside")
    ap.add_argument("--layout-out", help="write the job's layout spec here and exit")
    # For examples/elastic/pause_benchmark.py:
    ap.add_argument("--save-at", type=int, default=0, help="save and exit at this iteration")
    ap.add_argument("--save-every", type=int, default=0,
                    help="also save (and go on) every N iterations, as a job checkpointing "
                    "into ptc periodically would")
    ap.add_argument("--gap", type=float, default=0.0,
                    help="idle this many seconds after each periodic save")
    ap.add_argument("--baseline-save", help="also torch.save the shards here, timed")
    ap.add_argument("--baseline-load", help="load by torch.load and re-slicing the shards "
                    "saved here, instead of from ptc")
    if more:
        more(ap)
    args = ap.parse_args()
    args.run = pathlib.Path(args.run_dir)
    args.events = {"rank": args.rank, "config": args.config, "start": time.time()}
    return args


SAMPLES, SEQ = 4096, 32


def tokens(vocab, seed=7):
    """Synthetic token sequences [SAMPLES, SEQ + 1] from a fixed random
    bigram model, so that the loss can fall: each token picks its successor
    from 8 likely ones."""
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, vocab, size=(vocab, 8))
    data = np.empty((SAMPLES, SEQ + 1), dtype=np.int64)
    tok = rng.integers(0, vocab, size=SAMPLES)
    for j in range(SEQ + 1):
        data[:, j] = tok
        tok = succ[tok, rng.integers(0, 8, size=SAMPLES)]
    return torch.from_numpy(data)


def init_dist(args, world_size):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.master_port}",
                            rank=args.rank, world_size=world_size)


def stop(args, iteration):
    """(stop, save): whether the job stops before this iteration, and
    whether it saves then (the launcher asked, through RUN_DIR/save_request;
    rank 0 sees it and every rank agrees)."""
    want = torch.tensor([1 if args.rank == 0 and (args.run / "save_request").exists() else 0])
    dist.all_reduce(want, op=dist.ReduceOp.MAX)
    save = bool(want.item())
    return save or bool(args.stop_at and iteration >= args.stop_at), save


def log_samples(args, iteration, samples):
    """Sample ids one data-parallel rank read in `iteration` (0-based)."""
    path = args.run / "samples" / f"{args.config}_rank{args.rank}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(f"{iteration} {' '.join(map(str, samples))}\n")


def log_loss(args, iteration, loss):
    """The global batch's loss after `iteration` steps (one rank logs it)."""
    with open(args.run / "losses.jsonl", "a") as f:
        f.write(json.dumps({"iteration": iteration, "loss": float(loss),
                            "config": args.config, "time": time.time()}) + "\n")
    args.events.setdefault("first_step", time.time())


def _write_json(path, obj):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.rename(path)


def local_values(client, model, optimizer):
    """[(key, global box, value)] of every region this rank holds."""
    return [(r["key"], r["region"], v.clone())
            for r, v in pt.state_regions(client, model, optimizer)]


def overlaps(old, key, box):
    """(slices into `box`, slices into the old box, old value) for every
    old (key, box, value) that meets `box` of tensor `key`."""
    for okey, obox, data in old:
        if okey != key:
            continue
        inter = [(max(x[0], y[0]), min(x[1], y[1])) for x, y in zip(obox, box)]
        if any(b >= e for b, e in inter):
            continue
        yield (tuple(slice(b - o[0], e - o[0]) for (b, e), o in zip(inter, box)),
               tuple(slice(b - o[0], e - o[0]) for (b, e), o in zip(inter, obox)), data)


def write_aside(args, client, model, optimizer):
    """Before a save: this rank's values of every region, with torch.save,
    for the next phase's bit-identity check."""
    if not args.save_check_dir:
        return
    d = pathlib.Path(args.save_check_dir)
    d.mkdir(parents=True, exist_ok=True)
    torch.save(local_values(client, model, optimizer), d / f"rank{args.rank}.pt")


def _bits(t):
    """Floats as integers of their width: compared bit for bit."""
    if not t.is_floating_point():
        return t
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def check_reload(args, client, model, optimizer, iteration):
    """After a load: every element of every region this rank now holds
    equals, bit for bit, what an old rank held when it saved (assembled
    from however the old layout cut it)."""
    if not args.check_dir:
        return
    old = [v for f in sorted(pathlib.Path(args.check_dir).glob("rank*.pt"))
           for v in torch.load(f)]
    elements = mismatched = 0
    for key, box, got in local_values(client, model, optimizer):
        same = torch.zeros(got.shape, dtype=torch.bool)  # stays False where nothing covers
        for dst, src, data in overlaps(old, key, box):
            same[dst] = _bits(got[dst]) == _bits(data[src])
        elements += got.numel()
        mismatched += int((~same).sum())
    _write_json(args.run / "checks" / f"load_it{iteration}_rank{args.rank}.json",
                {"regions": len(client.regions), "elements": elements,
                 "mismatched": mismatched})


def timed_save(args, client, model, optimizer, scheduler, cursor, iteration, final):
    """pt.save with the timings the pause benchmark reads (and, with
    --baseline-save, the baseline's torch.save of the same shards)."""
    ev = {"save_start": time.time()}
    if final:
        write_aside(args, client, model, optimizer)
    saved = pt.save(client, model, optimizer, scheduler, extra={"cursor": cursor},
                    step=iteration, wait=False)
    ev["written"] = time.time()  # this rank's regions are in ptcd
    client.wait_committed(saved.version, timeout=120)
    ev["saved"] = time.time()
    ev["saved_version"] = saved.version
    if args.baseline_save:
        import baseline
        t0 = time.time()
        baseline.save(args.baseline_save, args.rank, client, model, optimizer,
                      {"iteration": iteration, "cursor": cursor.encode()})
        ev["baseline_save_seconds"] = time.time() - t0
    return ev


def baseline_resume(args, client, model, optimizer, scheduler):
    """--baseline-load: the state from torch.load and re-slicing; returns
    (iteration, cursor)."""
    import baseline
    t0 = time.time()
    extra = baseline.load(args.baseline_load, client, model, optimizer)
    iteration = extra["iteration"]
    scheduler.last_epoch = iteration - 1
    scheduler.step()
    args.events.update(loaded=time.time(), load_seconds=time.time() - t0)
    return iteration, ptc.DataCursor.decode(extra["cursor"])


def client(args):
    """This rank's ptc client. ptc refuses a rank started on another host
    than its placement's; the GPU is checked here."""
    if not args.socket:
        return None
    c = ptc.Client(socket=args.socket, coordinator=args.coordinator, job=args.job,
                   rank=args.rank)
    if args.gpu >= 0 and c.device != args.gpu:
        raise SystemExit(f"rank {args.rank} was started for GPU {args.gpu} but the job's "
                         f"placement gives it GPU {c.device} of {c.host}")
    args.events.update(host=c.host, device=c.device)
    return c


def finish(args, iteration, **timings):
    args.events.update(timings)
    args.events["iteration"] = iteration
    _write_json(args.run / "events" / f"{args.config}_rank{args.rank}.json", args.events)
    dist.barrier()
    dist.destroy_process_group()
