"""Megatron-style process groups and a GPipe training step, shared by the
GPT and LLaMA example jobs (a stage module with .first, .last, .arch.hidden,
forward() and loss())."""

import torch
import torch.distributed as dist


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



def train_step(cfg, groups, stage, opt, sched, batch, seq, micro_batches, tied=None):
    """One GPipe iteration over `micro_batches`; returns the global batch's
    mean loss (on the last stage). `tied`: the name of a parameter both end
    stages hold (a tied embedding), whose gradients they sum. An optimizer
    with `reduces_gradients` averages them over dp itself (zero.py)."""
    first, last = stage.first, stage.last
    pp_i, dp_i, tp_i = groups.pp_i, groups.dp_i, groups.tp_i
    prev = cfg.rank_of(pp_i - 1, dp_i, tp_i) if not first else None
    nxt = cfg.rank_of(pp_i + 1, dp_i, tp_i) if not last else None
    M = micro_batches
    micro = batch.chunk(M)
    opt.zero_grad(set_to_none=False)
    ins, outs, total = [], [], torch.zeros(1)
    b = micro[0].shape[0]
    for mb in micro:  # forward
        if first:
            x = mb[:, :-1]
        else:
            x = torch.empty(b, seq, stage.arch.hidden)
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
    params = dict(stage.named_parameters())
    if tied and groups.embedding is not None:  # the tied embedding's two copies
        dist.all_reduce(params[tied].grad, group=groups.embedding)
    if cfg.dp > 1 and not getattr(opt, "reduces_gradients", False):
        grads = [p.grad for p in params.values()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=groups.dp)
        flat /= cfg.dp
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()
    if cfg.dp > 1 and last:
        dist.all_reduce(total, group=groups.dp)
        total /= cfg.dp
    opt.step()
    sched.step()
    return total.item()
