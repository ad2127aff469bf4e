#include "common/args.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>

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

TEST_CASE("settings: flags win over the config file, unknown keys named",
          "[tools]") {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string path =
      std::string(base != nullptr ? base : "/tmp") + "/daemon.conf";
  std::ofstream(path) << "# a daemon\nstate_dir = /var/lib/x\n"
                         "listen = 0.0.0.0:1\ninsecure = true\n";
  const std::vector<std::string> options = {"config", "state-dir", "listen"};
  const char* argv[] = {"d", "--config", path.c_str(), "--listen", "h:2"};
  auto args = Args::Parse(5, argv, 1, options, {"insecure"});
  REQUIRE(args.ok());
  auto settings = Settings::Load(*args, options, {"insecure"});
  REQUIRE(settings.ok());
  CHECK(settings->Get("listen") == "h:2");
  CHECK(settings->Get("state-dir") == "/var/lib/x");
  CHECK(settings->Get("port-file", "none") == "none");
  CHECK(*settings->Flag("insecure"));

  std::ofstream(path) << "insecure = yes\n";
  settings = Settings::Load(*args, options, {"insecure"});
  REQUIRE(settings.ok());
  CHECK(settings->Flag("insecure").status().message() ==
        path + ": insecure must be 'true' or 'false', not 'yes'");
  std::ofstream(path) << "coordinatr = h:1\n";
  settings = Settings::Load(*args, options, {"insecure"});
  CHECK(settings.status().message() == path + ": unknown key 'coordinatr'");
  std::ofstream(path) << "config = other.conf\n";
  CHECK(!Settings::Load(*args, options, {"insecure"}).ok());
}

}  // namespace
}  // namespace ptc
