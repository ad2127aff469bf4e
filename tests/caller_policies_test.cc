// Every RPC of ptc's three services declares who may call it
// (proto/callers.proto), and the one authorization path (AuthorizeCall)
// refuses what does not match its declaration. The refusals of real
// callers under mutual TLS are tested with real processes
// (tests/python/test_security.py).
#include <grpcpp/grpcpp.h>

#include "catch2/catch.hpp"
#include "common/authz.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/tensor_store.grpc.pb.h"
#include "proto/transformer.grpc.pb.h"

namespace ptc {
namespace {

TEST_CASE("every method of every service declares its callers",
          "[authz]") {
  for (const char* service : {proto::Coordinator::service_full_name(),
                              proto::TensorStore::service_full_name(),
                              proto::Transformer::service_full_name()}) {
    const absl::Status s = CheckCallerPolicies(service);
    INFO(service << ": " << s.ToString());
    CHECK(s.ok());
  }
  CHECK(CheckCallerPolicies("ptc.proto.NoSuchService").code() ==
        absl::StatusCode::kInternal);
}

TEST_CASE("a call that does not match its declaration is refused",
          "[authz]") {
  grpc::ServerContext ctx;
  proto::AbortRequest abort;
  // Not a method of the service, or another method's request: refused
  // even without TLS, so that a wrong handler fails every test.
  CHECK(AuthorizeCall(ctx, proto::Coordinator::service_full_name(), "Abrot",
                      &abort)
            .code() == absl::StatusCode::kInternal);
  CHECK(AuthorizeCall(ctx, proto::Coordinator::service_full_name(),
                      "ForgetJob", &abort)
            .code() == absl::StatusCode::kInternal);
  CHECK(AuthorizeCall(ctx, proto::Coordinator::service_full_name(), "Abort",
                      &abort)
            .ok());
}

TEST_CASE("the job a call acts on is the request's declared field",
          "[authz]") {
  grpc::ServerContext ctx;
  proto::ListRequest list;
  list.set_job("run7");
  std::string job = "unset";
  REQUIRE(Admit<proto::TensorStore>(ctx, "List", &list, &job).ok());
  CHECK(job == "run7");
  // Empty is the caller's own job for listing calls: without TLS no
  // caller has one, so every job is listed.
  list.clear_job();
  REQUIRE(Admit<proto::TensorStore>(ctx, "List", &list, &job).ok());
  CHECK(job.empty());
  proto::BeginSaveRequest save;
  save.set_job("run8");
  REQUIRE(Admit<proto::Coordinator>(ctx, "BeginSave", &save, &job).ok());
  CHECK(job == "run8");
}

}  // namespace
}  // namespace ptc
