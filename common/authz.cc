#include "common/authz.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/channel.h"
#include "common/job_token.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "proto/callers.pb.h"

namespace ptc {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::MethodDescriptor;

const MethodDescriptor* FindMethod(absl::string_view service,
                                   absl::string_view method) {
  const auto* s =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(service));
  return s == nullptr ? nullptr : s->FindMethodByName(std::string(method));
}

unsigned DeclaredCallers(const MethodDescriptor& m) {
  unsigned allowed = 0;
  const google::protobuf::MethodOptions& o = m.options();
  for (int i = 0; i < o.ExtensionSize(proto::callers); ++i)
    allowed |= static_cast<unsigned>(o.GetExtension(proto::callers, i));
  return allowed;
}

// The fields from `type` down to the string field at the dotted `path`
// (through singular messages); empty if there is no such field.
std::vector<const FieldDescriptor*> FieldPath(const Descriptor* type,
                                              absl::string_view path) {
  std::vector<const FieldDescriptor*> chain;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (type == nullptr) return {};
    const FieldDescriptor* f = type->FindFieldByName(std::string(part));
    if (f == nullptr || f->is_repeated()) return {};
    chain.push_back(f);
    type = f->message_type();
  }
  if (chain.empty() || chain.back()->type() != FieldDescriptor::TYPE_STRING)
    return {};
  return chain;
}

std::string ReadPath(const Message& msg,
                     const std::vector<const FieldDescriptor*>& chain) {
  const Message* m = &msg;
  for (size_t i = 0; i + 1 < chain.size(); ++i)
    m = &m->GetReflection()->GetMessage(*m, chain[i]);
  return m->GetReflection()->GetString(*m, chain.back());
}

// Why `m`'s declaration cannot be enforced; empty if it can.
std::string PolicyProblem(const MethodDescriptor& m) {
  if (DeclaredCallers(m) == 0) return "declares no (callers)";
  const google::protobuf::MethodOptions& o = m.options();
  for (const std::string& path :
       {o.GetExtension(proto::job_field), o.GetExtension(proto::host_field)}) {
    if (!path.empty() && FieldPath(m.input_type(), path).empty()) {
      return absl::StrCat("names field '", path, "', which ",
                          m.input_type()->full_name(),
                          " has not as a singular string");
    }
  }
  return "";
}

}  // namespace

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
  if (int64_t held = 0; LogAllowed(absl::StrCat("refused ", rpc), &held)) {
    Log("security")->warn("refused {} from '{}' ({}){}", rpc, name, ctx.peer(),
                          SuppressedNote(held));
  }
  return absl::PermissionDeniedError(
      absl::StrCat(rpc, " may be called by ", absl::StrJoin(who, " or "),
                   "; this caller's certificate names '", name, "'"));
}

absl::Status AuthorizeCall(const grpc::ServerContext& ctx,
                           absl::string_view service, absl::string_view method,
                           const google::protobuf::Message* req,
                           std::string* job) {
  const MethodDescriptor* m = FindMethod(service, method);
  if (m == nullptr || !PolicyProblem(*m).empty() ||
      (req != nullptr && req->GetDescriptor() != m->input_type())) {
    // A handler that names the wrong method or request, or a method that
    // declares no callers: refused with or without TLS, so that tests
    // find it.
    if (int64_t held = 0; LogAllowed("refused an undeclared call", &held)) {
      std::string why = m == nullptr ? "no such method" : PolicyProblem(*m);
      if (why.empty()) {
        why = absl::StrCat("the handler passed a ",
                           req->GetDescriptor()->full_name(), ", not a ",
                           m->input_type()->full_name());
      }
      Log("security")
          ->error("refused {}.{}: {}{}", std::string(service),
                  std::string(method), why, SuppressedNote(held));
    }
    return absl::InternalError(absl::StrCat(
        service, ".", method,
        " is refused: the server's handler does not match the method's "
        "declared callers (a bug in this build; its log says what)"));
  }
  const google::protobuf::MethodOptions& o = m->options();
  const std::string& job_field = o.GetExtension(proto::job_field);
  std::string acts_on;
  if (req != nullptr && !job_field.empty())
    acts_on = ReadPath(*req, FieldPath(m->input_type(), job_field));
  if (acts_on.empty() && o.GetExtension(proto::empty_job_is_own)) {
    PTC_ASSIGN_OR_RETURN(std::optional<std::string> own, ClientJob(ctx));
    acts_on = own.value_or("");
  }
  if (job != nullptr) *job = acts_on;
  const std::string rpc(method);
  const unsigned allowed = DeclaredCallers(*m);
  if (req != nullptr && !job_field.empty()) {
    PTC_RETURN_IF_ERROR(AuthorizeJob(ctx, allowed, rpc.c_str(), acts_on));
  } else {
    PTC_RETURN_IF_ERROR(Authorize(ctx, allowed, rpc.c_str()));
  }
  const std::string& host_field = o.GetExtension(proto::host_field);
  if (!TlsEnabled() || req == nullptr || host_field.empty())
    return absl::OkStatus();
  const std::string caller = PeerName(ctx);
  const std::string host =
      ReadPath(*req, FieldPath(m->input_type(), host_field));
  if (CallerKind(caller) != kHost || caller == host) return absl::OkStatus();
  if (int64_t held = 0; LogAllowed(absl::StrCat("refused ", rpc), &held)) {
    Log("security")
        ->warn(
            "refused {}: a caller with certificate '{}' ({}) spoke for host "
            "{}{}",
            rpc, caller, ctx.peer(), host, SuppressedNote(held));
  }
  return absl::PermissionDeniedError(
      absl::StrCat("only host ", host, " may call ", rpc, " as ", host,
                   "; this caller's certificate names '", caller, "'"));
}

absl::Status CheckCallerPolicies(absl::string_view service) {
  const auto* s =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(service));
  if (s == nullptr)
    return absl::InternalError(absl::StrCat("no service ", service));
  for (int i = 0; i < s->method_count(); ++i) {
    if (std::string problem = PolicyProblem(*s->method(i)); !problem.empty())
      return absl::InternalError(
          absl::StrCat(s->method(i)->full_name(), " ", problem));
  }
  return absl::OkStatus();
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
    if (int64_t held = 0; LogAllowed(absl::StrCat("refused ", rpc), &held)) {
      Log("security")
          ->warn("refused {} from '{}' ({}): {}{}", rpc, PeerName(ctx),
                 ctx.peer(), std::string(own.status().message()),
                 SuppressedNote(held));
    }
    return own.status();
  }
  if (!own->has_value() || **own == job) return absl::OkStatus();
  if (int64_t held = 0; LogAllowed(absl::StrCat("refused ", rpc), &held)) {
    Log("security")
        ->warn("refused {} on job '{}' from a client of job '{}' ({}){}", rpc,
               job, **own, ctx.peer(), SuppressedNote(held));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      rpc, " on job '", job, "': this caller acts for job '", **own, "' only"));
}

}  // namespace ptc
