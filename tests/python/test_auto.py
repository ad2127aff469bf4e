"""Automatic changes with the real binaries: a job whose host dies, is
drained or joins its pool changes by itself to the advisor's config (or
its pinned one); without automatic changes nothing moves; the advisor
explains itself; the live job's RPCs refuse hostile requests clearly."""
import concurrent.futures
import time

import pytest

from cluster import LocalCluster

MODEL = "gpt:layers=4,hidden=64,heads=4,ffn=256,vocab=512,positions=64"


@pytest.fixture
def cluster(bin_dir, tmp_path):
    c = LocalCluster(bin_dir, tmp_path, hosts=3, gpus=2)
    yield c
    c.stop()


def register(c, *flags, config="tp=2,dp=2", hosts="host0,host1"):
    c.ptcctl("register", "--job", "j", "--model", MODEL, "--config", config, "--hosts", hosts,
             *flags, check=True)
    for h in hosts.split(","):
        c.save("j", h, 1)
    assert c.job("j")["committed_version"] == 1


def wait_for(what, ready, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"waited {timeout} s for {what}")


def rank_client(c, ptc, j, rank):
    """A client of job j's rank, on the host the placement gives it."""
    return ptc.Client(socket=str(c.dir / f"{j['rank_hosts'][rank]}.sock"),
                      coordinator=c.coordinator, job="j", rank=rank)


def committed_change(c):
    """The job once a change committed after the registration's epoch."""
    j = c.job("j")
    return j if j["layout_epoch"] > 1 and j["reconfiguration"]["phase"] == "committed" else None


def test_a_host_declared_dead_while_only_silent_rejoins_the_pool_once_back(cluster):
    """A stall or a cut link gets a live host declared dead: the job leaves
    it (and its pool). Back as the same process, it rejoins the pool, and
    the job grows onto it again by itself; it does not stay smaller for
    good."""
    register(cluster, "--auto", "on")
    cluster.stop_process("host1")
    j = wait_for("the automatic change", lambda: committed_change(cluster))
    assert j["hosts"] == ["host0"] and "host1" not in j["pool"], j
    cluster.resume_process("host1")
    j = wait_for("the job to grow back", lambda: (lambda x: x if x["layout_epoch"] > 2 and
                                                  x["reconfiguration"]["phase"] == "committed"
                                                  else None)(cluster.job("j")))
    assert "host1" in j["pool"], j
    assert j["ranks"] == 4 and sorted(j["hosts"]) == ["host0", "host1"], j
    assert "host host1 can take it (automatic)" in j["reconfiguration"]["reason"], j
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stdout + v.stderr


def test_a_host_that_flaps_is_held_back_and_ptcctl_hosts_says_so(cluster):
    """host2 is declared dead and comes back as the same process twice:
    the second time it is held back (jobs grow onto it only after 30 s;
    auto_changes_test covers the growth), and `ptcctl hosts` says so."""
    for _ in range(2):
        cluster.stop_process("host2")
        cluster.wait_dead("host2")
        cluster.resume_process("host2")
        wait_for("host2 back", lambda: cluster.hosts()["host2"]["alive"])
    held = cluster.hosts()["host2"]
    assert 0 < held["held_back_seconds"] <= 30, held
    r = cluster.ptcctl("hosts")
    assert any(line.split()[:1] == ["host2"] and "held" in line.split()
               for line in r.stdout.splitlines()), r.stdout
    assert cluster.hosts()["host0"]["held_back_seconds"] == 0


def test_a_dead_host_changes_the_job_by_itself_and_an_added_host_grows_it(cluster):
    register(cluster, "--auto", "on")
    cluster.kill("host1")
    j = wait_for("the automatic change", lambda: committed_change(cluster))
    assert j["hosts"] == ["host0"], j
    assert j["ranks"] == 2, j
    assert "host host1 died (automatic)" in j["reconfiguration"]["reason"]
    assert "host1" not in j["pool"]
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stdout + v.stderr
    # host1 back (empty), and added to the job: it grows to 4 GPUs again.
    cluster.restart_ptcd(1)
    cluster.wait_alive(3)
    r = cluster.ptcctl("hosts", "add", "host1", "--job", "j", check=True)
    assert "changing by themselves: j" in r.stdout
    j = wait_for("the job to grow", lambda: (lambda x: x if x["layout_epoch"] > 2 and
                                              x["reconfiguration"]["phase"] == "committed"
                                              else None)(cluster.job("j")))
    assert j["ranks"] == 4 and sorted(j["hosts"]) == ["host0", "host1"], j
    assert "host host1 can take it (automatic)" in j["reconfiguration"]["reason"]
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stdout + v.stderr


