"""ptc.torch_state with grouped tensors (GQA's q|k|v, SwiGLU's gate|up): a
rank's local tensor is its chunk of every group, concatenated (Megatron's
fused column-parallel layout), built here from the global tensors without
ptc's help. Saved and loaded at the same layout, and across a tp change,
every parameter and Adam slot comes back exactly."""
import pytest

from cluster import LocalCluster

# tp=3 gives groups of unequal size per rank (q: 16 rows, k and v: 8) and
# uneven chunks (ffn 40 = 14 + 13 + 13).
MODEL = "llama:layers=2,hidden=48,heads=12,kv_heads=6,ffn=40,vocab=64"


def global_tensor(torch, key, dtype, shape):
    """Deterministic values per tensor, the same in every rank."""
    g = torch.Generator().manual_seed(sum(map(ord, key)) * 7919 + len(key))
    return torch.randn(shape, generator=g).to(dtype)


def megatron_local(torch, full, regions):
    """The local tensor of a rank holding `regions` of `full`: a single
    region as it is; several (a grouped split, all along dimension 0)
    concatenated in order."""
    pieces = sorted(regions, key=lambda r: r[0][0])
    boxes = [full[tuple(slice(b, e) for b, e in r)] for r in pieces]
    return torch.cat(boxes, dim=0) if len(boxes) > 1 else boxes[0].clone()


def expected_locals(torch, torch_state, client, globals_):
    by_key = torch_state.regions_by_key(client)
    return {k: megatron_local(torch, globals_[k], regs) for k, regs in by_key.items()}


def clients_for(ptc, cluster, job, n):
    hosts = cluster.job(job)["rank_hosts"]
    return [ptc.Client(socket=str(cluster.dir / f"{hosts[r]}.sock"),
                       coordinator=cluster.coordinator, job=job, rank=r) for r in range(n)]


def save_and_check(ptc, torch, torch_state, cluster, clients, globals_, step):
    versions = set()
    for c in clients:
        local = expected_locals(torch, torch_state, c, globals_)
        small = {n: f"{n} {c.rank}".encode() for n in c.small_object_names}
        versions.add(torch_state.save(c, step, local, small))
    (version,) = versions
    clients[0].wait_committed(version, timeout=60)
    load_and_check(torch, torch_state, clients, globals_)
    return version


def load_and_check(torch, torch_state, clients, globals_):
    for c in clients:
        want = expected_locals(torch, torch_state, c, globals_)
        got = {k: torch.zeros_like(t) for k, t in want.items()}
        torch_state.load(c, got)
        for k in want:
            rows = (got[k] != want[k]).reshape(got[k].shape[0], -1).any(dim=1)
            assert not rows.any(), (f"rank {c.rank} of {c.config}: {int(rows.sum())} of "
                                    f"{rows.numel()} rows of {k} differ")


def test_grouped_tensors_round_trip_at_tp2_tp3_and_across_a_tp_change(
        ptc_module, bin_dir, tmp_path):
    ptc = ptc_module
    torch = pytest.importorskip("torch")
    from ptc import torch_state
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    globals_ = {k: global_tensor(torch, k, dtypes[d], s)
                for k, d, s in ptc.model_tensors(MODEL)}
    assert any(k.startswith("optim.exp_avg.") and "qkv" in k for k in globals_)
    cluster = LocalCluster(bin_dir, tmp_path, hosts=1, gpus=3)
    try:
        cluster.ptcctl("register", "--job", "g", "--model", MODEL, "--config", "tp=2",
                       "--hosts", "host0", check=True)
        tp2 = clients_for(ptc, cluster, "g", 2)
        qkv = [r for r in tp2[0].regions if r["key"] == "layers.0.attn.qkv.weight"]
        assert len(qkv) == 3  # one region per group: q, k, v
        save_and_check(ptc, torch, torch_state, cluster, tp2, globals_, step=10)

        cluster.ptcctl("reconfigure", "--job", "g", "--to", "tp=3", "--hosts", "host0",
                       check=True)
        tp3 = clients_for(ptc, cluster, "g", 3)
        load_and_check(torch, torch_state, tp3, globals_)  # across the change
        save_and_check(ptc, torch, torch_state, cluster, tp3, globals_, step=20)

        cluster.ptcctl("reconfigure", "--job", "g", "--to", "tp=1", "--hosts", "host0",
                       check=True)
        load_and_check(torch, torch_state, clients_for(ptc, cluster, "g", 1), globals_)
    finally:
        cluster.stop()


def test_local_slices_pack_a_ranks_groups_and_refuse_what_cannot_fit(ptc_module):
    from ptc import torch_state
    # Rank 1 of 2 with q|k|v = 8|4|4 rows: q rows 4..8, k 10..12, v 14..16.
    regions = [[(4, 8), (0, 3)], [(10, 12), (0, 3)], [(14, 16), (0, 3)]]
    got = [torch_state.local_slices(r, (8, 3), regions) for r in regions]
    assert got == [(slice(0, 4), slice(0, 3)), (slice(4, 6), slice(0, 3)),
                   (slice(6, 8), slice(0, 3))]
    with pytest.raises(ValueError, match="do not fit"):
        torch_state.local_slices(regions[0], (6, 3), regions)
    with pytest.raises(ValueError, match="overlap partly"):
        torch_state.local_slices(regions[0], (8, 3), [[(4, 8), (0, 3)], [(6, 9), (0, 3)]])
