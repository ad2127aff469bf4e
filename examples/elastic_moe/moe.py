"""A small mixture-of-experts decoder with expert parallelism, on CPU with gloo.

Every layer: attention, then an MoE feed-forward with top-2 routing over
`experts` SwiGLU-free GELU experts stacked in two tensors
(w1 [experts, ffn, hidden], w2 [experts, hidden, ffn]). Expert parallelism
cuts the stacks over the ep axis: each rank of an ep group holds
experts/ep experts; the group's tokens are gathered (all_gather), each rank
applies its experts to the tokens routed to them, and the partial outputs
are summed and handed back (all_reduce, then each rank keeps its tokens).
gloo has no all_to_all; the gather moves ep times more activations, which
does not matter here. Everything outside the experts is replicated over
dp and ep (data parallelism over dp*ep ranks).
"""

import math
import zlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ptc.torch as pt


class Arch:
    def __init__(self, text):
        kv = dict(p.split("=") for p in text.split(",")) if text else {}
        self.layers = int(kv.get("layers", 2))
        self.hidden = int(kv.get("hidden", 64))
        self.heads = int(kv.get("heads", 4))
        self.ffn = int(kv.get("ffn", 128))
        self.experts = int(kv.get("experts", 4))
        self.vocab = int(kv.get("vocab", 500))
        self.positions = int(kv.get("positions", 64))


class _Gather(torch.autograd.Function):
    """All ranks' tokens of the ep group, in rank order."""

    @staticmethod
    def forward(ctx, x, group, index, size):
        ctx.group, ctx.index, ctx.n = group, index, x.shape[0]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g[ctx.index * ctx.n:(ctx.index + 1) * ctx.n], None, None, None


class _SumAndSplit(torch.autograd.Function):
    """The sum over the ep group of every rank's partial outputs for all
    the group's tokens; each rank keeps its own tokens'."""

    @staticmethod
    def forward(ctx, z, group, index, size):
        ctx.group, ctx.size = group, size
        z = z.contiguous().clone()
        dist.all_reduce(z, group=group)
        n = z.shape[0] // size
        return z[index * n:(index + 1) * n]

    @staticmethod
    def backward(ctx, g):
        parts = [torch.empty_like(g) for _ in range(ctx.size)]
        dist.all_gather(parts, g.contiguous(), group=ctx.group)
        return torch.cat(parts), None, None, None


class Norm(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(h))
        self.bias = torch.nn.Parameter(torch.zeros(h))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias)


class Experts(torch.nn.Module):
    """This rank's experts, stacked: experts first..first+count of the layer."""

    def __init__(self, arch, ids, generator_of):
        super().__init__()
        h, f = arch.hidden, arch.ffn
        # Every expert from its own generator: the same values whichever
        # rank holds it.
        gens = [generator_of(f"expert{e}") for e in ids]
        self.w1 = torch.nn.Parameter(torch.stack([torch.randn(f, h, generator=g) for g in gens])
                                     * 0.02)
        self.w2 = torch.nn.Parameter(torch.stack([torch.randn(h, f, generator=g) for g in gens])
                                     * 0.02)


class MoE(torch.nn.Module):
    def __init__(self, arch, ep, ep_rank, ep_group, generator_of):
        super().__init__()
        self.arch, self.ep, self.ep_rank, self.group = arch, ep, ep_rank, ep_group
        self.local = arch.experts // ep
        self.norm = Norm(arch.hidden)
        self.router = torch.nn.Linear(arch.hidden, arch.experts, bias=False)
        with torch.no_grad():
            self.router.weight.copy_(torch.randn(arch.experts, arch.hidden,
                                                 generator=generator_of("router")) * 0.02)
        self.experts = Experts(arch, range(ep_rank * self.local, (ep_rank + 1) * self.local),
                               generator_of)

    def forward(self, x):
        b, s, h = x.shape
        y = self.norm(x).reshape(b * s, h)
        if self.ep > 1:
            y = _Gather.apply(y, self.group, self.ep_rank, self.ep)
        gates = self.router(y).softmax(dim=-1)
        top, idx = gates.topk(2, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        # Zero times y, not zeros: the output stays in the graph even when
        # no token picks this rank's experts, so every rank of the group
        # runs the collectives of the backward pass.
        out = y * 0.0
        first = self.ep_rank * self.local
        for e in range(self.local):
            rows, slot = (idx == first + e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            hdn = F.gelu(y[rows] @ self.experts.w1[e].t())
            out = out.index_add(0, rows, (hdn @ self.experts.w2[e].t()) * top[rows, slot, None])
        if self.ep > 1:
            out = _SumAndSplit.apply(out, self.group, self.ep_rank, self.ep)
        return x + out.reshape(b, s, h)


class Attention(torch.nn.Module):
    def __init__(self, arch, generator):
        super().__init__()
        h = arch.hidden
        self.heads = arch.heads
        self.norm = Norm(h)
        self.qkv = torch.nn.Linear(h, 3 * h)
        self.proj = torch.nn.Linear(h, h)
        with torch.no_grad():
            for lin in (self.qkv, self.proj):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=generator) * 0.02)
                lin.bias.zero_()

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(h // self.heads)
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        ctx = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        return x + self.proj(ctx.transpose(1, 2).reshape(b, s, h))


class Layer(torch.nn.Module):
    def __init__(self, arch, ep, ep_rank, ep_group, generator_of):
        super().__init__()
        self.attn = Attention(arch, generator_of("attn"))
        self.moe = MoE(arch, ep, ep_rank, ep_group, generator_of)

    def forward(self, x):
        return self.moe(self.attn(x))


class Model(torch.nn.Module):
    """The model on one rank (ep=1: the full model). Initial values depend
    on the seed only, not on the layout."""

    def __init__(self, arch, ep=1, ep_rank=0, ep_group=None, seed=1234):
        super().__init__()

        def gen(name):
            return torch.Generator().manual_seed(zlib.crc32(f"{seed}.{name}".encode()))

        self.embed = torch.nn.Embedding(arch.vocab, arch.hidden)
        self.pos = torch.nn.Embedding(arch.positions, arch.hidden)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(arch.vocab, arch.hidden, generator=gen("e")) * 0.02)
            self.pos.weight.copy_(torch.randn(arch.positions, arch.hidden, generator=gen("p")) * 0.02)
        self.layers = torch.nn.ModuleList(
            Layer(arch, ep, ep_rank, ep_group, lambda n, l=l: gen(f"layer{l}.{n}"))
            for l in range(arch.layers))
        self.norm = Norm(arch.hidden)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos.weight[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) @ self.embed.weight.t()  # tied output


def layout(arch, optimizer):
    """Experts cut over ep; everything else replicated (data parallel over
    dp and ep)."""
    return pt.Layout(Model(arch), {"layers.*.moe.experts": pt.Experts("ep")},
                     optimizer=optimizer, mesh=["pp", "dp", "ep", "tp"], name="moe")
