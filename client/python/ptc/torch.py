"""ptc.torch: a PyTorch job's whole state in ptc, from its modules.

A layout is built once from the full model (on the meta device: no memory)
and a placement plan written the way PyTorch's tensor-parallel plans are:

    import ptc, ptc.torch as pt
    plan = {"blocks.*.attn.qkv": pt.Colwise(groups=(q_rows, kv_rows, kv_rows)),
            "blocks.*.attn.proj": pt.Rowwise(),
            "embed": pt.VocabParallel(pad=128)}          # the rest: replicated
    layout = pt.Layout(full_model, plan, optimizer=torch.optim.AdamW,
                       stages=pt.Stages(layers="blocks", first=["embed"], last=["head"]))
    print(pt.describe(layout, "pp=2,tp=2,dp=2", rank=0))   # no cluster needed
    layout.write("job.json")                  # ptcctl register --layout job.json ...

Each rank then saves and loads its own modules with one call each:

    client = ptc.Client(socket=..., coordinator=..., job="j", rank=rank)
    pt.save(client, model, optimizer, scheduler, extra={"cursor": cursor})
    ...
    extra = pt.load(client, model, optimizer, scheduler)   # extra.step: the step

Keys are the parameters' and persistent buffers' names in the full model
(torchtitan's convention: a pipeline stage keeps the full model's names for
the layers it holds), and an optimizer's state is "optim.<slot>.<name>"
(Adam's exp_avg, exp_avg_sq and per-parameter step; SGD's momentum_buffer)
for the parameters it trains. A rank's local tensor is its regions of the
global tensor packed in order along each dimension: its chunk, or, for a
grouped split (q|k|v), its chunk of each group concatenated, as Megatron
and PyTorch's ColwiseParallel hold them.
"""

import base64
import fnmatch
import hashlib
import json
import math
import random
import re
from collections import namedtuple

import numpy as np
import torch

from . import _capi, torch_state

__all__ = ["Colwise", "Experts", "FlatBuffer", "Layout", "OptimizerState", "Replicate", "Rowwise", "Shard",
           "Stages", "VocabParallel", "check_forward", "describe", "flat_buffer", "load",
           "new_rank_seed", "optimizer_state", "save", "shard_state", "state_regions",
           "state_tensors"]

OPTIMIZER_OBJECT = "ptc.torch.optimizer"
SCHEDULER_OBJECT = "ptc.torch.scheduler"
EXTRA_OBJECT = "ptc.torch.extra"
RNG_OBJECT = "ptc.torch.rng"


torch_dtype = torch_state.torch_dtype
_PTC_DTYPE = {v: k for k, v in torch_state._TORCH_DTYPES.items()}


def ptc_dtype(dtype, what, remedy="or keep it out of the layout"):
    """The layout's dtype name of a torch dtype; TypeError naming `what`."""
    if dtype not in _PTC_DTYPE:
        raise TypeError(f"{what} is {dtype}; ptc stores {', '.join(sorted(_PTC_DTYPE.values()))} "
                        f"(convert it, e.g. to float32, {remedy})")
    return _PTC_DTYPE[dtype]


# ---------------------------------------------------------------- placements

class Placement:
    """How a module's parameters are cut over mesh axes. `axis` is one axis
    or several cut jointly (("dp", "ep"): their ranks flattened)."""

    def __init__(self, axis):
        self.axes = [axis] if isinstance(axis, str) else list(axis)

    def cut(self, module, name, shape):
        """The layout spec's placements of parameter `name` (a name inside
        `module`, e.g. "weight") of global `shape`."""
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(self.axes)})"


class Replicate(Placement):
    """Every index holds all of it (what unnamed modules get)."""

    def __init__(self):
        super().__init__([])

    def cut(self, module, name, shape):
        return []


class _Cut(Placement):
    """A placement that cuts one dimension: in chunks (uneven: the first
    ones one row larger), over a padded extent (`pad`), or with `groups`
    as a grouped shard (`repeats` blocks of groups). `even`: refuse configs
    that do not divide (`unit_size` rows per `unit`)."""

    def __init__(self, axis, groups=None, repeats=1, even=False, unit_size=1, unit="", pad=0):
        super().__init__(axis)
        self.groups = list(groups) if groups else None
        self.repeats, self.even, self.unit_size, self.unit, self.pad = (
            repeats, even, unit_size, unit, pad)

    def _spec(self, dim, name, shape):
        extra = {"even": self.even, "unit": self.unit, "pad_multiple": self.pad,
                 "unit_size": self.unit_size if self.unit_size != 1 else 0}
        p = {"axes": self.axes, "kind": "shard", "dim": dim}
        if self.groups:
            blocks = max(self.repeats, 1)
            if sum(self.groups) * blocks != shape[dim]:
                raise ValueError(f"{self!r} on '{name}': groups {self.groups} x {blocks} blocks "
                                 f"add up to {sum(self.groups) * blocks} but dimension {dim} "
                                 f"has {shape[dim]}")
            p.update(kind="grouped_shard", groups=self.groups)
            if blocks > 1:
                p["repeats"] = blocks
        p.update({k: v for k, v in extra.items() if v})
        return [p]

    def __repr__(self):
        g = f", groups={self.groups}" if self.groups else ""
        r = f", repeats={self.repeats}" if self.repeats > 1 else ""
        return f"{type(self).__name__}({', '.join(self.axes)}{g}{r})"


class Shard(_Cut):
    """Dimension `dim` of every parameter, in contiguous chunks (uneven
    chunks: the first ones one row larger). `pad`: the extent is padded to a
    multiple of pad * parts first and the padding is not stored."""

    def __init__(self, dim, axis="dp", pad=0, even=False, unit_size=1, unit=""):
        super().__init__(axis, even=even, unit_size=unit_size, unit=unit, pad=pad)
        self.dim = dim

    def cut(self, module, name, shape):
        return self._spec(self.dim % len(shape), name, shape) if shape else []


class Colwise(_Cut):
    """Output features over `axis` (PyTorch's ColwiseParallel, Megatron's
    ColumnParallelLinear): a Linear's weight rows and bias; an Embedding's
    columns. `groups` (global rows of one block, e.g. (q, k, v)): each group
    is chunked on its own, a rank holds its chunk of each, concatenated.
    `repeats` > 1: the rows are `repeats` blocks of `groups` (Megatron-core's
    qkv rows per query group) and whole blocks are chunked. `even`: refuse
    configs that do not divide (`unit_size` rows per `unit`)."""

    def __init__(self, axis="tp", groups=None, repeats=1, even=False, unit_size=1, unit=""):
        super().__init__(axis, groups, repeats, even, unit_size, unit)

    def cut(self, module, name, shape):
        if len(shape) == 0:
            return []
        return self._spec(1 if isinstance(module, torch.nn.Embedding) else 0, name, shape)


class Rowwise(_Cut):
    """Input features over `axis` (PyTorch's RowwiseParallel, Megatron's
    RowParallelLinear): a Linear's weight columns (its bias is replicated);
    an Embedding's rows; the last dimension of other parameters of two or
    more dimensions. `groups` / `repeats` as for Colwise (an attention
    output projection whose columns follow uneven query groups)."""

    def __init__(self, axis="tp", groups=None, repeats=1, even=False, unit_size=1, unit=""):
        super().__init__(axis, groups, repeats, even, unit_size, unit)

    def cut(self, module, name, shape):
        if isinstance(module, torch.nn.Embedding):
            return self._spec(0, name, shape)
        return self._spec(len(shape) - 1, name, shape) if len(shape) >= 2 else []


class VocabParallel(_Cut):
    """A vocabulary dimension over `axis` (Megatron's VocabParallelEmbedding
    and its output layer): dimension 0 of the weight (and bias), padded to
    a multiple of pad * parts; the padding rows are not stored (a load
    zeroes them)."""

    def __init__(self, axis="tp", pad=128):
        super().__init__(axis, pad=pad)

    def cut(self, module, name, shape):
        return self._spec(0, name, shape) if shape else []


class Experts(_Cut):
    """Stacked experts over `axis`: every parameter's dimension 0 is the
    expert index ([experts, ...]); a rank holds its contiguous chunk of the
    experts. Configs whose axis does not divide the experts are refused."""

    def __init__(self, axis="ep"):
        super().__init__(axis, even=True, unit="experts")

    def cut(self, module, name, shape):
        if len(shape) == 0:
            raise ValueError(f"Experts on '{name}': a scalar has no expert dimension")
        return self._spec(0, name, shape)


# ---------------------------------------------------------------- stages

