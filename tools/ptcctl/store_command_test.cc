// `ptcctl store` against a real daemon, run as the ptcctl binary.
#include <catch2/catch.hpp>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor_store/internal/testing.h"

namespace ptc {
namespace {

struct Output {
  int code;
  std::string out;
};

Output Ptcctl(const std::string& args) {
  // The in-process daemon runs without TLS.
  const std::string cmd =
      absl::StrCat("PTC_INSECURE=1 tools/ptcctl ", args, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

TEST_CASE("ptcctl store: ls, stat and stats for people and as JSON",
          "[tools][store]") {
  auto d = testing::StartDaemon();
  REQUIRE(
      d->client->Declare("run7", {{"layers.0.w", DType::kBFloat16, {64, 32}}})
          .ok());
  std::vector<char> data(32 * 32 * 2, 1);
  REQUIRE(d->client
              ->Put("run7", 3, "layers.0.w", Region{{0, 32}, {0, 32}},
                    data.data(), data.size())
              .ok());
  REQUIRE(d->client
              ->Put("run7", 3, "layers.0.w", Region{{32, 64}, {0, 32}},
                    data.data(), data.size())
              .ok());
  REQUIRE(d->client->Commit("run7", 3).ok());
  const std::string host = absl::StrCat("--host ", d->address());

  Output ls = Ptcctl("store ls --regions " + host);
  CHECK(ls.code == 0);
  CHECK(ls.out.find("job run7: 1 tensors declared, 1 versions") !=
        std::string::npos);
  CHECK(ls.out.find("version 3 (committed)") != std::string::npos);
  CHECK(ls.out.find("[32:64, 0:32]") != std::string::npos);

  Output ls_json = Ptcctl("store ls --json " + host);
  CHECK(ls_json.code == 0);
  CHECK(ls_json.out.find("\"bytes\": 4096") != std::string::npos);
  CHECK(ls_json.out.find("\"committed\": true") != std::string::npos);

  Output stat = Ptcctl(
      "store stat --job run7 --version 3 --tensor layers.0.w --json " + host);
  CHECK(stat.code == 0);
  CHECK(stat.out.find("\"region_count\": 2") != std::string::npos);
  CHECK(stat.out.find("\"checksum\": \"") != std::string::npos);

  Output stats = Ptcctl("store stats " + host);
  CHECK(stats.code == 0);
  // 4 KiB of data and one declaration (256 bytes + its 10-byte key + two
  // dimensions).
  CHECK(stats.out.find("memory: 4.29 KiB of 8.00 GiB used") !=
        std::string::npos);
  CHECK(stats.out.find("of which 298 B tensor declarations") !=
        std::string::npos);
  CHECK(stats.out.find("ptc_store_bytes_in_total") != std::string::npos);
}

TEST_CASE("ptcctl store: errors name the problem, with JSON for machines",
          "[tools][store]") {
  auto d = testing::StartDaemon();
  const std::string host = absl::StrCat("--host ", d->address());
  Output unknown =
      Ptcctl("store stat --job nojob --version 1 --tensor w --json " + host);
  CHECK(unknown.code == 1);
  CHECK(unknown.out.find("\"code\":\"NOT_FOUND\"") != std::string::npos);
  CHECK(unknown.out.find("job 'nojob' is unknown") != std::string::npos);
  Output missing = Ptcctl("store stat " + host);
  CHECK(missing.code == 2);
  CHECK(missing.out.find("missing required option --job") != std::string::npos);
  Output down = Ptcctl("store stats --host 127.0.0.1:1");
  CHECK(down.code == 1);
  CHECK(down.out.find("cannot reach ptcd at 127.0.0.1:1") != std::string::npos);
  CHECK(Ptcctl("store frobnicate").code == 2);
}

}  // namespace
}  // namespace ptc
