"""The Python client (`import ptc`) against a real local cluster of
processes: save/load round trips for every dtype, zero-copy loads, the
torch helpers, the data cursor, and a clear error for each misuse."""
import json
import random
import threading
import time
import zlib

import numpy as np
import pytest

from cluster import LocalCluster

MODEL = "gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8,pad=8"
DTYPES = ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int16", "int32", "int64",
          "uint8", "bool"]


@pytest.fixture(scope="module")
def cluster(bin_dir, tmp_path_factory):
    c = LocalCluster(bin_dir, tmp_path_factory.mktemp("client"), hosts=2, gpus=2)
    yield c
    c.stop()


def register(c, job, model=MODEL, config="tp=2,dp=2", hosts=("host0", "host1")):
    # A GPU runs one job's rank: the jobs of earlier tests make room.
    for j in c.ptcctl_json("jobs")[1]["jobs"]:
        c.ptcctl("forget", j["job"], check=True)
    c.ptcctl("register", "--job", job, "--model", model, "--config", config,
             "--hosts", ",".join(hosts), check=True)
    jobs = c.ptcctl_json("jobs")[1]["jobs"]
    return next(j for j in jobs if j["job"] == job)["rank_hosts"]


def connect(ptc, c, job, rank_hosts):
    return [ptc.Client(socket=str(c.dir / f"{h}.sock"), coordinator=c.coordinator, job=job,
                       rank=r) for r, h in enumerate(rank_hosts)]


def region_bytes(job, rank, r):
    """Deterministic bytes per (job, tensor, region): replicas agree."""
    seed = hash((job, r["key"], tuple(map(tuple, r["region"])))) & 0xFFFFFFFF
    return np.random.default_rng(seed).bytes(r["bytes"])


def save_rank(c, step):
    """Client `c` saves `step` (its regions' deterministic bytes and its
    small objects) and reports it; returns the save's version."""
    s = c.begin_save(step)
    version = s.version
    assert s.step == step
    for r in c.regions:
        raw = np.frombuffer(region_bytes(c.job, c.rank, r), dtype=np.uint8)
        arr = raw.view(r["numpy_dtype"]).reshape([e - b for b, e in r["region"]])
        s.write(r["index"], arr)
    for name in c.small_object_names:
        s.put_small_object(name, f"{name} of rank {c.rank}".encode())
    s.commit()
    return version


def save_all(clients, step):
    """Every client saves `step`; returns the version ptc gave the save."""
    versions = {save_rank(c, step) for c in clients}
    assert len(versions) == 1  # ranks saving one step share its version
    version = versions.pop()
    for c in clients:
        c.wait_committed(version, timeout=30)
        assert c.committed_step == step
    return version


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips_without_copies(ptc_module, cluster, dtype):
    ptc = ptc_module
    job = f"dt-{dtype}"
    clients = connect(ptc, cluster, job, register(cluster, job, f"{MODEL},dtype={dtype}"))
    version = save_all(clients, 3)
    states = []
    for c in clients:
        c.refresh()
        assert c.committed_version == version and c.committed_step == 3
        st = c.load()
        assert st.version == version
        for r in c.regions:
            view = st.region(r["index"])
            assert view.dtype == r["numpy_dtype"]
            assert list(view.shape) == [e - b for b, e in r["region"]]
            assert not view.flags.writeable
            assert view.tobytes() == region_bytes(job, c.rank, r)
        for name in c.small_object_names:
            assert st.small_object(name) == f"{name} of rank {c.rank}".encode()
        states.append(st)
    # Ranks 0 and 1 share host0 and a replicated tensor: both views are the
    # daemon's one buffer (same shared-memory inode), not copies.
    i0 = next(r["index"] for r in clients[0].regions if r["key"] == "embedding.position.weight")
    i1 = next(r["index"] for r in clients[1].regions if r["key"] == "embedding.position.weight")
    assert states[0].inode(i0) == states[1].inode(i1)


def test_views_outlive_the_state_object_and_torch_shares_them(ptc_module, cluster):
    ptc = ptc_module
    pytest.importorskip("torch")
    from ptc import torch_state
    clients = connect(ptc, cluster, "views", register(cluster, "views"))
    save_all(clients, 1)
    st = clients[0].load()
    r = clients[0].regions[0]
    view = st.region(r["index"])
    t = torch_state.region_tensor(st, r["index"], r["dtype"])
    assert t.data_ptr() == view.ctypes.data  # the same memory, no copy
    want = region_bytes("views", 0, r)
    del st  # the views keep the mapping alive
    assert view.tobytes() == want
    assert t.numpy().tobytes() == want


