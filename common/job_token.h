// Job tokens: what a training job's processes show to act on their job,
// and only on it. The coordinator issues one when the job is registered
// (and to an admin who asks: ptcctl token); the coordinator and every ptcd
// check it with the cluster's token key, a secret file only they read
// (tools/ptc-certs DIR token-key). A token is the job's name and an
// HMAC-SHA256 of it under that key:
//
//   ptc1:JOB:HEX-MAC
//
// so it needs no state to check and cannot be forged or moved to another
// job without the key. It is a bearer secret: it travels over TLS (gRPC
// metadata "ptc-job-token") or the host's local socket, and a process gets
// it from its launcher (PTC_JOB_TOKEN). Rotating the key revokes every
// token; a job registered again under a forgotten job's name gets the same
// token, so rotate the key when such a name is reused by someone else.
//
//   PTC_RETURN_IF_ERROR(ConfigureJobTokens("/etc/ptc/tokens.key"));
//   const std::string token = IssueJobToken("gpt-7b");
//   PTC_ASSIGN_OR_RETURN(std::string job, JobOfToken(token));  // "gpt-7b"
#ifndef PTC_COMMON_JOB_TOKEN_H_
#define PTC_COMMON_JOB_TOKEN_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ptc {

// The gRPC metadata key a client's calls carry their token under.
inline constexpr char kJobTokenMetadata[] = "ptc-job-token";

// Reads the key file (at least 32 bytes, e.g. 64 hex characters; the file
// must not be readable by others) and makes it the process's token key.
// An empty path turns tokens off. NOT_FOUND / INVALID_ARGUMENT say what is
// wrong with the file.
absl::Status ConfigureJobTokens(const std::string& key_path);

// Whether this process has a token key.
bool JobTokensEnabled();

// The token of `job` (empty if there is no key).
std::string IssueJobToken(const std::string& job);

// The job a token was issued for; UNAUTHENTICATED if it is malformed, was
// issued under another key, or there is no key.
absl::StatusOr<std::string> JobOfToken(const std::string& token);

// $PTC_JOB_TOKEN, or empty.
std::string JobTokenFromEnvironment();

// A job name a person can type and a path can hold: 1-128 characters of
// letters, digits, '.', '_' and '-', not starting with '.' or '-'.
absl::Status CheckJobName(const std::string& job);

}  // namespace ptc

#endif  // PTC_COMMON_JOB_TOKEN_H_
