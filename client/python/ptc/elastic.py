"""Live training: a job's processes follow its changes without restarting.

A process is started once per GPU by the host's agent (python3 -m
ptc.agent), with the job, the host and the GPU in its environment. It
takes the rank the job's placement gives its GPU, meets the job's other
processes, builds its model for that rank and loads the job's committed
state. At every step boundary it looks at the job as the coordinator's
Watch stream last showed it (rank 0's view, broadcast, so that every rank
decides the same):

  - a change is pending (a scheduler asked, a host joined or is drained):
    every rank saves its state, the change starts from that save, and the
    processes wait for its commit;
  - a change is in flight without a save (a host died: its processes are
    gone), or a step failed because a peer died: the processes wait for
    the change, which starts from the last committed version, and roll
    back to it;
  - after the commit each process takes the rank the new placement gives
    its GPU (or exits cleanly if there is none), the processes form their
    process groups for the new world, rebuild their model and optimizer
    for the new layout and load; new processes the agents started join.

    import ptc.torch as pt

    def build(live):                      # at the start and after every change
        model = MyModel(live.config, live.rank)   # process groups are ready
        opt = torch.optim.AdamW(model.parameters())
        return {"model": model, "optimizer": opt, "extra": {"cursor": cursor}}

    for live in pt.elastic(build, save_every=50):
        with live.step():                 # a peer that dies ends the step
            loss = train_one_step(live.model, live.optimizer, live.extra["cursor"])

`live.restoring` is true while build runs for a process that loads the
job's committed state next: build may then skip initializing parameters
(torch.empty instead of a random init), since the load overwrites every
parameter and optimizer state tensor the job's layout holds.

`live.iteration` counts the steps done (it goes back to the committed
step after a rollback); `live.changes` lists every change the process
went through, with its timings.
"""

import atexit
import datetime
import gc
import os
import signal
import threading
import time
import traceback
import weakref

import torch
import torch.distributed as dist

from . import _capi

# Phases of a change that has not ended (ReconfigurePhase names).
_RUNNING = ("staging", "verifying", "committing")
_GO, _SAVE_FOR_CHANGE, _FOLLOW, _PERIODIC_SAVE, _HOT = 0, 1, 2, 3, 4


class _Broken(Exception):
    """A collective failed or a save could not finish: a peer is gone.
    Its one argument is the error."""


def _without_frames(error):
    """`error`, and the errors it chains, without their tracebacks. The
    frames of a failed step or hot switch hold its process groups (and
    their pending sends and receives), whose connections must close when
    this process leaves them: its peers then fail at once instead of
    waiting for the collective timeout (a peer's receive from a process
    that kept them open waited the whole 60 s). The stack is kept as
    text (`_stack_of`), for the log where the error is raised again."""
    try:
        error.ptc_stack = "".join(traceback.format_exception(
            type(error), error, error.__traceback__))
    except AttributeError:
        pass  # an error that takes no attribute: its message tells enough
    todo, seen = [error], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.with_traceback(None)
        todo += [e.__cause__, e.__context__]
    return error


def _stack_of(error):
    """The stack `error` was raised with, as _without_frames kept it."""
    return getattr(error, "ptc_stack", "") or f"{type(error).__name__}: {error}\n"


class _SaveSkipped(Exception):
    """A periodic save not begun on every rank: one could not reach the
    coordinator. No rank wrote it; every rank trains on and saves at the
    next period."""


class _SaveLost(Exception):
    """A save that will never commit: the coordinator deleted it (a host
    of its placement was dead, or could not prove its share, as it
    committed; or a rank gave it up). Every process learns it (from its
    save's error or its Watch stream), and they may all be well: a host
    declared dead only because it was silent comes back, and no change
    follows. They meet at the step boundary again and save again, unless
    a change comes first."""


def _init_process_group(backend, **kwargs):
    """dist.init_process_group, after which a failure (a peer that died
    while the group formed) leaves this process able to form another.
    PyTorch names a default group after a process-wide counter that it
    increments before forming the group and resets only when a formed group
    is destroyed: after a failed init, this process would name its next
    group differently from its peers that never failed, and each side would
    wait for keys the other never writes until the timeout ("Socket
    Timeout"), in every layout it joins from then on."""
    try:
        dist.init_process_group(backend, **kwargs)
    except BaseException:
        c10d = dist.distributed_c10d
        world = getattr(c10d, "_world", None)  # PyTorch 2
        if world is not None and hasattr(world, "group_count"):
            world.group_count = 0
        elif hasattr(c10d, "_group_count"):  # PyTorch 1.13
            c10d._group_count = 0
        raise


