"""ptc.torch: layouts from modules and placement plans, one-call save and
load (every dtype, optimizer param_groups, scheduler, RNG, user objects),
the errors of every misuse, and the forward check of a shard's row order."""
import pathlib
import sys

import pytest
import torch

from cluster import LocalCluster
from torch_jobs import AllDtypes, connect, register, spec_tensors

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pt(ptc_module):
    import ptc.torch
    return ptc.torch


class Block(torch.nn.Module):
    def __init__(self, h=8, heads=2):
        super().__init__()
        self.qkv = torch.nn.Linear(h, 3 * h)
        self.proj = torch.nn.Linear(h, h)
        self.norm = torch.nn.LayerNorm(h)


class Tiny(torch.nn.Module):
    def __init__(self, layers=2, h=8, vocab=10):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, h)
        self.blocks = torch.nn.ModuleList(Block(h) for _ in range(layers))
        self.head = torch.nn.Linear(h, vocab, bias=False)


# ---- the spec built from modules, per placement kind ----

def test_linear_and_embedding_placements_follow_pytorch_tp(pt):
    plan = {"blocks.*.qkv": pt.Colwise(groups=(8, 8, 8)), "blocks.*.proj": pt.Rowwise(),
            "embed": pt.VocabParallel(pad=4), "head": pt.Colwise()}
    t = spec_tensors(pt.Layout(Tiny(), plan))
    assert t["blocks.0.qkv.weight"]["placements"] == [
        {"axes": ["tp"], "kind": "grouped_shard", "dim": 0, "groups": [8, 8, 8]}]
    assert t["blocks.1.qkv.bias"]["placements"][0]["groups"] == [8, 8, 8]
    assert t["blocks.0.proj.weight"]["placements"] == [{"axes": ["tp"], "kind": "shard", "dim": 1}]
    assert "placements" not in t["blocks.0.proj.bias"]          # a Rowwise bias: replicated
    assert "placements" not in t["blocks.0.norm.weight"]        # not in the plan: replicated
    assert t["embed.weight"]["placements"] == [
        {"axes": ["tp"], "kind": "shard", "dim": 0, "pad_multiple": 4}]
    assert t["head.weight"]["placements"][0]["dim"] == 0


def test_embedding_colwise_and_rowwise_cut_as_pytorch_does(pt):
    m = torch.nn.Module()
    m.a = torch.nn.Embedding(12, 6)
    m.b = torch.nn.Embedding(12, 6)
    t = spec_tensors(pt.Layout(m, {"a": pt.Colwise(), "b": pt.Rowwise()}))
    assert t["a.weight"]["placements"][0]["dim"] == 1
    assert t["b.weight"]["placements"][0]["dim"] == 0


def test_interleaved_groups_experts_and_generic_shards(pt):
    m = torch.nn.Module()
    m.qkv = torch.nn.Linear(4, 4 * (2 + 2) * 3, bias=False)   # 4 groups of (q q k v) x 3 rows
    m.experts = torch.nn.Module()
    m.experts.w1 = torch.nn.Parameter(torch.zeros(8, 5, 4))
    m.table = torch.nn.Parameter(torch.zeros(6, 10))
    layout = pt.Layout(m, {"qkv": pt.Colwise(groups=(6, 3, 3), repeats=4),
                           "experts": pt.Experts(), "table": pt.Shard(1, axis="dp")},
                       mesh=["pp", "dp", "ep", "tp"])
    t = spec_tensors(layout)
    assert t["qkv.weight"]["placements"][0]["repeats"] == 4
    assert t["experts.w1"]["placements"] == [
        {"axes": ["ep"], "kind": "shard", "dim": 0, "even": True, "unit": "experts"}]
    assert t["table"]["placements"] == [{"axes": ["dp"], "kind": "shard", "dim": 1}]
    # ep=3 does not divide 8 experts: refused naming the tensor.
    with pytest.raises(Exception, match="experts.w1"):
        pt.describe(layout, "ep=3")
    text = pt.describe(layout, "ep=4,tp=2", rank=1)
    assert "experts.w1" in text and "local [2, 5, 4]" in text


