// peer_probe: asks a ptcd for a job's pieces as a peer would
// (ExposePieces), with this process's certificate (PTC_TLS_*), and prints
// the answer's status code and message. For the security tests: a host the
// coordinator did not admit for the plan epoch must be refused.
//
//   peer_probe ADDRESS JOB VERSION PLAN_EPOCH TENSOR
#include <iostream>

#include "absl/strings/numbers.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "proto/transformer.grpc.pb.h"

int main(int argc, char** argv) {
  int64_t version = 0, epoch = 0;
  if (argc != 6 || !absl::SimpleAtoi(argv[3], &version) ||
      !absl::SimpleAtoi(argv[4], &epoch)) {
    std::cerr << "usage: peer_probe ADDRESS JOB VERSION PLAN_EPOCH TENSOR\n";
    return 2;
  }
  auto stub = ptc::proto::Transformer::NewStub(ptc::OpenChannel(argv[1]));
  ptc::proto::ExposePiecesRequest req;
  req.set_job(argv[2]);
  req.set_version(version);
  req.set_plan_epoch(epoch);
  ptc::proto::PieceRef* piece = req.add_pieces();
  piece->set_tensor(argv[5]);
  piece->mutable_region()->add_dims()->set_end(1);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ptc::proto::ExposePiecesResponse resp;
  const absl::Status s =
      ptc::FromGrpcStatus(stub->ExposePieces(&ctx, req, &resp));
  std::cout << absl::StatusCodeToString(s.code()) << ": " << s.message()
            << "\n";
  return 0;
}
