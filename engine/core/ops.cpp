// Tensor ops (engine/core/ops.h): argument checks and device dispatch.
#include "engine/core/ops.h"

#include <utility>

#include "engine/core/dispatch.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/reduce.h"

namespace lockstep::core::ops {
namespace {

void same_device(const char* op, const Tensor& a, const Tensor& b) {
  if (!(a.device() == b.device()))
    throw InvalidArgument(std::string(op) + ": tensors on " + a.device().str() + " and " +
                          b.device().str() + " (move one with .to())");
}

void same_layout(const char* op, const Tensor& a, const Tensor& b) {
  same_device(op, a, b);
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    throw InvalidArgument(std::string(op) + ": operands " + shape_str(a.shape()) + " " +
                          dtype_name(a.dtype()) + " and " + shape_str(b.shape()) + " " +
                          dtype_name(b.dtype()) + " differ in shape or dtype");
}

Tensor reduce(const Tensor& x, bool squares, const Stream& stream) {
  Tensor out;
  dispatch_stream(
      x.device(), stream,
      [&] {
        out = Tensor::empty({1}, DType::f32);
        if (squares)
          kernels::cpu::sum_squares(x.data(), x.dtype(), x.numel(), out.data_as<float>());
        else
          kernels::cpu::sum(x.data(), x.dtype(), x.numel(), out.data_as<float>());
      },
      [&](const Stream& s) {
        out = Tensor::empty({1}, DType::f32, x.device(), s);
        Tensor workspace = Tensor::empty({kernels::cuda::kReduceBlocks}, DType::i64, x.device(), s);
        if (squares)
          kernels::cuda::sum_squares(x.data(), x.dtype(), x.numel(), out.data_as<float>(),
                                     workspace.data(), s.handle());
        else
          kernels::cuda::sum(x.data(), x.dtype(), x.numel(), out.data_as<float>(), workspace.data(),
                             s.handle());
      });
  return out;
}

}  // namespace

void fill(Tensor& x, double value, const Stream& stream) {
  dispatch(
      x.device(), stream, [&] { kernels::cpu::fill(x.data(), x.dtype(), x.numel(), value); },
      [&](kernels::CudaStream s) {
        kernels::cuda::fill(x.data(), x.dtype(), x.numel(), value, s);
      });
}

void cast(const Tensor& src, Tensor& dst, const Stream& stream) {
  same_device("cast", src, dst);
  if (src.numel() != dst.numel())
    throw InvalidArgument("cast: source has " + std::to_string(src.numel()) +
                          " elements, destination " + std::to_string(dst.numel()));
  dispatch(
      src.device(), stream,
      [&] { kernels::cpu::cast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel()); },
      [&](kernels::CudaStream s) {
        kernels::cuda::cast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel(), s);
      });
}

void add(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream) {
  same_layout("add", a, b);
  same_layout("add", a, out);
  dispatch(
      a.device(), stream,
      [&] { kernels::cpu::add(a.data(), b.data(), out.data(), a.dtype(), a.numel()); },
      [&](kernels::CudaStream s) {
        kernels::cuda::add(a.data(), b.data(), out.data(), a.dtype(), a.numel(), s);
      });
}

void mul(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream) {
  same_layout("mul", a, b);
  same_layout("mul", a, out);
  dispatch(
      a.device(), stream,
      [&] { kernels::cpu::mul(a.data(), b.data(), out.data(), a.dtype(), a.numel()); },
      [&](kernels::CudaStream s) {
        kernels::cuda::mul(a.data(), b.data(), out.data(), a.dtype(), a.numel(), s);
      });
}

void scale(Tensor& x, float alpha, const Stream& stream) {
  dispatch(
      x.device(), stream, [&] { kernels::cpu::scale(x.data(), x.dtype(), x.numel(), alpha); },
      [&](kernels::CudaStream s) {
        kernels::cuda::scale(x.data(), x.dtype(), x.numel(), alpha, s);
      });
}

void axpy(float alpha, const Tensor& x, Tensor& y, const Stream& stream) {
  same_layout("axpy", x, y);
  dispatch(
      x.device(), stream,
      [&] { kernels::cpu::axpy(alpha, x.data(), y.data(), x.dtype(), x.numel()); },
      [&](kernels::CudaStream s) {
        kernels::cuda::axpy(alpha, x.data(), y.data(), x.dtype(), x.numel(), s);
      });
}

