"""A cluster forms from the shipped files: the coordinator and three ptcd,
each host in its own network namespace joined to a bridge by a veth pair,
started with nothing but `--config` pointing at deploy/coordinator.conf.example
and deploy/ptcd.conf.example (with this cluster's addresses, paths and
names filled in). With TLS and job tokens as shipped, a job is registered,
saved, reconfigured onto other hosts and verified, and each daemon's
Prometheus endpoint answers."""
import json
import os
import re
import subprocess
import time
import urllib.request

import pytest

from cluster import ROOT
from conftest import stop_processes

MODEL = "gpt:layers=2,hidden=64,heads=4,ffn=128,vocab=256,positions=16,pad=8"


def configure(example, path, values):
    """Writes the shipped example with `values` in place of its keys' values
    (a commented-out key is set); every key must already be in the example
    (the test proves the shipped file has it)."""
    text = (ROOT / "deploy" / example).read_text()
    for key, value in values.items():
        text, n = re.subn(rf"^(# )?{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, f"deploy/{example} has no '{key} = ...' line"
    path.write_text(text)
    return path


def run(*cmd, env=None, timeout=120):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                       env=env)
    assert r.returncode == 0, f"{cmd}: {r.stdout}{r.stderr}"
    return r.stdout


def test_a_cluster_forms_from_the_shipped_files(bin_dir, tmp_path, network_namespaces):
    net, _, made = network_namespaces(["c", "h0", "h1", "h2"])
    namespaces = [ns for ns, _, _ in made]
    coord_ns, host_ns = namespaces[0], namespaces[1:]
    certs = tmp_path / "certs"
    tool = ROOT / "tools/ptc-certs"
    run(tool, certs, "ca")
    run(tool, certs, "coordinator", f"{net}.10")
    for i in range(3):
        run(tool, certs, "host", f"host{i}", f"{net}.{11 + i}")
    for what in (["admin"], ["client"], ["token-key"]):
        run(tool, certs, *what)
    coordinator = f"{net}.10:7000"
    confs = [configure("coordinator.conf.example", tmp_path / "coordinator.conf", {
        "listen": coordinator, "state_dir": tmp_path / "coordinator",
        "tls_ca": certs / "ca.pem", "tls_cert": certs / "coordinator.pem",
        "tls_key": certs / "coordinator.key", "token_key": certs / "tokens.key",
        "metrics_listen": f"{net}.10:9471"})]
    for i in range(3):
        address = f"{net}.{11 + i}"
        confs.append(configure("ptcd.conf.example", tmp_path / f"host{i}.conf", {
            "listen": f"{address}:7070", "coordinator": coordinator, "name": f"host{i}",
            "gpus": 2, "bandwidth": "1.25e9", "advertise": f"{address}:7070",
            "tls_ca": certs / "ca.pem", "tls_cert": certs / f"host{i}.pem",
            "tls_key": certs / f"host{i}.key", "token_key": certs / "tokens.key",
            "socket": tmp_path / f"host{i}.sock", "memory_limit": "1GiB",
            "spare_pool": "64MiB", "allowed_group": "root",
            # Three ptcds on one kernel: as the shipped file says for that.
            "ucx_transports": "^cma",
            "metrics_listen": f"{address}:9470"}))
    # The daemons see only their config files: no PTC_* from this process.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PTC_")}
    procs = []
    logs = []
    try:
        for ns, conf, binary in [(coord_ns, confs[0], "coordinator/ptc-coordinator"),
                                 *[(host_ns[i], confs[1 + i], "ptcd/ptcd")
                                   for i in range(3)]]:
            log = open(tmp_path / f"{conf.stem}.log", "w")
            logs.append(tmp_path / f"{conf.stem}.log")
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, str(bin_dir / binary),
                                           "--config", str(conf)],
                                          stdout=log, stderr=subprocess.STDOUT, env=clean))
        admin = dict(clean, PTC_TLS_CA=str(certs / "ca.pem"),
                     PTC_TLS_CERT=str(certs / "admin.pem"), PTC_TLS_KEY=str(certs / "admin.key"))

        def ptcctl(*args):
            return run(bin_dir / "tools/ptcctl", *args, "--coordinator", coordinator, env=admin)

        deadline = time.time() + 30
        while True:
            try:
                hosts = json.loads(ptcctl("hosts", "--json"))["hosts"]
                if sum(h["alive"] for h in hosts) == 3:
                    break
            except AssertionError:
                pass
            assert time.time() < deadline, "\n".join(p.read_text() for p in logs)
            time.sleep(0.2)

        registered = json.loads(ptcctl("register", "--job", "deployed", "--model", MODEL,
                                       "--config", "tp=2", "--hosts", "host0", "--json"))
        job_env = dict(admin, PTC_JOB_TOKEN=registered["token"])
        run(bin_dir / "tools/synthetic_job", "save", "--coordinator", coordinator, "--job",
            "deployed", "--host", "host0", "--socket", tmp_path / "host0.sock", "--step", "1",
            env=job_env)
        report = json.loads(ptcctl("reconfigure", "--job", "deployed", "--to", "tp=1,dp=2",
                                   "--hosts", "host1,host2", "--json"))
        assert report["phase"] == "committed", report
        assert report["bytes_from_peers"] > 0
        run(bin_dir / "tools/synthetic_job", "verify", "--coordinator", coordinator, "--job",
            "deployed", env=job_env)

        # Metrics, over HTTP from every daemon.
        page = urllib.request.urlopen(f"http://{net}.10:9471/metrics", timeout=10).read()
        page = page.decode()
        assert 'ptc_coordinator_reconfigurations_total{outcome="committed"} 1' in page
        assert 'ptc_coordinator_hosts{state="alive"} 3' in page
        exported = set(re.findall(r"^# TYPE (\w+) ", page, re.M))
        ucx_bytes = 0
        for i in range(3):
            page = urllib.request.urlopen(f"http://{net}.{11 + i}:9470/metrics",
                                          timeout=10).read().decode()
            exported |= set(re.findall(r"^# TYPE (\w+) ", page, re.M))
            assert "# TYPE ptc_store_memory_used_bytes gauge" in page
            assert "ptc_store_memory_limit_bytes 1073741824" in page
            assert "ptc_transformer_ucx_fallbacks_total 0" in page
            ucx_bytes += int(re.search(r"^ptc_transformer_ucx_bytes_received_total (\d+)$",
                                       page, re.M).group(1))
        assert ucx_bytes > 0  # the bytes crossed the veths over UCX, not gRPC
        # The shipped Grafana dashboard plots only what the daemons export
        # (errors by code appear with a host's first error).
        dashboard = json.loads((ROOT / "deploy/grafana/ptc-dashboard.json").read_text())
        plotted = {m for p in dashboard["panels"] for t in p["targets"]
                   for m in re.findall(r"\bptc_\w+", t["expr"])}
        assert len(plotted) >= 15
        assert plotted - exported <= {"ptc_store_errors_by_code_total"}, plotted - exported
    finally:
        stop_processes(procs)


