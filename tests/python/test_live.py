"""Live jobs end to end (examples/elastic/live.py): a GPT job whose
processes an agent per host starts, registered with automatic, live
changes, goes through a host's death (as the job saves, so that the save
cannot commit) and return, through changes asked in a row and a process
killed during one, and through hot switches (the processes move the
state between themselves) for a tp, a pp and a dp change with a process
killed after one commits and during another, and a hot switch a process
fails to start, and through a host that stalls as the job saves (declared
dead, the save deleted) with no change to follow, without any process of
the surviving host restarting, and through the coordinator stopped for
longer than the processes' patience (their saves skipped, the job
training on);
every reload is bit-identical, and the loss and the samples of every
iteration are those of an uninterrupted run."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_live(bin_dir, tmp_path, scenario, iterations=32):
    r = subprocess.run(["/usr/bin/python3", str(ROOT / "examples/elastic/live.py"),
                        "--scenario", scenario, "--iterations", str(iterations),
                        "--bin", str(bin_dir),
                        "--work-dir", str(tmp_path / "work"), "--json"],
                       capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if r.returncode != 0:
        # (a failed wait ends with the agents' and processes' timeline)
        sys.stderr.write(r.stdout[-5000:] + r.stderr[-12000:])
    assert r.returncode == 0
    return json.loads(r.stdout)


def test_a_host_dies_and_returns_and_the_job_follows_by_itself(bin_dir, tmp_path):
    out = run_live(bin_dir, tmp_path, "host")
    assert out["ok"], out
    died, added = out["events"]
    assert "host host1 died (automatic)" in died["reason"]
    assert "host host1 can take it (automatic)" in added["reason"]
    # 2 GPUs left, then 4 again.
    assert died["config"].count("=") == 3 and added["config"] != died["config"]
    assert out["host0_kept"] and out["bit_identical"] and out["loss_ok"]
    assert out["samples_exactly_once"]
    assert out["loads_checked"] >= 4  # host0's 2 after the death, 4 after the return


def test_a_save_lost_to_a_stalled_host_is_made_again_and_the_job_goes_on(bin_dir, tmp_path):
    # The job is pinned to both hosts' GPUs: no change can follow host1's
    # (false) death, so only saving again keeps the job alive.
    out = run_live(bin_dir, tmp_path, "stall")
    assert out["ok"], out
    stalled = out["events"][0]
    assert stalled["what"] == "host1 stalled"
    assert 0 < stalled["dropped_save"] < stalled["committed_after"]
    # Saved again in the same layout, by the same processes.
    assert stalled["layout_epoch_after"] == stalled["layout_epoch_before"]
    assert stalled["host1_kept"] and out["host0_kept"]
    # Every process learned it, from its error or its Watch stream, and
    # again when a rank gave a save up before host0's processes began it.
    assert stalled["saves_lost"] >= 4 and out["saves_lost"] >= 8
    given = out["events"][1]
    assert given["what"] == "a save given up"
    assert 0 < given["dropped_save"] < given["committed_after"]
    assert given["layout_epoch"] == stalled["layout_epoch_after"]
    assert out["bit_identical"] and out["loss_ok"] and out["samples_exactly_once"]


def test_a_coordinator_out_for_longer_than_the_patience_skips_saves_and_the_job_goes_on(
        bin_dir, tmp_path):
    # The coordinator stops (SIGSTOP) until every process skipped a save,
    # first once every process began one and before any reported it, then
    # between saves: before, a save that could not begin, or whose report
    # got no answer, broke the step, and with nothing changing the job
    # ended after its timeout. Then it stops again while a process is
    # killed, whose exit its agent reports once it is back (iterations to
    # spare for the processes to be alive then).
    out = run_live(bin_dir, tmp_path, "outage", iterations=64)
    assert out["ok"], out
    mid_save, between = out["events"][:2]
    assert mid_save["what"] == "the coordinator stopped mid-save"
    assert between["what"] == "the coordinator stopped"
    for stopped in (mid_save, between):
        assert stopped["saves_skipped"] >= 4, stopped  # every process, the same save
        assert stopped["iterations_while_stopped"] > 0, stopped  # the job trained on
        assert stopped["committed_after"] > stopped["committed_before"], stopped
        assert stopped["layout_epoch_after"] == stopped["layout_epoch_before"], stopped
        assert stopped["processes_kept"], stopped
    assert out["host0_kept"]
    killed = out["events"][2]
    assert killed["layout_epoch_after"] > killed["layout_epoch_before"]
    assert "killed by signal 9" in killed["reason"], killed
    assert killed["host0_kept"]
    assert out["bit_identical"] and out["loss_ok"] and out["samples_exactly_once"]


def test_changes_in_a_row_and_a_process_killed_during_one(bin_dir, tmp_path):
    out = run_live(bin_dir, tmp_path, "requests")
    assert out["ok"], out
    requests, killed = out["events"]
    accepted = [a["to"] for a in requests["answers"] if a["accepted"]]
    # The newest accepted request is where the job went.
    assert accepted and requests["config"] == accepted[-1]
    assert out["host0_kept"] and out["bit_identical"] and out["loss_ok"]
    assert out["samples_exactly_once"]


def test_hot_switches_for_tp_pp_and_dp_and_processes_killed_after_and_during_one(
        bin_dir, tmp_path):
    out = run_live(bin_dir, tmp_path, "hot")
    assert out["ok"], out
    tp, pp, dp, refused = out["events"]
    assert tp["config"] == "tp=1,pp=1,dp=4" and tp["path"] == "hot switch", tp
    # A process killed after the tp change committed, right after it met
    # its peers under the new layout: the others, waiting for it in their
    # groups' store, leave it as its death changes the job again (through
    # the store), instead of waiting for the collective timeout.
    assert "killed by signal 9" in tp["recovery"]["reason"], tp
    assert tp["recovery"]["path"] == "store", tp
    assert out["formations_left"] >= 1, out
    assert dp["config"] == "tp=1,pp=2,dp=1" and dp["path"] == "hot switch", dp
    # A process killed during the pp change: the job ends at its config
    # either way, through the store from the committed version if the hot
    # switch had not committed yet.
    assert pp["config"] == "tp=1,pp=2,dp=2" and pp["path"] in ("hot switch", "store")
    assert out["host0_kept"] and out["bit_identical"] and out["loss_ok"]
    assert out["samples_exactly_once"]
    # The processes of the tp change received their new state from each
    # other (the one killed later writes no record of its changes).
    hot = [h for h in out["hot_switches"] if h["from"] == "tp=2,pp=1,dp=2"]
    assert len(hot) >= 3 and sum(h["bytes_received"] for h in hot) > 0
    # A hot switch that rank 1 fails to start: both processes save and the
    # change goes through the store at once (the job's save timeout, 900 s,
    # is longer than the scenario waits for it).
    assert refused["config"] == "tp=2,pp=1,dp=1" and refused["path"] == "store"
    assert out["hot_refused"] == 2


def test_the_agent_backs_its_processes_large_allocations_with_huge_pages(ptc_module):
    from ptc.agent import with_huge_pages
    assert with_huge_pages({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})[
        "GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    # An operator's own choice stands.
    assert with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})[
        "GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"
    # A process started with it still runs (glibc accepts the tunable).
    env = with_huge_pages(dict(os.environ))
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ['GLIBC_TUNABLES'])"],
                         env=env, capture_output=True, text=True, check=True)
    assert "glibc.malloc.hugetlb=1" in out.stdout.strip().split(":")


@pytest.mark.parametrize("value", ["-5", "0", "1MiB", "huge"])
def test_a_live_process_refuses_a_hot_message_size_that_is_not_positive_bytes(
        ptc_module, monkeypatch, value):
    from ptc import elastic
    monkeypatch.setenv("PTC_HOT_DIRECT_BYTES", value)
    with pytest.raises(ValueError, match="PTC_HOT_DIRECT_BYTES"):
        elastic.Live(lambda live: {}, job="j", coordinator="127.0.0.1:1", socket="/nonexistent",
                     host="h", device=0)


@pytest.mark.parametrize("case", ["freed", "cycle", "held by the script"])
def test_leaving_a_layout_collects_garbage_only_when_what_it_built_outlives_it(
        ptc_module, case):
    # A full collection traverses every object of the process (0.1-0.2 s of
    # a live change's pause with four processes on two cores): it runs only
    # when what the layout built is still alive once its references are
    # dropped, and names what a cycle held.
    import gc
    import weakref
    from ptc import elastic
    logs = []
    live = elastic.Live(lambda live: {}, job="j", coordinator="127.0.0.1:1",
                        socket="/nonexistent", host="h", device=0, log=logs.append)

    class Model:
        pass
    model = Model()
    if case == "cycle":
        model.me = model  # as a hook that refers to its module would
    gone = weakref.ref(model)
    live.model, live.groups, live.steps = model, Model(), 7  # what build kept
    script_data = Model()
    if case == "held by the script":
        live.data = script_data
    del model
    collecting = gc.isenabled()
    gc.disable()  # no automatic collection in between
    try:
        before = gc.get_stats()[2]["collections"]
        live._leave_groups()
        collected = gc.get_stats()[2]["collections"] - before
    finally:
        if collecting:
            gc.enable()
    assert gone() is None
    assert not hasattr(live, "groups") and not hasattr(live, "data")
    assert collected == (0 if case == "freed" else 1)
    if case == "cycle":
        assert len(logs) == 1 and logs[0].startswith(
            "the old layout's Model were held in a reference cycle: collected in"), logs
    else:
        assert logs == []


FORM_AGAIN = r"""
import datetime, subprocess, sys
import torch
import torch.distributed as dist
from ptc import elastic

