"""A small GPT decoder with Megatron-style parallelism, on CPU with gloo.

Tensor parallelism: column-parallel qkv and fc1, row-parallel proj and fc2,
a vocab-parallel word embedding and a vocab-parallel cross-entropy, with
Megatron's conjugate collectives (f: identity forward, all-reduce backward;
g: all-reduce forward, identity backward). Pipeline parallelism: stages of
consecutive layers exchanging activations with send/recv, a GPipe schedule
over micro-batches; the tied word embedding has a copy on the last stage
whose gradient is summed with the first stage's. Data parallelism: the
gradients of each stage are averaged over its dp group.

Parameters are named as in the full model (a stage keeps the names of the
layers it holds); layout() states how each is cut: qkv rows interleave q,
k, v per head (blocks of (q, k, v) per head: a tp split gives whole heads);
the word embedding is split over Megatron's padded vocabulary, whose
padding rows are zero, masked out of the loss, and never stored.
"""

import math
import zlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ptc.torch as pt


class Arch:
    def __init__(self, text):
        kind, _, params = text.rpartition(":")
        if kind not in ("", "gpt"):
            raise ValueError(f"this example trains gpt models, not '{kind}'")
        kv = dict(p.split("=") for p in params.split(","))
        self.text = text
        self.layers = int(kv["layers"])
        self.hidden = int(kv["hidden"])
        self.heads = int(kv["heads"])
        self.ffn = int(kv["ffn"])
        self.vocab = int(kv["vocab"])
        self.positions = int(kv["positions"])
        self.pad = int(kv.get("pad", 128))
        if kv.get("dtype", "fp32") not in ("fp32", "float32"):
            raise ValueError("the CPU example trains in fp32 (dtype=fp32)")

    def padded_vocab(self, tp):
        m = self.pad * tp
        return (self.vocab + m - 1) // m * m


# ---- deterministic global initialization (the same for every layout) ----

def _generator(key, seed):
    g = torch.Generator()
    g.manual_seed((zlib.crc32(key.encode()) << 16) ^ seed)
    return g


def global_init(key, shape, seed):
    """The initial value of a whole tensor, independent of the layout."""
    if key.endswith(".bias"):
        return torch.zeros(shape)
    if "norm" in key:
        return torch.ones(shape)
    std = 0.02
    if key.endswith("proj.weight") or key.endswith("fc2.weight"):
        std = 0.02 / math.sqrt(2.0)  # scaled residual projections
    return torch.randn(shape, generator=_generator(key, seed)) * std


# ---- tensor-parallel collectives as autograd functions ----