def test_without_automatic_changes_a_dead_or_drained_host_moves_nothing(cluster):
    register(cluster)
    r = cluster.ptcctl("hosts", "drain", "host0", check=True)
    assert "automatic changes off" in r.stdout and "j" in r.stdout
    cluster.kill("host1")
    cluster.wait_dead("host1")
    time.sleep(1.0)
    j = cluster.job("j")
    assert j["layout_epoch"] == 1 and j["reconfiguration"]["phase"] == "none", j
    hosts = cluster.hosts()
    assert hosts["host0"]["draining"] and not hosts["host2"]["draining"]
    cluster.ptcctl("hosts", "add", "host0", check=True)
    assert not cluster.hosts()["host0"]["draining"]


def test_a_pinned_config_is_taken_and_kept_when_a_host_is_drained(cluster):
    register(cluster, "--auto", "on")
    r = cluster.ptcctl("auto", "j", "on", "--pin", "tp=2,dp=1", check=True)
    assert "pinned to tp=2,dp=1" in r.stdout
    j = wait_for("the change to the pinned config", lambda: committed_change(cluster))
    assert j["config"] == "tp=2,pp=1,dp=1" and len(j["hosts"]) == 1, j
    assert "policy changed (automatic)" in j["reconfiguration"]["reason"]
    on, other = j["hosts"][0], ({"host0", "host1"} - set(j["hosts"])).pop()
    cluster.ptcctl("hosts", "drain", on, check=True)
    j = wait_for("the change off the drained host", lambda: (lambda x: x if x["layout_epoch"] > 2
                 and x["reconfiguration"]["phase"] == "committed" else None)(cluster.job("j")))
    assert j["config"] == "tp=2,pp=1,dp=1" and j["hosts"] == [other], j
    assert f"host {on} drained (automatic)" in j["reconfiguration"]["reason"]
    # One config to choose from (the pin): the advisor's plan of it is the
    # change's, not planned a second time.
    log = (cluster.dir / "coordinator.log").read_text()
    chose = [line for line in log.splitlines()
             if f"host {on} drained; the advisor chooses" in line]
    assert chose and "(its plan starts as the advisor made it)" in chose[-1], chose
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stdout + v.stderr
    # Another pinned config on as many GPUs: the job moves to it too.
    cluster.ptcctl("auto", "j", "on", "--pin", "tp=1,dp=2", check=True)
    j = wait_for("the change to the new pin", lambda: (lambda x: x if x["layout_epoch"] > 3
                 and x["reconfiguration"]["phase"] == "committed" else None)(cluster.job("j")))
    assert j["config"] == "tp=1,pp=1,dp=2", j
    v = cluster.job_tool("verify", "--job", "j")
    assert v.returncode == 0, v.stdout + v.stderr


