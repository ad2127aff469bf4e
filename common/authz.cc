#include "common/authz.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/channel.h"
#include "common/logging.h"

namespace ptc {

Caller CallerKind(const std::string& name) {
  if (name == "coordinator") return kCoordinator;
  if (name == "admin") return kAdmin;
  if (absl::StartsWith(name, "client:")) return kClient;
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

}  // namespace ptc
