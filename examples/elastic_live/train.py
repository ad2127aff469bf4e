"""One process of the live GPT job: started once per GPU by ptc's agent
(python3 -m ptc.agent), it trains through every change of the job's
parallelism without restarting (ptc.torch.elastic). The model, the
Megatron-style tp/pp/dp step and the data are examples/elastic_gpt's; the
lines marked `# ptc` are what live training asks of the script.

The launcher (examples/elastic/live.py) reads what it writes under
--run-dir: the loss of every iteration, the samples each data-parallel
rank read, each process's changes (with its PID), and, with --check, the
values of every save and the comparison of every load with them.
"""

import argparse
import json
import os
import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "elastic_gpt"))
sys.path.insert(0, str(HERE.parent / "elastic"))
import gpt  # noqa: E402
import harness  # noqa: E402
from megatron import Groups, train_step  # noqa: E402

import ptc  # noqa: E402  # ptc
import ptc.torch as pt  # noqa: E402  # ptc

LR, WARMUP = 3e-3, 4


def parse():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--iterations", type=int, required=True, help="stop after this many")
    ap.add_argument("--save-every", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--check", action="store_true",
                    help="write every save's values aside and compare every load with them")
    ap.add_argument("--step-seconds", type=float, default=0.0,
                    help="sleep this long in every step (a slower job, for tests)")
    ap.add_argument("--hold-save", metavar="ITERATION:HOST", action="append", default=[],
                    help="a test fault: the processes on HOST (*: every host) hold their "
                         "save of ITERATION, once begun, until RUN_DIR/held-ITERATION/release "
                         "exists (the others save meanwhile); once per iteration, and it may "
                         "be given again")
    return ap.parse_args()


def append(path, record):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def main():
    args = parse()
    run = pathlib.Path(args.run_dir)
    arch = gpt.Arch(args.model)
    data = harness.tokens(arch.vocab)
    torch.set_num_threads(1)

    def build(live):  # ptc: the modules for live.rank of live.config
        cfg = live.config
        groups = Groups(cfg, live.rank)
        first, n = cfg.stage_layers(groups.pp_i, arch.layers)
        stage = gpt.Stage(arch, cfg.tp, groups.tp_i, first, n, groups.pp_i == 0,
                          groups.pp_i == cfg.pp - 1, groups.tp, args.seed,
                          init=not live.restoring)  # ptc: a load overwrites every parameter
        opt = torch.optim.Adam(stage.parameters(), lr=LR, eps=1e-8)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: min(1.0, (it + 1) / WARMUP))
        live.groups = groups
        cursor = ptc.DataCursor(seed=args.seed, dataset_size=harness.SAMPLES,
                                global_batch=args.global_batch)
        return {"model": stage, "optimizer": opt, "scheduler": sched,
                "extra": {"cursor": cursor}}

    holds = {int(it): host for it, _, host in (h.partition(":") for h in args.hold_save)}

    def hold_save(live):
        """Announces this save under RUN_DIR/held-ITERATION; on the held
        host, waits for the release (once)."""
        if live.iteration not in holds:
            return
        held = run / f"held-{live.iteration}"
        held.mkdir(parents=True, exist_ok=True)
        (held / f"rank{live.rank}").write_text(live.host)
        if holds[live.iteration] not in (live.host, "*"):
            return
        del holds[live.iteration]
        deadline = time.time() + 120
        while not (held / "release").exists() and time.time() < deadline:
            time.sleep(0.01)

    def on_save(live):  # the values of this save, for the next load's check
        hold_save(live)
        live.extra["saved_under"] = live.layout_epoch
        if args.check:
            d = run / "aside" / f"it{live.iteration}_e{live.layout_epoch}"
            d.mkdir(parents=True, exist_ok=True)
            torch.save(harness.local_values(live.client, live.model, live.optimizer),
                       d / f"rank{live.rank}.pt")

    def on_load(live):  # every element equals what the saving ranks held
        if not args.check:
            return
        d = run / "aside" / f"it{live.iteration}_e{live.extra['saved_under']}"
        old = [v for f in sorted(d.glob("rank*.pt")) for v in torch.load(f)]
        elements = mismatched = 0
        for key, box, got in harness.local_values(live.client, live.model, live.optimizer):
            same = torch.zeros(got.shape, dtype=torch.bool)
            for dst, src, value in harness.overlaps(old, key, box):
                same[dst] = harness._bits(got[dst]) == harness._bits(value[src])
            elements += got.numel()
            mismatched += int((~same).sum())
        append(run / "checks.jsonl", {"layout_epoch": live.layout_epoch, "rank": live.rank,
                                      "iteration": live.iteration, "from": str(d.name),
                                      "files": len(list(d.glob("rank*.pt"))),
                                      "elements": elements, "mismatched": mismatched})

    live = pt.elastic(build, save_every=args.save_every, on_save=on_save,  # ptc
                      on_load=on_load)
    for live in live:  # ptc
        if live.iteration >= args.iterations:
            break
        # (The process groups are reached through live, not kept in this
        # frame: a failed layout's connections close when live drops them.)
        cursor = live.extra["cursor"]  # ptc
        samples = cursor.next_samples(live.groups.dp_i, live.config.dp)  # ptc
        with live.step():  # ptc: a peer that dies ends the step
            loss = train_step(live.config, live.groups, live.model, live.optimizer,
                              live.scheduler, data[sorted(samples)], harness.SEQ,
                              args.micro_batches, tied="embedding.word.weight")
            cursor.advance()  # ptc
            time.sleep(args.step_seconds)
            it = live.iteration + 1  # the step just done
            at = (live.groups.pp_i, live.groups.tp_i, live.groups.dp_i)
            if at[0] == 0 and at[1] == 0:
                append(run / "samples.jsonl", {"iteration": it - 1, "epoch": live.layout_epoch,
                                               "dp": at[2], "ids": sorted(samples)})
            if live.model.last and at[1] == 0 and at[2] == 0:
                append(run / "losses.jsonl", {"iteration": it, "loss": float(loss),
                                              "epoch": live.layout_epoch,
                                              "config": str(live.config),
                                              "time": time.time(), "pid": os.getpid()})
    append(run / "processes.jsonl", {"pid": os.getpid(), "host": live.host,
                                     "device": live.device, "iteration": live.iteration,
                                     "rank": live.rank, "changes": live.changes})


if __name__ == "__main__":
    main()
