// Local training processes and ptcd: saves through daemon-owned shared
// memory, zero-copy loads, and the ownership rules of handles and leases.
#include <grp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "common/checksum.h"
#include "common/job_token.h"
#include "ptc/region_proto.h"
#include "tensor_store/internal/testing.h"
#include "tensor_store/internal/unix_socket.h"
#include "tensor_store/local_client.h"
#include "tensor_store/local_server.h"

namespace ptc {
namespace {

using testing::StartDaemon;

constexpr int64_t kRows = 64, kCols = 1024;  // 256 KiB of fp32

// A daemon whose job "job" declares "w", fp32 [kRows, kCols].
std::unique_ptr<testing::Daemon> StartWithTensor() {
  auto d = StartDaemon();
  REQUIRE(
      d->client->Declare("job", {{"w", DType::kFloat32, {kRows, kCols}}}).ok());
  return d;
}

std::unique_ptr<LocalClient> Connect(const testing::Daemon& d) {
  auto c = LocalClient::Connect(d.socket_path());
  REQUIRE(c.ok());
  return std::move(*c);
}

uint64_t SaveRows(LocalClient& c, int64_t version, int64_t r0, int64_t r1,
                  uint64_t seed) {
  auto buf = c.AllocatePut("job", version, "w", Region{{r0, r1}, {0, kCols}});
  REQUIRE(buf.ok());
  testing::FillPattern(seed, 0, reinterpret_cast<char*>(buf->data()),
                       buf->size());
  const uint64_t sum = Checksum(buf->data(), buf->size());
  auto stored = c.CommitPut(&*buf, sum);
  REQUIRE(stored.ok());
  CHECK(*stored == sum);
  return sum;
}

TEST_CASE("local: a save through shared memory reads back over gRPC",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  SaveRows(*c, 1, 0, 32, 1);
  SaveRows(*c, 1, 32, 64, 2);
  std::vector<char> back(32 * kCols * 4);
  REQUIRE(d->client
              ->Read("job", 1, "w", Region{{32, 64}, {0, kCols}}, back.data(),
                     back.size())
              .ok());
  CHECK(testing::CheckPattern(2, 0, back.data(), back.size()));
}

TEST_CASE("local: regions copied through their descriptor, not mapped",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  const Region r{{0, kRows}, {0, kCols}};
  std::vector<char> bytes(kRows * kCols * 4);
  testing::FillPattern(7, 0, bytes.data(), bytes.size());
  auto buf = c->AllocatePut("job", 1, "w", r, /*map=*/false);
  REQUIRE(buf.ok());
  CHECK(buf->data() == nullptr);
  // Out of the buffer's bounds: refused, nothing written.
  CHECK(buf->Write(1, bytes.data(), buf->size()).code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(buf->Write(-1, bytes.data(), 1).code() ==
        absl::StatusCode::kOutOfRange);
  // In two parts, as a client writing chunks does.
  const int64_t half = buf->size() / 2;
  REQUIRE(buf->Write(0, bytes.data(), half).ok());
  REQUIRE(buf->Write(half, bytes.data() + half, buf->size() - half).ok());
  const uint64_t sum = Checksum(bytes.data(), bytes.size());
  auto stored = c->CommitPut(&*buf, sum);
  REQUIRE(stored.ok());
  CHECK(*stored == sum);  // the daemon's own pass over the sealed bytes

  auto m = c->Map("job", 1, "w", r, /*map=*/false);
  REQUIRE(m.ok());
  CHECK(m->data() == nullptr);
  std::vector<char> back(bytes.size());
  REQUIRE(m->Read(0, back.data(), m->size()).ok());
  CHECK(back == bytes);
  CHECK(m->Read(m->size() - 3, back.data(), 4).code() ==
        absl::StatusCode::kOutOfRange);
  // Mapped later, the same bytes.
  REQUIRE(m->MapNow().ok());
  CHECK(std::memcmp(m->data(), bytes.data(), bytes.size()) == 0);

  // A checksum that does not match what was written: nothing is stored.
  auto bad = c->AllocatePut("job", 2, "w", r, /*map=*/false);
  REQUIRE(bad.ok());
  REQUIRE(bad->Write(0, bytes.data(), bad->size()).ok());
  CHECK(c->CommitPut(&*bad, sum + 1).status().code() ==
        absl::StatusCode::kDataLoss);
}

TEST_CASE("local: a load maps the daemon's own buffer, with no copy",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  const Region r{{0, kRows}, {0, kCols}};
  auto buf = c->AllocatePut("job", 1, "w", r);
  REQUIRE(buf.ok());
  testing::FillPattern(3, 0, reinterpret_cast<char*>(buf->data()), buf->size());
  REQUIRE(c->CommitPut(&*buf).ok());
  const int64_t used = d->server->store()->data_bytes_used();
  auto m = c->Map("job", 1, "w", r);
  REQUIRE(m.ok());
  CHECK(testing::CheckPattern(3, 0, reinterpret_cast<const char*>(m->data()),
                              m->size()));
  // The mapping is the very memory the store holds: same memfd inode, and
  // the store's memory did not grow.
  auto view = d->server->store()->OpenRead("job", 1, "w", r);
  REQUIRE(view.ok());
  CHECK(m->inode() == view->sources[0].buffer->inode());
  CHECK(d->server->store()->data_bytes_used() == used);
  CHECK(m->checksum() == view->sources[0].checksum);
}

TEST_CASE("local: nobody can write a stored region, not even its mapper",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  const Region r{{0, kRows}, {0, kCols}};
  SaveRows(*c, 1, 0, kRows, 4);
  proto::LocalRequest req;
  proto::MapOp* op = req.mutable_map();
  op->set_job("job");
  op->set_version(1);
  op->set_tensor("w");
  RegionToProto(r, op->mutable_region());
  int fd = -1;
  auto resp = c->Call(req, &fd);
  REQUIRE(resp.ok());
  REQUIRE(fd >= 0);
  // The memfd is sealed: a shared writable mapping is refused.
  CHECK(mmap(nullptr, resp->bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
             0) == MAP_FAILED);
  CHECK(errno == EPERM);
  close(fd);
}

TEST_CASE("local: a mapping outlives the delete of its version until released",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  const Region r{{0, kRows}, {0, kCols}};
  SaveRows(*c, 1, 0, kRows, 5);
  {
    auto m = c->Map("job", 1, "w", r);
    REQUIRE(m.ok());
    REQUIRE(d->client->DeleteVersion("job", 1).ok());
    // Still readable, still paid for.
    CHECK(testing::CheckPattern(5, 0, reinterpret_cast<const char*>(m->data()),
                                m->size()));
    CHECK(d->server->store()->data_bytes_used() == kRows * kCols * 4);
  }
  // Released: the memory is back.
  d->server->store()->WaitReleased();
  CHECK(d->server->store()->data_bytes_used() == 0);
}

TEST_CASE("local: handles and leases belong to their connection",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto owner = Connect(*d);
  auto thief = Connect(*d);
  auto buf = owner->AllocatePut("job", 1, "w", Region{{0, 8}, {0, kCols}});
  REQUIRE(buf.ok());
  proto::LocalRequest commit;
  commit.mutable_commit_put()->set_handle(buf->handle());
  auto stolen = thief->Call(commit, nullptr);
  REQUIRE(stolen.ok());
  CHECK(stolen->code() ==
        static_cast<int>(absl::StatusCode::kPermissionDenied));
  CHECK(stolen->message().find("another client") != std::string::npos);
  proto::LocalRequest bogus;
  bogus.mutable_release()->set_lease(987654);
  CHECK(thief->Call(bogus, nullptr)->code() ==
        static_cast<int>(absl::StatusCode::kNotFound));
  REQUIRE(owner->CommitPut(&*buf).ok());
}

TEST_CASE("local: a lease is no put handle and a put handle no lease",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  SaveRows(*c, 1, 0, kRows, 3);
  proto::LocalRequest map;
  map.mutable_map()->set_job("job");
  map.mutable_map()->set_version(1);
  map.mutable_map()->set_tensor("w");
  RegionToProto(Region{{0, kRows}, {0, kCols}},
                map.mutable_map()->mutable_region());
  int fd = -1;
  auto mapped = c->Call(map, &fd);
  REQUIRE(mapped.ok());
  REQUIRE(mapped->code() == 0);
  close(fd);
  const uint64_t lease = mapped->handle();
  auto buf = c->AllocatePut("job", 2, "w", Region{{0, 8}, {0, kCols}});
  REQUIRE(buf.ok());
  proto::LocalRequest commit;
  commit.mutable_commit_put()->set_handle(lease);
  auto as_put = c->Call(commit, nullptr);
  REQUIRE(as_put.ok());
  CHECK(as_put->code() == static_cast<int>(absl::StatusCode::kNotFound));
  CHECK(as_put->message().find("is a lease") != std::string::npos);
  proto::LocalRequest batch;
  batch.mutable_commit_puts()->add_handles(lease);
  CHECK(c->Call(batch, nullptr)->code() ==
        static_cast<int>(absl::StatusCode::kNotFound));
  proto::LocalRequest abort;
  abort.mutable_abort_put()->set_handle(lease);
  CHECK(c->Call(abort, nullptr)->code() ==
        static_cast<int>(absl::StatusCode::kNotFound));
  proto::LocalRequest release;
  release.mutable_release()->set_lease(buf->handle());
  auto as_lease = c->Call(release, nullptr);
  CHECK(as_lease->code() == static_cast<int>(absl::StatusCode::kNotFound));
  CHECK(as_lease->message().find("is a put handle") != std::string::npos);
  // Both still work as what they are.
  CHECK(c->CommitPut(&*buf).ok());
  proto::LocalRequest done;
  done.mutable_release()->set_lease(lease);
  CHECK(c->Call(done, nullptr)->code() == 0);
}

TEST_CASE("local: CommitPuts commits a batch, one answer per put",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  // Eight puts of 8 rows: four filled in place (no checksum sent), three
  // with their checksum, one with a wrong one.
  std::vector<LocalClient::PutBuffer> bufs;
  std::vector<uint64_t> want, sent;
  for (int k = 0; k < 8; ++k) {
    auto b =
        c->AllocatePut("job", 1, "w", Region{{8 * k, 8 * k + 8}, {0, kCols}});
    REQUIRE(b.ok());
    testing::FillPattern(k, 0, reinterpret_cast<char*>(b->data()), b->size());
    want.push_back(Checksum(b->data(), b->size()));
    sent.push_back(k < 4 ? 0 : k == 7 ? want.back() ^ 1 : want.back());
    bufs.push_back(*std::move(b));
  }
  std::vector<LocalClient::PutBuffer*> ptrs;
  for (auto& b : bufs) ptrs.push_back(&b);
  auto results = c->CommitPuts(ptrs, sent);
  REQUIRE(results.ok());
  REQUIRE(results->size() == 8);
  for (int k = 0; k < 7; ++k) {
    CHECK((*results)[k].status.ok());
    CHECK((*results)[k].checksum == want[k]);
  }
  CHECK((*results)[7].status.code() == absl::StatusCode::kDataLoss);
  CHECK((*results)[7].checksum == want[7]);
  std::vector<char> back(8 * kCols * 4);
  REQUIRE(d->client
              ->Read("job", 1, "w", Region{{16, 24}, {0, kCols}}, back.data(),
                     back.size())
              .ok());
  CHECK(testing::CheckPattern(2, 0, back.data(), back.size()));

  // The same region again: refused, with the checksum of the new bytes.
  auto again = c->AllocatePut("job", 1, "w", Region{{0, 8}, {0, kCols}});
  REQUIRE(again.ok());
  testing::FillPattern(0, 0, reinterpret_cast<char*>(again->data()),
                       again->size());
  auto dup = c->CommitPuts({&*again}, {});
  REQUIRE(dup.ok());
  CHECK((*dup)[0].status.code() == absl::StatusCode::kAlreadyExists);
  CHECK((*dup)[0].checksum == want[0]);

  // Hostile batches change nothing.
  auto pending = c->AllocatePut("job", 1, "w", Region{{56, 64}, {0, kCols}});
  REQUIRE(pending.ok());
  pending->Unmap();
  auto code = [&](const proto::LocalRequest& req) {
    auto r = c->Call(req, nullptr);
    REQUIRE(r.ok());
    CHECK(r->put_results_size() == 0);
    return r->code();
  };
  proto::LocalRequest twice;
  twice.mutable_commit_puts()->add_handles(pending->handle());
  twice.mutable_commit_puts()->add_handles(pending->handle());
  CHECK(code(twice) == static_cast<int>(absl::StatusCode::kInvalidArgument));
  proto::LocalRequest none;
  none.mutable_commit_puts();
  CHECK(code(none) == static_cast<int>(absl::StatusCode::kInvalidArgument));
  proto::LocalRequest too_many;
  for (int k = 0; k <= store_internal::kMaxCommitPuts; ++k)
    too_many.mutable_commit_puts()->add_handles(pending->handle());
  CHECK(code(too_many) == static_cast<int>(absl::StatusCode::kInvalidArgument));
  proto::LocalRequest counts;
  counts.mutable_commit_puts()->add_handles(pending->handle());
  counts.mutable_commit_puts()->add_checksums(1);
  counts.mutable_commit_puts()->add_checksums(2);
  CHECK(code(counts) == static_cast<int>(absl::StatusCode::kInvalidArgument));
  proto::LocalRequest unknown;
  unknown.mutable_commit_puts()->add_handles(pending->handle());
  unknown.mutable_commit_puts()->add_handles(424242);
  CHECK(code(unknown) == static_cast<int>(absl::StatusCode::kNotFound));
  // The pending put survived all of that.
  auto last = c->CommitPuts({&*pending}, {});
  REQUIRE(last.ok());
  CHECK((*last)[0].status.ok());
}

TEST_CASE(
    "local: a pack of small regions is one memfd, written, committed and "
    "loaded region by region",
    "[tensor_store][local]") {
  auto d = StartWithTensor();
  // "big": 4 MiB in regions of 512 KiB, a pack of a huge page and more
  // (copied into a mapping where the host gives huge pages); "w" and "b":
  // a pack of 64 KiB (through the descriptor), with a 30-byte region.
  REQUIRE(d->client
              ->Declare("job", {{"big", DType::kFloat32, {1024, 1024}},
                                {"b", DType::kFloat16, {3, 5}}})
              .ok());
  auto c = Connect(*d);
  const int64_t before = d->server->store()->data_bytes_used();
  for (const bool large : {false, true}) {
    std::vector<std::pair<std::string, Region>> items;
    if (large) {
      for (int64_t k = 0; k < 8; ++k)
        items.push_back({"big", Region{{128 * k, 128 * k + 128}, {0, 1024}}});
    } else {
      items = {{"w", Region{{0, 8}, {0, kCols}}},
               {"b", Region{{0, 3}, {0, 5}}},
               {"w", Region{{8, 16}, {0, kCols}}}};
    }
    const int64_t version = large ? 2 : 1;
    auto bufs = c->AllocatePuts("job", version, items);
    REQUIRE(bufs.ok());
    REQUIRE(bufs->size() == items.size());
    std::vector<std::vector<char>> bytes;
    std::vector<LocalClient::PutBuffer*> ptrs;
    std::vector<uint64_t> sums;
    for (size_t i = 0; i < items.size(); ++i) {
      LocalClient::PutBuffer& b = (*bufs)[i];
      CHECK(b.packed());
      bytes.emplace_back(b.size());
      testing::FillPattern(10 * version + i, 0, bytes.back().data(), b.size());
      CHECK(b.Write(1, bytes.back().data(), b.size()).code() ==
            absl::StatusCode::kOutOfRange);  // past its region
      REQUIRE(b.Write(0, bytes.back().data(), b.size()).ok());
      sums.push_back(Checksum(bytes.back().data(), b.size()));
      ptrs.push_back(&b);
    }
    CHECK((*bufs)[1].size() == (large ? 512 << 10 : 30));
    // Sealed whole at its first commit: a commit of part of the pack is
    // refused and seals nothing.
    std::vector<LocalClient::PutBuffer*> some = ptrs;
    std::vector<uint64_t> some_sums = sums;
    some.erase(some.begin() + 1);
    some_sums.erase(some_sums.begin() + 1);
    auto part = c->CommitPuts(some, some_sums);
    REQUIRE_FALSE(part.ok());
    CHECK(part.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(part.status().message(), "in one CommitPuts"));
    CHECK(c->CommitPut(ptrs[1], sums[1]).status().code() ==
          absl::StatusCode::kFailedPrecondition);
    REQUIRE((*bufs)[1].Write(0, bytes[1].data(), (*bufs)[1].size()).ok());
    // Given in another order, with a put that is not in the pack between
    // them: one request, the pack whole.
    auto alone = c->AllocatePut("job", version, "w",
                                Region{{56, 64}, {0, kCols}}, /*map=*/false);
    REQUIRE(alone.ok());
    std::vector<char> alone_bytes(alone->size(), 5);
    REQUIRE(alone->Write(0, alone_bytes.data(), alone->size()).ok());
    std::vector<LocalClient::PutBuffer*> all = {ptrs.back(), &*alone};
    std::vector<uint64_t> all_sums = {sums.back(), 0};
    all.insert(all.end(), ptrs.begin(), ptrs.end() - 1);
    all_sums.insert(all_sums.end(), sums.begin(), sums.end() - 1);
    auto done = c->CommitPuts(all, all_sums);
    INFO(done.status().ToString());
    REQUIRE(done.ok());
    for (const auto& r : *done) CHECK(r.status.ok());
    CHECK((*done)[0].checksum == sums.back());
    CHECK((*done)[3].checksum == sums[1]);
    // Loaded alone, each from its offset: read through the descriptor,
    // mapped, and over gRPC.
    ino_t inode = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      auto m = c->Map("job", version, items[i].first, items[i].second,
                      /*map=*/false);
      REQUIRE(m.ok());
      CHECK(m->checksum() == sums[i]);
      if (i == 0) inode = m->inode();
      CHECK(m->inode() == inode);  // one memfd
      std::vector<char> back(m->size());
      REQUIRE(m->Read(0, back.data(), m->size()).ok());
      CHECK(back == bytes[i]);
      REQUIRE(m->MapNow().ok());
      CHECK(std::memcmp(m->data(), bytes[i].data(), bytes[i].size()) == 0);
      std::vector<char> rpc(bytes[i].size());
      REQUIRE(d->client
                  ->Read("job", version, items[i].first, items[i].second,
                         rpc.data(), rpc.size())
                  .ok());
      CHECK(rpc == bytes[i]);
    }
  }
  // Deleted, every pack's memory comes back.
  REQUIRE(d->client->DeleteVersion("job", 1).ok());
  REQUIRE(d->client->DeleteVersion("job", 2).ok());
  d->server->store()->WaitReleased();
  CHECK(d->server->store()->data_bytes_used() == before);
}

TEST_CASE(
    "local: MapMany leases many regions in one request, a pack's sharing one "
    "descriptor, and Release lets go of them together",
    "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  // Rows 0-16 in a pack of two regions, rows 16-64 alone.
  const std::vector<std::pair<std::string, Region>> packed = {
      {"w", Region{{0, 8}, {0, kCols}}}, {"w", Region{{8, 16}, {0, kCols}}}};
  auto bufs = c->AllocatePuts("job", 1, packed);
  REQUIRE(bufs.ok());
  std::vector<LocalClient::PutBuffer*> ptrs;
  std::vector<std::vector<char>> bytes;
  for (size_t i = 0; i < bufs->size(); ++i) {
    bytes.emplace_back((*bufs)[i].size());
    testing::FillPattern(40 + i, 0, bytes.back().data(), bytes.back().size());
    REQUIRE((*bufs)[i].Write(0, bytes.back().data(), bytes.back().size()).ok());
    ptrs.push_back(&(*bufs)[i]);
  }
  auto done = c->CommitPuts(ptrs, {});
  REQUIRE(done.ok());
  for (const auto& r : *done) REQUIRE(r.status.ok());
  const uint64_t alone_sum = SaveRows(*c, 1, 16, kRows, 42);
  const int64_t stored = d->server->store()->data_bytes_used();

  std::vector<std::pair<std::string, Region>> items = packed;
  items.push_back({"w", Region{{16, kRows}, {0, kCols}}});
  items.push_back(packed[0]);  // twice: two leases of one region
  auto ms = c->MapMany("job", 1, items);
  INFO(ms.status().ToString());
  REQUIRE(ms.ok());
  REQUIRE(ms->size() == items.size());
  CHECK((*ms)[0].inode() == (*ms)[1].inode());  // the pack's one memfd
  CHECK((*ms)[0].inode() != (*ms)[2].inode());
  CHECK((*ms)[2].checksum() == alone_sum);
  for (size_t i = 0; i < 2; ++i) {
    CHECK((*ms)[i].checksum() == (*done)[i].checksum);
    std::vector<char> back((*ms)[i].size());
    REQUIRE((*ms)[i].Read(0, back.data(), back.size()).ok());
    CHECK(back == bytes[i]);
  }
  std::vector<char> back3((*ms)[3].size());
  REQUIRE((*ms)[3].Read(0, back3.data(), back3.size()).ok());
  CHECK(back3 == bytes[0]);
  REQUIRE((*ms)[2].MapNow().ok());
  CHECK(testing::CheckPattern(
      42, 0, reinterpret_cast<const char*>((*ms)[2].data()), (*ms)[2].size()));

  // Deleted while leased: still readable, still paid for.
  REQUIRE(d->client->DeleteVersion("job", 1).ok());
  CHECK(d->server->store()->data_bytes_used() == stored);
  REQUIRE(c->Release(&*ms).ok());
  // Released (each lease once), and readable until destroyed.
  REQUIRE((*ms)[0].Read(0, back3.data(), back3.size()).ok());
  CHECK(back3 == bytes[0]);
  ms->clear();
  d->server->store()->WaitReleased();
  CHECK(d->server->store()->data_bytes_used() == 0);
}

TEST_CASE("local: hostile MapMany and Release requests get clear errors",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  SaveRows(*c, 1, 0, 32, 1);
  SaveRows(*c, 1, 32, kRows, 2);
  const Region top{{0, 32}, {0, kCols}}, bottom{{32, kRows}, {0, kCols}};
  auto code = [&](const proto::LocalRequest& req) {
    auto resp = c->Call(req, nullptr);
    REQUIRE(resp.ok());
    return absl::Status(static_cast<absl::StatusCode>(resp->code()),
                        resp->message());
  };
  proto::LocalRequest none;
  none.mutable_map_many()->set_job("job");
  none.mutable_map_many()->set_version(1);
  CHECK(code(none).code() == absl::StatusCode::kInvalidArgument);
  proto::LocalRequest many = none;
  for (int i = 0; i <= store_internal::kMaxMapRegions; ++i) {
    proto::AllocatePutsOp::Item* item = many.mutable_map_many()->add_items();
    item->set_tensor("w");
    RegionToProto(top, item->mutable_region());
  }
  const absl::Status too_many = code(many);
  CHECK(too_many.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(too_many.message(), "1 to 128"));
  // One item that is no stored region fails the request, naming it, and
  // leases nothing.
  auto wrong = c->MapMany(
      "job", 1, {{"w", top}, {"w", bottom}, {"w", Region{{0, 8}, {0, kCols}}}});
  CHECK(wrong.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(wrong.status().message(), "item 2"));
  auto gone = c->MapMany("job", 9, {{"w", top}});
  CHECK(gone.status().code() == absl::StatusCode::kNotFound);
  proto::LocalRequest no_rank = none;
  no_rank.mutable_map_many()->add_items()->set_tensor("w");
  CHECK(code(no_rank).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(d->client->DeleteVersion("job", 1).ok());
  d->server->store()->WaitReleased();
  CHECK(d->server->store()->data_bytes_used() == 0);  // nothing leased

  SaveRows(*c, 2, 0, 32, 1);
  auto ms = c->MapMany("job", 2, {{"w", top}, {"w", top}});
  REQUIRE(ms.ok());
  const uint64_t a = (*ms)[0].lease(), b = (*ms)[1].lease();
  // Release: all or none.
  proto::LocalRequest twice;
  twice.mutable_release()->add_leases(a);
  twice.mutable_release()->add_leases(a);
  CHECK(code(twice).code() == absl::StatusCode::kInvalidArgument);
  proto::LocalRequest bogus;
  bogus.mutable_release()->add_leases(a);
  bogus.mutable_release()->add_leases(987654);
  CHECK(code(bogus).code() == absl::StatusCode::kNotFound);
  proto::LocalRequest huge;
  for (int i = 0; i <= store_internal::kMaxReleaseLeases; ++i)
    huge.mutable_release()->add_leases(a);
  CHECK(code(huge).code() == absl::StatusCode::kInvalidArgument);
  proto::LocalRequest both;
  both.mutable_release()->add_leases(a);
  both.mutable_release()->add_leases(b);
  CHECK(code(both).ok());  // both were still held
  CHECK(code(both).code() == absl::StatusCode::kNotFound);  // and are no more
  ms->clear();  // their own releases are refused and ignored
  CHECK(d->server->local()->num_clients() == 1);
}

TEST_CASE("local: a connection holds a bounded number of leases",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  SaveRows(*c, 1, 0, kRows, 1);
  std::vector<std::pair<std::string, Region>> items(
      store_internal::kMaxMapRegions, {"w", Region{{0, kRows}, {0, kCols}}});
  std::vector<std::vector<LocalClient::Mapping>> held;
  for (int i = 0; i < store_internal::kMaxLeasesPerConnection /
                          store_internal::kMaxMapRegions;
       ++i) {
    auto ms = c->MapMany("job", 1, items);
    REQUIRE(ms.ok());
    held.push_back(*std::move(ms));
  }
  auto more = c->Map("job", 1, "w", Region{{0, kRows}, {0, kCols}});
  CHECK(more.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(more.status().message(), "release regions"));
  REQUIRE(c->Release(&held.back()).ok());
  held.pop_back();
  CHECK(c->Map("job", 1, "w", Region{{0, kRows}, {0, kCols}}).ok());
  for (auto& h : held) REQUIRE(c->Release(&h).ok());
}

TEST_CASE(
    "local: a pack's puts abort one by one; hostile packs get clear errors",
    "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  const int64_t before = d->server->store()->data_bytes_used();
  const Region top{{0, 8}, {0, kCols}}, next{{8, 16}, {0, kCols}};
  auto bufs = c->AllocatePuts("job", 1, {{"w", top}, {"w", next}});
  REQUIRE(bufs.ok());
  REQUIRE(c->AbortPut(&(*bufs)[0]).ok());
  // The rest of the pack commits without it.
  std::vector<char> bytes((*bufs)[1].size(), 9);
  REQUIRE((*bufs)[1].Write(0, bytes.data(), bytes.size()).ok());
  auto done = c->CommitPuts({&(*bufs)[1]}, {});
  REQUIRE(done.ok());
  CHECK((*done)[0].status.ok());
  CHECK(c->Map("job", 1, "w", top).status().code() ==
        absl::StatusCode::kNotFound);

  auto code = [&](const proto::LocalRequest& req) {
    int fd = -1;
    auto r = c->Call(req, &fd);
    REQUIRE(r.ok());
    CHECK(fd < 0);  // no memory handed out
    CHECK(r->handles_size() == 0);
    return absl::Status(static_cast<absl::StatusCode>(r->code()), r->message());
  };
  auto item = [](proto::AllocatePutsOp* op, const std::string& tensor,
                 const Region& r) {
    auto* it = op->add_items();
    it->set_tensor(tensor);
    RegionToProto(r, it->mutable_region());
  };
  proto::LocalRequest empty;
  empty.mutable_allocate_puts()->set_job("job");
  CHECK(code(empty).code() == absl::StatusCode::kInvalidArgument);
  proto::LocalRequest too_many;
  too_many.mutable_allocate_puts()->set_job("job");
  for (int k = 0; k <= kMaxPackRegions; ++k)
    item(too_many.mutable_allocate_puts(), "w", top);
  CHECK(code(too_many).code() == absl::StatusCode::kInvalidArgument);
  proto::LocalRequest wrong;
  wrong.mutable_allocate_puts()->set_job("job");
  wrong.mutable_allocate_puts()->set_version(2);
  item(wrong.mutable_allocate_puts(), "w", top);
  item(wrong.mutable_allocate_puts(), "w", Region{{0, 8}, {0, kCols + 1}});
  const absl::Status outside = code(wrong);
  CHECK(outside.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(outside.message(), "item 1"));
  proto::LocalRequest no_rank;
  no_rank.mutable_allocate_puts()->set_job("job");
  no_rank.mutable_allocate_puts()->add_items()->set_tensor("w");
  CHECK(code(no_rank).code() == absl::StatusCode::kInvalidArgument);
  // The aborted region's part of the pack stays until the pack goes.
  CHECK(d->server->store()->data_bytes_used() - before == 2 * 8 * kCols * 4);
}

TEST_CASE("local: against a ptcd that predates CommitPuts, puts one by one",
          "[tensor_store][local]") {
  // What an older ptcd answers: CommitPuts is an empty request to it.
  testing::TempDir dir;
  const std::string path = dir.path() + "/old.sock";
  const int listener = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(bind(listener, reinterpret_cast<struct sockaddr*>(&addr),
               sizeof(addr)) == 0);
  REQUIRE(listen(listener, 1) == 0);
  std::vector<uint64_t> committed, released;
  int maps = 0;
  std::thread old_ptcd([&] {
    const int conn = accept(listener, nullptr, nullptr);
    for (;;) {
      int unused = -1;
      auto packet = store_internal::ReceivePacket(conn, &unused);
      proto::LocalRequest req;
      if (!packet.ok() || !req.ParseFromString(*packet)) break;
      proto::LocalResponse resp;
      resp.set_request_id(req.request_id());
      resp.set_answered(true);
      int fd = -1;
      if (req.has_allocate_put()) {
        fd = memfd_create("old", 0);
        if (ftruncate(fd, 4096) != 0) break;
        resp.set_handle(7);
        resp.set_bytes(4096);
      } else if (req.has_commit_put()) {
        committed.push_back(req.commit_put().checksum());
        resp.set_checksum(req.commit_put().checksum());
      } else if (req.has_map()) {
        fd = memfd_create("old", 0);
        if (ftruncate(fd, 4096) != 0) break;
        resp.set_handle(100 + maps++);
        resp.set_bytes(4096);
      } else if (req.has_release() && req.release().leases_size() == 0) {
        released.push_back(req.release().lease());
      } else {
        resp.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
        resp.set_message("local request names no operation");
      }
      const bool sent =
          store_internal::SendPacket(conn, resp.SerializeAsString(), fd).ok();
      if (fd >= 0) close(fd);
      if (!sent) break;
    }
    close(conn);
  });
  {
    auto c = LocalClient::Connect(path);
    REQUIRE(c.ok());
    auto b = (*c)->AllocatePut("job", 1, "w", Region{{0, 1}, {0, 1024}});
    REQUIRE(b.ok());
    testing::FillPattern(5, 0, reinterpret_cast<char*>(b->data()), b->size());
    const uint64_t want = Checksum(b->data(), b->size());
    auto results = (*c)->CommitPuts({&*b}, {});
    REQUIRE(results.ok());
    CHECK((*results)[0].status.ok());
    CHECK((*results)[0].checksum == want);
    REQUIRE(committed.size() == 1);
    CHECK(committed[0] ==
          want);  // checksummed by the client for the old daemon
    // AllocatePuts is an empty request to it too: one AllocatePut per
    // region, no pack.
    auto two = (*c)->AllocatePuts(
        "job", 1,
        {{"w", Region{{1, 2}, {0, 1024}}}, {"w", Region{{2, 3}, {0, 1024}}}});
    REQUIRE(two.ok());
    REQUIRE(two->size() == 2);
    std::vector<char> bytes(4096, 3);
    for (LocalClient::PutBuffer& p : *two) {
      CHECK_FALSE(p.packed());
      REQUIRE(p.Write(0, bytes.data(), p.size()).ok());
    }
    auto done = (*c)->CommitPuts({&(*two)[0], &(*two)[1]}, {});
    REQUIRE(done.ok());
    for (const auto& r : *done) CHECK(r.status.ok());
    REQUIRE(committed.size() == 3);
    CHECK(committed[1] == Checksum(bytes.data(), bytes.size()));
    CHECK(committed[2] == committed[1]);
    // MapMany too: one Map per region, and one Release per lease.
    auto ms = (*c)->MapMany(
        "job", 1,
        {{"w", Region{{1, 2}, {0, 1024}}}, {"w", Region{{2, 3}, {0, 1024}}}});
    REQUIRE(ms.ok());
    REQUIRE(ms->size() == 2);
    CHECK(maps == 2);
    CHECK((*ms)[1].size() == 4096);
    REQUIRE((*c)->Release(&*ms).ok());
    CHECK(released == std::vector<uint64_t>{100, 101});
  }
  old_ptcd.join();
  close(listener);
}

TEST_CASE("local: a put still mapped writable stays pending in a batch",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  auto mapped = c->AllocatePut("job", 1, "w", Region{{0, 8}, {0, kCols}});
  auto done = c->AllocatePut("job", 1, "w", Region{{8, 16}, {0, kCols}});
  REQUIRE(mapped.ok());
  REQUIRE(done.ok());
  done->Unmap();
  proto::LocalRequest req;
  req.mutable_commit_puts()->add_handles(mapped->handle());
  req.mutable_commit_puts()->add_handles(done->handle());
  auto r = c->Call(req, nullptr);
  REQUIRE(r.ok());
  REQUIRE(r->put_results_size() == 2);
  CHECK(r->put_results(0).code() ==
        static_cast<int>(absl::StatusCode::kFailedPrecondition));
  CHECK(r->put_results(0).message().find("unmap") != std::string::npos);
  CHECK(r->put_results(1).code() == 0);
  CHECK(c->CommitPut(&*mapped).ok());  // unmaps, then commits
}

TEST_CASE(
    "local: committing while still mapped writable is refused, then works",
    "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  auto buf = c->AllocatePut("job", 1, "w", Region{{0, 8}, {0, kCols}});
  REQUIRE(buf.ok());
  proto::LocalRequest commit;
  commit.mutable_commit_put()->set_handle(buf->handle());
  auto early = c->Call(commit, nullptr);  // buf is still mapped
  REQUIRE(early.ok());
  CHECK(early->code() ==
        static_cast<int>(absl::StatusCode::kFailedPrecondition));
  CHECK(early->message().find("unmap") != std::string::npos);
  CHECK(c->CommitPut(&*buf).ok());  // unmaps, then commits
}

TEST_CASE("local: a client that disconnects mid-save leaves nothing behind",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  {
    auto c = Connect(*d);
    auto buf = c->AllocatePut("job", 1, "w", Region{{0, kRows}, {0, kCols}});
    REQUIRE(buf.ok());
    std::memset(buf->data(), 1, buf->size() / 2);
    CHECK(d->server->store()->data_bytes_used() == kRows * kCols * 4);
  }  // disconnect without commit
  // The daemon's thread for that client notices and aborts the put (a
  // moment, or seconds on a busy machine).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (d->server->store()->data_bytes_used() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  CHECK(d->server->store()->data_bytes_used() == 0);
  CHECK(d->server->store()->List("job").jobs(0).versions_size() == 0);
}

TEST_CASE("local: malformed requests and wrong regions get clear errors",
          "[tensor_store][local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  SaveRows(*c, 1, 0, kRows, 6);
  auto part = c->Map("job", 1, "w", Region{{0, 8}, {0, kCols}});
  CHECK(part.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(part.status().message().find("not one stored region") !=
        std::string::npos);
  auto unknown = c->AllocatePut("job", 1, "nope", Region{{0, 8}, {0, kCols}});
  CHECK(unknown.status().code() == absl::StatusCode::kNotFound);
  proto::LocalRequest empty;
  CHECK(c->Call(empty, nullptr)->code() ==
        static_cast<int>(absl::StatusCode::kInvalidArgument));
  CHECK(d->server->local()->num_clients() == 1);
}

TEST_CASE(
    "local: garbage and oversized packets are refused, the connection lives on",
    "[tensor_store][local]") {
  auto d = StartDaemon();
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, d->socket_path().c_str(),
               sizeof(addr.sun_path) - 1);
  REQUIRE(connect(fd, reinterpret_cast<struct sockaddr*>(&addr),
                  sizeof(addr)) == 0);
  auto answer = [&](const std::string& packet) {
    REQUIRE(send(fd, packet.data(), packet.size(), 0) ==
            static_cast<ssize_t>(packet.size()));
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    REQUIRE(n > 0);
    proto::LocalResponse resp;
    REQUIRE(resp.ParseFromArray(buf, n));
    return resp;
  };
  const proto::LocalResponse garbage =
      answer(std::string("\xff\xff\xff\xff\x0fjunk", 9));
  CHECK(garbage.code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
  CHECK(garbage.message().find("malformed") != std::string::npos);
  const proto::LocalResponse huge = answer(std::string(100 << 10, 'x'));
  CHECK(huge.code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
  CHECK(huge.message().find("larger than") != std::string::npos);
  close(fd);
  // The daemon still serves a proper client.
  auto c = Connect(*d);
  proto::LocalRequest empty;
  CHECK(c->Call(empty, nullptr).ok());
}

TEST_CASE("local: small objects round-trip and the daemon says who it is",
          "[local]") {
  auto d = StartWithTensor();
  auto c = Connect(*d);
  const std::string rng(5056, '\x5a');
  REQUIRE(c->PutSmallObject("job", 1, "rng.default", 3, rng).ok());
  auto got = c->GetSmallObject("job", 1, "rng.default", 3);
  REQUIRE(got.ok());
  CHECK(*got == rng);
  // The same object over gRPC, checksum checked.
  auto remote = d->client->GetSmallObject("job", 1, "rng.default", 3);
  REQUIRE(remote.ok());
  CHECK(*remote == rng);
  auto big = c->PutSmallObject("job", 1, "sched", 0,
                               std::string(kMaxSmallObjectBytes + 1, 'x'));
  CHECK(big.code() == absl::StatusCode::kInvalidArgument);
  auto missing = c->GetSmallObject("job", 1, "rng.default", 4);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);

  auto hello = c->SayHello("job");
  REQUIRE(hello.ok());
  CHECK(hello->committed_versions.empty());
  REQUIRE(d->client->Commit("job", 1).ok());
  hello = c->SayHello("job");
  REQUIRE(hello.ok());
  CHECK(hello->committed_versions == std::vector<int64_t>{1});
}

// The process's token key for one test; tokens are off again after it.
class TokenKey {
 public:
  TokenKey() {
    const std::string path = dir_.path() + "/tokens.key";
    std::ofstream(path) << std::string(64, 'k') << "\n";
    chmod(path.c_str(), 0600);
    REQUIRE(ConfigureJobTokens(path).ok());
  }
  ~TokenKey() { ConfigureJobTokens("").IgnoreError(); }

 private:
  testing::TempDir dir_;
};

TEST_CASE("local: with a token key a connection acts on its token's job only",
          "[tensor_store][local][security]") {
  TokenKey key;
  auto d = StartWithTensor();
  REQUIRE(d->client->Declare("other", {{"w", DType::kFloat32, {4, 4}}}).ok());

  auto c = Connect(*d);
  // Nothing before a Hello with a token.
  auto put = c->AllocatePut("job", 1, "w", Region{{0, 1}, {0, kCols}});
  CHECK(put.status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(c->SayHello("job").status().code() ==
        absl::StatusCode::kUnauthenticated);
  // A forged token, and a token moved to another job.
  const std::string real = IssueJobToken("job");
  std::string forged = real;
  forged.back() = forged.back() == '0' ? '1' : '0';
  CHECK(c->SayHello("job", forged).status().code() ==
        absl::StatusCode::kUnauthenticated);
  CHECK(
      c->SayHello("job", "ptc1:job:" + std::string(64, '0')).status().code() ==
      absl::StatusCode::kUnauthenticated);
  CHECK(c->SayHello("job", IssueJobToken("other")).status().code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(c->AllocatePut("job", 1, "w", Region{{0, 1}, {0, kCols}})
            .status()
            .code() == absl::StatusCode::kUnauthenticated);

  // The job's own token: its job works, another job's does not.
  REQUIRE(c->SayHello("job", real).ok());
  SaveRows(*c, 1, 0, 64, 7);
  CHECK(c->PutSmallObject("other", 1, "rng", 0, "x").code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(
      c->AllocatePut("other", 1, "w", Region{{0, 4}, {0, 4}}).status().code() ==
      absl::StatusCode::kPermissionDenied);
  CHECK(c->AllocatePuts(
             "other", 1,
             {{"w", Region{{0, 2}, {0, 4}}}, {"w", Region{{2, 4}, {0, 4}}}})
            .status()
            .code() == absl::StatusCode::kPermissionDenied);
  CHECK(
      c->MapMany("other", 1, {{"w", Region{{0, 4}, {0, 4}}}}).status().code() ==
      absl::StatusCode::kPermissionDenied);
  auto own = c->AllocatePuts(
      "job", 2,
      {{"w", Region{{0, 1}, {0, kCols}}}, {"w", Region{{1, 2}, {0, kCols}}}});
  REQUIRE(own.ok());
  for (LocalClient::PutBuffer& b : *own) REQUIRE(c->AbortPut(&b).ok());
  CHECK(c->Declare("other", {{"v", DType::kFloat32, {2}}}).code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(c->SayHello("other", IssueJobToken("other")).status().code() ==
        absl::StatusCode::kPermissionDenied);
  REQUIRE(d->client->Commit("job", 1).ok());
  auto mapped = c->Map("job", 1, "w", Region{{0, kRows}, {0, kCols}});
  CHECK(mapped.ok());
  // The store holds nothing of "other" from this client.
  CHECK(d->client->GetSmallObject("other", 1, "rng", 0).status().code() ==
        absl::StatusCode::kNotFound);
}

// Connects from a child process that runs as user nobody with the given
// supplementary groups; returns the Hello's status code (or -1).
int HelloFromNobody(const std::string& socket, std::vector<gid_t> groups) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(groups.size(), groups.data()) != 0 || setgid(65534) != 0 ||
        setuid(65534) != 0)
      _exit(100);
    auto c = LocalClient::Connect(socket);
    if (!c.ok()) _exit(101);
    _exit(static_cast<int>((*c)->SayHello("job").status().code()));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_CASE("local: members of the daemon's group may connect, others not",
          "[tensor_store][local][security]") {
  if (geteuid() != 0) {
    WARN("needs root to run clients as other users; not checked here");
    return;
  }
  // A directory everyone can reach.
  char dir_template[] = "/tmp/ptc-group-test-XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  chmod(dir.c_str(), 0777);
  Store store(StoreOptions{});
  const gid_t group = 4242;
  LocalServerOptions options;
  options.socket_path = dir + "/ptcd.sock";
  options.allowed_gid = group;
  auto server = LocalServer::Start(&store, options);
  REQUIRE(server.ok());
  // The socket belongs to the group (mode 0660): its members reach it,
  // other users do not (the connect fails).
  struct stat st;
  REQUIRE(stat(options.socket_path.c_str(), &st) == 0);
  CHECK(st.st_gid == group);
  CHECK((st.st_mode & 0777) == 0660);
  CHECK(HelloFromNobody(options.socket_path, {group}) == 0);
  CHECK(HelloFromNobody(options.socket_path, {4243}) == 101);

  // A socket everyone can reach: the daemon's own check decides.
  chmod(options.socket_path.c_str(), 0666);
  CHECK(HelloFromNobody(options.socket_path, {group}) == 0);
  CHECK(HelloFromNobody(options.socket_path, {4243, group, 4244}) == 0);
  CHECK(HelloFromNobody(options.socket_path, {4243}) ==
        static_cast<int>(absl::StatusCode::kPermissionDenied));
  CHECK(HelloFromNobody(options.socket_path, {}) ==
        static_cast<int>(absl::StatusCode::kPermissionDenied));
  server->reset();
  rmdir(dir.c_str());
}

TEST_CASE(
    "local: a client beyond the most served at once is told "
    "RESOURCE_EXHAUSTED, and served once another leaves",
    "[tensor_store][local]") {
  testing::TempDir dir;
  Store store(StoreOptions{});
  LocalServerOptions options;
  options.socket_path = dir.path() + "/ptcd.sock";
  options.max_clients = 2;
  auto server = LocalServer::Start(&store, options);
  REQUIRE(server.ok());
  std::vector<std::unique_ptr<LocalClient>> served;
  for (int i = 0; i < 2; ++i) {
    auto c = LocalClient::Connect(options.socket_path);
    REQUIRE(c.ok());
    REQUIRE((*c)->SayHello("job").ok());
    served.push_back(std::move(*c));
  }
  auto third = LocalClient::Connect(options.socket_path);
  REQUIRE(third.ok());
  const absl::Status refused = (*third)->SayHello("job").status();
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused.message()),
             Catch::Contains("serves 2 local clients at once"));
  served.pop_back();
  // The departed client's thread ends on its own; the next one is served.
  absl::Status again;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  do {
    auto c = LocalClient::Connect(options.socket_path);
    REQUIRE(c.ok());
    again = (*c)->SayHello("job").status();
  } while (!again.ok() && absl::Now() < deadline &&
           (absl::SleepFor(absl::Milliseconds(20)), true));
  CHECK(again.ok());
}

TEST_CASE("local: a put never committed is aborted after put_timeout",
          "[tensor_store][local][hostile]") {
  testing::TempDir dir;
  Store store(StoreOptions{int64_t{64} << 20, 0, false});
  REQUIRE(store.DeclareTensors("job", {{"w", DType::kFloat32, {kRows, kCols}}})
              .ok());
  LocalServerOptions options;
  options.socket_path = dir.path() + "/ptcd.sock";
  // Long enough that a thread the machine's load holds back still sees
  // the allocation before the abort.
  options.put_timeout = absl::Seconds(3);
  auto server = LocalServer::Start(&store, options);
  REQUIRE(server.ok());
  auto c = LocalClient::Connect(options.socket_path);
  REQUIRE(c.ok());
  auto put = (*c)->AllocatePut("job", 1, "w", Region{{0, kRows}, {0, kCols}});
  REQUIRE(put.ok());
  CHECK(store.data_bytes_used() >= kRows * kCols * 4);
  // The client hangs on to it and never commits: aborted 3 s after its
  // allocation (waited for, for a busy machine).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (store.data_bytes_used() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(store.data_bytes_used() == 0);
  auto late = (*c)->CommitPut(&*put, 0);
  CHECK(late.status().code() == absl::StatusCode::kNotFound);
  // The connection still serves.
  CHECK((*c)->SayHello("job").ok());
}

}  // namespace
}  // namespace ptc