class _EpochStore(dist.Store):
    """The store a layout epoch's process groups form through: every wait
    in it ends as soon as the epoch does (`ended()`: a peer died and the
    job is changing away from the epoch), instead of after the group's
    timeout. A peer that dies after the processes met leaves the others
    waiting in the store for its keys (its address, the group's barrier):
    those waits fail at once with the epoch's end, and the processes
    follow the change.

    It never waits in the store it wraps with a short timeout: PyTorch's
    TCPStore client keeps a timed-out wait's answer pending on its
    connection (and the shorter timeout), so the next call on it fails.
    It asks whether the keys are there (a call that returns at once),
    every 5 ms at first and every 100 ms after a while, so that a
    thousand ranks waiting for a slow peer do not flood rank 0's store."""

    _ABSENT = b"\x00ptc: no such key\x00"
    _POLL_FIRST, _POLL_MOST = 0.005, 0.1

    def __init__(self, inner, ended, timeout):
        super().__init__()
        self._inner, self._ended = inner, ended
        self._timeout = timeout  # a datetime.timedelta

    def _check_epoch(self):
        if self._ended():
            raise RuntimeError("the layout epoch ended while its processes formed their "
                               "groups (a peer is gone); following the change")

    def _present(self, key):
        check = getattr(self._inner, "check", None)  # PyTorch 2
        if check is not None:
            return check([key])
        # PyTorch 1.13: a compare-and-set that changes nothing; a key that
        # is absent answers with the value expected.
        return self._inner.compare_set(key, self._ABSENT, self._ABSENT) != self._ABSENT

    def wait(self, keys, timeout=None):
        # PyTorch passes no timeout, or a negative one for "none".
        limit = self._timeout
        if timeout is not None and timeout.total_seconds() > 0:
            limit = min(limit, timeout)
        deadline = time.monotonic() + limit.total_seconds()
        pause = self._POLL_FIRST
        for key in keys:
            while not self._present(key):
                self._check_epoch()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"waited {limit.total_seconds():.0f} s for the "
                                       f"process group's key {key!r} (a peer never wrote it)")
                time.sleep(pause)
                pause = min(pause * 1.5, self._POLL_MOST)

    def get(self, key):
        self.wait([key])
        return self._inner.get(key)

    def set(self, key, value):
        self._inner.set(key, value)

    def add(self, key, value):
        # PyTorch's barrier after forming a group polls a counter with add.
        self._check_epoch()
        return self._inner.add(key, value)

    def check(self, keys):
        return all(self._present(k) for k in keys)

    def compare_set(self, key, expected, desired):
        return self._inner.compare_set(key, expected, desired)

    def delete_key(self, key):
        return self._inner.delete_key(key)

    def num_keys(self):
        self._check_epoch()
        return self._inner.num_keys()

    def set_timeout(self, timeout):
        self._timeout = timeout


class _Tally:
    """Every process's outcome of one periodic save, counted in the layout
    epoch's store (rank 0's TCPStore): each adds 1 to one counter, plus
    _UNREACHABLE where its report got no answer, and reads the counter
    until every process added. One add per process and its looks, not a
    key per process that every process reads.

    A thread of its own does the store's calls: a call to a rank 0 whose
    host vanished blocks until the store's timeout, while the process,
    following its Watch stream, leaves as soon as the job changes away
    from the epoch (stop() ends the looks; a blocked call ends with the
    store)."""

    _UNREACHABLE = 1 << 32
    _POLL_FIRST, _POLL_MOST = 0.005, 0.1

    def __init__(self, store, key, world, unreachable):
        self.done = threading.Event()
        self.unreachable = 0  # how many processes' reports got no answer
        self.error = None  # the store's, where a call failed
        self._stopped = threading.Event()
        threading.Thread(target=self._count, args=(store, key, world, unreachable),
                         name="ptc-save-tally", daemon=True).start()

    def _count(self, store, key, world, unreachable):
        try:
            total = store.add(key, 1 + (self._UNREACHABLE if unreachable else 0))
            pause = self._POLL_FIRST
            while total % self._UNREACHABLE < world:
                if self._stopped.wait(pause):
                    return
                pause = min(pause * 1.5, self._POLL_MOST)
                total = store.add(key, 0)
            self.unreachable = total // self._UNREACHABLE
        except Exception as e:  # RuntimeError: the store is gone
            self.error = e
        self.done.set()

    def stop(self):
        self._stopped.set()


def _close_at_exit(ref):
    live = ref()
    if live is not None:
        live.close()


def _refused_in_test(config, rank):
    """Fault injection for the process tests: with PTC_TEST_HOT_REFUSE set
    to CONFIG:RANK, that rank fails to start a hot switch to CONFIG (as a
    process whose connection to the target's store fails would)."""
    armed = os.environ.get("PTC_TEST_HOT_REFUSE")
    return bool(armed) and armed.rpartition(":") == (config, ":", str(rank))


# Saves this process gave up for PTC_TEST_GIVE_UP_SAVE (once each).
_GIVEN_UP_IN_TEST = set()


def _gives_up_save_in_test(iteration, rank):
    """Fault injection for the process tests: with PTC_TEST_GIVE_UP_SAVE
    set to ITERATION:RANK, that rank gives its save of that iteration up
    right after it began it (as a rank whose ptcd failed its part would),
    once."""
    armed = os.environ.get("PTC_TEST_GIVE_UP_SAVE")
    if not armed or armed != f"{iteration}:{rank}" or armed in _GIVEN_UP_IN_TEST:
        return False
    _GIVEN_UP_IN_TEST.add(armed)
    return True


def _tell_agent(epoch):
    """Tells the host's agent (ptc.agent) the layout epoch this process now
    runs under, so that if it dies, its exit is reported under that epoch
    even when the agent has not looked at the new placement yet."""
    path = os.environ.get("PTC_AGENT_EPOCH_FILE")
    if not path:
        return
    tmp = f"{path}.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(str(epoch))
        os.replace(tmp, path)
    except OSError:
        pass  # the agent then reports under its own last look


def _dies_after_meeting_in_test(config, device, change):
    """Fault injection for the process tests: with PTC_TEST_DIE_AFTER_MEETING
    set to CONFIG:DEVICE, the process on that device that follows a hot
    switch to CONFIG is killed right after it met its peers there (before
    any process group forms). A process started anew does not die."""
    armed = os.environ.get("PTC_TEST_DIE_AFTER_MEETING")
    return (bool(armed) and change is not None and change.get("how") == "hot switch" and
            armed.rpartition(":") == (str(config), ":", str(device)))


def elastic(build, **options):
    """The live loop over a job's steps (see the module's docstring);
    options are Live's."""
    return Live(build, **options)