def test_advise_explains_its_choice_and_refuses_what_cannot_be(cluster):
    register(cluster)
    code, out = cluster.ptcctl_json("advise", "--job", "j", "--gpus", "2")
    assert code == 0, out
    chosen = out["candidates"][out["chosen"]]
    assert chosen["gpus"] == 2 and chosen["fits"] and chosen["bytes_moved"] >= 0
    assert "fewest bytes" in out["explanation"]
    assert all(c["gpus"] == 2 for c in out["candidates"])
    text = cluster.ptcctl("advise", "--job", "j", check=True).stdout
    assert "chosen: " in text and "tp=2,pp=1,dp=2" in text
    r = cluster.ptcctl("advise", "--job", "j", "--gpus", "99")
    assert r.returncode == 1 and "99 GPUs asked" in r.stderr
    r = cluster.ptcctl("advise", "--job", "nojob")
    assert r.returncode == 1 and "job 'nojob' is unknown" in r.stderr
    r = cluster.ptcctl("auto", "j", "on", "--pin", "tp=3")
    assert r.returncode == 1 and "pinned config" in r.stderr
    r = cluster.ptcctl("auto", "j", "on", "--margin", "-1")
    assert r.returncode != 0 and "--margin" in r.stderr
    r = cluster.ptcctl("auto", "j", "on", "--margin", "11")
    assert r.returncode == 1 and "margin 11" in r.stderr
    r = cluster.ptcctl("hosts", "drain", "host9")
    assert r.returncode == 1 and "host 'host9' is not registered" in r.stderr
    # Nothing of that changed the job.
    j = cluster.job("j")
    assert j["layout_epoch"] == 1 and not j["auto"]["enabled"]


def test_rendezvous_and_exit_reports_refuse_hostile_requests(cluster, ptc_module):
    ptc = ptc_module
    register(cluster, "--auto", "on", "--live")
    j = cluster.job("j")
    epoch = j["layout_epoch"]
    rank0, rank1 = rank_client(cluster, ptc, j, 0), rank_client(cluster, ptc, j, 1)
    with pytest.raises(ptc.Error, match="has not offered its address yet"):
        rank1.rendezvous(epoch, timeout=0.2)
    with pytest.raises(ptc.Error, match="layout epoch 9 is not the job's"):
        rank0.rendezvous(9, port=5555)
    with pytest.raises(ptc.Error, match="port 0 must be 1 to 65535"):
        rank0.rendezvous(epoch, port=0)
    # Nobody gets the address before all of the epoch's ranks are there.
    with pytest.raises(ptc.Error, match=r"of the 4 ranks of layout epoch \d+ are here; "
                                        r"waiting for ranks (1, )?2, 3"):
        rank0.rendezvous(epoch, port=5555, timeout=0.3)
    ranks = [rank0, rank1] + [rank_client(cluster, ptc, j, r) for r in (2, 3)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        met = list(pool.map(lambda c: c.rendezvous(epoch, port=5555 if c.rank == 0 else 0,
                                                   timeout=30), ranks))
    assert met == ["127.0.0.1:5555"] * 4
    # Once met, a rank asking again gets it at once.
    assert rank1.rendezvous(epoch, timeout=0.3) == "127.0.0.1:5555"
    with pytest.raises(ptc.Error, match="runs no rank on GPU 7"):
        ptc.report_process_exit(cluster.coordinator, "j", "host0", 7, 1, epoch)
    with pytest.raises(ptc.Error, match="unknown"):
        ptc.report_process_exit(cluster.coordinator, "nojob", "host0", 0, 1, epoch)
    # A report from an older layout changes nothing.
    assert not ptc.report_process_exit(cluster.coordinator, "j", "host0", 0, -9, epoch - 1)
    # The job follows its Watch stream.
    rank0.follow()
    ev = wait_for("the first event", lambda: rank0.event if rank0.event["known"] else None)
    assert ev["layout_epoch"] == epoch and ev["committed_version"] == 1
    assert ev["received"] >= 1
    # A process waits for news asleep: with none, the wait ends at its
    # timeout with the event it had; told something, it wakes with it.
    same = rank0.wait_event(ev["received"], 0.2)
    assert same["received"] == ev["received"] and same["layout_epoch"] == epoch
    with pytest.raises(ptc.Error, match="the timeout must be from 0 to 3600 seconds"):
        rank0.wait_event(ev["received"], -1)
    # Asked now, within a bound of its own (ptc.elastic's look before a
    # periodic save), or the client's patience.
    assert rank0.fetch_event(timeout=5)["layout_epoch"] == epoch
    assert rank0.fetch_event()["committed_version"] == 1
    for hostile in (0, -1, float("nan"), 1e9):
        with pytest.raises(ptc.Error, match="more than 0 and at most 3600 seconds"):
            rank0.fetch_event(timeout=hostile)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        def told():
            seen = ev
            while not seen["pending_config"]:
                news = rank0.wait_event(seen["received"], 120)
                assert news["received"] > seen["received"], "woken without news"
                seen = news
            return seen
        waiting = pool.submit(told)
        r = cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=1,dp=4", "--hosts",
                           "host0,host1", "--after-save", check=True)
        assert "starts when its processes have saved their next step" in r.stdout
        assert waiting.result(timeout=120)["pending_config"] == "tp=1,pp=1,dp=4"
    assert wait_for("the pending change", lambda: rank0.event["pending_config"]) == \
        "tp=1,pp=1,dp=4"
    assert cluster.job("j")["pending_config"] == "tp=1,pp=1,dp=4"


