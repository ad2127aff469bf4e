"""Shared fixtures: where the Bazel-built binaries are."""
import itertools
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Numbers the network "hosts" made in this process: a name is never used
# twice in one suite, since a namespace's teardown in the kernel ends after
# `ip netns del` returns (a veth it held can still exist for a moment).
_network_serial = itertools.count()


@pytest.fixture(scope="session")
def bin_dir():
    path = pathlib.Path(os.environ.get("PTC_BIN_DIR", ROOT / "bazel-bin"))
    if not (path / "tools" / "ptcctl").exists():
        pytest.fail(f"{path}/tools/ptcctl is missing; build with `bazel build //...` "
                    "or set PTC_BIN_DIR")
    return path


def stop_processes(procs, timeout=15):
    """SIGTERM to each process, then waits; one that does not exit within
    `timeout` is killed."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def network_namespaces():
    """Makes "hosts": network namespaces joined to a bridge in the root
    namespace by veth pairs. make(labels) returns the subnet ("10.x.y"),
    the bridge's name and [(namespace, address, veth)] per label, on a /24
    of its own (from this process's id, so
    that two suites at once do not share one); the bridge is the subnet's
    .1, the i-th namespace its .(10+i). Names are new for every call in
    the suite. Everything is removed afterwards, each veth pair explicitly
    (deleting its root end removes both ends at once)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    made, veths, bridges = [], [], []

    def run(*cmd):
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"{cmd}: {r.stdout}{r.stderr}"

    def make(labels):
        pid = os.getpid()
        tag = f"{pid % 10000}x{next(_network_serial)}"
        net = f"10.{100 + pid % 100}.{(pid // 100) % 250 + len(bridges)}"
        bridge = f"ptc{tag}br"
        run("ip", "link", "add", bridge, "type", "bridge")
        bridges.append(bridge)
        run("ip", "addr", "add", f"{net}.1/24", "dev", bridge)
        run("ip", "link", "set", bridge, "up")
        hosts = []
        for i, label in enumerate(labels):
            ns, veth = f"ptc{tag}-{label}", f"ptc{tag}v{i}"
            run("ip", "netns", "add", ns)
            made.append(ns)
            run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            veths.append(veth)
            run("ip", "link", "set", veth, "master", bridge, "up")
            run("ip", "-n", ns, "addr", "add", f"{net}.{10 + i}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            hosts.append((ns, f"{net}.{10 + i}", veth))
        return net, bridge, hosts

    try:
        yield make
    finally:
        for veth in veths:
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for bridge in bridges:
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)


@pytest.fixture(scope="session")
def ptcctl(bin_dir):
    def run(*args):
        return subprocess.run([str(bin_dir / "tools" / "ptcctl"), *args],
                              capture_output=True, text=True, timeout=300)
    return run


@pytest.fixture(scope="session")
def ptc_module(bin_dir):
    """The `ptc` Python package Bazel built (client/python), or, with
    PTC_INSTALLED_CLIENT=1, the one installed in this interpreter (the
    wheel in a venv: tools/venv_check.sh)."""
    import sys
    if os.environ.get("PTC_INSTALLED_CLIENT") == "1":
        import ptc
        assert "bazel-out" not in ptc.__file__ and ROOT not in pathlib.Path(ptc.__file__).parents, \
            f"ptc is not the installed wheel: {ptc.__file__}"
        return ptc
    pkg = bin_dir / "client" / "python" / "pkg"
    if not (pkg / "ptc" / "libptc.so").exists():
        pytest.fail(f"{pkg}/ptc/libptc.so is missing; build with `bazel build //...`")
    sys.path.insert(0, str(pkg))
    import ptc
    return ptc


@pytest.fixture(scope="session", autouse=True)
def tls_certificates():
    """Every test's processes speak mutual TLS; the certificates (and the
    PTC_TLS_* environment of this process) exist before any client
    connects, since ptc's client library reads them once per process."""
    from cluster import certificates
    return certificates()
