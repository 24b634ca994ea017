// Generator: a Philox4x32-10 stream whose whole state is (seed, offset), the
// same bits on CPU and CUDA (Note [Philox stream] in kernels/philox.h). Each
// fill advances the offset by the words it used, so a restored state
// continues the stream exactly.
#pragma once

#include <cstdint>

#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::core {

struct GeneratorState {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;  // in 32-bit words
};

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0) : state_{seed, 0} {}

  const GeneratorState& state() const { return state_; }
  void set_state(const GeneratorState& state) { state_ = state; }

  // out: f32, uniform in [0, 1).
  void uniform(Tensor& out, const Stream& stream = {});
  // out: f32, normal with the given mean and standard deviation.
  void normal(Tensor& out, float mean = 0.0f, float stddev = 1.0f, const Stream& stream = {});
  // out: u8, 1 with probability keep_prob.
  void bernoulli_mask(Tensor& out, float keep_prob, const Stream& stream = {});
  // out: i32 raw words (bit patterns).
  void words(Tensor& out, const Stream& stream = {});

 private:
  GeneratorState state_;
};

}  // namespace lockstep::core