def test_processes_waiting_at_their_meeting_leave_it_when_a_missing_one_died(
        cluster, ptc_module):
    """Three of four processes wait at the meeting of their layout; the
    fourth died before it came (its agent reports it): the change its
    death starts ends the epoch, and the three leave the meeting at once,
    told to meet under the next one, instead of waiting out their timeout
    (or, without a meeting, their process group's connect)."""
    ptc = ptc_module
    register(cluster, "--auto", "on", "--live")
    j = cluster.job("j")
    epoch = j["layout_epoch"]
    waiting = [rank_client(cluster, ptc, j, r) for r in range(3)]
    began = time.time()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        meetings = [pool.submit(c.rendezvous, epoch, port=5555 if c.rank == 0 else 0,
                                timeout=60) for c in waiting]
        time.sleep(1.0)
        assert not any(m.done() for m in meetings)
        host = j["rank_hosts"][3]
        gpu = next(r["gpu"] for r in ptc.ranks_on_host(cluster.coordinator, "j", host)["ranks"]
                   if r["rank"] == 3)
        assert ptc.report_process_exit(cluster.coordinator, "j", host, gpu, -9, epoch)
        for m in meetings:
            with pytest.raises(ptc.Error, match=f"layout epoch {epoch} is not the job's"):
                m.result(timeout=50)
    assert time.time() - began < 30
    assert cluster.job("j")["layout_epoch"] > epoch


def test_a_second_exit_of_a_layout_a_change_is_replacing_starts_no_second_change(
        cluster, ptc_module):
    """Two processes of one layout die one after the other (their agents
    report both): the first report starts a change from the committed
    version; the second, arriving while that change runs (or after it
    committed), starts no other: the agents start both GPUs' processes
    under the new layout."""
    ptc = ptc_module
    register(cluster, "--auto", "on", "--live")
    j = cluster.job("j")
    epoch = j["layout_epoch"]
    rank0 = rank_client(cluster, ptc, j, 0)
    assert ptc.report_process_exit(cluster.coordinator, "j", "host0", 0, -9, epoch)
    wait_for("the change to start", lambda: (lambda ev: ev["layout_epoch"] > epoch or ev[
        "phase"] in ("staging", "verifying", "committing"))(rank0.fetch_event()), timeout=30)
    ptc.report_process_exit(cluster.coordinator, "j", "host1", 1, -9, epoch)
    j = wait_for("the change", lambda: committed_change(cluster))
    assert j["layout_epoch"] == epoch + 1, j
    assert "its process on GPU 0 of host0 was killed by signal 9 (automatic)" in \
        j["reconfiguration"]["reason"], j
    time.sleep(1.5)  # the auto loop looks at least every 200 ms
    j = cluster.job("j")
    assert j["layout_epoch"] == epoch + 1 and j["reconfiguration"]["phase"] == "committed", j