class Stages:
    """Which pipeline stage holds each parameter: those under
    `layers`.<i> follow layer i (the config's stage map: ParallelConfig's
    stage_layers), those matching `first` / `last` / `first_and_last`
    (patterns as in a plan; a tied embedding is in both end stages) sit on
    those stages. Every other parameter is an error under a pipeline."""

    def __init__(self, layers, first=(), last=(), first_and_last=()):
        self.layers = layers
        self.first, self.last = list(first), list(last)
        self.first_and_last = list(first_and_last)


class OptimizerState:
    """An optimizer's per-parameter state for the layout: `slots` are
    tensors shaped like the parameter (Adam: exp_avg, exp_avg_sq); `step`:
    a per-parameter step count. For optimizers ptc.torch does not know."""

    def __init__(self, slots, step=False):
        self.slots, self.step = list(slots), step

    def __repr__(self):
        return f"OptimizerState(slots={self.slots}, step={self.step})"


def _known_state(cls, settings):
    """The OptimizerState a torch optimizer class keeps for a parameter of
    a param group with `settings` (its hyper-parameters), or None for a
    class ptc.torch does not know."""
    if issubclass(cls, (torch.optim.Adam, torch.optim.AdamW)):
        return OptimizerState(["exp_avg", "exp_avg_sq"] +
                              (["max_exp_avg_sq"] if settings.get("amsgrad") else []), step=True)
    if issubclass(cls, torch.optim.SGD):
        return OptimizerState(["momentum_buffer"] if settings.get("momentum") else [])
    if issubclass(cls, torch.optim.Adagrad):
        return OptimizerState(["sum"], step=True)
    if issubclass(cls, torch.optim.RMSprop):
        return OptimizerState(["square_avg"] + (["momentum_buffer"] if settings.get("momentum")
                                                else [])
                              + (["grad_avg"] if settings.get("centered") else []), step=True)
    return None


def _held_state(optimizer, p, name):
    """The OptimizerState optimizer.state holds for parameter `p` (None
    values are nothing held: SGD without momentum); ValueError for an entry
    ptc cannot keep as a slot (not a tensor shaped like the parameter)."""
    st = optimizer.state.get(p) or {}
    slots, step = [], False
    for k, v in st.items():
        if v is None:
            continue
        if k == "step":
            step = True
        elif torch.is_tensor(v) and tuple(v.shape) == tuple(p.shape):
            slots.append(k)
        else:
            what = (f"a tensor of shape {tuple(v.shape)}" if torch.is_tensor(v)
                    else f"a {type(v).__name__}")
            raise ValueError(
                f"{type(optimizer).__name__}'s state of '{name}' holds '{k}', {what}, which "
                "ptc.torch cannot keep: it keeps per-parameter slots shaped like the parameter "
                f"{tuple(p.shape)} and a step, so this optimizer's state would be lost; use an "
                "optimizer whose state is such slots")
    return OptimizerState(slots, step)


def _union(states):
    slots, step = [], False
    for s in states:
        slots += [k for k in s.slots if k not in slots]
        step = step or s.step
    return OptimizerState(slots, step)


def optimizer_state(optimizer):
    """The OptimizerState of an optimizer (instance or class). From an
    instance, every slot it keeps: those its param_groups' settings give
    (Adam with amsgrad=True: max_exp_avg_sq; SGD with momentum:
    momentum_buffer) and those its state already holds (an optimizer
    ptc.torch does not know, after a step: every tensor shaped like its
    parameter, and the step)."""
    if optimizer is None or isinstance(optimizer, OptimizerState):
        return optimizer
    cls = optimizer if isinstance(optimizer, type) else type(optimizer)
    if isinstance(optimizer, type):
        if issubclass(cls, torch.optim.SGD):
            raise ValueError("pass the SGD optimizer itself, not its class: whether it keeps "
                             "a momentum buffer depends on its momentum")
        known = _known_state(cls, {})
        if known is None:
            raise ValueError(f"ptc.torch does not know the state of {cls.__name__}; pass the "
                             "optimizer itself after one step (its state shows its slots) or "
                             "optimizer=ptc.torch.OptimizerState(slots=[...], step=...)")
        return known
    known = [_known_state(cls, g) for g in optimizer.param_groups] or [_known_state(cls, {})]
    held = [_held_state(optimizer, p, f"a parameter of param group {i}")
            for i, g in enumerate(optimizer.param_groups) for p in g["params"]
            if optimizer.state.get(p)]
    if known[0] is None and not held:
        raise ValueError(f"ptc.torch does not know the state of {cls.__name__}; pass it after "
                         "one step (its state shows its slots) or "
                         "optimizer=ptc.torch.OptimizerState(slots=[...], step=...)")
    return _union([k for k in known if k is not None] + held)


def _parameter_states(optimizer, kept, params):
    """{parameter name: OptimizerState} of the parameters that keep
    optimizer state in the layout. An optimizer instance over these very
    parameters decides for itself: a parameter in its param_groups keeps
    the slots its group's settings give and any its state holds, unless it
    is frozen (requires_grad=False) and holds none; a parameter outside them
    keeps none. A class or an OptimizerState (or an instance over other
    tensors, e.g. a local model's): every parameter that requires grad
    keeps `kept`."""
    group_of = {}
    if isinstance(optimizer, torch.optim.Optimizer):
        for g in optimizer.param_groups:
            for p in g["params"]:
                group_of[id(p)] = g
    out = {}
    if any(id(p) in group_of for _, p in params):
        cls = type(optimizer)
        for name, p in params:
            g = group_of.get(id(p))
            if g is None:
                continue
            held = _held_state(optimizer, p, name)
            if not p.requires_grad and not (held.slots or held.step):
                continue
            known = _known_state(cls, g)
            if known is None and not (held.slots or held.step):
                known = kept  # a class ptc does not know: the slots its other parameters show
            out[name] = _union([known, held] if known is not None else [held])
        return out
    return {name: kept for name, p in params if p.requires_grad}


class FlatBuffer:
    """A flat-buffer distributed optimizer (ZeRO-1; Megatron-core's
    DistributedOptimizer) for the layout. The parameters' local shards are
    concatenated into one flat buffer (in `order`: "reverse", the order
    gradients become ready, or "forward"; each starting at a multiple of
    `align` elements), closed into buckets once one holds `bucket_size`
    elements (0: one bucket), each bucket's end padded to a multiple of
    lcm(ranks, `bucket_pad`), and every bucket is split over `axis` in
    contiguous chunks. A rank keeps `optimizer`'s state (Adam's exp_avg,
    exp_avg_sq; its step once for all) and, with `main_params`, fp32 master
    copies of the parameters, only for the elements in its chunks. The
    defaults are Megatron-core's; a parameter tied across pipeline stages
    gets a bucket of its own, as there. flat_buffer() gives each rank its
    ranges; save() and load() take an optimizer object with .optimizer and
    .shards (see flat_buffer)."""

    def __init__(self, optimizer, axis="dp", *, order="reverse", align=64,
                 bucket_size=40_000_000, bucket_pad=128, main_params=False, name="optimizer"):
        if order not in ("reverse", "forward"):
            raise ValueError(f"FlatBuffer order is 'reverse' or 'forward', not {order!r}")
        if isinstance(optimizer, FlatBuffer):
            raise ValueError("FlatBuffer takes the optimizer that runs on each rank's ranges "
                             "(e.g. torch.optim.Adam), not another FlatBuffer")
        self.state = optimizer_state(optimizer)
        if self.state is None:
            raise ValueError("FlatBuffer needs the optimizer whose state it keeps")
        self.axes = [axis] if isinstance(axis, str) else list(axis)
        self.order, self.align, self.bucket_size = order, align, bucket_size
        self.bucket_pad, self.main_params, self.name = bucket_pad, main_params, name
        self.slots = (["main"] if main_params else []) + self.state.slots

    def __repr__(self):
        return (f"FlatBuffer('{self.name}' over {', '.join(self.axes)}, {self.order}, "
                f"align {self.align}, buckets {self.bucket_size}, pad {self.bucket_pad})")

    def spec(self, params):
        """The buffer's spec and its member tensors for `params` (the
        layout's parameter entries, in model order)."""
        tensors, entries = [], []
        for t in params:
            for p in t.get("placements", []):
                dim = p.get("dim", 0)
                if dim != 0 and (p.get("kind") == "grouped_shard"
                                 or int(p.get("pad_multiple", 0))):
                    what = "as groups" if p.get("kind") == "grouped_shard" else "with padding"
                    raise ValueError(
                        f"parameter '{t['key']}' is cut {what} along dimension {dim}: its "
                        "local tensor's memory does not hold its regions one after another, "
                        "which a flat buffer needs; cut it along dimension 0")
            for slot in self.slots:
                tensors.append(dict(t, key=f"optim.{slot}.{t['key']}", role="optimizer_state",
                                    dtype="fp32" if self.main_params else t["dtype"],
                                    buffer=self.name, slot=t["key"]))
            e = {"tensor": t["key"]}
            if t.get("stage", {}).get("kind") == "first_and_last":
                e["own_bucket"] = "when_shared"
            entries.append(e)
        if self.state.step:
            tensors.append({"key": "optim.step", "dtype": "fp32", "shape": [1],
                            "role": "optimizer_state"})
        buf = {"name": self.name, "axes": self.axes,
               "entries": entries[::-1] if self.order == "reverse" else entries,
               "align": self.align, "bucket_size": self.bucket_size,
               "bucket_pad": self.bucket_pad}
        return buf, tensors