def test_torch_state_saves_and_restores_a_model_and_adam(ptc_module, cluster):
    ptc = ptc_module
    torch = pytest.importorskip("torch")
    from ptc import torch_state
    model = "gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8,pad=8,dtype=fp32"
    rank_hosts = register(cluster, "torch", model, config="tp=1,dp=1", hosts=("host0",))
    c = connect(ptc, cluster, "torch", rank_hosts)[0]
    shapes = {k: s for k, _, s in ptc.model_tensors(model) if not k.startswith("optim.")}
    params = {k: torch.nn.Parameter(torch.randn(s)) for k, s in shapes.items()}
    opt = torch.optim.Adam(list(params.values()), lr=1e-2)
    sum(p.sum() for p in params.values()).backward()
    opt.step()
    small = {n: n.encode() for n in c.small_object_names}
    version = torch_state.save(c, 1, torch_state.collect(params, opt), small)
    c.wait_committed(version)
    fresh = {k: torch.nn.Parameter(torch.zeros(s)) for k, s in shapes.items()}
    opt2 = torch.optim.Adam(list(fresh.values()), lr=1e-2)
    torch_state.prepare_adam(fresh, opt2, 1)
    torch_state.load(c, torch_state.collect(fresh, opt2))
    for k in shapes:
        assert torch.equal(fresh[k], params[k])
        for slot in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt2.state[fresh[k]][slot], opt.state[params[k]][slot])
    # The same parameters found through a module's own names.
    module = torch.nn.Module()
    for k, p in params.items():
        module.register_parameter(k.replace(".", "__"), p)
    found = torch_state.keyed_parameters(module, lambda n: n.replace("__", "."))
    assert found.keys() == params.keys()
    with pytest.raises(ValueError, match="both map to"):
        torch_state.keyed_parameters(module, lambda n: "same")
    # A model whose tensors do not match the layout is told so.
    wrong = dict(fresh)
    wrong["final_norm.weight"] = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="layout mismatch|does not fit"):
        torch_state.load(c, torch_state.collect(wrong, None))


def _devices():
    try:
        import torch
    except ImportError:
        return ["cpu"]
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
def test_tensors_save_and_load_on_their_device(ptc_module, cluster, device):
    """CPU tensors move through host memory; CUDA tensors (where a GPU is)
    through the store's memory pinned in place, on a side stream. Where
    CUDA is not usable, ptc says why."""
    ptc = ptc_module
    torch = pytest.importorskip("torch")
    from ptc import torch_state
    if not torch.cuda.is_available():
        with pytest.raises(ptc.Error, match="CUDA is not usable on this host") as e:
            ptc._capi.DeviceCopies(0)
        assert e.value.code == "UNAVAILABLE"
    model = "gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8,pad=8,dtype=bf16"
    rank_hosts = register(cluster, f"dev-{device}", model, config="tp=2,dp=1",
                          hosts=("host0",))
    clients = connect(ptc, cluster, f"dev-{device}", rank_hosts)
    local = []
    for c in clients:
        by_key = torch_state.regions_by_key(c)
        shapes, dtypes = {}, {}
        for r in c.regions:
            dtypes[r["key"]] = torch_state.torch_dtype(r["dtype"])
            shapes[r["key"]] = [max(shapes.get(r["key"], [0] * len(r["region"]))[d], e - b)
                                for d, (b, e) in enumerate(r["region"])]
        # The rank's local tensors (one region each here), a column slice
        # of a wider tensor so that some views are strided.
        # Seeded by key and region: replicas on the host save equal bytes.
        gen = {k: torch.Generator().manual_seed(zlib.crc32(repr((k, by_key[k])).encode()))
               for k in shapes}
        wide = {k: torch.randn([*s[:-1], s[-1] * 2] if s else s, generator=gen[k])
                .to(dtypes[k]).to(device) for k, s in shapes.items()}
        tensors = {k: (w[..., :shapes[k][-1]] if shapes[k] else w) for k, w in wide.items()}
        s = c.begin_save(5)
        copies = torch_state.RegionCopies()
        for r in c.regions:
            copies.save(s, r["index"], tensors[r["key"]][torch_state.local_slices(
                r["region"], tensors[r["key"]].shape, by_key[r["key"]])])
        stats = copies.finish()
        kind = "gpu_regions" if device == "cuda" else "host_regions"
        assert stats[kind] == len(c.regions)
        for name in c.small_object_names:
            s.put_small_object(name, b"x")
        s.commit()
        local.append(tensors)
    for c, tensors in zip(clients, local):
        c.wait_committed(s.version, timeout=30)
        st = c.load()
        by_key = torch_state.regions_by_key(c)
        fresh = {k: torch.zeros_like(t) for k, t in tensors.items()}
        wide = {k: torch.zeros([*t.shape[:-1], t.shape[-1] * 2] if t.dim() else [],
                               dtype=t.dtype, device=t.device) for k, t in tensors.items()}
        into = {k: (wide[k][..., :t.shape[-1]] if t.dim() else fresh[k])
                for k, t in tensors.items()}
        copies = torch_state.RegionCopies()
        for r in c.regions:
            copies.load(st, r["index"], r["dtype"], into[r["key"]][torch_state.local_slices(
                r["region"], into[r["key"]].shape, by_key[r["key"]])])
        copies.finish()
        for k, t in tensors.items():
            assert into[k].device == t.device
            assert torch.equal(into[k].cpu(), t.cpu()), k