def test_pipeline_stages_and_optimizer_state(pt):
    model = Tiny(layers=4)
    stages = pt.Stages(layers="blocks", first=["embed"], last=["head"])
    layout = pt.Layout(model, optimizer=torch.optim.AdamW(model.parameters()), stages=stages)
    t = spec_tensors(layout)
    assert layout.spec["num_layers"] == 4
    assert t["blocks.3.qkv.weight"]["stage"] == {"kind": "layer", "layer": 3}
    assert t["embed.weight"]["stage"] == {"kind": "first"}
    assert t["optim.exp_avg.head.weight"]["stage"] == {"kind": "last"}
    assert t["optim.step.head.weight"]["shape"] == [1]
    assert t["optim.exp_avg_sq.embed.weight"]["role"] == "optimizer_state"
    regions = layout.regions("pp=2")
    assert {r["key"] for r in regions[0]} >= {"embed.weight", "blocks.1.proj.weight"}
    assert not any(r["key"].startswith("blocks.2.") for r in regions[0])
    sgd = pt.Layout(model, optimizer=torch.optim.SGD(model.parameters(), lr=1, momentum=0.9))
    assert "optim.momentum_buffer.head.weight" in spec_tensors(sgd)
    plain = pt.Layout(model, optimizer=torch.optim.SGD(model.parameters(), lr=1))
    assert len(spec_tensors(plain)) == len(list(model.parameters()))


def test_a_flat_buffer_optimizer_is_laid_out_as_megatron_core_does(pt, ptc_module):
    model = Tiny(layers=4)
    stages = pt.Stages(layers="blocks", first_and_last=["embed"], last=["head"])
    plan = {"blocks.*.qkv": pt.Colwise(groups=(8, 8, 8)), "blocks.*.proj": pt.Rowwise(),
            "embed": pt.VocabParallel(pad=4)}
    flat = pt.FlatBuffer(torch.optim.Adam, bucket_size=300, align=8, bucket_pad=16)
    layout = pt.Layout(model, plan, optimizer=flat, stages=stages)
    t = spec_tensors(layout)
    [buf] = layout.spec["buffers"]
    names = [n for n, _ in model.named_parameters()]
    assert [e["tensor"] for e in buf["entries"]] == names[::-1]       # backward order
    assert buf["entries"][-1] == {"tensor": "embed.weight", "own_bucket": "when_shared"}
    assert (buf["axes"], buf["align"], buf["bucket_size"], buf["bucket_pad"]) == (
        ["dp"], 8, 300, 16)
    assert t["optim.exp_avg.blocks.1.qkv.weight"]["buffer"] == "optimizer"
    assert t["optim.exp_avg.blocks.1.qkv.weight"]["slot"] == "blocks.1.qkv.weight"
    assert t["optim.step"]["shape"] == [1] and "optim.main.head.weight" not in t
    for config in ("tp=2,dp=3", "pp=2,dp=2", "tp=2,pp=2,dp=3"):
        cfg = ptc_module.ParallelConfig.parse(config, layout.mesh)
        # The ranks of one (pp, tp) group own disjoint ranges that cover
        # every parameter of their stage, in chunks of equal size.
        groups = {}
        for rank in range(cfg.world_size):
            pp, dp, tp = cfg.coord_of(rank)
            view = pt.flat_buffer(layout, config, rank)
            assert view.shards == cfg.dp and view.index == dp
            for b in view.buckets:
                assert (b.end - b.start) % 16 == 0
                assert b.chunk[1] - b.chunk[0] == (b.end - b.start) // cfg.dp
            for e in view.entries:
                assert e.offset % 8 == 0
                groups.setdefault((pp, tp, e.name, e.numel), []).append(e.owned)
        for (pp, tp, name, numel), owned in groups.items():
            assert len(owned) == cfg.dp
            got = sorted(o for o in owned if o)
            assert got[0][0] == 0 and got[-1][1] == numel, (config, name)
            assert all(a[1] == b[0] for a, b in zip(got, got[1:])), (config, name)
    text = pt.describe(layout, "tp=2,dp=3", rank=1, state=True)
    assert "flat buffer 'optimizer' over dp" in text and "of the shard of" in text
    mixed = pt.Layout(model.half(), optimizer=pt.FlatBuffer(torch.optim.Adam, main_params=True))
    assert spec_tensors(mixed)["optim.main.head.weight"]["dtype"] == "fp32"
    assert spec_tensors(mixed)["optim.exp_avg.head.weight"]["dtype"] == "fp32"
    with pytest.raises(ValueError, match="cut as groups along dimension 1"):
        pt.Layout(Tiny(), {"blocks.*.proj": pt.Rowwise(groups=(4, 4))}, optimizer=flat)
    with pytest.raises(ptc_module.Error, match="no flat buffer 'grads'"):
        pt.flat_buffer(layout, "dp=2", 0, name="grads")


