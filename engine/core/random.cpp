// Generator (engine/core/random.h): dtype checks, device dispatch, offset bookkeeping.
#include "engine/core/random.h"

#include <string>

#include "engine/core/dispatch.h"
#include "kernels/philox.h"

namespace lockstep::core {
namespace {

void require_dtype(const char* op, const Tensor& t, DType want) {
  if (t.dtype() != want)
    throw InvalidArgument(std::string("Generator::") + op + ": output is " + dtype_name(t.dtype()) +
                          ", expected " + dtype_name(want));
}

}  // namespace

void Generator::uniform(Tensor& out, const Stream& stream) {
  require_dtype("uniform", out, DType::f32);
  const kernels::PhiloxKey key{state_.seed, 0};
  const std::uint64_t offset = state_.offset;
  float* dst = out.data_as<float>();
  const std::int64_t n = out.numel();
  dispatch(
      out.device(), stream, [&] { kernels::cpu::uniform(key, offset, dst, n); },
      [&](kernels::CudaStream s) { kernels::cuda::uniform(key, offset, dst, n, s); });
  state_.offset += kernels::philox_words_used(kernels::RandomKind::uniform, n);
}

void Generator::normal(Tensor& out, float mean, float stddev, const Stream& stream) {
  require_dtype("normal", out, DType::f32);
  const kernels::PhiloxKey key{state_.seed, 0};
  const std::uint64_t offset = state_.offset;
  float* dst = out.data_as<float>();
  const std::int64_t n = out.numel();
  dispatch(
      out.device(), stream, [&] { kernels::cpu::normal(key, offset, dst, n, mean, stddev); },
      [&](kernels::CudaStream s) { kernels::cuda::normal(key, offset, dst, n, mean, stddev, s); });
  state_.offset += kernels::philox_words_used(kernels::RandomKind::normal, n);
}

void Generator::bernoulli_mask(Tensor& out, float keep_prob, const Stream& stream) {
  require_dtype("bernoulli_mask", out, DType::u8);
  if (!(keep_prob >= 0.0f && keep_prob <= 1.0f))
    throw InvalidArgument("Generator::bernoulli_mask: keep_prob " + std::to_string(keep_prob) +
                          " is outside [0, 1]");
  const kernels::PhiloxKey key{state_.seed, 0};
  const std::uint64_t offset = state_.offset;
  std::uint8_t* dst = out.data_as<std::uint8_t>();
  const std::int64_t n = out.numel();
  dispatch(
      out.device(), stream, [&] { kernels::cpu::bernoulli_mask(key, offset, dst, n, keep_prob); },
      [&](kernels::CudaStream s) {
        kernels::cuda::bernoulli_mask(key, offset, dst, n, keep_prob, s);
      });
  state_.offset += kernels::philox_words_used(kernels::RandomKind::bernoulli, n);
}

void Generator::words(Tensor& out, const Stream& stream) {
  require_dtype("words", out, DType::i32);
  const kernels::PhiloxKey key{state_.seed, 0};
  const std::uint64_t offset = state_.offset;
  auto* dst = reinterpret_cast<std::uint32_t*>(out.data_as<std::int32_t>());
  const std::int64_t n = out.numel();
  dispatch(
      out.device(), stream, [&] { kernels::cpu::random_words(key, offset, dst, n); },
      [&](kernels::CudaStream s) { kernels::cuda::random_words(key, offset, dst, n, s); });
  state_.offset += kernels::philox_words_used(kernels::RandomKind::words, n);
}

}  // namespace lockstep::core
