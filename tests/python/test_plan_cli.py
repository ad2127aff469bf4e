"""`ptcctl plan` end to end: output for people and machines, the whole plan
checked by a separate program, and clear errors."""
import json
import pathlib
import subprocess
import sys

from conftest import ROOT

CHECKER = [sys.executable, str(ROOT / "tools" / "check_plan.py")]
SMALL = "gpt:layers=4,hidden=32,heads=4,ffn=48,vocab=100,positions=8,pad=8"


def test_json_summary_meets_both_bounds(ptcctl):
    r = ptcctl("plan", "--model", "gpt3-2.7b", "--from", "tp=4,pp=2,dp=1",
               "--to", "tp=2,pp=2,dp=4", "--hosts", "4x4", "--to-hosts", "8x4",
               "--baseline", "tenplex", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    s = out["summary"]
    for key in ("cross_host_bytes", "cross_host_bytes_lower_bound", "max_host_send_bytes",
                "max_host_send_bytes_lower_bound", "plan_seconds"):
        assert isinstance(s[key], (int, float)), key
    assert s["cross_host_bytes"] == s["cross_host_bytes_lower_bound"]
    assert s["max_host_send_bytes"] <= 1.05 * s["max_host_send_bytes_lower_bound"]
    assert out["baseline"]["summary"]["cross_host_bytes"] > s["cross_host_bytes"]


def test_text_output_reads_well(ptcctl):
    r = ptcctl("plan", "--model", "gpt3-350m", "--from", "tp=2", "--to", "tp=1,dp=2",
               "--hosts", "1x2", "--to-hosts", "2x2")
    assert r.returncode == 0, r.stderr
    for phrase in ("sent across hosts", "largest send of a host", "plan time", "validated"):
        assert phrase in r.stdout


def test_whole_plan_passes_the_independent_checker(ptcctl, tmp_path):
    # Hosts 0-3 hold (pp0,dp0), (pp0,dp1), (pp1,dp0), (pp1,dp1); with ZeRO-1
    # each host's optimizer state is unique, without it host1 may die.
    for source, extra in (("tp=2,pp=2,dp=2,zero=1", []),
                          ("tp=2,pp=2,dp=2", ["--dead-hosts", "1"])):
        path = tmp_path / "plan.json"
        r = ptcctl("plan", "--model", SMALL, "--from", source,
                   "--to", "tp=4,pp=1,dp=2", "--hosts", "4x2", "--to-hosts", "5x2",
                   "--out", str(path), *extra)
        assert r.returncode == 0, r.stderr
        c = subprocess.run(CHECKER + [str(path)], capture_output=True, text=True)
        assert c.returncode == 0, c.stdout + c.stderr
        assert "plan OK" in c.stdout


def test_baseline_plan_is_correct_but_sends_more(ptcctl, tmp_path):
    ours, theirs = tmp_path / "ptc.json", tmp_path / "tenplex.json"
    r = ptcctl("plan", "--model", SMALL, "--from", "tp=2,pp=2,dp=2", "--to", "tp=4,pp=1,dp=2",
               "--hosts", "4x2", "--to-hosts", "5x2", "--baseline", "tenplex",
               "--out", str(ours), "--baseline-out", str(theirs))
    assert r.returncode == 0, r.stderr
    for path in (ours, theirs):
        c = subprocess.run(CHECKER + [str(path)], capture_output=True, text=True)
        assert c.returncode == 0, c.stdout + c.stderr
    base = json.loads(theirs.read_text())
    assert base["per_rank"] and base["strategy"] == "tenplex"
    assert (base["summary"]["cross_host_bytes"] >
            json.loads(ours.read_text())["summary"]["cross_host_bytes"])


def test_checker_rejects_a_corrupted_plan(ptcctl, tmp_path):
    path = tmp_path / "plan.json"
    r = ptcctl("plan", "--model", SMALL, "--from", "tp=2,dp=2", "--to", "tp=1,dp=8",
               "--hosts", "2x2", "--to-hosts", "4x2", "--out", str(path))
    assert r.returncode == 0, r.stderr
    plan = json.loads(path.read_text())
    remote = [x for x in plan["transfers"] if x["source_host"] != x["target_host"]]
    assert remote
    plan["transfers"].remove(remote[0])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(plan))
    c = subprocess.run(CHECKER + [str(bad)], capture_output=True, text=True)
    assert c.returncode == 1
    assert "INVALID" in c.stdout


