// The C ABI of the client library (client/c_api.h): each function converts
// its arguments, calls the C++ library, and turns a status into a code and
// the thread's last error. Nothing here decides anything the C++ library
// does not; structured results are written with common/json_writer.
#include "client/c_api.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "client/device_copies.h"
#include "common/json_writer.h"
#include "common/status_macros.h"
#include "proto/enum_names.h"
#include "ptc/data_cursor.h"
#include "ptc/families.h"
#include "ptc/layout.h"
#include "ptc/layout_spec_proto.h"
#include "ptc/model_spec.h"
#include "ptc/parallel_config.h"
#include "ptc/small_object.h"

// Handles may be freed in any order (a garbage collector chooses it): a
// save or state keeps its client alive (the deleter holds it), and GPU
// copies keep the saves and states they copy into or from until finished.
struct ptc_client {
  std::shared_ptr<ptc::Client> client;
};
struct ptc_follower {
  std::unique_ptr<ptc::JobFollower> follower;
};
struct ptc_save {
  std::shared_ptr<ptc::Client::Save> save;
};
struct ptc_state {
  std::shared_ptr<ptc::Client::State> state;
};
struct ptc_gpu {
  // Declared first, released last: after `copies` waited for its copies.
  std::vector<std::shared_ptr<const void>> pending;
  std::unique_ptr<ptc::DeviceCopies> copies;
};
struct ptc_config {
  ptc::ParallelConfig config;
};

namespace ptc {
namespace {

thread_local std::string last_error;

int Fail(const absl::Status& s) {
  last_error = std::string(s.message());
  return static_cast<int>(s.code());
}

// Runs `fn` (returning absl::Status), turning a status or a C++ exception
// into a code: nothing is thrown across the C boundary.
template <typename Fn>
int Call(Fn fn) {
  try {
    const absl::Status s = fn();
    if (s.ok()) return 0;
    return Fail(s);
  } catch (const std::exception& e) {
    return Fail(absl::InternalError(absl::StrCat("ptc: ", e.what())));
  } catch (...) {
    return Fail(absl::InternalError("ptc: unknown C++ exception"));
  }
}

// `owned`, deleted with a reference to `client` held until then.
template <typename T>
std::shared_ptr<T> KeepingClient(std::unique_ptr<T> owned,
                                 std::shared_ptr<Client> client) {
  return std::shared_ptr<T>(owned.release(),
                            [client = std::move(client)](T* p) { delete p; });
}

absl::Status Null(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " is NULL"));
}

void Give(const std::string& s, ptc_bytes* out) {
  out->size = s.size();
  out->data = static_cast<char*>(std::malloc(s.size() + 1));
  if (out->data == nullptr) std::abort();  // as operator new would
  std::memcpy(out->data, s.data(), s.size());
  out->data[s.size()] = '\0';
}

std::vector<std::string> Mesh(const char* mesh) {
  if (mesh == nullptr || *mesh == '\0') return DefaultMesh();
  return absl::StrSplit(mesh, ',');
}

void WriteInts(JsonWriter& w, const std::vector<int>& v) {
  w.BeginArray();
  for (int x : v) w.Int(x);
  w.EndArray();
}

void WriteStrings(JsonWriter& w, const std::vector<std::string>& v) {
  w.BeginArray();
  for (const std::string& s : v) w.String(s);
  w.EndArray();
}

// A rank's region as Client.regions lists it (client/python/ptc/_capi.py).
void WriteRegion(JsonWriter& w, int index, const RankRegion& r) {
  w.BeginObject();
  w.Key("index").Int(index);
  w.Key("tensor").Int(r.tensor);
  w.Key("key").String(r.key);
  w.Key("dtype").String(DTypeName(r.dtype));
  w.Key("shape").BeginArray();
  for (int64_t d : r.shape) w.Int(d);
  w.EndArray();
  w.Key("region").BeginArray();
  for (int i = 0; i < r.region.rank(); ++i) {
    w.BeginArray().Int(r.region.dim(i).begin).Int(r.region.dim(i).end);
    w.EndArray();
  }
  w.EndArray();
  w.Key("bytes").Int(r.bytes);
  w.EndObject();
}

void WriteRegions(JsonWriter& w, const std::vector<RankRegion>& regions) {
  w.BeginArray();
  for (int i = 0; i < static_cast<int>(regions.size()); ++i)
    WriteRegion(w, i, regions[i]);
  w.EndArray();
}

std::vector<int> CoordIndices(const ParallelConfig& c, const MeshCoord& coord) {
  std::vector<int> out;
  for (const std::string& axis : c.mesh) out.push_back(c.IndexOn(coord, axis));
  return out;
}

