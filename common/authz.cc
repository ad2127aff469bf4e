#include "common/authz.h"

#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/channel.h"
#include "common/job_token.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "proto/callers.pb.h"

namespace ptc {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::MethodDescriptor;

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

// A method's declaration (proto/callers.proto), resolved once.
struct Policy {
  const MethodDescriptor* method = nullptr;
  unsigned callers = 0;
  std::vector<const FieldDescriptor*> job_path, host_path;
  bool empty_job_is_own = false;
  // Why the declaration cannot be enforced; empty if it can.
  std::string problem;
  // The method's calls, by the server that takes them (every handler
  // authorizes its request once): ptc_rpc_calls_total{method="S.M"}.
  Counter* calls = nullptr;
};

Policy Resolve(const MethodDescriptor& m) {
  Policy p;
  p.method = &m;
  p.calls =
      &GetCounter(absl::StrCat("ptc_rpc_calls_total{method=\"",
                               m.service()->name(), ".", m.name(), "\"}"));
  const google::protobuf::MethodOptions& o = m.options();
  for (int i = 0; i < o.ExtensionSize(proto::callers); ++i)
    p.callers |= static_cast<unsigned>(o.GetExtension(proto::callers, i));
  p.empty_job_is_own = o.GetExtension(proto::empty_job_is_own);
  if (p.callers == 0) p.problem = "declares no (callers)";
  for (auto [path, chain] :
       {std::pair{&o.GetExtension(proto::job_field), &p.job_path},
        std::pair{&o.GetExtension(proto::host_field), &p.host_path}}) {
    if (path->empty()) continue;
    *chain = FieldPath(m.input_type(), *path);
    if (chain->empty() && p.problem.empty()) {
      p.problem = absl::StrCat("names field '", *path, "', which ",
                               m.input_type()->full_name(),
                               " has not as a singular string");
    }
  }
  return p;
}

// The declaration of `method` of the service named `service`, resolved on
// its first call and kept (descriptors live as long as the program);
// nullptr if there is no such method.
const Policy* PolicyOf(absl::string_view service, absl::string_view method) {
  static absl::Mutex mu;
  static auto* policies =  // guarded by mu
      new std::map<std::string, std::map<std::string, Policy, std::less<>>,
                   std::less<>>();
  {
    // Every call reads; only a method's first call writes.
    absl::ReaderMutexLock read(&mu);
    auto s = policies->find(service);
    if (s != policies->end()) {
      auto m = s->second.find(method);
      if (m != s->second.end()) return &m->second;
    }
  }
  absl::MutexLock lock(&mu);
  const auto* sd =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(service));
  const MethodDescriptor* md =
      sd == nullptr ? nullptr : sd->FindMethodByName(std::string(method));
  if (md == nullptr) return nullptr;
  return &(*policies)[std::string(service)]
              .emplace(std::string(method), Resolve(*md))
              .first->second;
}

void LogRefusal(const char* rpc, const std::string& what) {
  if (int64_t held = 0; LogAllowed(absl::StrCat("refused ", rpc), &held))
    Log("security")->warn("refused {}{}{}", rpc, what, SuppressedNote(held));
}

// OK if TLS is off or the caller is one of `allowed`; PERMISSION_DENIED
// naming the RPC, the caller and who may call it otherwise (and a warning
// in the log).
absl::Status Authorize(const grpc::ServerContextBase& ctx, unsigned allowed,
                       const char* rpc) {
  if (!TlsEnabled()) return absl::OkStatus();
  const std::string name = CallerName(ctx);
  if (!name.empty() && (CallerKind(name) & allowed) != 0)
    return absl::OkStatus();
  std::vector<std::string> who;
  if (allowed & kHost) who.push_back("a host");
  if (allowed & kCoordinator) who.push_back("the coordinator");
  if (allowed & kAdmin) who.push_back("an admin");
  if (allowed & kClient) who.push_back("a job's client");
  LogRefusal(rpc, absl::StrCat(" from '", name, "' (", ctx.peer(), ")"));
  const std::string peer = PeerName(ctx);
  return absl::PermissionDeniedError(absl::StrCat(
      rpc, " may be called by ", absl::StrJoin(who, " or "),
      peer == name
          ? absl::StrCat("; this caller's certificate names '", name, "'")
          : absl::StrCat("; this call came through host '", peer,
                         "''s coordinator relay, which acts as a job's "
                         "client only")));
}

