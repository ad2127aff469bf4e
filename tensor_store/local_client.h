// The client side of ptcd's local protocol: save a region by filling
// daemon-owned shared memory, load one by mapping it read-only, zero-copy.
// A LocalClient serves one request at a time (calls are serialized).
//
//   PTC_ASSIGN_OR_RETURN(auto client,
//   LocalClient::Connect("/run/ptcd/ptcd.sock"));
//   PTC_ASSIGN_OR_RETURN(LocalClient::PutBuffer buf,
//   client->AllocatePut("run7", 1, "w", r)); std::memcpy(buf.data(), src,
//   buf.size()); PTC_RETURN_IF_ERROR(client->CommitPut(&buf).status());
//   PTC_ASSIGN_OR_RETURN(LocalClient::Mapping m, client->Map("run7", 1, "w",
//   r)); use(m.data(), m.size());   // valid until m is destroyed
#ifndef PTC_TENSOR_STORE_LOCAL_CLIENT_H_
#define PTC_TENSOR_STORE_LOCAL_CLIENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/local.pb.h"
#include "ptc/region.h"
#include "ptc/small_object.h"
#include "ptc/tensor_decl.h"
#include "tensor_store/region_buffer.h"

namespace ptc {

class LocalClient {
 public:
  // The memfd of a pack (AllocatePuts), and its one writable mapping,
  // shared by the pack's put buffers; closed when the last goes.
  struct Pack {
    int fd = -1;
    int64_t size = 0;
    uint8_t* data = nullptr;
    Pack() = default;
    Pack(const Pack&) = delete;
    Pack& operator=(const Pack&) = delete;
    ~Pack();
    absl::Status Map(bool populate);
    void Unmap();
  };

  // A writable shared buffer for one region, from AllocatePut or
  // AllocatePuts. Move-only; unmapped when destroyed (the put stays
  // pending until committed or aborted, or until the client disconnects,
  // which aborts it).
  class PutBuffer {
   public:
    PutBuffer() = default;
    PutBuffer(PutBuffer&& o) noexcept { *this = std::move(o); }
    PutBuffer& operator=(PutBuffer&& o) noexcept;
    ~PutBuffer() { Drop(); }
    // The mapping; null for a buffer allocated without one until Map().
    uint8_t* data() {
      if (!pack_) return data_;
      return pack_->data == nullptr ? nullptr : pack_->data + offset_;
    }
    int64_t size() const { return size_; }
    uint64_t handle() const { return handle_; }
    // A hollow daemon's buffer (a scale test's ptcd): no memory; Map and
    // Write fail, and it is committed with nothing written.
    bool hollow() const { return hollow_; }
    // Whether the buffer is one of a pack's (AllocatePuts).
    bool packed() const { return pack_ != nullptr; }
    // Maps the buffer writable (if AllocatePut did not), its pages at once
    // unless `populate` is false. A pack's buffer maps the whole pack,
    // which its other buffers then share.
    absl::Status Map(bool populate = true);
    // Copies `n` bytes into the buffer at `offset` through its descriptor,
    // mapping nothing (see WriteAt in region_buffer.h: several times
    // faster than filling a fresh mapping where page faults are costly).
    // A pack of a huge page or more, where the host gives shared memory
    // huge pages, is mapped instead (once: a few entries) and copied into.
    absl::Status Write(int64_t offset, const void* src, int64_t n);
    // Unmaps the buffer (a pack's: the pack's mapping, which all its
    // buffers share) so that the daemon can seal it.
    void Unmap();

   private:
    friend class LocalClient;
    // Unmaps and closes a buffer of its own; lets go of a pack.
    void Drop();
    uint64_t handle_ = 0;
    uint8_t* data_ = nullptr;
    int64_t size_ = 0;
    int fd_ = -1;
    bool hollow_ = false;
    std::shared_ptr<Pack> pack_;
    int64_t offset_ = 0;
  };

  // A descriptor that several mappings share (the regions of one pack);
  // closed with the last of them.
  struct SharedFd {
    int fd = -1;
    explicit SharedFd(int f) : fd(f) {}
    SharedFd(const SharedFd&) = delete;
    SharedFd& operator=(const SharedFd&) = delete;
    ~SharedFd();
  };

  // A read-only mapping of one stored region, from Map or MapMany.
  // Move-only; on destruction it unmaps and releases the lease (unless
  // Release took it with others). Must not outlive the client that made
  // it.
  class Mapping {
   public:
    Mapping() = default;
    Mapping(Mapping&& o) noexcept { *this = std::move(o); }
    Mapping& operator=(Mapping&& o) noexcept;
    ~Mapping();
    // The read-only mapping; null for a lease Map gave without one until
    // MapNow().
    const uint8_t* data() const { return data_; }
    int64_t size() const { return size_; }
    // Maps the region (if Map did not), its pages at once.
    absl::Status MapNow();
    // Copies `n` bytes at `offset` of the region into `dst` through its
    // descriptor, mapping nothing.
    absl::Status Read(int64_t offset, void* dst, int64_t n) const;
    // xxh3-64 the daemon took when the region was stored.
    uint64_t checksum() const { return checksum_; }
    // A hollow daemon's region: no bytes to map or read.
    bool hollow() const { return hollow_; }
    // The shared memory's inode (equal to the daemon's buffer: no copy).
    ino_t inode() const;
    // The lease by which the daemon keeps the region for this mapping.
    uint64_t lease() const { return lease_; }

