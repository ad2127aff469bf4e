"""What users do today instead of ptc, for the pause benchmark: every rank
torch.saves its shards (with where they sit in the global tensors) to a
checkpoint directory, and every new rank torch.loads the old ranks' files
and re-slices them into its own shards (as checkpoint conversion does)."""

import json
import pathlib

import torch

import ptc.torch as pt


def _intersect(a, b):
    return [(max(x[0], y[0]), min(x[1], y[1])) for x, y in zip(a, b)]


def save(directory, rank, client, model, optimizer, extra):
    tensors = pt.state_tensors(client, model, optimizer)
    by_key = {}
    for r in client.regions:
        by_key.setdefault(r["key"], []).append(r["region"])
    shards = [(r["key"], r["region"],
               tensors[r["key"]].detach()[pt.local_slices(r["region"], by_key[r["key"]])].clone())
              for r in client.regions]
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({"shards": shards, "extra": extra}, directory / f"rank{rank}.pt")
    # An index (like Megatron's per-rank file names), so that a new rank
    # opens only the files it needs.
    (directory / f"rank{rank}.index.json").write_text(
        json.dumps([(r["key"], r["region"]) for r in client.regions]))


def load(directory, client, model, optimizer):
    """Fills the model's and optimizer's local tensors from the files;
    returns old rank 0's extra objects."""
    directory = pathlib.Path(directory)
    holder = {}
    for index in sorted(directory.glob("rank*.index.json")):
        for key, region in json.loads(index.read_text()):
            holder.setdefault((key, json.dumps(region)), index.name.split(".")[0] + ".pt")
    needed = set()
    for r in client.regions:
        for (key, region), f in holder.items():
            if key == r["key"] and all(b < e for b, e in _intersect(json.loads(region),
                                                                     r["region"])):
                needed.add(f)
    old = [torch.load(directory / f) for f in sorted(needed)]
    # Optimizer state exists only after a step: create it to fill.
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state[p]
            st.setdefault("step", torch.tensor(0.0))
            st.setdefault("exp_avg", torch.zeros_like(p))
            st.setdefault("exp_avg_sq", torch.zeros_like(p))
    tensors = pt.state_tensors(client, model, optimizer)
    by_key = {}
    for r in client.regions:
        by_key.setdefault(r["key"], []).append(r["region"])
    with torch.no_grad():
        for r in client.regions:
            dst_all = tensors[r["key"]][pt.local_slices(r["region"], by_key[r["key"]])]
            for saved in old:
                for key, region, data in saved["shards"]:
                    if key != r["key"]:
                        continue
                    inter = _intersect(region, r["region"])
                    if any(b >= e for b, e in inter):
                        continue
                    dst = tuple(slice(b - o[0], e - o[0]) for (b, e), o in zip(inter, r["region"]))
                    src = tuple(slice(b - o[0], e - o[0]) for (b, e), o in zip(inter, region))
                    dst_all[dst] = data[src]
    return old[0]["extra"] if old else {}
