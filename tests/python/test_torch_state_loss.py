"""ptc.torch keeps a module's whole state or says what is wrong: persistent
buffers (BatchNorm's running statistics) saved, cut by the plan and
reloaded; an optimizer whose slots differ from the layout's refused at
save and load, and a layout derived from the optimizer itself keeping
every slot it has; frozen parameters saved without optimizer state; new
ranks' RNG seeds that depend on the job and on the user's base seed."""
import random

import numpy as np
import pytest
import torch

from cluster import LocalCluster
from torch_jobs import connect, register, spec_tensors


@pytest.fixture(scope="module")
def pt(ptc_module):
    import ptc.torch
    return ptc.torch


@pytest.fixture
def cluster(bin_dir, tmp_path):
    c = LocalCluster(bin_dir, tmp_path, hosts=2, gpus=2)
    yield c
    c.stop()


def reconfigure(cluster, to, hosts, job="t"):
    r = cluster.ptcctl("reconfigure", "--job", job, "--to", to, "--hosts", hosts)
    assert r.returncode == 0, r.stderr


def connect_rank(ptc_module, cluster, rank, job="t"):
    """A client for `rank` on the host the coordinator placed it on."""
    for host in ("host0", "host1"):
        placed = ptc_module.ranks_on_host(cluster.coordinator, job, host)["ranks"]
        if any(r["rank"] == rank for r in placed):
            return connect(ptc_module, cluster, job=job, rank=rank, host=host)
    raise AssertionError(f"rank {rank} of job {job} is on no host")


def train(model, opt, steps, inputs):
    for i in range(steps):
        opt.zero_grad()
        model(inputs(i)).square().sum().backward()
        opt.step()


# ---- 6: persistent buffers are state ----

class Normed(torch.nn.Module):
    """BatchNorm over features cut by tp, a persistent buffer of the model's
    own and one it recomputes (persistent=False)."""

    def __init__(self, h=6):
        super().__init__()
        self.fc = torch.nn.Linear(4, h)
        self.bn = torch.nn.BatchNorm1d(h)
        self.head = torch.nn.Linear(h, 2)
        self.register_buffer("scale", torch.ones(3))
        self.register_buffer("scratch", torch.zeros(5), persistent=False)

    def forward(self, x):
        return self.head(self.bn(self.fc(x)))


NORMED_PLAN = {"fc": "Colwise", "bn": "Colwise", "head": "Rowwise"}


def normed_plan(pt):
    return {k: getattr(pt, v)() for k, v in NORMED_PLAN.items()}


def test_persistent_buffers_are_in_the_layout_cut_by_the_plan(pt):
    layout = pt.Layout(Normed(), normed_plan(pt), optimizer=torch.optim.Adam)
    t = spec_tensors(layout)
    assert t["bn.running_mean"]["role"] == "other"
    assert t["bn.running_var"]["placements"] == [{"axes": ["tp"], "kind": "shard", "dim": 0}]
    assert t["bn.num_batches_tracked"]["dtype"] == "int64"
    assert "placements" not in t["bn.num_batches_tracked"]        # a scalar: replicated
    assert "placements" not in t["scale"] and t["scale"]["role"] == "other"  # by default
    assert "scratch" not in t                                      # persistent=False
    assert not any(k.startswith("optim.") and ("running" in k or k.endswith("scale"))
                   for k in t)                                     # no optimizer state
    assert "bn.running_var" in pt.describe(layout, "tp=2", rank=1)
    assert {r["key"]: r["region"] for r in layout.regions("tp=2")[1]}["bn.running_mean"] == [(3, 6)]

    # Buffers follow their layer through the pipeline; others must be placed.
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(torch.nn.BatchNorm1d(4) for _ in range(2))
    model.out = torch.nn.Linear(4, 4)
    model.register_buffer("step_scale", torch.ones(1))
    with pytest.raises(ValueError, match="buffer 'step_scale' is in no pipeline stage"):
        pt.Layout(model, stages=pt.Stages(layers="layers", last=["out"]))
    layout = pt.Layout(model, stages=pt.Stages(layers="layers", last=["out", "step_scale"]))
    t = spec_tensors(layout)
    assert t["layers.1.running_mean"]["stage"] == {"kind": "layer", "layer": 1}
    assert t["step_scale"]["stage"] == {"kind": "last"}
    with pytest.raises(TypeError, match="buffer 'c' is torch.complex64.*persistent=False"):
        m = torch.nn.Linear(2, 2)
        m.register_buffer("c", torch.zeros(2, dtype=torch.complex64))
        pt.Layout(m)