@pytest.mark.parametrize("binary,example", [("ptcd/ptcd", "ptcd.conf.example"),
                                            ("coordinator/ptc-coordinator",
                                             "coordinator.conf.example")])
def test_the_example_configuration_names_every_option(bin_dir, binary, example):
    """Every option the daemon's --help lists has a line in its shipped
    example (set, or commented out with its default), so that an operator
    finds it there."""
    usage = run(bin_dir / binary, "--help")
    options = set(re.findall(r"^\s+--([a-z][a-z-]+)", usage, flags=re.M))
    options -= {"config", "help", "tls-ca", "tls-cert", "tls-key"}
    assert {"insecure", "port-file"} <= options, usage
    text = (ROOT / "deploy" / example).read_text()
    missing = [o for o in sorted(options)
               if not re.search(rf"^(# )?{o.replace('-', '_')} =", text, flags=re.M)]
    assert not missing, f"deploy/{example} lacks {missing}"


@pytest.mark.parametrize("domain", ["a//b", "rack 3", "/rack3", "x" * 64,
                                    "/".join(["r"] * 9)])
def test_ptcd_refuses_a_malformed_failure_domain_at_start(bin_dir, tmp_path, domain):
    r = subprocess.run([str(bin_dir / "ptcd/ptcd"), "--insecure", "--listen", "127.0.0.1:0",
                        "--socket", "none", "--coordinator", "127.0.0.1:1", "--name", "h",
                        "--gpus", "1", "--domain", domain],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--domain: failure domain" in r.stderr and "must be a path" in r.stderr, r.stderr