def test_errors_name_the_problem(ptcctl):
    r = ptcctl("plan", "--model", "gpt3-9b", "--from", "tp=1", "--to", "tp=2", "--hosts", "1x2")
    assert r.returncode == 1 and "unknown model 'gpt3-9b'" in r.stderr
    r = ptcctl("plan", "--model", "gpt3-2.7b", "--from", "tp=3", "--to", "tp=2", "--hosts", "1x8")
    assert r.returncode == 1 and "tp=3 does not divide the 32 attention heads" in r.stderr
    r = ptcctl("plan", "--model", "gpt3-2.7b", "--from", "tp=8", "--to", "tp=8,dp=2",
               "--hosts", "1x8")
    assert r.returncode == 1 and "needs 16 GPUs" in r.stderr
    r = ptcctl("plan", "--model", "gpt3-2.7b", "--to", "tp=2", "--hosts", "1x8")
    assert r.returncode == 2 and "missing required option --from" in r.stderr
    r = ptcctl("plan", "--model", "gpt3-2.7b", "--from", "tp=2", "--to", "tp=2",
               "--hosts", "1x8", "--colour", "red")
    assert r.returncode == 2 and "unknown option --colour" in r.stderr


def test_lost_state_is_reported_as_json_for_machines(ptcctl):
    # pp=2 without replicas on two hosts; host1 (stage 1) dies.
    r = ptcctl("plan", "--model", SMALL, "--from", "pp=2", "--to", "pp=1",
               "--hosts", "2x1", "--dead-hosts", "host1", "--json")
    assert r.returncode == 1
    err = json.loads(r.stdout)["error"]
    assert err["code"] == "FAILED_PRECONDITION"
    assert "no surviving copy" in err["message"] and "host1" in err["message"]


def test_the_placement_says_which_host_losses_it_survives(ptcctl):
    # tp=1,pp=2,dp=2 held in rank order on two hosts (each host both
    # replicas of one stage): ptc's placement moves half of it so that
    # each host holds a whole replica; --prefer-movement keeps it in place
    # and says that either host's loss loses a stage.
    args = ["plan", "--model", SMALL, "--from", "tp=1,pp=2,dp=2", "--to", "tp=1,pp=2,dp=2",
            "--hosts", "2x2", "--json"]
    r = ptcctl(*args)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["placement"]["survives_host_loss"] is True
    assert out["placement"]["survival"] == "survives the loss of any one host"
    assert out["summary"]["cross_host_bytes"] > 0
    r = ptcctl(*args, "--prefer-movement")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["placement"]["survives_host_loss"] is False
    assert out["placement"]["survival"].startswith("does not survive the loss of host host0")
    assert out["summary"]["cross_host_bytes"] == 0
    text = ptcctl(*args[:-1]).stdout
    assert "survives the loss of any one host" in text, text


def test_the_plan_as_a_picture_says_what_the_plan_says(ptcctl, tmp_path):
    """--svg and --html draw the bytes between hosts and the placements;
    the numbers in the picture are the plan's, and a real browser (headless
    Chromium) renders the page."""
    import os
    import shutil
    import xml.etree.ElementTree as ET
    svg, html, whole = tmp_path / "plan.svg", tmp_path / "plan.html", tmp_path / "plan.json"
    r = ptcctl("plan", "--model", SMALL, "--from", "tp=1,pp=4,dp=2", "--to", "tp=2,pp=2,dp=2",
               "--hosts", "2x4", "--to-hosts", "4x4", "--dead-hosts", "3", "--svg", str(svg),
               "--html", str(html), "--out", str(whole), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]
    plan = json.loads(whole.read_text())
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.parse(svg).getroot()
    cells = root.findall(".//s:rect[@class='flow']", ns)
    assert len(cells) == 4 * 4  # four hosts, no snapshot row
    across = sum(float(c.get("data-bytes")) for c in cells
                 if c.get("data-from") != c.get("data-to"))
    within = sum(float(c.get("data-bytes")) for c in cells
                 if c.get("data-from") == c.get("data-to"))
    assert across == summary["cross_host_bytes"] > 0
    assert within == summary["kept_in_place_bytes"] + summary["copied_within_host_bytes"]
    for side in ("source", "target"):
        ranks = {int(c.get("data-rank")): int(c.get("data-host"))
                 for c in root.findall(f".//s:rect[@class='rank {side}']", ns)}
        assert ranks == {p["rank"]: p["host"] for p in plan[side]["ranks"]}
    text = " ".join(t.text or "" for t in root.iter(f"{{{ns['s']}}}text"))
    assert "host3 (dead)" in text and "least possible" in text
    page = html.read_text()
    assert "<svg" in page and "<table id=\"hosts\">" in page and "<script" not in page

    chromium = shutil.which("chromium")
    if chromium is None:
        assert os.environ.get("CI") != "true", "CI installs chromium (tools/setup.sh)"
        return
    shots = pathlib.Path(os.environ.get("PTC_SCREENSHOT_DIR", tmp_path))
    shot = shots / "plan-picture.png"
    browser = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'chromium'}"]
    dom = subprocess.run([*browser, "--dump-dom", html.as_uri()], capture_output=True,
                         text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "host3 (dead)" in dom.stdout and "keeps in place" in dom.stdout
    r = subprocess.run([*browser, "--window-size=1000,620", f"--screenshot={shot}", html.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.stat().st_size > 10000, r.stderr[-2000:]