class Live:
    """One process of a live job.

    build(live) -> {"model", "optimizer", "scheduler", "extra"}: the
    modules for live.rank of live.config (the process groups exist);
    "extra" is what pt.save keeps besides them (a data cursor ...).
    Defaults come from the environment the agent gives: PTC_JOB,
    PTC_COORDINATOR, PTC_SOCKET, PTC_HOST, PTC_DEVICE.
    save_every: also save every N steps (what a rollback returns to);
    on_save(live) / on_load(live): called before each save writes anything
    (a periodic save has begun on every process by then) / after each
    load; backend: "nccl" with a GPU, else "gloo"; timeout: seconds any
    one wait may take (a change, a rendezvous, a save's commit);
    collective_timeout: seconds a collective may wait for a peer (one
    that a failed peer's partner still holds open gives up after it).

    Attributes build sets on live (process groups, helpers) last until
    the next change: they are dropped with the process groups, so that
    nothing keeps a failed layout's connections open."""

    def __init__(self, build, *, job=None, coordinator=None, socket=None, host=None,
                 device=None, save_every=0, backend=None, timeout=300.0,
                 collective_timeout=60.0, on_save=None, on_load=None, log=None):
        env = os.environ
        self.job = job or env["PTC_JOB"]
        self.coordinator = coordinator or env["PTC_COORDINATOR"]
        self.socket = socket or env["PTC_SOCKET"]
        self.host = host or env["PTC_HOST"]
        self.device = int(env.get("PTC_DEVICE", "0") if device is None else device)
        self.save_every = save_every
        self.timeout = timeout
        self.collective_timeout = collective_timeout
        # The hot switch's size from which a piece is a message of its own
        # (every process of a job must use the same).
        direct = env.get("PTC_HOT_DIRECT_BYTES", "")
        if direct and not (direct.isdigit() and int(direct) > 0):
            raise ValueError(f"PTC_HOT_DIRECT_BYTES={direct!r}: give a positive number of "
                             "bytes (the hot switch's size from which a piece is a message "
                             "of its own)")
        self._hot_direct_bytes = int(direct) if direct else None
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self._build, self._on_save, self._on_load = build, on_save, on_load
        self._log = log or self._print
        self.client = None
        self.rank = -1
        self.config = None
        self.layout_epoch = 0
        # The newest layout epoch this process gave up joining (a peer died
        # as they formed it): a change away from it is what it follows next.
        self._abandoned_epoch = 0
        self.iteration = 0
        self.model = self.optimizer = self.scheduler = None
        self.extra = {}
        self.changes = []
        self.restoring = False
        self._store = None
        self._started = False
        self._broken = None  # the error of a step that failed
        self._saved_at = -1
        # Saves lost in a row (_SaveLost) and when the first was.
        self._lost_saves, self._lost_since = 0, None
        # The newest deleted save (the job's dropped_save) this process has
        # acted on: a newer one is a loss it has yet to follow, even if it
        # began its save after the deletion (and got a version of its own).
        self._dropped_seen = 0
        self._change = None  # timings of the change being followed
        self._plan_epoch_seen = 0  # the newest change this process knows of
        self._own = set(self.__dict__) | {"_own"}

    def _print(self, msg):
        stamp = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
        print(f"[ptc {self.host}:{self.device} {stamp}] {msg}", flush=True)

    # ------------------------------------------------------------ the loop

    def __iter__(self):
        return self

    def __next__(self):
        if not self._started:
            self._started = True
            atexit.register(_close_at_exit, weakref.ref(self))
            if not self._start():
                raise StopIteration
        while True:
            try:
                if self._broken is not None:
                    self._recover()
                    continue
                decision, serial = self._boundary()
                if decision == _GO:
                    return self
                if decision == _HOT:
                    if self._hot_switch(serial):
                        continue  # the processes run the new layout
                    # Not started on every process: the change goes
                    # through the store, from the save they make now for
                    # it (the coordinator takes no other save for it).
                    decision = _SAVE_FOR_CHANGE
                if decision in (_PERIODIC_SAVE, _SAVE_FOR_CHANGE):
                    if decision == _SAVE_FOR_CHANGE:
                        self._note_change("pending")
                    try:
                        if decision == _SAVE_FOR_CHANGE:
                            self._save(serial)
                        else:
                            self._save(periodic=True)
                    except _SaveSkipped as e:
                        # The coordinator is out of reach (an outage longer
                        # than the client's patience): the job trains on
                        # from what it holds, and saves at the next period.
                        # What is committed stays as it was.
                        self._log(f"save skipped ({e}); training goes on")
                        self._saved_at = self.iteration
                        continue
                    except _SaveLost as e:
                        self._after_lost_save(e)
                        continue  # rank 0 decides again: the change, or the save
                    except _capi.Error as e:
                        if e.unreachable:
                            # Cut off from the coordinator (a report that
                            # got no answer within its patience) or a save
                            # not begun: the loop waits for a change, as
                            # after a failed step, and raises this if none
                            # comes within the timeout.
                            self._log(f"save failed ({e}); waiting for the change")
                            raise _Broken(e)
                        # Refused because a change started meanwhile (from
                        # the version committed before): follow it.
                        if not self._changing():
                            raise
                        self._log(f"save refused ({e}); following the change")
                        decision = _FOLLOW
                    if decision == _PERIODIC_SAVE:
                        continue
                if not self._follow():
                    raise StopIteration
            except _Broken as e:
                # The error itself (raised again if no change follows
                # within the timeout), without the frames that failed.
                self._broken = _without_frames(e.args[0])

    class _Step:
        def __init__(self, live):
            self.live = live

        def __enter__(self):
            return self.live

        def __exit__(self, kind, error, tb):
            if kind is None:
                self.live.iteration += 1
                return False
            if issubclass(kind, RuntimeError) and not issubclass(kind, _capi.Error):
                # A collective failed: a peer is likely gone. The loop waits
                # for the change that follows (and re-raises this if none
                # comes within the timeout).
                self.live._log(f"step {self.live.iteration + 1} failed: {str(error)[:200]}")
                self.live._broken = _without_frames(error)
                return True
            return False

    @property
    def world_size(self):
        return self.client.world_size

    def save(self):
        """Saves this process's state now (every rank must call it at the
        same step), and waits for the version's commit. A save that cannot
        commit (a host of the job declared dead as it committed) is made
        again, after a pause, by every rank; TimeoutError once saves have
        failed for the timeout."""
        while True:
            try:
                self._save()
                return
            except _SaveLost as e:
                self._after_lost_save(e)

    def step(self):
        """Wraps one training step: a step that fails because a peer died
        is dropped, and the loop recovers at the next boundary."""
        return Live._Step(self)

    # ---------------------------------------------------------- decisions

    def _boundary(self):
        """What every rank does now, as rank 0 sees the job."""
        code, serial = _GO, 0
        if self.rank == 0:
            ev = self._ev()
            if ev["layout_epoch"] > self.layout_epoch or (
                    ev["phase"] in _RUNNING and ev["plan_epoch"] > self._plan_epoch_seen):
                code = _FOLLOW
            elif ev["pending_config"] and ev["pending_hot"]:
                code, serial = _HOT, ev["pending_serial"]
            elif ev["pending_config"]:
                code, serial = _SAVE_FOR_CHANGE, ev["pending_serial"]
            elif (self.save_every and self.iteration > 0 and
                  self.iteration % self.save_every == 0 and self.iteration != self._saved_at):
                code = _PERIODIC_SAVE
                # The Watch stream may lag: a hot switch asked just now is
                # taken now, not after this save (the coordinator would
                # take the save as the change's, and change through the
                # store).
                try:
                    # Within seconds: the other processes wait for this
                    # look at the boundary's broadcast.
                    fresh = self.client.fetch_event(timeout=self._FRESH_PATIENCE)
                except _capi.Error as e:
                    # The coordinator out of reach: the save finds out too,
                    # and every rank learns of it there (a change asked
                    # meanwhile is taken at a later boundary).
                    self._log(f"the job's news could not be fetched ({e})")
                    fresh = self._ev()
                if (fresh["pending_config"] and fresh["pending_hot"] and
                        fresh["layout_epoch"] == self.layout_epoch and
                        fresh["phase"] not in _RUNNING):
                    code, serial = _HOT, fresh["pending_serial"]
        flag = torch.tensor([code, serial], dtype=torch.int64,
                            device=self._collective_device())
        try:
            dist.broadcast(flag, 0)
        except RuntimeError as e:
            raise _Broken(e)
        return int(flag[0]), int(flag[1])

    def _ev(self):
        """The job as this process knows it: what the coordinator's Watch
        stream last told it. Every process follows its own stream (the
        coordinator holds no thread per stream and sends a job's news to
        its streams once per change of phase), so a process that waits is
        told, and asks nothing while the job trains."""
        return self.client.event

    # The longest a waiting process sleeps without news: its Watch stream
    # wakes it when it tells something new; this bounds only a wait whose
    # stream went quiet (followed again after the coordinator restarted).
    _QUIET = 0.5
    # How long rank 0's look for a hot switch asked just now may take
    # before a periodic save (without an answer: the Watch's news).
    _FRESH_PATIENCE = 5.0

    def _until(self, ready, deadline):
        """The first event for which ready(event) holds, or None once the
        deadline passed. The process sleeps until its stream tells it
        something new: four processes looking every 2-5 ms took CPU from
        the daemons changing the store on the same cores."""
        ev = self._ev()
        while not ready(ev):
            left = deadline - time.time()
            if left < 0:
                return None
            ev = self.client.wait_event(ev["received"], min(left, self._QUIET))
        return ev

    def _soon(self, ready, patience=2.0):
        """Whether ready(event) holds within `patience` seconds (the Watch
        stream may lag the coordinator's answer a little)."""
        return self._until(ready, time.time() + patience) is not None

    def _changing(self):
        """Whether the job is changing (or a change waits for a save)."""
        return self._soon(lambda ev: ev["layout_epoch"] > self.layout_epoch or
                          ev["phase"] in _RUNNING or bool(ev["pending_config"]))

    @staticmethod
    def _away_from(ev, epoch):
        """Whether, in event `ev`, the job left layout `epoch` or is
        changing away from it."""
        return ev["layout_epoch"] > epoch or ev["phase"] in _RUNNING

    def _epoch_ended(self, epoch):
        """_away_from as this process last heard (no wait)."""
        return self._away_from(self._ev(), epoch)

    def _left_epoch(self, epoch):
        """_away_from within the Watch stream's lag."""
        return self._soon(lambda ev: self._away_from(ev, epoch))

    def _collective_device(self):
        return f"cuda:{torch.cuda.current_device()}" if self.backend == "nccl" else "cpu"

    def _note_change(self, how):
        """Starts the timings of a change, and remembers the job's event
        then: the change has ended once the event differs from it."""
        if self._change is None:
            ev = self._ev()
            self._change = {"noticed": time.time(), "how": how, "from": str(self.config),
                            "from_rank": self.rank, "iteration": self.iteration,
                            "marker": (ev["plan_epoch"], ev["phase"], ev["error"])}

    def close(self):
        """Leaves the process groups and stops following the job; runs at
        exit too (a process that ends with its process groups alive can
        abort in their teardown, and its agent would start it again)."""
        if dist.is_initialized() or self.model is not None:
            self._leave_groups()
        if self.client is not None:
            self.client.unfollow()
            self.client = None

    # ---------------------------------------------------------- the parts

    def _start(self):
        """Takes this GPU's rank, meets the others, builds and loads.
        False if the job runs nothing on this GPU."""
        rank = self._my_rank()
        if rank is None:
            self._log(f"job {self.job} runs no rank on GPU {self.device} of {self.host}")
            return False
        if torch.cuda.is_available() and self.backend == "nccl":
            torch.cuda.set_device(self.device)
        self.client = _capi.Client(socket=self.socket, coordinator=self.coordinator,
                                  job=self.job, rank=rank)
        self.rank = rank
        self.client.follow()
        self._wait(lambda ev: ev["known"], "the coordinator's Watch stream")
        ev = self._ev()
        self._plan_epoch_seen = ev["plan_epoch"]
        self._dropped_seen = ev["dropped_save"]
        if ev["phase"] in _RUNNING or ev["pending_config"]:
            # Started during a change: join the layout it ends in.
            if not self._rebind_after_change():
                return False
        while True:
            epoch = self.client.layout_epoch
            try:
                self._form_and_load()
                return True
            except RuntimeError as e:  # ptc.Error too
                # The layout this process was started for ended while it
                # met its peers (one of them died, a newer change started):
                # join the layout the job goes to instead of exiting.
                if not self._left_epoch(epoch):
                    raise
                self._log(f"layout epoch {epoch} ended before this process joined it: "
                          f"{str(e)[:200]}")
                self._leave_groups()
                if not self._rebind_after_change():
                    return False

    def _rebind_after_change(self):
        """Waits for the change in flight to end and takes this GPU's rank
        in the layout it ends in; False if that layout has none here."""
        self._wait(lambda ev: ev["phase"] not in _RUNNING and not ev["pending_config"],
                   "the change in flight")
        # The rank on this GPU and the layout it is a rank of, from one
        # answer of the coordinator.
        return self.client.rebind_device(self.device) is not None

    def _my_rank(self):
        # Over the client's connection once it has one (after a change):
        # a connection per call, from every process at every change, is
        # what a busy coordinator resets.
        placed = (self.client.ranks_on_host(self.host) if self.client is not None
                  else _capi.ranks_on_host(self.coordinator, self.job, self.host,
                                           socket=self.socket))
        for r in placed["ranks"]:
            if r["gpu"] == self.device:
                return r["rank"]
        return None

    def _wait(self, ready, what):
        """Until ready(event) holds, at most the client's timeout."""
        if self._until(ready, time.time() + self.timeout) is None:
            raise TimeoutError(f"waited {self.timeout:.0f} s for {what}")

    def _save(self, change_serial=0, periodic=False):
        """Saves this step (for the pending change `change_serial`, if any)
        and waits for its commit. A `periodic` save is begun on every rank
        first, and skipped on all of them (_SaveSkipped) where one could
        not reach the coordinator to begin it: they agree on that (one
        all-reduce) before on_save and before anything is written. They
        agree again once each wrote and reported its share, through the
        epoch's store: where a report got no answer (the coordinator lost
        after the save began), every rank gives the version up and skips
        it too."""
        from . import torch as pt
        began, refused, newest = self._begin_agreed() if periodic else (None, None, 0)
        version, error = 0, None
        try:
            if self._on_save:
                try:
                    self._on_save(self)
                except BaseException as e:
                    if began is not None:
                        began.abandon(f"rank {self.rank}: on_save failed: {e}")
                    raise
            if refused is not None:
                raise refused
            if _gives_up_save_in_test(self.iteration, self.rank):
                s = began if began is not None else self.client.begin_save(
                    int(self.iteration), change_serial, self._dropped_seen)
                s.give_up("PTC_TEST_GIVE_UP_SAVE (a test fault)")
                e = _capi.Error(f"ABORTED: rank {self.rank} gave version {s.version} up "
                                "(PTC_TEST_GIVE_UP_SAVE)", "ABORTED")
                e.version = s.version
                raise e
            saved = pt.save(self.client, self.model, self.optimizer, self.scheduler,
                            extra=self.extra, step=self.iteration, wait=False,
                            change_serial=change_serial, known_dropped=self._dropped_seen,
                            began=began)
            version = saved.version
        except _capi.Error as e:
            error = e
        if periodic and self._reported_agreed(began, newest, error):
            version, error = newest, None  # committed after all
        if error is not None:
            version = self._after_failed_save(error)
        self._wait_committed(version, self.layout_epoch)
        self._saved_at = self.iteration
        self._lost_saves, self._lost_since = 0, None
        self._dropped_seen = max(self._dropped_seen, self._ev()["dropped_save"])
        if self._change is not None and "saved" not in self._change:
            self._change["saved"] = time.time()

    def _after_failed_save(self, e):
        """After a save that raised `e`: raises _SaveLost where its
        version (or the one the others saved) was deleted, else `e`;
        returns the version if it committed after all."""
        if getattr(e, "code", "") == "ABORTED" and not getattr(e, "version", 0):
            # Refused: a save was deleted before this rank began it
            # (known_dropped), and the others make it again together.
            seen, epoch = self._dropped_seen, self.layout_epoch
            if self._until(lambda ev: ev["dropped_save"] > seen or
                           self._away_from(ev, epoch), time.time() + self.timeout):
                if self._ev()["dropped_save"] > seen:
                    raise _SaveLost(e)
            raise e
        # Deleted: this rank's report came after, or completed it and its
        # hosts could not prove it, or this rank gave it up. Or committed
        # after all (the report's answer was lost), or the job changed.
        # Every rank must conclude the same: this one waits until its Watch
        # stream says which, as the others, waiting for the commit, learn it.
        version = getattr(e, "version", 0)
        if not version:
            raise e
        epoch, seen = self.layout_epoch, self._dropped_seen
        ev = self._until(lambda ev: ev["committed_version"] >= version or
                         ev["dropped_save"] >= version or ev["dropped_save"] > seen or
                         self._away_from(ev, epoch), time.time() + self.timeout)
        if ev is not None and ev["committed_version"] >= version:
            return version
        if ev is not None and (ev["dropped_save"] >= version or ev["dropped_save"] > seen):
            raise _SaveLost(e)
        raise e

    # What a process tells the others of beginning a periodic save, and
    # then of reporting its share; the worst of every process's decides
    # what each does. One that could not
    # reach the coordinator is the worst: the save is skipped on every
    # process whatever refused the others (a change that started, a save
    # lost meanwhile: the next boundary follows it).
    _BEGAN, _REFUSED, _UNREACHABLE = 0, 1, 2

    def _begin_agreed(self):
        """Begins this step's periodic save, and agrees with every other
        process on going on (one all-reduce of the worst outcome and the
        newest version begun). Where a process could not reach the
        coordinator (no answer within the client's patience), every one
        gives up what it began and raises _SaveSkipped: nothing is written,
        and the job trains on. Otherwise returns the save this process
        began, or the error it was refused with (raised once on_save ran,
        on every process), and the newest version any process began."""
        s = error = None
        try:
            s = self.client.begin_save(int(self.iteration), 0, self._dropped_seen)
            mine = self._BEGAN
        except _capi.Error as e:
            error = e
            mine = self._UNREACHABLE if e.unreachable else self._REFUSED
        worst, newest = self._worst(mine, s.version if s is not None else 0)
        if worst == self._UNREACHABLE:
            self._skip(s, newest, f"not every rank could begin the save of step "
                                  f"{self.iteration}: "
                                  f"{error or 'another rank could not reach the coordinator'}")
        return s, error, newest

    # How often a process waiting for the others' reports looks at its
    # Watch stream and at the tally (which its own thread keeps).
    _TALLY_POLL = 0.05

    def _reported_agreed(self, began, newest, error):
        """After a periodic save's share is written and reported, or not
        (`error`): agrees with every other process again, through the
        layout epoch's store (_Tally), not a collective. Where a process's
        report got no answer (the coordinator lost after the save began),
        every one gives the version up and raises _SaveSkipped: the job
        trains on, and saves at the next period. Returns True where the
        version committed (the Watch stream told it first), else False:
        each goes on with its own outcome.

        The wait ends as the Watch stream tells the save's end (committed
        or deleted) or the epoch's (a peer died: the change follows), and
        after `timeout` (TimeoutError, as a commit that never comes).
        Ranks that finish early wait here, not in a collective: a host that
        vanishes, a slow rank, an error that is not ptc's leave no one in
        a collective whose timeout does not see the epoch end."""
        if not newest:
            return False  # no process began it: nothing was written
        unreachable = error is not None and error.unreachable
        tally = _Tally(self._store, f"ptc-reported-{newest}", dist.get_world_size(),
                       unreachable)
        epoch, seen = self.layout_epoch, self._dropped_seen
        deadline = time.time() + self.timeout
        try:
            ev = self._ev()
            while not tally.done.is_set():
                if ev["committed_version"] >= newest:
                    return True
                if (ev["dropped_save"] >= newest or ev["dropped_save"] > seen or
                        self._away_from(ev, epoch)):
                    return False  # what follows learns it again from the stream
                if time.time() > deadline:
                    raise TimeoutError(f"not every rank reported its share of version "
                                       f"{newest} within {self.timeout:.0f} s")
                ev = self.client.wait_event(ev["received"], self._TALLY_POLL)
        finally:
            tally.stop()
        if tally.error is not None:
            # Rank 0's store is gone with it: the change its death starts
            # follows.
            raise _Broken(tally.error)
        if tally.unreachable:
            # (A rank whose report got no answer does not ask again to give
            # the version up: that would wait the client's patience again.)
            self._skip(None if unreachable else began, newest,
                       f"not every rank could report its share of version {newest} (step "
                       f"{self.iteration}): "
                       f"{error or f'{tally.unreachable} got no answer from the coordinator'}")
        return False

    def _worst(self, mine, version):
        """The worst outcome of every process's, and the newest version any
        began (one all-reduce)."""
        flag = torch.tensor([mine, version], dtype=torch.int64, device=self._collective_device())
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        except RuntimeError as e:
            raise _Broken(e)
        return int(flag[0]), int(flag[1])

    def _skip(self, began, newest, why):
        """Skips a periodic save on every process: gives up the version this
        one began (best effort: a coordinator out of reach deletes it once a
        newer save supersedes it; one that got every report may have
        committed it, a whole save all the same) and raises _SaveSkipped."""
        if began is not None:
            began.abandon(f"rank {self.rank}: the save is skipped: {why}")
        # Given up, or deleted later: not a loss the next save must learn
        # of (known_dropped).
        self._dropped_seen = max(self._dropped_seen, newest)
        raise _SaveSkipped(why)

    def _all_ok(self, ok):
        """Whether every process is ok (one all-reduce)."""
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64,
                            device=self._collective_device())
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        except RuntimeError as e:
            raise _Broken(e)
        return bool(flag.item())

    def _hot_switch(self, serial):
        """The pending change is a hot switch: move the state to its target
        layout between the processes (ptc's plan), save the target's first
        version, and follow the commit (True). If it does not start on
        every process (False), none of them has moved anything: they save in
        their layout, and the coordinator starts the change from that save
        through the store (a switch held by some of them would otherwise
        wait for the save timeout)."""
        from . import hot
        from . import torch as pt
        self._note_change("hot switch")
        began = time.time()
        plan = target = save = None
        try:
            plan = self.client.hot_plan(serial)
            me = self.rank
            mine = [d for d, p in enumerate(plan["process_of"]) if p == me]
            if mine:
                if _refused_in_test(plan["config"], me):
                    raise _capi.Error(f"rank {me} refuses the hot switch to {plan['config']} "
                                     "(PTC_TEST_HOT_REFUSE)")
                target = _capi.Client(socket=self.socket, coordinator=self.coordinator,
                                     job=self.job, rank=mine[0], pending_serial=serial)
                # Holds the switch: the change can no longer be replaced.
                save = target.begin_save(int(self.iteration))
            ok = True
        except _capi.Error as e:
            self._log(f"hot switch {serial} does not start: {e}")
            ok = False
        planned = time.time()
        if not self._all_ok(ok):
            self._log(f"hot switch {serial} did not start on every process; "
                      "the change goes through the store")
            self._change["how"] = "store (the hot switch did not start)"
            return False
        agreed = time.time()
        if self._on_save:
            self._on_save(self)  # the switch ends in a save of this state
        device = self._collective_device()
        try:
            rank_view, tensors = pt._local_tensors(self.client, self.model, self.optimizer,
                                                   create_state=False)
            regions = target.regions if target is not None else []
            buffers = hot.receive_buffers(regions, device)
            ready = time.time()
            sent, received = hot.exchange(
                plan, me, rank_view, tensors, buffers, regions, device,
                direct_bytes=self._hot_direct_bytes or hot.DIRECT_BYTES)
            exchanged = time.time()
            del rank_view, tensors
            mine_objects = pt.small_objects(self.optimizer, self.scheduler, self.extra)
            objects = hot.exchange_small_objects(
                plan, me, mine_objects, self.job, save.version if save is not None else 0,
                device)
            moved = time.time()
            if save is not None:
                hot.save_target(save, regions, buffers, objects)
            del buffers
        except RuntimeError as e:
            # A peer died (the collective failed), or the save was refused
            # because a change from the committed version started: follow it.
            self._log(f"hot switch {serial} failed: {str(e)[:200]}")
            raise _Broken(e)
        version = save.version if save is not None else None
        if version is not None:
            self._wait_committed(version, self.layout_epoch, hot=True)
        self._change.update(planned=planned, agreed=agreed, ready=ready,
                            exchanged=exchanged, moved=moved, saved=time.time(),
                            hot_seconds=moved - began, bytes_sent=sent,
                            bytes_received=received,
                            bytes_between_processes=plan["bytes_between_processes"],
                            bytes_between_hosts=plan["bytes_between_hosts"])
        del target, save
        if not self._follow():
            raise StopIteration
        return True

    def _wait_committed(self, version, start_epoch, hot=False):
        """Until `version` commits (every rank saved it). A peer that died
        meanwhile never saves, and the change its death starts ends the
        wait (_Broken). A version the coordinator deleted ends it too
        (_SaveLost; a hot switch's: _Broken, its change follows). A hot
        switch's version commits with the change."""
        deadline = time.time() + self.timeout
        ev = self._ev()
        while True:
            if ev["committed_version"] >= version:
                return
            if ev["dropped_save"] >= version or (not hot and
                                                  ev["dropped_save"] > self._dropped_seen):
                # This version, or (begun after it) the one the others
                # saved: it can never commit.
                error = RuntimeError(f"version {ev['dropped_save']} could not commit and was "
                                     "deleted")
                raise _Broken(error) if hot else _SaveLost(error)
            started = ev["phase"] in _RUNNING and ev["plan_epoch"] > self._plan_epoch_seen
            if ev["layout_epoch"] > start_epoch or (started and (hot or not ev["pending_config"])):
                raise _Broken(RuntimeError(f"a change started before version {version} "
                                           "committed"))
            left = deadline - time.time()
            if left < 0:
                raise TimeoutError(f"version {version} did not commit in "
                                   f"{self.timeout:.0f} s")
            ev = self.client.wait_event(ev["received"], min(left, self._QUIET))

    # The pause after the first lost save in a row, doubled after each
    # next, at most _LOST_PAUSE_MOST (and a quarter of the collective
    # timeout: the first process back at the step boundary waits there for
    # the others).
    _LOST_PAUSE = 1.0
    _LOST_PAUSE_MOST = 16.0

    def _after_lost_save(self, error):
        """After a save that will never commit: waits a little for a change
        (a host of the job died: the change its death starts is followed
        from the step boundary) and returns, for rank 0 to decide there
        again (that change, or the save again). Raises TimeoutError once
        saves have been lost for the timeout with no change."""
        now = time.time()
        self._dropped_seen = max(self._dropped_seen, self._ev()["dropped_save"])
        if self._lost_since is None:
            self._lost_since = now
        self._lost_saves += 1
        if now - self._lost_since > self.timeout:
            raise TimeoutError(f"saves failed for {self.timeout:.0f} s and no change "
                               f"came: {error}") from error
        pause = min(self._LOST_PAUSE * 2 ** (self._lost_saves - 1), self._LOST_PAUSE_MOST,
                    self.collective_timeout / 4)
        self._log(f"save lost ({str(error)[:300]}); saving again in {pause:.1f} s unless "
                  "the job changes first")
        epoch = self.layout_epoch
        self._until(lambda ev: self._away_from(ev, epoch), time.time() + pause)

    def _recover(self):
        """After a failed step: drop the broken groups, wait for the change
        that follows the failure, and follow it."""
        error, self._broken = self._broken, None
        self._note_change("failure")
        self._leave_groups()
        if not self._follow(broken=True, error=error):
            raise StopIteration

    def _follow(self, broken=False, error=None):
        """Waits for the change to end. Committed: takes the new rank (False
        if none), forms the groups, rebuilds and loads. Aborted: goes on in
        the old layout (if the groups are intact)."""
        self._note_change("in flight")
        marker = self._change["marker"]
        known = max(self.layout_epoch, self._abandoned_epoch)

        def settled(ev):
            if ev["layout_epoch"] > known:
                return True
            ended = ev["phase"] not in _RUNNING and not ev["pending_config"]
            return ended and (ev["plan_epoch"], ev["phase"], ev["error"]) != marker and \
                ev["plan_epoch"] >= self._plan_epoch_seen

        try:
            self._wait(settled, "the job's change")
        except TimeoutError:
            if error is not None:
                self._log(f"no change followed the failure within {self.timeout:.0f} s; it "
                          f"failed here:\n{_stack_of(error).rstrip()}")
                raise error
            raise
        ev = self._ev()
        self._plan_epoch_seen = ev["plan_epoch"]
        if ev["layout_epoch"] <= known:
            self._log(f"the change aborted ({ev['error'] or 'no reason given'})")
            if broken:
                # The groups are gone: wait for the next change (the
                # coordinator retries), or give up with the step's error.
                self._broken = error
                self._change = None
                time.sleep(0.2)
                return True
            self._change = None
            return True
        self._change["committed"] = time.time()
        self._change["reason"] = ev["reason"]
        # No automatic collection in the pause: building the model and
        # loading make many objects, and a full collection they set off
        # traverses every object of the process (0.1-0.2 s with four
        # processes on two cores). It runs in the steps that follow.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._leave_groups()
            self._change["left"] = time.time()
            # The rank on this GPU and the layout it is a rank of, from one
            # answer of the coordinator.
            if self.client.rebind_device(self.device) is None:
                self._log("the new layout runs no rank on this GPU; leaving")
                return False
            self._change["rebound"] = time.time()
            try:
                self._form_and_load()
            except RuntimeError as e:  # ptc.Error too
                # A newer change started while this process met its peers
                # or loaded (one of them died): the loop follows that one.
                if not self._left_epoch(self.client.layout_epoch):
                    raise
                self._log(f"layout epoch {self.client.layout_epoch} ended before this "
                          f"process joined it: {str(e)[:200]}")
                # Its meeting may have completed (the peer died after it):
                # this process must not meet there again, but follow the
                # change.
                self._abandoned_epoch = self.client.layout_epoch
                raise _Broken(e)
        finally:
            if collecting:
                gc.enable()
        return True

    def _leave_groups(self):
        # What this layout built (the model, the optimizer, what build kept
        # on live: its groups) is freed by reference counting unless
        # something holds it in a cycle (a failed step's frames, a hook of
        # the script's); only then does a full collection run, which
        # traverses every object of the process (0.1-0.2 s of the pause
        # with four processes on two cores; _follow keeps the automatic
        # ones out of the pause too).
        built = [self.model, self.optimizer, self.scheduler]
        built += [getattr(self, k) for k in self.__dict__ if k not in self._own]
        kept = []
        for obj in built:
            try:
                kept.append(weakref.ref(obj))
            except TypeError:
                pass  # no weak references (None, a number): nothing to free
        del built, obj
        self.model = self.optimizer = self.scheduler = None
        for name in [k for k in self.__dict__ if k not in self._own]:
            delattr(self, name)  # what build kept on live (its groups)
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None
        alive = [(ref, type(ref()).__name__) for ref in kept if ref() is not None]
        if alive:
            started = time.time()
            gc.collect()
            cycle = [name for ref, name in alive if ref() is None]
            if cycle:  # (the rest is held by the script itself)
                self._log(f"the old layout's {', '.join(cycle)} were held in a reference "
                          f"cycle: collected in {time.time() - started:.2f} s")

    def _form_and_load(self):
        from . import torch as pt
        epoch = self.client.layout_epoch
        self.rank = self.client.rank
        self.config = self.client.config
        world = self.client.world_size
        wait = datetime.timedelta(seconds=self.timeout)
        if self.rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=wait,
                                  wait_for_workers=False)
            self.client.rendezvous(epoch, port=store.port, timeout=self.timeout)
        else:
            address = self.client.rendezvous(epoch, timeout=self.timeout)
            where, _, port = address.rpartition(":")
            store = dist.TCPStore(where.strip("[]"), int(port), world, False, timeout=wait)
        met = time.time()
        _tell_agent(epoch)
        if _dies_after_meeting_in_test(self.config, self.device, self._change):
            os.kill(os.getpid(), signal.SIGKILL)
        self._store = store
        collective = datetime.timedelta(seconds=self.collective_timeout)
        groups_store = _EpochStore(dist.PrefixStore(f"ptc-{epoch}", store),
                                   lambda: self._epoch_ended(epoch), collective)
        _init_process_group(self.backend, store=groups_store, rank=self.rank,
                            world_size=world, timeout=collective)
        formed = time.time()
        self.restoring = self.client.committed_version > 0
        parts = self._build(self)
        self.model = parts["model"]
        self.optimizer = parts.get("optimizer")
        self.scheduler = parts.get("scheduler")
        self.extra = dict(parts.get("extra") or {})
        self.layout_epoch = epoch
        self._lost_saves, self._lost_since = 0, None
        self._dropped_seen = max(self._dropped_seen, self._ev()["dropped_save"])
        built = time.time()
        if self.client.committed_version > 0:
            restored = pt.load(self.client, self.model, self.optimizer, self.scheduler)
            self.extra.update(restored)
            self.iteration = restored.step
            self._saved_at = restored.step
            if self._on_load:
                self._on_load(self)
        self._plan_epoch_seen = max(self._plan_epoch_seen, self._ev()["plan_epoch"])
        if self._change is not None:
            c = self._change
            c.pop("marker", None)
            c.update(met=met, formed=formed, built=built, resumed=time.time(), to=str(self.config),
                     rank=self.rank, layout_epoch=epoch, resumed_iteration=self.iteration,
                     pid=os.getpid())
            c["pause_seconds"] = c["resumed"] - c["noticed"]
            self.changes.append(c)
            self._log(f"now rank {self.rank} of {self.config} (layout epoch {epoch}), "
                      f"iteration {self.iteration}, after {c['pause_seconds']:.2f} s")
            self._change = None