class _CopyToTp(torch.autograd.Function):  # f
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTp(torch.autograd.Function):  # g
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary across the tp group."""

    @staticmethod
    def forward(ctx, logits, target, group, vocab_start):
        logits = logits.clone()
        vmax = logits.max(dim=-1)[0]
        if group is not None:
            dist.all_reduce(vmax, op=dist.ReduceOp.MAX, group=group)
        logits -= vmax.unsqueeze(-1)
        local = logits.shape[-1]
        outside = (target < vocab_start) | (target >= vocab_start + local)
        t = (target - vocab_start).masked_fill(outside, 0)
        rows = torch.arange(logits.shape[0])
        predicted = logits[rows, t].masked_fill(outside, 0.0)
        exp = logits.exp()
        total = exp.sum(dim=-1)
        if group is not None:
            dist.all_reduce(predicted, group=group)
            dist.all_reduce(total, group=group)
        ctx.save_for_backward(exp / total.unsqueeze(-1), t, outside)
        return total.log() - predicted

    @staticmethod
    def backward(ctx, grad):
        softmax, t, outside = ctx.saved_tensors
        g = softmax.clone()
        rows = torch.arange(g.shape[0])
        g[rows, t] -= (~outside).to(g.dtype)
        return g * grad.unsqueeze(-1), None, None, None


# ---- the pipeline stage ----

class Stage(torch.nn.Module):
    """The layers of one pipeline stage, for one tp rank; with tp=1 and
    every layer, the full model (what ptc.torch reads the layout from).

    Parameter names are the full model's: embedding.word.weight,
    embedding.position.weight, layers.<l>.attn.{norm,qkv,proj}.{weight,bias},
    layers.<l>.mlp.{norm,fc1,fc2}.{weight,bias}, final_norm.{weight,bias}.
    The last stage of a pipeline holds its own copy of the tied word
    embedding under the same name."""

    def __init__(self, arch, tp=1, tp_rank=0, first_layer=0, num_layers=None, first=True,
                 last=True, tp_group=None, seed=1234, init=True):
        super().__init__()
        num_layers = arch.layers if num_layers is None else num_layers
        self.arch, self.tp, self.tp_rank = arch, tp, tp_rank
        self.first, self.last = first, last
        self.tp_group = tp_group if tp > 1 else None
        self.layer_ids = list(range(first_layer, first_layer + num_layers))
        h, H = arch.hidden, arch.heads
        self.local_heads = H // tp
        self.head_dim = h // H
        self.vocab_local = arch.padded_vocab(tp) // tp
        self.vocab_start = tp_rank * self.vocab_local
        self._keys = {}  # parameter name -> parameter
        # Without init the parameters are left uninitialized (torch.empty):
        # for a stage whose every parameter a load overwrites next.
        self._init = init
        if first or last:
            self._param("embedding.word.weight", (arch.vocab, h), 0, seed)
        if first:
            self._param("embedding.position.weight", (arch.positions, h), None, seed)
        for l in self.layer_ids:
            p = f"layers.{l}."
            self._param(p + "attn.norm.weight", (h,), None, seed)
            self._param(p + "attn.norm.bias", (h,), None, seed)
            self._param(p + "attn.qkv.weight", (3 * h, h), 0, seed)
            self._param(p + "attn.qkv.bias", (3 * h,), 0, seed)
            self._param(p + "attn.proj.weight", (h, h), 1, seed)
            self._param(p + "attn.proj.bias", (h,), None, seed)
            self._param(p + "mlp.norm.weight", (h,), None, seed)
            self._param(p + "mlp.norm.bias", (h,), None, seed)
            self._param(p + "mlp.fc1.weight", (arch.ffn, h), 0, seed)
            self._param(p + "mlp.fc1.bias", (arch.ffn,), 0, seed)
            self._param(p + "mlp.fc2.weight", (h, arch.ffn), 1, seed)
            self._param(p + "mlp.fc2.bias", (h,), None, seed)
        if last:
            self._param("final_norm.weight", (h,), None, seed)
            self._param("final_norm.bias", (h,), None, seed)

    def _param(self, key, shape, split, seed):
        """A parameter holding this tp rank's shard of `key` (split over dim
        `split`, or replicated), initialized from the global tensor and
        registered under its dotted name."""
        if not self._init:
            local = list(shape)
            if split is not None:
                if key == "embedding.word.weight":
                    local[0] = self.arch.padded_vocab(self.tp)
                local[split] //= self.tp
            return self._register(key, torch.nn.Parameter(torch.empty(local)))
        full = global_init(key, shape, seed)
        if split is not None:
            if key == "embedding.word.weight":
                pad = self.arch.padded_vocab(self.tp) - shape[0]
                full = torch.cat([full, torch.zeros(pad, shape[1])])
            n = full.shape[split] // self.tp
            full = full.narrow(split, self.tp_rank * n, n)
        return self._register(key, torch.nn.Parameter(full.contiguous()))

    def _register(self, key, p):
        *path, name = key.split(".")
        module = self
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.ModuleDict() if part == "layers" else
                                  torch.nn.Module())
            module = getattr(module, part)
        module.register_parameter(name, p)
        self._keys[key] = p
        return p

    def _f(self, x):
        return _CopyToTp.apply(x, self.tp_group) if self.tp_group else x

    def _g(self, x):
        return _ReduceFromTp.apply(x, self.tp_group) if self.tp_group else x

    def _p(self, key):
        return self._keys[key]

    def embed(self, tokens):
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_local)
        e = F.embedding(local.masked_fill(outside, 0), self._p("embedding.word.weight"))
        e = e.masked_fill(outside.unsqueeze(-1), 0.0)
        pos = self._p("embedding.position.weight")[: tokens.shape[1]]
        return self._g(e) + pos

    def layer(self, x, l):
        p = f"layers.{l}."
        b, s, h = x.shape
        y = F.layer_norm(x, (h,), self._p(p + "attn.norm.weight"), self._p(p + "attn.norm.bias"))
        qkv = F.linear(self._f(y), self._p(p + "attn.qkv.weight"), self._p(p + "attn.qkv.bias"))
        qkv = qkv.view(b, s, self.local_heads, 3, self.head_dim)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        ctx = (attn @ v).transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim)
        x = x + self._g(F.linear(ctx, self._p(p + "attn.proj.weight"))) + self._p(p + "attn.proj.bias")
        y = F.layer_norm(x, (h,), self._p(p + "mlp.norm.weight"), self._p(p + "mlp.norm.bias"))
        y = F.gelu(F.linear(self._f(y), self._p(p + "mlp.fc1.weight"), self._p(p + "mlp.fc1.bias")))
        return x + self._g(F.linear(y, self._p(p + "mlp.fc2.weight"))) + self._p(p + "mlp.fc2.bias")

    def forward(self, x):
        """tokens [b, s] on the first stage, activations [b, s, h] after;
        returns activations, or this tp rank's logits on the last stage."""
        if self.first:
            x = self.embed(x)
        for l in self.layer_ids:
            x = self.layer(x, l)
        if not self.last:
            return x
        x = F.layer_norm(x, (self.arch.hidden,), self._p("final_norm.weight"),
                         self._p("final_norm.bias"))
        return F.linear(self._f(x), self._p("embedding.word.weight"))

    def loss(self, logits, labels):
        """Mean cross-entropy; padded vocabulary entries are never predicted."""
        ids = torch.arange(self.vocab_start, self.vocab_start + self.vocab_local)
        logits = logits.masked_fill(ids >= self.arch.vocab, -1e30)
        flat = logits.reshape(-1, logits.shape[-1])
        losses = _VocabParallelCrossEntropy.apply(flat, labels.reshape(-1), self.tp_group,
                                                  self.vocab_start)
        return losses.mean()


def layout(arch, optimizer):
    """The job's layout for ptc: the full model (tp=1, every layer) and how
    tensor and pipeline parallelism cut it."""
    hd = arch.hidden // arch.heads
    plan = {
        "layers.*.attn.qkv": pt.Colwise(groups=(hd, hd, hd), repeats=arch.heads, even=True,
                                        unit="attention heads"),
        "layers.*.attn.proj": pt.Rowwise(even=True, unit_size=hd, unit="attention heads"),
        "layers.*.mlp.fc1": pt.Colwise(even=True),
        "layers.*.mlp.fc2": pt.Rowwise(even=True),
        "embedding.word": pt.VocabParallel(pad=arch.pad),
    }
    stages = pt.Stages(layers="layers", first=["embedding.position"],
                       first_and_last=["embedding.word"], last=["final_norm"])
    return pt.Layout(Stage(arch), plan, optimizer=optimizer, stages=stages, name="gpt")
