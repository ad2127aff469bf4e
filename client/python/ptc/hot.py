"""The hot switch: a live job's processes move their state to a new layout
between themselves, over the process groups they already have, following
ptc's plan, and save the new layout's first version to the store; the
coordinator commits the change with that save.

ptc's planner decides which host sends each piece of every new region
(nothing crosses hosts that the receiving host holds, senders balanced);
the client's plan (Client.hot_plan) names, on that host, the process that
sends it: the receiving process itself when it holds the piece (a local
copy), else the least loaded holder. Every process computes the same plan,
so each sends and receives without asking anyone: every piece of 1 MiB or
more as a message of its own (straight from the sender's tensor into the
receiver's buffer where contiguous), smaller ones packed into one message
per pair of processes, all posted at once (torch.distributed.batch_isend_irecv; NCCL
on GPUs, gloo on CPU). Small objects (optimizer hyper-parameters, the
scheduler, `extra`, RNG states) follow the store's rules: a new rank takes
the copy of the old rank ptc's rules name, or a value derived for its new
coordinates.

Live (elastic.py) runs it; this module is its mechanics:

    plan = client.hot_plan(serial)
    bufs = receive_buffers(target_client.regions, device)
    sent = exchange(plan, me, rank_view, tensors, bufs, target_client.regions)
"""

import math
from collections import defaultdict

import torch
import torch.distributed as dist

from . import torch_state
from . import _capi


def _inside(box, outer):
    return all(o0 <= b0 and b1 <= o1 for (b0, b1), (o0, o1) in zip(box, outer))


def _sub(view, box, outer):
    """The part of `view` (which holds region `outer`) that holds `box`."""
    return view[tuple(slice(b0 - o0, b1 - o0) for (b0, b1), (o0, _) in zip(box, outer))]


_ARENA_ALIGN = 64  # views carved from one allocation start at multiples of it


