// A tensor as a job declares it to a store: its key, element type and
// global shape. Part of the PTC model, not of the store: clients, the
// snapshot code and the planner's callers speak it without depending on
// the store (tensor_store/store.h includes this).
#ifndef PTC_PTC_TENSOR_DECL_H_
#define PTC_PTC_TENSOR_DECL_H_

#include <string>

#include "ptc/dtype.h"
#include "ptc/region.h"

namespace ptc {

struct TensorDecl {
  std::string key;
  DType dtype = DType::kFloat32;
  Shape shape;
};

}  // namespace ptc

#endif  // PTC_PTC_TENSOR_DECL_H_