   private:
    friend class LocalClient;
    LocalClient* client_ = nullptr;
    uint64_t lease_ = 0;
    const uint8_t* data_ = nullptr;
    int64_t size_ = 0;
    int64_t offset_ = 0;  // of the region in fd_ (a pack's)
    uint64_t checksum_ = 0;
    std::shared_ptr<SharedFd> fd_;  // null: released, or hollow
    bool hollow_ = false;
  };

  // UNAVAILABLE naming the path if no ptcd listens there.
  static absl::StatusOr<std::unique_ptr<LocalClient>> Connect(
      const std::string& socket_path);
  ~LocalClient();

  // A buffer for one region, mapped writable unless `map` is false (then
  // filled by PutBuffer::Write) or the daemon is hollow.
  absl::StatusOr<PutBuffer> AllocatePut(const std::string& job, int64_t version,
                                        const std::string& tensor,
                                        const Region& region, bool map = true);
  // Buffers for several regions of one version in one pack: one memfd,
  // one request (at most kMaxPackRegions regions of at most
  // kMaxPackBytes in all; the request must fit a packet). Unmapped;
  // the buffers must be committed together, in one CommitPuts. With a
  // ptcd older than this request, one AllocatePut per region.
  absl::StatusOr<std::vector<PutBuffer>> AllocatePuts(
      const std::string& job, int64_t version,
      const std::vector<std::pair<std::string, Region>>& items);
  // Unmaps the buffer and commits it; `checksum` (0: none) is the xxh3-64
  // of the bytes written. Returns the checksum the daemon stored.
  absl::StatusOr<uint64_t> CommitPut(PutBuffer* buffer, uint64_t checksum = 0);
  absl::Status AbortPut(PutBuffer* buffer);
  // What CommitPuts says of one buffer: whether it was stored, and the
  // checksum of its bytes as the daemon took it (also when it was refused,
  // e.g. ALREADY_EXISTS, so that the caller can compare its copy with the
  // stored one; 0 where unknown).
  struct PutResult {
    absl::Status status;
    uint64_t checksum = 0;
  };
  // Unmaps and commits the buffers, up to kMaxCommitPuts per request (a
  // pack's in the same request): the daemon checksums each request's
  // buffers on several threads.
  // `checksums` is empty or one per buffer, as CommitPut's. One result per
  // buffer; an error status only if a request failed as a whole. With a
  // ptcd older than this request, one CommitPut per buffer, each mapped
  // buffer checksummed here first (so that its result has its checksum).
  absl::StatusOr<std::vector<PutResult>> CommitPuts(
      const std::vector<PutBuffer*>& buffers,
      const std::vector<uint64_t>& checksums);
  // Maps a stored region (exactly one region the daemon stores); with
  // `map` false, only leases it (read by Mapping::Read, or MapNow later).
  absl::StatusOr<Mapping> Map(const std::string& job, int64_t version,
                              const std::string& tensor, const Region& region,
                              bool map = true);
  // Leases several stored regions of one version, in order, in as few
  // requests as fit (MapMany: up to kMaxMapRegions each); regions saved in
  // one pack share one descriptor. Nothing is mapped (Mapping::Read, or
  // MapNow). With a ptcd older than MapMany, one Map per region.
  absl::StatusOr<std::vector<Mapping>> MapMany(
      const std::string& job, int64_t version,
      const std::vector<std::pair<std::string, Region>>& items);
  // Releases the leases of `mappings` (this client's) in as few requests
  // as fit; each stays readable until it is destroyed. The first failure
  // is returned, and every lease is let go of here either way.
  absl::Status Release(std::vector<Mapping>* mappings);

  // Small objects (at most kMaxSmallObjectBytes, sent inline).
  absl::Status PutSmallObject(const std::string& job, int64_t version,
                              const std::string& name, int32_t rank,
                              const std::string& bytes);
  absl::StatusOr<std::string> GetSmallObject(const std::string& job,
                                             int64_t version,
                                             const std::string& name,
                                             int32_t rank);

  // Declares tensors of `job` (in requests that fit a packet).
  absl::Status Declare(const std::string& job,
                       const std::vector<TensorDecl>& tensors);

  // Who the daemon is: its host name and the committed versions of `job`
  // it holds (ascending). `token` is the job's token (empty: none); a
  // daemon with a token key needs it before any request naming the job.
  struct Hello {
    std::string host;
    std::vector<int64_t> committed_versions;
    // The daemon's coordinator relay (a gRPC Unix socket) and the
    // coordinator it relays to; empty: it relays nothing.
    std::string coordinator_relay;
    std::string coordinator;
  };
  absl::StatusOr<Hello> SayHello(const std::string& job,
                                 const std::string& token = "");

  // Sends a raw request; for tests of the daemon's error handling.
  absl::StatusOr<proto::LocalResponse> Call(proto::LocalRequest req,
                                            int* fd_out);
  // As Call, with every descriptor passed (the caller owns them).
  absl::StatusOr<proto::LocalResponse> CallWithFds(proto::LocalRequest req,
                                                   std::vector<int>* fds_out);

 private:
  explicit LocalClient(int fd) : fd_(fd) {}
  absl::Status Release(uint64_t lease);

  int fd_;
  absl::Mutex mu_;
  uint64_t next_request_ = 1;
  // The daemon answered CommitPuts as an unknown request (it is older).
  std::atomic<bool> batch_unknown_{false};
  // The daemon answered AllocatePuts as an unknown request.
  std::atomic<bool> pack_unknown_{false};
  // The daemon answered MapMany as an unknown request; or it answered one
  // (it releases several leases at once).
  std::atomic<bool> many_unknown_{false};
  std::atomic<bool> many_known_{false};
};

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_LOCAL_CLIENT_H_
