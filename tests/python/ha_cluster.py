"""A local ptc cluster whose control plane outlives its processes: a
3-member etcd (mutual TLS with a CA of its own), several coordinators
campaigning in it, and ptcds (with their clients) given every
coordinator's address. Each coordinator runs under a supervisor that
starts it again when it exits, as systemd's Restart=always does in the
deploy guide: a coordinator that lost the lead exits and comes back as a
standby."""
import os
import signal
import socket
import subprocess
import threading
import time

from cluster import LocalCluster, ROOT, certificates, tls_flags


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Etcd:
    def __init__(self, tmp_path, members=3, host="127.0.0.1", also=()):
        """host: the members' address; also: addresses their certificates
        name besides (etcd checks a peer's certificate against the address
        it connects from)."""
        self.host = host
        self.dir = tmp_path / "etcd"
        self.dir.mkdir()
        self.certs = self.dir / "certs"
        tool = str(ROOT / "tools/ptc-certs")
        for what in (["ca"], ["etcd-client", "coordinator"],
                     *(["etcd", f"e{i}"] for i in range(members))):
            subprocess.run([tool, str(self.certs), *what, *([host, *also] if what[0] == "etcd" else [])],
                           check=True, capture_output=True)
        ports = free_ports(2 * members)
        self.client_ports, self.peer_ports = ports[:members], ports[members:]
        self.procs = [None] * members
        self.endpoints = ",".join(f"{host}:{p}" for p in self.client_ports)
        self.initial = ",".join(f"e{i}=https://{host}:{p}"
                                for i, p in enumerate(self.peer_ports))
        for i in range(members):
            self.start(i, state="new")

    def start(self, i, state="existing"):
        c = self.certs
        tls = ["--cert-file", c / f"etcd-e{i}.pem", "--key-file", c / f"etcd-e{i}.key",
               "--trusted-ca-file", c / "ca.pem", "--client-cert-auth",
               "--peer-cert-file", c / f"etcd-e{i}.pem", "--peer-key-file", c / f"etcd-e{i}.key",
               "--peer-trusted-ca-file", c / "ca.pem", "--peer-client-cert-auth"]
        cmd = ["etcd", "--name", f"e{i}", "--data-dir", self.dir / f"e{i}",
               "--listen-client-urls", f"https://{self.host}:{self.client_ports[i]}",
               "--advertise-client-urls", f"https://{self.host}:{self.client_ports[i]}",
               "--listen-peer-urls", f"https://{self.host}:{self.peer_ports[i]}",
               "--initial-advertise-peer-urls", f"https://{self.host}:{self.peer_ports[i]}",
               "--initial-cluster", self.initial, "--initial-cluster-state", state,
               "--initial-cluster-token", f"ptc-test-{os.getpid()}", *tls]
        log = open(self.dir / f"e{i}.log", "a")
        self.procs[i] = subprocess.Popen([str(a) for a in cmd], stdout=log, stderr=log)

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].wait()

    def pause(self, i):
        """Freezes member i (SIGSTOP): its port still accepts connections,
        nothing answers."""
        self.procs[i].send_signal(signal.SIGSTOP)

    def resume(self, i):
        self.procs[i].send_signal(signal.SIGCONT)

    def ctl(self, *args, timeout=30):
        c = self.certs
        r = subprocess.run(["etcdctl", "--endpoints", self.endpoints, "--cacert", str(c / "ca.pem"),
                            "--cert", str(c / "etcd-client-coordinator.pem"),
                            "--key", str(c / "etcd-client-coordinator.key"), *args],
                           capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "ETCDCTL_API": "3"})
        return r

    def stop(self):
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs:
            if p is not None:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()


def coordinator_command(bin_dir, etcd, address, lease=3, host_timeout=3):
    """ptc-coordinator over `etcd` (an Etcd), listening at `address`."""
    e = etcd.certs
    return [str(bin_dir / "coordinator/ptc-coordinator"), "--listen", address,
            "--etcd", etcd.endpoints, "--etcd-lease", str(lease),
            "--etcd-ca", str(e / "ca.pem"), "--etcd-cert", str(e / "etcd-client-coordinator.pem"),
            "--etcd-key", str(e / "etcd-client-coordinator.key"),
            "--host-timeout", str(host_timeout), "--log-level", "info",
            *tls_flags("coordinator")]


class Supervised:
    """A coordinator started again 0.3 s after it exits, until stopped."""

    def __init__(self, cmd, log_path, env=None):
        self.cmd, self.log_path, self.env = cmd, log_path, env
        self.proc = None
        self.starts = 0
        self.exits = []
        self._stop = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            with self._lock:
                if self._stop:
                    return
                log = open(self.log_path, "a")
                self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=log, env=self.env)
                self.starts += 1
            code = self.proc.wait()
            self.exits.append(code)
            time.sleep(0.3)

    def kill(self, sig=signal.SIGKILL):
        with self._lock:
            self.proc.send_signal(sig)

    def stop(self):
        with self._lock:
            self._stop = True
            if self.proc.poll() is None:
                self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._thread.join(timeout=20)


class HaCluster(LocalCluster):
    def __init__(self, bin_dir, tmp_path, coordinators=2, hosts=2, gpus=2, memory="1GiB",
                 host_timeout=3, lease=5):
        self.bin, self.dir, self.gpus, self.memory = bin_dir, tmp_path, gpus, memory
        self.procs = {}
        self.certs = certificates()
        self.host_timeout = host_timeout
        self.token_flags = []
        self.lease = lease
        self.etcd = Etcd(tmp_path)
        ports = free_ports(coordinators)
        self.addresses = [f"127.0.0.1:{p}" for p in ports]
        self.coordinator = ",".join(self.addresses)
        self.coordinators = [
            Supervised(coordinator_command(bin_dir, self.etcd, address, lease, host_timeout),
                       tmp_path / f"coordinator{i}.log")
            for i, address in enumerate(self.addresses)]
        try:
            self.wait_serving()
            for i in range(hosts):
                self._start_ptcd(i, memory)
            self.wait_alive(hosts)
        except BaseException:
            self.stop()  # no fixture will: leave no process behind
            raise

    def restart_coordinator(self):
        """What a restart is for one coordinator: here the leader is killed,
        a standby (or it, started again) takes over."""
        self.coordinators[self.leader()].kill()
        self.wait_serving()

    def leader(self, timeout=60):
        """The index of the coordinator that leads (per etcd's leader key)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.etcd.ctl("get", "/ptc/leader", "--print-value-only")
            value = r.stdout.strip()
            if r.returncode == 0 and value in self.addresses:
                return self.addresses.index(value)
            time.sleep(0.1)
        raise RuntimeError(f"no coordinator leads after {timeout} s")

    def wait_serving(self, timeout=60):
        """Seconds until a coordinator answers a call (ListJobs)."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.ptcctl("jobs", "--json").returncode == 0:
                return time.monotonic() - start
            time.sleep(0.05)
        raise RuntimeError(f"no coordinator served within {timeout} s")

    def stop(self):
        for c in self.coordinators:
            c.stop()
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        self.etcd.stop()
