// BufferPool (engine/core/buffer_pool.h, Note [step buffers]).
#include "engine/core/buffer_pool.h"

#include <algorithm>

#include "engine/core/ops.h"

namespace lockstep::core {

Tensor BufferPool::take(const Shape& shape, DType dtype, Device device, const Stream& stream) {
  for (Entry& e : entries_) {
    if (e.tensor.reusable_as(shape, dtype, device, stream)) {
      e.taken = true;
      return e.tensor;
    }
  }
  entries_.push_back({Tensor::empty(shape, dtype, device, stream), true});
  return entries_.back().tensor;
}

Tensor BufferPool::as_dtype(const Tensor& x, DType dtype, const Stream& stream) {
  if (x.dtype() == dtype) return x;
  Tensor out = take(x.shape(), dtype, x.device(), stream);
  ops::cast(x, out, stream);
  return out;
}

void BufferPool::end_step() {
  std::erase_if(entries_, [](const Entry& e) { return !e.taken; });
  for (Entry& e : entries_) e.taken = false;
}

}  // namespace lockstep::core