std::string EventJson(const JobEvent& e) {
  JsonWriter w;
  w.BeginObject();
  w.Key("known").Bool(e.known);
  w.Key("layout_epoch").Int(e.layout_epoch);
  w.Key("committed_version").Int(e.committed_version);
  w.Key("dropped_save").Int(e.dropped_save);
  w.Key("pending_config").String(e.pending_config);
  w.Key("pending_hot").Bool(e.pending_hot);
  w.Key("pending_serial").Int(e.pending_serial);
  w.Key("path").String(e.path);
  w.Key("plan_epoch").Int(e.plan_epoch);
  w.Key("phase").String(PhaseName(e.phase));
  w.Key("reason").String(e.reason);
  w.Key("error").String(e.error);
  w.Key("received").Int(e.received);
  w.EndObject();
  return w.str();
}

absl::Status CheckCursor(const ptc_cursor* c) {
  if (c == nullptr) return Null("cursor");
  if (c->dataset_size < 1 || c->global_batch < 1 || c->consumed < 0) {
    return absl::InvalidArgumentError(
        "a cursor needs dataset_size >= 1, global_batch >= 1 and consumed >= "
        "0");
  }
  return absl::OkStatus();
}

absl::Status CheckIndex(const ptc_state* s, int index) {
  if (s == nullptr) return Null("state");
  const int n = static_cast<int>(s->state->regions().size());
  if (index < 0 || index >= n) {
    return absl::OutOfRangeError(absl::StrCat(
        "region ", index, " is outside this rank's ", n, " regions"));
  }
  return absl::OkStatus();
}

DataCursor ToCursor(const ptc_cursor* c) {
  return DataCursor{c->seed, c->dataset_size, c->consumed, c->global_batch};
}

// ptc_ranks_on_host's answer: {config, world_size, ..., ranks: [{rank, gpu}]}.
std::string HostRanksJson(const HostRanks& r) {
  JsonWriter w;
  w.BeginObject();
  w.Key("config").String(r.config);
  w.Key("world_size").Int(r.world_size);
  w.Key("layout_epoch").Int(r.layout_epoch);
  w.Key("committed_version").Int(r.committed_version);
  w.Key("phase").String(PhaseName(r.phase));
  w.Key("live").Bool(r.live);
  w.Key("rank0_host_address").String(r.rank0_host_address);
  w.Key("ranks").BeginArray();
  for (const auto& [rank, gpu] : r.ranks) {
    w.BeginObject().Key("rank").Int(rank).Key("gpu").Int(gpu).EndObject();
  }
  w.EndArray();
  w.EndObject();
  return w.str();
}

}  // namespace
}  // namespace ptc

using ptc::Call;
using ptc::CheckIndex;
using ptc::Give;
using ptc::JsonWriter;
using ptc::Null;

extern "C" {

int ptc_api_version(void) { return PTC_C_API_VERSION; }

const char* ptc_last_error(void) { return ptc::last_error.c_str(); }

void ptc_bytes_free(ptc_bytes* b) {
  if (b == nullptr) return;
  std::free(b->data);
  b->data = nullptr;
  b->size = 0;
}

int64_t ptc_max_small_object_bytes(void) { return ptc::kMaxSmallObjectBytes; }

int ptc_config_parse(const char* text, const char* mesh, ptc_config** out) {
  return Call([&]() -> absl::Status {
    if (text == nullptr || out == nullptr) return Null("text or out");
    PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig c,
                         ptc::ParallelConfig::Parse(text, ptc::Mesh(mesh)));
    *out = new ptc_config{std::move(c)};
    return absl::OkStatus();
  });
}

void ptc_config_free(ptc_config* c) { delete c; }

int ptc_config_describe(const ptc_config* c, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || json == nullptr) return Null("config or out");
    const ptc::ParallelConfig& p = c->config;
    JsonWriter w;
    w.BeginObject();
    w.Key("text").String(p.ToString());
    w.Key("mesh");
    ptc::WriteStrings(w, p.mesh);
    std::vector<int> sizes;
    for (const std::string& axis : p.mesh) sizes.push_back(p.size(axis));
    w.Key("sizes");
    ptc::WriteInts(w, sizes);
    w.Key("world_size").Int(p.world_size());
    w.Key("tp").Int(p.tp());
    w.Key("pp").Int(p.pp());
    w.Key("dp").Int(p.dp());
    w.EndObject();
    Give(w.str(), json);
    return absl::OkStatus();
  });
}

