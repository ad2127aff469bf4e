"""ptc's client library, bound with ctypes to its C ABI (libptc.so,
client/c_api.h).

One build of libptc.so serves every CPython from 3.9 on and every
PyTorch: nothing here is compiled against a Python version. The library
exports its C functions only (gRPC, protobuf and abseil stay inside it),
and ctypes releases the GIL during each call, so a blocking call (a
rendezvous, a commit) does not stop the process's other threads.

Arrays handed out alias daemon memory without copies: a save's bytes are
written through Save.write (one copy, straight into shared memory), a
load's regions are read-only numpy views of the mapped buffers that keep
their State alive. Every failed call raises ptc.Error with the library's
message; its .code is the status code's name ("INVALID_ARGUMENT", ...).

The library is looked for beside this file (the package as Bazel builds
it, or as the wheel installs it), or at $PTC_LIBRARY.
"""
import atexit
import ctypes
import json
import os
import weakref

_API_VERSION = 1

_CODES = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
          "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
          "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
          "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"]

# ptc dtypes as numpy holds them; formats numpy lacks (bf16, fp8) come as
# unsigned integers of the same width, to be viewed as the framework's type
# (torch: .view(torch.bfloat16)).
_NUMPY_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "uint16", "fp8_e4m3": "uint8",
                 "fp8_e5m2": "uint8", "int8": "int8", "int16": "int16", "int32": "int32",
                 "int64": "int64", "uint8": "uint8", "bool": "bool", "raw": "uint8"}


class Error(RuntimeError):
    """A failed call: str(e) is "CODE: message"; e.code is CODE."""

    def __init__(self, message, code="UNKNOWN"):
        super().__init__(message)
        self.code = code

    @property
    def unreachable(self):
        """whether the call failed for want of its server: refused for its
        connection, or no answer within the client's patience"""
        return self.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def _load():
    path = os.environ.get("PTC_LIBRARY") or os.path.join(os.path.dirname(__file__), "libptc.so")
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(f"ptc: cannot load its library {path}: {e}") from e
    lib.ptc_api_version.restype = ctypes.c_int
    if lib.ptc_api_version() != _API_VERSION:
        raise ImportError(f"ptc: {path} has C ABI version {lib.ptc_api_version()}, this "
                          f"package needs {_API_VERSION}; install matching versions")
    return lib


_lib = _load()


