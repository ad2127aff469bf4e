"""ptc.torch with the job's state on a GPU (skipped where PyTorch sees no
CUDA device: the development machine and CI; tools/device_check.sh runs it
on a GPU machine). Saves copy CUDA tensors into the store's shared memory
registered as pinned host memory, and loads copy back, on a side stream
(ptc's DeviceCopies); every byte must come back, across changes of tensor
parallelism made by the store between saves and loads.

Ranks of one job are clients in this one process (a machine with one GPU
has no second GPU for a second rank's process), each holding its shard on
the GPU; no process group is needed to save and load."""
import json
import os

import pytest
import torch

from cluster import LocalCluster
from torch_jobs import DTYPES, AllDtypes, connect, register

if os.environ.get("PTC_REQUIRE_GPU") == "1" and not torch.cuda.is_available():
    raise RuntimeError("PTC_REQUIRE_GPU=1 but PyTorch sees no CUDA device")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="PyTorch sees no CUDA device")


@pytest.fixture(scope="module")
def pt(ptc_module):
    import ptc.torch
    return ptc.torch


@pytest.fixture
def cluster(bin_dir, tmp_path):
    c = LocalCluster(bin_dir, tmp_path, hosts=2, gpus=2)
    yield c
    c.stop()


@pytest.fixture
def copy_stats(monkeypatch):
    """What every RegionCopies.finish did (regions through the GPU's pinned
    path, through host memory, pageable)."""
    from ptc import torch_state
    seen = []
    finish = torch_state.RegionCopies.finish

    def recording(self):
        st = finish(self)
        seen.append(dict(st))
        return st
    monkeypatch.setattr(torch_state.RegionCopies, "finish", recording)
    return seen


def test_every_dtype_round_trips_gpu_store_gpu_bit_for_bit(pt, ptc_module, cluster, tmp_path,
                                                           copy_stats):
    register(cluster, tmp_path, pt.Layout(AllDtypes(True, "meta", (64, 33))))
    client = connect(ptc_module, cluster)
    saved = AllDtypes(True, "cuda", (64, 33))
    pt.save(client, saved, step=4)
    got = AllDtypes(False, "cuda", (64, 33))
    assert pt.load(client, got).step == 4
    for (name, a), (_, b) in zip(saved.named_parameters(), got.named_parameters()):
        assert b.is_cuda and a.dtype == b.dtype and torch.equal(a, b), name
    # Both ways went through the GPU's pinned path, none through host memory.
    assert [s["gpu_regions"] for s in copy_stats] == [len(DTYPES)] * 2
    assert all(s["pageable_regions"] == 0 for s in copy_stats)


class Block(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.qkv = torch.nn.Linear(h, 3 * h)
        self.proj = torch.nn.Linear(h, h)
        self.fc1 = torch.nn.Linear(h, 4 * h)
        self.fc2 = torch.nn.Linear(4 * h, h)
        self.norm = torch.nn.LayerNorm(h)


class Gpt(torch.nn.Module):
    """A GPT's tensors (Megatron's cut: q|k|v and fc1 by rows, proj and fc2
    by columns), enough to hold real training state on a GPU."""

    def __init__(self, layers=4, h=256, vocab=1024):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, h)
        self.blocks = torch.nn.ModuleList(Block(h) for _ in range(layers))
        self.head = torch.nn.Linear(h, vocab, bias=False)


def plan(pt, h=256):
    return {"blocks.*.qkv": pt.Colwise(groups=(h, h, h)), "blocks.*.proj": pt.Rowwise(),
            "blocks.*.fc1": pt.Colwise(), "blocks.*.fc2": pt.Rowwise(), "head": pt.Colwise()}


def local_model(pt, full_state, layout, config, rank):
    """Rank `rank`'s shard of the full model under `config`, on the GPU."""
    model = Gpt().to("meta")
    for key, t in pt.shard_state(full_state, layout, config, rank).items():
        module, _, attr = key.rpartition(".")
        setattr(model.get_submodule(module), attr,
                torch.nn.Parameter(t.clone().to("cuda")))
    return model