def test_batchnorm_statistics_survive_a_save_and_a_tp_change(pt, ptc_module, cluster,
                                                             tmp_path):
    torch.manual_seed(0)
    model = Normed()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    register(cluster, tmp_path, pt.Layout(model, normed_plan(pt), optimizer=opt),
             config="tp=1")
    client = connect(ptc_module, cluster)
    g = torch.Generator().manual_seed(1)
    train(model, opt, 3, lambda i: torch.randn(8, 4, generator=g) * 3 + 1)
    model.scale.mul_(torch.tensor([2.0, 3.0, 4.0]))
    want = {k: v.clone() for k, v in model.state_dict().items()}
    assert int(want["bn.num_batches_tracked"]) == 3 and want["bn.running_var"].ne(1).all()

    pt.save(client, model, opt, step=3)
    torch.manual_seed(5)
    again = Normed()
    pt.load(client, again, torch.optim.Adam(again.parameters(), lr=0.01))
    got = again.state_dict()
    assert sorted(got) == sorted(want)
    for k in ["bn.running_mean", "bn.running_var", "bn.num_batches_tracked"] + sorted(want):
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k

    # Buffers the layout lacks, or a model without those it has: refused.
    more = Normed()
    more.register_buffer("extra_stat", torch.zeros(2))
    with pytest.raises(ValueError, match="buffers the layout lacks: extra_stat"):
        pt.load(client, more, torch.optim.Adam(more.parameters()))
    fewer = Normed()
    fewer.bn = torch.nn.BatchNorm1d(6, track_running_stats=False)
    with pytest.raises(ValueError, match="lacks buffers this rank holds in the layout: "
                                         "bn.num_batches_tracked, bn.running_mean"):
        pt.save(client, fewer, torch.optim.Adam(fewer.parameters()), step=4)

    # tp=1 -> tp=2: each rank holds its features' statistics.
    reconfigure(cluster, "tp=2", "host0,host1")
    for rank in range(2):
        local = Normed(h=3)
        lopt = torch.optim.Adam(local.parameters(), lr=0.01)
        pt.load(connect_rank(ptc_module, cluster, rank), local, lopt)
        rows = slice(3 * rank, 3 * rank + 3)
        for k in ("bn.running_mean", "bn.running_var", "bn.weight", "fc.weight"):
            assert torch.equal(local.state_dict()[k], want[k][rows]), (rank, k)
        assert torch.equal(local.head.weight, want["head.weight"][:, rows])
        assert torch.equal(local.bn.num_batches_tracked, want["bn.num_batches_tracked"])
        assert torch.equal(local.scale, want["scale"])


# ---- 7: the optimizer's slots must be the layout's ----

def _fake_step(model, opt, seed=0):
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn(p.shape, generator=g)
    opt.step()


