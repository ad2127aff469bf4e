"""The pause of a GPU job's restart and of a change of its parallelism:
ptc against what users pick today, in one run, on one GPU (not a test).

    python3 tools/gpu_pause_benchmark.py --bin BIN_DIR [--runs 3] [--layers 12]

BIN_DIR holds the daemons as Bazel lays them out (ptcd/ptcd,
coordinator/ptc-coordinator, tools/ptcctl; tools/venv_check.sh and
tools/device_check.sh make such a folder from the tarball); `ptc` must be
importable (the wheel). The job is a GPT's tensors (hidden 2048, 4x MLP,
vocabulary 32000) in fp32 with Adam's two moments, on the GPU: 3.72 GiB at
the default 4 layers (each layer adds about 0.56 GiB).

Per run, each a fresh job on the same cluster (the DCP change after the
other runs, in processes of its own):
  ptc restart   pt.save from the GPU into ptcd, then pt.load into a fresh
                model and optimizer on the GPU (same layout)
  DCP restart   torch.distributed.checkpoint save of the same state dict
                to local disk, then load into a fresh model and optimizer
  torch.save    torch.save of the state dict to local disk, then torch.load
                and load_state_dict
  ptc change    tp=2 -> tp=1: both tp=2 ranks save their shards (clients
                in this process; one GPU), the store re-partitions the
                state (ptcctl reconfigure), the tp=1 rank loads it
  DCP change    tp=2 -> tp=1: two processes (one per tp rank, sharing the
                GPU over gloo) save their shards as DTensors with
                torch.distributed.checkpoint, then one process loads the
                checkpoint into a fresh tp=1 model and optimizer on the GPU
                (DCP reshards at load). The DTensors cut qkv in two
                contiguous halves where ptc's layout cuts q, k and v each:
                the same bytes, a layout DTensor can express.

ptc's saves begin once host0's spare pool holds their memory, as a
job's next save finds it in its steady state (the pool prepares a job's
first save when it registers and refills after each save; up to 30 s),
and the benchmark counts their puts into prepared memory and not.

Prints min/median/max seconds per phase and the GB/s of each against
cudaMemcpy-class copies of the same bytes to and from pinned memory
(torch's pin_memory tensors), measured in the same run.
"""
import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def gpt(layers, hidden=2048, vocab=32000):
    m = torch.nn.Module()
    m.embed = torch.nn.Embedding(vocab, hidden)
    m.blocks = torch.nn.ModuleList()
    for _ in range(layers):
        b = torch.nn.Module()
        b.qkv = torch.nn.Linear(hidden, 3 * hidden)
        b.proj = torch.nn.Linear(hidden, hidden)
        b.fc1 = torch.nn.Linear(hidden, 4 * hidden)
        b.fc2 = torch.nn.Linear(4 * hidden, hidden)
        b.norm = torch.nn.LayerNorm(hidden)
        m.blocks.append(b)
    m.head = torch.nn.Linear(hidden, vocab, bias=False)
    return m


def plan(pt, hidden=2048):
    return {"blocks.*.qkv": pt.Colwise(groups=(hidden,) * 3), "blocks.*.proj": pt.Rowwise(),
            "blocks.*.fc1": pt.Colwise(), "blocks.*.fc2": pt.Rowwise(), "head": pt.Colwise()}