# ---------------------------------------------------------------- the layout

def _matches(pattern, name):
    """A plan pattern against a dotted name: `*` matches one component."""
    p, n = pattern.split("."), name.split(".")
    return len(p) == len(n) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(n, p))


def _under(pattern, name):
    """Whether `name` is the object `pattern` names or lies under it."""
    parts = name.split(".")
    k = len(pattern.split("."))
    return len(parts) >= k and _matches(pattern, ".".join(parts[:k]))


def _state_buffers(model):
    """[(name, module, name inside it, tensor)] of the model's persistent
    buffers, those its state_dict holds (BatchNorm's running_mean,
    running_var and num_batches_tracked; not those registered with
    persistent=False), each tensor once, in the model's order."""
    out, seen = [], set()
    for mname, module in model.named_modules():
        transient = getattr(module, "_non_persistent_buffers_set", set())
        for bname, b in module.named_buffers(recurse=False):
            if b is None or bname in transient or id(b) in seen:
                continue
            seen.add(id(b))
            out.append((f"{mname}.{bname}" if mname else bname, module, bname, b))
    return out


class Layout:
    """The layout spec of a model: every parameter (its name in the full
    model, dtype, global shape), how the plan cuts it, its pipeline stage,
    the optimizer's state beside it, the model's persistent buffers (those
    in its state_dict: BatchNorm's running statistics), and the small
    objects ptc.torch keeps (optimizer hyper-parameters, scheduler, RNG
    states, user objects).

    `model` is the full model (build it on the meta device: only shapes
    are read). `mesh`: the axes, slowest first (default pp, dp, tp, with ep
    before tp when the plan uses it). `optimizer`: a class, an
    OptimizerState, a FlatBuffer, or the optimizer itself over `model`'s
    parameters, which then decides every parameter's slots (its param
    groups' settings, e.g. amsgrad; parameters outside it keep none).
    Frozen parameters (requires_grad=False) keep no optimizer state."""

    def __init__(self, model, plan=None, *, optimizer=None, stages=None, mesh=None,
                 name=None):
        plan = dict(plan or {})
        axes_used = {a for p in plan.values() for a in p.axes}
        if mesh is None:
            mesh = ["pp", "dp"] + (["ep"] if "ep" in axes_used else []) + ["tp"]
        self.mesh = list(mesh)
        unknown = sorted(axes_used - set(self.mesh))
        if unknown:
            raise ValueError(f"the plan cuts over {unknown}, which the mesh {self.mesh} lacks")
        self.optimizer = (optimizer if isinstance(optimizer, FlatBuffer)
                          else optimizer_state(optimizer))
        per_tensor = isinstance(self.optimizer, OptimizerState)
        self.stages = stages
        owners = {}  # parameter or buffer name -> (module, name inside it)
        for mname, module in model.named_modules():
            for pname, _ in module.named_parameters(recurse=False):
                full = f"{mname}.{pname}" if mname else pname
                owners[full] = (module, pname)
        params = list(model.named_parameters())
        if not params:
            raise ValueError("the model has no parameters")
        buffers = []
        for full, module, bname, b in _state_buffers(model):
            owners[full] = (module, bname)
            buffers.append((full, b))
        buffer_names = {f for f, _ in buffers}
        kind = lambda n: "buffer" if n in buffer_names else "parameter"  # noqa: E731
        # Which plan entry cuts each parameter and buffer.
        chosen, used = {}, {pat: 0 for pat in plan}
        for full, _ in params + buffers:
            hits = [pat for pat in plan if _under(pat, full)]
            if len(hits) > 1:
                raise ValueError(f"{kind(full)} '{full}' matches plan entries {hits}; "
                                 "make them disjoint")
            if hits:
                chosen[full] = hits[0]
                used[hits[0]] += 1
        unused = [pat for pat, n in used.items() if n == 0]
        if unused:
            raise ValueError(f"plan entries {unused} match no parameter or buffer of the model "
                             f"(its modules: {_sample([m for m, _ in model.named_modules() if m])})")
        self.num_layers, stage_of = self._stage_rules(model, [f for f, _ in params + buffers],
                                                      kind)
        kept = (_parameter_states(optimizer, self.optimizer, params) if per_tensor else {})
        tensors, members, buffer_tensors = [], [], []
        for full, p in params + buffers:
            is_buffer = full in buffer_names
            dtype = ptc_dtype(p.dtype, f"{kind(full)} '{full}'",
                              "or register it with persistent=False if the module recomputes it"
                              if is_buffer else "or keep it out of the layout")
            module, pname = owners[full]
            pl = plan.get(chosen.get(full), Replicate())
            cuts = pl.cut(module, full, list(p.shape))
            t = {"key": full, "dtype": dtype, "shape": list(p.shape)}
            if is_buffer:
                t["role"] = "other"
            if cuts:
                t["placements"] = cuts
            if stage_of[full]:
                t["stage"] = stage_of[full]
            if is_buffer:
                buffer_tensors.append(t)
                continue
            tensors.append(t)
            members.append(t)
            st = kept.get(full)
            if st is not None:
                for slot in st.slots:
                    tensors.append(dict(t, key=f"optim.{slot}.{full}", role="optimizer_state"))
                if st.step:
                    s = {"key": f"optim.step.{full}", "dtype": "fp32", "shape": [1],
                         "role": "optimizer_state"}
                    if stage_of[full]:
                        s["stage"] = stage_of[full]
                    tensors.append(s)
        flat = []
        if isinstance(self.optimizer, FlatBuffer):
            buf, state = self.optimizer.spec(members)
            flat.append(buf)
            tensors += state
        tensors += buffer_tensors
        self.spec = {
            "format_version": 1,
            "name": name or type(model).__name__,
            "mesh": self.mesh,
            "num_layers": self.num_layers,
            "tensors": tensors,
            "buffers": flat,
            "small_objects": [
                {"name": OPTIMIZER_OBJECT, "bytes": 1024},
                {"name": SCHEDULER_OBJECT, "bytes": 1024},
                {"name": EXTRA_OBJECT, "bytes": 1024},
                {"name": RNG_OBJECT, "scope": self.mesh, "new_ranks": "derive",
                 "bytes": 20000},
            ],
        }
        # ptc's own checks (names, placements against shapes).
        _capi.check_layout(json.dumps(self.spec))

    def _stage_rules(self, model, names, kind):
        st = self.stages
        if st is None:
            return 1, {n: None for n in names}
        container = dict(model.named_modules()).get(st.layers)
        if container is None:
            raise ValueError(f"Stages(layers='{st.layers}'): the model has no module "
                             f"'{st.layers}'")
        layer_names = [n for n, _ in container.named_children()]
        if not all(n.isdigit() for n in layer_names) or not layer_names:
            raise ValueError(f"the children of '{st.layers}' must be numbered layers 0..L-1 "
                             f"(an nn.ModuleList or a ModuleDict keyed '0', '1', ...); got "
                             f"{_sample(layer_names)}")
        num_layers = max(int(n) for n in layer_names) + 1
        rules = {}
        for n in names:
            m = re.match(re.escape(st.layers) + r"\.(\d+)\.", n)
            ends = [k for k, pats in (("first_and_last", st.first_and_last),
                                      ("first", st.first), ("last", st.last))
                    if any(_under(p, n) for p in pats)]
            if m:
                rules[n] = {"kind": "layer", "layer": int(m.group(1))}
            elif ends:
                rules[n] = {"kind": ends[0]}
            else:
                raise ValueError(f"{kind(n)} '{n}' is in no pipeline stage: it is not under "
                                 f"'{st.layers}' and matches none of first={st.first}, "
                                 f"last={st.last}, first_and_last={st.first_and_last}")
        return num_layers, rules

    def json(self):
        return json.dumps(self.spec, indent=1)

    def write(self, path):
        with open(path, "w") as f:
            f.write(self.json() + "\n")

    def regions(self, config):
        """Every rank's regions under `config`: [[region dict, ...], ...]."""
        return _capi.layout_regions(json.dumps(self.spec), str(config))