def test_an_optimizer_other_than_the_layouts_is_refused(pt, ptc_module, cluster, tmp_path):
    model = torch.nn.Linear(3, 2)
    register(cluster, tmp_path, pt.Layout(model, optimizer=torch.optim.Adam))  # built for Adam
    client = connect(ptc_module, cluster)
    rebuild = r"Build the job's Layout from the optimizer itself"

    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"SGD \(param group 0: momentum=0.9\) keeps "
                                         r"'momentum_buffer' of 'weight', which the layout lacks"):
        pt.save(client, model, sgd, step=1)                    # before its first step
    _fake_step(model, sgd)
    with pytest.raises(ValueError, match=rebuild):
        pt.save(client, model, sgd, step=1)

    ams = torch.optim.Adam(model.parameters(), amsgrad=True)
    with pytest.raises(ValueError, match="keeps 'max_exp_avg_sq' of 'weight'"):
        pt.save(client, model, ams, step=1)
    _fake_step(model, ams)
    with pytest.raises(ValueError, match="'max_exp_avg_sq' of 'bias', which the layout lacks"):
        pt.save(client, model, ams, step=1)

    # An optimizer ptc.torch does not know: its state decides.
    adamax = torch.optim.Adamax(model.parameters())
    _fake_step(model, adamax)
    with pytest.raises(ValueError, match="state of 'weight' holds 'exp_inf', which the layout "
                                         "lacks"):
        pt.save(client, model, adamax, step=1)

    adam = torch.optim.Adam(model.parameters())
    _fake_step(model, adam)
    pt.save(client, model, adam, step=1)                       # the layout's optimizer
    # A load into an optimizer the layout does not fit is refused too: the
    # next step would need the slot the save never had.
    with pytest.raises(ValueError, match="keeps 'max_exp_avg_sq'"):
        pt.load(client, model, torch.optim.Adam(model.parameters(), amsgrad=True))
    # State the layout lacks in an optimizer being loaded into: refused.
    _fake_step(model, ams)
    with pytest.raises(ValueError, match="holds 'max_exp_avg_sq'|keeps 'max_exp_avg_sq'"):
        pt.load(client, model, ams)


def test_a_layout_from_the_optimizer_keeps_every_slot_it_has(pt, ptc_module, cluster,
                                                              tmp_path):
    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
        opt = torch.optim.Adam([{"params": model[0].parameters(), "amsgrad": True},
                                {"params": model[1].parameters()}], lr=0.1)
        return model, opt

    model, opt = build()
    t = spec_tensors(pt.Layout(model, optimizer=opt))
    assert "optim.max_exp_avg_sq.0.weight" in t and "optim.max_exp_avg_sq.1.weight" not in t
    assert pt.optimizer_state(opt).slots == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert "optim.momentum_buffer.1.bias" in spec_tensors(pt.Layout(model, optimizer=sgd))
    adamax = torch.optim.Adamax(model.parameters())
    with pytest.raises(ValueError, match="does not know the state of Adamax; pass it after "
                                         "one step"):
        pt.Layout(model, optimizer=adamax)
    _fake_step(model, adamax)
    kept = pt.optimizer_state(adamax)
    assert (kept.slots, kept.step) == (["exp_avg", "exp_inf"], True)
    assert "optim.exp_inf.0.weight" in spec_tensors(pt.Layout(model, optimizer=adamax))

    model, opt = build()
    register(cluster, tmp_path, pt.Layout(model, optimizer=opt))
    client = connect(ptc_module, cluster)
    for i in range(3):
        _fake_step(model, opt, i)
    pt.save(client, model, opt)
    model2, opt2 = build()
    assert pt.load(client, model2, opt2).step == 3
    for p, q in zip(model.parameters(), model2.parameters()):
        assert set(opt.state[p]) == set(opt2.state[q])
        for slot in opt.state[p]:
            assert torch.equal(opt.state[p][slot], opt2.state[q][slot]), slot
    _fake_step(model, opt, 9)                 # the next step goes on, the same on both
    _fake_step(model2, opt2, 9)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)


# ---- 8: frozen parameters ----

class FineTune(torch.nn.Module):
    def __init__(self, h=8, out=4):
        super().__init__()
        self.embed = torch.nn.Embedding(10, h)
        self.head = torch.nn.Linear(h, out)

    def forward(self, tokens):
        return self.head(self.embed(tokens))


