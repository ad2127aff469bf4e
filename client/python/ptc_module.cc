// The Python binding of the client library: `import ptc` (the package in
// client/python/ptc wraps this extension, ptc._ptc). Arrays handed to
// Python alias daemon memory without copies: a save's buffers are written
// through Save.write (one copy, straight into shared memory), a load's
// regions are read-only numpy views of the mapped buffers that keep their
// State alive. Errors raise ptc.Error with the library's message and its
// status code name.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/device_copies.h"
#include "proto/enum_names.h"
#include "ptc/data_cursor.h"
#include "ptc/families.h"
#include "ptc/layout.h"
#include "ptc/layout_spec_proto.h"
#include "ptc/model_spec.h"
#include "ptc/parallel_config.h"

namespace py = pybind11;

namespace ptc {
namespace {

// Raised for every failed call: .code is the status code's name.
PyObject* error_type = nullptr;

[[noreturn]] void Raise(const absl::Status& s) {
  py::object err = py::reinterpret_borrow<py::object>(error_type)(
      absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message()));
  err.attr("code") = absl::StatusCodeToString(s.code());
  PyErr_SetObject(error_type, err.ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *std::move(v);
}

// Runs `fn` (a blocking call into the library) without the GIL, then
// raises its error, if any, with the GIL held again.
template <typename Fn>
auto Unlocked(Fn fn) {
  using R = decltype(fn());
  std::optional<R> r;
  {
    py::gil_scoped_release release;
    r.emplace(fn());
  }
  if constexpr (std::is_same_v<R, absl::Status>) {
    Check(*r);
  } else {
    return Value(*std::move(r));
  }
}

// Row-major and dense, or refuse: no silent reordering.
void CheckDense(const py::buffer_info& info) {
  py::ssize_t expect = info.itemsize;
  for (int d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expect)
      Check(absl::InvalidArgumentError(
          "the data must be C-contiguous (use .contiguous())"));
    expect *= info.shape[d];
  }
}

// The numpy dtype that holds a ptc dtype's elements; formats numpy lacks
// (bf16, fp8) come as unsigned integers of the same width, to be viewed
// as the framework's type (torch: .view(torch.bfloat16)).
py::dtype NumpyDType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return py::dtype("float32");
    case DType::kFloat16:
      return py::dtype("float16");
    case DType::kBFloat16:
      return py::dtype("uint16");
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kUInt8:
    case DType::kRaw:
      return py::dtype("uint8");
    case DType::kInt8:
      return py::dtype("int8");
    case DType::kInt16:
      return py::dtype("int16");
    case DType::kInt32:
      return py::dtype("int32");
    case DType::kInt64:
      return py::dtype("int64");
    case DType::kBool:
      return py::dtype("bool");
  }
  return py::dtype("uint8");
}

std::vector<py::ssize_t> RegionShape(const Region& r) {
  std::vector<py::ssize_t> shape;
  for (int d = 0; d < r.rank(); ++d) shape.push_back(r.dim(d).size());
  return shape;
}

py::dict RegionDict(int index, const RankRegion& r) {
  py::dict d;
  d["index"] = index;
  d["tensor"] = r.tensor;
  d["key"] = r.key;
  d["dtype"] = std::string(DTypeName(r.dtype));
  d["numpy_dtype"] = NumpyDType(r.dtype);
  d["shape"] = std::vector<int64_t>(r.shape.begin(), r.shape.end());
  std::vector<std::pair<int64_t, int64_t>> box;
  for (int i = 0; i < r.region.rank(); ++i)
    box.push_back({r.region.dim(i).begin, r.region.dim(i).end});
  d["region"] = box;
  d["bytes"] = r.bytes;
  return d;
}

// A rank's indices on the mesh's axes, in the spec's order (pp, dp, tp
// for the built-in families).
py::tuple CoordTuple(const ParallelConfig& config, const MeshCoord& c) {
  py::tuple out(config.mesh.size());
  for (size_t i = 0; i < config.mesh.size(); ++i)
    out[i] = config.IndexOn(c, config.mesh[i]);
  return out;
}

}  // namespace