int ptc_config_coord_of(const ptc_config* c, int rank, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || json == nullptr) return Null("config or out");
    const ptc::ParallelConfig& p = c->config;
    if (rank < 0 || rank >= p.world_size()) {
      return absl::OutOfRangeError(absl::StrCat(
          "rank ", rank, " is outside ", p.world_size(), " ranks"));
    }
    JsonWriter w;
    ptc::WriteInts(w, ptc::CoordIndices(p, p.CoordOf(rank)));
    Give(w.str(), json);
    return absl::OkStatus();
  });
}

int ptc_config_rank_of(const ptc_config* c, const int* indices, int n,
                       int* rank) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || rank == nullptr || (n > 0 && indices == nullptr))
      return Null("config, indices or out");
    const ptc::ParallelConfig& p = c->config;
    if (n != static_cast<int>(p.mesh.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank_of takes ", p.mesh.size(), " indices (",
                       absl::StrJoin(p.mesh, ", "), ")"));
    }
    ptc::MeshCoord coord;
    coord.index.assign(p.axes.size(), 0);
    for (int i = 0; i < n; ++i) {
      const int a = p.AxisIndex(p.mesh[i]);
      if (indices[i] < 0 || indices[i] >= p.sizes[a]) {
        return absl::OutOfRangeError(absl::StrCat(
            p.mesh[i], " index ", indices[i], " is outside ", p.sizes[a]));
      }
      coord.index[a] = indices[i];
    }
    *rank = p.RankOf(coord);
    return absl::OkStatus();
  });
}

int ptc_config_stage_layers(const ptc_config* c, int stage, int num_layers,
                            int* first, int* count) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || first == nullptr || count == nullptr)
      return Null("config or out");
    PTC_RETURN_IF_ERROR(c->config.Validate(num_layers));
    if (stage < 0 || stage >= c->config.pp()) {
      return absl::OutOfRangeError(absl::StrCat(
          "stage ", stage, " is outside ", c->config.pp(), " stages"));
    }
    const auto [f, n] = c->config.StageLayers(stage, num_layers);
    *first = f;
    *count = n;
    return absl::OkStatus();
  });
}

int ptc_check_layout(const char* layout_json, const char* config,
                     ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (layout_json == nullptr || json == nullptr) return Null("layout or out");
    PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromJson(layout_json));
    if (config != nullptr && *config != '\0') {
      PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig c, spec.ParseConfig(config));
      PTC_RETURN_IF_ERROR(ptc::CheckConfig(spec, c));
    }
    Give(ptc::SpecToJson(spec), json);
    return absl::OkStatus();
  });
}

int ptc_layout_regions(const char* layout_json, const char* config,
                       ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (layout_json == nullptr || config == nullptr || json == nullptr)
      return Null("layout, config or out");
    PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromJson(layout_json));
    PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig c, spec.ParseConfig(config));
    PTC_ASSIGN_OR_RETURN(ptc::Layout layout, ptc::BuildLayout(spec, c));
    std::vector<std::vector<ptc::RankRegion>> by_rank(c.world_size());
    for (int t = 0; t < layout.num_tensors(); ++t) {
      const ptc::TensorSpec& ts = spec.tensors[t];
      for (const ptc::Shard& s : layout.shards(t)) {
        if (s.region.empty()) continue;
        by_rank[s.rank].push_back(
            {t, ts.key, ts.dtype, ts.shape, s.region,
             s.region.volume() * ptc::ElementSize(ts.dtype)});
      }
    }
    JsonWriter w;
    w.BeginArray();
    for (const auto& regions : by_rank) ptc::WriteRegions(w, regions);
    w.EndArray();
    Give(w.str(), json);
    return absl::OkStatus();
  });
}

int ptc_buffer_view(const char* layout_json, const char* config,
                    const char* buffer, int rank, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (layout_json == nullptr || config == nullptr || buffer == nullptr ||
        json == nullptr)
      return Null("layout, config, buffer or out");
    PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromJson(layout_json));
    PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig c, spec.ParseConfig(config));
    PTC_ASSIGN_OR_RETURN(ptc::BufferView v,
                         ptc::ViewBuffer(spec, c, buffer, rank));
    JsonWriter w;
    w.BeginObject();
    w.Key("in_use").Bool(v.in_use);
    w.Key("shards").Int(v.shards);
    w.Key("index").Int(v.index);
    w.Key("entries").BeginArray();
    for (const ptc::BufferView::Entry& e : v.entries) {
      w.BeginObject();
      w.Key("key").String(spec.tensors[e.tensor].key);
      w.Key("offset").Int(e.offset);
      w.Key("size").Int(e.size);
      w.EndObject();
    }
    w.EndArray();
    w.Key("buckets").BeginArray();
    for (size_t k = 0; k < v.buckets.size(); ++k) {
      w.BeginObject();
      w.Key("start").Int(v.buckets[k].first);
      w.Key("end").Int(v.buckets[k].second);
      w.Key("chunk").BeginArray().Int(v.chunks[k].first).Int(v.chunks[k].second);
      w.EndArray();
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
    Give(w.str(), json);
    return absl::OkStatus();
  });
}

