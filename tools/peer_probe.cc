// peer_probe: asks a ptcd for a job's pieces as a peer would, with this
// process's certificate (PTC_TLS_*), and prints the answer's status code
// and message. For the security tests: a host the coordinator did not
// admit for the job's plan epoch must be refused both the UCX transfer
// call (SendParts, the default: asked for the first element with no worker
// address to send to, so nothing moves; an admitted host hears
// INVALID_ARGUMENT), the store's Read (--read, which the gRPC transport
// uses) and its GetSmallObjects (--small-objects: TENSOR names the small
// object, of ranks 0 and 1).
//
//   peer_probe [--read|--small-objects] ADDRESS JOB VERSION PLAN_EPOCH TENSOR
#include <cstring>
#include <iostream>

#include "absl/strings/numbers.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "proto/tensor_store.grpc.pb.h"
#include "proto/transformer.grpc.pb.h"

namespace {

void FirstElement(ptc::proto::Region* region) {
  region->add_dims()->set_end(1);
}

absl::Status SendParts(const char* address, const char* job, int64_t version,
                       int64_t epoch, const char* tensor) {
  auto stub = ptc::proto::Transformer::NewStub(ptc::OpenChannel(address));
  ptc::proto::SendPartsRequest req;
  req.set_job(job);
  req.set_version(version);
  req.set_plan_epoch(epoch);
  ptc::proto::PartToSend* part = req.add_parts();
  part->set_tensor(tensor);
  FirstElement(part->mutable_region());
  part->set_count(1);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ptc::proto::SendPartsResponse resp;
  return ptc::FromGrpcStatus(stub->SendParts(&ctx, req, &resp));
}

absl::Status Read(const char* address, const char* job, int64_t version,
                  const char* tensor) {
  auto stub = ptc::proto::TensorStore::NewStub(ptc::OpenChannel(address));
  ptc::proto::ReadRequest req;
  req.set_job(job);
  req.set_version(version);
  req.set_tensor(tensor);
  FirstElement(req.mutable_region());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = stub->Read(&ctx, req);
  ptc::proto::ReadResponse resp;
  while (reader->Read(&resp)) {
  }
  return ptc::FromGrpcStatus(reader->Finish());
}

absl::Status SmallObjects(const char* address, const char* job, int64_t version,
                          const char* name) {
  auto stub = ptc::proto::TensorStore::NewStub(ptc::OpenChannel(address));
  ptc::proto::GetSmallObjectsRequest req;
  req.set_job(job);
  req.set_version(version);
  for (int rank : {0, 1}) {
    ptc::proto::SmallObjectKey* key = req.add_objects();
    key->set_name(name);
    key->set_rank(rank);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ptc::proto::GetSmallObjectsResponse resp;
  return ptc::FromGrpcStatus(stub->GetSmallObjects(&ctx, req, &resp));
}

}  // namespace

int main(int argc, char** argv) {
  const bool read = argc > 1 && std::strcmp(argv[1], "--read") == 0;
  const bool small = argc > 1 && std::strcmp(argv[1], "--small-objects") == 0;
  if (read || small) {
    --argc;
    ++argv;
  }
  int64_t version = 0, epoch = 0;
  if (argc != 6 || !absl::SimpleAtoi(argv[3], &version) ||
      !absl::SimpleAtoi(argv[4], &epoch)) {
    std::cerr << "usage: peer_probe [--read|--small-objects] ADDRESS JOB "
                 "VERSION PLAN_EPOCH TENSOR\n";
    return 2;
  }
  const absl::Status s =
      read    ? Read(argv[1], argv[2], version, argv[5])
      : small ? SmallObjects(argv[1], argv[2], version, argv[5])
              : SendParts(argv[1], argv[2], version, epoch, argv[5]);
  std::cout << absl::StatusCodeToString(s.code()) << ": " << s.message()
            << "\n";
  return 0;
}
