#include "state_transformer/snapshot_transport.h"

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/status_macros.h"
#include "ptc/region_proto.h"

namespace ptc {

SnapshotPieceTransport::SnapshotPieceTransport(
    std::unique_ptr<PieceTransport> peers, proto::SnapshotSource source,
    const std::vector<TensorDecl>& tensors)
    : peers_(std::move(peers)),
      source_(std::move(source)),
      reader_(source_.dir()) {
  for (const proto::SnapshotRegion& r : source_.regions()) {
    if (r.tensor() >= 0 && r.tensor() < static_cast<int>(tensors.size()))
      regions_[tensors[r.tensor()].key].push_back(&r);
  }
}

absl::Status SnapshotPieceTransport::Fetch(
    int32_t host, const std::string& job, int64_t version,
    const std::string& tensor, const Region& region, int64_t element_size,
    const StoreClient::Consumer& consume) {
  if (host != kFromSnapshot) {
    return peers_->Fetch(host, job, version, tensor, region, element_size,
                         consume);
  }
  auto it = regions_.find(tensor);
  if (it != regions_.end()) {
    for (const proto::SnapshotRegion* r : it->second) {
      auto stored = RegionFromProto(r->region());
      if (!stored.ok() || stored->rank() != region.rank() ||
          !stored->Contains(region))
        continue;
      int64_t read = 0;
      absl::Status s =
          reader_.Read(*r, tensor, region, element_size, consume, &read);
      bytes_read_ += read;
      return s;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "piece ", region.ToString(), " of tensor '", tensor,
      "' is to come from the snapshot, but no snapshot region sent with the "
      "fragment holds it"));
}

absl::Status SnapshotPieceTransport::FetchInto(
    int32_t host, const std::string& job, int64_t version,
    const std::string& tensor, const Region& region, int64_t element_size,
    absl::Span<const PieceTarget> targets,
    const StoreClient::Consumer& consume) {
  if (host == kFromSnapshot) {
    return Fetch(host, job, version, tensor, region, element_size, consume);
  }
  return peers_->FetchInto(host, job, version, tensor, region, element_size,
                           targets, consume);
}

absl::Status SnapshotPieceTransport::FetchBatch(
    int32_t host, const std::string& job, int64_t version,
    absl::Span<const BatchPiece> pieces) {
  if (host == kFromSnapshot)
    return PieceTransport::FetchBatch(host, job, version, pieces);
  return peers_->FetchBatch(host, job, version, pieces);
}

absl::StatusOr<std::string> SnapshotPieceTransport::FetchSmallObject(
    int32_t host, const std::string& job, int64_t version,
    const std::string& name, int32_t rank) {
  if (host != kFromSnapshot)
    return peers_->FetchSmallObject(host, job, version, name, rank);
  for (const proto::SnapshotSmallObject& o : source_.small_objects()) {
    if (o.name() != name || o.rank() != rank) continue;
    if (Checksum(o.data().data(), o.data().size()) != o.checksum()) {
      return absl::DataLossError(absl::StrCat(
          "small object '", name, "' of rank ", rank, " in snapshot ",
          source_.dir(), " does not match its checksum"));
    }
    return o.data();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "small object '", name, "' of rank ", rank,
      " is to come from the snapshot, but the fragment did not carry it"));
}

}  // namespace ptc