int ptc_derived_seed(const char* bytes, size_t size, int* has,
                     uint64_t* seed) {
  return Call([&]() -> absl::Status {
    if ((bytes == nullptr && size > 0) || has == nullptr || seed == nullptr)
      return Null("bytes or out");
    const std::optional<uint64_t> s =
        ptc::DerivedSeed(absl::string_view(bytes, size));
    *has = s.has_value();
    *seed = s.value_or(0);
    return absl::OkStatus();
  });
}

int ptc_derived_small_object(const char* job, const char* name,
                             const char* derive_from, int64_t version,
                             ptc_bytes* out) {
  return Call([&]() -> absl::Status {
    if (job == nullptr || name == nullptr || derive_from == nullptr ||
        out == nullptr)
      return Null("job, name, derive_from or out");
    Give(ptc::DerivedSmallObject(job, name, derive_from, version), out);
    return absl::OkStatus();
  });
}

int ptc_padded_vocab(const char* model, int tp, int64_t* out) {
  return Call([&]() -> absl::Status {
    if (model == nullptr || out == nullptr) return Null("model or out");
    if (tp < 1) return absl::InvalidArgumentError("tp must be >= 1");
    PTC_ASSIGN_OR_RETURN(ptc::Architecture arch,
                         ptc::ResolveArchitecture(model));
    *out = ptc::PaddedVocab(arch, tp);
    return absl::OkStatus();
  });
}

int ptc_model_tensors(const char* model, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (model == nullptr || json == nullptr) return Null("model or out");
    PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecForModel(model));
    JsonWriter w;
    w.BeginArray();
    for (const ptc::TensorSpec& t : spec.tensors) {
      w.BeginArray().String(t.key).String(ptc::DTypeName(t.dtype)).BeginArray();
      for (int64_t d : t.shape) w.Int(d);
      w.EndArray().EndArray();
    }
    w.EndArray();
    Give(w.str(), json);
    return absl::OkStatus();
  });
}

int ptc_cursor_next_samples(const ptc_cursor* c, int dp_rank, int dp,
                            ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    PTC_RETURN_IF_ERROR(ptc::CheckCursor(c));
    if (json == nullptr) return Null("out");
    if (dp < 1 || dp_rank < 0 || dp_rank >= dp) {
      return absl::InvalidArgumentError(
          absl::StrCat("dp_rank ", dp_rank, " is outside [0, ", dp, ")"));
    }
    JsonWriter w;
    w.BeginArray();
    for (int64_t s : ptc::NextSamples(ptc::ToCursor(c), dp_rank, dp)) w.Int(s);
    w.EndArray();
    Give(w.str(), json);
    return absl::OkStatus();
  });
}

int ptc_cursor_sample_at(const ptc_cursor* c, int64_t position, int64_t* out) {
  return Call([&]() -> absl::Status {
    PTC_RETURN_IF_ERROR(ptc::CheckCursor(c));
    if (out == nullptr) return Null("out");
    if (position < 0)
      return absl::InvalidArgumentError("a position must be >= 0");
    *out = ptc::SampleAt(ptc::ToCursor(c), position);
    return absl::OkStatus();
  });
}

int ptc_cursor_advance(ptc_cursor* c) {
  return Call([&]() -> absl::Status {
    PTC_RETURN_IF_ERROR(ptc::CheckCursor(c));
    ptc::DataCursor d = ptc::ToCursor(c);
    ptc::Advance(&d);
    c->consumed = d.consumed;
    return absl::OkStatus();
  });
}

int ptc_cursor_encode(const ptc_cursor* c, ptc_bytes* out) {
  return Call([&]() -> absl::Status {
    PTC_RETURN_IF_ERROR(ptc::CheckCursor(c));
    if (out == nullptr) return Null("out");
    Give(ptc::EncodeCursor(ptc::ToCursor(c)), out);
    return absl::OkStatus();
  });
}

int ptc_cursor_decode(const char* bytes, size_t size, ptc_cursor* out) {
  return Call([&]() -> absl::Status {
    if ((bytes == nullptr && size > 0) || out == nullptr)
      return Null("bytes or out");
    PTC_ASSIGN_OR_RETURN(ptc::DataCursor d,
                         ptc::DecodeCursor(absl::string_view(bytes, size)));
    *out = ptc_cursor{d.seed, d.dataset_size, d.consumed, d.global_batch};
    return absl::OkStatus();
  });
}