def train(pt, model, layout, config, rank, steps, seed):
    """Adam steps with the rank's shard of random full gradients (as
    tensor parallelism's all-reduces leave them: a replicated parameter
    gets the same gradient on every rank), on the GPU."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    shapes = {k: layout_shape(layout, k) for k, _ in model.named_parameters()}
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        full = {k: torch.randn(shape, generator=g) for k, shape in shapes.items()}
        local = pt.shard_state(full, layout, config, rank)
        for k, p in model.named_parameters():
            p.grad = local[k].to(p.device)
        opt.step()
    return opt


def layout_shape(layout, key):
    return next(t["shape"] for t in layout.spec["tensors"] if t["key"] == key)


def snapshot(model, opt):
    out = {}
    for name, p in model.named_parameters():
        out[name] = p.detach().clone()
        for slot in ("exp_avg", "exp_avg_sq"):
            out[f"{slot}:{name}"] = opt.state[p][slot].clone()
    return out


def host_of(cluster, rank, job="t"):
    for host in ("host0", "host1"):
        r = cluster.ptcctl("ranks", "--job", job, "--host", host, "--json", check=True)
        if rank in [x["rank"] for x in json.loads(r.stdout)["ranks"]]:
            return host
    raise AssertionError(f"no host holds rank {rank}")


def test_a_gpu_job_changes_its_tensor_parallelism_bit_for_bit(pt, ptc_module, cluster, tmp_path,
                                                              copy_stats):
    torch.manual_seed(0)
    full = Gpt()
    layout = pt.Layout(full, plan(pt), optimizer=torch.optim.Adam)
    register(cluster, tmp_path, layout, config="tp=2", hosts="host0")
    full_state = {k: v.detach() for k, v in full.named_parameters()}

    # tp=2: both ranks train on the GPU and save.
    held = []
    for rank in range(2):
        model = local_model(pt, full_state, layout, "tp=2", rank)
        opt = train(pt, model, layout, "tp=2", rank, 3, seed=1)
        pt.save(connect(ptc_module, cluster, rank=rank), model, opt, step=3, wait=rank == 1)
        held.append(snapshot(model, opt))
    # Every GPU tensor went through the pinned path; only Adam's step
    # counters (CPU tensors in PyTorch 2) through host memory.
    step_regions = sum(1 for r in connect(ptc_module, cluster).regions
                       if r["key"].startswith("optim.step"))
    on_gpu = sum(p.numel() * p.element_size() * 3 for h in held for k, p in h.items()
                 if ":" not in k)
    assert sum(s["gpu_bytes"] for s in copy_stats) == on_gpu, copy_stats
    assert sum(s["host_regions"] for s in copy_stats) == 2 * step_regions, copy_stats

    # tp=2 -> tp=1 on the other host: one rank holds everything.
    r = cluster.ptcctl("reconfigure", "--job", "t", "--to", "tp=1", "--hosts", "host1")
    assert r.returncode == 0, r.stderr
    model = Gpt().to("cuda")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    assert pt.load(connect(ptc_module, cluster, rank=0, host="host1"), model, opt).step == 3
    whole = snapshot(model, opt)
    for slot in ("", "exp_avg:", "exp_avg_sq:"):
        state = {k[len(slot):]: v for k, v in whole.items()
                 if k.startswith(slot) and (slot or ":" not in k)}
        for rank in range(2):
            for key, shard in pt.shard_state(state, layout, "tp=2", rank).items():
                assert torch.equal(shard.cpu(), held[rank][slot + key].cpu()), \
                    f"{slot}{key} of rank {rank}"
    # The loaded state trains on.
    train(pt, model, layout, "tp=1", 0, 1, seed=9)

    # And back to tp=2 on both hosts: each rank gets its own shard again.
    r = cluster.ptcctl("reconfigure", "--job", "t", "--to", "tp=2", "--hosts", "host0,host1")
    assert r.returncode == 0, r.stderr
    for rank in range(2):
        client = connect(ptc_module, cluster, rank=rank, host=host_of(cluster, rank))
        local = local_model(pt, {k: torch.zeros_like(v) for k, v in full_state.items()},
                            layout, "tp=2", rank)
        lopt = torch.optim.Adam(local.parameters(), lr=1e-3)
        pt.load(client, local, lopt)
        for key, p in local.named_parameters():
            assert p.is_cuda
            assert torch.equal(p.detach(), held[rank][key]), f"{key} of rank {rank}"
            assert torch.equal(lopt.state[p]["exp_avg"], held[rank][f"exp_avg:{key}"])
    assert all(s["pageable_regions"] == 0 for s in copy_stats)
