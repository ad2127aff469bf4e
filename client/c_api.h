// ptc's client library as a C ABI (libptc.so), for languages that bind C
// without compiling against their own headers: Python's package `ptc`
// binds it with ctypes, so one build of the library serves every CPython
// (3.9 and newer) and every PyTorch, and the wheel (tools/wheel.py) carries
// it with the libraries it loads.
//
// Conventions:
//   - Every function that can fail returns 0 on success or an absl status
//     code (3 INVALID_ARGUMENT, 9 FAILED_PRECONDITION, 14 UNAVAILABLE, ...);
//     ptc_last_error() then gives the message, on the calling thread, until
//     its next call into the library.
//   - Handles (ptc_client*, ptc_save*, ...) are owned by the caller and
//     released with their ptc_*_free, in any order: a save or a state keeps
//     its client alive, and GPU copies keep the saves and states they were
//     queued with until ptc_gpu_finish or ptc_gpu_free.
//   - Strings in are NUL-terminated UTF-8; byte strings are (pointer,
//     length). Results that are strings or bytes come back in a ptc_bytes
//     the caller releases with ptc_bytes_free; structured results are JSON
//     objects in one (their fields are the Python package's, documented in
//     client/python/ptc/_capi.py).
//   - No call keeps a pointer it was given beyond its return, except the
//     GPU addresses of ptc_gpu_save/ptc_gpu_load until ptc_gpu_finish.
//   - Calls are thread-safe where the C++ class is (client/client.h): one
//     client per thread that saves or loads.
#ifndef PTC_CLIENT_C_API_H_
#define PTC_CLIENT_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PTC_API __attribute__((visibility("default")))

typedef struct ptc_client ptc_client;
typedef struct ptc_follower ptc_follower;
typedef struct ptc_save ptc_save;
typedef struct ptc_state ptc_state;
typedef struct ptc_gpu ptc_gpu;
typedef struct ptc_config ptc_config;

typedef struct {
  char* data;  // NUL-terminated as well (data[size] == 0)
  size_t size;
} ptc_bytes;

// The library's ABI version; the Python package refuses another.
#define PTC_C_API_VERSION 1
PTC_API int ptc_api_version(void);
PTC_API const char* ptc_last_error(void);
PTC_API void ptc_bytes_free(ptc_bytes* b);
PTC_API int64_t ptc_max_small_object_bytes(void);

// Parallel configs ("tp=2,pp=2,dp=4") on a mesh of axes; `mesh` is a
// comma-separated list, slowest first ("": the default pp, dp, tp).
PTC_API int ptc_config_parse(const char* text, const char* mesh,
                             ptc_config** out);
PTC_API void ptc_config_free(ptc_config* c);
// {text, mesh: [...], sizes: [...] (per mesh axis), world_size, tp, pp, dp}
PTC_API int ptc_config_describe(const ptc_config* c, ptc_bytes* json);
// A rank's indices in mesh order: JSON array.
PTC_API int ptc_config_coord_of(const ptc_config* c, int rank,
                                ptc_bytes* json);
PTC_API int ptc_config_rank_of(const ptc_config* c, const int* indices,
                               int n, int* rank);
PTC_API int ptc_config_stage_layers(const ptc_config* c, int stage,
                                    int num_layers, int* first, int* count);

// Without a cluster.
PTC_API int ptc_check_layout(const char* layout_json, const char* config,
                             ptc_bytes* json);
PTC_API int ptc_layout_regions(const char* layout_json, const char* config,
                               ptc_bytes* json);
PTC_API int ptc_buffer_view(const char* layout_json, const char* config,
                            const char* buffer, int rank, ptc_bytes* json);
// *has = 0 where the bytes are not a derived seed.
PTC_API int ptc_derived_seed(const char* bytes, size_t size, int* has,
                             uint64_t* seed);
PTC_API int ptc_derived_small_object(const char* job, const char* name,
                                     const char* derive_from, int64_t version,
                                     ptc_bytes* out);