int ptc_ranks_on_host(const char* coordinator, const char* job,
                      const char* host, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (coordinator == nullptr || job == nullptr || host == nullptr ||
        json == nullptr)
      return Null("coordinator, job, host or out");
    PTC_ASSIGN_OR_RETURN(ptc::HostRanks r,
                         ptc::RanksOnHost(coordinator, job, host));
    Give(ptc::HostRanksJson(r), json);
    return absl::OkStatus();
  });
}

int ptc_ranks_on_host_local(const char* socket, const char* coordinator,
                            const char* job, const char* host,
                            ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (socket == nullptr || coordinator == nullptr || job == nullptr ||
        host == nullptr || json == nullptr)
      return Null("socket, coordinator, job, host or out");
    PTC_ASSIGN_OR_RETURN(
        ptc::HostRanks r,
        ptc::RanksOnHost(coordinator, job, host, absl::Seconds(30), socket));
    Give(ptc::HostRanksJson(r), json);
    return absl::OkStatus();
  });
}

int ptc_client_ranks_on_host(ptc_client* c, const char* host, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || host == nullptr || json == nullptr)
      return Null("client, host or out");
    PTC_ASSIGN_OR_RETURN(ptc::HostRanks r, c->client->RanksOn(host));
    Give(ptc::HostRanksJson(r), json);
    return absl::OkStatus();
  });
}

int ptc_follower_open(const char* coordinator, const char* job,
                      ptc_follower** out) {
  return Call([&]() -> absl::Status {
    if (coordinator == nullptr || job == nullptr || out == nullptr)
      return Null("coordinator, job or out");
    *out =
        new ptc_follower{std::make_unique<ptc::JobFollower>(coordinator, job)};
    return absl::OkStatus();
  });
}

void ptc_follower_free(ptc_follower* f) { delete f; }

int ptc_follower_event(const ptc_follower* f, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (f == nullptr || json == nullptr) return Null("follower or out");
    Give(ptc::EventJson(f->follower->Latest()), json);
    return absl::OkStatus();
  });
}

int ptc_follower_ranks_on_host(ptc_follower* f, const char* host,
                               ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (f == nullptr || host == nullptr || json == nullptr)
      return Null("follower, host or out");
    PTC_ASSIGN_OR_RETURN(ptc::HostRanks r, f->follower->RanksOn(host));
    Give(ptc::HostRanksJson(r), json);
    return absl::OkStatus();
  });
}

int ptc_report_process_exit(const char* coordinator, const char* job,
                            const char* host, int gpu, int exit_code,
                            int64_t layout_epoch, int* changes) {
  return Call([&]() -> absl::Status {
    if (coordinator == nullptr || job == nullptr || host == nullptr ||
        changes == nullptr)
      return Null("coordinator, job, host or out");
    PTC_ASSIGN_OR_RETURN(bool c,
                         ptc::ReportProcessExit(coordinator, job, host, gpu,
                                                exit_code, layout_epoch));
    *changes = c;
    return absl::OkStatus();
  });
}

int ptc_client_connect(const char* socket, const char* coordinator,
                       const char* job, int rank, const char* token,
                       int64_t pending_serial, ptc_client** out) {
  return Call([&]() -> absl::Status {
    if (socket == nullptr || coordinator == nullptr || job == nullptr ||
        out == nullptr)
      return Null("socket, coordinator, job or out");
    ptc::ClientOptions o;
    o.socket_path = socket;
    o.coordinator = coordinator;
    o.job = job;
    o.rank = rank;
    o.token = token == nullptr ? "" : token;
    o.pending_serial = pending_serial;
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::Client> c,
                         ptc::Client::Connect(std::move(o)));
    *out = new ptc_client{std::move(c)};
    return absl::OkStatus();
  });
}

void ptc_client_free(ptc_client* c) { delete c; }

void ptc_client_numbers(const ptc_client* c, int64_t* out7) {
  if (out7 == nullptr) return;
  if (c == nullptr) {
    std::fill(out7, out7 + 7, 0);
    return;
  }
  const ptc::Client& x = *c->client;
  const int64_t v[7] = {x.rank(),          x.device(),
                        x.world_size(),    x.committed_version(),
                        x.committed_step(), x.layout_epoch(),
                        x.spec().num_layers};
  std::memcpy(out7, v, sizeof(v));
}