def test_frozen_parameters_are_saved_without_optimizer_state(pt, ptc_module, cluster,
                                                             tmp_path):
    torch.manual_seed(0)
    model = FineTune()
    model.embed.weight.requires_grad_(False)           # a frozen pretrained embedding
    opt = torch.optim.Adam(model.head.parameters(), lr=0.1)
    plan = {"embed": pt.Colwise(), "head": pt.Colwise()}
    layout = pt.Layout(model, plan, optimizer=opt)
    t = spec_tensors(layout)
    assert "embed.weight" in t and not any(k.startswith("optim.") and k.endswith("embed.weight")
                                           for k in t)
    assert "optim.exp_avg.head.weight" in t and "optim.step.head.bias" in t
    # From the class: a frozen parameter keeps no optimizer state either.
    assert "optim.exp_avg.embed.weight" not in spec_tensors(
        pt.Layout(model, plan, optimizer=torch.optim.Adam))

    register(cluster, tmp_path, layout, config="tp=1")
    client = connect(ptc_module, cluster)
    tokens = torch.randint(0, 10, (6,), generator=torch.Generator().manual_seed(2))
    train(model, opt, 3, lambda i: tokens)
    pt.save(client, model, opt)
    embed, head = model.embed.weight.detach().clone(), model.head.weight.detach().clone()

    # tp=1 -> tp=2: the frozen embedding is cut by columns, the head by rows.
    reconfigure(cluster, "tp=2", "host0,host1")
    for rank in range(2):
        torch.manual_seed(10 + rank)
        local = FineTune(h=4, out=2)
        local.embed.weight.requires_grad_(False)
        local.head = torch.nn.Linear(8, 2)
        lopt = torch.optim.Adam(local.head.parameters(), lr=0.1)
        extra = pt.load(connect_rank(ptc_module, cluster, rank), local, lopt)
        assert extra.step == 3
        assert torch.equal(local.embed.weight, embed[:, 4 * rank:4 * rank + 4])
        assert torch.equal(local.head.weight, head[2 * rank:2 * rank + 2])
        for slot in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(lopt.state[local.head.weight][slot],
                               opt.state[model.head.weight][slot][2 * rank:2 * rank + 2])
        assert local.embed.weight not in lopt.state

    # A layout that keeps optimizer state for a parameter the optimizer
    # does not hold is refused, saying how to build it.
    unfrozen = FineTune()
    register(cluster, tmp_path, pt.Layout(unfrozen, optimizer=torch.optim.Adam), job="u",
             hosts="host0,host1")
    with pytest.raises(ValueError, match="'embed.weight' is not in the optimizer's param_groups "
                                         "but the layout keeps its optimizer state"):
        pt.save(connect_rank(ptc_module, cluster, 0, job="u"), unfrozen,
                torch.optim.Adam(unfrozen.head.parameters()), step=1)


# ---- 9: new ranks' seeds ----

def test_new_ranks_seeds_depend_on_the_job_and_the_base_seed(pt, ptc_module, cluster,
                                                             tmp_path):
    model = torch.nn.Linear(3, 2)
    for job, host in (("t", "host0"), ("u", "host1")):
        register(cluster, tmp_path, pt.Layout(model), job=job, hosts=host)
        pt.save(connect(ptc_module, cluster, job=job, host=host), model, step=1)
        reconfigure(cluster, "dp=2", host, job=job)     # rank 1 is new

    def stream(job, base):
        torch.manual_seed(base)                          # the process's base seed
        client = connect_rank(ptc_module, cluster, 1, job=job)
        assert ptc_module.derived_seed(client.load().small_object(pt.RNG_OBJECT)) is not None
        pt.load(client, torch.nn.Linear(3, 2))
        return torch.rand(4), random.random(), np.random.rand()

    def same(a, b):
        return torch.equal(a[0], b[0]) and a[1:] == b[1:]

    one, two, again = stream("t", 1), stream("t", 2), stream("t", 1)
    assert not same(one, two)          # two base seeds: two streams
    assert same(one, again)            # the same base seed: the same stream
    other_job = stream("u", 1)
    assert not same(one, other_job)    # two jobs: two streams
    assert not any(torch.equal(one[0], s[0]) for s in (two, other_job))
