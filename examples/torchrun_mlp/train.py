"""A restart-style training script, written as for torchrun, that keeps its
state in ptc: it reads RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT
from the environment, loads the job's committed version when there is one,
trains an MLP under data parallelism and saves to ptc every --save-every
steps. The lines marked `# ptc` are all it takes.

Launched by ptc (one command on a machine; the agent under systemd on a
cluster), which starts it again in the new layout after every change:

    ptcctl register --job mlp --layout mlp.json --config dp=2 --hosts host0
    ptcctl run --job mlp -- python3 examples/torchrun_mlp/train.py --steps 200
    ptcctl reconfigure --job mlp --to dp=4 --hosts host0,host1   (meanwhile)

The layout file comes from the script itself: `train.py --layout-out
mlp.json`. It trains until the job's step reaches --steps, or until the
file --stop-file names exists (then it saves first). With --record DIR each
rank appends what it did (its environment, loads and saves with a digest
of the parameters) to DIR/rank<R>.jsonl, for tests.
"""

import argparse
import hashlib
import json
import os
import pathlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ptc  # ptc
import ptc.torch as pt  # ptc

DIM, HIDDEN, CLASSES, SAMPLES, BATCH = 16, 64, 4, 4096, 32


def model_and_optimizer(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.GELU(),
                                torch.nn.Linear(HIDDEN, CLASSES))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="train until the job's step is this")
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--step-seconds", type=float, default=0.0,
                    help="sleep this long per step (a stand-in for real work)")
    ap.add_argument("--stop-file", help="save and end once this file exists")
    ap.add_argument("--fail-rank", type=int, default=-1,
                    help="this rank exits with status 3 after its first step (tests)")
    ap.add_argument("--record", help="append what each rank did to DIR/rank<R>.jsonl")
    ap.add_argument("--layout-out", help="write the job's layout spec here and exit")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    model, opt = model_and_optimizer(args.seed)
    if args.layout_out:
        return pt.Layout(model, optimizer=opt).write(args.layout_out)  # ptc

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")  # MASTER_ADDR, MASTER_PORT
    client = ptc.Client(socket=os.environ["PTC_SOCKET"],  # ptc
                        coordinator=os.environ["PTC_COORDINATOR"],
                        job=os.environ["PTC_JOB"], rank=rank)
    record = None
    if args.record:
        path = pathlib.Path(args.record) / f"rank{rank}.jsonl"
        record = open(path, "a")

    def note(**what):
        if record:
            record.write(json.dumps(dict(what, rank=rank, world=world, pid=os.getpid())) + "\n")
            record.flush()

    note(event="start", env={k: os.environ.get(k) for k in (
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RUN_ID", "PTC_DEVICE", "PTC_HOST", "PTC_LAYOUT_EPOCH")})
    step = 0
    if client.committed_version > 0:  # ptc: resume from the job's state
        step = pt.load(client, model, opt).step  # ptc
        note(event="load", step=step, digest=digest(model))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(SAMPLES, DIM, generator=g)
    y = (x @ torch.randn(DIM, CLASSES, generator=g)).argmax(dim=1)
    while step < args.steps:
        stop = torch.tensor([1 if args.stop_file and os.path.exists(args.stop_file) else 0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if stop.item():
            break
        ids = torch.arange(BATCH) + (step * BATCH * world + rank * BATCH) % (SAMPLES - BATCH)
        loss = F.cross_entropy(model(x[ids]), y[ids])
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        step += 1
        if rank == args.fail_rank:
            note(event="fail", step=step)
            raise SystemExit(3)
        if step % args.save_every == 0:
            note(event="saving", step=step, digest=digest(model))
            pt.save(client, model, opt, step=step)  # ptc
            note(event="save", step=step)
        time.sleep(args.step_seconds)
    if step % args.save_every != 0:
        note(event="saving", step=step, digest=digest(model))
        pt.save(client, model, opt, step=step)  # ptc
        note(event="save", step=step)
    note(event="end", step=step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