int ptc_client_describe(const ptc_client* c, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || json == nullptr) return Null("client or out");
    const ptc::Client& x = *c->client;
    JsonWriter w;
    w.BeginObject();
    w.Key("job").String(x.job());
    w.Key("host").String(x.host());
    w.Key("relayed").Bool(x.relayed());
    w.Key("config").String(x.config().ToString());
    w.Key("mesh");
    ptc::WriteStrings(w, x.config().mesh);
    w.Key("coord");
    ptc::WriteInts(w, ptc::CoordIndices(x.config(), x.coord()));
    std::vector<std::string> names;
    for (const ptc::SmallObjectSpec& o : x.spec().small_objects)
      names.push_back(o.name);
    w.Key("small_object_names");
    ptc::WriteStrings(w, names);
    w.Key("regions");
    ptc::WriteRegions(w, x.regions());
    w.EndObject();
    Give(w.str(), json);
    return absl::OkStatus();
  });
}

int ptc_client_config(const ptc_client* c, ptc_config** out) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || out == nullptr) return Null("client or out");
    *out = new ptc_config{c->client->config()};
    return absl::OkStatus();
  });
}

int ptc_client_layout(const ptc_client* c, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || json == nullptr) return Null("client or out");
    Give(ptc::SpecToJson(c->client->spec()), json);
    return absl::OkStatus();
  });
}

int ptc_client_refresh(ptc_client* c) {
  return Call([&] { return c ? c->client->Refresh() : Null("client"); });
}

int ptc_client_rebind(ptc_client* c, int rank) {
  return Call([&] { return c ? c->client->Rebind(rank) : Null("client"); });
}

int ptc_client_rebind_device(ptc_client* c, int device, int* rank) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || rank == nullptr) return Null("client or out");
    PTC_ASSIGN_OR_RETURN(*rank, c->client->RebindToDevice(device));
    return absl::OkStatus();
  });
}

int ptc_client_follow(ptc_client* c) {
  return Call([&]() -> absl::Status {
    if (c == nullptr) return Null("client");
    c->client->Follow();
    return absl::OkStatus();
  });
}

int ptc_client_unfollow(ptc_client* c) {
  return Call([&]() -> absl::Status {
    if (c == nullptr) return Null("client");
    c->client->Unfollow();
    return absl::OkStatus();
  });
}

int ptc_client_event(const ptc_client* c, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || json == nullptr) return Null("client or out");
    Give(ptc::EventJson(c->client->LatestEvent()), json);
    return absl::OkStatus();
  });
}

int ptc_client_wait_event(const ptc_client* c, int64_t after, double timeout_s,
                          ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || json == nullptr) return Null("client or out");
    if (!(timeout_s >= 0 && timeout_s <= 3600)) {
      return absl::InvalidArgumentError(
          "the timeout must be from 0 to 3600 seconds");
    }
    Give(ptc::EventJson(c->client->WaitEvent(after, absl::Seconds(timeout_s))),
         json);
    return absl::OkStatus();
  });
}

int ptc_client_fetch_event(ptc_client* c, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || json == nullptr) return Null("client or out");
    PTC_ASSIGN_OR_RETURN(ptc::JobEvent e, c->client->FetchEvent());
    Give(ptc::EventJson(e), json);
    return absl::OkStatus();
  });
}

int ptc_client_fetch_event_within(ptc_client* c, double timeout_s,
                                  ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || json == nullptr) return Null("client or out");
    if (!(timeout_s > 0 && timeout_s <= 3600)) {
      return absl::InvalidArgumentError(
          "the timeout must be more than 0 and at most 3600 seconds");
    }
    PTC_ASSIGN_OR_RETURN(ptc::JobEvent e,
                         c->client->FetchEvent(absl::Seconds(timeout_s)));
    Give(ptc::EventJson(e), json);
    return absl::OkStatus();
  });
}

int ptc_client_rendezvous(ptc_client* c, int64_t layout_epoch, int port,
                          double timeout_s, ptc_bytes* address) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || address == nullptr) return Null("client or out");
    if (!(timeout_s >= 0)) {
      return absl::InvalidArgumentError("the timeout must be >= 0 seconds");
    }
    PTC_ASSIGN_OR_RETURN(std::string a,
                         c->client->Rendezvous(layout_epoch, port,
                                               absl::Seconds(timeout_s)));
    Give(a, address);
    return absl::OkStatus();
  });
}