Tensor sum(const Tensor& x, const Stream& stream) { return reduce(x, false, stream); }

Tensor sum_squares(const Tensor& x, const Stream& stream) { return reduce(x, true, stream); }

void flag_nonfinite(const Tensor& x, Tensor& flag, const Stream& stream) {
  same_device("flag_nonfinite", x, flag);
  if (flag.numel() != 1 || flag.dtype() != DType::i32)
    throw InvalidArgument("flag_nonfinite: flag must be one i32 element, got " +
                          shape_str(flag.shape()) + " " + dtype_name(flag.dtype()));
  auto* out = flag.data_as<std::int32_t>();
  dispatch(
      x.device(), stream,
      [&] { kernels::cpu::flag_nonfinite(x.data(), x.dtype(), x.numel(), out); },
      [&](kernels::CudaStream s) {
        kernels::cuda::flag_nonfinite(x.data(), x.dtype(), x.numel(), out, s);
      });
}

namespace {

// The GEMM behind matmul and batched_matmul: a, b, c hold `batch` matrices each,
// in their last two dimensions.
void run_gemm(const char* op, const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& o,
              const Stream& stream) {
  same_device(op, a, b);
  same_device(op, a, c);
  if (a.dtype() != b.dtype())
    throw InvalidArgument(std::string(op) + ": a is " + dtype_name(a.dtype()) + " but b is " +
                          dtype_name(b.dtype()) + " (cast one of them)");
  const std::size_t r = a.shape().size();
  kernels::GemmArgs g;
  g.trans_a = o.trans_a;
  g.trans_b = o.trans_b;
  g.m = o.trans_a ? a.dim(r - 1) : a.dim(r - 2);
  g.k = o.trans_a ? a.dim(r - 2) : a.dim(r - 1);
  g.n = o.trans_b ? b.dim(r - 2) : b.dim(r - 1);
  const std::int64_t b_k = o.trans_b ? b.dim(r - 1) : b.dim(r - 2);
  if (b_k != g.k || c.dim(r - 2) != g.m || c.dim(r - 1) != g.n)
    throw InvalidArgument(std::string(op) + ": op(a) is [" + std::to_string(g.m) + ", " +
                          std::to_string(g.k) + "], op(b) is [" + std::to_string(b_k) + ", " +
                          std::to_string(g.n) + "], c is " + shape_str(c.shape()) +
                          ": inner sizes or c's shape differ");
  g.alpha = o.alpha;
  g.beta = o.beta;
  g.a = a.data();
  g.lda = std::max<std::int64_t>(1, a.dim(r - 1));
  g.b = b.data();
  g.ldb = std::max<std::int64_t>(1, b.dim(r - 1));
  g.c = c.data();
  g.ldc = std::max<std::int64_t>(1, c.dim(r - 1));
  g.ab_type = a.dtype();
  g.c_type = c.dtype();
  if (r == 3) {
    g.batch = a.dim(0);
    g.stride_a = a.dim(1) * a.dim(2);
    g.stride_b = b.dim(1) * b.dim(2);
    g.stride_c = c.dim(1) * c.dim(2);
  }
  dispatch_stream(
      a.device(), stream, [&] { kernels::cpu::gemm(g); },
      [&](const Stream& s) {
        kernels::cuda::gemm(g, s.gemm_workspace(), kernels::cuda::kGemmWorkspaceBytes, s.handle());
      });
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& o,
            const Stream& stream) {
  if (a.shape().size() != 2 || b.shape().size() != 2 || c.shape().size() != 2)
    throw InvalidArgument("matmul: expects 2-D tensors, got a " + shape_str(a.shape()) + ", b " +
                          shape_str(b.shape()) + ", c " + shape_str(c.shape()));
  run_gemm("matmul", a, b, c, o, stream);
}

void batched_matmul(const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& o,
                    const Stream& stream) {
  if (a.shape().size() != 3 || b.shape().size() != 3 || c.shape().size() != 3 ||
      a.dim(0) != b.dim(0) || a.dim(0) != c.dim(0))
    throw InvalidArgument("batched_matmul: expects 3-D tensors with one batch size, got a " +
                          shape_str(a.shape()) + ", b " + shape_str(b.shape()) + ", c " +
                          shape_str(c.shape()));
  run_gemm("batched_matmul", a, b, c, o, stream);
}

}  // namespace lockstep::core::ops