def test_a_hot_switch_is_pending_only_where_processes_run_and_refuses_stale_saves(
        cluster, ptc_module):
    ptc = ptc_module
    register(cluster)
    sock = lambda h: str(cluster.dir / f"{h}.sock")  # noqa: E731
    j = cluster.job("j")
    rank0 = ptc.Client(socket=sock(j["rank_hosts"][0]), coordinator=cluster.coordinator,
                       job="j", rank=0)
    r = cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=1,dp=4", "--hot")
    assert r.returncode != 0 and "give --after-save with it" in r.stderr
    # On the GPUs the job runs on: a hot switch, with a placement and a serial.
    cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=1,dp=4", "--hosts",
                   "host0,host1", "--after-save", "--hot", check=True)
    assert cluster.job("j")["pending_hot"]
    serial = rank0.fetch_event()["pending_serial"]
    plan = rank0.hot_plan(serial)
    assert plan["config"] == "tp=1,pp=1,dp=4" and sorted(plan["process_of"]) == [0, 1, 2, 3]
    assert plan["transfers"] and plan["bytes_between_processes"] > 0
    with pytest.raises(ptc.Error, match="no longer pending"):
        rank0.hot_plan(serial + 1)
    with pytest.raises(ptc.Error, match="no longer pending"):
        ptc.Client(socket=sock(j["rank_hosts"][0]), coordinator=cluster.coordinator,
                   job="j", rank=0, pending_serial=serial + 1)
    with pytest.raises(ptc.Error, match="outside"):
        ptc.Client(socket=sock(j["rank_hosts"][0]), coordinator=cluster.coordinator,
                   job="j", rank=9, pending_serial=serial)
    # A request before the switch began replaces it (another serial).
    cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=2,dp=2", "--hosts",
                   "host0,host1", "--after-save", "--hot", check=True)
    serial2 = rank0.fetch_event()["pending_serial"]
    assert serial2 != serial
    with pytest.raises(ptc.Error, match="no longer pending"):
        rank0.hot_plan(serial)
    # Once a process began the switch's save, it holds: no replacement.
    target = ptc.Client(socket=sock(j["rank_hosts"][0]), coordinator=cluster.coordinator,
                        job="j", rank=0, pending_serial=serial2)
    assert target.layout_epoch == j["layout_epoch"] + 1
    save = target.begin_save(5)
    assert save.version > j["committed_version"]
    with pytest.raises(ptc.Error, match="not both"):
        target.begin_save(5, change_serial=serial2)
    r = cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=1,dp=4", "--hosts",
                       "host0,host1", "--after-save", "--hot")
    assert r.returncode != 0 and "hot switch" in r.stderr
    # A periodic save (made by processes that had not heard of the switch
    # yet) commits, but the switch stays pending: no save of their own
    # turns it into a change through the store.
    for h in ("host0", "host1"):
        cluster.save("j", h, 4)
    periodic = cluster.job("j")
    assert periodic["committed_version"] > j["committed_version"], periodic
    assert periodic["pending_hot"], periodic
    time.sleep(0.5)  # the auto loop looks at least every 200 ms
    assert cluster.job("j")["pending_hot"]
    assert rank0.fetch_event()["pending_serial"] == serial2
    # The processes give the switch up (one of them could not start it):
    # they save step 5 in their layout, for the change. That save is a
    # version of its own, not the switch's of the same step; it commits,
    # and the change starts from it through the store, without waiting for
    # the save timeout.
    for h in ("host0", "host1"):
        cluster.save("j", h, 5, "--change-serial", str(serial2))
    committed = cluster.job("j")["committed_version"]
    assert committed not in (j["committed_version"], save.version,
                             periodic["committed_version"])
    done = wait_for("the change from that save", lambda: committed_change(cluster), timeout=30)
    assert done["config"] == "tp=2,pp=1,dp=2" and not done["pending_config"]
    assert done["reconfiguration"]["path"] == "store"
    del save, target


def test_a_hot_switch_onto_gpus_without_processes_goes_through_the_store(cluster):
    register(cluster)
    cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=2,dp=3", "--hosts",
                   "host0,host1,host2", "--after-save", "--hot", check=True)
    j = cluster.job("j")
    assert j["pending_config"] == "tp=2,pp=1,dp=3" and not j["pending_hot"]


