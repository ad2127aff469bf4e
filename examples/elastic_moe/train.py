"""One rank of the elastic MoE training job (started by examples/elastic/run.py).

A mixture-of-experts decoder (top-2 routing) whose experts are cut over the
ep axis of its mesh (pp, dp, ep, tp); the rest is data parallel over dp*ep
ranks. AdamW with a warm-up schedule; samples through ptc's data cursor.
The lines marked `# ptc` are what ptc asks of the script.
"""

import pathlib
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import moe

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "elastic"))
import harness  # noqa: E402

import ptc  # noqa: E402  # ptc
import ptc.torch as pt  # noqa: E402  # ptc

SAMPLES, SEQ = harness.SAMPLES, harness.SEQ
MESH = ["pp", "dp", "ep", "tp"]


def groups(cfg, rank):
    """(ep group, dp group) of `rank`, created in the same order everywhere."""
    ep_group = dp_group = None
    for d in range(cfg.dp):
        ranks = [cfg.rank_of(0, d, e, 0) for e in range(cfg.size("ep"))]
        g = dist.new_group(ranks)
        if rank in ranks:
            ep_group = g
    for e in range(cfg.size("ep")):
        ranks = [cfg.rank_of(0, d, e, 0) for d in range(cfg.dp)]
        g = dist.new_group(ranks)
        if rank in ranks:
            dp_group = g
    return ep_group, dp_group


def main():
    args = harness.parse(__doc__)
    arch = moe.Arch(args.model)
    cfg = ptc.ParallelConfig.parse(args.config, MESH)  # ptc
    if cfg.pp > 1 or cfg.tp > 1:
        raise SystemExit("this example runs dp and ep only")
    make_opt = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.01)  # noqa: E731
    if args.layout_out:
        return moe.layout(arch, torch.optim.AdamW).write(args.layout_out)  # ptc
    harness.init_dist(args, cfg.world_size)
    _, dp_i, ep_i, _ = cfg.coord_of(args.rank)
    ep, world = cfg.size("ep"), cfg.world_size
    ep_group, dp_group = groups(cfg, args.rank)
    model = moe.Model(arch, ep, ep_i, ep_group, args.seed)
    opt = make_opt(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: min(1.0, (it + 1) / 4))
    client = harness.client(args)  # ptc.Client(socket, coordinator, job, rank)  # ptc
    cursor = ptc.DataCursor(seed=args.seed, dataset_size=SAMPLES,  # ptc
                            global_batch=args.global_batch)
    iteration = 0
    if args.baseline_load:
        iteration, cursor = harness.baseline_resume(args, client, model, opt, sched)
    elif args.load:
        t0 = time.time()
        extra = pt.load(client, model, opt, sched)  # ptc
        iteration, cursor = extra.step, extra["cursor"]  # ptc
        args.events.update(loaded=time.time(), load_seconds=time.time() - t0)
        harness.check_reload(args, client, model, opt, iteration)
    data = harness.tokens(arch.vocab)
    experts = {n for n, _ in model.named_parameters() if ".experts." in n}
    while True:
        done, saving = harness.stop(args, iteration)
        saving = saving or bool(args.save_at and iteration == args.save_at)
        if done or saving:
            break
        # Every rank is a data-parallel rank: dp*ep of them.
        samples = cursor.next_samples(args.rank, world)  # ptc
        harness.log_samples(args, iteration, samples)
        batch = data[sorted(samples)]
        loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, arch.vocab),
                               batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        # Dense gradients sum over every rank, an expert's over the ranks
        # holding it (its ep group already summed its tokens' share).
        for n, p in model.named_parameters():
            if p.grad is None:  # an expert no token picked on any rank so far
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=dp_group if n in experts else None)
            p.grad /= world
        opt.step()
        sched.step()
        cursor.advance()  # ptc
        iteration += 1
        total = loss.detach().clone()
        dist.all_reduce(total)
        if args.rank == 0:
            harness.log_loss(args, iteration, total.item() / world)
        if args.save_every and iteration % args.save_every == 0 and client is not None:
            args.events.setdefault("periodic_saves", []).append(
                harness.timed_save(args, client, model, opt, sched, cursor, iteration, False))
            time.sleep(args.gap)
    if saving:  # pt.save, timed for the pause benchmark
        args.events.update(harness.timed_save(args, client, model, opt, sched, cursor, iteration,
                                              True))
    harness.finish(args, iteration)


if __name__ == "__main__":
    main()
