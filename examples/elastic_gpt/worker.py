"""One rank of the elastic GPT training job (started by run.py).

Trains with tp/pp/dp from --config, reads samples through ptc's data
cursor, and at the end of its phase (--save-at, or when the launcher
writes RUN_DIR/save_request) saves its parameters, Adam state, RNG states,
iteration, LR schedule and cursor to ptc and exits. Started with --load, it
first loads all of that from the committed version for its rank of the new
config and checks it bit for bit against what the old ranks wrote aside.
"""

import argparse
import json
import pathlib
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import gpt

try:
    import ptc
    from ptc import torch_state
except ImportError as e:  # pragma: no cover - printed for people
    sys.exit(f"cannot import ptc ({e}); run through run.py or set PYTHONPATH to "
             "bazel-bin/client/python/pkg")

LR, WARMUP = 3e-3, 4


def lr_at(iteration):
    return LR * min(1.0, (iteration + 1) / WARMUP)


class Groups:
    """Megatron's process groups, created in the same order on every rank."""

    def __init__(self, cfg, rank):
        self.pp_i, self.dp_i, self.tp_i = cfg.coord_of(rank)
        self.tp = self.dp = self.embedding = None
        for pp in range(cfg.pp):
            for dp in range(cfg.dp):
                ranks = [cfg.rank_of(pp, dp, t) for t in range(cfg.tp)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    self.tp = g
        for pp in range(cfg.pp):
            for tp in range(cfg.tp):
                ranks = [cfg.rank_of(pp, d, tp) for d in range(cfg.dp)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    self.dp = g
        if cfg.pp > 1:
            for dp in range(cfg.dp):
                for tp in range(cfg.tp):
                    ranks = [cfg.rank_of(0, dp, tp), cfg.rank_of(cfg.pp - 1, dp, tp)]
                    g = dist.new_group(ranks)
                    if rank in ranks:
                        self.embedding = g


def write_json(path, obj):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.rename(path)


def boxes_overlap(a, b):
    return [(max(x[0], y[0]), min(x[1], y[1])) for x, y in zip(a, b)]


def torch_save_shards(directory, rank, regions, tensors, extra=None):
    """What users do today: every rank torch.saves its shards (with where
    they sit in the global tensors) to a checkpoint directory."""
    by_key = torch_state.regions_by_key(regions)
    shards = [(r["key"], r["region"],
               tensors[r["key"]][torch_state.local_slices(
                   r["region"], tensors[r["key"]].shape, by_key[r["key"]])].clone())
              for r in regions]
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({"shards": shards, "extra": extra or {}}, directory / f"rank{rank}.pt")
    # An index (like Megatron's per-rank file names), so that a new rank
    # opens only the files it needs.
    write_json(directory / f"rank{rank}.index.json",
               [(r["key"], r["region"]) for r in regions])


def torch_load_resliced(directory, regions):
    """The other half of today's path: a new rank torch.loads the old ranks'
    files and re-slices them into its own regions (as checkpoint conversion
    does). Returns ({region index: tensor}, {region index: covered mask},
    the extra objects of old rank 0)."""
    directory = pathlib.Path(directory)
    # For every old (tensor, region) that meets one of ours, the first file
    # holding it (data-parallel replicas hold the same ones).
    holder = {}
    for index in sorted(directory.glob("rank*.index.json")):
        for key, region in json.loads(index.read_text()):
            holder.setdefault((key, json.dumps(region)), index.name.split(".")[0] + ".pt")
    needed = set()
    for r in regions:
        for (key, region), f in holder.items():
            inter = boxes_overlap(json.loads(region), r["region"])
            if key == r["key"] and all(b < e for b, e in inter):
                needed.add(f)
    old = [torch.load(directory / f) for f in sorted(needed)]
    out, covered = {}, {}
    for r in regions:
        shape = [e - b for b, e in r["region"]]
        want = torch.zeros(shape, dtype=torch_state.torch_dtype(r["dtype"]))
        mask = torch.zeros(shape, dtype=torch.bool)
        for saved in old:
            for key, region, data in saved["shards"]:
                if key != r["key"]:
                    continue
                inter = boxes_overlap(region, r["region"])
                if any(b >= e for b, e in inter):
                    continue
                dst = tuple(slice(b - o[0], e - o[0]) for (b, e), o in zip(inter, r["region"]))
                src = tuple(slice(b - o[0], e - o[0]) for (b, e), o in zip(inter, region))
                want[dst] = data[src]
                mask[dst] = True
        out[r["index"]], covered[r["index"]] = want, mask
    extra = old[0]["extra"] if old else {}
    return out, covered, extra


def check_against_saved(client, state, check_dir):
    """Compares every loaded region with the values the old ranks wrote aside
    (torch.save) before saving to ptc: bit for bit, assembled from however
    the old layout sliced them."""
    want, covered, _ = torch_load_resliced(check_dir, client.regions)
    elements = mismatched = 0
    for r in client.regions:
        got = torch_state.region_tensor(state, r["index"], r["dtype"])
        w = want[r["index"]]
        elements += got.numel()
        same = covered[r["index"]] & (w.view(torch.int32) == got.view(torch.int32))
        mismatched += int((~same).sum())
    return {"regions": len(client.regions), "elements": elements, "mismatched": mismatched}


def save_state(args, client, params, opt, iteration, cursor, tp_rng, final):
    """Saves this rank's state to ptc (and, for the benchmark, with
    torch.save); returns the timings."""
    ev = {"save_start": time.time()}
    tensors = torch_state.collect(params, opt)
    if final and args.save_check_dir:  # the values aside, for the bit-identity check
        torch_save_shards(args.save_check_dir, args.rank, client.regions, tensors)
    small = {
        "iteration": str(iteration).encode(),
        "lr_scheduler": json.dumps({"base_lr": LR, "warmup": WARMUP}).encode(),
        "data_cursor": cursor.encode(),
        "rng.default": torch.get_rng_state().numpy().tobytes(),
        "rng.model_parallel": tp_rng.get_state().numpy().tobytes(),
    }
    # ptc numbers the version; the iteration is the save's step.
    version = torch_state.save(client, iteration, tensors, small)
    ev["written"] = time.time()  # this rank's regions are in ptcd
    client.wait_committed(version, timeout=120)
    ev["saved"] = time.time()
    ev["saved_version"] = version
    if args.baseline_save:
        t0 = time.time()
        torch_save_shards(args.baseline_save, args.rank, client.regions, tensors,
                          {"iteration": iteration, "data_cursor": cursor.encode()})
        ev["baseline_save_seconds"] = time.time() - t0
    return ev


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--socket", help="this rank's host's ptcd socket (none: no ptc)")
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--save-at", type=int, default=0, help="save and exit at this iteration")
    ap.add_argument("--stop-at", type=int, default=0, help="exit at this iteration, no save")
    ap.add_argument("--save-every", type=int, default=0,
                    help="also save (and go on) every N iterations, as a job checkpointing "
                    "into ptc periodically would")
    ap.add_argument("--gap", type=float, default=0.0,
                    help="benchmark: idle this many seconds after each periodic save, standing "
                    "in for the training between checkpoints")
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--check-dir", help="where the old ranks wrote their values aside (load)")
    ap.add_argument("--save-check-dir", help="where to write this rank's values aside (save)")
    ap.add_argument("--baseline-save", help="benchmark: also torch.save the shards here, timed")
    ap.add_argument("--baseline-load", help="benchmark: load by torch.load and re-slicing the "
                    "shards saved here, instead of from ptc")
    args = ap.parse_args()

    torch.set_num_threads(1)
    run = pathlib.Path(args.run_dir)
    cfg = ptc.ParallelConfig.parse(args.config)
    arch = gpt.Arch(args.model)
    events = {"rank": args.rank, "config": args.config, "start": time.time()}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.master_port}",
                            rank=args.rank, world_size=cfg.world_size)
    groups = Groups(cfg, args.rank)
    pp_i, dp_i, tp_i = groups.pp_i, groups.dp_i, groups.tp_i
    first, last = pp_i == 0, pp_i == cfg.pp - 1
    first_layer, n_layers = cfg.stage_layers(pp_i, arch.layers)
    stage = gpt.Stage(arch, cfg.tp, tp_i, first_layer, n_layers, first, last, groups.tp,
                      args.seed)
    params = stage.ptc_params()
    opt = torch.optim.Adam(list(params.values()), lr=LR, eps=1e-8)
    data = np.load(args.data, mmap_mode="r")
    seq = data.shape[1] - 1
    tp_rng = torch.Generator()
    tp_rng.manual_seed(args.seed + tp_i)

    client = None
    if args.socket:
        client = ptc.Client(socket=args.socket, coordinator=args.coordinator, job=args.job,
                            rank=args.rank)
    if args.baseline_load:
        t0 = time.time()
        torch_state.prepare_adam(params, opt, 0)
        tensors = torch_state.collect(params, opt)
        shards, _, extra = torch_load_resliced(args.baseline_load, client.regions)
        by_key = torch_state.regions_by_key(client)
        with torch.no_grad():
            for r in client.regions:
                t = tensors[r["key"]]
                t[torch_state.local_slices(r["region"], t.shape, by_key[r["key"]])].copy_(
                    shards[r["index"]])
        iteration = extra["iteration"]
        for p in params.values():
            opt.state[p]["step"] = torch.tensor(float(iteration))
        cursor = ptc.DataCursor.decode(extra["data_cursor"])
        events["loaded"] = time.time()
        events["load_seconds"] = events["loaded"] - t0
    elif args.load:
        t0 = time.time()
        torch_state.prepare_adam(params, opt, 0)
        state = torch_state.load(client, torch_state.collect(params, opt))
        iteration = int(state.small_object("iteration").decode())
        for p in params.values():
            opt.state[p]["step"] = torch.tensor(float(iteration))
        cursor = ptc.DataCursor.decode(state.small_object("data_cursor"))
        sched = json.loads(state.small_object("lr_scheduler").decode())
        assert sched["warmup"] == WARMUP and sched["base_lr"] == LR, sched
        # A rank whose coordinates are new gets a fresh seed from ptc, not a
        # copy of another rank's generator (its dropout masks must differ).
        for name, set_state, seed_with in (
                ("rng.default", torch.set_rng_state, torch.manual_seed),
                ("rng.model_parallel", tp_rng.set_state, tp_rng.manual_seed)):
            raw = state.small_object(name)
            seed = ptc.derived_seed(raw)
            if seed is None:
                set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
            else:
                seed_with(seed)
        events["loaded"] = time.time()
        events["load_seconds"] = events["loaded"] - t0
        events["loaded_version"] = state.version
        if args.check_dir:
            write_json(run / "checks" / f"load_it{iteration}_rank{args.rank}.json",
                       check_against_saved(client, state, args.check_dir))
        del state
    else:
        iteration = 0
        cursor = ptc.DataCursor(seed=args.seed, dataset_size=data.shape[0],
                                global_batch=args.global_batch)

    M = args.micro_batches
    prev = cfg.rank_of(pp_i - 1, dp_i, tp_i) if not first else None
    nxt = cfg.rank_of(pp_i + 1, dp_i, tp_i) if not last else None
    sample_log = open(run / "samples" / f"{args.config}_rank{args.rank}.txt", "a") \
        if (first and tp_i == 0) else None
    loss_log = open(run / "losses.jsonl", "a") if (last and tp_i == 0 and dp_i == 0) else None

    while True:
        # Save on request: rank 0 sees the launcher's file, everyone agrees.
        want_save = torch.tensor([1 if args.save_at and iteration == args.save_at else 0])
        if args.rank == 0 and (run / "save_request").exists():
            want_save[0] = 1
        dist.all_reduce(want_save, op=dist.ReduceOp.MAX)
        saving = bool(want_save.item())
        if saving or (args.stop_at and iteration >= args.stop_at):
            break

        samples = cursor.next_samples(dp_i, cfg.dp)
        batch = torch.from_numpy(np.asarray(data[sorted(samples)], dtype=np.int64))
        if sample_log:
            sample_log.write(f"{iteration} {' '.join(map(str, samples))}\n")
            sample_log.flush()
        micro = batch.chunk(M)
        for group in opt.param_groups:
            group["lr"] = lr_at(iteration)
        opt.zero_grad(set_to_none=False)
        ins, outs, total = [], [], torch.zeros(1)
        b = micro[0].shape[0]
        for mb in micro:  # forward, GPipe
            if first:
                x = mb[:, :-1]
            else:
                x = torch.empty(b, seq, arch.hidden)
                dist.recv(x, prev)
                x.requires_grad_()
            y = stage(x)
            if last:
                y = stage.loss(y, mb[:, 1:]) / M
                total += y.detach()
            else:
                dist.send(y.detach().contiguous(), nxt)
            ins.append(x)
            outs.append(y)
        for x, y in zip(ins, outs):  # backward, same order
            if last:
                y.backward()
            else:
                g = torch.empty_like(y)
                dist.recv(g, nxt)
                y.backward(g)
            if not first:
                dist.send(x.grad.contiguous(), prev)
        if groups.embedding is not None and "embedding.word.weight" in params:
            dist.all_reduce(params["embedding.word.weight"].grad, group=groups.embedding)
        if cfg.dp > 1:
            grads = [p.grad for p in params.values()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=groups.dp)
            flat /= cfg.dp
            off = 0
            for g in grads:
                g.copy_(flat[off:off + g.numel()].view_as(g))
                off += g.numel()
            if last:
                dist.all_reduce(total, group=groups.dp)
                total /= cfg.dp
        opt.step()
        cursor.advance()
        iteration += 1
        if loss_log:
            loss_log.write(json.dumps({"iteration": iteration, "loss": total.item(),
                                       "config": args.config, "time": time.time()}) + "\n")
            loss_log.flush()
        if "first_step" not in events:
            events["first_step"] = time.time()
        if (args.save_every and iteration % args.save_every == 0 and
                iteration != args.save_at and client is not None):
            events.setdefault("periodic_saves", []).append(
                save_state(args, client, params, opt, iteration, cursor, tp_rng, final=False))
            time.sleep(args.gap)

    events["iteration"] = iteration
    if saving:
        events.update(save_state(args, client, params, opt, iteration, cursor, tp_rng,
                                 final=True))
    write_json(run / "events" / f"{args.config}_rank{args.rank}.json", events)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
