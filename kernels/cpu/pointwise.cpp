// CPU pointwise ops (kernels/pointwise.h): the reference the CUDA kernels are
// tested against. Broadcast operands are walked with an odometer over the
// outer dimensions and a strided loop over the innermost one.
#include <cstdint>

#include "kernels/detail/cpu_float.h"
#include "kernels/detail/pointwise_math.h"
#include "kernels/pointwise.h"

namespace lockstep::kernels::cpu {
namespace {

// Calls row(offsets, count) for every innermost row of the output, in order,
// with each operand's element offset at the row's start.
template <int operands, typename Row>
void for_each_row(const BroadcastGeometry& g, Row row) {
  std::int64_t offsets[operands] = {};
  if (g.rank == 0) {
    row(offsets, std::int64_t{1});
    return;
  }
  const int last = g.rank - 1;
  for (int d = 0; d < g.rank; ++d)
    if (g.sizes[d] == 0) return;
  std::int64_t coord[kMaxBroadcastDims] = {};
  while (true) {
    row(offsets, g.sizes[last]);
    int d = last - 1;
    for (; d >= 0; --d) {  // the odometer: advance the outer coordinates
      ++coord[d];
      for (int k = 0; k < operands; ++k) offsets[k] += g.strides[k][d];
      if (coord[d] < g.sizes[d]) break;
      for (int k = 0; k < operands; ++k) offsets[k] -= coord[d] * g.strides[k][d];
      coord[d] = 0;
    }
    if (d < 0) return;
  }
}

float operand(const void* p, float scalar, DType t, std::int64_t i) {
  return p ? detail::load_f32(p, t, i) : scalar;
}

bool condition(const void* cond, DType t, std::int64_t i) {
  if (t == DType::u8) return static_cast<const std::uint8_t*>(cond)[i] != 0;
  return detail::load_f32(cond, t, i) != 0.0f;
}

}  // namespace

void unary(UnaryOp op, const void* x, void* y, DType type, std::int64_t n) {
  detail::require_float(type, "unary op");
  if (type == DType::f32) {
    const auto* in = static_cast<const float*>(x);
    auto* out = static_cast<float*>(y);
    for (std::int64_t i = 0; i < n; ++i) out[i] = detail::unary_value(op, in[i]);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i)
    detail::store_f32(y, type, i, detail::unary_value(op, detail::load_f32(x, type, i)));
}

void binary(BinaryOp op, const BinaryOperands& v, void* out, DType type,
            const BroadcastGeometry& g) {
  detail::require_float(type, "binary op");
  const std::int64_t sa = g.rank ? g.strides[0][g.rank - 1] : 0;
  const std::int64_t sb = g.rank ? g.strides[1][g.rank - 1] : 0;
  std::int64_t o = 0;
  for_each_row<2>(g, [&](const std::int64_t* offsets, std::int64_t count) {
    for (std::int64_t j = 0; j < count; ++j, ++o) {
      const float a = operand(v.a, v.a_scalar, type, offsets[0] + j * sa);
      const float b = operand(v.b, v.b_scalar, type, offsets[1] + j * sb);
      detail::store_f32(out, type, o, detail::binary_value(op, a, b));
    }
  });
}

void where(const void* cond, DType cond_type, const void* a, const void* b, void* out, DType type,
           const BroadcastGeometry& g) {
  detail::require_float(type, "where");
  const int last = g.rank - 1;
  const std::int64_t sa = g.rank ? g.strides[0][last] : 0;
  const std::int64_t sb = g.rank ? g.strides[1][last] : 0;
  const std::int64_t sc = g.rank ? g.strides[2][last] : 0;
  std::int64_t o = 0;
  for_each_row<3>(g, [&](const std::int64_t* offsets, std::int64_t count) {
    for (std::int64_t j = 0; j < count; ++j, ++o) {
      const bool pick_a = condition(cond, cond_type, offsets[2] + j * sc);
      detail::store_f32(out, type, o,
                        pick_a ? detail::load_f32(a, type, offsets[0] + j * sa)
                               : detail::load_f32(b, type, offsets[1] + j * sb));
    }
  });
}

}  // namespace lockstep::kernels::cpu
