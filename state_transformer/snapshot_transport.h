// Pieces from a snapshot on disk, for a fragment whose plan takes regions
// no live host holds from the job's latest snapshot: pieces and small
// objects with source host kFromSnapshot are read from the snapshot's
// files (only the blocks that hold them, each checked); all others go to
// the peers' transport.
#ifndef PTC_STATE_TRANSFORMER_SNAPSHOT_TRANSPORT_H_
#define PTC_STATE_TRANSFORMER_SNAPSHOT_TRANSPORT_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "proto/transformer.pb.h"
#include "snapshot/snapshot_reader.h"
#include "state_transformer/fragment_executor.h"

namespace ptc {

class SnapshotPieceTransport : public PieceTransport {
 public:
  // `tensors` are the fragment's (the plan's tensor ids index them).
  SnapshotPieceTransport(std::unique_ptr<PieceTransport> peers,
                         proto::SnapshotSource source,
                         const std::vector<TensorDecl>& tensors);

  absl::Status Fetch(int32_t host, const std::string& job, int64_t version,
                     const std::string& tensor, const Region& region,
                     int64_t element_size,
                     const StoreClient::Consumer& consume) override;
  absl::Status FetchInto(int32_t host, const std::string& job, int64_t version,
                         const std::string& tensor, const Region& region,
                         int64_t element_size,
                         absl::Span<const PieceTarget> targets,
                         const StoreClient::Consumer& consume) override;
  absl::Status FetchBatch(int32_t host, const std::string& job, int64_t version,
                          absl::Span<const BatchPiece> pieces) override;
  absl::StatusOr<std::string> FetchSmallObject(int32_t host,
                                               const std::string& job,
                                               int64_t version,
                                               const std::string& name,
                                               int32_t rank) override;
  absl::StatusOr<std::vector<std::string>> FetchSmallObjects(
      int32_t host, const std::string& job, int64_t version,
      const SmallObjectKeys& keys) override {
    if (host == kFromSnapshot)
      return PieceTransport::FetchSmallObjects(host, job, version, keys);
    return peers_->FetchSmallObjects(host, job, version, keys);
  }

  // Bytes read from the snapshot's files so far.
  int64_t bytes_read() const { return bytes_read_.load(); }

 private:
  std::unique_ptr<PieceTransport> peers_;
  proto::SnapshotSource source_;
  SnapshotReader reader_;
  // tensor key -> its regions in source_.
  std::map<std::string, std::vector<const proto::SnapshotRegion*>> regions_;
  std::atomic<int64_t> bytes_read_{0};
};

}  // namespace ptc

#endif  // PTC_STATE_TRANSFORMER_SNAPSHOT_TRANSPORT_H_