@pytest.mark.parametrize("kwargs, message", [
    ({"plan": {"blocks.*.attn": None}}, "match no parameter"),
    ({"plan": {"blocks.*": "C", "blocks.0.qkv": "C"}}, "matches plan entries"),
    ({"plan": {"blocks.*.qkv": "G"}}, "add up to"),
    ({"plan": {"head": "X"}}, "the mesh"),
    ({"stages": "S"}, "is in no pipeline stage"),
    ({"optimizer": torch.optim.LBFGS}, "does not know the state of LBFGS"),
])
def test_a_plan_that_does_not_fit_the_model_is_refused_clearly(pt, kwargs, message):
    subs = {None: pt.Colwise(), "C": pt.Colwise(), "G": pt.Colwise(groups=(8, 8)),
            "X": pt.Colwise(axis="cp"), "S": pt.Stages(layers="blocks", first=["embed"])}
    kw = dict(kwargs)
    if "plan" in kw:
        kw["plan"] = {k: subs[v] for k, v in kw["plan"].items()}
    if "stages" in kw:
        kw["stages"] = subs[kw["stages"]]
    with pytest.raises(ValueError, match=message):
        pt.Layout(Tiny(), **kw)


def test_shard_state_cuts_full_tensors_as_the_layout_says(pt):
    model = Tiny()
    layout = pt.Layout(model, {"blocks.*.qkv": pt.Colwise(groups=(8, 8, 8))})
    full = {k: torch.arange(p.numel(), dtype=torch.float32).view(p.shape)
            for k, p in model.named_parameters()}
    local = pt.shard_state(full, layout, "tp=2", 1)
    w = full["blocks.0.qkv.weight"]
    assert torch.equal(local["blocks.0.qkv.weight"], torch.cat([w[4:8], w[12:16], w[20:24]]))


# ---- the forward check: the one thing shapes cannot show ----

def _llama():
    sys.path.insert(0, str(ROOT / "examples" / "elastic_llama"))
    import llama
    return llama


def _build(config, rank):
    import torch.distributed as dist
    import ptc
    llama = _llama()
    cfg = ptc.ParallelConfig.parse(config)
    group = dist.new_group(list(range(cfg.tp)))
    return llama.Stage(llama.Arch(""), cfg.tp, rank, tp_group=group)


def _forward(model, tokens):
    return model(tokens)