class _Bytes(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _Cursor(ctypes.Structure):
    _fields_ = [("seed", ctypes.c_uint64), ("dataset_size", ctypes.c_int64),
                ("consumed", ctypes.c_int64), ("global_batch", ctypes.c_int64)]


_P = ctypes.c_void_p
_S = ctypes.c_char_p
_I = ctypes.c_int
_I64 = ctypes.c_int64
_U64 = ctypes.c_uint64
_SZ = ctypes.c_size_t
_D = ctypes.c_double
_B = ctypes.POINTER(_Bytes)
_PP = ctypes.POINTER(ctypes.c_void_p)

# name: (argtypes, restype); restype None (void) or a value; the rest
# return a status code.
_SIGNATURES = {
    "ptc_last_error": ([], _S),
    "ptc_bytes_free": ([_B], None),
    "ptc_max_small_object_bytes": ([], _I64),
    "ptc_config_parse": ([_S, _S, _PP], _I),
    "ptc_config_free": ([_P], None),
    "ptc_config_describe": ([_P, _B], _I),
    "ptc_config_coord_of": ([_P, _I, _B], _I),
    "ptc_config_rank_of": ([_P, ctypes.POINTER(_I), _I, ctypes.POINTER(_I)], _I),
    "ptc_config_stage_layers": ([_P, _I, _I, ctypes.POINTER(_I), ctypes.POINTER(_I)], _I),
    "ptc_check_layout": ([_S, _S, _B], _I),
    "ptc_layout_regions": ([_S, _S, _B], _I),
    "ptc_buffer_view": ([_S, _S, _S, _I, _B], _I),
    "ptc_derived_seed": ([_S, _SZ, ctypes.POINTER(_I), ctypes.POINTER(_U64)], _I),
    "ptc_derived_small_object": ([_S, _S, _S, _I64, _B], _I),
    "ptc_padded_vocab": ([_S, _I, ctypes.POINTER(_I64)], _I),
    "ptc_model_tensors": ([_S, _B], _I),
    "ptc_cursor_next_samples": ([ctypes.POINTER(_Cursor), _I, _I, _B], _I),
    "ptc_cursor_sample_at": ([ctypes.POINTER(_Cursor), _I64, ctypes.POINTER(_I64)], _I),
    "ptc_cursor_advance": ([ctypes.POINTER(_Cursor)], _I),
    "ptc_cursor_encode": ([ctypes.POINTER(_Cursor), _B], _I),
    "ptc_cursor_decode": ([_S, _SZ, ctypes.POINTER(_Cursor)], _I),
    "ptc_ranks_on_host": ([_S, _S, _S, _B], _I),
    "ptc_ranks_on_host_local": ([_S, _S, _S, _S, _B], _I),
    "ptc_report_process_exit": ([_S, _S, _S, _I, _I, _I64, ctypes.POINTER(_I)], _I),
    "ptc_follower_open": ([_S, _S, _PP], _I),
    "ptc_follower_free": ([_P], None),
    "ptc_follower_event": ([_P, _B], _I),
    "ptc_follower_ranks_on_host": ([_P, _S, _B], _I),
    "ptc_client_connect": ([_S, _S, _S, _I, _S, _I64, _PP], _I),
    "ptc_client_free": ([_P], None),
    "ptc_client_numbers": ([_P, ctypes.POINTER(_I64)], None),
    "ptc_client_describe": ([_P, _B], _I),
    "ptc_client_config": ([_P, _PP], _I),
    "ptc_client_layout": ([_P, _B], _I),
    "ptc_client_refresh": ([_P], _I),
    "ptc_client_rebind": ([_P, _I], _I),
    "ptc_client_rebind_device": ([_P, _I, ctypes.POINTER(_I)], _I),
    "ptc_client_follow": ([_P], _I),
    "ptc_client_unfollow": ([_P], _I),
    "ptc_client_event": ([_P, _B], _I),
    "ptc_client_wait_event": ([_P, _I64, _D, _B], _I),
    "ptc_client_fetch_event": ([_P, _B], _I),
    "ptc_client_fetch_event_within": ([_P, _D, _B], _I),
    "ptc_client_ranks_on_host": ([_P, _S, _B], _I),
    "ptc_client_rendezvous": ([_P, _I64, _I, _D, _B], _I),
    "ptc_client_hot_plan": ([_P, _I64, _B], _I),
    "ptc_client_begin_save": ([_P, _I64, _PP], _I),
    "ptc_client_begin_save_for_change": ([_P, _I64, _I64, _PP], _I),
    "ptc_client_begin_save_known_dropped": ([_P, _I64, _I64, _I64, _PP], _I),
    "ptc_client_load": ([_P, _PP], _I),
    "ptc_client_wait_committed": ([_P, _I64, _D], _I),
    "ptc_save_free": ([_P], None),
    "ptc_save_version": ([_P], _I64),
    "ptc_save_step": ([_P], _I64),
    "ptc_save_write": ([_P, _I, _P, _SZ], _I),
    "ptc_save_put_small_object": ([_P, _S, _S, _SZ], _I),
    "ptc_save_commit": ([_P, ctypes.POINTER(_I)], _I),
    "ptc_save_give_up": ([_P, _S], _I),
    "ptc_state_free": ([_P], None),
    "ptc_state_version": ([_P], _I64),
    "ptc_state_describe": ([_P, _B], _I),
    "ptc_state_region": ([_P, _I, _PP, ctypes.POINTER(_SZ)], _I),
    "ptc_state_read_into": ([_P, _I, _P, _SZ], _I),
    "ptc_state_checksum": ([_P, _I, ctypes.POINTER(_U64)], _I),
    "ptc_state_inode": ([_P, _I, ctypes.POINTER(_U64)], _I),
    "ptc_state_small_object": ([_P, _S, _B], _I),
    "ptc_gpu_create": ([_I, _PP], _I),
    "ptc_gpu_free": ([_P], None),
    "ptc_gpu_device": ([_P], _I),
    # GPU addresses and streams: uintptr_t, size_t's width on every target.
    "ptc_gpu_save": ([_P, _P, _I, _SZ, _U64, _SZ], _I),
    "ptc_gpu_load": ([_P, _P, _I, _SZ, _U64, _SZ], _I),
    "ptc_gpu_finish": ([_P, _B], _I),
}
for _name, (_args, _res) in _SIGNATURES.items():
    _fn = getattr(_lib, _name)
    _fn.argtypes = _args
    _fn.restype = _res


def _check(code):
    if code != 0:
        name = _CODES[code] if 0 <= code < len(_CODES) else f"CODE_{code}"
        message = _lib.ptc_last_error().decode("utf-8", "replace")
        raise Error(f"{name}: {message}", name)


def _s(text):
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {type(text).__name__}")
    return text.encode()


def _bytes(fn, *args):
    """Calls fn(*args, out) and returns the bytes it gave."""
    out = _Bytes()
    _check(fn(*args, ctypes.byref(out)))
    try:
        return ctypes.string_at(out.data, out.size)
    finally:
        _lib.ptc_bytes_free(ctypes.byref(out))


def _json(fn, *args):
    return json.loads(_bytes(fn, *args))


def _handle(fn, *args):
    out = ctypes.c_void_p()
    _check(fn(*args, ctypes.byref(out)))
    return out


def _np():
    """numpy, imported where arrays are made: configs, cursors and the
    launcher's calls work without it."""
    import numpy
    return numpy


def _region_dicts(regions):
    np = _np()
    for r in regions:
        r["numpy_dtype"] = np.dtype(_NUMPY_DTYPES[r["dtype"]])
        r["region"] = [tuple(d) for d in r["region"]]
    return regions


def _bytes_of(data, writable):
    """(address, size, keep) of a C-contiguous buffer (numpy array, bytes,
    a CPU tensor's .numpy()); `keep` must outlive the use of the address."""
    view = memoryview(data)
    if not view.c_contiguous:
        raise Error("INVALID_ARGUMENT: the data must be C-contiguous (use .contiguous())",
                    "INVALID_ARGUMENT")
    if writable and view.readonly:
        raise Error("INVALID_ARGUMENT: the output buffer is read-only", "INVALID_ARGUMENT")
    if view.nbytes == 0:
        return None, 0, view
    flat = _np().frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view,
                         dtype="uint8")
    return flat.ctypes.data, view.nbytes, (view, flat)


