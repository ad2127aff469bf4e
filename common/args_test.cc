#include "common/args.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

TEST_CASE("args: values, inline values, flags and positionals", "[tools]") {
  const char* argv[] = {"ptcctl",    "plan",   "--model", "gpt3-125m",
                        "--to=tp=2", "--json", "extra"};
  auto args = Args::Parse(7, argv, 2, {"model", "to"}, {"json"});
  REQUIRE(args.ok());
  CHECK(args->Get("model") == "gpt3-125m");
  CHECK(args->Get("to") == "tp=2");
  CHECK(args->Flag("json"));
  CHECK(args->positional() == std::vector<std::string>{"extra"});
  CHECK(args->Required("from").status().message() ==
        "missing required option --from");
}

TEST_CASE("args: unknown options and missing values are named", "[tools]") {
  const char* unknown[] = {"ptcctl", "plan", "--modle", "x"};
  CHECK(Args::Parse(4, unknown, 2, {"model"}, {}).status().message() ==
        "unknown option --modle");
  const char* missing[] = {"ptcctl", "plan", "--model"};
  CHECK(Args::Parse(3, missing, 2, {"model"}, {}).status().message() ==
        "option --model needs a value");
}

TEST_CASE("args: byte counts with binary and decimal units", "[common]") {
  CHECK(*ParseBytes("8GiB") == (int64_t{8} << 30));
  CHECK(*ParseBytes("512MiB") == (int64_t{512} << 20));
  CHECK(*ParseBytes("1.5 GB") == 1500000000);
  CHECK(*ParseBytes("4096") == 4096);
  CHECK(ParseBytes("lots").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ParseBytes("-1GiB").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ptc