def test_check_forward_passes_the_right_row_order_and_catches_the_wrong_one(pt):
    llama = _llama()
    arch = llama.Arch("")
    tokens = torch.randint(0, arch.vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    good = llama.layout(arch, None)
    for config in ("tp=2", "tp=3"):
        assert pt.check_forward(_build, _forward, good, tokens, config)["max_abs_diff"] < 1e-5
    # nanoGPT's stacked q|k|v declared for a model whose rows are per group:
    # every local shape fits, the function does not.
    hd, g = arch.head_dim, arch.groups
    stacked = pt.Layout(llama.Stage(arch), {
        "layers.*.attn.qkv": pt.Colwise(groups=(g * arch.q_per_group * hd, g * hd, g * hd)),
        "layers.*.attn.proj": pt.Rowwise(), "layers.*.mlp.fc1": pt.Colwise(groups=(96, 96)),
        "layers.*.mlp.fc2": pt.Rowwise()})
    with pytest.raises(ValueError, match="another order"):
        pt.check_forward(_build, _forward, stacked, tokens, "tp=2")


# ---- on a cluster: round trips and misuse ----

@pytest.fixture
def cluster(bin_dir, tmp_path):
    c = LocalCluster(bin_dir, tmp_path, hosts=2, gpus=2)
    yield c
    c.stop()


def test_every_dtype_round_trips_bit_for_bit(pt, ptc_module, cluster, tmp_path):
    register(cluster, tmp_path, pt.Layout(AllDtypes(fill=True)))
    client = connect(ptc_module, cluster)
    saved = AllDtypes(fill=True)
    assert pt.save(client, saved, step=7).step == 7
    got = AllDtypes(fill=False)
    extra = pt.load(client, got)
    assert extra.step == 7 and dict(extra) == {}
    for (name, a), (_, b) in zip(saved.named_parameters(), got.named_parameters()):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_optimizer_groups_scheduler_rng_and_extra_come_back(pt, ptc_module, cluster, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    groups = [{"params": model[0].parameters(), "weight_decay": 0.1},
              {"params": model[1].parameters(), "lr": 0.5}]
    opt = torch.optim.AdamW(groups, lr=0.1, betas=(0.8, 0.95))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    register(cluster, tmp_path, pt.Layout(model, optimizer=opt))
    client = connect(ptc_module, cluster)
    for _ in range(3):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        sched.step()
    cursor = ptc_module.DataCursor(seed=1, dataset_size=100, global_batch=4, consumed=12)
    pt.save(client, model, opt, sched,
            extra={"cursor": cursor, "blob": b"\x00\x01", "pair": (1, 2.5), "t": torch.ones(2),
                   7: "int key"})
    after = torch.rand(3)

    torch.manual_seed(99)
    model2 = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt2 = torch.optim.AdamW([{"params": model2[0].parameters()},
                              {"params": model2[1].parameters()}], lr=1.0)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    extra = pt.load(client, model2, opt2, sched2)
    assert extra.step == 3
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups]
    assert opt2.param_groups[0]["weight_decay"] == 0.1
    assert tuple(opt2.param_groups[1]["betas"]) == (0.8, 0.95)
    assert sched2.state_dict() == sched.state_dict()
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
        for slot in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][slot], opt2.state[q][slot])
    assert torch.equal(torch.rand(3), after)        # the RNG goes on where it was
    assert extra["cursor"].consumed == 12 and extra["blob"] == b"\x00\x01"
    assert extra["pair"] == (1, 2.5) and torch.equal(extra["t"], torch.ones(2))
    assert extra[7] == "int key"


def test_misuse_gives_clear_errors(pt, ptc_module, cluster, tmp_path):
    model = Tiny()
    opt = torch.optim.Adam(model.parameters())
    register(cluster, tmp_path, pt.Layout(model, {"blocks.*.qkv": pt.Colwise(groups=(8, 8, 8))},
                                          optimizer=opt), config="tp=1")
    client = connect(ptc_module, cluster)
    with pytest.raises(ptc_module.Error, match="no committed version"):
        pt.load(client, model, opt)                                  # before any save

    wrong = Tiny(h=8)
    wrong.blocks[0].qkv = torch.nn.Linear(8, 20)
    with pytest.raises(ValueError, match=r"'blocks.0.qkv.weight' has local shape \(20, 8\) "
                                         r"but the layout expects \(24, 8\)"):
        pt.save(client, wrong, torch.optim.Adam(wrong.parameters()), step=1)

    half = Tiny().half()
    with pytest.raises(TypeError, match="is torch.float16 but the layout says torch.float32"):
        pt.save(client, half, torch.optim.Adam(half.parameters()), step=1)

    fewer = Tiny()
    del fewer.head
    with pytest.raises(ValueError, match="lacks parameters this rank holds.*head.weight"):
        pt.save(client, fewer, torch.optim.Adam(fewer.parameters()), step=1)

    more = Tiny()
    more.extra = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="parameters the layout lacks: extra.weight"):
        pt.save(client, more, torch.optim.Adam(more.parameters()), step=1)

    with pytest.raises(ValueError, match="pass the optimizer"):
        pt.save(client, model, step=1)
    with pytest.raises(TypeError, match="plain data"):
        pt.save(client, model, opt, extra={"f": open}, step=1)
    with pytest.raises(ValueError, match="at most"):
        pt.save(client, model, opt, extra={"big": b"x" * 100000}, step=1)

    pt.save(client, model, opt, step=1)                              # a good save
    r = cluster.ptcctl("reconfigure", "--job", "t", "--to", "tp=2", "--hosts", "host0,host1")
    assert r.returncode == 0, r.stderr
    with pytest.raises(ptc_module.Error, match="layout|epoch"):
        pt.save(client, model, opt, step=2)                          # under the old layout
    # The tp=2 layout wants half of each q, k, v: a tp=1 model is refused.
    with pytest.raises(ValueError, match=r"expects \(12, 8\)"):
        pt.load(connect(ptc_module, cluster, rank=1), model, opt)


