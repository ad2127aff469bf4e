// The client's C ABI (client/c_api.h) as a C caller uses it, against a
// real cluster in process: a save and a load round trip, every failure a
// status code with a message (NULLs, indexes out of range, wrong sizes,
// garbage bytes), handles freed in any order, and results as JSON.
#include "client/c_api.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/client.h"
#include "client/internal/testing.h"
#include "tools/internal/synthetic.h"

namespace ptc {
namespace {

using testing::ClientCluster;

constexpr char kModel[] =
    "gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8,pad=8";

// The bytes of a ptc_bytes, released.
std::string Take(ptc_bytes* b) {
  std::string s(b->data, b->size);
  CHECK(b->data[b->size] == '\0');
  ptc_bytes_free(b);
  CHECK(b->data == nullptr);
  return s;
}

// Expects `code` (absl's numbering) and a message containing `text`.
void Expect(int got, int code, const std::string& text) {
  INFO(ptc_last_error());
  CHECK(got == code);
  CHECK(absl::StrContains(ptc_last_error(), text));
}

TEST_CASE("c api: configs, layouts and cursors without a cluster", "[c_api]") {
  CHECK(ptc_api_version() == PTC_C_API_VERSION);
  ptc_config* c = nullptr;
  REQUIRE(ptc_config_parse("tp=2,pp=2,dp=2", "", &c) == 0);
  ptc_bytes b{};
  REQUIRE(ptc_config_describe(c, &b) == 0);
  const std::string d = Take(&b);
  CHECK(absl::StrContains(d, "\"world_size\":8"));
  CHECK(absl::StrContains(d, "\"mesh\":[\"pp\",\"dp\",\"tp\"]"));
  REQUIRE(ptc_config_coord_of(c, 5, &b) == 0);
  CHECK(Take(&b) == "[1,0,1]");
  const int idx[3] = {1, 0, 1};
  int rank = -1;
  REQUIRE(ptc_config_rank_of(c, idx, 3, &rank) == 0);
  CHECK(rank == 5);
  Expect(ptc_config_rank_of(c, idx, 2, &rank), 3, "rank_of takes 3 indices");
  const int bad[3] = {0, 0, 7};
  Expect(ptc_config_rank_of(c, bad, 3, &rank), 11, "tp index 7 is outside 2");
  Expect(ptc_config_coord_of(c, 8, &b), 11, "rank 8 is outside 8 ranks");
  Expect(ptc_config_coord_of(c, -1, &b), 11, "rank -1");
  int first = 0, count = 0;
  REQUIRE(ptc_config_stage_layers(c, 1, 8, &first, &count) == 0);
  CHECK(first == 4);
  CHECK(count == 4);
  Expect(ptc_config_stage_layers(c, 2, 8, &first, &count), 11, "stage 2");
  Expect(ptc_config_stage_layers(c, 0, 1, &first, &count), 3, "");
  ptc_config_free(c);
  Expect(ptc_config_parse("tp=0", "", &c), 3, "between 1 and");
  Expect(ptc_config_parse(nullptr, "", &c), 3, "NULL");
  Expect(ptc_config_parse("tp=2", "", nullptr), 3, "NULL");

  int64_t vocab = 0;
  REQUIRE(ptc_padded_vocab("gpt:layers=2,hidden=64,heads=4,vocab=250,positions=8",
                           2, &vocab) == 0);
  CHECK(vocab == 256);
  Expect(ptc_padded_vocab("gpt:layers=2", -1, &vocab), 3, "tp must be >= 1");
  Expect(ptc_model_tensors("nonsense-model", &b), 5, "unknown model");
  REQUIRE(ptc_model_tensors(kModel, &b) == 0);
  CHECK(absl::StartsWith(Take(&b), "[[\"embedding.word.weight\",\"fp16\",[64,16]]"));

  ptc_cursor cursor{7, 100, 0, 8};
  REQUIRE(ptc_cursor_next_samples(&cursor, 1, 2, &b) == 0);
  const std::string samples = Take(&b);  // 8 per batch over dp=2: 4 each
  CHECK(std::count(samples.begin(), samples.end(), ',') == 3);
  REQUIRE(ptc_cursor_advance(&cursor) == 0);
  CHECK(cursor.consumed == 8);
  REQUIRE(ptc_cursor_encode(&cursor, &b) == 0);
  const std::string encoded = Take(&b);
  ptc_cursor back{};
  REQUIRE(ptc_cursor_decode(encoded.data(), encoded.size(), &back) == 0);
  CHECK(std::memcmp(&back, &cursor, sizeof(cursor)) == 0);
  Expect(ptc_cursor_decode("garbage", 7, &back), 3, "");
  Expect(ptc_cursor_next_samples(&cursor, 2, 2, &b), 3, "dp_rank 2 is outside");
  ptc_cursor broken{1, 0, 0, 8};
  Expect(ptc_cursor_advance(&broken), 3, "dataset_size >= 1");
  int64_t at = 0;
  Expect(ptc_cursor_sample_at(&cursor, -1, &at), 3, "position must be >= 0");

  int has = 1;
  uint64_t seed = 0;
  REQUIRE(ptc_derived_seed("abc", 3, &has, &seed) == 0);
  CHECK(has == 0);
  REQUIRE(ptc_derived_small_object("j", "rng", "dp=1", 3, &b) == 0);
  const std::string derived = Take(&b);
  REQUIRE(ptc_derived_seed(derived.data(), derived.size(), &has, &seed) == 0);
  CHECK(has == 1);

  Expect(ptc_check_layout("{not json", "", &b), 3, "");
  Expect(ptc_layout_regions(nullptr, "tp=1", &b), 3, "NULL");
}

TEST_CASE("c api: a rank saves and loads through the library, and every "
          "misuse is a code with a message",
          "[c_api]") {
  ClientCluster cluster(1, 2);
  cluster.RegisterJob("j", kModel, "tp=2", {"host0"});
  const std::string socket = cluster.daemons.daemons[0]->socket_path();

  ptc_client* client = nullptr;
  Expect(ptc_client_connect(socket.c_str(), cluster.address.c_str(), "j", 5,
                            "", 0, &client),
         9, "rank 5 is outside job");
  Expect(ptc_client_connect(socket.c_str(), cluster.address.c_str(), "nojob",
                            0, "", 0, &client),
         5, "nojob");
  REQUIRE(client == nullptr);
  std::vector<ptc_client*> clients(2);
  for (int rank = 0; rank < 2; ++rank) {
    REQUIRE(ptc_client_connect(socket.c_str(), cluster.address.c_str(), "j",
                               rank, nullptr, 0, &clients[rank]) == 0);
  }
  int64_t numbers[7];
  ptc_client_numbers(nullptr, numbers);
  CHECK(numbers[2] == 0);
  CHECK(ptc_save_version(nullptr) == 0);
  CHECK(ptc_state_version(nullptr) == 0);
  CHECK(ptc_gpu_device(nullptr) == -1);
  ptc_client_numbers(clients[1], numbers);
  CHECK(numbers[0] == 1);  // rank
  CHECK(numbers[2] == 2);  // world size
  CHECK(numbers[3] == 0);  // no committed version yet
  ptc_bytes b{};
  REQUIRE(ptc_client_describe(clients[0], &b) == 0);
  const std::string described = Take(&b);
  CHECK(absl::StrContains(described, "\"host\":\"host0\""));
  CHECK(absl::StrContains(described, "\"config\":\"tp=2,pp=1,dp=1\""));

  // Each rank saves synthetic values; the region index and size are checked.
  ClientOptions options{socket, cluster.address, "j", 0};
  auto reference = Client::Connect(options);
  REQUIRE(reference.ok());
  const std::vector<RankRegion> regions0 = (*reference)->regions();
  int64_t version = 0;
  for (int rank = 0; rank < 2; ++rank) {
    options.rank = rank;
    auto ref = Client::Connect(options);
    REQUIRE(ref.ok());
    ptc_save* save = nullptr;
    REQUIRE(ptc_client_begin_save(clients[rank], 3, &save) == 0);
    version = ptc_save_version(save);
    CHECK(ptc_save_step(save) == 3);
    const auto& regions = (*ref)->regions();
    for (int i = 0; i < static_cast<int>(regions.size()); ++i) {
      const RankRegion& r = regions[i];
      const std::vector<char> bytes =
          tools::Synthetic(r.tensor, r.shape, r.region, ElementSize(r.dtype));
      if (i == 0) {
        Expect(ptc_save_write(save, 0, bytes.data(), bytes.size() - 1), 3, "");
        Expect(ptc_save_write(save, -1, bytes.data(), bytes.size()), 11, "");
        Expect(ptc_save_write(save, 1 << 30, bytes.data(), bytes.size()), 11, "");
        Expect(ptc_save_write(save, 0, nullptr, bytes.size()), 3, "NULL");
      }
      REQUIRE(ptc_save_write(save, i, bytes.data(), bytes.size()) == 0);
    }
    for (const SmallObjectSpec& o : (*ref)->spec().small_objects) {
      const std::string v = tools::SyntheticSmallObject(o.name, rank);
      REQUIRE(ptc_save_put_small_object(save, o.name.c_str(), v.data(),
                                        v.size()) == 0);
    }
    const std::string huge(kMaxSmallObjectBytes + 1, 'x');
    Expect(ptc_save_put_small_object(save, "rng", huge.data(), huge.size()), 3,
           "");
    int committed = -1;
    REQUIRE(ptc_save_commit(save, &committed) == 0);
    CHECK(committed == (rank == 1));
    ptc_save_free(save);
  }
  REQUIRE(ptc_client_wait_committed(clients[0], version, 10.0) == 0);
  Expect(ptc_client_wait_committed(clients[0], version, -1.0), 3, "timeout");

  // A load's regions are mapped read-only, and read_into copies them.
  ptc_state* state = nullptr;
  REQUIRE(ptc_client_load(clients[0], &state) == 0);
  CHECK(ptc_state_version(state) == version);
  for (int i = 0; i < static_cast<int>(regions0.size()); ++i) {
    const RankRegion& r = regions0[i];
    const std::vector<char> want =
        tools::Synthetic(r.tensor, r.shape, r.region, ElementSize(r.dtype));
    const void* data = nullptr;
    size_t size = 0;
    REQUIRE(ptc_state_region(state, i, &data, &size) == 0);
    REQUIRE(size == want.size());
    CHECK(std::memcmp(data, want.data(), size) == 0);
    std::vector<char> got(size);
    REQUIRE(ptc_state_read_into(state, i, got.data(), got.size()) == 0);
    CHECK(got == want);
  }
  const void* data = nullptr;
  size_t size = 0;
  Expect(ptc_state_region(state, static_cast<int>(regions0.size()), &data,
                          &size),
         11, "");
  uint64_t checksum = 0;
  Expect(ptc_state_checksum(state, -3, &checksum), 11, "region -3 is outside");
  Expect(ptc_state_small_object(state, "no such object", &b), 5, "");
  REQUIRE(ptc_state_describe(state, &b) == 0);
  CHECK(absl::StrContains(Take(&b), "\"regions\":[{\"index\":0"));

  // Freed out of order: the state and a save keep their client alive.
  ptc_save* open_save = nullptr;
  REQUIRE(ptc_client_begin_save(clients[1], 4, &open_save) == 0);
  ptc_client_free(clients[0]);
  ptc_client_free(clients[1]);
  REQUIRE(ptc_state_region(state, 0, &data, &size) == 0);
  CHECK(std::memcmp(data,
                    tools::Synthetic(regions0[0].tensor, regions0[0].shape,
                                     regions0[0].region,
                                     ElementSize(regions0[0].dtype))
                        .data(),
                    size) == 0);
  ptc_state_free(state);
  ptc_save_free(open_save);

  // No GPU here: device copies say so.
  ptc_gpu* gpu = nullptr;
  const int gpu_code = ptc_gpu_create(0, &gpu);
  if (gpu_code != 0) {
    Expect(gpu_code, 14, "CUDA is not usable");
  } else {
    ptc_gpu_free(gpu);
  }
}

}  // namespace
}  // namespace ptc
