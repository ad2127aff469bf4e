"""A small LLaMA-style decoder (RMSNorm, grouped-query attention, SwiGLU)
with Megatron-core's tensor-parallel layout, on CPU with gloo.

The fused qkv weight orders its rows per query group, as Megatron-core
does: for each of the `groups` kv groups, its q heads, then its k head,
then its v head. Tensor parallelism gives each rank whole query groups, in
ptc's chunk order (with 4 groups on tp=3: 2, 1, 1), so tp need not divide
the groups; the output projection's columns follow the same heads. The
SwiGLU gate|up weight is fused: a rank holds its chunk of gate and its
chunk of up, concatenated. Embedding and output layer are not tied and are
replicated over tp. Initial values depend on the seed only: a rank cuts
its tensors from the full model with ptc.torch.shard_state.
"""

import math
import pathlib
import sys
import zlib

import torch
import torch.nn.functional as F

import ptc.torch as pt

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "elastic_gpt"))
from gpt import _CopyToTp, _ReduceFromTp  # noqa: E402  (Megatron's f and g)


def chunk(n, parts, i):
    """ptc's chunk sizes: the first n % parts chunks are one larger."""
    return n // parts + (1 if i < n % parts else 0)


class Arch:
    def __init__(self, text):
        kv = dict(p.split("=") for p in text.split(",")) if text else {}
        self.layers = int(kv.get("layers", 4))
        self.hidden = int(kv.get("hidden", 64))
        self.heads = int(kv.get("heads", 8))
        self.groups = int(kv.get("groups", 4))
        self.ffn = int(kv.get("ffn", 96))
        self.vocab = int(kv.get("vocab", 500))
        self.head_dim = self.hidden // self.heads
        self.q_per_group = self.heads // self.groups


class RMSNorm(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(h))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(torch.nn.Module):
    def __init__(self, arch, tp, tp_rank, tp_group):
        super().__init__()
        self.arch, self.tp_group = arch, tp_group
        self.local_groups = chunk(arch.groups, tp, tp_rank)
        block = (arch.q_per_group + 2) * arch.head_dim
        self.norm = RMSNorm(arch.hidden)
        self.qkv = torch.nn.Linear(arch.hidden, self.local_groups * block, bias=False)
        self.proj = torch.nn.Linear(self.local_groups * arch.q_per_group * arch.head_dim,
                                    arch.hidden, bias=False)

    def forward(self, x):
        a = self.arch
        b, s, _ = x.shape
        y = self.norm(x)
        if self.tp_group is not None:
            y = _CopyToTp.apply(y, self.tp_group)
        qkv = self.qkv(y).view(b, s, self.local_groups, a.q_per_group + 2, a.head_dim)
        q = qkv[:, :, :, :a.q_per_group]                          # [b, s, g, qpg, hd]
        k = qkv[:, :, :, a.q_per_group:a.q_per_group + 1].expand_as(q)
        v = qkv[:, :, :, a.q_per_group + 1:].expand_as(q)
        q, k, v = (t.reshape(b, s, -1, a.head_dim).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(a.head_dim)
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        ctx = (scores.masked_fill(causal, float("-inf")).softmax(-1) @ v).transpose(1, 2)
        out = self.proj(ctx.reshape(b, s, -1))
        if self.tp_group is not None:
            out = _ReduceFromTp.apply(out, self.tp_group)
        return x + out


class SwiGLU(torch.nn.Module):
    def __init__(self, arch, tp, tp_rank, tp_group):
        super().__init__()
        self.tp_group = tp_group
        self.local = chunk(arch.ffn, tp, tp_rank)
        self.norm = RMSNorm(arch.hidden)
        self.fc1 = torch.nn.Linear(arch.hidden, 2 * self.local, bias=False)  # gate | up
        self.fc2 = torch.nn.Linear(self.local, arch.hidden, bias=False)

    def forward(self, x):
        y = self.norm(x)
        if self.tp_group is not None:
            y = _CopyToTp.apply(y, self.tp_group)
        gate, up = self.fc1(y).split(self.local, dim=-1)
        out = self.fc2(F.silu(gate) * up)
        if self.tp_group is not None:
            out = _ReduceFromTp.apply(out, self.tp_group)
        return x + out


class Layer(torch.nn.Module):
    def __init__(self, arch, tp, tp_rank, tp_group):
        super().__init__()
        self.attn = Attention(arch, tp, tp_rank, tp_group)
        self.mlp = SwiGLU(arch, tp, tp_rank, tp_group)

    def forward(self, x):
        return self.mlp(self.attn(x))


class Stage(torch.nn.Module):
    """One pipeline stage for one tp rank (defaults: the full model). Its
    layers keep the full model's names (layers.<l>)."""

    def __init__(self, arch, tp=1, tp_rank=0, first_layer=0, num_layers=None, first=True,
                 last=True, tp_group=None):
        super().__init__()
        num_layers = arch.layers if num_layers is None else num_layers
        self.arch, self.first, self.last = arch, first, last
        group = tp_group if tp > 1 else None
        if first:
            self.embed = torch.nn.Embedding(arch.vocab, arch.hidden)
        self.layers = torch.nn.ModuleDict({str(l): Layer(arch, tp, tp_rank, group) for l in
                                           range(first_layer, first_layer + num_layers)})
        if last:
            self.norm = RMSNorm(arch.hidden)
            self.head = torch.nn.Linear(arch.hidden, arch.vocab, bias=False)

    def forward(self, x):
        if self.first:
            x = self.embed(x)
        for layer in self.layers.values():
            x = layer(x)
        return self.head(self.norm(x)) if self.last else x

    def loss(self, logits, labels):
        return F.cross_entropy(logits.reshape(-1, self.arch.vocab), labels.reshape(-1))


def full_state(arch, seed):
    """The full model's initial values: each tensor from its own generator."""
    out = {}
    for name, p in Stage(arch).named_parameters():
        g = torch.Generator().manual_seed(zlib.crc32(f"{seed}.{name}".encode()))
        out[name] = torch.ones(p.shape) if "norm" in name else torch.randn(
            p.shape, generator=g) * 0.02
    return out


def layout(arch, optimizer):
    a = arch
    hd, qpg = a.head_dim, a.q_per_group
    plan = {
        "layers.*.attn.qkv": pt.Colwise(groups=(qpg * hd, hd, hd), repeats=a.groups,
                                        unit="query groups"),
        "layers.*.attn.proj": pt.Rowwise(groups=(qpg * hd,), repeats=a.groups),
        "layers.*.mlp.fc1": pt.Colwise(groups=(a.ffn, a.ffn)),
        "layers.*.mlp.fc2": pt.Rowwise(),
    }
    stages = pt.Stages(layers="layers", first=["embed"], last=["norm", "head"])
    return pt.Layout(Stage(arch), plan, optimizer=optimizer, stages=stages, name="llama")