def test_a_client_asks_which_ranks_run_on_a_host_over_its_own_connection(ptc_module, cluster):
    """A live process asks after every change which rank its GPU runs;
    its client answers as ptc.ranks_on_host does, without a connection of
    its own per call."""
    ptc = ptc_module
    rank_hosts = register(cluster, "mine")
    clients = connect(ptc, cluster, "mine", rank_hosts)
    for host in ("host0", "host1"):
        fresh = ptc.ranks_on_host(cluster.coordinator, "mine", host)
        assert clients[0].ranks_on_host(host) == fresh
        assert sorted(r["rank"] for r in fresh["ranks"]) == [
            r for r, h in enumerate(rank_hosts) if h == host]
        # Before it has a client, through its host's ptcd (the relay
        # there), the same answer.
        sock = str(cluster.dir / f"{host}.sock")
        assert ptc.ranks_on_host(cluster.coordinator, "mine", host, socket=sock) == fresh
    # A host the job does not use: no rank there.
    assert clients[0].ranks_on_host("nowhere")["ranks"] == []


def test_each_misuse_gets_a_clear_error(ptc_module, cluster):
    ptc = ptc_module
    rank_hosts = register(cluster, "misuse")
    sock = lambda h: str(cluster.dir / f"{h}.sock")
    cases = [
        (dict(socket="/nonexistent.sock", coordinator=cluster.coordinator, job="misuse", rank=0),
         "UNAVAILABLE", "cannot connect to ptcd at /nonexistent.sock"),
        (dict(socket=sock("host0"), coordinator=cluster.coordinator, job="nope", rank=0),
         "NOT_FOUND", "job 'nope' is unknown"),
        (dict(socket=sock("host0"), coordinator=cluster.coordinator, job="misuse", rank=9),
         "FAILED_PRECONDITION", "has 4 ranks"),
        (dict(socket=sock("host0"), coordinator=cluster.coordinator, job="misuse", rank=3),
         "FAILED_PRECONDITION", "placed on host 'host1'"),
    ]
    for kwargs, code, text in cases:
        with pytest.raises(ptc.Error) as e:
            ptc.Client(**kwargs)
        assert e.value.code == code and text in str(e.value), str(e.value)
    c = connect(ptc, cluster, "misuse", rank_hosts)[0]
    with pytest.raises(ptc.Error, match="no committed version"):
        c.load()
    s = c.begin_save(2)
    r = c.regions[0]
    with pytest.raises(ptc.Error, match="bytes but .* were given"):
        s.write(r["index"], np.zeros(3, dtype=np.float32))
    shape = [e - b for b, e in r["region"]]
    if len(shape) == 2 and shape[1] > 1:
        wide = np.zeros((shape[0], shape[1] * 2), dtype=r["numpy_dtype"])
        with pytest.raises(ptc.Error, match="C-contiguous"):
            s.write(r["index"], wide[:, ::2])
    with pytest.raises(ptc.Error, match="OUT_OF_RANGE"):
        s.write(999, np.zeros(1))
    with pytest.raises(ptc.Error, match="not in the model spec"):
        s.put_small_object("rng.cuda", b"x")
    with pytest.raises(ptc.Error, match="at most"):
        s.put_small_object("iteration", b"x" * (ptc.MAX_SMALL_OBJECT_BYTES + 1))
    with pytest.raises(ptc.Error, match="was not written"):
        s.commit()
    with pytest.raises(ptc.Error, match="step -1 is negative"):
        c.begin_save(-1)
    with pytest.raises(ptc.Error, match="change serial -3 is negative"):
        c.begin_save(1, change_serial=-3)
    # A serial that is not pending: a save like any other.
    s2 = c.begin_save(1, change_serial=12345)
    assert s2.version > 0
    del s2


def test_cursor_consumes_every_sample_once_across_dp_and_batch_changes(ptc_module):
    ptc = ptc_module
    rng = random.Random(11)
    for trial in range(200):
        n = rng.randint(30, 300)
        cur = ptc.DataCursor(seed=rng.getrandbits(63), dataset_size=n,
                             global_batch=rng.randint(1, 20))
        seen = []
        while cur.consumed + cur.global_batch <= n:
            dp = rng.randint(1, 8)
            batch = [s for r in range(dp) for s in cur.next_samples(r, dp)]
            assert len(batch) == cur.global_batch
            seen += batch
            cur.advance()
            if rng.random() < 0.3:
                cur.global_batch = rng.randint(1, 20)
            cur = ptc.DataCursor.decode(cur.encode())  # saved and restored
        assert len(seen) == len(set(seen)) == cur.consumed
        assert all(0 <= s < n for s in seen)
    with pytest.raises(ptc.Error, match="not a ptc data cursor"):
        ptc.DataCursor.decode(b"junk")


