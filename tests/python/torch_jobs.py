"""What the ptc.torch tests share: a layout's tensors by key, a job
registered from a layout with a client of one of its ranks, and a module
with a parameter of every dtype."""
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool]


class AllDtypes(torch.nn.Module):
    """One parameter of each of DTYPES, `shape`, on `device`: random values
    (fill) or zeros."""

    def __init__(self, fill, device="cpu", shape=(5, 3)):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        for i, dt in enumerate(DTYPES):
            if fill and dt.is_floating_point:
                v = torch.randn(*shape, generator=g).to(dt)
            elif fill:
                v = torch.randint(0, 2 if dt == torch.bool else 100, shape, generator=g).to(dt)
            else:
                v = torch.zeros(*shape, dtype=dt)
            self.register_parameter(f"p{i}", torch.nn.Parameter(v.to(device),
                                                                requires_grad=False))


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
