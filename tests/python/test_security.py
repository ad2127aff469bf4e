"""Who gets in: the local cluster runs mutual TLS and job tokens; without
credentials, with a certificate of another CA, with a host's certificate
used as another host, with a certificate of the wrong kind for an admin
operation, or with another job's token or certificate, every call is
refused and nothing changes."""
import json
import os
import subprocess
import sys
import time

import pytest

from cluster import LocalCluster, tls_flags, ROOT

MODEL = "gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8,pad=8"


@pytest.fixture(scope="module")
def cluster(bin_dir, tmp_path_factory):
    c = LocalCluster(bin_dir, tmp_path_factory.mktemp("security"), hosts=2, gpus=3,
                     tokens=True)
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


def as_job_process(c, cert, token, code):
    """Runs `code` (Python, with `ptc`, `sock`, `coord` defined) as a job's
    process would: the given certificate and PTC_JOB_TOKEN. Returns what it
    prints, or "ERROR: ..." for the exception it raised."""
    env = {k: v for k, v in os.environ.items() if k != "PTC_JOB_TOKEN"}
    env.update(PTC_TLS_CERT=str(c.certs / f"{cert}.pem"),
               PTC_TLS_KEY=str(c.certs / f"{cert}.key"),
               PYTHONPATH=f"{c.bin}/client/python/pkg")
    if token is not None:
        env["PTC_JOB_TOKEN"] = token
    program = ("import ptc, sys\n"
               f"sock, coord = {str(c.dir / 'host0.sock')!r}, {c.coordinator!r}\n"
               "try:\n"
               + "".join(f"    {line}\n" for line in code.strip().splitlines()) +
               "except Exception as e:\n"
               "    print('ERROR:', e)\n")
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_job_token_acts_on_its_job_only(cluster):
    out = cluster.ptcctl("register", "--job", "k", "--model", MODEL, "--config", "tp=1",
                         "--hosts", "host0,host1", "--json", check=True)
    token_k = json.loads(out.stdout)["token"]
    assert token_k.startswith("ptc1:k:")
    token = cluster.ptcctl("token", "j", check=True).stdout.strip()
    assert token.startswith("ptc1:j:") and token != token_k
    connect = "print(ptc.Client(sock, coord, {job!r}, 0).host)"

    # The job's token, with the jobs' certificate: its own job only.
    assert as_job_process(cluster, "client", token, connect.format(job="j")) == "host0"
    refused = as_job_process(cluster, "client", token, connect.format(job="k"))
    assert "the token is for job 'j', not job 'k'" in refused
    # No token, a forged one, one of a key this cluster does not have.
    assert "job token" in as_job_process(cluster, "client", None, connect.format(job="j"))
    forged = token[:-1] + ("0" if token[-1] != "0" else "1")
    assert "not issued by this cluster" in as_job_process(cluster, "client", forged,
                                                          connect.format(job="j"))
    # On gRPC: the token names the job it may act on...
    ranks = "print(ptc.ranks_on_host(coord, {job!r}, 'host0')['config'])"
    assert as_job_process(cluster, "client", token, ranks.format(job="j")) == "tp=2,dp=2"
    assert "acts for job 'j' only" in as_job_process(cluster, "client", token,
                                                     ranks.format(job="k"))
    # ...as a client:JOB certificate does without one.
    assert as_job_process(cluster, "client-k", None, ranks.format(job="k")) == "tp=1"
    assert "acts for job 'k' only" in as_job_process(cluster, "client-k", None,
                                                     ranks.format(job="j"))
    # A job's certificate and token are no admin's.
    r = ptcctl_as(cluster, cluster.certs, "client", "forget", "j")
    assert r.returncode != 0 and "ForgetJob may be called by an admin" in r.stderr
    r = ptcctl_as(cluster, cluster.certs, "client-k", "token", "k")
    assert r.returncode != 0 and "JobToken may be called by an admin" in r.stderr
    assert sorted(jobs(cluster)) == ["j", "k"]
    cluster.ptcctl("forget", "k", check=True)


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
        [str(cluster.bin / "ptcd/ptcd"), "--listen", "127.0.0.1:0", "--socket", "none",
         "--memory-limit", "64MiB", "--coordinator", cluster.coordinator, "--name", "host1",
         "--gpus", "2", *[f.replace("host1", "host0") for f in tls_flags("host1")]],
        stdout=log, stderr=log)
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            text = (tmp_path / "impostor.log").read_text()
            if "only host host1 may call RegisterHost as host1" in text:
                break
            time.sleep(0.1)
        assert "only host host1 may call RegisterHost as host1" in (tmp_path / "impostor.log").read_text()
        assert cluster.hosts()["host1"]["address"] == before
    finally:
        impostor.kill()
        impostor.wait()


