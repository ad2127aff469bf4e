"""The coordinator's web view in a real browser: headless Chromium driven by
chromedriver (Debian's chromium and chromium-driver) over the WebDriver
protocol, against a local cluster. The page loads over HTTPS with the
viewer token, shows the hosts and a job, follows a change to its commit,
and shows a killed host as dead. With PTC_SCREENSHOT_DIR set, the
screenshots go there (docs/images holds the ones in docs/web-view.md)."""
import base64
import json
import os
import pathlib
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from cluster import LocalCluster

MODEL = "gpt:layers=2,hidden=64,heads=4,vocab=512,positions=64"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """A headless Chromium session through chromedriver's HTTP API."""

    def __init__(self, tmp_path):
        driver = shutil.which("chromedriver")
        if driver is None or shutil.which("chromium") is None:
            assert os.environ.get("CI") != "true", "CI installs chromium (tools/setup.sh)"
            pytest.skip("no chromium and chromedriver here (apt-get install chromium "
                        "chromium-driver)")
        self.port = free_port()
        self.proc = subprocess.Popen([driver, f"--port={self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                self.call("GET", "/status")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.time() < deadline, "chromedriver did not start"
                time.sleep(0.2)
        caps = {"browserName": "chrome", "acceptInsecureCerts": True,
                "goog:chromeOptions": {"binary": shutil.which("chromium"), "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1280,1000", f"--user-data-dir={tmp_path / 'chromium'}"]}}
        r = self.call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
        self.session = r["value"]["sessionId"]

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                     method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    def go(self, url):
        self.call("POST", f"/session/{self.session}/url", {"url": url})

    def js(self, script):
        return self.call("POST", f"/session/{self.session}/execute/sync",
                         {"script": script, "args": []})["value"]

    def text(self, selector="body"):
        return self.js(f"const e = document.querySelector({json.dumps(selector)});"
                       "return e ? e.innerText : '';")

    def wait(self, what, timeout=60):
        deadline = time.time() + timeout
        while True:
            got = what()
            if got:
                return got
            assert time.time() < deadline, f"the page never showed it: {self.text()[:3000]}"
            time.sleep(0.25)

    def screenshot(self, path):
        png = self.call("GET", f"/session/{self.session}/screenshot")["value"]
        path.write_bytes(base64.b64decode(png))

    def close(self):
        try:
            self.call("DELETE", f"/session/{self.session}")
        finally:
            self.proc.kill()
            self.proc.wait()


def test_the_web_view_follows_hosts_jobs_and_a_change_in_a_browser(bin_dir, tmp_path):
    token = "viewer-" + os.urandom(12).hex()
    (tmp_path / "web.token").write_text(token + "\n")
    web = free_port()
    cluster = LocalCluster(bin_dir, tmp_path, hosts=4, gpus=2, coordinator_flags=[
        "--web-listen", f"127.0.0.1:{web}", "--web-token-file", str(tmp_path / "web.token")])
    shots = pathlib.Path(os.environ.get("PTC_SCREENSHOT_DIR", tmp_path))
    browser = None
    try:
        url = f"https://127.0.0.1:{web}"
        # Without the token: nothing but how to sign in.
        import ssl
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"{url}/api/jobs", context=insecure, timeout=30)
        assert denied.value.code == 401
        # Nor does it write anything, whatever the caller holds.
        req = urllib.request.Request(f"{url}/api/jobs", data=b"{}", method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, context=insecure, timeout=30)
        assert refused.value.code == 405

        browser = Browser(tmp_path)
        browser.go(f"{url}/?token={token}")  # once: the cookie, then the page
        browser.wait(lambda: browser.js("return location.pathname === '/' && "
                                        "!location.search"))
        browser.wait(lambda: browser.text("#host-count") == "4 alive of 4")
        for i in range(4):
            assert browser.text(f'tr[data-host="host{i}"] .state') == "alive"

        r = cluster.ptcctl("register", "--job", "gpt", "--model", MODEL, "--config",
                           "tp=2,pp=2", "--hosts", "host0,host1")
        assert r.returncode == 0, r.stderr
        _, status = cluster.ptcctl_json("status", "gpt")
        placed = status["jobs"][0]["rank_hosts"]
        for host in sorted(set(placed)):
            cluster.save("gpt", host, 1)
        job = '[data-job="gpt"]'
        browser.wait(lambda: "committed version 1" in browser.text(job))
        # The stores' memory in use, from the hosts' heartbeats.
        browser.wait(lambda: not browser.text(f'tr[data-host="{placed[0]}"] .memory')
                     .startswith("0 B of "))
        assert "tp=2,pp=2" in browser.text(f"{job} .config")
        ranks = browser.js(f"return [...document.querySelectorAll('{job} .strip')[0].children]"
                           ".map(c => c.dataset.host)")
        assert ranks == placed
        # A tensor's regions, each held by its ranks on their hosts (the
        # first tensor, then another one chosen in the list).
        def regions():
            return browser.js(f"return [...document.querySelectorAll('{job} .layout g')]"
                              ".map(g => [g.dataset.ranks, g.dataset.hosts])")
        drawn = browser.wait(regions)
        for ranks, hosts in drawn:
            assert hosts.split(",") == [placed[int(r)] for r in ranks.split(",")]
        assert sorted(int(r) for ranks, _ in drawn for r in ranks.split(",")) == \
            sorted(set(int(r) for ranks, _ in drawn for r in ranks.split(",")))
        first = drawn
        browser.js(f"const s = document.querySelector('{job} .tensor-choice');"
                   "const o = [...s.options].find(o => /qkv.*weight/.test(o.text));"
                   "s.value = o ? o.value : String(s.options.length - 1);"
                   "s.dispatchEvent(new Event('change'));")
        browser.wait(lambda: regions() and regions() != first)
        browser.screenshot(shots / "web-view.png")

        # A change: the page follows it to its commit (the new config, a new
        # layout epoch, the last change committed).
        r = cluster.ptcctl("reconfigure", "--job", "gpt", "--to", "tp=1,pp=2,dp=2",
                           "--hosts", "host1,host2,host3")
        assert r.returncode == 0, r.stdout + r.stderr
        browser.wait(lambda: "tp=1,pp=2,dp=2" in browser.text(f"{job} .config"))
        browser.wait(lambda: browser.js(
            f"const c = document.querySelector('{job} .change');"
            "return c && c.dataset.phase === 'committed'"))
        assert "layout epoch 2" in browser.text(f"{job} .epoch")
        # The change's plan as a matrix of bytes between hosts, and each
        # target host's staging, all done.
        _, status = cluster.ptcctl_json("status", "gpt")
        event = status["jobs"][0]["reconfiguration"]
        cells = browser.wait(lambda: browser.js(
            f"return [...document.querySelectorAll('{job} td.flow')]"
            ".map(c => [c.dataset.from, c.dataset.to, Number(c.dataset.bytes)])"))
        across = sum(b for f, t, b in cells if f != t and f != "snapshot")
        assert across == event["plan"]["cross_host_bytes"] > 0
        progress = browser.js(f"return [...document.querySelectorAll('{job} .host-progress')]"
                              ".map(h => [h.dataset.host, h.classList.contains('done')])")
        assert sorted(h for h, _ in progress) == sorted(p["host"] for p in event["host_progress"])
        assert progress and all(done for _, done in progress)
        browser.screenshot(shots / "web-view-changed.png")
        assert "tp=2,pp=2 → tp=1,pp=2,dp=2, committed" in browser.text(f"{job} .change")

        # A job on one host (freed by the change) with a data loader's
        # position: each of its small objects has every copy there, and the
        # page says how many the coordinator keeps a copy of, once saved.
        cluster.register_with_loader(MODEL, "tp=2", ("host0",), job="solo")
        solo = '[data-job="solo"]'
        cluster.save("solo", "host0", 1)
        browser.wait(lambda: "committed version 1" in browser.text(solo))
        _, status = cluster.ptcctl_json("status", "solo")
        kept = status["jobs"][0]
        assert kept["kept_small_objects"] == kept["small_objects_to_keep"] > 0, kept
        browser.wait(lambda: (f"small objects with every copy on one host: "
                              f"{kept['small_objects_to_keep']}, of which the coordinator "
                              f"keeps a copy of {kept['kept_small_objects']}")
                     in browser.text(f"{solo} .kept"))

        # Another change: the first one goes to the job's earlier changes.
        r = cluster.ptcctl("reconfigure", "--job", "gpt", "--to", "tp=2,pp=2",
                           "--hosts", "host2,host3")
        assert r.returncode == 0, r.stdout + r.stderr
        browser.wait(lambda: "tp=1,pp=2,dp=2 → tp=2,pp=2,dp=1, committed" in
                     browser.text(f"{job} .change"))
        browser.js(f"document.querySelector('{job} details.history').open = true")
        assert "tp=2,pp=2 → tp=1,pp=2,dp=2, committed" in browser.text(f"{job} details.history")

        # A host dies: the page says so.
        cluster.kill("host3")
        browser.wait(lambda: browser.text('tr[data-host="host3"] .state') == "dead", timeout=90)
        assert browser.text("#host-count") == "3 alive of 4"
        # The job's ranks there are marked (it has no other copy: automatic
        # changes are off, and its survival line says what is lost).
        browser.wait(lambda: browser.js(
            f"return document.querySelectorAll('{job} .rank.dead').length > 0"))
        browser.js("document.querySelectorAll('details.history').forEach(d => d.open = true)")
        browser.screenshot(shots / "web-view-dead-host.png")
    finally:
        if browser:
            browser.close()
        cluster.stop()


