"""One rank of the elastic GPT training job (started by examples/elastic/run.py).

Trains with tp/pp/dp from --config (Megatron-style tensor parallelism,
GPipe pipeline, data parallelism, Adam with a warm-up schedule; with
--zero, Adam's state sharded over dp by a flat-buffer distributed
optimizer as Megatron-core's), reads
samples through ptc's data cursor, and when the launcher asks, saves its
whole state to ptc with ptc.torch and exits. Started with --load, it
resumes from the job's state for its rank of the new config. The lines
marked `# ptc` are what ptc asks of the script.
"""

import pathlib
import sys
import time

import torch

import gpt

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "elastic"))
import harness  # noqa: E402
from megatron import Groups, train_step  # noqa: E402
import zero  # noqa: E402

import ptc  # noqa: E402  # ptc
import ptc.torch as pt  # noqa: E402  # ptc

LR, WARMUP = 3e-3, 4
SAMPLES, SEQ = harness.SAMPLES, harness.SEQ


def flags(ap):
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--zero", action="store_true",
                    help="a flat-buffer distributed optimizer (ZeRO-1, Megatron-core's layout)")


def main():
    args = harness.parse(__doc__, flags)
    arch = gpt.Arch(args.model)
    cfg = ptc.ParallelConfig.parse(args.config)
    adam = lambda params: torch.optim.Adam(params, lr=LR, eps=1e-8)  # noqa: E731
    warmup = lambda opt: torch.optim.lr_scheduler.LambdaLR(  # noqa: E731
        opt, lambda it: min(1.0, (it + 1) / WARMUP))
    # ZeRO-1: Adam's state over flat-buffer ranges, in buckets of ~40k elements.
    kept = pt.FlatBuffer(torch.optim.Adam, bucket_size=40_000) if args.zero else torch.optim.Adam
    layout = gpt.layout(arch, kept)  # ptc
    if args.layout_out:
        return layout.write(args.layout_out)  # ptc
    harness.init_dist(args, cfg.world_size)
    groups = Groups(cfg, args.rank)
    first_layer, n_layers = cfg.stage_layers(groups.pp_i, arch.layers)
    stage = gpt.Stage(arch, cfg.tp, groups.tp_i, first_layer, n_layers, groups.pp_i == 0,
                      groups.pp_i == cfg.pp - 1, groups.tp, args.seed)
    if args.zero:
        opt = zero.DistributedOptimizer(stage, pt.flat_buffer(layout, cfg, args.rank),  # ptc
                                        adam, groups.dp)
        sched = warmup(opt.optimizer)
    else:
        opt = adam(stage.parameters())
        sched = warmup(opt)
    client = harness.client(args)  # ptc.Client(socket, coordinator, job, rank)  # ptc
    iteration = 0
    cursor = ptc.DataCursor(seed=args.seed, dataset_size=SAMPLES,  # ptc
                            global_batch=args.global_batch)
    if args.baseline_load:
        iteration, cursor = harness.baseline_resume(args, client, stage, opt, sched)
    elif args.load:
        t0 = time.time()
        extra = pt.load(client, stage, opt, sched)  # ptc
        iteration, cursor = extra.step, extra["cursor"]  # ptc
        args.events.update(loaded=time.time(), load_seconds=time.time() - t0,
                           loaded_version=extra.version)
        harness.check_reload(args, client, stage, opt, iteration)
    data = harness.tokens(arch.vocab)
    log_samples = groups.pp_i == 0 and groups.tp_i == 0
    log_loss = stage.last and groups.tp_i == 0 and groups.dp_i == 0
    while True:
        done, saving = harness.stop(args, iteration)
        saving = saving or bool(args.save_at and iteration == args.save_at)
        if done or saving:
            break
        samples = cursor.next_samples(groups.dp_i, cfg.dp)  # ptc
        if log_samples:
            harness.log_samples(args, iteration, samples)
        loss = train_step(cfg, groups, stage, opt, sched, data[sorted(samples)], SEQ,
                          args.micro_batches, tied="embedding.word.weight")
        cursor.advance()  # ptc
        iteration += 1
        if log_loss:
            harness.log_loss(args, iteration, loss)
        if args.save_every and iteration % args.save_every == 0 and iteration != args.save_at \
                and client is not None:
            args.events.setdefault("periodic_saves", []).append(
                harness.timed_save(args, client, stage, opt, sched, cursor, iteration, False))
            time.sleep(args.gap)
    if saving:
        args.events.update(harness.timed_save(args, client, stage, opt, sched, cursor, iteration,
                                              True))
    harness.finish(args, iteration)


if __name__ == "__main__":
    main()
