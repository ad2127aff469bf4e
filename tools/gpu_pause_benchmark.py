"""The pause of a GPU job's restart and of a change of its parallelism:
ptc against what users pick today, in one run, on one GPU (not a test).

    python3 tools/gpu_pause_benchmark.py --bin BIN_DIR [--runs 3] [--layers 12]

BIN_DIR holds the daemons as Bazel lays them out (ptcd/ptcd,
coordinator/ptc-coordinator, tools/ptcctl; tools/venv_check.sh and
tools/device_check.sh make such a folder from the tarball); `ptc` must be
importable (the wheel). The job is a GPT's tensors (hidden 2048, 4x MLP,
vocabulary 32000) in fp32 with Adam's two moments, on the GPU: 3.72 GiB at
the default 4 layers (each layer adds about 0.56 GiB).

Per run, each a fresh job on the same cluster:
  ptc restart   pt.save from the GPU into ptcd, then pt.load into a fresh
                model and optimizer on the GPU (same layout)
  DCP restart   torch.distributed.checkpoint save of the same state dict
                to local disk, then load into a fresh model and optimizer
  torch.save    torch.save of the state dict to local disk, then torch.load
                and load_state_dict
  ptc change    tp=2 -> tp=1: both tp=2 ranks save their shards (clients
                in this process; one GPU), the store re-partitions the
                state (ptcctl reconfigure), the tp=1 rank loads it
DCP can reshard tp=2 -> tp=1 only from a checkpoint saved by one process
per rank with DTensors on a device mesh of one GPU per rank: not on a
machine with one GPU, so the table has no DCP change.

Prints min/median/max seconds per phase and the GB/s of each against
cudaMemcpy-class copies of the same bytes to and from pinned memory
(torch's pin_memory tensors), measured in the same run.
"""
import argparse
import json
import os
import pathlib
import shutil
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
        self.bin, self.dir, self.procs = bin_dir, work, []
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

    def client(self, job, rank, host):
        import ptc
        return ptc.Client(socket=str(self.dir / f"{host}.sock"), coordinator=self.coordinator,
                          job=job, rank=rank)

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


def local_model(pt, full_state, layout, config, rank, layers):
    model = gpt(layers).to("meta")
    for key, t in pt.shard_state(full_state, layout, config, rank).items():
        module, _, attr = key.rpartition(".")
        setattr(model.get_submodule(module), attr, torch.nn.Parameter(t.clone().to(DEVICE)))
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", type=pathlib.Path, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--disk", type=pathlib.Path, default=None,
                    help="where DCP and torch.save write (default: a temporary folder)")
    ap.add_argument("--device", default="cuda",
                    help="cpu: a dry run of the script on a machine without a GPU")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    import ptc.torch as pt
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("PyTorch sees no CUDA device")
    import torch.distributed.checkpoint as dcp

    work = pathlib.Path(tempfile.mkdtemp(prefix="ptc-pause-"))
    disk = pathlib.Path(tempfile.mkdtemp(prefix="ptc-pause-disk-", dir=args.disk))
    cluster = Cluster(args.bin, work)
    times = {k: [] for k in ("ptc restart: save", "ptc restart: load", "DCP restart: save",
                             "DCP restart: load", "torch.save", "torch.load",
                             "ptc change: save (2 ranks)", "ptc change: store", "ptc change: load",
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
            t0 = synced()
            pt.save(client, model, opt, step=1)
            t1 = synced()
            fresh = gpt(args.layers).to(DEVICE)
            fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-4)
            t2 = synced()
            pt.load(client, fresh, fresh_opt)
            t3 = synced()
            times["ptc restart: save"].append(t1 - t0)
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
            t0 = synced()
            for rank, (local, lopt, c) in enumerate(ranks):
                pt.save(c, local, lopt, step=1, wait=rank == 1)
            t1 = synced()
            cluster.ptcctl("reconfigure", "--job", job, "--to", "tp=1", "--hosts", "host1")
            t2 = synced()
            fresh = gpt(args.layers).to(DEVICE)
            fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-4)
            t3 = synced()
            pt.load(cluster.client(job, 0, "host1"), fresh, fresh_opt)
            t4 = synced()
            times["ptc change: save (2 ranks)"].append(t1 - t0)
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
            print(f"run {run + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()),
                  flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(disk, ignore_errors=True)
    print(f"{'phase':32} {'min':>8} {'median':>8} {'max':>8}   GB/s (median)")
    for k, v in times.items():
        med = statistics.median(v)
        print(f"{k:32} {min(v):8.3f} {med:8.3f} {max(v):8.3f}   {nbytes / med / 1e9:6.2f}")
    pause = {name: statistics.median(times[f"{name}: save"]) +
             statistics.median(times[f"{name}: load"]) for name in ("ptc restart", "DCP restart")}
    pause["torch.save/load"] = (statistics.median(times["torch.save"]) +
                                statistics.median(times["torch.load"]))
    pause["ptc change tp=2 -> tp=1"] = sum(statistics.median(times[f"ptc change: {p}"])
                                           for p in ("save (2 ranks)", "store", "load"))
    print("pause (save + load, medians): " + ", ".join(f"{k} {v:.3f} s" for k, v in pause.items()))


if __name__ == "__main__":
    main()
