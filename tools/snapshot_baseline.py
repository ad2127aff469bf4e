"""The baseline a user would pick instead of ptc's snapshots, for
tools/snapshot_benchmark.sh (not a test): the same shards written with
torch.save (one process per host file, as each rank saves its own), and a
restore under another config as torch.load of every file plus re-slicing
into the target ranks' regions.

  snapshot_baseline.py save SNAPSHOT_DIR OUT_DIR   -> seconds
  snapshot_baseline.py load SNAPSHOT_DIR OUT_DIR TARGETS_JSON -> seconds

The shards' shapes and places come from the ptc snapshot's manifest, so
both write the same bytes. Prints the measured seconds on stdout.
"""
import json
import multiprocessing as mp
import os
import sys
import time

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
          "fp64": torch.float64, "int64": torch.int64, "int32": torch.int32,
          "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}


def region(r):
    """A manifest region (proto3 JSON: int64 as strings, zeros omitted)."""
    return [(int(d.get("begin", 0)), int(d.get("end", 0))) for d in r.get("dims", [])]


def manifest(snapshot_dir):
    with open(os.path.join(snapshot_dir, "manifest.json")) as f:
        m = json.load(f)
    tensors = m["tensors"]
    shards = {}  # file -> [(key, dtype, region)]
    for r in m["regions"]:
        t = tensors[int(r.get("tensor", 0))]
        shards.setdefault(r["file"], []).append(
            (t["key"], t.get("dtype", "fp32"), region(r["region"])))
    return tensors, shards


def shape(reg):
    return [e - b for b, e in reg]


def save_one(path, items, barrier, out):
    d = {f"{key}@{reg}": torch.ones(shape(reg), dtype=DTYPES[dtype])
         for key, dtype, reg in items}
    barrier.wait()
    t = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(d, f)
        f.flush()
        os.fsync(f.fileno())
    out.put(time.perf_counter() - t)


def save(snapshot_dir, out_dir):
    _, shards = manifest(snapshot_dir)
    os.makedirs(out_dir, exist_ok=True)
    barrier = mp.Barrier(len(shards) + 1)
    q = mp.Queue()
    procs = [mp.Process(target=save_one,
                        args=(os.path.join(out_dir, f + ".pt"), items, barrier, q))
             for f, items in shards.items()]
    for p in procs:
        p.start()
    barrier.wait()  # every process holds its shards in memory
    t = time.perf_counter()
    for _ in procs:
        q.get()
    for p in procs:
        p.join()
    return time.perf_counter() - t


def load(snapshot_dir, out_dir, targets_json):
    tensors, shards = manifest(snapshot_dir)
    with open(targets_json) as f:
        targets = json.load(f)  # [[key, [[begin, end], ...]], ...]
    t = time.perf_counter()
    sources = {}  # key -> [(region, tensor)]
    for f, items in shards.items():
        d = torch.load(os.path.join(out_dir, f + ".pt"))
        for key, _, reg in items:
            sources.setdefault(key, []).append((reg, d[f"{key}@{reg}"]))
    dtype_of = {t["key"]: DTYPES[t.get("dtype", "fp32")] for t in tensors}
    built = []
    for key, reg in targets:
        reg = [tuple(d) for d in reg]
        dst = torch.empty(shape(reg), dtype=dtype_of[key])
        for sreg, src in sources.get(key, []):
            both = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(reg, sreg)]
            if any(b <= a for a, b in both):
                continue
            dst[tuple(slice(a - r[0], b - r[0]) for (a, b), r in zip(both, reg))] = \
                src[tuple(slice(a - s[0], b - s[0]) for (a, b), s in zip(both, sreg))]
        built.append(dst)
    return time.perf_counter() - t


if __name__ == "__main__":
    if sys.argv[1] == "save":
        print(f"{save(sys.argv[2], sys.argv[3]):.3f}")
    else:
        print(f"{load(sys.argv[2], sys.argv[3], sys.argv[4]):.3f}")
