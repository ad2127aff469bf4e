"""Snapshots on a local cluster of real processes: regions no live host
holds come back from disk, a cluster that lost all its memory is restored
under another config, a snapshot killed part-way never replaces the last
complete one, and an export is read by a safetensors reader written here
from the format's specification."""
import json
import os
import signal
import struct
import subprocess
import time

import numpy as np
import pytest

from cluster import LocalCluster

MODEL = "gpt:layers=2,hidden=64,heads=4,ffn=128,vocab=256,positions=32"


@pytest.fixture
def cluster(bin_dir, tmp_path):
    c = LocalCluster(bin_dir, tmp_path, hosts=3)
    yield c
    c.stop()


def register(c, config, hosts):
    c.ptcctl("register", "--job", "j", "--model", MODEL, "--config", config,
             "--hosts", ",".join(hosts), check=True)


def verify(c):
    v = c.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stdout + v.stderr
    assert "every element exact" in v.stdout


def snapshot(c, root, *extra):
    code, out = c.ptcctl_json("snapshot", "--job", "j", "--to", str(root), *extra)
    assert code == 0, out
    return out


def complete(root):
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root)
                  if os.path.exists(os.path.join(root, d, "manifest.json")))


def wait_writing(root, host, limit=120):
    """Once `host` has written some bytes of its file of a new snapshot
    (a fixed sleep may end before a loaded machine starts the file)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            for d in set(os.listdir(root)) - set(complete(root)):
                for f in os.listdir(os.path.join(root, d)):
                    if host in f and os.path.getsize(os.path.join(root, d, f)) > 0:
                        return
        except OSError:  # no folder yet, or a file renamed as it was read
            pass
        time.sleep(0.05)
    raise AssertionError(f"{host} wrote nothing of the snapshot within {limit} s")


def test_a_region_on_no_live_host_comes_from_the_snapshot(cluster, tmp_path):
    """tp=2, dp=1 on host0: each tensor's shards have one holder. host0
    dies; the change to host1 reads them from the snapshot of the committed
    version, and says how many bytes came from disk."""
    c, root = cluster, tmp_path / "snaps"
    register(c, "tp=2,dp=1", ["host0"])
    c.save("j", "host0", 1)
    snap = snapshot(c, root)
    assert snap["version"] == c.job("j")["committed_version"]
    assert snap["bytes"] > 0 and snap["files"] == 1
    c.kill("host0")
    c.wait_dead("host0")
    code, report = c.ptcctl_json("reconfigure", "--job", "j", "--to", "tp=1",
                                 "--hosts", "host1")
    assert code == 0 and report["phase"] == "committed", report
    assert report["snapshot_bytes_read"] >= report["plan"]["snapshot_bytes"] > 0
    assert report["snapshot_dir"].endswith(snap["dir"].split("/")[-1])
    verify(c)


def test_without_a_snapshot_the_loss_is_named(cluster):
    c = cluster
    register(c, "tp=2,dp=1", ["host0"])
    c.save("j", "host0", 1)
    c.kill("host0")
    c.wait_dead("host0")
    r = c.ptcctl("reconfigure", "--job", "j", "--to", "tp=1", "--hosts", "host1")
    assert r.returncode != 0 and "no surviving copy" in r.stderr, r.stderr


def test_every_ptcd_restarted_restore_under_another_config(cluster, tmp_path):
    c, root = cluster, tmp_path / "snaps"
    register(c, "tp=2,dp=2", ["host0", "host1"])
    c.save("j", "host0", 7)
    c.save("j", "host1", 7)
    snapshot(c, root)
    for i, h in enumerate(["host0", "host1", "host2"]):
        c.kill(h)
        c.restart_ptcd(i)
    c.wait_alive(3)
    code, report = c.ptcctl_json("restore", "--job", "j", "--from", str(root),
                                 "--config", "tp=1,dp=3",
                                 "--hosts", "host0,host1,host2")
    assert code == 0 and report["phase"] == "committed", report
    assert report["bytes_from_peers"] == 0
    assert report["snapshot_bytes_read"] >= report["bytes_moved"] > 0
    job = c.job("j")
    assert job["config"].startswith("tp=1") and job["committed_step"] == 7
    verify(c)
    # A restore into a coordinator that forgot the job registers it.
    # Its progress lines estimate no time where none is left to estimate.
    c.ptcctl("forget", "j", check=True)
    r = c.ptcctl("restore", "--job", "j", "--from", str(root), "--config", "tp=2,dp=1",
                 "--hosts", "host2", check=True)
    assert "ETA" in r.stderr and "ETA 0.0" not in r.stderr, r.stderr
    assert c.job("j")["committed_step"] == 7
    verify(c)


def test_bad_snapshots_are_refused_with_reasons(cluster, tmp_path):
    c, root = cluster, tmp_path / "snaps"
    register(c, "tp=2,dp=1", ["host0"])
    c.save("j", "host0", 1)
    snap = snapshot(c, root)
    # Another job's snapshot.
    r = c.ptcctl("restore", "--job", "k", "--from", str(root), "--config", "tp=1",
                 "--hosts", "host1")
    assert r.returncode != 0 and "of job 'j'" in r.stderr, r.stderr
    # A corrupted file: DATA_LOSS naming it.
    shard = os.path.join(snap["dir"], "host0.safetensors")
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) - 10)
        f.write(b"\xff" * 4)
    c.ptcctl("forget", "j", check=True)
    r = c.ptcctl("restore", "--job", "j", "--from", str(root), "--config", "tp=1",
                 "--hosts", "host1")
    assert r.returncode != 0, r.stdout
    assert "host0.safetensors" in r.stderr and "checksum" in r.stderr, r.stderr
    # Relative and missing directories.
    r = c.ptcctl("snapshot", "--job", "j", "--to", "relative/dir")
    assert r.returncode != 0 and "absolute" in r.stderr


def test_a_killed_snapshot_never_replaces_the_last_complete_one(cluster, tmp_path):
    """tp=4 on host0 and host1: host1's regions have no other holder, so
    a snapshot whose writer on host1 dies cannot complete."""
    c, root = cluster, tmp_path / "snaps"
    register(c, "tp=4", ["host0", "host1"])
    c.save("j", "host0", 1)
    c.save("j", "host1", 1)
    first = snapshot(c, root)
    c.save("j", "host0", 2)
    c.save("j", "host1", 2)
    # Throttled to 200 kB/s, so that the kill lands mid-file.
    p = c.ptcctl_async("snapshot", "--job", "j", "--to", str(root),
                       "--rate", "200000", "--json")
    wait_writing(root, "host1")
    c.kill("host1")
    out, err = p.communicate(timeout=60)
    assert p.returncode != 0, out
    # The error names the host that failed, not the coordinator, which
    # answered.
    assert "host1" in out + err and "cannot reach ptc-coordinator" not in out + err, out + err
    assert complete(root) == [first["dir"].split("/")[-1]]
    new = [d for d in os.listdir(root) if d not in complete(root)]
    assert new and not os.path.exists(root / new[0] / "manifest.json")
    # The previous snapshot restores (to step 1).
    c.restart_ptcd(1)
    c.wait_alive(3)
    c.ptcctl("forget", "j", check=True)
    code, report = c.ptcctl_json("restore", "--job", "j", "--from", str(root),
                                 "--config", "tp=2,dp=1", "--hosts", "host2")
    assert code == 0, report
    assert c.job("j")["committed_step"] == 1
    # The next snapshot removes the one cut short, and keeps --keep.
    c.save("j", "host2", 3)
    snapshot(c, root, "--keep", "1")
    assert len(os.listdir(root)) == 1


def test_a_snapshot_whose_writer_dies_completes_from_a_replica(cluster, tmp_path):
    """tp=2, dp=2 on host0 and host1: each holds a whole replica. host1 is
    killed while it writes its file; what it was to write is written by
    host0 into a file of its own, the snapshot completes, and a restore
    from it onto a third host is exact."""
    c, root = cluster, tmp_path / "snaps"
    register(c, "tp=2,dp=2", ["host0", "host1"])
    c.save("j", "host0", 1)
    c.save("j", "host1", 1)
    # Throttled to 200 kB/s, so that the kill lands mid-file.
    p = c.ptcctl_async("snapshot", "--job", "j", "--to", str(root),
                       "--rate", "200000", "--json")
    wait_writing(root, "host1")
    c.kill("host1")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, out + err
    snap = json.loads(out)
    dirs = complete(root)
    assert len(dirs) == 1
    manifest = json.loads(open(root / dirs[0] / "manifest.json").read())
    # host0's own file and the one it wrote for host1.
    assert [f["host"] for f in manifest["files"]] == ["host0", "host0"], manifest["files"]
    assert any(".r1." in f["name"] for f in manifest["files"]), manifest["files"]
    # host1's unfinished file is not left in the complete snapshot.
    assert sorted(os.listdir(root / dirs[0])) == sorted(
        [f["name"] for f in manifest["files"]] + ["manifest.json"])
    log = (tmp_path / "coordinator.log").read_text()
    assert "writing the snapshot on host1" in log and "go to other holders" in log
    assert snap["bytes"] > 0
    c.wait_dead("host1")
    c.ptcctl("forget", "j", check=True)
    code, report = c.ptcctl_json("restore", "--job", "j", "--from", str(root),
                                 "--config", "tp=2,dp=1", "--hosts", "host2")
    assert code == 0, report
    verify(c)


def test_a_snapshot_while_a_host_is_dead_takes_its_ranks_small_objects_from_copies(
        cluster, tmp_path):
    """host0 holds a whole replica (tp=2,dp=2 with host1) and is dead when a
    snapshot is taken: its ranks' small objects come from host1's copies
    (the step counter, the model-parallel RNG states), the copy the
    coordinator keeps (its replica's data loader position) or a fresh
    value (each rank's own RNG state), instead of failing the snapshot.
    Every memory then lost, the restore from it is exact."""
    c, root = cluster, tmp_path / "snaps"
    c.register_with_loader(MODEL, "tp=2,dp=2", ("host0", "host1"))
    hosts = c.ptcctl_json("jobs")[1]["jobs"][0]["rank_hosts"]
    for h in ("host0", "host1"):
        c.save("j", h, 1)
    dead, alive = hosts[0], hosts[2]
    c.kill(dead)
    c.wait_dead(dead)
    snapshot(c, root)
    log = (tmp_path / "coordinator.log").read_text()
    assert ("the small objects of 2 ranks whose host is dead or lost them: 8 from "
            "other ranks' copies, 2 from the copies the coordinator keeps, 2 fresh "
            "values") in log, log
    c.kill(alive)
    c.wait_dead(alive)
    c.ptcctl("forget", "j", check=True)
    code, report = c.ptcctl_json("restore", "--job", "j", "--from", str(root),
                                 "--config", "tp=2,dp=1", "--hosts", "host2")
    assert code == 0 and report["phase"] == "committed", report
    verify(c)


def read_safetensors(path):
    """The format from its specification: u64 little-endian header size, a
    JSON header, then the data."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64,
              "I32": np.int32, "U8": np.uint8, "BF16": np.uint16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
    return header.get("__metadata__", {}), out


def synthetic(index, shape, dtype):
    """What the synthetic job saves: the low bytes of SplitMix64(index << 40
    ^ flat index), per element."""
    with np.errstate(over="ignore"):
        x = (np.uint64(index) << np.uint64(40)) ^ np.arange(
            int(np.prod(shape)), dtype=np.uint64)
        x = x + np.uint64(0x9e3779b97f4a7c15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
        x = x ^ (x >> np.uint64(31))
    size = np.dtype(dtype).itemsize
    return x.view(np.uint8).reshape(-1, 8)[:, :size].copy().view(dtype).reshape(shape)


def test_export_is_read_by_an_independent_reader(cluster, tmp_path):
    c, root = cluster, tmp_path / "snaps"
    register(c, "tp=2,dp=2", ["host0", "host1"])
    c.save("j", "host0", 5)
    c.save("j", "host1", 5)
    snap = snapshot(c, root)
    out = tmp_path / "model.safetensors"
    code, res = c.ptcctl_json("export", "--job", "j", "--to", str(out))
    assert code == 0, res
    meta, tensors = read_safetensors(out)
    assert meta["step"] == "5"
    manifest = json.load(open(os.path.join(snap["dir"], "manifest.json")))
    keys = [t["key"] for t in manifest["tensors"]]
    assert tensors and all(not k.startswith("optim") for k in tensors)
    for key, value in tensors.items():
        expected = synthetic(keys.index(key), value.shape, value.dtype)
        assert np.array_equal(value.view(np.uint8), expected.view(np.uint8)), key
    # The snapshot's own shards are safetensors too: each a region of a
    # tensor, named by key and region.
    _, shards = read_safetensors(os.path.join(snap["dir"], "host0.safetensors"))
    name, part = next(iter(shards.items()))
    assert "[" in name
    # Every file of the state, the snapshot's and the export, is readable
    # by its owner and group only.
    for path in [out, os.path.join(snap["dir"], "host0.safetensors"),
                 os.path.join(snap["dir"], "manifest.json")]:
        assert oct(os.stat(path).st_mode & 0o777) == "0o640", path


def test_a_zero1_job_takes_the_lost_optimizer_shards_from_the_snapshot(bin_dir, tmp_path):
    """ZeRO-1 over dp=2, one rank per host: each rank's optimizer shard has
    one holder; the parameters are on both. host1 dies: the change reads
    only host1's optimizer shards from disk, the parameters from host0,
    and the state is exact."""
    c = LocalCluster(bin_dir, tmp_path, hosts=3, gpus=1)
    try:
        root = tmp_path / "snaps"
        register(c, "tp=1,dp=2,zero=1", ["host0", "host1"])
        assert c.job("j")["rank_hosts"] == ["host0", "host1"]
        c.save("j", "host0", 4)
        c.save("j", "host1", 4)
        snapshot(c, root)
        c.kill("host1")
        c.wait_dead("host1")
        code, report = c.ptcctl_json("reconfigure", "--job", "j", "--to",
                                     "tp=1,dp=2,zero=1", "--hosts", "host0,host2")
        assert code == 0 and report["phase"] == "committed", report
        from_disk = report["snapshot_bytes_read"]
        state = c.job("j")["state_bytes"]
        # Some bytes from disk (the lost shards), but not the parameters,
        # which host0 still held.
        assert 0 < report["plan"]["snapshot_bytes"] <= from_disk < state, report
        assert report["bytes_from_peers"] > 0
        assert c.job("j")["committed_step"] == 4
        verify(c)
    finally:
        c.stop()


def test_a_full_disk_fails_the_snapshot_and_keeps_the_previous_one(cluster, tmp_path):
    """The snapshot directory on a small tmpfs that holds one snapshot: the
    second fails with RESOURCE_EXHAUSTED naming the disk, leaves no
    manifest and no partial file, and the first still restores."""
    c, root = cluster, tmp_path / "small"
    root.mkdir()
    register(c, "tp=2,dp=1", ["host0"])
    c.save("j", "host0", 1)
    state = c.job("j")["state_bytes"]
    size_kib = (state * 3 // 2) // 1024 + 64
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs",
                        str(root)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        first = snapshot(c, root)
        c.save("j", "host0", 2)
        code, out = c.ptcctl_json("snapshot", "--job", "j", "--to", str(root))
        assert code != 0, out
        assert out["error"]["code"] == "RESOURCE_EXHAUSTED", out
        assert "No space left on device" in out["error"]["message"], out
        assert complete(root) == [first["dir"].split("/")[-1]]
        leftovers = [f for d in os.listdir(root) for f in os.listdir(root / d)
                     if ".tmp" in f]
        assert leftovers == [], leftovers
        c.ptcctl("forget", "j", check=True)
        code, report = c.ptcctl_json("restore", "--job", "j", "--from", str(root),
                                     "--config", "tp=1", "--hosts", "host1")
        assert code == 0 and report["phase"] == "committed", report
        assert c.job("j")["committed_step"] == 1
        verify(c)
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)


def test_periodic_snapshots_follow_the_committed_versions(cluster, tmp_path):
    """--every-versions 1 --policy-only: the coordinator snapshots each new
    committed version by itself, and keeps --keep of them."""
    c, root = cluster, tmp_path / "snaps"
    register(c, "tp=2,dp=1", ["host0"])
    c.save("j", "host0", 1)
    code, out = c.ptcctl_json("snapshot", "--job", "j", "--to", str(root),
                              "--every-versions", "1", "--keep", "2", "--policy-only")
    assert code == 0, out
    for step in (2, 3, 4):
        c.save("j", "host0", step)
        version = c.job("j")["committed_version"]
        deadline = time.time() + 30
        while f"snapshot-{version:012d}" not in complete(root):
            assert time.time() < deadline, (version, os.listdir(root))
            time.sleep(0.2)
    # The daemon removes the older snapshots after the new one's manifest
    # is written (never fewer than --keep complete): wait for that too.
    deadline = time.time() + 30
    while len(complete(root)) != 2:
        assert time.time() < deadline, complete(root)
        time.sleep(0.1)
    assert complete(root)[-1] == f"snapshot-{version:012d}"
    # The newest is the committed version, and restores exactly.
    c.ptcctl("forget", "j", check=True)
    code, report = c.ptcctl_json("restore", "--job", "j", "--from", str(root),
                                 "--config", "tp=1", "--hosts", "host1")
    assert code == 0 and report["phase"] == "committed", report
    assert c.job("j")["committed_step"] == 4
    verify(c)