def trained(model):
    """An Adam optimizer with state (one step of ones as gradients)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return opt


def state_bytes(model, opt):
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return n + sum(t.numel() * t.element_size() for s in opt.state.values()
                   for t in s.values() if torch.is_tensor(t) and t.dim() > 0)


class Cluster:
    """A coordinator and two ptcds from BIN_DIR, plaintext on loopback."""

    def __init__(self, bin_dir, work):
        self.bin, self.dir, self.procs, self.names = bin_dir, work, [], []
        env = {k: v for k, v in os.environ.items() if not k.startswith("PTC_")}
        env["PTC_INSECURE"] = "1"
        self.env = env
        os.environ["PTC_INSECURE"] = "1"
        self.coordinator = "127.0.0.1:" + self._start(
            "coordinator", [bin_dir / "coordinator/ptc-coordinator", "--listen", "127.0.0.1:0",
                            "--state-dir", work / "state", "--insecure"])
        for i in range(2):
            self._start(f"host{i}", [bin_dir / "ptcd/ptcd", "--listen", "127.0.0.1:0",
                                     "--coordinator", self.coordinator, "--name", f"host{i}",
                                     "--gpus", "2", "--socket", work / f"host{i}.sock",
                                     "--memory-limit", "64GiB", "--insecure"])
        for _ in range(200):
            hosts = json.loads(self.ptcctl("hosts", "--json"))["hosts"]
            if sum(h["alive"] for h in hosts) == 2:
                return
            time.sleep(0.1)
        raise SystemExit("the ptcds did not register")

    def _start(self, name, cmd):
        port_file = self.dir / f"{name}.port"
        log = open(self.dir / f"{name}.log", "w")
        self.procs.append(subprocess.Popen([str(c) for c in cmd] + ["--port-file", str(port_file)],
                                           stdout=log, stderr=log, env=self.env))
        self.names.append(name)
        for _ in range(400):
            if port_file.exists() and port_file.read_text().strip():
                return port_file.read_text().strip()
            time.sleep(0.025)
        raise SystemExit(f"{name} did not start: {(self.dir / f'{name}.log').read_text()}")

    def ptcctl(self, *args):
        r = subprocess.run([str(self.bin / "tools/ptcctl"), *args, "--coordinator",
                            self.coordinator], capture_output=True, text=True, env=self.env)
        if r.returncode != 0:
            raise SystemExit(f"ptcctl {' '.join(args)}: {r.stderr}")
        return r.stdout

    def store_stats(self, host):
        port = (self.dir / f"{host}.port").read_text().strip()
        r = subprocess.run([str(self.bin / "tools/ptcctl"), "store", "stats", "--host",
                            f"127.0.0.1:{port}", "--json"],
                           capture_output=True, text=True, env=self.env, check=True)
        return json.loads(r.stdout)

    def spare_counts(self, host):
        """(puts into prepared memory, puts not) on `host` so far."""
        c = self.store_stats(host)["counters"]
        return c.get("ptc_store_spares_used_total", 0), c.get("ptc_store_spares_missed_total", 0)

    def counted_save(self, host, nbytes, counts, save, *args, **kwargs):
        """Runs save(*args, **kwargs) once `host`'s spare pool has prepared what it
        was asked for and holds `nbytes` (up to 30 s), as a training job's
        next save finds it in its steady state (the pool prepares a job's
        first save when it registers, and refills after each save); adds
        its puts into prepared memory and not to `counts`; returns its
        seconds."""
        deadline = time.time() + 30
        while time.time() < deadline:
            stats = self.store_stats(host)
            if stats["spare_queued_bytes"] == 0 and stats["spare_bytes"] >= 0.95 * nbytes:
                break
            time.sleep(0.1)
        before = self.spare_counts(host)
        t0 = synced()
        save(*args, **kwargs)
        seconds = synced() - t0
        for i, (b, a) in enumerate(zip(before, self.spare_counts(host))):
            counts[i] += a - b
        return seconds

    def client(self, job, rank, host):
        import ptc
        return ptc.Client(socket=str(self.dir / f"{host}.sock"), coordinator=self.coordinator,
                          job=job, rank=rank)

    def cpu_seconds(self):
        """{daemon: CPU seconds (user + system) it has used so far}."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for name, p in zip(self.names, self.procs):
            try:
                fields = pathlib.Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[name] = (int(fields[11]) + int(fields[12])) / tick
        return out

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=30)


DEVICE = "cuda"


def synced():
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def save_ranks(pt, ranks):
    """Saves each (model, optimizer, client) of `ranks` in turn, the last
    waiting for the version to commit."""
    for rank, (local, lopt, c) in enumerate(ranks):
        pt.save(c, local, lopt, step=1, wait=rank == len(ranks) - 1)


def local_model(pt, full_state, layout, config, rank, layers):
    model = gpt(layers).to("meta")
    for key, t in pt.shard_state(full_state, layout, config, rank).items():
        module, _, attr = key.rpartition(".")
        setattr(model.get_submodule(module), attr, torch.nn.Parameter(t.clone().to(DEVICE)))
    return model


# DCP's change runs in processes of its own, since DCP saves one shard per
# process: two savers (`--dcp-role save --dcp-rank R`, a gloo group of two
# on the one GPU) and then one loader (`--dcp-role load`), each doing every
# run.
COLWISE, ROWWISE = ("qkv", "fc1", "head"), ("proj", "fc2")


