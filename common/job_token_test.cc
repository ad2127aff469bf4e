#include "common/job_token.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

namespace ptc {
namespace {

std::string KeyFile(const std::string& name, const std::string& text,
                    mode_t mode) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string path =
      std::string(base != nullptr ? base : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
  return path;
}

TEST_CASE("job tokens: issued for a job, checked for it, not forgeable",
          "[common][security]") {
  REQUIRE(!JobTokensEnabled());
  CHECK(IssueJobToken("a").empty());
  CHECK(JobOfToken("ptc1:a:00").status().code() ==
        absl::StatusCode::kUnauthenticated);

  REQUIRE(ConfigureJobTokens(KeyFile("k1", std::string(64, 'a'), 0600)).ok());
  const std::string token = IssueJobToken("gpt-7b");
  CHECK(token.rfind("ptc1:gpt-7b:", 0) == 0);
  auto job = JobOfToken(token);
  REQUIRE(job.ok());
  CHECK(*job == "gpt-7b");

  // Moved to another job, altered, truncated, or made up.
  std::string moved = token;
  moved.replace(5, 6, "gpt-7c");
  CHECK(JobOfToken(moved).status().code() ==
        absl::StatusCode::kUnauthenticated);
  std::string altered = token;
  altered.back() = altered.back() == 'f' ? 'e' : 'f';
  CHECK(!JobOfToken(altered).ok());
  CHECK(!JobOfToken(token.substr(0, token.size() - 1)).ok());
  for (const char* bad :
       {"", "ptc1:", "ptc1::", "gpt-7b", "ptc2:gpt-7b:00", "ptc1:gpt-7b"}) {
    CHECK(JobOfToken(bad).status().code() ==
          absl::StatusCode::kUnauthenticated);
  }
  // Another key: the same job's token differs, and the old one is void.
  REQUIRE(ConfigureJobTokens(KeyFile("k2", std::string(64, 'b'), 0600)).ok());
  CHECK(IssueJobToken("gpt-7b") != token);
  CHECK(!JobOfToken(token).ok());
  REQUIRE(ConfigureJobTokens("").ok());
  CHECK(!JobTokensEnabled());
}

TEST_CASE("job tokens: bad key files are refused", "[common][security]") {
  CHECK(ConfigureJobTokens("/nonexistent/tokens.key").code() ==
        absl::StatusCode::kNotFound);
  CHECK(ConfigureJobTokens(KeyFile("short", "abc", 0600)).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(
      ConfigureJobTokens(KeyFile("open", std::string(64, 'c'), 0644)).code() ==
      absl::StatusCode::kInvalidArgument);
  CHECK(!JobTokensEnabled());
}

TEST_CASE("job names: letters, digits, '.', '_' and '-'", "[common]") {
  for (const char* good : {"a", "gpt-7b", "run_12.3", "A9"})
    CHECK(CheckJobName(good).ok());
  for (const std::string bad :
       {std::string(), std::string("a/b"), std::string("a:b"),
        std::string(".hidden"), std::string("-x"), std::string("a b"),
        std::string(129, 'x'), std::string("a\0b", 3)}) {
    CHECK(CheckJobName(bad).code() == absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace ptc