def test_plaintext_needs_an_explicit_choice(bin_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PTC_")}
    r = subprocess.run([str(bin_dir / "ptcd/ptcd"), "--listen", "127.0.0.1:0",
                        "--socket", "none"], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 2
    assert "needs TLS" in r.stderr and "--insecure" in r.stderr
    r = subprocess.run([str(bin_dir / "coordinator/ptc-coordinator"), "--state-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 2 and "needs TLS" in r.stderr


def test_only_the_hosts_of_a_plan_epoch_read_from_a_source(bin_dir, tmp_path):
    """The coordinator admits, on each source host, the hosts that pull from
    it in a plan epoch; any other host certificate is refused the transfer
    call (and with it the bytes a source sends over UCX) and the store's
    reads (the gRPC transport's Read, small objects)."""
    c = LocalCluster(bin_dir, tmp_path, hosts=3, gpus=2, tokens=True)
    try:
        c.ptcctl("register", "--job", "p", "--model", MODEL, "--config", "tp=2",
                 "--hosts", "host0", check=True)
        token = c.ptcctl("token", "p", check=True).stdout.strip()
        r = subprocess.run([str(c.bin / "tools/synthetic_job"), "save", "--coordinator",
                            c.coordinator, "--job", "p", "--host", "host0", "--socket",
                            str(c.dir / "host0.sock"), "--step", "1"],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PTC_JOB_TOKEN=token))
        assert r.returncode == 0, r.stdout + r.stderr
        # host1 pulls everything from host0 (over mutual TLS, admitted).
        code, report = c.ptcctl_json("reconfigure", "--job", "p", "--to", "tp=2",
                                     "--hosts", "host1")
        assert code == 0 and report["phase"] == "committed", report
        assert report["bytes_from_peers"] > 0
        epoch = str(report["plan_epoch"])
        host0 = c.hosts()["host0"]["address"]

        def probe(as_host, *mode):
            env = dict(os.environ, PTC_TLS_CERT=str(c.certs / f"{as_host}.pem"),
                       PTC_TLS_KEY=str(c.certs / f"{as_host}.key"))
            r = subprocess.run([str(c.bin / "tools/peer_probe"), *mode, host0, "p", "1",
                                epoch, "embedding.word.weight"],
                               capture_output=True, text=True, timeout=60, env=env)
            assert r.returncode == 0, r.stderr
            return r.stdout

        refused = probe("host2")
        assert refused.startswith("PERMISSION_DENIED")
        assert "host 'host2' is not a peer of plan epoch" in refused
        assert not probe("host1").startswith("PERMISSION_DENIED")
        # The store's Read: a host certificate alone reads nothing.
        refused = probe("host2", "--read")
        assert refused.startswith("PERMISSION_DENIED"), refused
        assert "host 'host2' is not a peer of the current plan epoch" in refused
        assert not probe("host1", "--read").startswith("PERMISSION_DENIED")
        # Its small objects, many a call (GetSmallObjects), the same.
        refused = probe("host2", "--small-objects")
        assert refused.startswith("PERMISSION_DENIED"), refused
        assert "host 'host2' is not a peer of the current plan epoch" in refused
        assert not probe("host1", "--small-objects").startswith("PERMISSION_DENIED")
    finally:
        c.stop()


def test_a_process_reaches_the_coordinator_through_its_ptcd_as_its_job_only(cluster):
    """A job's processes call the coordinator through their host's ptcd (one
    connection per host). A relayed call acts with its job's token and
    nothing else: the host's certificate on ptcd's connection lends it no
    right, and neither does the certificate of whoever used the socket."""
    token = cluster.ptcctl("token", "j", check=True).stdout.strip()
    relay = cluster.dir / "host0-coordinator.sock"
    assert relay.exists()
    connect = "c = ptc.Client(sock, coord, 'j', 0); print(c.relayed, c.config)"
    assert as_job_process(cluster, "client", token, connect) == "True tp=2,pp=1,dp=2"
    ranks = f"print(ptc.ranks_on_host('unix:{relay}', {{job!r}}, 'host0')['config'])"
    assert as_job_process(cluster, "client", token, ranks.format(job="j")) == "tp=2,dp=2"
    assert "acts for job 'j' only" in as_job_process(cluster, "client", token,
                                                     ranks.format(job="k"))
    # Without a token nothing passes, not even a list of the hosts.
    assert "needs its job's token" in as_job_process(cluster, "client", None,
                                                     ranks.format(job="j"))
    # An admin's certificate does not pass through the socket: ptcctl there
    # (which sends no token) may not forget the job, add hosts or list them.
    env = dict(os.environ, PTC_TLS_CA=str(cluster.certs / "ca.pem"),
               PTC_TLS_CERT=str(cluster.certs / "admin.pem"),
               PTC_TLS_KEY=str(cluster.certs / "admin.key"))
    for args in (["forget", "j"], ["hosts", "add", "host1", "--job", "j"], ["hosts"]):
        r = subprocess.run([str(cluster.bin / "tools/ptcctl"), *args,
                            "--coordinator", f"unix:{relay}"],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode != 0, r.stdout
        assert "needs its job's token" in r.stderr, r.stderr
    assert jobs(cluster) == ["j"]


def test_a_ptcd_relays_unless_told_not_to_or_its_socket_path_is_too_long(cluster, tmp_path):
    """--coordinator-socket none, or a local socket whose relay path would not
    fit a socket's address: ptcd serves without the relay (a warning says
    why), and its processes connect to the coordinator directly."""
    deep = tmp_path / ("d" * max(1, 100 - len(str(tmp_path)) - len("/h.sock") - 1))
    deep.mkdir()
    cases = {"none": (tmp_path / "n.sock", ["--coordinator-socket", "none"]),
             "long": (deep / "h.sock", [])}
    assert 96 <= len(str(cases["long"][0])) <= 107
    for what, (sock, flags) in cases.items():
        log = tmp_path / f"{what}.log"
        port = tmp_path / f"{what}.port"
        p = subprocess.Popen(
            [str(cluster.bin / "ptcd/ptcd"), "--listen", "127.0.0.1:0", "--socket", str(sock),
             "--port-file", str(port), "--memory-limit", "256MiB",
             "--coordinator", cluster.coordinator, "--name", "host2", "--gpus", "1",
             *tls_flags("host2"), *cluster.token_flags, *flags],
            stdout=open(log, "w"), stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 60
            while not port.exists() and p.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            assert port.exists(), log.read_text()
            assert not list(sock.parent.glob("*-coordinator.sock"))
            if what == "none":
                cluster.ptcctl("register", "--job", "r", "--model", MODEL, "--config",
                               "tp=1", "--hosts", "host2", check=True)
            token = cluster.ptcctl("token", "r", check=True).stdout.strip()
            code = (f"sock = {str(sock)!r}\n"
                    "c = ptc.Client(sock, coord, 'r', 0); print(c.relayed, c.host)")
            assert as_job_process(cluster, "client", token, code) == "False host2"
            if what == "long":
                assert "no coordinator relay" in log.read_text()
        finally:
            p.terminate()
            p.wait(30)
    # host2 is gone: the job is forgotten, its store on host2 not cleared.
    assert "job r forgotten" in cluster.ptcctl("forget", "r").stdout
