"""What users do today instead of ptc, for the pause benchmark: every rank
torch.saves its shards (with where they sit in the global tensors) to a
checkpoint directory, and every new rank torch.loads the old ranks' files
and re-slices them into its own shards (as checkpoint conversion does)."""

import json
import pathlib

import torch

import harness
import ptc.torch as pt


def save(directory, rank, client, model, optimizer, extra):
    shards = harness.local_values(client, model, optimizer)
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
            if key == r["key"] and all(max(b0, b1) < min(e0, e1) for (b0, e0), (b1, e1)
                                       in zip(json.loads(region), r["region"])):
                needed.add(f)
    old = [torch.load(directory / f) for f in sorted(needed)]
    shards = [s for saved in old for s in saved["shards"]]
    # Optimizer state exists only after a step: create it to fill (a
    # distributed optimizer's over its ranges).
    inner = getattr(optimizer, "optimizer", optimizer)
    for group in inner.param_groups:
        for p in group["params"]:
            st = inner.state[p]
            st.setdefault("step", torch.tensor(0.0))
            st.setdefault("exp_avg", torch.zeros_like(p))
            st.setdefault("exp_avg_sq", torch.zeros_like(p))
    with torch.no_grad():
        for r, dst_all in pt.state_regions(client, model, optimizer):
            for dst, src, data in harness.overlaps(shards, r["key"], r["region"]):
                dst_all[dst] = data[src]
    return old[0]["extra"] if old else {}