def test_a_padded_vocabulary_at_one_part_says_how_to_build_the_module(pt, ptc_module,
                                                                      cluster, tmp_path):
    model = Tiny()  # 10 rows of vocabulary, padded to 12 by pad=4
    opt = torch.optim.Adam(model.parameters())
    register(cluster, tmp_path, pt.Layout(model, {"embed": pt.VocabParallel(pad=4)},
                                          optimizer=opt), config="tp=1")
    with pytest.raises(ValueError, match=r"expects \(12, 8\).*padded to a multiple of 4 x 1 "
                                         r"parts, 12.*VocabParallel\(pad=1\)"):
        pt.save(connect(ptc_module, cluster), model, opt, step=1)


def test_sgd_without_momentum_keeps_only_its_hyper_parameters(pt, ptc_module, cluster, tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.25)
    register(cluster, tmp_path, pt.Layout(model, optimizer=opt))
    client = connect(ptc_module, cluster)
    pt.save(client, model, opt, step=4)
    model2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.SGD(model2.parameters(), lr=1.0)
    assert pt.load(client, model2, opt2).step == 4
    assert opt2.param_groups[0]["lr"] == 0.25
    assert torch.equal(model.weight, model2.weight)


class _Zero:
    """A flat-buffer optimizer as ptc.torch takes it: Adam over the ranges
    of the parameters this rank owns (views of them), from flat_buffer."""

    def __init__(self, pt, client, model):
        params = dict(model.named_parameters())
        view = pt.flat_buffer(client)
        self.owned = view.owned()
        self.shards = {n: params[n].detach().view(-1)[lo:hi] for n, (lo, hi) in self.owned.items()}
        self.optimizer = torch.optim.Adam(list(self.shards.values()), lr=0.01)

    def fake_step(self, seed):
        g = torch.Generator().manual_seed(seed)
        for t in self.shards.values():
            t.grad = torch.randn(t.shape, generator=g)
        self.optimizer.step()


def _gathered(ranks, slot):
    """{parameter: the stored prefix of its flat local tensor} assembled
    from every rank's owned ranges of `slot` (dp only: the local tensor is
    the whole parameter)."""
    out = {}
    for z in ranks:
        for name, (lo, hi) in z.owned.items():
            t = z.shards[name]
            v = t if slot == "param" else z.optimizer.state[t][slot]
            out.setdefault(name, {})[lo] = v.detach().clone()
    return {n: torch.cat([parts[lo] for lo in sorted(parts)]) for n, parts in out.items()}


