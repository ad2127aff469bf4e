"""What the ptc.torch tests share: a layout's tensors by key, and a job
registered from a layout with a client of one of its ranks."""


def spec_tensors(layout):
    return {t["key"]: t for t in layout.spec["tensors"]}


def register(cluster, tmp_path, layout, config="dp=1", job="t", hosts="host0"):
    path = tmp_path / f"{job}.json"
    layout.write(path)
    r = cluster.ptcctl("register", "--job", job, "--layout", str(path), "--config", config,
                       "--hosts", hosts)
    assert r.returncode == 0, r.stderr


def connect(ptc_module, cluster, job="t", rank=0, host="host0"):
    return ptc_module.Client(socket=str(cluster.dir / f"{host}.sock"),
                             coordinator=cluster.coordinator, job=job, rank=rank)