def _sample(names, k=6):
    names = list(names)
    return ", ".join(names[:k]) + (f", ... ({len(names)} in all)" if len(names) > k else "")


def _spec_of(layout):
    """A spec dict from a Layout, a dict, JSON text or a file; shapes as
    ints (ptc writes 64-bit numbers as strings)."""
    if isinstance(layout, Layout):
        return layout.spec
    if isinstance(layout, dict):
        spec = layout
    else:
        text = str(layout)
        if not text.lstrip().startswith("{"):
            with open(text) as f:
                text = f.read()
        spec = json.loads(text)
    for t in spec.get("tensors", []):
        t["shape"] = [int(n) for n in t.get("shape", [])]
    return spec


# ---------------------------------------------------------------- local tensors

def _placement_parts(p, config):
    return math.prod(config.size(a) for a in p.get("axes", []))


def _packed(regions):
    """Along each dimension, the extent of the distinct intervals of `regions`."""
    return tuple(sum(e - b for b, e in {tuple(r[d]) for r in regions})
                 for d in range(len(regions[0])))


def local_shape(tensor, regions, config):
    """The shape of a rank's local tensor of `tensor` (a spec entry) holding
    `regions` (boxes): along each dimension the distinct intervals packed;
    a padded shard dimension has its padded chunk."""
    shape = list(_packed(regions))
    for p in tensor.get("placements", []):
        if p.get("kind") == "shard" and int(p.get("pad_multiple", 0)):
            parts = _placement_parts(p, config)
            mult = int(p["pad_multiple"]) * parts
            shape[p.get("dim", 0)] = -(-int(tensor["shape"][p.get("dim", 0)]) // mult) * mult // parts
    return tuple(shape)


def local_slices(region, regions):
    """Where `region` sits in the local tensor holding `regions`: along each
    dimension the offset of its interval among the distinct ones."""
    return torch_state.local_slices(region, _packed(regions), regions)


FlatEntry = namedtuple("FlatEntry", ["name", "offset", "numel", "owned"])
FlatEntry.__doc__ = """A parameter in a flat buffer: where its local shard starts in
the buffer, its elements there (a shard with padding rows: the rows before
them, the first `numel` of the local tensor's memory), and `owned`: the
range (lo, hi) of those elements this rank keeps state for, or None."""
Bucket = namedtuple("Bucket", ["start", "end", "chunk"])
Bucket.__doc__ = """A bucket of a flat buffer, [start, end) in buffer elements; `chunk`:
the part (lo, hi) this rank owns, in buffer elements."""


class BufferView:
    """A flat buffer as one rank sees it under one config (flat_buffer()):
    `entries` (FlatEntry, in buffer order; parameters of the rank's stage),
    `buckets` (Bucket), `shards` (ranks the buffer is split over), `index`
    (this rank's among them), `size` (elements, with alignment and
    padding), `in_use`."""

    def __init__(self, d, name):
        self.name, self.in_use = name, bool(d["in_use"])
        self.shards, self.index = int(d["shards"]), int(d["index"])
        self.buckets = [Bucket(int(b["start"]), int(b["end"]), tuple(map(int, b["chunk"])))
                        for b in d["buckets"]]
        self.size = self.buckets[-1].end if self.buckets else 0
        self.entries = []
        for e in d["entries"]:
            off, n = int(e["offset"]), int(e["size"])
            if off < 0:
                continue
            owned = None
            for b in self.buckets:  # an entry lies in one bucket
                lo, hi = max(b.chunk[0], off), min(b.chunk[1], off + n)
                if lo < hi:
                    owned = (lo - off, hi - off)
            self.entries.append(FlatEntry(e["key"], off, n, owned))

    def owned(self):
        """{parameter name: (lo, hi)} of the ranges this rank owns."""
        return {e.name: e.owned for e in self.entries if e.owned}

    def __repr__(self):
        mine = sum(hi - lo for lo, hi in self.owned().values())
        return (f"<flat buffer '{self.name}': {self.size} elements in {len(self.buckets)} "
                f"buckets over {self.shards} ranks; index {self.index} owns {mine} elements "
                f"of {len(self.owned())} of {len(self.entries)} parameters>")


def flat_buffer(layout, config=None, rank=None, name=None):
    """Flat buffer `name` (default: the layout's only one) as `rank` sees
    it under `config`; `layout` is a Layout (or spec), or a ptc.Client (its
    job's layout, config and rank). A distributed optimizer built on it
    agrees with ptc: for each parameter in `entries` whose range `owned` is
    not None, it keeps a 1-D tensor of the local shard's elements
    [lo, hi) of its memory (an fp32 copy with main_params, else a view
    of the parameter), and optimizer state for those. save() and load()
    take it as an object with .optimizer (the torch optimizer over those
    tensors) and .shards ({parameter name: that tensor})."""
    if isinstance(layout, _capi.Client):
        text, config, rank = layout.layout, str(layout.config), layout.rank
        spec = _spec_of(text)
    else:
        spec = _spec_of(layout)
        text = json.dumps(spec)
        if config is None or rank is None:
            raise ValueError("flat_buffer(layout, config, rank): give the config and the rank")
    names = [b.get("name", "") for b in spec.get("buffers", [])]
    if name is None:
        if len(names) != 1:
            raise ValueError(f"the layout has {len(names)} flat buffers "
                             f"({', '.join(names) or 'none'}); name one")
        name = names[0]
    rank = int(rank)
    if not 0 <= rank < 2**31:
        raise ValueError(f"rank {rank} is not a rank of {config}")
    return BufferView(_capi.buffer_view(text, str(config), name, rank), name)


def _flat_parts(optimizer, where):
    """(torch optimizer, {name: shard}) of a flat-buffer optimizer object."""
    inner, shards = getattr(optimizer, "optimizer", None), getattr(optimizer, "shards", None)
    if not isinstance(inner, torch.optim.Optimizer) or not isinstance(shards, dict):
        raise ValueError(
            f"{where}: the job's layout keeps the optimizer's state in a flat buffer (a "
            "distributed optimizer); pass an object with .optimizer (the torch optimizer "
            "over this rank's ranges) and .shards ({parameter name: 1-D tensor of its "
            f"range}}), not {type(optimizer).__name__} (see ptc.torch.flat_buffer)")
    return inner, shards


def _torch_optimizer(optimizer):
    """The torch optimizer whose param_groups and steps a save keeps."""
    if optimizer is not None and hasattr(optimizer, "shards") and hasattr(optimizer, "optimizer"):
        return optimizer.optimizer
    return optimizer


class _Rank:
    """This rank's view of the job's layout: its regions by key, the spec's
    tensors, the flat buffers in use, and the local tensors they map to."""

    def __init__(self, client):
        text = client.layout
        self.spec = _spec_of(text)
        self.config = client.config
        self.rank = client.rank
        self.tensors = {t["key"]: t for t in self.spec["tensors"]}
        self.regions = client.regions
        self.by_key = {}
        for r in self.regions:
            self.by_key.setdefault(r["key"], []).append(r["region"])
        # Members of flat buffers in use: key -> (buffer, parameter, lo, hi),
        # and parameter -> (buffer, lo, hi) of the ranges this rank owns.
        self.buffers, self.member, self.owned = {}, {}, {}
        for b in self.spec.get("buffers", []):
            view = BufferView(_capi.buffer_view(text, str(self.config), b["name"], self.rank),
                              b["name"])
            if not view.in_use:
                continue
            self.buffers[view.name] = view
            owned = view.owned()
            for t in self.spec["tensors"]:
                if t.get("buffer") != view.name:
                    continue
                if not t.get("slot"):
                    raise ValueError(f"the job's layout shards '{t['key']}' itself by flat "
                                     f"ranges of buffer '{view.name}' (FSDP-style); ptc.torch "
                                     "maps parameters held as tensors and optimizer state in "
                                     "flat buffers")
                if t["key"] in self.by_key:
                    if t["slot"] not in owned:
                        raise ValueError(f"rank {self.rank}: the layout gives '{t['key']}' "
                                         f"regions but buffer '{view.name}' no range of "
                                         f"'{t['slot']}' to this rank")
                    self.member[t["key"]] = (view.name, t["slot"], *owned[t["slot"]])
                    self.owned[t["slot"]] = (view.name, *owned[t["slot"]])

    def expected(self, key):
        if key in self.member:
            _, _, lo, hi = self.member[key]
            return (hi - lo,)
        return local_shape(self.tensors[key], self.by_key[key], self.config)

    def view(self, key, region, tensor):
        """The part of local tensor `tensor` of `key` that holds `region`."""
        if key not in self.member:
            return tensor[local_slices(region, self.by_key[key])]
        # A flat range of the parameter's local shard: the box lies in one
        # of the parameter's regions, and its elements are consecutive in
        # the local tensor's memory from where its first one sits.
        buf, name, lo, hi = self.member[key]
        boxes = self.by_key.get(name, [])
        box = next((b for b in boxes if all(b0 <= r0 and r1 <= b1 for (b0, b1), (r0, r1)
                                            in zip(b, region))), None)
        shape = local_shape(self.tensors[name], boxes, self.config) if boxes else ()
        at, rows = 0, False
        if box is not None:
            sls = local_slices(box, boxes)
            # Whole rows of the local tensor: consecutive in its memory.
            rows = all(sl.start == 0 and sl.stop == n for sl, n in zip(sls[1:], shape[1:]))
            for sl, (b0, _), (r0, _), n in zip(sls, box, region, shape):
                at = at * n + sl.start + r0 - b0
        size = math.prod(r1 - r0 for r0, r1 in region)
        if not rows or not lo <= at < at + size <= hi:
            raise ValueError(f"rank {self.rank}: '{key}' holds {region} of buffer '{buf}', "
                             f"which is not elements [{lo}, {hi}) of this rank's shard of "
                             f"'{name}' {boxes}; the buffer does not follow the local "
                             "tensor's memory order")
        return tensor[at - lo:at - lo + size].view([r1 - r0 for r0, r1 in region])


def _local_tensors(client, model, optimizer, create_state):
    """{spec key: local tensor} for every key this rank holds, checked
    against the job's layout: every parameter and persistent buffer known
    and held here, every held key given, shapes and dtypes as the layout
    says, the optimizer's slots those the layout keeps. With
    `create_state`, missing optimizer state is created (zeros) to load into."""
    rank = _Rank(client)
    params = dict(model.named_parameters())
    buffers = {n: b for n, _, _, b in _state_buffers(model)}
    where = f"rank {rank.rank} ({client.config}, coordinates {client.coord})"
    param_keys = {k for k, t in rank.tensors.items() if t.get("role", "") in ("", "parameter")}
    buffer_keys = {k for k, t in rank.tensors.items() if t.get("role") == "other"}
    problems = []
    held = list(rank.by_key)  # in the layout's order
    for what, mine, keys in (("parameters", params, param_keys), ("buffers", buffers, buffer_keys)):
        extra = [n for n in mine if n not in keys]
        if extra:
            problems.append(f"the model has {what} the layout lacks: {_sample(extra)}" + (
                " (ptc.torch keeps a module's persistent buffers, those in its state_dict: "
                "build the Layout from this model, or register a buffer the module "
                "recomputes with persistent=False)" if what == "buffers" else ""))
        elsewhere = [n for n in mine if n in keys and n not in held and not any(
            int(p.get("pad_multiple", 0)) for p in rank.tensors[n].get("placements", []))]
        if elsewhere:
            problems.append(f"the layout puts these {what} on other pipeline stages: "
                            f"{_sample(elsewhere)}")
        missing = [k for k in held if k in keys and k not in mine]
        if missing:
            problems.append(f"the model lacks {what} this rank holds in the layout: "
                            f"{_sample(sorted(missing))}")
    if problems:
        raise ValueError(f"{where}: the model does not match the job's layout: "
                         + "; ".join(problems))
    out = {k: params[k] for k in held if k in param_keys}
    out.update({k: buffers[k] for k in held if k in buffer_keys})
    state_keys = [k for k in held if k not in param_keys and k not in buffer_keys]
    if state_keys and optimizer is None:
        raise ValueError(f"the job's layout holds optimizer state ({_sample(state_keys, 2)}); "
                         "pass the optimizer")
    if optimizer is not None and not any(
            t.get("role") == "optimizer_state" for t in rank.tensors.values()):
        try:
            kept = optimizer_state(optimizer)
            stateful = bool(kept.slots or kept.step)
        except ValueError:
            stateful = True
        if stateful:
            raise ValueError("an optimizer was given but the job's layout keeps no optimizer "
                             "state; build the Layout with optimizer=")
    if rank.buffers and optimizer is not None:
        out.update(_flat_state(rank, optimizer, state_keys, where, create_state))
    elif optimizer is not None:
        if hasattr(optimizer, "shards"):
            if state_keys:
                raise ValueError(f"{where}: the optimizer keeps flat shards but the job's layout "
                                 "keeps per-parameter state; build the Layout with "
                                 "optimizer=ptc.torch.FlatBuffer(...)")
        else:
            out.update(_parameter_state(rank, optimizer, params,
                                        [k for k in held if k in param_keys], state_keys,
                                        where, create_state))
    for k, t in out.items():
        spec_t = rank.tensors[k]
        want_shape = rank.expected(k)
        got = tuple(t.shape)
        want_dtype = torch_dtype(spec_t["dtype"])
        if got != want_shape:
            hint = ""
            for p in spec_t.get("placements", []):
                if p.get("kind") == "grouped_shard":
                    hint = (" (the layout cuts it as groups "
                            f"{p.get('groups')}{' x %d blocks' % p['repeats'] if p.get('repeats', 1) > 1 else ''}"
                            f" over {p['axes']}: each rank holds its chunk of each)")
                elif p.get("kind") == "shard" and int(p.get("pad_multiple", 0)):
                    dim = p.get("dim", 0)
                    mult = int(p["pad_multiple"]) * _placement_parts(p, rank.config)
                    size = int(spec_t["shape"][dim])
                    hint = (f" (dimension {dim} of {size} is padded to a multiple of "
                            f"{p['pad_multiple']} x {_placement_parts(p, rank.config)} parts, "
                            f"{-(-size // mult) * mult}, at every config, one part included: "
                            "build the module at its padded size, as Megatron does, or cut "
                            "it with a smaller pad, e.g. VocabParallel(pad=1), which pads "
                            "only to a multiple of the parts)")
            raise ValueError(f"{where}: '{k}' has local shape {got} but the layout expects "
                             f"{want_shape} for this rank (global {tuple(spec_t['shape'])}, "
                             f"regions {rank.by_key[k]}){hint}")
        if t.dtype != want_dtype:
            raise TypeError(f"{where}: '{k}' is {t.dtype} but the layout says {want_dtype}")
    return rank, out


_REBUILD_LAYOUT = (
    "build the job's Layout from the optimizer itself, with its final settings and param "
    "groups (ptc.torch.Layout(model, plan, optimizer=opt): it keeps every slot the optimizer "
    "has, e.g. max_exp_avg_sq of Adam(amsgrad=True) or SGD's momentum_buffer, and none for "
    "parameters outside it or frozen), or with optimizer=ptc.torch.OptimizerState(slots=[...], "
    "step=...), and register the job with that layout")


def _settings(group):
    keys = [k for k in ("amsgrad", "momentum", "centered") if k in group]
    return ", ".join(f"{k}={group[k]}" for k in keys)


def _parameter_state(rank, optimizer, params, held_params, state_keys, where, create_state):
    """{key: local tensor} of a per-parameter optimizer's state on this
    rank, after checking that the optimizer keeps exactly the slots the
    layout keeps for each parameter held here: those its param group's
    settings give (an optimizer ptc.torch knows) and those its state holds.
    A parameter outside the optimizer keeps none."""
    kept = {}  # parameter name -> slots the layout keeps for it ("step": its step)
    for k, t in rank.tensors.items():
        parts = k.split(".", 2)
        if t.get("role") == "optimizer_state" and len(parts) == 3 and parts[0] == "optim":
            kept.setdefault(parts[2], []).append(parts[1])
    group_of = {id(p): (i, g) for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
    cls = type(optimizer)
    problems = {}  # (parameter, slot) -> what is wrong
    for name in held_params:
        p, slots = params[name], kept.get(name, [])
        if id(p) not in group_of:
            if slots:
                problems[name, ""] = (f"'{name}' is not in the optimizer's param_groups but the "
                                      f"layout keeps its optimizer state ({', '.join(slots)})")
            continue
        i, group = group_of[id(p)]
        held = _held_state(optimizer, p, name)
        has = held.slots + (["step"] if held.step else [])
        known = _known_state(cls, group) if (p.requires_grad or has) else None
        if known is not None:
            want = known.slots + (["step"] if known.step else [])
            how = f"param group {i}" + (f": {_settings(group)}" if _settings(group) else "")
            for slot in want:
                if slot not in slots:
                    problems.setdefault((name, slot), (
                        f"{cls.__name__} ({how}) keeps '{slot}' of '{name}', which the layout "
                        f"lacks (no 'optim.{slot}.{name}': it would be lost)"))
            for slot in slots:
                if slot not in want:
                    problems.setdefault((name, slot), (
                        f"the layout keeps 'optim.{slot}.{name}', which {cls.__name__} ({how}) "
                        f"does not keep (its slots: {', '.join(want) or 'none'})"))
        for slot in has:
            if slot not in slots:
                problems.setdefault((name, slot), (
                    f"the optimizer's state of '{name}' holds '{slot}', which the layout lacks "
                    f"(no 'optim.{slot}.{name}': it would be lost)"))
        if has and not create_state:
            for slot in slots:
                if slot not in has:
                    problems.setdefault((name, slot), (
                        f"the layout keeps 'optim.{slot}.{name}' but the optimizer's state of "
                        f"'{name}' holds no '{slot}' (it holds {', '.join(has)})"))
    if problems:
        found = list(problems.values())
        raise ValueError(f"{where}: the optimizer does not match the job's layout: "
                         + "; ".join(found[:4])
                         + (f"; ... ({len(found)} in all)" if len(found) > 4 else "")
                         + f". {_REBUILD_LAYOUT[0].upper()}{_REBUILD_LAYOUT[1:]}")
    out = {}
    for k in state_keys:
        _, slot, name = k.split(".", 2)
        p = params.get(name)
        if p is None:
            raise ValueError(f"{where}: the layout holds '{k}' but the model has no "
                             f"parameter '{name}'")
        # Before the first step an optimizer has no state: a save writes
        # what the first step would start from (zeros), a load creates it.
        st = optimizer.state[p] if create_state else optimizer.state.get(p, {})
        if slot == "step":
            cur = st.get("step", 0.0)
            if not torch.is_tensor(cur) or cur.dtype != torch.float32:
                cur = torch.tensor(float(cur))
            if create_state:
                st["step"] = cur
            out[k] = cur.reshape(1)
        else:
            cur = st.get(slot)
            if cur is None:
                cur = torch.zeros_like(p.data, memory_format=torch.preserve_format)
                if create_state:
                    st[slot] = cur
            out[k] = cur
    return out


def _flat_state(rank, optimizer, state_keys, where, create_state):
    """{key: local tensor} of the optimizer state a flat-buffer optimizer
    keeps on this rank: each member's 1-D range (its shard, or the state
    slot of it) and the step."""
    inner, shards = _flat_parts(optimizer, where)
    owned = rank.owned
    stray = sorted(n for n, t in shards.items() if n not in owned and t.numel())
    if stray:
        raise ValueError(f"{where}: the optimizer keeps shards of {_sample(stray)}, of which "
                         "this rank owns no range in the layout's flat buffer; build it from "
                         "ptc.torch.flat_buffer(...)")
    in_opt = {id(p) for g in inner.param_groups for p in g["params"]}
    out = {}
    for name, (buf, lo, hi) in owned.items():
        t = shards.get(name)
        if t is None:
            raise ValueError(f"{where}: the optimizer keeps no shard of '{name}'; this rank owns "
                             f"its elements [{lo}, {hi}) in flat buffer '{buf}'")
        if tuple(t.shape) != (hi - lo,):
            raise ValueError(f"{where}: the shard of '{name}' has shape {tuple(t.shape)}; this "
                             f"rank owns its elements [{lo}, {hi}) in flat buffer '{buf}', a "
                             f"1-D tensor of {hi - lo}")
        if id(t) not in in_opt:
            raise ValueError(f"{where}: the shard of '{name}' is not in the optimizer's "
                             "param_groups")
    # The optimizer keeps no slot the buffer lacks (it would be lost).
    slots = {t["key"].split(".", 2)[1] for t in rank.tensors.values()
             if t.get("buffer") and t.get("slot")} | (
                 {"step"} if "optim.step" in rank.tensors else set())
    for name in owned:
        held = _held_state(inner, shards[name], name)
        for slot in held.slots + (["step"] if held.step else []):
            if slot not in slots:
                raise ValueError(
                    f"{where}: the optimizer's state of the shard of '{name}' holds '{slot}', "
                    "which the job's flat buffer does not keep (it would be lost); build the "
                    "Layout with ptc.torch.FlatBuffer(opt, ...) of the optimizer itself, with "
                    "its final settings, and register the job with that layout")
    for k in state_keys:
        if k == "optim.step":
            # One step for all: the optimizer's (every range steps together).
            steps = [st["step"] for st in inner.state.values() if "step" in st]
            out[k] = torch.tensor([float(steps[0]) if steps else 0.0])
            continue
        if k not in rank.member:
            raise ValueError(f"{where}: the layout holds '{k}' outside the flat buffers; "
                             "ptc.torch keeps an optimizer's state all in one or all per "
                             "parameter")
        _, name, _, _ = rank.member[k]
        slot = k.split(".", 2)[1]
        t = shards[name]
        if slot == "main":
            out[k] = t
            continue
        st = inner.state[t] if create_state else inner.state.get(t, {})
        cur = st.get(slot)
        if cur is None:  # before the first step: what it starts from
            cur = torch.zeros_like(t)
            if create_state:
                st[slot] = cur
        out[k] = cur
    return out


def state_tensors(client, model, optimizer=None):
    """{key: local tensor} of every key of the job's layout this rank holds
    (parameters, and optimizer state as "optim.<slot>.<name>"), checked
    against the layout as save() checks them."""
    return _local_tensors(client, model, optimizer, create_state=False)[1]


def state_regions(client, model, optimizer=None):
    """[(region, tensor)] for every region this rank holds (a dict as in
    client.regions: key, region, index, dtype, ...): the part of the
    model's or optimizer's tensor that holds it, a view (writes go to the
    model). Checked against the layout as save() checks."""
    rank, tensors = _local_tensors(client, model, optimizer, create_state=False)
    return [(r, rank.view(r["key"], r["region"], tensors[r["key"]].detach()))
            for r in rank.regions]


# ---------------------------------------------------------------- small objects

def encode(obj):
    """Plain data (None, bool, int, float, str, bytes, list, tuple, dict,
    tensors, ptc.DataCursor) as bytes; decode() reads it back without
    running code (no pickle)."""
    def enc(o):
        if o is None or isinstance(o, (bool, int, float, str)):
            return o
        if isinstance(o, bytes):
            return {"__b": base64.b64encode(o).decode()}
        if isinstance(o, tuple):
            return {"__t": [enc(x) for x in o]}
        if isinstance(o, list):
            return [enc(x) for x in o]
        if isinstance(o, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in o):
                return {k: enc(v) for k, v in o.items()}
            return {"__d": [[enc(k), enc(v)] for k, v in o.items()]}
        if isinstance(o, _capi.DataCursor):
            return {"__cursor": base64.b64encode(o.encode()).decode()}
        if torch.is_tensor(o):
            t = o.detach().cpu().contiguous()
            raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
            return {"__tensor": ptc_dtype(t.dtype, "a tensor in a small object"),
                    "shape": list(t.shape),
                    "data": base64.b64encode(raw.numpy().tobytes()).decode()}
        if isinstance(o, np.ndarray):
            return {"__ndarray": o.dtype.str, "shape": list(o.shape),
                    "data": base64.b64encode(np.ascontiguousarray(o).tobytes()).decode()}
        if isinstance(o, (np.integer, np.floating)):
            return o.item()
        raise TypeError(f"ptc.torch keeps plain data (numbers, strings, bytes, lists, dicts, "
                        f"tensors); got {type(o).__name__}")
    return json.dumps(enc(obj), separators=(",", ":")).encode()


def decode(data):
    def dec(o):
        if isinstance(o, list):
            return [dec(x) for x in o]
        if not isinstance(o, dict):
            return o
        if "__b" in o:
            return base64.b64decode(o["__b"])
        if "__t" in o:
            return tuple(dec(x) for x in o["__t"])
        if "__d" in o:
            return {dec(k): dec(v) for k, v in o["__d"]}
        if "__cursor" in o:
            return _capi.DataCursor.decode(base64.b64decode(o["__cursor"]))
        if "__tensor" in o:
            dtype = torch_dtype(o["__tensor"])
            raw_dtype = torch.int16 if dtype == torch.bfloat16 else dtype
            arr = np.frombuffer(base64.b64decode(o["data"]),
                                dtype=torch.zeros(0, dtype=raw_dtype).numpy().dtype)
            t = torch.from_numpy(arr.copy()).reshape(o["shape"])
            return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t
        if "__ndarray" in o:
            return np.frombuffer(base64.b64decode(o["data"]),
                                 dtype=np.dtype(o["__ndarray"])).reshape(o["shape"]).copy()
        return {k: dec(v) for k, v in o.items()}
    return dec(json.loads(data.decode()))


def _encoded(obj, what):
    data = encode(obj)
    if len(data) > _capi.MAX_SMALL_OBJECT_BYTES:
        raise ValueError(f"{what} takes {len(data)} bytes encoded; ptc keeps at most "
                         f"{_capi.MAX_SMALL_OBJECT_BYTES} per small object (keep large "
                         "data in tensors of the model or the layout)")
    return data


def _rng_state():
    st = {"torch": torch.get_rng_state(), "python": random.getstate(),
          "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def new_rank_seed(derived, job, base_seed):
    """The seed a rank whose coordinates are new starts its generators
    from: ptc's derived seed (from the object's name, the rank's
    coordinates and the new version) mixed with the job's name and the
    process's base seed (torch.initial_seed() when it loads: the seed it
    gave torch.manual_seed), so that two jobs, or one job run with two
    seeds, give a new rank different streams. The first 8 bytes,
    little-endian, of BLAKE2b of "ptc.torch.seed:<derived>:<job>:<base>"."""
    text = f"ptc.torch.seed:{int(derived)}:{job}:{int(base_seed)}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def _set_rng_state(raw, job):
    derived = _capi.derived_seed(raw)
    if derived is not None:
        # A rank whose coordinates are new: a fresh stream, never a copy.
        seed = new_rank_seed(derived, job, torch.initial_seed())
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        return
    st = decode(raw)
    torch.set_rng_state(st["torch"])
    random.setstate(_tuples(st["python"]))
    np.random.set_state(_tuples(st["numpy"]))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _tuples(o):
    return tuple(_tuples(x) for x in o) if isinstance(o, (list, tuple)) else o


# ---------------------------------------------------------------- save, load

Saved = namedtuple("Saved", ["step", "version"])


class Restored(dict):
    """The user objects a load returns, with the step of the save as `.step`
    and ptc's version as `.version`."""
    step = 0
    version = 0


def _infer_step(optimizer, scheduler):
    optimizer = _torch_optimizer(optimizer)
    if optimizer is not None:
        for st in optimizer.state.values():
            if "step" in st:
                return int(st["step"])
    if scheduler is not None and hasattr(scheduler, "last_epoch"):
        return int(scheduler.last_epoch)
    raise ValueError("pass step=: the optimizer keeps no step and there is no scheduler")


def small_objects(optimizer=None, scheduler=None, extra=None):
    """[(name, bytes)] of the small objects save() writes for a rank: the
    optimizer's param_groups, the scheduler, `extra`, the RNG states."""
    groups = None
    if optimizer is not None:
        groups = [{k: v for k, v in g.items() if k != "params"} | {"params": len(g["params"])}
                  for g in _torch_optimizer(optimizer).param_groups]
    return [(name, _encoded(obj, what)) for name, obj, what in (
        (OPTIMIZER_OBJECT, groups, "the optimizer's param_groups"),
        (SCHEDULER_OBJECT, scheduler.state_dict() if scheduler is not None else None,
         "the scheduler's state_dict"),
        (EXTRA_OBJECT, dict(extra or {}), "extra"),
        (RNG_OBJECT, _rng_state(), "the RNG states"))]


def save(client, model, optimizer=None, scheduler=None, extra=None, *, step=None,
         wait=True, timeout=300.0, change_serial=0, known_dropped=None, began=None):
    """Saves this rank's parameters, persistent buffers, optimizer state
    (with its param_groups), scheduler, RNG states and `extra` (plain data:
    a dict of numbers, strings, tensors, ptc.DataCursor ...) as one version
    of the job. Every local tensor is checked against the job's layout
    first (a mismatch raises naming the tensor, and so does an optimizer
    whose slots are not the layout's; nothing is written). `step` (default:
    the optimizer's step, or the scheduler's last_epoch) is what a load
    returns. With `wait`, returns once every rank saved and the version
    committed. `change_serial`: the pending change the save is made for
    (ptc.elastic passes it when a hot switch does not start).
    `known_dropped`: see Client.begin_save (ptc.elastic passes it).
    `began`: the save, if this rank already began it (Client.begin_save;
    ptc.elastic does, to agree with the other ranks that every one could
    before anything is written); `step`, `change_serial` and
    `known_dropped` are then the begin's. If anything fails once the save
    began, this rank gives the version up (the ranks that reported it are
    told); the error raised carries the version as `e.version`."""
    if began is not None:
        step = began.step
    elif step is None:
        step = _infer_step(optimizer, scheduler)
    s = began
    try:
        rank, tensors = _local_tensors(client, model, optimizer, create_state=False)
        # Encode everything before the save starts: a bad object fails early.
        objects = small_objects(optimizer, scheduler, extra)
        if s is None:
            s = client.begin_save(int(step), change_serial, known_dropped)
        copies = torch_state.RegionCopies()
        for r in rank.regions:
            copies.save(s, r["index"], rank.view(r["key"], r["region"],
                                                 tensors[r["key"]].detach()))
        copies.finish()
        for name, data in objects:
            s.put_small_object(name, data)
    except BaseException as e:
        if s is None:
            raise  # nothing began
        # This rank cannot save the version: its peers that reported it
        # are told (they would otherwise wait for its commit), and save
        # again. Best effort: the coordinator may be unreachable too.
        s.abandon(f"rank {client.rank}: {type(e).__name__}: {e}")
        if isinstance(e, _capi.Error):
            e.version = s.version  # the save's (ptc.elastic asks if it was deleted)
        raise
    try:
        s.commit()  # gives the version up itself if ptcd fails its part
    except _capi.Error as e:
        e.version = s.version
        raise
    if wait:
        client.wait_committed(s.version, timeout=timeout)
    return Saved(int(step), s.version)


def load(client, model, optimizer=None, scheduler=None):
    """Loads the job's committed version into this rank's modules: every
    parameter, persistent buffer and optimizer state tensor (checked
    against the layout as save() does), the optimizer's param_groups
    hyper-parameters, the scheduler, the RNG states (a rank whose
    coordinates are new gets a fresh seed: new_rank_seed() of ptc's derived
    seed, the job's name and torch.initial_seed()). Returns the saved
    `extra` (a dict) with `.step`."""
    rank, tensors = _local_tensors(client, model, optimizer, create_state=True)
    state = client.load()
    with torch.no_grad():
        for k, t in tensors.items():
            # Elements the layout does not store (vocabulary padding) are zero.
            if t.numel() != sum(math.prod(e - b for b, e in box) for box in rank.by_key[k]):
                t.zero_()
        copies = torch_state.RegionCopies()
        for r in rank.regions:
            copies.load(state, r["index"], r["dtype"],
                        rank.view(r["key"], r["region"], tensors[r["key"]]))
        copies.finish()
    if optimizer is not None:
        inner = _torch_optimizer(optimizer)
        if rank.buffers and "optim.step" in tensors:  # one step for every range
            for t in optimizer.shards.values():
                if t in inner.state:
                    inner.state[t]["step"] = tensors["optim.step"][0].clone()
        groups = decode(state.small_object(OPTIMIZER_OBJECT))
        if groups is None or len(groups) != len(inner.param_groups):
            raise ValueError(f"the saved optimizer had {len(groups or [])} param_groups; this "
                             f"one has {len(inner.param_groups)}: build it the same way")
        for g, saved in zip(inner.param_groups, groups):
            for k, v in saved.items():
                if k != "params":
                    g[k] = v
    if scheduler is not None:
        sd = decode(state.small_object(SCHEDULER_OBJECT))
        if sd is None:
            raise ValueError("the save has no scheduler state; pass scheduler=None or save one")
        scheduler.load_state_dict(sd)
    _set_rng_state(state.small_object(RNG_OBJECT), client.job)
    out = Restored(decode(state.small_object(EXTRA_OBJECT)) or {})
    out.step = client.committed_step
    out.version = state.version
    del state
    return out


# ---------------------------------------------------------------- without a cluster

def _placement_text(t):
    parts = []
    for p in t.get("placements", []):
        axes = ",".join(p.get("axes", []))
        kind = p.get("kind", "replicate")
        if kind == "shard":
            pad = f", pad {p['pad_multiple']}" if int(p.get("pad_multiple", 0)) else ""
            parts.append(f"shard dim {p.get('dim', 0)} over {axes}{pad}")
        elif kind == "grouped_shard":
            rep = f" x {p['repeats']}" if int(p.get("repeats", 1)) > 1 else ""
            parts.append(f"groups {p.get('groups')}{rep} of dim {p.get('dim', 0)} over {axes}")
        elif kind == "select":
            parts.append(f"item {p.get('item', 0)}/{p.get('items')} over {axes}")
    return "; ".join(parts) or "replicated"


def _mib(n):
    return f"{n / 2**20:.2f} MiB"


def describe(layout, config, rank=None, state=False):
    """A readable account of a layout under `config`: every rank (or only
    `rank`) with each parameter's local shape, regions and cut (with
    `state`, the optimizer's tensors too: cut as their parameter, or ranges
    of a flat buffer), the flat buffers, and the bytes it holds. Needs no cluster; raises what ptc would refuse."""
    spec = _spec_of(layout)
    text = json.dumps(spec)
    _capi.check_layout(text, str(config))
    regions = _capi.layout_regions(text, str(config))
    cfg = _capi.ParallelConfig.parse(str(config), spec.get("mesh", []))
    tensors = {t["key"]: t for t in spec["tensors"]}
    total = sum(math.prod(t["shape"]) * torch.zeros(0, dtype=torch_dtype(t["dtype"])).element_size()
                for t in spec["tensors"])
    lines = [f"layout '{spec.get('name', '')}': mesh {', '.join(cfg.mesh)}; config {cfg} "
             f"({cfg.world_size} ranks); {len(tensors)} tensors, {_mib(total)}"]
    ranks = range(cfg.world_size) if rank is None else [rank]
    for r in ranks:
        if not 0 <= r < cfg.world_size:
            raise ValueError(f"rank {r} is outside {cfg.world_size} ranks of {cfg}")
        mine = regions[r]
        by_key = {}
        for reg in mine:
            by_key.setdefault(reg["key"], []).append(reg["region"])
        coord = ", ".join(f"{a}={i}" for a, i in zip(cfg.mesh, cfg.coord_of(r)))
        views = [BufferView(_capi.buffer_view(text, str(config), b["name"], r), b["name"])
                 for b in spec.get("buffers", [])]
        views = {v.name: v for v in views if v.in_use}
        shown = {k: b for k, b in by_key.items()
                 if state or tensors[k].get("role", "") != "optimizer_state"}
        hidden = len(by_key) - len(shown)
        lines.append(f"rank {r} ({coord}): {len(by_key)} tensors, "
                     f"{_mib(sum(reg['bytes'] for reg in mine))}"
                     + (f" ({hidden} of optimizer state, "
                        + ("in flat buffers" if views else "cut as their parameters") + ")"
                        if hidden else ""))
        for v in views.values():
            axes = ",".join(next(b.get("axes", []) for b in spec["buffers"]
                                 if b["name"] == v.name))
            lines.append(f"  flat buffer '{v.name}' over {axes}: {v.size} elements in "
                         f"{len(v.buckets)} buckets, split {v.shards} ways; index {v.index} "
                         f"owns {sum(hi - lo for lo, hi in v.owned().values())} elements of "
                         f"{len(v.owned())} of its {len(v.entries)} parameters")
        width = max((len(k) for k in shown), default=0)
        for k, boxes in shown.items():
            t = tensors[k]
            if t.get("buffer") in views:
                n = sum(math.prod(e - b for b, e in box) for box in boxes)
                lo, hi = views[t["buffer"]].owned()[t["slot"]]
                lines.append(f"  {k:<{width}}  {t['dtype']:<8} local {str([n]):<14} "
                             f"of {t['shape']}  elements [{lo}, {hi}) of the shard of "
                             f"'{t['slot']}' (flat buffer '{t['buffer']}')")
                continue
            shape = list(local_shape(t, boxes, cfg))
            where = " ".join("[" + ", ".join(f"{b}:{e}" for b, e in box) + "]" for box in boxes)
            lines.append(f"  {k:<{width}}  {t['dtype']:<8} local {str(shape):<14} "
                         f"of {t['shape']}  {where}  ({_placement_text(t)})")
    return "\n".join(lines)


def shard_state(full, layout, config, rank):
    """This rank's local tensors, cut from full ones: {key: full tensor} ->
    {key: local tensor} for every key of `full` the rank holds (a model
    loaded from an unsharded checkpoint; the forward check)."""
    spec = _spec_of(layout)
    cfg = _capi.ParallelConfig.parse(str(config), spec.get("mesh", []))
    tensors = {t["key"]: t for t in spec["tensors"]}
    regions = _capi.layout_regions(json.dumps(spec), str(config))
    if not 0 <= rank < len(regions):
        raise ValueError(f"rank {rank} is outside the {len(regions)} ranks of {config}")
    by_key = {}
    for reg in regions[rank]:
        by_key.setdefault(reg["key"], []).append(reg["region"])
    out = {}
    for k, boxes in by_key.items():
        if k not in full:
            continue
        src = full[k]
        local = torch.zeros(local_shape(tensors[k], boxes, cfg), dtype=src.dtype)
        for box in boxes:
            local[local_slices(box, boxes)] = src[tuple(slice(b, e) for b, e in box)]
        out[k] = local
    return out


def _forward_worker(rank, world, port, config, build, forward, inputs, full, layout, result):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        model = build(config, rank)
        params = dict(model.named_parameters())
        local = shard_state(full, layout, config, rank) if full is not None else None
        with torch.no_grad():
            if local is not None:
                for k, p in params.items():
                    if k not in local:
                        raise ValueError(f"rank {rank} of {config}: the layout gives no "
                                         f"part of '{k}' to this rank")
                    if tuple(local[k].shape) != tuple(p.shape):
                        raise ValueError(f"rank {rank} of {config}: '{k}' has local shape "
                                         f"{tuple(p.shape)} but the layout cuts "
                                         f"{tuple(local[k].shape)}")
                    p.copy_(local[k])
            out = forward(model, inputs)
        if rank == 0:
            torch.save({"output": out, "state": {k: p.detach().clone() for k, p in
                                                 params.items()} if full is None else None},
                       result)
    finally:
        dist.destroy_process_group()


def check_forward(build, forward, layout, inputs, config, *, reference="",
                  rtol=1e-4, atol=1e-5, seed=0):
    """Checks the one thing a layout cannot show: the order of rows inside
    each rank's shard. Builds the model at `reference` (default: every axis
    1) with `seed`, runs forward(model, inputs) there, cuts its parameters
    into every rank's local tensors under `config` with the layout, builds
    the model on each rank (build(config, rank), in its own process of a
    gloo group), loads them and runs the forward again; rank 0's output must
    equal the reference within rtol/atol. Returns {"max_abs_diff": ...}.
    `build` and `forward` run in forked processes (no pipeline stages)."""
    import os
    import socket
    import tempfile
    import torch.multiprocessing as mp

    spec = _spec_of(layout)

    def run(cfg, full):
        world = _capi.ParallelConfig.parse(str(cfg), spec.get("mesh", [])).world_size
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        fd, path = tempfile.mkstemp(suffix=".pt")
        os.close(fd)
        try:
            torch.manual_seed(seed)
            mp.start_processes(_forward_worker, nprocs=world, start_method="fork",
                               args=(world, port, str(cfg), build, forward, inputs, full,
                                     spec, path))
            return torch.load(path)
        finally:
            os.unlink(path)

    ref = run(reference, None)
    got = run(config, ref["state"])
    a, b = ref["output"], got["output"]
    if a.shape != b.shape:
        raise ValueError(f"the forward pass under {config} gives shape {tuple(b.shape)}, "
                         f"under the reference {tuple(a.shape)}")
    diff = (a.double() - b.double()).abs().max().item()
    if not torch.allclose(a, b, rtol=rtol, atol=atol):
        raise ValueError(
            f"the forward pass under {config} differs from the reference by up to {diff:.3g}: "
            "the model's local tensors hold their rows in another order than the layout "
            "says (e.g. q|k|v stacked per head but declared as groups, or the reverse)")
    return {"max_abs_diff": diff}


# Live jobs: the processes follow changes without restarting (ptc/elastic.py).
from .elastic import Live, elastic  # noqa: E402,F401
