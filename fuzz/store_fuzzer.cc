// The tensor store's gRPC service, called as a network client would: the
// first byte picks the RPC, the rest is its request. The store keeps what
// earlier inputs left (jobs, versions), as a daemon would.
#include <grpcpp/grpcpp.h>

#include <memory>

#include "fuzz/fuzz.h"
#include "fuzz/store_seed.h"
#include "proto/tensor_store.pb.h"
#include "tensor_store/store.h"
#include "tensor_store/tensor_store_service.h"

namespace ptc::fuzz {
namespace {

struct Daemon {
  Daemon()
      : store(StoreOptions{kFuzzStoreBytes, 0, false}),
        service(&store, [] { return 0; }) {
    SeedStore(store);
  }
  Store store;
  TensorStoreService service;
};

template <typename Req, typename Resp>
void Call(grpc::Status (TensorStoreService::*rpc)(grpc::ServerContext*,
                                                  const Req*, Resp*),
          TensorStoreService* service, const FuzzRequest& in) {
  Req req;
  if (!req.ParseFromArray(in.message, static_cast<int>(in.size))) return;
  grpc::ServerContext ctx;
  Resp resp;
  (service->*rpc)(&ctx, &req, &resp);
}

}  // namespace
}  // namespace ptc::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = ptc::fuzz::QuietProtobuf();
  (void)quiet;
  using namespace ptc;
  using namespace ptc::fuzz;
  static Daemon* d = new Daemon;
  const FuzzRequest in = SplitInput(data, size);
  TensorStoreService* s = &d->service;
  switch (in.selector % 9) {
    case 0:
      Call(&TensorStoreService::DeclareTensors, s, in);
      break;
    case 1:
      Call(&TensorStoreService::Stat, s, in);
      break;
    case 2:
      Call(&TensorStoreService::Fingerprint, s, in);
      break;
    case 3:
      Call(&TensorStoreService::CommitVersion, s, in);
      break;
    case 4:
      Call(&TensorStoreService::PutSmallObject, s, in);
      break;
    case 5:
      Call(&TensorStoreService::GetSmallObject, s, in);
      break;
    case 6:
      Call(&TensorStoreService::PrepareMemory, s, in);
      break;
    case 7:
      Call(&TensorStoreService::DeleteVersion, s, in);
      break;
    case 8:
      Call(&TensorStoreService::GetSmallObjects, s, in);
      break;
  }
  return 0;
}
