"""A local ptc cluster of real processes for tests: a coordinator and N ptcd,
every connection mutual TLS with certificates from tools/ptc-certs."""
import json
import os
import pathlib
import signal
import subprocess
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_HOSTS = 16


def plaintext():
    """PTC_TEST_PLAINTEXT=1: clusters without TLS (--insecure), for a machine
    without openssl to make certificates (tools/device_check.sh on a GPU
    image); never in CI."""
    return os.environ.get("PTC_TEST_PLAINTEXT") == "1"


def certificates():
    """The test session's CA and certificates (host0..host15, coordinator,
    admin, the jobs' "client", "client:k") and job token key, made once. This process and everything it starts use the admin
    certificate: ptc's client library reads PTC_TLS_* once per process."""
    global _certs
    if _certs is None and plaintext():
        _certs = pathlib.Path(tempfile.mkdtemp(prefix="ptc-plaintext-"))
        os.environ["PTC_INSECURE"] = "1"
    if _certs is None:
        _certs = pathlib.Path(tempfile.mkdtemp(prefix="ptc-certs-"))
        tool = str(ROOT / "tools/ptc-certs")
        for what in (["ca"], ["coordinator"], ["admin"], ["client"], ["client", "k"],
                     ["token-key"], *(["host", f"host{i}"] for i in range(MAX_HOSTS))):
            subprocess.run([tool, str(_certs), *what], check=True, capture_output=True)
        os.environ.update(PTC_TLS_CA=str(_certs / "ca.pem"),
                          PTC_TLS_CERT=str(_certs / "admin.pem"),
                          PTC_TLS_KEY=str(_certs / "admin.key"))
    return _certs


_certs = None


def tls_flags(name):
    certs = certificates()
    if plaintext():
        return ["--insecure"]
    return ["--tls-ca", str(certs / "ca.pem"), "--tls-cert", str(certs / f"{name}.pem"),
            "--tls-key", str(certs / f"{name}.key")]


