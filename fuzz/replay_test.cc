// Replays a fuzz target's corpus (fuzz/corpus/NAME: seeds and every input
// that once crashed it) as a test: with gcc in `bazel test //...`, so a
// crash found by tools/fuzz.sh stays fixed. The corpus folder is the test's
// first argument.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz.h"

namespace {

std::string corpus_dir;

TEST_CASE("fuzz: every input of the corpus runs", "[fuzz]") {
  REQUIRE(!corpus_dir.empty());
  int inputs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus_dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    INFO(entry.path().string());
    CHECK(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                                 bytes.size()) == 0);
    ++inputs;
  }
  CHECK(inputs > 0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) corpus_dir = argv[1];
  return Catch::Session().run(1, argv);
}
