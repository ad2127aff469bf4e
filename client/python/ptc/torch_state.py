"""PyTorch parameters and Adam state <-> the model spec's tensors.

A rank's local tensor (a Megatron shard) is the rank's regions of the
global tensor packed together: along each dimension, the distinct
intervals the rank's regions cover, in order, one after the other. For a
plain split that is the rank's chunk; for a grouped split (GQA's q|k|v,
SwiGLU's gate|up) it is the rank's chunk of each group, concatenated, as
Megatron lays out a fused column-parallel weight. Local rows past the
packed extent are padding (the padded vocabulary rows of a vocab-parallel
embedding are never stored: they are zero and stay so).

    tensors = torch_state.collect(named_params, optimizer)
    version = torch_state.save(client, step, tensors, small_objects)
    ...
    torch_state.prepare_adam(named_params, optimizer, step)
    tensors = torch_state.collect(named_params, optimizer)
    state = torch_state.load(client, tensors)   # copies into `tensors`
"""

import os
import sys
import warnings

import numpy as np
import torch

from . import _capi

_TORCH_DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}

ADAM_SLOTS = ("master", "exp_avg", "exp_avg_sq")


def local_slices(region, local_shape, regions=None):
    """The slices of a local tensor of `local_shape` that hold `region` (a
    list of (begin, end) in global coordinates), where `regions` are all of
    the rank's regions of that tensor (default: `region` alone). Along each
    dimension the local tensor holds the distinct intervals of `regions`
    packed in order; a region's place is its interval's offset there."""
    regions = [region] if regions is None else regions
    if len(region) != len(local_shape):
        raise ValueError(f"region {region} has {len(region)} dims but the local "
                         f"tensor has shape {tuple(local_shape)}")
    out = []
    for d, n in enumerate(local_shape):
        spans = sorted({tuple(r[d]) for r in regions})
        for (b0, e0), (b1, e1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise ValueError(f"regions {regions} overlap partly along dimension {d}: "
                                 "not a layout a local tensor can hold")
        offset = 0
        for span in spans:
            if span == tuple(region[d]):
                break
            offset += span[1] - span[0]
        packed = sum(e - b for b, e in spans)
        if packed > n:
            raise ValueError(f"the rank's regions {regions} do not fit a local tensor of "
                             f"shape {tuple(local_shape)} along dimension {d} ({packed} > "
                             f"{n}): layout mismatch")
        begin, end = region[d]
        out.append(slice(offset, offset + end - begin))
    return tuple(out)


# Bytes of contiguous staging copies (of strided GPU views) the copies may
# hold on a GPU before they wait for the queued ones and free them.
_STAGING_LIMIT = 1 << 30

# GPUs where CUDA is not usable from ptc (said once per process).
_NO_GPU_COPIES = {}


class RegionCopies:
    """Copies between local tensors and the regions of one save or load.
    CUDA tensors move through the store's shared memory registered as
    pinned host memory, on a side stream after the work the tensor's
    current stream queued (ptc's DeviceCopies: the GPU's DMA engines read
    and write the store's pages directly); CPU tensors, and GPU tensors
    where CUDA is not usable from ptc (said once) or PTC_PINNED_COPIES=0,
    through host memory.
    finish() must run before the save commits and before loaded tensors
    are used:

        copies = RegionCopies()
        for r in client.regions:
            copies.save(s, r["index"], local_view)
        copies.finish()
        s.commit()
    """

    def __init__(self):
        self._gpu = {}       # device index -> _capi.DeviceCopies
        self._held = []      # tensors the queued copies read or write
        self._staged = 0     # bytes of staging copies among them
        self._scatter = []   # (strided view, staged load) to copy at finish
        self.stats = {"gpu_regions": 0, "gpu_bytes": 0, "host_regions": 0,
                      "pageable_regions": 0, "register_seconds": 0.0}

    def _device(self, t):
        if not t.is_cuda:
            return None
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        if index in _NO_GPU_COPIES:
            return None
        if index not in self._gpu:
            if os.environ.get("PTC_PINNED_COPIES", "1") == "0":
                _NO_GPU_COPIES[index] = "turned off (PTC_PINNED_COPIES=0)"
                return None
            try:
                self._gpu[index] = _capi.DeviceCopies(index)
            except _capi.Error as e:
                _NO_GPU_COPIES[index] = str(e)
                print(f"ptc: GPU {index}'s tensors go through pageable host memory "
                      f"(slower): {e}", file=sys.stderr, flush=True)
                return None
        return self._gpu[index]

    def _hold(self, t, staged):
        self._held.append(t)
        if staged:
            self._staged += t.numel() * t.element_size()
            if self._staged >= _STAGING_LIMIT:
                self.finish()

    def save(self, s, index, part):
        """Queues region `index` of save `s` from `part` (the local tensor's
        view that holds it)."""
        copies = self._device(part)
        if copies is None:
            if part.dtype == torch.bfloat16:
                part = part.view(torch.int16)
            s.write(index, part.detach().contiguous().cpu().numpy())
            self.stats["host_regions"] += 1
            return
        src = part.detach().contiguous()
        copies.save(s, index, src.data_ptr(), src.numel() * src.element_size(),
                    torch.cuda.current_stream(src.device).cuda_stream)
        self._hold(src, staged=src.data_ptr() != part.data_ptr())

    def load(self, state, index, ptc_dtype, view):
        """Queues region `index` of loaded `state` into `view` (the local
        tensor's view that holds it, of the region's dtype and shape)."""
        copies = self._device(view)
        if copies is None:
            if not view.is_cuda and view.is_contiguous():
                # Straight into the tensor through the region's descriptor:
                # nothing mapped (mapping small regions page by page costs
                # several times the copy on a VM).
                out = view.detach()
                if out.dtype == torch.bfloat16:
                    out = out.view(torch.int16)
                state.read_into(index, out.numpy())
            else:
                with torch.no_grad():
                    view.copy_(region_tensor(state, index, ptc_dtype))
            self.stats["host_regions"] += 1
            return
        dst = view if view.is_contiguous() else torch.empty(
            view.shape, dtype=view.dtype, device=view.device)
        copies.load(state, index, dst.data_ptr(), dst.numel() * dst.element_size(),
                    torch.cuda.current_stream(dst.device).cuda_stream)
        if dst is not view:
            self._scatter.append((view, dst))
        self._hold(dst, staged=dst is not view)

    def finish(self):
        """Waits for the queued GPU copies; places staged loads."""
        for copies in self._gpu.values():
            st = copies.finish()
            self.stats["gpu_regions"] += st["regions"]
            self.stats["gpu_bytes"] += st["bytes"]
            self.stats["pageable_regions"] += st["pageable_regions"]
            self.stats["register_seconds"] += st["register_seconds"]
            if st["pageable_regions"]:
                print(f"ptc: {st['pageable_regions']} regions copied pageable on GPU "
                      f"{copies.device}: {st['pageable_reason']}", file=sys.stderr, flush=True)
        with torch.no_grad():
            for view, staged in self._scatter:
                view.copy_(staged)
        self._scatter.clear()
        self._held.clear()
        self._staged = 0
        return self.stats


def regions_by_key(client_or_regions):
    """{key: [region, ...]}: a rank's regions of each tensor (from a Client
    or its `regions` list), what local_slices needs to place one."""
    regions = getattr(client_or_regions, "regions", client_or_regions)
    by_key = {}
    for r in regions:
        by_key.setdefault(r["key"], []).append(r["region"])
    return by_key


def torch_dtype(ptc_dtype):
    if ptc_dtype not in _TORCH_DTYPES:
        raise ValueError(f"ptc dtype {ptc_dtype} has no PyTorch equivalent")
    return _TORCH_DTYPES[ptc_dtype]


def region_tensor(state, index, ptc_dtype):
    """A read-only torch view of a loaded region, without a copy."""
    arr = state.region(index)
    if ptc_dtype == "bf16":
        arr = arr.view(np.int16)
    with warnings.catch_warnings():
        # The mapping is read-only; torch warns that it cannot enforce it.
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(arr)
    if ptc_dtype == "bf16":
        t = t.view(torch.bfloat16)
    return t


def keyed_parameters(model, key_of):
    """{ptc key: parameter} from a module's named_parameters(): `key_of`
    maps a parameter's name (e.g. "blocks.3.mlp.0.weight") to its model-spec
    key (e.g. "layers.3.mlp.fc1.weight"), or to None for a parameter ptc
    does not keep. Two names mapping to one key is an error."""
    out = {}
    for name, p in model.named_parameters():
        key = key_of(name)
        if key is None:
            continue
        if key in out:
            raise ValueError(f"parameters '{name}' and another both map to '{key}'")
        out[key] = p
    return out


def collect(named_params, optimizer=None):
    """{ptc key: local tensor} for parameters ({ptc key: parameter}) and, with
    an Adam optimizer, its state as "optim.<slot>.<key>" (the fp32 master
    weight of an fp32 parameter is the parameter itself)."""
    out = {}
    for key, p in named_params.items():
        out[key] = p.data
        if optimizer is None:
            continue
        st = optimizer.state.get(p)
        if not st or "exp_avg" not in st:
            raise ValueError(f"the optimizer has no Adam state for '{key}' yet; "
                             "call prepare_adam() (or take a step) first")
        out["optim.master." + key] = p.data if p.dtype == torch.float32 else p.data.float()
        out["optim.exp_avg." + key] = st["exp_avg"]
        out["optim.exp_avg_sq." + key] = st["exp_avg_sq"]
    return out


def prepare_adam(named_params, optimizer, step):
    """Creates zeroed Adam state at `step` for every parameter, so that a
    load can fill it in place."""
    for p in named_params.values():
        optimizer.state[p] = {
            "step": torch.tensor(float(step)),
            "exp_avg": torch.zeros_like(p.data, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(p.data, memory_format=torch.preserve_format),
        }


def save(client, step, tensors, small_objects):
    """Saves this rank's regions of `tensors` and its small objects at
    training step `step`; returns the version ptc gave the save (committed
    once every rank saved it: client.wait_committed(version))."""
    s = client.begin_save(step)
    by_key = regions_by_key(client)
    copies = RegionCopies()
    for r in client.regions:
        t = tensors.get(r["key"])
        if t is None:
            raise KeyError(f"rank {client.rank} holds a region of '{r['key']}' but no "
                           "local tensor was given for it")
        want = torch_dtype(r["dtype"])
        if t.dtype != want:
            raise TypeError(f"'{r['key']}' is {t.dtype} locally but {r['dtype']} in "
                            "the model spec")
        sl = local_slices(r["region"], t.shape, by_key[r["key"]])
        copies.save(s, r["index"], t[sl])
    copies.finish()
    for name, data in small_objects.items():
        s.put_small_object(name, data)
    s.commit()
    return s.version


def load(client, tensors):
    """Loads this rank's regions of the committed version into `tensors`
    (the same dict collect() returns, allocated); returns the ptc.State for
    the small objects."""
    state = client.load()
    by_key = regions_by_key(client)
    copies = RegionCopies()
    filled = {}
    for r in client.regions:
        t = tensors.get(r["key"])
        if t is None:
            raise KeyError(f"rank {client.rank} holds a region of '{r['key']}' but no "
                           "local tensor was given for it")
        if t.dtype != torch_dtype(r["dtype"]):
            raise TypeError(f"'{r['key']}' is {t.dtype} locally but {r['dtype']} in "
                            "the model spec")
        view = t[local_slices(r["region"], t.shape, by_key[r["key"]])]
        copies.load(state, r["index"], r["dtype"], view)
        filled[r["key"]] = filled.get(r["key"], 0) + view.numel()
    copies.finish()
    missing = [k for k in tensors if k not in filled]
    if missing:
        raise KeyError(f"rank {client.rank} got no region of {missing[:3]}: the "
                       "model's tensors do not match the job's layout")
    return state