def saved_on_two_hosts(ptc, c, job):
    """Job `job` at tp=2,dp=2 on host0 and host1 of `c` (a cluster of its
    own, whose hosts a test may stop), saved at step 1: its clients, and
    those on host0 and on host1."""
    rank_hosts = register(c, job)
    clients = connect(ptc, c, job, rank_hosts)
    save_all(clients, 1)
    return (clients, [k for k in clients if rank_hosts[k.rank] == "host0"],
            [k for k in clients if rank_hosts[k.rank] == "host1"])


def test_a_rank_that_reports_while_another_save_commits_reports_again(ptc_module, bin_dir,
                                                                      tmp_path):
    """The coordinator commits one save of a job at a time and asks a rank
    that reports another meanwhile to report again (UNAVAILABLE); the
    client does so until its deadline instead of failing the save."""
    c = LocalCluster(bin_dir, tmp_path, hosts=2, gpus=2, host_timeout=30)
    try:
        clients, on0, on1 = saved_on_two_hosts(ptc_module, c, "again")

        def save(k, step, results):
            try:
                save_rank(k, step)
                results.append(None)
            except Exception as e:  # reported to the test below
                results.append(e)

        # Step 2: host0's ranks save, then host0 stops; host1's ranks save,
        # and the last report starts the commit, which waits for host0.
        done = []
        for k in on0:
            save(k, 2, done)
        c.stop_process("host0")
        save(on1[0], 2, done)
        assert done == [None] * 3, done
        committing_done = []
        committing = threading.Thread(target=save, args=(on1[1], 2, committing_done))
        committing.start()
        time.sleep(1.5)
        assert committing.is_alive(), committing_done  # waiting for host0's proof
        # Step 3 of a host1 rank reports while step 2 commits: asked to
        # report again until host0 answers.
        later_done = []
        later = threading.Thread(target=save, args=(on1[0], 3, later_done))
        later.start()
        # Asked to report again while the commit waits for host0. Not
        # asserted by time: on a busy machine the commit can end first, by
        # giving host0 up once its connection's keepalive pings go
        # unanswered (about 4 s); either way both saves must succeed.
        time.sleep(2)
        c.resume_process("host0")
        committing.join(120)
        later.join(120)
        assert committing_done == [None] and later_done == [None], (committing_done, later_done)
        for k in clients:
            k.wait_committed(2, timeout=30)
        save(on1[1], 3, done)
        for k in on0:
            save(k, 3, done)
        deadline = time.time() + 30
        while c.job("again")["committed_step"] < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert c.job("again")["committed_step"] == 3
    finally:
        c.stop()


def test_a_change_asked_while_a_save_commits_starts_after_it(ptc_module, bin_dir, tmp_path):
    """The coordinator refuses a change, and an advice, while it commits a
    save (ABORTED: try again in a moment); ptcctl asks again, and the
    change starts from that save once it committed."""
    c = LocalCluster(bin_dir, tmp_path, hosts=2, gpus=2, host_timeout=30)
    try:
        clients, on0, on1 = saved_on_two_hosts(ptc_module, c, "change")

        for k in on0 + on1[:1]:
            save_rank(k, 2)
        c.stop_process("host0")
        committing = threading.Thread(target=save_rank, args=(on1[1], 2))
        committing.start()  # its report starts the commit, which waits for host0
        time.sleep(1.5)
        change = c.ptcctl_async("reconfigure", "--job", "change", "--to", "tp=2,dp=1",
                                "--hosts", "host1", "--json")
        # (An advice plans its candidates: it was "no config could be
        # planned" while the save committed.)
        advice = c.ptcctl_async("advise", "--job", "change", "--json")
        # Both are refused and ask again while the commit waits for host0
        # (their output below says so). Not asserted by time: on a busy
        # machine the commit can end first, by giving host0 up once its
        # connection's keepalive pings go unanswered (about 4 s).
        time.sleep(2)
        c.resume_process("host0")
        committing.join(120)
        out, err = advice.communicate(timeout=300)
        assert advice.returncode == 0, out + err
        assert "committing a save" in err and "asking again" in err, err
        out, err = change.communicate(timeout=300)
        assert change.returncode == 0, out + err
        assert "committing a save" in err and "asking again" in err, err
        report = json.loads(out)
        assert report["phase"] == "committed", report
        assert report["source_version"] == 2 and c.job("change")["committed_step"] == 2
    finally:
        c.stop()
