// BufferPool: the buffers a training step's layers hand out (their outputs,
// input gradients and autocast casts), kept from step to step so that a step
// whose shapes repeat allocates none of them (Note [step buffers]).
#pragma once

#include <vector>

#include "engine/core/tensor.h"

namespace lockstep::core {

// Note [step buffers]: take() gives a kept buffer of the shape, dtype and
// device asked for when no tensor outside the pool shares it (its last user
// has let go, so nobody can see it overwritten) and it was allocated on the
// stream asked for (so the stream orders the new work after the old);
// otherwise a new buffer, kept from then on. Within a step a buffer that one
// layer's consumers have released serves the next request of its shape, so
// the pool holds about what the step holds at its peak, as a caching
// allocator would; end_step() drops the buffers the step did not take (the
// shapes of an evaluation, a last short batch), so it never holds more than
// one step's working set. A caller that keeps a tensor it was handed (logits
// for metrics) keeps it intact: the pool sees it shared and passes it over.
class BufferPool {
 public:
  Tensor take(const Shape& shape, DType dtype, Device device, const Stream& stream = {});
  // `x` in `dtype`: `x` itself when it has it, else a cast into a taken buffer.
  Tensor as_dtype(const Tensor& x, DType dtype, const Stream& stream = {});
  void end_step();
  std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Tensor tensor;
    bool taken = false;  // since the last end_step()
  };
  std::vector<Entry> entries_;
};

}  // namespace lockstep::core