def tp_dim(name):
    """The dimension tensor parallelism cuts parameter `name` along (None: replicated)."""
    module, _, attr = name.rpartition(".")
    kind = module.rsplit(".", 1)[-1]
    if kind in COLWISE:
        return 0
    return 1 if kind in ROWWISE and attr == "weight" else None


def dcp_state(model, opt, wrap):
    """A flat state dict of the parameters and their Adam state, each
    tensor through wrap(parameter_name, tensor)."""
    names = {id(p): n for n, p in model.named_parameters()}
    state = {"model": {n: wrap(n, p.detach()) for n, p in model.named_parameters()}, "optim": {}}
    for p, s in opt.state.items():
        n = names[id(p)]
        state["optim"][n] = {k: wrap(n, v) if torch.is_tensor(v) and v.dim() > 0 else v
                             for k, v in s.items()}
    return state


def dcp_save_role(args):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    dist.init_process_group("gloo", rank=args.dcp_rank, world_size=2)
    mesh = init_device_mesh(DEVICE, (2,))
    torch.manual_seed(0)
    model = gpt(args.layers).to(DEVICE)
    opt = trained(model)

    def shard(name, t):
        dim = tp_dim(name)
        local = t if dim is None else t.chunk(2, dim)[args.dcp_rank].contiguous()
        return DTensor.from_local(local, mesh, [Replicate() if dim is None else Shard(dim)],
                                  run_check=False, shape=t.shape, stride=t.stride())

    state = dcp_state(model, opt, shard)
    times = []
    for run in range(args.runs):
        dist.barrier()
        t0 = synced()
        dcp.save(state, checkpoint_id=str(args.dcp_dir / f"dcp-change{run}"))
        synced()
        dist.barrier()  # the save ends when both ranks' shards are written
        times.append(time.perf_counter() - t0)
    if args.dcp_rank == 0:
        (args.dcp_dir / "dcp-save.json").write_text(json.dumps(times))
    dist.destroy_process_group()


def dcp_load_role(args):
    import torch.distributed.checkpoint as dcp
    times = []
    for run in range(args.runs):
        torch.manual_seed(1000 + run)  # not the saved model's values
        fresh = gpt(args.layers).to(DEVICE)
        fresh_opt = trained(fresh)  # DCP loads in place: the state must exist
        t0 = synced()
        dcp.load(dcp_state(fresh, fresh_opt, lambda n, t: t),
                 checkpoint_id=str(args.dcp_dir / f"dcp-change{run}"))
        t1 = synced()
        times.append(t1 - t0)
        if run == 0:  # every parameter as the savers' model had it
            torch.manual_seed(0)
            ref = gpt(args.layers).to(DEVICE)
            ref_opt = trained(ref)
            for (n, a), b in zip(ref.named_parameters(), fresh.parameters()):
                assert torch.equal(a, b), f"DCP change: {n} differs after the load"
                assert torch.equal(ref_opt.state[a]["exp_avg"], fresh_opt.state[b]["exp_avg"])
            del ref, ref_opt
        del fresh, fresh_opt
        shutil.rmtree(args.dcp_dir / f"dcp-change{run}")
    (args.dcp_dir / "dcp-load.json").write_text(json.dumps(times))


