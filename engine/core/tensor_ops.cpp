// Pointwise tensor ops (engine/core/tensor_ops.h): dtype promotion, the
// broadcast geometry of kernels/pointwise.h, and device dispatch. The dim
// ops (softmax, reductions, slice, concat) are in dim_ops.cpp.
#include <algorithm>
#include <string>

#include "engine/core/detail/op_checks.h"
#include "engine/core/dispatch.h"
#include "engine/core/tensor_ops.h"
#include "kernels/pointwise.h"

namespace lockstep::core::ops {
namespace {

using kernels::BinaryOp;
using kernels::BroadcastGeometry;
using kernels::kMaxBroadcastDims;
using kernels::UnaryOp;

// Note [op dtypes] in tensor_ops.h.
DType promoted(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() ? a.dtype() : DType::f32;
}

Tensor as_dtype(const Tensor& x, DType type, const Stream& stream) {
  return x.dtype() == type ? x : x.cast(type, stream);
}

std::string shapes_str(const std::vector<const Tensor*>& operands) {
  std::string s;
  for (std::size_t k = 0; k < operands.size(); ++k)
    s += (k ? (k + 1 == operands.size() ? " and " : ", ") : "") + shape_str(operands[k]->shape());
  return s;
}

// The broadcast shape of the operands and their geometry (Note [broadcast
// geometry], kernels/pointwise.h), with mergeable dimensions merged.
struct Broadcast {
  Shape shape;
  BroadcastGeometry geometry;
};

Broadcast broadcast(const char* op, const std::vector<const Tensor*>& operands) {
  std::size_t rank = 0;
  for (const Tensor* t : operands) rank = std::max(rank, t->shape().size());
  if (rank > static_cast<std::size_t>(kMaxBroadcastDims))
    throw InvalidArgument(std::string(op) + ": shapes " + shapes_str(operands) +
                          " have more than " + std::to_string(kMaxBroadcastDims) +
                          " dimensions (reshape to merge some)");
  Broadcast b;
  b.shape.assign(rank, 1);
  for (std::size_t d = 0; d < rank; ++d) {  // d counts from the last dimension
    for (const Tensor* t : operands) {
      const std::size_t r = t->shape().size();
      if (d >= r) continue;
      const std::int64_t size = t->shape()[r - 1 - d];
      std::int64_t& out = b.shape[rank - 1 - d];
      if (size == out || size == 1) continue;
      if (out != 1)
        throw InvalidArgument(
            std::string(op) + ": shapes " + shapes_str(operands) + " cannot broadcast (dimension " +
            std::to_string(-1 - static_cast<int>(d)) + " is " + std::to_string(out) + " and " +
            std::to_string(size) + "; each dimension must match or be 1: reshape an operand)");
      out = size;
    }
  }
  // Per-operand element strides over the broadcast shape, 0 where stretched.
  std::vector<std::vector<std::int64_t>> strides(operands.size(),
                                                 std::vector<std::int64_t>(rank, 0));
  for (std::size_t k = 0; k < operands.size(); ++k) {
    const Shape& s = operands[k]->shape();
    std::int64_t stride = 1;
    for (std::size_t d = 0; d < s.size(); ++d) {
      const std::size_t i = s.size() - 1 - d, o = rank - 1 - d;
      strides[k][o] = s[i] == 1 ? 0 : stride;
      stride *= s[i];
    }
  }
  // Drop dimensions of size 1, and merge a dimension into the one outside it
  // when every operand steps over both as over one.
  BroadcastGeometry& g = b.geometry;
  for (std::size_t d = 0; d < rank; ++d) {
    if (b.shape[d] == 1) continue;
    bool merge = g.rank > 0;
    for (std::size_t k = 0; merge && k < operands.size(); ++k)
      merge = g.strides[k][g.rank - 1] == strides[k][d] * b.shape[d];
    if (merge) {
      g.sizes[g.rank - 1] *= b.shape[d];
      for (std::size_t k = 0; k < operands.size(); ++k) g.strides[k][g.rank - 1] = strides[k][d];
      continue;
    }
    g.sizes[g.rank] = b.shape[d];
    for (std::size_t k = 0; k < operands.size(); ++k) g.strides[k][g.rank] = strides[k][d];
    ++g.rank;
  }
  return b;
}

Tensor unary(const char* op, UnaryOp kind, const Tensor& x, const Stream& stream) {
  detail::require_float_dtype(op, x);
  Tensor y;
  dispatch_stream(
      x.device(), stream,
      [&] {
        y = Tensor::empty(x.shape(), x.dtype());
        kernels::cpu::unary(kind, x.data(), y.data(), x.dtype(), x.numel());
      },
      [&](const Stream& s) {
        y = Tensor::empty(x.shape(), x.dtype(), x.device(), s);
        kernels::cuda::unary(kind, x.data(), y.data(), x.dtype(), x.numel(), s.handle());
      });
  return y;
}

// a op b, either of which may be a scalar (a null tensor pointer).
Tensor binary(const char* op, BinaryOp kind, const Tensor* a, double a_scalar, const Tensor* b,
              double b_scalar, const Stream& stream) {
  const Tensor& first = a ? *a : *b;
  if (a) detail::require_float_dtype(op, *a);
  if (b) detail::require_float_dtype(op, *b);
  if (a && b) detail::require_same_device(op, *a, *b);
  const DType type = a && b ? promoted(*a, *b) : first.dtype();
  std::vector<const Tensor*> operands;
  Tensor a_in, b_in;
  if (a) a_in = as_dtype(*a, type, stream);
  if (b) b_in = as_dtype(*b, type, stream);
  // A scalar takes the other operand's place in the geometry, its strides unused.
  const Broadcast shape = broadcast(op, {a ? &a_in : &b_in, b ? &b_in : &a_in});
  kernels::BinaryOperands v;
  v.a_scalar = static_cast<float>(a_scalar);
  v.b_scalar = static_cast<float>(b_scalar);
  Tensor out;
  auto bind = [&] {
    v.a = a ? a_in.data() : nullptr;
    v.b = b ? b_in.data() : nullptr;
  };
  dispatch_stream(
      first.device(), stream,
      [&] {
        out = Tensor::empty(shape.shape, type);
        bind();
        kernels::cpu::binary(kind, v, out.data(), type, shape.geometry);
      },
      [&](const Stream& s) {
        out = Tensor::empty(shape.shape, type, first.device(), s);
        bind();
        kernels::cuda::binary(kind, v, out.data(), type, shape.geometry, s.handle());
      });
  return out;
}

Tensor binary(const char* op, BinaryOp kind, const Tensor& a, const Tensor& b,
              const Stream& stream) {
  return binary(op, kind, &a, 0.0, &b, 0.0, stream);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, const Stream& s) {
  return binary("add", BinaryOp::add, a, b, s);
}
Tensor sub(const Tensor& a, const Tensor& b, const Stream& s) {
  return binary("sub", BinaryOp::sub, a, b, s);
}
Tensor mul(const Tensor& a, const Tensor& b, const Stream& s) {
  return binary("mul", BinaryOp::mul, a, b, s);
}
Tensor div(const Tensor& a, const Tensor& b, const Stream& s) {
  return binary("div", BinaryOp::div, a, b, s);
}
Tensor maximum(const Tensor& a, const Tensor& b, const Stream& s) {
  return binary("maximum", BinaryOp::maximum, a, b, s);
}
Tensor minimum(const Tensor& a, const Tensor& b, const Stream& s) {
  return binary("minimum", BinaryOp::minimum, a, b, s);
}

Tensor add(const Tensor& a, double b, const Stream& s) {
  return binary("add", BinaryOp::add, &a, 0.0, nullptr, b, s);
}
Tensor add(double a, const Tensor& b, const Stream& s) {
  return binary("add", BinaryOp::add, nullptr, a, &b, 0.0, s);
}
Tensor sub(const Tensor& a, double b, const Stream& s) {
  return binary("sub", BinaryOp::sub, &a, 0.0, nullptr, b, s);
}
Tensor sub(double a, const Tensor& b, const Stream& s) {
  return binary("sub", BinaryOp::sub, nullptr, a, &b, 0.0, s);
}
Tensor mul(const Tensor& a, double b, const Stream& s) {
  return binary("mul", BinaryOp::mul, &a, 0.0, nullptr, b, s);
}
Tensor mul(double a, const Tensor& b, const Stream& s) {
  return binary("mul", BinaryOp::mul, nullptr, a, &b, 0.0, s);
}
Tensor div(const Tensor& a, double b, const Stream& s) {
  return binary("div", BinaryOp::div, &a, 0.0, nullptr, b, s);
}
Tensor div(double a, const Tensor& b, const Stream& s) {
  return binary("div", BinaryOp::div, nullptr, a, &b, 0.0, s);
}
Tensor maximum(const Tensor& a, double b, const Stream& s) {
  return binary("maximum", BinaryOp::maximum, &a, 0.0, nullptr, b, s);
}
Tensor minimum(const Tensor& a, double b, const Stream& s) {
  return binary("minimum", BinaryOp::minimum, &a, 0.0, nullptr, b, s);
}

Tensor exp(const Tensor& x, const Stream& s) { return unary("exp", UnaryOp::exp, x, s); }
Tensor log(const Tensor& x, const Stream& s) { return unary("log", UnaryOp::log, x, s); }
Tensor sigmoid(const Tensor& x, const Stream& s) {
  return unary("sigmoid", UnaryOp::sigmoid, x, s);
}
Tensor tanh(const Tensor& x, const Stream& s) { return unary("tanh", UnaryOp::tanh, x, s); }
Tensor relu(const Tensor& x, const Stream& s) { return unary("relu", UnaryOp::relu, x, s); }
Tensor abs(const Tensor& x, const Stream& s) { return unary("abs", UnaryOp::abs, x, s); }
Tensor sqrt(const Tensor& x, const Stream& s) { return unary("sqrt", UnaryOp::sqrt, x, s); }
Tensor neg(const Tensor& x, const Stream& s) { return unary("neg", UnaryOp::neg, x, s); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, const Stream& stream) {
  detail::require_defined("where", cond, "the condition");
  if (cond.dtype() != DType::u8 && !is_floating(cond.dtype()))
    throw InvalidArgument(std::string("where: condition dtype ") + dtype_name(cond.dtype()) +
                          " is neither u8 nor a float type (cast it to u8)");
  detail::require_float_dtype("where", a);
  detail::require_float_dtype("where", b);
  detail::require_same_device("where", cond, a);
  detail::require_same_device("where", a, b);
  const DType type = promoted(a, b);
  const Tensor a_in = as_dtype(a, type, stream), b_in = as_dtype(b, type, stream);
  const Broadcast shape = broadcast("where", {&a_in, &b_in, &cond});
  Tensor out;
  dispatch_stream(
      a.device(), stream,
      [&] {
        out = Tensor::empty(shape.shape, type);
        kernels::cpu::where(cond.data(), cond.dtype(), a_in.data(), b_in.data(), out.data(), type,
                            shape.geometry);
      },
      [&](const Stream& s) {
        out = Tensor::empty(shape.shape, type, a.device(), s);
        kernels::cuda::where(cond.data(), cond.dtype(), a_in.data(), b_in.data(), out.data(), type,
                             shape.geometry, s.handle());
      });
  return out;
}

}  // namespace lockstep::core::ops
