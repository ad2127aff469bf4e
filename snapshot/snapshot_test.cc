// The snapshot files without daemons: a store's regions written to a
// safetensors file and read back in pieces; damage and bad paths refused;
// the manifest's round trip and retention.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ptc/region_proto.h"
#include "snapshot/safetensors.h"
#include "snapshot/snapshot_dir.h"
#include "snapshot/snapshot_reader.h"
#include "snapshot/snapshot_writer.h"

namespace ptc {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  std::string t = fs::temp_directory_path() / "ptc-snapshot-test-XXXXXX";
  REQUIRE(mkdtemp(t.data()) != nullptr);
  return t;
}

// A store with w (float32 [600, 1000], value = flat index) in two row
// halves, committed as version 1.
void Fill(Store& s) {
  REQUIRE(s.DeclareTensors("j", {{"w", DType::kFloat32, {600, 1000}}}).ok());
  for (int half = 0; half < 2; ++half) {
    const Region r{{half * 300, half * 300 + 300}, {0, 1000}};
    auto put = s.BeginPut("j", 1, "w", r);
    REQUIRE(put.ok());
    auto* f = reinterpret_cast<float*>((*put)->buffer->mutable_data());
    for (int64_t i = 0; i < r.volume(); ++i)
      f[i] = static_cast<float>(half * 300000 + i);
    REQUIRE(s.FinishPut(std::move(*put)).ok());
  }
  REQUIRE(s.Commit("j", 1).ok());
}

std::vector<float> ReadPiece(SnapshotReader& reader,
                             const proto::SnapshotRegion& e,
                             const Region& piece, absl::Status* status,
                             int64_t* read = nullptr) {
  std::vector<float> out(static_cast<size_t>(piece.volume()));
  *status = reader.Read(
      e, "w", piece, 4,
      [&](int64_t off, const char* src, int64_t n) {
        std::memcpy(reinterpret_cast<char*>(out.data()) + off, src, n);
      },
      read);
  return out;
}