def test_a_flat_buffer_optimizer_saves_loads_and_is_recut_over_dp(pt, ptc_module, cluster,
                                                                   tmp_path):
    plan = {"embed": pt.VocabParallel(pad=4)}  # 10 rows padded to 12: 2 never stored
    flat = pt.FlatBuffer(torch.optim.Adam, bucket_size=200, align=4, bucket_pad=8)
    register(cluster, tmp_path, pt.Layout(Tiny(), plan, optimizer=flat), config="dp=2",
             hosts="host0")
    models, ranks, clients = [], [], []
    for rank in range(2):
        torch.manual_seed(0)
        model = Tiny()
        model.embed.weight = torch.nn.Parameter(
            torch.cat([model.embed.weight.detach(), torch.zeros(2, 8)]))  # the padded shard
        clients.append(connect(ptc_module, cluster, rank=rank))
        ranks.append(_Zero(pt, clients[-1], model))
        models.append(model)
    for it in range(3):
        for rank, z in enumerate(ranks):
            z.fake_step(100 * it + rank)
        for z in ranks:  # the all-gather: every replica gets each owner's range
            for name, (lo, hi) in z.owned.items():
                for m in models:
                    dict(m.named_parameters())[name].data.view(-1)[lo:hi] = z.shards[name]

    # Misuse first: nothing is written.
    with pytest.raises(ValueError, match=r"a distributed optimizer\); pass an object"):
        pt.save(clients[0], models[0], torch.optim.Adam(models[0].parameters()), step=3)
    z = ranks[0]
    name = next(iter(z.shards))
    bad = type("Z", (), {"optimizer": z.optimizer, "shards": dict(z.shards)})()
    bad.shards[name] = z.shards[name][:-1]
    with pytest.raises(ValueError, match=f"the shard of '{name}' has shape"):
        pt.save(clients[0], models[0], bad, step=3)
    del bad.shards[name]
    with pytest.raises(ValueError, match=f"keeps no shard of '{name}'"):
        pt.save(clients[0], models[0], bad, step=3)
    other = next(n for n in ranks[1].owned if n not in z.owned)
    bad.shards = dict(z.shards, **{other: torch.zeros(3)})
    with pytest.raises(ValueError, match=f"shards of {other}, of which this rank owns no range"):
        pt.save(clients[0], models[0], bad, step=3)

    pt.save(clients[0], models[0], ranks[0], step=3, wait=False)
    pt.save(clients[1], models[1], ranks[1], step=3)
    want = {slot: _gathered(ranks, slot) for slot in ("param", "exp_avg", "exp_avg_sq")}
    # What ptc holds is each moment at its place in the global tensor.
    from ptc import torch_state
    shapes = {t["key"]: t["shape"] for t in pt._spec_of(clients[0].layout)["tensors"]}
    checked = 0
    for client in clients:
        state = client.load()
        for r in client.regions:
            slot, _, name = r["key"].partition(".")[2].partition(".")
            if slot in ("exp_avg", "exp_avg_sq"):
                full = want[slot][name].view(shapes[name])
                assert torch.equal(torch_state.region_tensor(state, r["index"], r["dtype"]),
                                   full[tuple(slice(b, e) for b, e in r["region"])]), r["key"]
                checked += full[tuple(slice(b, e) for b, e in r["region"])].numel()
        del state
    assert checked == 2 * sum(t.numel() for t in want["exp_avg"].values())

    # dp=2 -> dp=3: every range is cut anew; the new ranks' ranges
    # assemble to the same parameters and moments.
    r = cluster.ptcctl("reconfigure", "--job", "t", "--to", "dp=3", "--hosts", "host0,host1")
    assert r.returncode == 0, r.stderr
    new = []
    for rank in range(3):
        torch.manual_seed(rank + 50)
        model = Tiny()
        model.embed.weight = torch.nn.Parameter(torch.full((12, 8), 7.0))
        client = connect(ptc_module, cluster, rank=rank, host="host0" if rank < 2 else "host1")
        z = _Zero(pt, client, model)
        assert pt.load(client, model, z).step == 3
        assert torch.equal(model.embed.weight[10:], torch.zeros(2, 8))  # padding zeroed
        for p, q in zip(models[0].parameters(), model.parameters()):
            assert torch.equal(p, q)                      # every replica whole again
        for st in z.optimizer.state.values():
            assert float(st["step"]) == 3.0
        new.append(z)
    assert sorted(want["param"]) == sorted(_gathered(new, "param"))
    for slot, full in want.items():
        got = _gathered(new, slot)
        for n in full:
            assert torch.equal(full[n], got[n]), (slot, n)
    # A layout with per-parameter state refuses a flat optimizer.
    register(cluster, tmp_path, pt.Layout(Tiny(), optimizer=torch.optim.Adam), job="u",
             hosts="host1")  # the GPU job t leaves free
    m = Tiny()
    with pytest.raises(ValueError, match="keeps flat shards but the job's layout keeps "
                                         "per-parameter state"):
        pt.save(connect(ptc_module, cluster, job="u", host="host1"), m, new[0], step=1)