// Authorize, and a client caller must act on `job`: its certificate names
// it (client:JOB) or its token was issued for it. PERMISSION_DENIED names
// the job the caller may act on; UNAUTHENTICATED says what is wrong with a
// missing or bad token.
absl::Status AuthorizeJob(const grpc::ServerContextBase& ctx, unsigned allowed,
                          const char* rpc, const std::string& job) {
  PTC_RETURN_IF_ERROR(Authorize(ctx, allowed, rpc));
  absl::StatusOr<std::optional<std::string>> own = ClientJob(ctx);
  if (!own.ok()) {
    LogRefusal(rpc, absl::StrCat(" from '", CallerName(ctx), "' (", ctx.peer(),
                                 "): ", own.status().message()));
    return own.status();
  }
  if (!own->has_value() || **own == job) return absl::OkStatus();
  LogRefusal(rpc, absl::StrCat(" on job '", job, "' from a client of job '",
                               **own, "' (", ctx.peer(), ")"));
  return absl::PermissionDeniedError(absl::StrCat(
      rpc, " on job '", job, "': this caller acts for job '", **own, "' only"));
}

}  // namespace

std::string CallerName(const grpc::ServerContextBase& ctx) {
  std::string name = PeerName(ctx);
  const auto& metadata = ctx.client_metadata();
  if (!name.empty() && CallerKind(name) == kHost &&
      metadata.count(kRelayedMetadata) != 0) {
    // Without a token it is no one's (ptcd's relay does not send those).
    return metadata.count(kJobTokenMetadata) != 0 ? "client" : "";
  }
  return name;
}

Caller CallerKind(const std::string& name) {
  if (name == "coordinator") return kCoordinator;
  if (name == "admin") return kAdmin;
  if (name == "client" || absl::StartsWith(name, "client:")) return kClient;
  return kHost;
}

absl::Status AuthorizeCall(const grpc::ServerContextBase& ctx,
                           absl::string_view service, absl::string_view method,
                           const google::protobuf::Message* req,
                           std::string* job) {
  const Policy* p = PolicyOf(service, method);
  if (p == nullptr || !p->problem.empty() ||
      (req != nullptr && req->GetDescriptor() != p->method->input_type())) {
    // A handler that names the wrong method or request, or a method that
    // declares no callers: refused with or without TLS, so that tests
    // find it.
    if (int64_t held = 0; LogAllowed("refused an undeclared call", &held)) {
      std::string why = p == nullptr ? "no such method" : p->problem;
      if (why.empty()) {
        why = absl::StrCat("the handler passed a ",
                           req->GetDescriptor()->full_name(), ", not a ",
                           p->method->input_type()->full_name());
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
  if (req != nullptr) p->calls->Add();
  std::string acts_on;
  if (req != nullptr && !p->job_path.empty())
    acts_on = ReadPath(*req, p->job_path);
  if (acts_on.empty() && p->empty_job_is_own) {
    PTC_ASSIGN_OR_RETURN(std::optional<std::string> own, ClientJob(ctx));
    acts_on = own.value_or("");
  }
  if (job != nullptr) *job = acts_on;
  const std::string rpc(method);
  if (req != nullptr && !p->job_path.empty()) {
    PTC_RETURN_IF_ERROR(AuthorizeJob(ctx, p->callers, rpc.c_str(), acts_on));
  } else {
    PTC_RETURN_IF_ERROR(Authorize(ctx, p->callers, rpc.c_str()));
  }
  if (!TlsEnabled() || req == nullptr || p->host_path.empty())
    return absl::OkStatus();
  const std::string caller = CallerName(ctx);
  const std::string host = ReadPath(*req, p->host_path);
  if (CallerKind(caller) != kHost || caller == host) return absl::OkStatus();
  LogRefusal(rpc.c_str(),
             absl::StrCat(": a caller with certificate '", caller, "' (",
                          ctx.peer(), ") spoke for host ", host));
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
    const Policy* p = PolicyOf(service, s->method(i)->name());
    if (!p->problem.empty())
      return absl::InternalError(
          absl::StrCat(s->method(i)->full_name(), " ", p->problem));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> ClientJob(
    const grpc::ServerContextBase& ctx) {
  if (!TlsEnabled()) return std::nullopt;
  const std::string name = CallerName(ctx);
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

}  // namespace ptc