store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
# The first layout's peer never comes (it died as the group formed).
try:
    elastic._init_process_group("gloo", store=dist.PrefixStore("first", store), rank=0,
                                world_size=2, timeout=datetime.timedelta(seconds=2))
    sys.exit("formed a group of 2 alone")
except RuntimeError:
    pass
# The next layout: a fresh peer, which never failed.
peer = subprocess.Popen([sys.executable, "-c", f'''
import datetime, torch, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", {store.port}, 2, False)
dist.init_process_group("gloo", store=dist.PrefixStore("next", store), rank=1, world_size=2,
                        timeout=datetime.timedelta(seconds=120))
t = torch.tensor([2.0]); dist.all_reduce(t); assert t.item() == 3.0
'''])
# (The peer imports torch first: seconds on a busy machine.)
elastic._init_process_group("gloo", store=dist.PrefixStore("next", store), rank=0,
                            world_size=2, timeout=datetime.timedelta(seconds=120))
t = torch.tensor([1.0])
dist.all_reduce(t)
assert t.item() == 3.0, t
assert peer.wait(150) == 0
print("formed again")
"""


def test_a_process_whose_group_failed_to_form_forms_the_next_with_fresh_peers(ptc_module,
                                                                               bin_dir):
    # A survivor whose group init failed (a peer died after the meeting)
    # meets fresh processes in the next layout: without undoing PyTorch's
    # group counter it would name its group differently and both sides
    # would wait for each other's keys until the timeout.
    env = dict(os.environ, PYTHONPATH=str(bin_dir / "client" / "python" / "pkg"))
    r = subprocess.run([sys.executable, "-c", FORM_AGAIN], env=env, capture_output=True,
                       text=True, timeout=400)
    assert r.returncode == 0 and "formed again" in r.stdout, r.stdout + r.stderr


TALLY = r"""
import datetime, subprocess, sys, threading, time
import torch.distributed as dist
from ptc import elastic