def test_an_agent_is_told_of_changes_by_the_jobs_stream_and_asks_only_then(
        cluster, ptc_module, tmp_path):
    """A host's agent follows its job on the coordinator's Watch stream
    (ptc.Follower) and asks for its host's ranks only when the stream tells
    of a change, or after --refresh: an idle job costs the coordinator
    nothing per look (it was one call per host every 100 ms)."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    ptc = ptc_module
    register(cluster, "--auto", "on", "--live")
    j = cluster.job("j")
    follower = ptc.Follower(cluster.coordinator, "j")
    wait_for("the stream's first event", lambda: follower.event["known"])
    assert follower.event["layout_epoch"] == j["layout_epoch"]
    placed = follower.ranks_on_host("host0")
    assert sorted(r["rank"] for r in placed["ranks"]) == [
        r for r, h in enumerate(j["rank_hosts"]) if h == "host0"]
    with pytest.raises(ptc.Error, match="unknown"):
        ptc.Follower(cluster.coordinator, "nope").ranks_on_host("host0")

    status = tmp_path / "agent.json"
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(ptc.__file__).parents[1]))
    agent = subprocess.Popen(
        [sys.executable, "-m", "ptc.agent", "--job", "j", "--host", "host0", "--socket",
         str(cluster.dir / "host0.sock"), "--coordinator", cluster.coordinator,
         "--status", str(status), "--mode", "live", "--refresh", "600", "--", "sleep", "600"],
        env=env, stdout=open(tmp_path / "agent.log", "w"), stderr=subprocess.STDOUT)
    try:
        def agent_status():
            try:
                return json.loads(status.read_text())
            except (OSError, ValueError):
                return None
        s = wait_for("the agent's processes", lambda: (lambda x: x if x and len(
            x["running"]) == 2 else None)(agent_status()))
        # Once its Watch stream is up, the agent asks nothing while the
        # job runs: 20 looks at the placement, at most one ask (the first
        # asks, until the stream's first event came, may take longer on a
        # busy machine).
        time.sleep(2.0)
        before = agent_status()["coordinator_asks"]
        assert before >= 1, agent_status()
        time.sleep(2.0)
        idle = agent_status()["coordinator_asks"]
        assert idle - before <= 1, (before, agent_status())
        # A change: the stream tells the agent, which asks again at once
        # (long before --refresh).
        cluster.ptcctl("reconfigure", "--job", "j", "--to", "tp=1,dp=4", "--hosts",
                       "host0,host1", check=True)
        s = wait_for("the agent to see the new layout", lambda: (lambda x: x if x and x[
            "layout_epoch"] == j["layout_epoch"] + 1 else None)(agent_status()), timeout=120)
        assert s["coordinator_asks"] <= idle + 10, s
        wait_for("the follower to see the new layout",
                 lambda: follower.event["layout_epoch"] == j["layout_epoch"] + 1)
    finally:
        agent.terminate()
        agent.wait(60)


def test_processes_keep_their_streams_while_the_coordinator_stalls_for_seconds(
        bin_dir, tmp_path, ptc_module):
    """The coordinator stops for 6 s (SIGSTOP: as a machine overloaded for
    seconds): the channels to it wait up to 10 s for a ping's answer
    (common/channel.h), so no process's Watch stream breaks and is opened
    again, which would add every host's streams at once to a coordinator
    that is slow already. Its pings went unanswered after 2 s before, and
    every stream broke within 4 s."""
    c = LocalCluster(bin_dir, tmp_path, hosts=2, gpus=2, host_timeout=60)
    try:
        register(c, "--live")
        j = c.job("j")
        ranks = [rank_client(c, ptc_module, j, r) for r in (0, 3)]  # one on each host
        for r in ranks:
            r.follow()
        seen = [wait_for("the first event", lambda r=r: r.event if r.event["known"] else None)
                for r in ranks]
        c.stop_process("coordinator")
        time.sleep(6)
        c.resume_process("coordinator")
        # Nothing changed: the streams are the same, and tell nothing.
        for r, ev in zip(ranks, seen):
            assert r.wait_event(ev["received"], 3)["received"] == ev["received"], \
                "the stream was opened again"
        # And they still tell what changes.
        c.save("j", "host0", 2)
        c.save("j", "host1", 2)
        for r, ev in zip(ranks, seen):
            news = r.wait_event(ev["received"], 60)
            assert news["received"] > ev["received"]
            assert wait_for("version 2", lambda r=r: r.event["committed_version"] == 2)
    finally:
        c.stop()