class LocalCluster:
    def __init__(self, bin_dir, tmp_path, hosts=4, gpus=2, memory="2GiB", host_timeout=2,
                 coordinator_env=None, tokens=False, domains=None, coordinator_flags=()):
        """tokens: the coordinator and every ptcd get the job token key, so
        local clients need their job's token (as the local cluster of
        tools/local_cluster.sh runs). domains: each host's failure domain
        (ptcd --domain). coordinator_flags: more flags for the coordinator."""
        self.coordinator_flags = list(coordinator_flags)
        self.bin = bin_dir
        self.domains = domains
        self.dir = tmp_path
        self.gpus = gpus
        self.memory = memory
        self.procs = {}
        assert hosts <= MAX_HOSTS
        self.certs = certificates()
        self.host_timeout = host_timeout
        self.token_flags = ["--token-key", str(self.certs / "tokens.key")] if tokens else []
        self.coordinator_env = coordinator_env
        self.coord_port = self._start_coordinator(port=0)
        self.coordinator = f"127.0.0.1:{self.coord_port}"
        for i in range(hosts):
            self._start_ptcd(i, memory)
        self.wait_alive(hosts)

    def _wait_port(self, path):
        for _ in range(400):
            if path.exists() and path.read_text().strip():
                return int(path.read_text())
            time.sleep(0.025)
        raise RuntimeError(f"{path} never appeared")

    def _start_coordinator(self, port):
        port_file = self.dir / "coordinator.port"
        if port_file.exists():
            port_file.unlink()
        (self.dir / "coordinator").mkdir(exist_ok=True)
        log = open(self.dir / "coordinator.log", "a")
        self.procs["coordinator"] = subprocess.Popen(
            [str(self.bin / "coordinator/ptc-coordinator"), "--listen", f"127.0.0.1:{port}",
             "--state-dir", str(self.dir / "coordinator"), "--port-file", str(port_file),
             "--host-timeout", str(self.host_timeout), "--log-level", "info",
             *tls_flags("coordinator"), *self.token_flags, *self.coordinator_flags],
            stdout=log, stderr=log, env={**os.environ, **(self.coordinator_env or {})})
        return self._wait_port(port_file)

    def _start_ptcd(self, i, memory):
        port_file = self.dir / f"host{i}.port"
        if port_file.exists():
            port_file.unlink()
        log = open(self.dir / f"host{i}.log", "a")
        self.procs[f"host{i}"] = subprocess.Popen(
            [str(self.bin / "ptcd/ptcd"), "--listen", "127.0.0.1:0",
             "--socket", str(self.dir / f"host{i}.sock"),
             "--port-file", str(self.dir / f"host{i}.port"), "--memory-limit", memory,
             "--coordinator", self.coordinator, "--name", f"host{i}", "--gpus", str(self.gpus),
             "--log-level", "info", *tls_flags(f"host{i}"), *self.token_flags,
             *(["--domain", self.domains[i]] if getattr(self, "domains", None) else [])],
            stdout=log, stderr=log)
        self._wait_port(self.dir / f"host{i}.port")

    def restart_coordinator(self):
        self.kill("coordinator")
        self._start_coordinator(port=self.coord_port)

    def kill(self, name, sig=signal.SIGKILL):
        p = self.procs[name]
        p.send_signal(sig)
        p.wait(timeout=30)

    def register_with_loader(self, model, config, hosts, job="j"):
        """Registers `job` as `model`'s layout plus a data loader's position
        per data-parallel rank ("loader": scope dp, copied to new ranks):
        where a replica is on one host, its loader has no copy on another
        host."""
        spec = json.loads(self.ptcctl("layout", "export", "--model", model,
                                      check=True).stdout)
        spec["small_objects"].append({"name": "loader", "scope": ["dp"], "bytes": "64"})
        path = self.dir / f"{job}_loader_layout.json"
        path.write_text(json.dumps(spec))
        self.ptcctl("register", "--job", job, "--layout", str(path), "--config", config,
                    "--hosts", ",".join(hosts), check=True)

    def restart_ptcd(self, i):
        """Starts host<i> again: a new process with an empty store."""
        self._start_ptcd(i, self.memory)

    def stop_process(self, name):
        self.procs[name].send_signal(signal.SIGSTOP)

    def resume_process(self, name):
        self.procs[name].send_signal(signal.SIGCONT)

    def wait_change(self, job, timeout=60):
        """Waits until the job's reconfiguration ended; returns its event."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            e = self.job(job).get("reconfiguration", {})
            if e.get("phase") in ("committed", "aborted"):
                return e
            time.sleep(0.05)
        raise RuntimeError(f"the change of {job} did not end in {timeout} s: {self.job(job)}")

    def wait_phase(self, job, phase, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.job(job).get("reconfiguration", {}).get("phase") == phase:
                return
            time.sleep(0.01)
        raise RuntimeError(f"{job} never reached phase {phase}: {self.job(job)}")

    def ptcctl(self, *args, check=False):
        r = subprocess.run([str(self.bin / "tools/ptcctl"), *args, "--coordinator", self.coordinator],
                           capture_output=True, text=True, timeout=300)
        if check:
            assert r.returncode == 0, r.stdout + r.stderr
        return r

    def ptcctl_async(self, *args):
        """Starts a ptcctl command (e.g. a reconfigure, which waits for the
        change's end) and returns its process."""
        return subprocess.Popen([str(self.bin / "tools/ptcctl"), *args, "--coordinator",
                                 self.coordinator], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def ptcctl_json(self, *args):
        r = self.ptcctl(*args, "--json")
        return r.returncode, json.loads(r.stdout)

    def job_tool(self, *args):
        return subprocess.run([str(self.bin / "tools/synthetic_job"), *args,
                               "--coordinator", self.coordinator],
                              capture_output=True, text=True, timeout=300)

    def save(self, job, host, step, *extra, check=True):
        """Saves `step` of every rank `job` places on `host` (synthetic
        values); returns the tool's result."""
        r = self.job_tool("save", "--job", job, "--host", host, "--socket",
                          str(self.dir / f"{host}.sock"), "--step", str(step), *extra)
        if check:
            assert r.returncode == 0, r.stdout + r.stderr
        return r

    def hosts(self):
        return {h["name"]: h for h in self.ptcctl_json("hosts")[1]["hosts"]}

    def wait_alive(self, n):
        for _ in range(400):
            if sum(h["alive"] for h in self.hosts().values()) >= n:
                return
            time.sleep(0.025)
        raise RuntimeError("hosts did not register")

    def wait_dead(self, name):
        for _ in range(400):
            if not self.hosts()[name]["alive"]:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{name} was never declared dead")

    def job(self, job):
        return self.ptcctl_json("status", job)[1]["jobs"][0]

    def store_versions(self, host, job):
        port = (self.dir / f"{host}.port").read_text().strip()
        r = subprocess.run([str(self.bin / "tools/ptcctl"), "store", "ls", "--host",
                            f"127.0.0.1:{port}", "--json"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        jobs = [j for j in json.loads(r.stdout)["jobs"] if j["job"] == job]
        return sorted((v["version"], v["committed"]) for j in jobs for v in j["versions"])

    def stop(self):
        for name, p in self.procs.items():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
