// Tensor ops (engine/core/ops.h): argument checks and device dispatch.
#include "engine/core/ops.h"

#include <exception>
#include <utility>

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

#if LOCKSTEP_WITH_CUDA
// The stream a GPU op runs on, and whether the op must wait for it (see ops.h).
struct GpuStream {
  Stream stream;
  bool synchronous;
  ~GpuStream() noexcept(false) {
    if (synchronous && std::uncaught_exceptions() == 0) stream.synchronize();
  }
};

// Makes `device` current in both cases: kernels launch into, and cuBLASLt's
// handle is picked for, the current device, whatever stream they are given.
GpuStream gpu_stream(Device device, const Stream& given) {
  if (given.device().is_cuda() && !(given.device() == device))
    throw InvalidArgument("op on " + device.str() + " given a stream of " + given.device().str());
  set_current_device(device);
  if (given.device().is_cuda()) return {given, false};
  return {Stream::default_for(device), true};
}

Tensor reduce_on_gpu(const Tensor& x, bool squares, [[maybe_unused]] const Stream& stream) {
  GpuStream g = gpu_stream(x.device(), stream);
  Tensor out = Tensor::empty({1}, DType::f32, x.device(), g.stream);
  Tensor workspace =
      Tensor::empty({kernels::cuda::kReduceBlocks}, DType::i64, x.device(), g.stream);
  auto* result = out.data_as<float>();
  if (squares)
    kernels::cuda::sum_squares(x.data(), x.dtype(), x.numel(), result, workspace.data(),
                               g.stream.handle());
  else
    kernels::cuda::sum(x.data(), x.dtype(), x.numel(), result, workspace.data(), g.stream.handle());
  return out;
}
#endif

}  // namespace

void fill(Tensor& x, double value, [[maybe_unused]] const Stream& stream) {
  if (!x.device().is_cuda()) return kernels::cpu::fill(x.data(), x.dtype(), x.numel(), value);
#if LOCKSTEP_WITH_CUDA
  GpuStream g = gpu_stream(x.device(), stream);
  kernels::cuda::fill(x.data(), x.dtype(), x.numel(), value, g.stream.handle());
#endif
}

void cast(const Tensor& src, Tensor& dst, [[maybe_unused]] const Stream& stream) {
  same_device("cast", src, dst);
  if (src.numel() != dst.numel())
    throw InvalidArgument("cast: source has " + std::to_string(src.numel()) +
                          " elements, destination " + std::to_string(dst.numel()));
  if (!src.device().is_cuda())
    return kernels::cpu::cast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel());
#if LOCKSTEP_WITH_CUDA
  GpuStream g = gpu_stream(src.device(), stream);
  kernels::cuda::cast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel(),
                      g.stream.handle());
#endif
}

void add(const Tensor& a, const Tensor& b, Tensor& out, [[maybe_unused]] const Stream& stream) {
  same_layout("add", a, b);
  same_layout("add", a, out);
  if (!a.device().is_cuda())
    return kernels::cpu::add(a.data(), b.data(), out.data(), a.dtype(), a.numel());
#if LOCKSTEP_WITH_CUDA
  GpuStream g = gpu_stream(a.device(), stream);
  kernels::cuda::add(a.data(), b.data(), out.data(), a.dtype(), a.numel(), g.stream.handle());
#endif
}

void mul(const Tensor& a, const Tensor& b, Tensor& out, [[maybe_unused]] const Stream& stream) {
  same_layout("mul", a, b);
  same_layout("mul", a, out);
  if (!a.device().is_cuda())
    return kernels::cpu::mul(a.data(), b.data(), out.data(), a.dtype(), a.numel());
#if LOCKSTEP_WITH_CUDA
  GpuStream g = gpu_stream(a.device(), stream);
  kernels::cuda::mul(a.data(), b.data(), out.data(), a.dtype(), a.numel(), g.stream.handle());
#endif
}

void scale(Tensor& x, float alpha, [[maybe_unused]] const Stream& stream) {
  if (!x.device().is_cuda()) return kernels::cpu::scale(x.data(), x.dtype(), x.numel(), alpha);
#if LOCKSTEP_WITH_CUDA
  GpuStream g = gpu_stream(x.device(), stream);
  kernels::cuda::scale(x.data(), x.dtype(), x.numel(), alpha, g.stream.handle());
#endif
}

void axpy(float alpha, const Tensor& x, Tensor& y, [[maybe_unused]] const Stream& stream) {
  same_layout("axpy", x, y);
  if (!x.device().is_cuda())
    return kernels::cpu::axpy(alpha, x.data(), y.data(), x.dtype(), x.numel());
#if LOCKSTEP_WITH_CUDA
  GpuStream g = gpu_stream(x.device(), stream);
  kernels::cuda::axpy(alpha, x.data(), y.data(), x.dtype(), x.numel(), g.stream.handle());
#endif
}

Tensor sum(const Tensor& x, [[maybe_unused]] const Stream& stream) {
#if LOCKSTEP_WITH_CUDA
  if (x.device().is_cuda()) return reduce_on_gpu(x, false, stream);
#endif
  Tensor out = Tensor::empty({1}, DType::f32);
  kernels::cpu::sum(x.data(), x.dtype(), x.numel(), out.data_as<float>());
  return out;
}

Tensor sum_squares(const Tensor& x, [[maybe_unused]] const Stream& stream) {
#if LOCKSTEP_WITH_CUDA
  if (x.device().is_cuda()) return reduce_on_gpu(x, true, stream);
#endif
  Tensor out = Tensor::empty({1}, DType::f32);
  kernels::cpu::sum_squares(x.data(), x.dtype(), x.numel(), out.data_as<float>());
  return out;
}

void flag_nonfinite(const Tensor& x, Tensor& flag, [[maybe_unused]] const Stream& stream) {
  same_device("flag_nonfinite", x, flag);
  if (flag.numel() != 1 || flag.dtype() != DType::i32)
    throw InvalidArgument("flag_nonfinite: flag must be one i32 element, got " +
                          shape_str(flag.shape()) + " " + dtype_name(flag.dtype()));
  if (!x.device().is_cuda())
    return kernels::cpu::flag_nonfinite(x.data(), x.dtype(), x.numel(),
                                        flag.data_as<std::int32_t>());
#if LOCKSTEP_WITH_CUDA
  GpuStream g = gpu_stream(x.device(), stream);
  kernels::cuda::flag_nonfinite(x.data(), x.dtype(), x.numel(), flag.data_as<std::int32_t>(),
                                g.stream.handle());
#endif
}

namespace {

// The GEMM behind matmul and batched_matmul: a, b, c hold `batch` matrices each,
// in their last two dimensions.
void run_gemm(const char* op, const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& o,
              [[maybe_unused]] const Stream& stream) {
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
  if (!a.device().is_cuda()) return kernels::cpu::gemm(g);
#if LOCKSTEP_WITH_CUDA
  GpuStream gs = gpu_stream(a.device(), stream);
  kernels::cuda::gemm(g, gs.stream.gemm_workspace(), kernels::cuda::kGemmWorkspaceBytes,
                      gs.stream.handle());
#endif
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