wait = datetime.timedelta(seconds=60)
server = subprocess.Popen([sys.executable, "-c", (
    "import datetime, sys, time, torch.distributed as dist\n"
    "s = dist.TCPStore('127.0.0.1', 0, 4, True, timeout=datetime.timedelta(seconds=60),"
    " wait_for_workers=False)\n"
    "print(s.port, flush=True)\n"
    "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
port = int(server.stdout.readline())
stores = [dist.TCPStore("127.0.0.1", port, 4, False, timeout=wait) for _ in range(3)]

def tallying():
    return [t for t in threading.enumerate() if t.name == "ptc-save-tally"]

# Every process counts; one's report got no answer: each learns it.
tallies = [elastic._Tally(s, "reported-5", 3, unreachable=(i == 1))
           for i, s in enumerate(stores)]
for t in tallies:
    assert t.done.wait(30) and t.error is None and t.unreachable == 1, vars(t)
# All answered.
tallies = [elastic._Tally(s, "reported-6", 3, unreachable=False) for s in stores]
for t in tallies:
    assert t.done.wait(30) and t.error is None and t.unreachable == 0, vars(t)
# One never counts (it died): the others wait, until they stop looking.
waiting = [elastic._Tally(s, "reported-7", 3, unreachable=False) for s in stores[:2]]
assert not any(t.done.wait(1.0) for t in waiting)
for t in waiting:
    t.stop()
deadline = time.time() + 10
while tallying() and time.time() < deadline:
    time.sleep(0.05)
assert not tallying(), "a stopped tally's thread is still looking"
# The store's process dies (rank 0 with it): the tally ends with its error.
waiting = elastic._Tally(stores[0], "reported-8", 3, unreachable=False)
assert not waiting.done.wait(0.5)
server.kill()
assert waiting.done.wait(30) and waiting.error is not None, vars(waiting)
print("tallied", flush=True)
"""


def test_a_save_tally_counts_every_process_once_and_ends_with_its_store(ptc_module, bin_dir):
    # The processes of a periodic save agree on its reports through the
    # epoch's store (one counter), each from a thread of its own: a report
    # that got no answer is counted by all, a process that never counts
    # keeps the others waiting only until they stop looking, and a store
    # that dies ends the tally with an error rather than a hang.
    env = dict(os.environ, PYTHONPATH=str(bin_dir / "client" / "python" / "pkg"))
    r = subprocess.run([sys.executable, "-c", TALLY], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "tallied" in r.stdout, r.stdout + r.stderr


LEAVE_AT_EPOCH_END = r"""
import datetime, os, pathlib, sys, time
import torch
import torch.distributed as dist
from ptc import elastic

rank, port, ended = int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3])
store = dist.TCPStore("127.0.0.1", port, 3, rank == 0, wait_for_workers=False)
groups = elastic._EpochStore(dist.PrefixStore("epoch-2", store), ended.exists,
                             datetime.timedelta(seconds=120))
if rank == 2:
    os._exit(9)  # it met its peers, and dies before the groups form
print("forming", flush=True)
began = time.time()
try:
    elastic._init_process_group("gloo", store=groups, rank=rank, world_size=3,
                                timeout=datetime.timedelta(seconds=120))
    sys.exit("formed a group without rank 2")
except RuntimeError as e:
    # Rank 1 may instead find rank 0's store gone (rank 0 left first):
    # refused, or its connection broken or reset mid-call.
    assert any(m in str(e) for m in ("layout epoch ended", "Connection refused",
                                     "Broken pipe", "Connection reset")), e
    print(f"left after {time.time() - began:.1f} s")
"""


def test_processes_waiting_for_a_dead_peer_in_their_groups_store_leave_as_the_epoch_ends(
        ptc_module, bin_dir, tmp_path):
    # A process that dies after the meeting never writes its address: its
    # peers wait in the groups' store (here up to 120 s) until the epoch
    # ends (the job changes away from it), then at once.
    env = dict(os.environ, PYTHONPATH=str(bin_dir / "client" / "python" / "pkg"))
    ended = tmp_path / "ended"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", LEAVE_AT_EPOCH_END, str(r), str(port),
                               str(ended)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(3)]
    try:
        assert procs[2].wait(60) == 9
        for p in procs[:2]:
            assert p.stdout.readline().strip() == "forming"
        time.sleep(2)
        assert procs[0].poll() is None and procs[1].poll() is None  # waiting
        ended.touch()
        for p in procs[:2]:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0 and "left after" in out, out + err
    finally:
        for p in procs:
            p.kill()