PTC_API int ptc_padded_vocab(const char* model, int tp, int64_t* out);
PTC_API int ptc_model_tensors(const char* model, ptc_bytes* json);

// A data-loader position (ptc/data_cursor.h).
typedef struct {
  uint64_t seed;
  int64_t dataset_size;
  int64_t consumed;
  int64_t global_batch;
} ptc_cursor;
PTC_API int ptc_cursor_next_samples(const ptc_cursor* c, int dp_rank, int dp,
                                    ptc_bytes* json);
PTC_API int ptc_cursor_sample_at(const ptc_cursor* c, int64_t position,
                                 int64_t* out);
PTC_API int ptc_cursor_advance(ptc_cursor* c);
PTC_API int ptc_cursor_encode(const ptc_cursor* c, ptc_bytes* out);
PTC_API int ptc_cursor_decode(const char* bytes, size_t size, ptc_cursor* out);

// A host's launcher and agent.
PTC_API int ptc_ranks_on_host(const char* coordinator, const char* job,
                              const char* host, ptc_bytes* json);
// ptc_ranks_on_host through the relay of the host's ptcd at `socket`
// where it relays to `coordinator` (else directly).
PTC_API int ptc_ranks_on_host_local(const char* socket, const char* coordinator,
                                    const char* job, const char* host,
                                    ptc_bytes* json);
PTC_API int ptc_report_process_exit(const char* coordinator, const char* job,
                                    const char* host, int gpu, int exit_code,
                                    int64_t layout_epoch, int* changes);
// A job followed by an agent (client/client.h JobFollower): its Watch
// stream's newest event (the JSON of ptc_client_event), and the ranks on
// a host (the JSON of ptc_ranks_on_host) over the follower's channel.
PTC_API int ptc_follower_open(const char* coordinator, const char* job,
                              ptc_follower** out);
PTC_API void ptc_follower_free(ptc_follower* f);
PTC_API int ptc_follower_event(const ptc_follower* f, ptc_bytes* json);
PTC_API int ptc_follower_ranks_on_host(ptc_follower* f, const char* host,
                                       ptc_bytes* json);

// A training rank's client (client/client.h).
PTC_API int ptc_client_connect(const char* socket, const char* coordinator,
                               const char* job, int rank, const char* token,
                               int64_t pending_serial, ptc_client** out);
PTC_API void ptc_client_free(ptc_client* c);
// rank, device, world_size, committed_version, committed_step,
// layout_epoch, num_layers: 7 values (zeros for a NULL client). The
// accessors below that return a value give 0 (-1 for a device) for NULL.
PTC_API void ptc_client_numbers(const ptc_client* c, int64_t* out7);
// {job, host, relayed, config, mesh, coord, small_object_names,
//  regions: [...]}
PTC_API int ptc_client_describe(const ptc_client* c, ptc_bytes* json);
PTC_API int ptc_client_config(const ptc_client* c, ptc_config** out);
// The job's layout spec as JSON.
PTC_API int ptc_client_layout(const ptc_client* c, ptc_bytes* json);
PTC_API int ptc_client_refresh(ptc_client* c);
PTC_API int ptc_client_rebind(ptc_client* c, int rank);
// Takes the rank the job's placement now puts on this host's GPU `device`
// and reads the job, from one answer (Client::RebindToDevice); *rank is -1
// where the placement puts none there.
PTC_API int ptc_client_rebind_device(ptc_client* c, int device, int* rank);
PTC_API int ptc_client_follow(ptc_client* c);
PTC_API int ptc_client_unfollow(ptc_client* c);
PTC_API int ptc_client_event(const ptc_client* c, ptc_bytes* json);
// The newest event once the stream has told more than `after` events
// (the event's "received"), or after timeout_s seconds (0 to 3600).
PTC_API int ptc_client_wait_event(const ptc_client* c, int64_t after,
                                  double timeout_s, ptc_bytes* json);