def _carve(sizes, device):
    """uint8 tensors of `sizes` bytes, views into one allocation: its fresh
    memory is mapped in huge pages (with the agent's malloc settings), where
    a tensor of its own per piece of about 1 MiB is mapped a 4 KiB page at
    a time as bytes arrive (4 processes receiving 315 MiB each over gloo,
    in 1.2 MiB messages, on the CI VM: 2.7-3.7 s into a fresh tensor per
    message, 0.5-0.7 s into one fresh allocation)."""
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += -(-n // _ARENA_ALIGN) * _ARENA_ALIGN
    arena = torch.empty(at, dtype=torch.uint8, device=device)
    return [arena[o:o + n] for o, n in zip(offsets, sizes)]


def receive_buffers(regions, device):
    """One tensor per target region (client.regions of the switch's target
    rank), in the region's shape and dtype (views into one allocation)."""
    shapes = [[e - b for b, e in r["region"]] for r in regions]
    dtypes = [torch_state.torch_dtype(r["dtype"]) for r in regions]
    sizes = [math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
             for shape, dtype in zip(shapes, dtypes)]
    return [raw.view(dtype).view(shape)
            for raw, dtype, shape in zip(_carve(sizes, device), dtypes, shapes)]


# A piece of at least this many bytes travels as a message of its own,
# straight from the sender's tensor and into the receiver's buffer where
# they are contiguous (no packing copy); smaller pieces between a pair of
# processes are packed into one message. The rule reads only the plan, so
# both sides of a pair agree on the messages and their order.
DIRECT_BYTES = 1 << 20
_ALIGN = 8  # packed pieces start at multiples of it (any dtype's view)


def _nbytes(t):
    return t.numel() * t.element_size()


def _packed_at(pieces):
    """Offsets of `pieces` (tensors) in their packed message, and its size."""
    at, offsets = 0, []
    for t in pieces:
        offsets.append(at)
        at += -(-_nbytes(t) // _ALIGN) * _ALIGN
    return offsets, at


def _in(msg, at, like):
    """The bytes of `msg` from `at` viewed as a tensor shaped like `like`."""
    return msg[at:at + _nbytes(like)].view(like.dtype).view(like.shape)


def exchange(plan, me, rank_view, tensors, buffers, regions, device,
             direct_bytes=DIRECT_BYTES):
    """Sends this process's pieces and receives its target's (all at once),
    copying local pieces directly. me: this process's rank in the current
    world; rank_view / tensors: its current state (ptc.torch's view of the
    old layout); buffers / regions: its target rank's receive buffers and
    regions (empty for a process that leaves); direct_bytes: the size from
    which a piece is a message of its own (every process of the switch must
    use the same; Live takes $PTC_HOT_DIRECT_BYTES). Returns bytes sent to
    and received from other processes."""
    process_of = plan["process_of"]
    held = defaultdict(list)  # key -> regions this process holds
    for r in rank_view.regions:
        held[r["key"]].append(r["region"])
    wanted = defaultdict(list)  # key -> [(region, buffer)]
    for r, buf in zip(regions, buffers):
        wanted[r["key"]].append((r["region"], buf))
    views = {}

    def source(key, box):
        for i, outer in enumerate(held[key]):
            if _inside(box, outer):
                if (key, i) not in views:
                    views[key, i] = rank_view.view(key, outer, tensors[key].detach())
                return _sub(views[key, i], box, outer)
        raise RuntimeError(f"the hot switch's plan has this process send {box} of '{key}', "
                           "which it does not hold")

    def target(key, box):
        for outer, buf in wanted[key]:
            if _inside(box, outer):
                return _sub(buf, box, outer)
        raise RuntimeError(f"the hot switch's plan sends {box} of '{key}' to this process, "
                           "whose target rank does not hold it")

    # Per peer, in the plan's order: pieces sent (received) on their own,
    # and pieces packed.
    sends, recvs = defaultdict(lambda: ([], [])), defaultdict(lambda: ([], []))
    with torch.no_grad():
        for key, box, src, dst in plan["transfers"]:
            to = process_of[dst]
            if src == me and to == me:
                target(key, box).copy_(source(key, box))
            elif src == me:
                piece = source(key, box)
                sends[to][_nbytes(piece) < direct_bytes].append(piece)
            elif to == me:
                piece = target(key, box)
                recvs[src][_nbytes(piece) < direct_bytes].append(piece)
        # Staging (a non-contiguous piece sent or received on its own, the
        # packed messages) in one allocation, in the order used below.
        staged = []
        for side in (sends, recvs):
            for peer in sorted(side):
                direct, packed = side[peer]
                staged += [_nbytes(p) for p in direct if not p.is_contiguous()]
                if packed:
                    staged.append(_packed_at(packed)[1])
        stage = iter(_carve(staged, device))
        ops, scatter = [], []  # scatter: (received, its place) after the wait
        sent = received = 0
        for peer in sorted(sends):
            direct, packed = sends[peer]
            for piece in direct:
                if not piece.is_contiguous():
                    piece = _in(next(stage), 0, piece).copy_(piece)
                ops.append(dist.P2POp(dist.isend, piece.view(-1), peer))
            if packed:
                msg = next(stage)
                for piece, at in zip(packed, _packed_at(packed)[0]):
                    _in(msg, at, piece).copy_(piece)
                ops.append(dist.P2POp(dist.isend, msg, peer))
            sent += sum(_nbytes(p) for p in direct + packed)
        for peer in sorted(recvs):
            direct, packed = recvs[peer]
            for place in direct:
                into = place
                if not place.is_contiguous():
                    into = _in(next(stage), 0, place)
                    scatter.append((into, place))
                ops.append(dist.P2POp(dist.irecv, into.view(-1), peer))
            if packed:
                msg = next(stage)
                scatter.extend((_in(msg, at, place), place)
                               for place, at in zip(packed, _packed_at(packed)[0]))
                ops.append(dist.P2POp(dist.irecv, msg, peer))
            received += sum(_nbytes(p) for p in direct + packed)
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        for got, place in scatter:
            place.copy_(got)
    return sent, received


def exchange_small_objects(plan, me, mine, job, version, device):
    """This process's target rank's small objects: {name: bytes}, each from
    the old rank ptc's rules name (its process sends it) or derived for
    its new coordinates. mine: [(name, bytes)] this process would save."""
    process_of = plan["process_of"]
    own = dict(mine)
    out = {}
    sends, recvs = defaultdict(list), defaultdict(list)
    for m in plan["small_objects"]:
        to = process_of[m["target_rank"]]
        if m["derive_from"]:
            if to == me:
                out[m["name"]] = _capi.derived_small_object(job, m["name"], m["derive_from"],
                                                          version)
            continue
        if m["source_rank"] == me and to == me:
            out[m["name"]] = own[m["name"]]
        elif m["source_rank"] == me:
            sends[to].append(m["name"])
        elif to == me:
            recvs[m["source_rank"]].append(m["name"])
    # Lengths first, then the bytes: one message per pair each time.
    lengths, ops = {}, []
    for peer in sorted(sends):
        n = torch.tensor([len(own[name]) for name in sends[peer]], dtype=torch.int64,
                         device=device)
        ops.append(dist.P2POp(dist.isend, n, peer))
    for peer in sorted(recvs):
        lengths[peer] = torch.empty(len(recvs[peer]), dtype=torch.int64, device=device)
        ops.append(dist.P2POp(dist.irecv, lengths[peer], peer))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    ops, inbound = [], {}
    for peer in sorted(sends):
        data = b"".join(own[name] for name in sends[peer])
        msg = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        ops.append(dist.P2POp(dist.isend, msg, peer))
    for peer in sorted(recvs):
        inbound[peer] = torch.empty(int(lengths[peer].sum()), dtype=torch.uint8, device=device)
        ops.append(dist.P2POp(dist.irecv, inbound[peer], peer))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    for peer, msg in inbound.items():
        raw, at = msg.cpu().numpy().tobytes(), 0
        for name, n in zip(recvs[peer], lengths[peer].tolist()):
            out[name] = raw[at:at + n]
            at += n
    return out


def save_target(save, regions, buffers, objects):
    """Writes the target rank's regions and small objects into the switch's
    save and commits it (True if this completed the version)."""
    copies = torch_state.RegionCopies()
    for r, buf in zip(regions, buffers):
        copies.save(save, r["index"], buf)
    copies.finish()
    for name, data in objects.items():
        save.put_small_object(name, data)
    return save.commit()
