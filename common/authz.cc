#include "common/authz.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/channel.h"
#include "common/job_token.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace ptc {

Caller CallerKind(const std::string& name) {
  if (name == "coordinator") return kCoordinator;
  if (name == "admin") return kAdmin;
  if (name == "client" || absl::StartsWith(name, "client:")) return kClient;
  return kHost;
}

absl::Status Authorize(const grpc::ServerContext& ctx, unsigned allowed,
                       const char* rpc) {
  if (!TlsEnabled()) return absl::OkStatus();
  const std::string name = PeerName(ctx);
  if (!name.empty() && (CallerKind(name) & allowed) != 0)
    return absl::OkStatus();
  std::vector<std::string> who;
  if (allowed & kHost) who.push_back("a host");
  if (allowed & kCoordinator) who.push_back("the coordinator");
  if (allowed & kAdmin) who.push_back("an admin");
  if (allowed & kClient) who.push_back("a job's client");
  Log("security")->warn("refused {} from '{}' ({})", rpc, name, ctx.peer());
  return absl::PermissionDeniedError(
      absl::StrCat(rpc, " may be called by ", absl::StrJoin(who, " or "),
                   "; this caller's certificate names '", name, "'"));
}

absl::StatusOr<std::optional<std::string>> ClientJob(
    const grpc::ServerContext& ctx) {
  if (!TlsEnabled()) return std::nullopt;
  const std::string name = PeerName(ctx);
  if (CallerKind(name) != kClient) return std::nullopt;
  if (name != "client") return name.substr(sizeof("client:") - 1);
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(kJobTokenMetadata);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "this caller's certificate names no job ('client') and its call "
        "carries no job token; set PTC_JOB_TOKEN (ptcctl token --job JOB)");
  }
  return JobOfToken(std::string(it->second.data(), it->second.size()));
}

absl::Status AuthorizeJob(const grpc::ServerContext& ctx, unsigned allowed,
                          const char* rpc, const std::string& job) {
  PTC_RETURN_IF_ERROR(Authorize(ctx, allowed, rpc));
  absl::StatusOr<std::optional<std::string>> own = ClientJob(ctx);
  if (!own.ok()) {
    Log("security")
        ->warn("refused {} from '{}' ({}): {}", rpc, PeerName(ctx), ctx.peer(),
               std::string(own.status().message()));
    return own.status();
  }
  if (!own->has_value() || **own == job) return absl::OkStatus();
  Log("security")
      ->warn("refused {} on job '{}' from a client of job '{}' ({})", rpc, job,
             **own, ctx.peer());
  return absl::PermissionDeniedError(absl::StrCat(
      rpc, " on job '", job, "': this caller acts for job '", **own, "' only"));
}

}  // namespace ptc