PTC_API int ptc_client_fetch_event(ptc_client* c, ptc_bytes* json);
// The same, waiting at most timeout_s seconds (more than 0, at most 3600)
// for an answer:
// a caller that can do without it (ptc.elastic's look for a hot switch
// asked just now) does not wait out the client's patience.
PTC_API int ptc_client_fetch_event_within(ptc_client* c, double timeout_s,
                                          ptc_bytes* json);
// ptc_ranks_on_host over the client's own connection.
PTC_API int ptc_client_ranks_on_host(ptc_client* c, const char* host,
                                     ptc_bytes* json);
PTC_API int ptc_client_rendezvous(ptc_client* c, int64_t layout_epoch,
                                  int port, double timeout_s,
                                  ptc_bytes* address);
PTC_API int ptc_client_hot_plan(ptc_client* c, int64_t serial,
                                ptc_bytes* json);
PTC_API int ptc_client_begin_save(ptc_client* c, int64_t step,
                                  ptc_save** out);
// A save for the pending change of serial `change_serial`, made in the
// current layout because its hot switch did not start (Client::BeginSave).
PTC_API int ptc_client_begin_save_for_change(ptc_client* c, int64_t step,
                                             int64_t change_serial,
                                             ptc_save** out);
// The same, refused (ABORTED) if the job deleted a save newer than
// `known_dropped` (the newest this rank has acted on): its peers make that
// save again together (Client::BeginSave).
PTC_API int ptc_client_begin_save_known_dropped(ptc_client* c, int64_t step,
                                                int64_t change_serial,
                                                int64_t known_dropped,
                                                ptc_save** out);
PTC_API int ptc_client_load(ptc_client* c, ptc_state** out);
PTC_API int ptc_client_wait_committed(ptc_client* c, int64_t version,
                                      double timeout_s);

PTC_API void ptc_save_free(ptc_save* s);
PTC_API int64_t ptc_save_version(const ptc_save* s);
PTC_API int64_t ptc_save_step(const ptc_save* s);
PTC_API int ptc_save_write(ptc_save* s, int index, const void* data,
                           size_t size);
PTC_API int ptc_save_put_small_object(ptc_save* s, const char* name,
                                      const char* data, size_t size);
// *committed = 1 if this commit was the version's last rank.
PTC_API int ptc_save_commit(ptc_save* s, int* committed);
// This rank will not save this version (Client::Save::GiveUp): the
// coordinator deletes it and the job's ranks save again.
PTC_API int ptc_save_give_up(ptc_save* s, const char* why);

PTC_API void ptc_state_free(ptc_state* s);
PTC_API int64_t ptc_state_version(const ptc_state* s);
// {version, regions: [...]}
PTC_API int ptc_state_describe(const ptc_state* s, ptc_bytes* json);
// Region `index`'s bytes, mapped read-only (no copy); valid until the
// state is freed.
PTC_API int ptc_state_region(const ptc_state* s, int index,
                             const void** data, size_t* size);
PTC_API int ptc_state_read_into(const ptc_state* s, int index, void* dst,
                                size_t size);
PTC_API int ptc_state_checksum(const ptc_state* s, int index, uint64_t* out);
PTC_API int ptc_state_inode(const ptc_state* s, int index, uint64_t* out);
PTC_API int ptc_state_small_object(const ptc_state* s, const char* name,
                                   ptc_bytes* out);

// GPU copies (client/device_copies.h); addresses and streams are integers.
PTC_API int ptc_gpu_create(int device, ptc_gpu** out);
PTC_API void ptc_gpu_free(ptc_gpu* g);
PTC_API int ptc_gpu_device(const ptc_gpu* g);
PTC_API int ptc_gpu_save(ptc_gpu* g, ptc_save* s, int index, uintptr_t src,
                         uint64_t bytes, uintptr_t after);
PTC_API int ptc_gpu_load(ptc_gpu* g, const ptc_state* s, int index,
                         uintptr_t dst, uint64_t bytes, uintptr_t after);
// {regions, bytes, pageable_regions, pageable_reason, register_seconds,
//  seconds}
PTC_API int ptc_gpu_finish(ptc_gpu* g, ptc_bytes* json);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // PTC_CLIENT_C_API_H_