int ptc_client_hot_plan(ptc_client* c, int64_t serial, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || json == nullptr) return Null("client or out");
    PTC_ASSIGN_OR_RETURN(ptc::Client::HotSwitch h,
                         c->client->PlanHotSwitch(serial));
    JsonWriter w;
    w.BeginObject();
    w.Key("config").String(h.config);
    w.Key("process_of");
    ptc::WriteInts(w, h.process_of);
    w.Key("transfers").BeginArray();
    for (const ptc::ProcessTransfer& x : h.plan.transfers) {
      w.BeginArray().String(c->client->spec().tensors[x.tensor].key);
      w.BeginArray();
      for (int i = 0; i < x.region.rank(); ++i) {
        w.BeginArray().Int(x.region.dim(i).begin).Int(x.region.dim(i).end);
        w.EndArray();
      }
      w.EndArray().Int(x.source_rank).Int(x.target_rank).EndArray();
    }
    w.EndArray();
    w.Key("small_objects").BeginArray();
    for (const ptc::SmallObjectMove& m : h.plan.small_objects) {
      w.BeginObject();
      w.Key("name").String(m.name);
      w.Key("target_rank").Int(m.target_rank);
      w.Key("source_rank").Int(m.source_rank);
      w.Key("derive_from").String(m.derive_from);
      w.EndObject();
    }
    w.EndArray();
    w.Key("bytes").Int(h.plan.bytes);
    w.Key("bytes_between_processes").Int(h.plan.bytes_between_processes);
    w.Key("bytes_between_hosts").Int(h.plan.bytes_between_hosts);
    w.Key("host_plan_cross_host_bytes").Int(h.plan.host_plan.cross_host_bytes);
    w.EndObject();
    Give(w.str(), json);
    return absl::OkStatus();
  });
}

int ptc_client_begin_save(ptc_client* c, int64_t step, ptc_save** out) {
  return ptc_client_begin_save_for_change(c, step, 0, out);
}

int ptc_client_begin_save_for_change(ptc_client* c, int64_t step,
                                     int64_t change_serial, ptc_save** out) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || out == nullptr) return Null("client or out");
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::Client::Save> s,
                         c->client->BeginSave(step, change_serial));
    *out = new ptc_save{ptc::KeepingClient(std::move(s), c->client)};
    return absl::OkStatus();
  });
}

int ptc_client_begin_save_known_dropped(ptc_client* c, int64_t step,
                                        int64_t change_serial,
                                        int64_t known_dropped, ptc_save** out) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || out == nullptr) return Null("client or out");
    PTC_ASSIGN_OR_RETURN(
        std::unique_ptr<ptc::Client::Save> s,
        c->client->BeginSave(step, change_serial, known_dropped));
    *out = new ptc_save{ptc::KeepingClient(std::move(s), c->client)};
    return absl::OkStatus();
  });
}

int ptc_client_load(ptc_client* c, ptc_state** out) {
  return Call([&]() -> absl::Status {
    if (c == nullptr || out == nullptr) return Null("client or out");
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::Client::State> s,
                         c->client->Load());
    *out = new ptc_state{ptc::KeepingClient(std::move(s), c->client)};
    return absl::OkStatus();
  });
}

int ptc_client_wait_committed(ptc_client* c, int64_t version,
                              double timeout_s) {
  return Call([&]() -> absl::Status {
    if (c == nullptr) return Null("client");
    if (!(timeout_s >= 0)) {
      return absl::InvalidArgumentError("the timeout must be >= 0 seconds");
    }
    return c->client->WaitCommitted(version, absl::Seconds(timeout_s));
  });
}

void ptc_save_free(ptc_save* s) { delete s; }
int64_t ptc_save_version(const ptc_save* s) {
  return s == nullptr ? 0 : s->save->version();
}
int64_t ptc_save_step(const ptc_save* s) {
  return s == nullptr ? 0 : s->save->step();
}

int ptc_save_write(ptc_save* s, int index, const void* data, size_t size) {
  return Call([&]() -> absl::Status {
    if (s == nullptr || (data == nullptr && size > 0))
      return Null("save or data");
    return s->save->Write(
        index, absl::Span<const uint8_t>(static_cast<const uint8_t*>(data),
                                         size));
  });
}

int ptc_save_put_small_object(ptc_save* s, const char* name, const char* data,
                              size_t size) {
  return Call([&]() -> absl::Status {
    if (s == nullptr || name == nullptr || (data == nullptr && size > 0))
      return Null("save, name or data");
    return s->save->PutSmallObject(name, std::string(data, size));
  });
}

int ptc_save_commit(ptc_save* s, int* committed) {
  return Call([&]() -> absl::Status {
    if (s == nullptr || committed == nullptr) return Null("save or out");
    PTC_ASSIGN_OR_RETURN(bool c, s->save->Commit());
    *committed = c;
    return absl::OkStatus();
  });
}

int ptc_save_give_up(ptc_save* s, const char* why) {
  return Call([&]() -> absl::Status {
    if (s == nullptr || why == nullptr) return Null("save or why");
    return s->save->GiveUp(why);
  });
}

void ptc_state_free(ptc_state* s) { delete s; }
int64_t ptc_state_version(const ptc_state* s) {
  return s == nullptr ? 0 : s->state->version();
}

