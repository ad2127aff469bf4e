#include "common/job_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ptc {
namespace {

constexpr char kPrefix[] = "ptc1:";
constexpr size_t kMinKeyBytes = 32;
constexpr size_t kMaxJobName = 128;

absl::Mutex mu;
std::string& Key() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  static std::string* key = new std::string;
  return *key;
}

std::string Mac(const std::string& key, const std::string& job) {
  const std::string message = absl::StrCat("ptc-job-token\n", job);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       mac, &size);
  return absl::BytesToHexString(
      std::string(reinterpret_cast<const char*>(mac), size));
}

}  // namespace

absl::Status ConfigureJobTokens(const std::string& key_path) {
  std::string key;
  if (!key_path.empty()) {
    std::ifstream in(key_path, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("cannot read the token key file '", key_path, "'"));
    }
    struct stat st;
    if (stat(key_path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the token key file '", key_path,
          "' is readable by every user; chmod o-r it (anyone with the key "
          "can forge any job's token)"));
    }
    std::stringstream text;
    text << in.rdbuf();
    key = std::string(absl::StripAsciiWhitespace(text.str()));
    if (key.size() < kMinKeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("the token key file '", key_path, "' holds ", key.size(),
                       " bytes; a key has at least ", kMinKeyBytes,
                       " (tools/ptc-certs DIR token-key makes one)"));
    }
  }
  absl::MutexLock lock(&mu);
  Key() = std::move(key);
  return absl::OkStatus();
}

bool JobTokensEnabled() {
  absl::MutexLock lock(&mu);
  return !Key().empty();
}

std::string IssueJobToken(const std::string& job) {
  absl::MutexLock lock(&mu);
  if (Key().empty()) return "";
  return absl::StrCat(kPrefix, job, ":", Mac(Key(), job));
}

absl::StatusOr<std::string> JobOfToken(const std::string& token) {
  std::string key;
  {
    absl::MutexLock lock(&mu);
    key = Key();
  }
  if (key.empty()) {
    return absl::UnauthenticatedError(
        "this process has no token key, so it cannot check job tokens");
  }
  const size_t colon = token.rfind(':');
  if (token.rfind(kPrefix, 0) != 0 || colon == std::string::npos ||
      colon < sizeof(kPrefix) - 1) {
    return absl::UnauthenticatedError(
        "the job token is malformed (a token reads ptc1:JOB:MAC; ptcctl "
        "token --job JOB prints it)");
  }
  std::string job =
      token.substr(sizeof(kPrefix) - 1, colon - (sizeof(kPrefix) - 1));
  const std::string mac = token.substr(colon + 1);
  const std::string expected = Mac(key, job);
  if (mac.size() != expected.size() ||
      CRYPTO_memcmp(mac.data(), expected.data(), mac.size()) != 0) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the job token for '", job,
        "' was not issued by this cluster's coordinator (or its token key "
        "changed); get a new one with ptcctl token --job ",
        job));
  }
  return job;
}

std::string JobTokenFromEnvironment() {
  const char* v = std::getenv("PTC_JOB_TOKEN");
  return v == nullptr ? "" : v;
}

absl::Status CheckJobName(const std::string& job) {
  if (job.empty()) return absl::InvalidArgumentError("the job name is empty");
  if (job.size() > kMaxJobName) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job name is ", job.size(), " characters; at most ", kMaxJobName));
  }
  for (char c : job) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("the job name '", absl::CHexEscape(job),
                       "' may hold only letters, digits, '.', '_' and '-'"));
    }
  }
  if (job[0] == '.' || job[0] == '-') {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job name '", job, "' must not start with '.' or '-'"));
  }
  return absl::OkStatus();
}

}  // namespace ptc