MAX_SMALL_OBJECT_BYTES = _lib.ptc_max_small_object_bytes()


class _Handle:
    """Owns one handle of the library and frees it once: when the object is
    collected (in any order: the library keeps what a handle needs alive),
    or at interpreter exit, before the library's own statics go (a client's
    background threads must be stopped by then)."""

    _live = weakref.WeakSet()

    def _own(self, handle, free):
        self._h = handle
        self._free = free  # kept: module globals may be gone at exit
        _Handle._live.add(self)

    def close(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._free(h)

    def __del__(self):
        self.close()


@atexit.register
def _close_all():
    for obj in list(_Handle._live):
        obj.close()


class ParallelConfig(_Handle):
    """A parallel config ("tp=2,pp=2,dp=4") on a mesh of axes."""

    def __init__(self, handle):
        self._own(handle, _lib.ptc_config_free)
        self._d = _json(_lib.ptc_config_describe, handle)

    @staticmethod
    def parse(text, mesh=()):
        """a config for a mesh of these axes (slowest first; default pp, dp, tp)"""
        return ParallelConfig(_handle(_lib.ptc_config_parse, _s(text), _s(",".join(mesh))))

    tp = property(lambda self: self._d["tp"])
    pp = property(lambda self: self._d["pp"])
    dp = property(lambda self: self._d["dp"])
    mesh = property(lambda self: list(self._d["mesh"]))
    world_size = property(lambda self: self._d["world_size"])

    def size(self, axis):
        """degree of an axis (1 if the mesh lacks it)"""
        sizes = dict(zip(self._d["mesh"], self._d["sizes"]))
        return sizes.get(axis, 1)

    def coord_of(self, rank):
        """a rank's indices in mesh order ((pp, dp, tp))"""
        return tuple(_json(_lib.ptc_config_coord_of, self._h, int(rank)))

    def rank_of(self, *indices):
        """the rank at these indices, in mesh order"""
        arr = (ctypes.c_int * len(indices))(*[int(i) for i in indices])
        rank = ctypes.c_int()
        _check(_lib.ptc_config_rank_of(self._h, arr, len(indices), ctypes.byref(rank)))
        return rank.value

    def stage_layers(self, stage, num_layers):
        """(first layer, number of layers) of a pipeline stage"""
        first, count = ctypes.c_int(), ctypes.c_int()
        _check(_lib.ptc_config_stage_layers(self._h, int(stage), int(num_layers),
                                            ctypes.byref(first), ctypes.byref(count)))
        return first.value, count.value

    def __str__(self):
        return self._d["text"]

    def __repr__(self):
        return f"ParallelConfig({self._d['text']!r})"


def ranks_on_host(coordinator, job, host, socket=None):
    """the ranks of `job` that its placement puts on `host`, and their GPUs:
    {config, world_size, layout_epoch, ranks: [{rank, gpu}]}; what a host's
    launcher starts there (ptcctl ranks). With `socket` (the host's ptcd),
    asked through the daemon's relay where it relays to this coordinator:
    one connection per host, however many of its processes ask at once"""
    if socket:
        return _json(_lib.ptc_ranks_on_host_local, _s(socket), _s(coordinator), _s(job),
                     _s(host))
    return _json(_lib.ptc_ranks_on_host, _s(coordinator), _s(job), _s(host))


def report_process_exit(coordinator, job, host, gpu, exit_code, layout_epoch):
    """a host's agent: the process on `gpu` died under `layout_epoch` while
    its GPU had a rank; returns whether the coordinator changes the job"""
    changes = ctypes.c_int()
    _check(_lib.ptc_report_process_exit(_s(coordinator), _s(job), _s(host), int(gpu),
                                        int(exit_code), int(layout_epoch),
                                        ctypes.byref(changes)))
    return bool(changes.value)


class Follower(_Handle):
    """A job followed from outside its processes (a host's agent): the
    coordinator's Watch stream tells it of every change (`event`, no call),
    and `ranks_on_host` asks over the follower's one channel."""

    def __init__(self, coordinator, job):
        self._own(_handle(_lib.ptc_follower_open, _s(coordinator), _s(job)),
                  _lib.ptc_follower_free)

    @property
    def event(self):
        """the job as the stream last told it (Client.event's fields;
        known is False until the first event)"""
        return _json(_lib.ptc_follower_event, self._h)

    def ranks_on_host(self, host):
        """ptc.ranks_on_host over this follower's channel"""
        return _json(_lib.ptc_follower_ranks_on_host, self._h, _s(host))


def check_layout(layout, config=""):
    """validates a layout spec (JSON) and, with `config`, that the config can
    run it; returns the spec as ptc writes it. Raises ptc.Error naming the
    field"""
    return _bytes(_lib.ptc_check_layout, _s(layout), _s(config)).decode()


def layout_regions(layout, config):
    """every rank's regions of a layout spec (JSON) under a config, as
    Client.regions lists them, without a cluster"""
    return [_region_dicts(rank) for rank in _json(_lib.ptc_layout_regions, _s(layout),
                                                  _s(config))]


def buffer_view(layout, config, buffer, rank):
    """flat buffer `buffer` of a layout spec (JSON) as `rank` sees it under
    `config`: in_use, shards, index, entries [{key, offset, size}] (offset -1:
    not on this rank's stage) and buckets [{start, end, chunk}] (chunk: this
    rank's [lo, hi) in buffer coordinates)"""
    v = _json(_lib.ptc_buffer_view, _s(layout), _s(config), _s(buffer), int(rank))
    for b in v["buckets"]:
        b["chunk"] = tuple(b["chunk"])
    return v


def derived_seed(value):
    """the seed ptc derived for a rank whose coordinates are new (an RNG
    state's small object), or None for bytes a rank saved itself"""
    value = bytes(value)
    has, seed = ctypes.c_int(), ctypes.c_uint64()
    _check(_lib.ptc_derived_seed(value, len(value), ctypes.byref(has), ctypes.byref(seed)))
    return seed.value if has.value else None


def derived_small_object(job, name, derive_from, version):
    """the value the store derives for small object `name` of job `job` for
    a rank whose coordinates (`derive_from`) are new, in `version`"""
    return _bytes(_lib.ptc_derived_small_object, _s(job), _s(name), _s(derive_from),
                  int(version))


def padded_vocab(model, tp):
    """Megatron's padded vocabulary of a model at tensor parallelism tp"""
    out = ctypes.c_int64()
    _check(_lib.ptc_padded_vocab(_s(model), int(tp), ctypes.byref(out)))
    return out.value


def model_tensors(model):
    """(key, dtype, global shape) of every tensor"""
    return [(k, d, list(s)) for k, d, s in _json(_lib.ptc_model_tensors, _s(model))]


class DataCursor:
    """A data loader's position: which samples each dp rank reads next, the
    same whatever the dp degree (ptc/data_cursor.h)."""

    def __init__(self, seed, dataset_size, global_batch, consumed=0):
        if dataset_size < 1 or global_batch < 1 or consumed < 0:
            raise Error("INVALID_ARGUMENT: a cursor needs dataset_size >= 1, global_batch >= 1 "
                        "and consumed >= 0", "INVALID_ARGUMENT")
        self._c = _Cursor(int(seed), int(dataset_size), int(consumed), int(global_batch))

    seed = property(lambda self: self._c.seed)
    dataset_size = property(lambda self: self._c.dataset_size)
    consumed = property(lambda self: self._c.consumed)

    @property
    def global_batch(self):
        return self._c.global_batch

    @global_batch.setter
    def global_batch(self, b):
        if b < 1:
            raise Error("INVALID_ARGUMENT: global_batch must be >= 1", "INVALID_ARGUMENT")
        self._c.global_batch = int(b)

    def next_samples(self, dp_rank, dp):
        """sample indices this dp rank reads in the next global batch"""
        return _json(_lib.ptc_cursor_next_samples, ctypes.byref(self._c), int(dp_rank), int(dp))

    def sample_at(self, position):
        out = ctypes.c_int64()
        _check(_lib.ptc_cursor_sample_at(ctypes.byref(self._c), int(position),
                                         ctypes.byref(out)))
        return out.value

    def advance(self):
        _check(_lib.ptc_cursor_advance(ctypes.byref(self._c)))

    def encode(self):
        return _bytes(_lib.ptc_cursor_encode, ctypes.byref(self._c))

    @staticmethod
    def decode(data):
        data = bytes(data)
        c = _Cursor()
        _check(_lib.ptc_cursor_decode(data, len(data), ctypes.byref(c)))
        out = DataCursor.__new__(DataCursor)
        out._c = c
        return out


class Save(_Handle):
    """A save of one version by a rank (Client.begin_save)."""

    def __init__(self, handle, client):
        self._own(handle, _lib.ptc_save_free)
        self._client = client  # a save must not outlive its client

    version = property(lambda self: _lib.ptc_save_version(self._h))
    step = property(lambda self: _lib.ptc_save_step(self._h))

    def write(self, index, data):
        """copies a C-contiguous buffer (numpy array, torch tensor via
        .numpy()) into region `index` of the save"""
        address, size, keep = _bytes_of(data, writable=False)
        _check(_lib.ptc_save_write(self._h, int(index), address, size))
        del keep

    def put_small_object(self, name, data):
        data = bytes(data)
        _check(_lib.ptc_save_put_small_object(self._h, _s(name), data, len(data)))

    def commit(self):
        committed = ctypes.c_int()
        _check(_lib.ptc_save_commit(self._h, ctypes.byref(committed)))
        return bool(committed.value)

    def give_up(self, why):
        """this rank will not save this version: the coordinator deletes
        it, and the job's ranks that reported it stop waiting for it (their
        event's dropped_save) and save again"""
        _check(_lib.ptc_save_give_up(self._h, _s(str(why))))

    def abandon(self, why):
        """give_up, best effort: where the coordinator cannot be told (out
        of reach too), it deletes the version once a newer save supersedes
        it"""
        try:
            self.give_up(str(why)[:1000])
        except Error:
            pass


class _Mapped:
    """A read-only byte range of a State's mapping, as numpy sees it; it
    keeps the State (and so the mapping) alive."""

    def __init__(self, address, size, state):
        self.__array_interface__ = {"data": (address, True), "shape": (size,),
                                    "typestr": "|u1", "version": 3}
        self._state = state


class State(_Handle):
    """A rank's state in one committed version (Client.load)."""

    def __init__(self, handle, client):
        self._own(handle, _lib.ptc_state_free)
        self._client = client
        self._regions = None

    version = property(lambda self: _lib.ptc_state_version(self._h))

    @property
    def regions(self):
        if self._regions is None:
            self._regions = _region_dicts(_json(_lib.ptc_state_describe, self._h)["regions"])
        return self._regions

    def region(self, index):
        """a read-only numpy view of region `index` (no copy); valid while any
        view or the State lives"""
        regions = self.regions
        if not 0 <= index < len(regions):
            raise Error(f"OUT_OF_RANGE: region {index} is outside this rank's {len(regions)} "
                        "regions", "OUT_OF_RANGE")
        r = regions[index]
        address, size = ctypes.c_void_p(), ctypes.c_size_t()
        _check(_lib.ptc_state_region(self._h, int(index), ctypes.byref(address),
                                     ctypes.byref(size)))
        raw = _np().asarray(_Mapped(address.value or 0, size.value, self))
        return raw.view(r["numpy_dtype"]).reshape([e - b for b, e in r["region"]])

    def read_into(self, index, out):
        """copies region `index` into `out` (a writable C-contiguous buffer
        of exactly its bytes: numpy array, CPU tensor via .numpy()) without
        mapping it; faster than copying from region(index) where the copy is
        all that is needed"""
        address, size, keep = _bytes_of(out, writable=True)
        _check(_lib.ptc_state_read_into(self._h, int(index), address, size))
        del keep

    def checksum(self, index):
        out = ctypes.c_uint64()
        _check(_lib.ptc_state_checksum(self._h, int(index), ctypes.byref(out)))
        return out.value

    def inode(self, index):
        out = ctypes.c_uint64()
        _check(_lib.ptc_state_inode(self._h, int(index), ctypes.byref(out)))
        return out.value

    def small_object(self, name):
        return _bytes(_lib.ptc_state_small_object, self._h, _s(name))


class DeviceCopies(_Handle):
    """GPU copies (client/device_copies.h); addresses and streams are
    integers (torch: tensor.data_ptr(), current_stream().cuda_stream)."""

    def __init__(self, device):
        """a side stream on GPU `device`; raises ptc.Error (UNAVAILABLE) where
        CUDA has no driver or GPU"""
        self._own(_handle(_lib.ptc_gpu_create, int(device)), _lib.ptc_gpu_free)

    device = property(lambda self: _lib.ptc_gpu_device(self._h))

    def save(self, save, index, src, bytes, after=0):
        """queues a copy of contiguous GPU memory `src` into region `index`
        of the save, after the work queued on stream `after`"""
        _check(_lib.ptc_gpu_save(self._h, save._h, int(index), int(src), int(bytes), int(after)))

    def load(self, state, index, dst, bytes, after=0):
        """queues a copy of loaded region `index` into contiguous GPU memory
        `dst`, after the work queued on stream `after`"""
        _check(_lib.ptc_gpu_load(self._h, state._h, int(index), int(dst), int(bytes),
                                 int(after)))

    def finish(self):
        """waits for the queued copies and unregisters the mappings (before a
        save's commit, before loaded memory is used); returns what they did"""
        return _json(_lib.ptc_gpu_finish, self._h)


class Client(_Handle):
    """A training rank's connection to its host's ptcd and the coordinator
    (client/client.h)."""

    def __init__(self, socket, coordinator, job, rank, token="", pending_serial=0):
        """token: the job's token (ptcctl token); empty: $PTC_JOB_TOKEN.
        pending_serial: bind to the job's pending hot switch (its target
        layout; a save is the switch's)"""
        self._own(_handle(_lib.ptc_client_connect, _s(socket), _s(coordinator), _s(job),
                          int(rank), _s(token), int(pending_serial)), _lib.ptc_client_free)
        self._described = None  # (layout_epoch, rank) -> describe()

    def _numbers(self):
        out = (ctypes.c_int64 * 7)()
        _lib.ptc_client_numbers(self._h, out)
        return list(out)

    def _describe(self):
        n = self._numbers()
        key = (n[5], n[0])
        if self._described is None or self._described[0] != key:
            d = _json(_lib.ptc_client_describe, self._h)
            _region_dicts(d["regions"])
            self._described = (key, d)
        return self._described[1]

    def hot_plan(self, serial):
        """the plan of the job's pending hot switch between its processes:
        {config, process_of (per target rank, the rank of this layout whose
        process runs on its GPU), transfers [(key, region, source_rank,
        target_rank)], small_objects [{name, target_rank, source_rank,
        derive_from}], bytes, bytes_between_processes, bytes_between_hosts}"""
        h = _json(_lib.ptc_client_hot_plan, self._h, int(serial))
        h["transfers"] = [(k, [tuple(d) for d in region], s, t)
                          for k, region, s, t in h["transfers"]]
        return h

    def refresh(self):
        _check(_lib.ptc_client_refresh(self._h))

    def rebind(self, rank):
        """becomes `rank` of the job's current config (a live process after a
        change) and re-reads the job"""
        _check(_lib.ptc_client_rebind(self._h, int(rank)))

    def rebind_device(self, device):
        """becomes the rank the job's placement now puts on this host's GPU
        `device` and re-reads the job, from one answer of the coordinator;
        returns the rank, or None where the placement puts none there (the
        client stays as it was)"""
        rank = ctypes.c_int()
        _check(_lib.ptc_client_rebind_device(self._h, int(device), ctypes.byref(rank)))
        return rank.value if rank.value >= 0 else None

    def follow(self):
        """follows the job in the background (the coordinator's Watch
        stream); `event` is then its newest state"""
        _check(_lib.ptc_client_follow(self._h))

    def unfollow(self):
        """stops following (event keeps the last state)"""
        _check(_lib.ptc_client_unfollow(self._h))

    @property
    def event(self):
        """the job as Follow last saw it: {known, layout_epoch,
        committed_version, pending_config, plan_epoch, phase, reason, error,
        received (how many events the stream has told)}"""
        return _json(_lib.ptc_client_event, self._h)

    def wait_event(self, after, timeout):
        """`event` once the stream has told more than `after` events (an
        event's "received"), or after `timeout` seconds: a process that
        waits for the job sleeps until it is told something new"""
        return _json(_lib.ptc_client_wait_event, self._h, int(after),
                     float(timeout))

    def fetch_event(self, timeout=None):
        """the job's state now, as `event` has it (one call to the
        coordinator; asked again within `timeout` seconds if given, else
        within the client's patience)"""
        if timeout is None:
            return _json(_lib.ptc_client_fetch_event, self._h)
        return _json(_lib.ptc_client_fetch_event_within, self._h, float(timeout))

    def ranks_on_host(self, host):
        """ranks_on_host(coordinator, job, host) over this client's
        connection to the coordinator (that one opens one per call)"""
        return _json(_lib.ptc_client_ranks_on_host, self._h, _s(host))

    def rendezvous(self, layout_epoch, port=0, timeout=120.0):
        """meets the job's other processes under a layout epoch: rank 0 offers
        the port of its process group store; every rank waits until all of
        the epoch's ranks are there at once; returns the store's host:port (an
        error once the job has another layout epoch, or after `timeout`
        seconds, naming the ranks missing)"""
        return _bytes(_lib.ptc_client_rendezvous, self._h, int(layout_epoch), int(port),
                      float(timeout)).decode()

    job = property(lambda self: self._describe()["job"])
    rank = property(lambda self: self._numbers()[0])
    host = property(lambda self: self._describe()["host"])
    relayed = property(lambda self: self._describe()["relayed"],
                       doc="whether this process reaches the coordinator through its "
                           "host's ptcd (one connection per host), not directly")
    device = property(lambda self: self._numbers()[1],
                      doc="this rank's GPU on its host, from the job's placement (-1: none "
                          "placed)")
    world_size = property(lambda self: self._numbers()[2])
    committed_version = property(lambda self: self._numbers()[3])
    committed_step = property(lambda self: self._numbers()[4])
    layout_epoch = property(lambda self: self._numbers()[5])
    num_layers = property(lambda self: self._numbers()[6])
    coord = property(lambda self: tuple(self._describe()["coord"]))
    mesh = property(lambda self: list(self._describe()["mesh"]))
    small_object_names = property(lambda self: list(self._describe()["small_object_names"]))
    regions = property(lambda self: self._describe()["regions"])

    @property
    def config(self):
        return ParallelConfig(_handle(_lib.ptc_client_config, self._h))

    @property
    def layout(self):
        """the job's layout spec as JSON (as registered, or generated from its
        model name)"""
        return _bytes(_lib.ptc_client_layout, self._h).decode()

    def begin_save(self, step, change_serial=0, known_dropped=None):
        """Starts saving `step`. `change_serial`: the pending change this
        save is made for (its hot switch did not start on every process),
        which then goes through the store from it. `known_dropped`: the
        newest deleted save (the event's dropped_save) this rank has acted
        on; refused (ABORTED) if a newer one was deleted, which the job's
        ranks make again together (None: not checked)."""
        if known_dropped is None:
            return Save(_handle(_lib.ptc_client_begin_save_for_change, self._h, int(step),
                                int(change_serial)), self)
        return Save(_handle(_lib.ptc_client_begin_save_known_dropped, self._h, int(step),
                            int(change_serial), int(known_dropped)), self)

    def load(self):
        return State(_handle(_lib.ptc_client_load, self._h), self)

    def wait_committed(self, version, timeout=60.0):
        _check(_lib.ptc_client_wait_committed(self._h, int(version), float(timeout)))