def dcp_change(args, disk):
    """DCP's tp=2 -> tp=1 for every run: (save seconds, load seconds) lists."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # LOCAL_RANK 0: both ranks on the one GPU (DeviceMesh picks the device by it).
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK="0")
    cmd = [sys.executable, __file__, "--runs", str(args.runs), "--layers", str(args.layers),
           "--device", DEVICE, "--dcp-dir", str(disk)]
    savers = [subprocess.Popen(cmd + ["--dcp-role", "save", "--dcp-rank", str(r)], env=env)
              for r in range(2)]
    while any(p.poll() is None for p in savers):
        if any(p.poll() not in (None, 0) for p in savers):  # the other waits at a barrier
            for p in savers:
                p.kill()
        time.sleep(0.1)
    if any(p.returncode != 0 for p in savers):
        raise RuntimeError(f"DCP change: a saver failed (exit {[p.returncode for p in savers]})")
    subprocess.run(cmd + ["--dcp-role", "load"], env=env, check=True)
    return (json.loads((disk / "dcp-save.json").read_text()),
            json.loads((disk / "dcp-load.json").read_text()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", type=pathlib.Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--disk", type=pathlib.Path, default=None,
                    help="where DCP and torch.save write (default: a temporary folder)")
    ap.add_argument("--device", default="cuda",
                    help="cpu: a dry run of the script on a machine without a GPU")
    ap.add_argument("--dcp-role", choices=("save", "load"), help=argparse.SUPPRESS)
    ap.add_argument("--dcp-rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--dcp-dir", type=pathlib.Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if args.dcp_role:
        return dcp_save_role(args) if args.dcp_role == "save" else dcp_load_role(args)
    if args.bin is None:
        ap.error("--bin BIN_DIR is required")
    import ptc.torch as pt
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("PyTorch sees no CUDA device")
    import torch.distributed.checkpoint as dcp

    dcp_failed = None
    work = pathlib.Path(tempfile.mkdtemp(prefix="ptc-pause-"))
    disk = pathlib.Path(tempfile.mkdtemp(prefix="ptc-pause-disk-", dir=args.disk))
    cluster = Cluster(args.bin, work)
    ready = {"ptc restart: save": [0, 0], "ptc change: save (2 ranks)": [0, 0]}
    times = {k: [] for k in ("ptc restart: save", "ptc restart: load", "DCP restart: save",
                             "DCP restart: load", "torch.save", "torch.load",
                             "ptc change: save (2 ranks)", "ptc change: store", "ptc change: load",
                             "DCP change: save (2 processes)", "DCP change: load",
                             "limit: GPU -> pinned", "limit: pinned -> GPU")}
    try:
        torch.manual_seed(0)
        full = gpt(args.layers)
        layout = pt.Layout(full, plan(pt), optimizer=torch.optim.Adam)
        spec = work / "layout.json"
        layout.write(spec)
        model = full.to(DEVICE)
        opt = trained(model)
        nbytes = state_bytes(model, opt)
        name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "CPU (dry run)"
        print(f"{name}: {args.layers} layers, "
              f"{nbytes / 2**30:.2f} GiB of parameters and Adam state on the GPU, "
              f"{args.runs} runs", flush=True)
        for run in range(args.runs):
            job = f"r{run}"
            # ptc, same layout.
            cluster.ptcctl("register", "--job", job, "--layout", str(spec), "--config", "tp=1",
                           "--hosts", "host0")
            client = cluster.client(job, 0, "host0")
            saved = cluster.counted_save("host0", nbytes, ready["ptc restart: save"], pt.save,
                                         client, model, opt, step=1)
            fresh = gpt(args.layers).to(DEVICE)
            fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-4)
            t2 = synced()
            pt.load(client, fresh, fresh_opt)
            t3 = synced()
            times["ptc restart: save"].append(saved)
            times["ptc restart: load"].append(t3 - t2)
            if run == 0:
                for a, b in zip(model.parameters(), fresh.parameters()):
                    assert torch.equal(a, b)
                    assert torch.equal(opt.state[a]["exp_avg_sq"], fresh_opt.state[b]["exp_avg_sq"])
            del fresh, fresh_opt, client
            cluster.ptcctl("forget", job)

            # DCP, same layout.
            ckpt = disk / f"dcp{run}"
            sd = {"model": model.state_dict(), "optim": opt.state_dict()}
            t0 = synced()
            dcp.save(sd, checkpoint_id=str(ckpt))
            t1 = synced()
            fresh = gpt(args.layers).to(DEVICE)
            fresh_opt = trained(fresh)  # DCP loads in place: the state must exist
            t2 = synced()
            target = {"model": fresh.state_dict(), "optim": fresh_opt.state_dict()}
            dcp.load(target, checkpoint_id=str(ckpt))
            fresh.load_state_dict(target["model"])
            fresh_opt.load_state_dict(target["optim"])
            t3 = synced()
            times["DCP restart: save"].append(t1 - t0)
            times["DCP restart: load"].append(t3 - t2)
            if run == 0:
                for a, b in zip(model.parameters(), fresh.parameters()):
                    assert torch.equal(a, b)
            del fresh, fresh_opt, target
            shutil.rmtree(ckpt)

            # torch.save / torch.load.
            path = disk / f"torch{run}.pt"
            t0 = synced()
            torch.save(sd, path)
            t1 = synced()
            fresh = gpt(args.layers).to(DEVICE)
            fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-4)
            t2 = synced()
            loaded = torch.load(path, map_location=DEVICE)
            fresh.load_state_dict(loaded["model"])
            fresh_opt.load_state_dict(loaded["optim"])
            t3 = synced()
            times["torch.save"].append(t1 - t0)
            times["torch.load"].append(t3 - t2)
            del fresh, fresh_opt, loaded, sd
            path.unlink()

            # ptc, tp=2 -> tp=1.
            cluster.ptcctl("register", "--job", job, "--layout", str(spec), "--config", "tp=2",
                           "--hosts", "host0")
            full_state = {k: v.detach() for k, v in model.named_parameters()}
            ranks = []
            for rank in range(2):
                local = local_model(pt, full_state, layout, "tp=2", rank, args.layers)
                ranks.append((local, trained(local), cluster.client(job, rank, "host0")))
            saved = cluster.counted_save("host0", nbytes, ready["ptc change: save (2 ranks)"],
                                         save_ranks, pt, ranks)
            t1 = synced()
            cluster.ptcctl("reconfigure", "--job", job, "--to", "tp=1", "--hosts", "host1")
            t2 = synced()
            fresh = gpt(args.layers).to(DEVICE)
            fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-4)
            t3 = synced()
            pt.load(cluster.client(job, 0, "host1"), fresh, fresh_opt)
            t4 = synced()
            times["ptc change: save (2 ranks)"].append(saved)
            times["ptc change: store"].append(t2 - t1)
            times["ptc change: load"].append(t4 - t3)
            del ranks, fresh, fresh_opt
            cluster.ptcctl("forget", job)
            torch.cuda.empty_cache()

            # The limit: the same bytes between the GPU and pinned memory.
            gpu = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
            pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=DEVICE == "cuda")
            t0 = synced()
            pinned.copy_(gpu)
            t1 = synced()
            gpu.copy_(pinned)
            t2 = synced()
            times["limit: GPU -> pinned"].append(t1 - t0)
            times["limit: pinned -> GPU"].append(t2 - t1)
            del gpu, pinned
            print(f"run {run + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items() if v),
                  flush=True)
        del model, opt
        torch.cuda.empty_cache()
        print("DCP change tp=2 -> tp=1: two saving processes, then one loading", flush=True)
        try:
            saves, loads = dcp_change(args, disk)
            times["DCP change: save (2 processes)"], times["DCP change: load"] = saves, loads
        except (RuntimeError, subprocess.CalledProcessError) as e:
            dcp_failed = str(e)
            print(f"DCP change failed: {e}", flush=True)
    finally:
        cpu = cluster.cpu_seconds()
        cluster.stop()
        shutil.rmtree(disk, ignore_errors=True)
    print(f"{'phase':32} {'min':>8} {'median':>8} {'max':>8}   GB/s (median)")
    times = {k: v for k, v in times.items() if v}
    for k, v in times.items():
        med = statistics.median(v)
        print(f"{k:32} {min(v):8.3f} {med:8.3f} {max(v):8.3f}   {nbytes / med / 1e9:6.2f}")
    pause = {name: statistics.median(times[f"{name}: save"]) +
             statistics.median(times[f"{name}: load"]) for name in ("ptc restart", "DCP restart")}
    pause["torch.save/load"] = (statistics.median(times["torch.save"]) +
                                statistics.median(times["torch.load"]))
    pause["ptc change tp=2 -> tp=1"] = sum(statistics.median(times[f"ptc change: {p}"])
                                           for p in ("save (2 ranks)", "store", "load"))
    if not dcp_failed:
        pause["DCP change tp=2 -> tp=1"] = sum(statistics.median(times[f"DCP change: {p}"])
                                               for p in ("save (2 processes)", "load"))
    print("pause (save + load, medians): " + ", ".join(f"{k} {v:.3f} s" for k, v in pause.items()))
    print("ptc's saves began once host0's spare pool held their memory (as in a job's steady "
          "state), up to 30 s: puts into prepared memory / not, all runs: " +
          ", ".join(f"{k} {u} / {m}" for k, (u, m) in ready.items()))
    print("the daemons' CPU over the whole benchmark (user + system): " +
          ", ".join(f"{k} {v:.2f} s" for k, v in cpu.items()))
    if dcp_failed:
        raise SystemExit(f"the DCP change did not run: {dcp_failed}")


if __name__ == "__main__":
    main()
