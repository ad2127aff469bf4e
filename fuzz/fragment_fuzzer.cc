// A fragment the coordinator sends a ptcd (ExecuteFragment), checked before
// anything is staged: regions against their tensors, tensor ids, coverage,
// counts. Nothing here may crash, hang or allocate by a request's numbers.
#include "fuzz/fuzz.h"
#include "proto/transformer.pb.h"
#include "state_transformer/transformer_service.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = ptc::fuzz::QuietProtobuf();
  (void)quiet;
  ptc::proto::ExecuteFragmentRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  (void)ptc::FragmentJobFromRequest(req);
  return 0;
}