TEST_CASE("snapshot: regions written from the store read back in pieces",
          "[snapshot]") {
  Store s({64 << 20});
  Fill(s);
  const std::string dir = TempDir() + "/" + SnapshotDirName(1);
  SnapshotFileRequest r;
  r.job = "j";
  r.version = 1;
  r.dir = dir;
  r.file = "host0.safetensors";
  // A whole stored region, and a part of the other one (columns).
  r.regions = {{"w", Region{{0, 300}, {0, 1000}}},
               {"w", Region{{300, 600}, {0, 500}}}};
  auto done = WriteSnapshotFile(&s, r);
  REQUIRE(done.ok());
  CHECK(done->done());
  REQUIRE(done->regions_size() == 2);
  CHECK(fs::exists(dir + "/host0.safetensors"));
  CHECK(!fs::exists(dir + "/.host0.safetensors.tmp"));
  CHECK(done->regions(0).block_checksums_size() == 2);  // 1.2 MB

  // Any safetensors reader sees two tensors named by key and region.
  std::ifstream in(dir + "/host0.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto index =
      ParseSafetensorsHeader(bytes, static_cast<int64_t>(bytes.size()));
  REQUIRE(index.ok());
  REQUIRE(index->tensors.size() == 2);
  const auto& second = index->tensors.at("w[300:600, 0:500]");
  CHECK(second.dtype == "F32");
  CHECK(second.shape == std::vector<int64_t>{300, 500});
  CHECK(index->data_start % 8 == 0);
  CHECK(index->data_start + second.begin == done->regions(1).offset());
  float v = 0;
  std::memcpy(&v, bytes.data() + done->regions(1).offset() + 4 * 1001, 4);
  CHECK(v == 300000 + 2 * 1000 + 1);  // row 302, column 1

  SnapshotReader reader(dir);
  absl::Status st;
  // Rows 100..102 of the first region: only its first block is read.
  int64_t read = 0;
  auto rows = ReadPiece(reader, done->regions(0), Region{{100, 103}, {0, 1000}},
                        &st, &read);
  REQUIRE(st.ok());
  CHECK(rows[0] == 100000);
  CHECK(rows[2999] == 102999);
  CHECK(read == kSnapshotBlockBytes);
  // A column block of the second.
  auto cols =
      ReadPiece(reader, done->regions(1), Region{{310, 320}, {7, 9}}, &st);
  REQUIRE(st.ok());
  CHECK(cols[0] == 300000 + 10 * 1000 + 7);
  CHECK(cols[19] == 300000 + 19 * 1000 + 8);
  // Outside the region.
  ReadPiece(reader, done->regions(1), Region{{310, 320}, {600, 601}}, &st);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);

  SECTION("a corrupted block is DATA_LOSS naming the file and region") {
    const int fd = ::open((dir + "/host0.safetensors").c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    const char x = 0x5a;
    REQUIRE(::pwrite(fd, &x, 1, done->regions(0).offset() + 10) == 1);
    ::close(fd);
    SnapshotReader fresh(dir);
    ReadPiece(fresh, done->regions(0), Region{{0, 1}, {0, 1000}}, &st);
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(st.message(), "host0.safetensors"));
    CHECK(absl::StrContains(st.message(), "of tensor 'w'"));
    // The other block of the region is still good.
    ReadPiece(fresh, done->regions(0), Region{{299, 300}, {0, 1000}}, &st);
    CHECK(st.ok());
  }
  SECTION("a truncated file is DATA_LOSS") {
    fs::resize_file(dir + "/host0.safetensors",
                    done->regions(1).offset() + 100);
    SnapshotReader fresh(dir);
    ReadPiece(fresh, done->regions(1), Region{{599, 600}, {0, 500}}, &st);
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(st.message(), "truncated"));
  }
  SECTION("a missing file is DATA_LOSS") {
    fs::remove(dir + "/host0.safetensors");
    SnapshotReader fresh(dir);
    ReadPiece(fresh, done->regions(1), Region{{599, 600}, {0, 500}}, &st);
    CHECK(st.code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("snapshot: bad requests leave no file", "[snapshot]") {
  Store s({64 << 20});
  Fill(s);
  const std::string dir = TempDir();
  SnapshotFileRequest r;
  r.job = "j";
  r.version = 1;
  r.dir = dir;
  r.file = "f.safetensors";
  r.regions = {{"w", Region{{250, 350}, {0, 1000}}}};  // spans two stored
  CHECK(WriteSnapshotFile(&s, r).status().code() ==
        absl::StatusCode::kInvalidArgument);
  r.regions = {{"w", Region{{0, 10}, {0, 1000}}}};
  r.version = 2;  // not there
  CHECK(!WriteSnapshotFile(&s, r).ok());
  r.version = 1;
  r.file = "../escape";
  CHECK(WriteSnapshotFile(&s, r).status().code() ==
        absl::StatusCode::kInvalidArgument);
  r.file = "f.safetensors";
  std::atomic<bool> cancel{true};
  r.cancel = &cancel;
  CHECK(WriteSnapshotFile(&s, r).status().code() ==
        absl::StatusCode::kCancelled);
  CHECK(fs::is_empty(dir));
}

TEST_CASE("snapshot: roots, manifests and retention", "[snapshot]") {
  CHECK(CheckSnapshotRoot("/data/snaps", "").ok());
  CHECK(!CheckSnapshotRoot("relative", "").ok());
  CHECK(!CheckSnapshotRoot("/data/../etc", "").ok());
  CHECK(CheckSnapshotRoot("/data/snaps/j", "/data/snaps/").ok());
  CHECK(CheckSnapshotRoot("/data/snapsX", "/data/snaps").code() ==
        absl::StatusCode::kPermissionDenied);

  const std::string root = TempDir();
  auto manifest = [](int64_t version) {
    proto::SnapshotManifest m;
    m.set_format(kSnapshotFormat);
    m.set_job("j");
    m.set_version(version);
    proto::TensorDecl* d = m.add_tensors();
    d->set_key("w");
    d->set_dtype("fp32");
    d->add_shape(4);
    proto::SnapshotFile* f = m.add_files();
    f->set_name("a.safetensors");
    f->set_bytes(100);
    proto::SnapshotRegion* r = m.add_regions();
    RegionToProto(Region{{0, 4}}, r->mutable_region());
    r->set_file("a.safetensors");
    r->set_offset(64);
    r->set_bytes(16);
    r->set_block_bytes(kSnapshotBlockBytes);
    r->add_block_checksums(1);
    return m;
  };
  for (int64_t v : {3, 5, 9}) {
    const std::string dir = root + "/" + SnapshotDirName(v);
    fs::create_directories(dir);
    REQUIRE(WriteManifest(dir, manifest(v)).ok());
  }
  fs::create_directories(root + "/" + SnapshotDirName(12));  // cut short
  auto latest = LatestSnapshot(root, "j");
  REQUIRE(latest.ok());
  CHECK(latest->manifest.version() == 9);
  CHECK(LatestSnapshot(root, "k").status().code() ==
        absl::StatusCode::kFailedPrecondition);
  auto removed = RetainSnapshots(root, "j", 2, root + "/" + SnapshotDirName(9));
  REQUIRE(removed.ok());
  CHECK(removed->size() == 2);  // 3 and the incomplete 12
  CHECK(fs::exists(root + "/" + SnapshotDirName(5)));
  CHECK(!fs::exists(root + "/" + SnapshotDirName(3)));
  CHECK(!fs::exists(root + "/" + SnapshotDirName(12)));

  // A manifest whose regions do not cover the tensor is damaged.
  proto::SnapshotManifest bad = manifest(1);
  bad.mutable_regions(0)->set_bytes(12);
  CHECK(ManifestFromJson(ManifestToJson(bad), "m").status().code() ==
        absl::StatusCode::kDataLoss);
  CHECK(ManifestFromJson("{not json", "m").status().code() ==
        absl::StatusCode::kDataLoss);
  CHECK(ManifestFromJson(ManifestToJson(manifest(1)), "m").ok());
}

}  // namespace
}  // namespace ptc