py::dict EventDict(const JobEvent& e) {
  py::dict d;
  d["known"] = e.known;
  d["layout_epoch"] = e.layout_epoch;
  d["committed_version"] = e.committed_version;
  d["pending_config"] = e.pending_config;
  d["pending_hot"] = e.pending_hot;
  d["pending_serial"] = e.pending_serial;
  d["path"] = e.path;
  d["plan_epoch"] = e.plan_epoch;
  d["phase"] = std::string(PhaseName(e.phase));
  d["reason"] = e.reason;
  d["error"] = e.error;
  return d;
}

PYBIND11_MODULE(_ptc, m) {
  m.doc() = "ptc client: save and load a training rank's state in ptcd.";
  error_type = PyErr_NewException("ptc.Error", PyExc_RuntimeError, nullptr);
  m.attr("Error") = py::handle(error_type);
  m.attr("MAX_SMALL_OBJECT_BYTES") = kMaxSmallObjectBytes;

  py::class_<ParallelConfig>(m, "ParallelConfig")
      .def_static(
          "parse",
          [](const std::string& text, std::vector<std::string> mesh) {
            return Value(ParallelConfig::Parse(
                text, mesh.empty() ? DefaultMesh() : mesh));
          },
          py::arg("text"), py::arg("mesh") = std::vector<std::string>{},
          "a config for a mesh of these axes (slowest first; default pp, "
          "dp, tp)")
      .def_property_readonly("tp", &ParallelConfig::tp)
      .def_property_readonly("pp", &ParallelConfig::pp)
      .def_property_readonly("dp", &ParallelConfig::dp)
      .def_readonly("mesh", &ParallelConfig::mesh)
      .def(
          "size",
          [](const ParallelConfig& c, const std::string& axis) {
            return c.size(axis);
          },
          py::arg("axis"),
           "degree of an axis (1 if the mesh lacks it)")
      .def_property_readonly("world_size", &ParallelConfig::world_size)
      .def(
          "coord_of",
          [](const ParallelConfig& c, int rank) {
            if (rank < 0 || rank >= c.world_size())
              Check(absl::OutOfRangeError(absl::StrCat(
                  "rank ", rank, " is outside ", c.world_size(), " ranks")));
            return CoordTuple(c, c.CoordOf(rank));
          },
          py::arg("rank"), "a rank's indices in mesh order ((pp, dp, tp))")
      .def(
          "rank_of",
          [](const ParallelConfig& c, py::args indices) {
            if (indices.size() != c.mesh.size())
              Check(absl::InvalidArgumentError(absl::StrCat(
                  "rank_of takes ", c.mesh.size(), " indices (",
                  absl::StrJoin(c.mesh, ", "), ")")));
            MeshCoord coord;
            coord.index.assign(c.axes.size(), 0);
            for (size_t i = 0; i < c.mesh.size(); ++i) {
              const int v = indices[i].cast<int>();
              const int a = c.AxisIndex(c.mesh[i]);
              if (v < 0 || v >= c.sizes[a])
                Check(absl::OutOfRangeError(absl::StrCat(
                    c.mesh[i], " index ", v, " is outside ", c.sizes[a])));
              coord.index[a] = v;
            }
            return c.RankOf(coord);
          },
          "the rank at these indices, in mesh order")
      .def(
          "stage_layers",
          [](const ParallelConfig& c, int stage, int num_layers) {
            Check(c.Validate(num_layers));
            return c.StageLayers(stage, num_layers);
          },
          py::arg("stage"), py::arg("num_layers"),
          "(first layer, number of layers) of a pipeline stage")
      .def("__str__", &ParallelConfig::ToString);

  m.def(
      "ranks_on_host",
      [](const std::string& coordinator, const std::string& job,
         const std::string& host) {
        const HostRanks r = Value(RanksOnHost(coordinator, job, host));
        py::list ranks;
        for (const auto& [rank, gpu] : r.ranks) {
          py::dict d;
          d["rank"] = rank;
          d["gpu"] = gpu;
          ranks.append(d);
        }
        py::dict out;
        out["config"] = r.config;
        out["world_size"] = r.world_size;
        out["layout_epoch"] = r.layout_epoch;
        out["ranks"] = ranks;
        return out;
      },
      py::arg("coordinator"), py::arg("job"), py::arg("host"),
      "the ranks of `job` that its placement puts on `host`, and their GPUs: "
      "{config, world_size, layout_epoch, ranks: [{rank, gpu}]}; what a "
      "host's launcher starts there (ptcctl ranks)");
  m.def(
      "report_process_exit",
      [](const std::string& coordinator, const std::string& job,
         const std::string& host, int gpu, int exit_code, int64_t epoch) {
        return Value(ReportProcessExit(coordinator, job, host, gpu, exit_code,
                                       epoch));
      },
      py::arg("coordinator"), py::arg("job"), py::arg("host"), py::arg("gpu"),
      py::arg("exit_code"), py::arg("layout_epoch"),
      "a host's agent: the process on `gpu` died under `layout_epoch` while "
      "its GPU had a rank; returns whether the coordinator changes the job");
  m.def(
      "check_layout",
      [](const std::string& json, const std::string& config) {
        const ModelSpec spec = Value(SpecFromJson(json));
        if (!config.empty()) {
          const ParallelConfig c = Value(spec.ParseConfig(config));
          Check(CheckConfig(spec, c));
        }
        return SpecToJson(spec);
      },
      py::arg("layout"), py::arg("config") = "",
      "validates a layout spec (JSON) and, with `config`, that the config "
      "can run it; returns the spec as ptc writes it. Raises ptc.Error "
      "naming the field");
  m.def(
      "layout_regions",
      [](const std::string& json, const std::string& config) {
        const ModelSpec spec = Value(SpecFromJson(json));
        const ParallelConfig c = Value(spec.ParseConfig(config));
        const Layout layout = Value(BuildLayout(spec, c));
        std::vector<std::vector<RankRegion>> by_rank(c.world_size());
        for (int t = 0; t < layout.num_tensors(); ++t) {
          const TensorSpec& ts = spec.tensors[t];
          for (const Shard& s : layout.shards(t)) {
            if (s.region.empty()) continue;
            by_rank[s.rank].push_back(
                {t, ts.key, ts.dtype, ts.shape, s.region,
                 s.region.volume() * ElementSize(ts.dtype)});
          }
        }
        py::list out;
        for (const std::vector<RankRegion>& regions : by_rank) {
          py::list rank;
          for (int i = 0; i < static_cast<int>(regions.size()); ++i)
            rank.append(RegionDict(i, regions[i]));
          out.append(rank);
        }
        return out;
      },
      py::arg("layout"), py::arg("config"),
      "every rank's regions of a layout spec (JSON) under a config, as "
      "Client.regions lists them, without a cluster");
  m.def(
      "buffer_view",
      [](const std::string& json, const std::string& config,
         const std::string& name, int rank) {
        const ModelSpec spec = Value(SpecFromJson(json));
        const ParallelConfig c = Value(spec.ParseConfig(config));
        const BufferView v = Value(ViewBuffer(spec, c, name, rank));
        py::list entries, buckets;
        for (const BufferView::Entry& e : v.entries) {
          py::dict d;
          d["key"] = spec.tensors[e.tensor].key;
          d["offset"] = e.offset;
          d["size"] = e.size;
          entries.append(d);
        }
        for (size_t k = 0; k < v.buckets.size(); ++k) {
          py::dict d;
          d["start"] = v.buckets[k].first;
          d["end"] = v.buckets[k].second;
          d["chunk"] = py::make_tuple(v.chunks[k].first, v.chunks[k].second);
          buckets.append(d);
        }
        py::dict out;
        out["in_use"] = v.in_use;
        out["shards"] = v.shards;
        out["index"] = v.index;
        out["entries"] = entries;
        out["buckets"] = buckets;
        return out;
      },
      py::arg("layout"), py::arg("config"), py::arg("buffer"), py::arg("rank"),
      "flat buffer `buffer` of a layout spec (JSON) as `rank` sees it under "
      "`config`: in_use, shards, index, entries [{key, offset, size}] "
      "(offset -1: not on this rank's stage) and buckets [{start, end, "
      "chunk}] (chunk: this rank's [lo, hi) in buffer coordinates)");
  m.def(
      "derived_seed",
      [](py::bytes b) -> std::optional<uint64_t> {
        return DerivedSeed(std::string(b));
      },
      py::arg("value"),
      "the seed ptc derived for a rank whose coordinates are new (an RNG "
      "state's small object), or None for bytes a rank saved itself");
  m.def(
      "derived_small_object",
      [](const std::string& job, const std::string& name,
         const std::string& derive_from, int64_t version) {
        return py::bytes(DerivedSmallObject(job, name, derive_from, version));
      },
      py::arg("job"), py::arg("name"), py::arg("derive_from"),
      py::arg("version"),
      "the value the store derives for small object `name` of job `job` for "
      "a rank whose coordinates (`derive_from`) are new, in `version`");
  m.def(
      "padded_vocab",
      [](const std::string& model, int tp) {
        return PaddedVocab(Value(ResolveArchitecture(model)), tp);
      },
      py::arg("model"), py::arg("tp"),
      "Megatron's padded vocabulary of a model at tensor parallelism tp");
  m.def(
      "model_tensors",
      [](const std::string& model) {
        const ModelSpec spec = Value(SpecForModel(model));
        py::list out;
        for (const TensorSpec& t : spec.tensors)
          out.append(py::make_tuple(
              t.key, std::string(DTypeName(t.dtype)),
              std::vector<int64_t>(t.shape.begin(), t.shape.end())));
        return out;
      },
      py::arg("model"), "(key, dtype, global shape) of every tensor");

  py::class_<DataCursor>(m, "DataCursor")
      .def(py::init([](uint64_t seed, int64_t dataset_size,
                       int64_t global_batch, int64_t consumed) {
             if (dataset_size < 1 || global_batch < 1 || consumed < 0)
               Check(absl::InvalidArgumentError(
                   "a cursor needs dataset_size >= 1, global_batch >= 1 and "
                   "consumed >= 0"));
             return DataCursor{seed, dataset_size, consumed, global_batch};
           }),
           py::arg("seed"), py::arg("dataset_size"), py::arg("global_batch"),
           py::arg("consumed") = 0)
      .def_readonly("seed", &DataCursor::seed)
      .def_readonly("dataset_size", &DataCursor::dataset_size)
      .def_readonly("consumed", &DataCursor::consumed)
      .def_property(
          "global_batch", [](const DataCursor& c) { return c.global_batch; },
          [](DataCursor& c, int64_t b) {
            if (b < 1)
              Check(absl::InvalidArgumentError("global_batch must be >= 1"));
            c.global_batch = b;
          })
      .def(
          "next_samples",
          [](const DataCursor& c, int dp_rank, int dp) {
            if (dp < 1 || dp_rank < 0 || dp_rank >= dp)
              Check(absl::InvalidArgumentError(absl::StrCat(
                  "dp_rank ", dp_rank, " is outside [0, ", dp, ")")));
            return NextSamples(c, dp_rank, dp);
          },
          py::arg("dp_rank"), py::arg("dp"),
          "sample indices this dp rank reads in the next global batch")
      .def("sample_at", &SampleAt, py::arg("position"))
      .def("advance", [](DataCursor& c) { Advance(&c); })
      .def("encode",
           [](const DataCursor& c) { return py::bytes(EncodeCursor(c)); })
      .def_static("decode", [](const py::bytes& b) {
        return Value(DecodeCursor(std::string(b)));
      });

  py::class_<Client::Save>(m, "Save")
      .def_property_readonly("version", &Client::Save::version)
      .def_property_readonly("step", &Client::Save::step)
      .def(
          "write",
          [](Client::Save& s, int i, py::buffer data) {
            py::buffer_info info = data.request();
            CheckDense(info);
            const absl::Span<const uint8_t> bytes(
                static_cast<const uint8_t*>(info.ptr),
                static_cast<size_t>(info.size * info.itemsize));
            Unlocked([&] { return s.Write(i, bytes); });
          },
          py::arg("index"), py::arg("data"),
          "copies a C-contiguous buffer (numpy array, torch tensor via "
          ".numpy()) into region `index` of the save")
      .def(
          "put_small_object",
          [](Client::Save& s, const std::string& name, const py::bytes& b) {
            Check(s.PutSmallObject(name, std::string(b)));
          },
          py::arg("name"), py::arg("data"))
      .def("commit", [](Client::Save& s) {
        return Unlocked([&] { return s.Commit(); });
      });

  py::class_<Client::State>(m, "State")
      .def_property_readonly("version", &Client::State::version)
      .def(
          "region",
          [](py::object self, int i) {
            const Client::State& s = self.cast<const Client::State&>();
            if (i < 0 || i >= static_cast<int>(s.regions().size()))
              Check(absl::OutOfRangeError(
                  absl::StrCat("region ", i, " is outside this rank's ",
                               s.regions().size(), " regions")));
            const RankRegion& r = s.regions()[i];
            absl::Span<const uint8_t> bytes =
                Unlocked([&] { return s.Region(i); });
            // A read-only view of the mapped buffer; it keeps the State.
            py::array a(NumpyDType(r.dtype), RegionShape(r.region),
                        bytes.data(), self);
            py::detail::array_proxy(a.ptr())->flags &=
                ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
            return a;
          },
          py::arg("index"),
          "a read-only numpy view of region `index` (no copy); valid while "
          "any view or the State lives")
      .def(
          "read_into",
          [](const Client::State& s, int i, py::buffer out) {
            py::buffer_info info = out.request(/*writable=*/true);
            CheckDense(info);
            const absl::Span<uint8_t> dst(
                static_cast<uint8_t*>(info.ptr),
                static_cast<size_t>(info.size * info.itemsize));
            Unlocked([&] { return s.Read(i, dst); });
          },
          py::arg("index"), py::arg("out"),
          "copies region `index` into `out` (a writable C-contiguous "
          "buffer of exactly its bytes: numpy array, CPU tensor via "
          ".numpy()) without mapping it; faster than copying from "
          "region(index) where the copy is all that is needed")
      .def("checksum", &Client::State::Checksum, py::arg("index"))
      .def("inode", [](const Client::State& s,
                       int i) { return static_cast<uint64_t>(s.Inode(i)); })
      .def("small_object", [](const Client::State& s, const std::string& n) {
        return py::bytes(Value(s.SmallObject(n)));
      });

  // GPU copies (see client/device_copies.h); addresses and streams are
  // integers (torch: tensor.data_ptr(), current_stream().cuda_stream).
  py::class_<DeviceCopies>(m, "DeviceCopies")
      .def(py::init([](int device) {
             return Value(DeviceCopies::Create(device));
           }),
           py::arg("device"),
           "a side stream on GPU `device`; raises ptc.Error (UNAVAILABLE) "
           "where CUDA has no driver or GPU")
      .def_property_readonly("device", &DeviceCopies::device)
      .def(
          "save",
          [](DeviceCopies& c, Client::Save& s, int i, uintptr_t src,
             uint64_t bytes, uintptr_t after) {
            Check(c.Save(s, i, src, bytes, after));
          },
          py::arg("save"), py::arg("index"), py::arg("src"), py::arg("bytes"),
          py::arg("after") = 0,
          // The save's mappings outlive the copies into them.
          py::keep_alive<1, 2>(),
          "queues a copy of contiguous GPU memory `src` into region `index` "
          "of the save, after the work queued on stream `after`")
      .def(
          "load",
          [](DeviceCopies& c, const Client::State& s, int i, uintptr_t dst,
             uint64_t bytes, uintptr_t after) {
            Check(c.Load(s, i, dst, bytes, after));
          },
          py::arg("state"), py::arg("index"), py::arg("dst"), py::arg("bytes"),
          py::arg("after") = 0, py::keep_alive<1, 2>(),
          "queues a copy of loaded region `index` into contiguous GPU memory "
          "`dst`, after the work queued on stream `after`")
      .def(
          "finish",
          [](DeviceCopies& c) {
            const DeviceCopies::Stats st =
                Unlocked([&] { return c.Finish(); });
            py::dict d;
            d["regions"] = st.regions;
            d["bytes"] = st.bytes;
            d["pageable_regions"] = st.pageable_regions;
            d["pageable_reason"] = st.pageable_reason;
            d["register_seconds"] = st.register_seconds;
            d["seconds"] = st.seconds;
            return d;
          },
          "waits for the queued copies and unregisters the mappings (before "
          "a save's commit, before loaded memory is used); returns what they "
          "did");

  py::class_<Client>(m, "Client")
      .def(
          py::init([](const std::string& socket, const std::string& coordinator,
                      const std::string& job, int rank,
                      const std::string& token, int64_t pending_serial) {
            ClientOptions o;
            o.socket_path = socket;
            o.coordinator = coordinator;
            o.job = job;
            o.rank = rank;
            o.token = token;
            o.pending_serial = pending_serial;
            return Unlocked([&] { return Client::Connect(std::move(o)); });
          }),
          py::arg("socket"), py::arg("coordinator"), py::arg("job"),
          py::arg("rank"), py::arg("token") = "", py::arg("pending_serial") = 0,
          "token: the job's token (ptcctl token); empty: $PTC_JOB_TOKEN. "
          "pending_serial: bind to the job's pending hot switch (its target "
          "layout; a save is the switch's)")
      .def(
          "hot_plan",
          [](Client& c, int64_t serial) {
            Client::HotSwitch h =
                Unlocked([&] { return c.PlanHotSwitch(serial); });
            py::dict d;
            d["config"] = h.config;
            d["process_of"] = h.process_of;
            py::list transfers;
            for (const ProcessTransfer& x : h.plan.transfers) {
              std::vector<std::pair<int64_t, int64_t>> box;
              for (int i = 0; i < x.region.rank(); ++i)
                box.push_back({x.region.dim(i).begin, x.region.dim(i).end});
              transfers.append(py::make_tuple(c.spec().tensors[x.tensor].key, box,
                                              x.source_rank, x.target_rank));
            }
            d["transfers"] = transfers;
            py::list small;
            for (const SmallObjectMove& m : h.plan.small_objects) {
              py::dict o;
              o["name"] = m.name;
              o["target_rank"] = m.target_rank;
              o["source_rank"] = m.source_rank;
              o["derive_from"] = m.derive_from;
              small.append(o);
            }
            d["small_objects"] = small;
            d["bytes"] = h.plan.bytes;
            d["bytes_between_processes"] = h.plan.bytes_between_processes;
            d["bytes_between_hosts"] = h.plan.bytes_between_hosts;
            d["host_plan_cross_host_bytes"] = h.plan.host_plan.cross_host_bytes;
            return d;
          },
          py::arg("serial"),
          "the plan of the job's pending hot switch between its processes: "
          "{config, process_of (per target rank, the rank of this layout "
          "whose process runs on its GPU), transfers [(key, region, "
          "source_rank, target_rank)], small_objects [{name, target_rank, "
          "source_rank, derive_from}], bytes, bytes_between_processes, "
          "bytes_between_hosts}")
      .def("refresh", [](Client& c) { Unlocked([&] { return c.Refresh(); }); })
      .def(
          "rebind",
          [](Client& c, int rank) {
            Unlocked([&] { return c.Rebind(rank); });
          },
          py::arg("rank"),
          "becomes `rank` of the job's current config (a live process after "
          "a change) and re-reads the job")
      .def("follow", &Client::Follow,
           "follows the job in the background (the coordinator's Watch "
           "stream); `event` is then its newest state")
      .def("unfollow", [](Client& c) { Unlocked([&] {
             c.Unfollow();
             return absl::OkStatus();
           }); },
           "stops following (event keeps the last state)")
      .def_property_readonly(
          "event", [](const Client& c) { return EventDict(c.LatestEvent()); },
          "the job as Follow last saw it: {known, layout_epoch, "
          "committed_version, pending_config, plan_epoch, phase, reason, "
          "error}")
      .def(
          "fetch_event",
          [](Client& c) {
            return EventDict(Unlocked([&] { return c.FetchEvent(); }));
          },
          "the job's state now, as `event` has it (one call to the "
          "coordinator)")
      .def(
          "rendezvous",
          [](Client& c, int64_t epoch, int port, double timeout_s) {
            return Unlocked([&] {
              return c.Rendezvous(epoch, port, absl::Seconds(timeout_s));
            });
          },
          py::arg("layout_epoch"), py::arg("port") = 0,
          py::arg("timeout") = 120.0,
          "meets the job's other processes under a layout epoch: rank 0 "
          "offers the port of its process group store; every rank waits "
          "until all of the epoch's ranks are there at once; returns the "
          "store's host:port (an error once the job has another layout "
          "epoch, or after `timeout` seconds, naming the ranks missing)")
      .def_property_readonly("job", &Client::job)
      .def_property_readonly("rank", &Client::rank)
      .def_property_readonly("host", &Client::host)
      .def_property_readonly("device", &Client::device,
                             "this rank's GPU on its host, from the job's "
                             "placement (-1: none placed)")
      .def_property_readonly("world_size", &Client::world_size)
      .def_property_readonly("config", &Client::config)
      .def_property_readonly(
          "coord",
          [](const Client& c) { return CoordTuple(c.config(), c.coord()); })
      .def_property_readonly(
          "mesh", [](const Client& c) { return c.config().mesh; })
      .def_property_readonly("committed_version", &Client::committed_version)
      .def_property_readonly("committed_step", &Client::committed_step)
      .def_property_readonly("layout_epoch", &Client::layout_epoch)
      .def_property_readonly(
          "layout", [](const Client& c) { return SpecToJson(c.spec()); },
          "the job's layout spec as JSON (as registered, or generated from "
          "its model name)")
      .def_property_readonly(
          "num_layers", [](const Client& c) { return c.spec().num_layers; })
      .def_property_readonly(
          "small_object_names",
          [](const Client& c) {
            std::vector<std::string> names;
            for (const SmallObjectSpec& o : c.spec().small_objects)
              names.push_back(o.name);
            return names;
          })
      .def_property_readonly(
          "regions",
          [](const Client& c) {
            py::list out;
            for (int i = 0; i < static_cast<int>(c.regions().size()); ++i)
              out.append(RegionDict(i, c.regions()[i]));
            return out;
          })
      .def(
          "begin_save",
          [](Client& c, int64_t step) {
            return Unlocked([&] { return c.BeginSave(step); });
          },
          py::arg("step"), py::keep_alive<0, 1>())
      .def(
          "load", [](Client& c) { return Unlocked([&] { return c.Load(); }); },
          py::keep_alive<0, 1>())
      .def(
          "wait_committed",
          [](Client& c, int64_t version, double timeout_s) {
            Unlocked([&] {
              return c.WaitCommitted(version, absl::Seconds(timeout_s));
            });
          },
          py::arg("version"), py::arg("timeout") = 60.0);
}

}  // namespace ptc
