"""Who gets in: the local cluster runs mutual TLS; without credentials, with
a certificate of another CA, with a host's certificate used as another
host, or with a certificate of the wrong kind for an admin operation, every
call is refused and nothing changes."""
import os
import subprocess
import time

import pytest

from cluster import LocalCluster, tls_flags, ROOT

MODEL = "gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8,pad=8"


@pytest.fixture(scope="module")
def cluster(bin_dir, tmp_path_factory):
    c = LocalCluster(bin_dir, tmp_path_factory.mktemp("security"), hosts=2, gpus=2)
    c.ptcctl("register", "--job", "j", "--model", MODEL, "--config", "tp=2,dp=2",
             "--hosts", "host0,host1", check=True)
    yield c
    c.stop()


def ptcctl_as(c, certs, name, *args):
    env = dict(os.environ, PTC_TLS_CA=str(certs / "ca.pem"),
               PTC_TLS_CERT=str(certs / f"{name}.pem"), PTC_TLS_KEY=str(certs / f"{name}.key"))
    return subprocess.run([str(c.bin / "tools/ptcctl"), *args, "--coordinator", c.coordinator],
                          capture_output=True, text=True, timeout=60, env=env)


def jobs(c):
    return [j["job"] for j in c.ptcctl_json("jobs")[1]["jobs"]]


def test_without_credentials_nothing_is_served(cluster):
    r = cluster.ptcctl("forget", "j", "--insecure")
    assert r.returncode != 0
    host0 = cluster.hosts()["host0"]["address"]
    r = subprocess.run([str(cluster.bin / "tools/ptcctl"), "store", "ls", "--host", host0,
                        "--insecure"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("PTC_")}
    r = subprocess.run([str(cluster.bin / "tools/ptcctl"), "jobs", "--coordinator",
                        cluster.coordinator], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 2 and "needs TLS" in r.stderr
    assert jobs(cluster) == ["j"]


def test_a_certificate_of_another_ca_is_refused(cluster, tmp_path):
    tool = str(ROOT / "tools/ptc-certs")
    for what in (["ca"], ["admin"]):
        subprocess.run([tool, str(tmp_path), *what], check=True, capture_output=True)
    r = ptcctl_as(cluster, tmp_path, "admin", "forget", "j")
    assert r.returncode != 0
    assert jobs(cluster) == ["j"]


def test_a_host_certificate_is_not_an_admin(cluster):
    r = ptcctl_as(cluster, cluster.certs, "host0", "forget", "j")
    assert r.returncode != 0
    assert "ForgetJob may be called by an admin" in r.stderr
    assert "'host0'" in r.stderr
    r = ptcctl_as(cluster, cluster.certs, "host1", "reconfigure", "--job", "j", "--to", "dp=4")
    assert r.returncode != 0 and "may be called by an admin" in r.stderr
    assert jobs(cluster) == ["j"]


def test_a_host_cannot_register_as_another_host(cluster, tmp_path):
    """A ptcd with host0's certificate that claims to be host1 is refused:
    host1's share of a reconfiguration cannot be diverted to it."""
    before = cluster.hosts()["host1"]["address"]
    log = open(tmp_path / "impostor.log", "w")
    impostor = subprocess.Popen(
        [str(cluster.bin / "tensor_store/ptcd"), "--listen", "127.0.0.1:0", "--socket", "none",
         "--memory-limit", "64MiB", "--coordinator", cluster.coordinator, "--name", "host1",
         "--gpus", "2", *[f.replace("host1", "host0") for f in tls_flags("host1")]],
        stdout=log, stderr=log)
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            text = (tmp_path / "impostor.log").read_text()
            if "only host host1 may register" in text:
                break
            time.sleep(0.1)
        assert "only host host1 may register" in (tmp_path / "impostor.log").read_text()
        assert cluster.hosts()["host1"]["address"] == before
    finally:
        impostor.kill()
        impostor.wait()


def test_plaintext_needs_an_explicit_choice(bin_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PTC_")}
    r = subprocess.run([str(bin_dir / "tensor_store/ptcd"), "--listen", "127.0.0.1:0",
                        "--socket", "none"], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 2
    assert "needs TLS" in r.stderr and "--insecure" in r.stderr
    r = subprocess.run([str(bin_dir / "coordinator/ptc-coordinator"), "--state-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 2 and "needs TLS" in r.stderr