int ptc_state_describe(const ptc_state* s, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (s == nullptr || json == nullptr) return Null("state or out");
    JsonWriter w;
    w.BeginObject();
    w.Key("version").Int(s->state->version());
    w.Key("regions");
    ptc::WriteRegions(w, s->state->regions());
    w.EndObject();
    Give(w.str(), json);
    return absl::OkStatus();
  });
}

int ptc_state_region(const ptc_state* s, int index, const void** data,
                     size_t* size) {
  return Call([&]() -> absl::Status {
    if (s == nullptr || data == nullptr || size == nullptr)
      return Null("state or out");
    PTC_ASSIGN_OR_RETURN(absl::Span<const uint8_t> bytes,
                         s->state->Region(index));
    *data = bytes.data();
    *size = bytes.size();
    return absl::OkStatus();
  });
}

int ptc_state_read_into(const ptc_state* s, int index, void* dst,
                        size_t size) {
  return Call([&]() -> absl::Status {
    if (s == nullptr || (dst == nullptr && size > 0))
      return Null("state or dst");
    return s->state->Read(
        index, absl::Span<uint8_t>(static_cast<uint8_t*>(dst), size));
  });
}

int ptc_state_checksum(const ptc_state* s, int index, uint64_t* out) {
  return Call([&]() -> absl::Status {
    PTC_RETURN_IF_ERROR(CheckIndex(s, index));
    if (out == nullptr) return Null("out");
    *out = s->state->Checksum(index);
    return absl::OkStatus();
  });
}

int ptc_state_inode(const ptc_state* s, int index, uint64_t* out) {
  return Call([&]() -> absl::Status {
    PTC_RETURN_IF_ERROR(CheckIndex(s, index));
    if (out == nullptr) return Null("out");
    *out = static_cast<uint64_t>(s->state->Inode(index));
    return absl::OkStatus();
  });
}

int ptc_state_small_object(const ptc_state* s, const char* name,
                           ptc_bytes* out) {
  return Call([&]() -> absl::Status {
    if (s == nullptr || name == nullptr || out == nullptr)
      return Null("state, name or out");
    PTC_ASSIGN_OR_RETURN(std::string bytes, s->state->SmallObject(name));
    Give(bytes, out);
    return absl::OkStatus();
  });
}

int ptc_gpu_create(int device, ptc_gpu** out) {
  return Call([&]() -> absl::Status {
    if (out == nullptr) return Null("out");
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::DeviceCopies> c,
                         ptc::DeviceCopies::Create(device));
    *out = new ptc_gpu{{}, std::move(c)};
    return absl::OkStatus();
  });
}

void ptc_gpu_free(ptc_gpu* g) { delete g; }
int ptc_gpu_device(const ptc_gpu* g) {
  return g == nullptr ? -1 : g->copies->device();
}

int ptc_gpu_save(ptc_gpu* g, ptc_save* s, int index, uintptr_t src,
                 uint64_t bytes, uintptr_t after) {
  return Call([&]() -> absl::Status {
    if (g == nullptr || s == nullptr) return Null("copies or save");
    PTC_RETURN_IF_ERROR(g->copies->Save(*s->save, index, src, bytes, after));
    g->pending.push_back(s->save);
    return absl::OkStatus();
  });
}

int ptc_gpu_load(ptc_gpu* g, const ptc_state* s, int index, uintptr_t dst,
                 uint64_t bytes, uintptr_t after) {
  return Call([&]() -> absl::Status {
    if (g == nullptr || s == nullptr) return Null("copies or state");
    PTC_RETURN_IF_ERROR(g->copies->Load(*s->state, index, dst, bytes, after));
    g->pending.push_back(s->state);
    return absl::OkStatus();
  });
}

int ptc_gpu_finish(ptc_gpu* g, ptc_bytes* json) {
  return Call([&]() -> absl::Status {
    if (g == nullptr || json == nullptr) return Null("copies or out");
    absl::StatusOr<ptc::DeviceCopies::Stats> finished = g->copies->Finish();
    g->pending.clear();
    PTC_ASSIGN_OR_RETURN(ptc::DeviceCopies::Stats st, std::move(finished));
    JsonWriter w;
    w.BeginObject();
    w.Key("regions").Int(st.regions);
    w.Key("bytes").Int(st.bytes);
    w.Key("pageable_regions").Int(st.pageable_regions);
    w.Key("pageable_reason").String(st.pageable_reason);
    w.Key("register_seconds").Double(st.register_seconds);
    w.Key("seconds").Double(st.seconds);
    w.EndObject();
    Give(w.str(), json);
    return absl::OkStatus();
  });
}

}  // extern "C"