def test_the_web_view_survives_hostile_and_slow_clients(bin_dir, tmp_path):
    import ssl
    token = "viewer-" + os.urandom(12).hex()
    (tmp_path / "web.token").write_text(token)
    web = free_port()
    cluster = LocalCluster(bin_dir, tmp_path, hosts=1, gpus=2, coordinator_flags=[
        "--web-listen", f"127.0.0.1:{web}", "--web-token-file", str(tmp_path / "web.token")])
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE

    def ask(path, headers=None):
        req = urllib.request.Request(f"https://127.0.0.1:{web}{path}",
                                     headers={"Authorization": f"Bearer {token}",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
    try:
        status, body = ask("/api/hosts")
        assert status == 200 and json.loads(body)["hosts"][0]["name"] == "host0"
        # A client that connects and says nothing holds the view at most 2 s.
        silent = socket.create_connection(("127.0.0.1", web))
        start = time.time()
        assert ask("/api/jobs")[0] == 200
        assert time.time() - start < 10
        silent.close()
        # Paths outside the page's files, a wrong token, an oversized head.
        assert ask("/../../etc/passwd")[0] == 404
        assert ask("/api/hosts", {"Authorization": "Bearer " + "x" * 32})[0] == 401
        with socket.create_connection(("127.0.0.1", web)) as raw:
            with ctx.wrap_socket(raw) as tls:
                tls.sendall(b"GET / HTTP/1.1\r\nX: " + b"a" * (64 << 10) + b"\r\n\r\n")
                try:
                    tls.recv(1024)
                except (ssl.SSLError, ConnectionError):
                    pass
        status, page = ask("/")
        assert status == 200 and b"app.js" in page
        assert cluster.procs["coordinator"].poll() is None
        # The token file's rules are checked at start.
        (tmp_path / "short.token").write_text("short")
        r = subprocess.run([str(bin_dir / "coordinator/ptc-coordinator"), "--state-dir",
                            str(tmp_path / "other"), "--listen", "127.0.0.1:0", "--insecure",
                            "--web-listen", "127.0.0.1:0", "--web-token-file",
                            str(tmp_path / "short.token")], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and "at least 16 characters" in r.stderr, r.stderr
    finally:
        cluster.stop()
