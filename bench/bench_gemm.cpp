// bench_gemm: GFLOP/s of lockstep's GEMM (core::ops::matmul, the path layers
// use) against the raw library call on the same buffers in the same run: on
// the CPU each library the build has (Note [CPU GEMM libraries]), the
// baseline being the fastest of them at each shape; cublasGemmEx on a GPU.
// f16/bf16 on the CPU are reported without a baseline: neither CPU library's
// sgemm takes half precision.
#include <fmt/core.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench/report.h"
#include "engine/core/device.h"
#include "engine/core/ops.h"
#include "engine/core/random.h"
#include "examples/common/flags.h"
#include "kernels/gemm.h"

#if LOCKSTEP_WITH_CUDA
#include <cublas_v2.h>

#include "kernels/cuda/check.h"
#endif

using namespace lockstep;
using namespace lockstep::core;

namespace {

struct Shape3 {
  std::string kind;  // "square", "mlp-fwd", "mlp-dgrad", "mlp-wgrad", "attn-qk", ...
  std::int64_t m, n, k;
  bool trans_a, trans_b;
};

// Square sizes, and the three GEMMs of a Linear layer (in -> out, batch B):
// forward y = x W^T, input gradient dx = dy W, weight gradient dW = dy^T x.
std::vector<Shape3> shapes_for(const std::vector<std::int64_t>& squares, std::int64_t batch,
                               std::int64_t in, std::int64_t out) {
  std::vector<Shape3> shapes;
  for (std::int64_t s : squares) shapes.push_back({"square", s, s, s, false, false});
  shapes.push_back({"mlp-fwd", batch, out, in, false, true});
  shapes.push_back({"mlp-dgrad", batch, in, out, false, false});
  shapes.push_back({"mlp-wgrad", out, in, batch, true, false});
  return shapes;
}

// The CPU's other GEMMs: gpt-tiny's attention per head (T 128, head size 32:
// scores Q K^T, then P V) and the cnn preset's second convolution per image
// through im2col (64 channels out, 14 x 14, 32 x 3 x 3 in: kernels/cpu/conv.cpp's
// forward, input-gradient and weight-gradient GEMMs).
void add_cpu_shapes(std::vector<Shape3>& shapes) {
  shapes.push_back({"attn-qk", 128, 128, 32, false, true});
  shapes.push_back({"attn-pv", 128, 32, 128, false, false});
  shapes.push_back({"conv-fwd", 64, 196, 288, false, false});
  shapes.push_back({"conv-dgrad", 288, 196, 64, true, false});
  shapes.push_back({"conv-wgrad", 64, 288, 196, false, true});
}

struct Result {
  double lockstep_gflops;
  std::optional<double> raw_gflops;    // the baseline's: the fastest library's
  std::string baseline;                // its name
  std::vector<double> library_gflops;  // CPU: each of gemm_libraries(), in order
};

Tensor random_tensor(const core::Shape& shape, DType type, Device device, std::uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::f32);
  Generator(seed).normal(t);
  return t.cast(type).to(device);
}

Result run_cpu(const Shape3& s, DType type, int trials, double batch_s) {
  Tensor a = random_tensor(s.trans_a ? core::Shape{s.k, s.m} : core::Shape{s.m, s.k}, type,
                           Device::cpu(), 1);
  Tensor b = random_tensor(s.trans_b ? core::Shape{s.n, s.k} : core::Shape{s.k, s.n}, type,
                           Device::cpu(), 2);
  Tensor c = Tensor::zeros({s.m, s.n}, type == DType::f32 ? DType::f32 : type);
  const double flop = 2.0 * s.m * s.n * s.k;
  auto ours = [&] { ops::matmul(a, b, c, {.trans_a = s.trans_a, .trans_b = s.trans_b}); };
  auto no_sync = [] {};
  if (type != DType::f32)
    return {
        flop / bench::median_seconds(ours, no_sync, trials, batch_s) / 1e9, std::nullopt, "", {}};
  // Note [baseline selection]: the fastest library is chosen in a first
  // round (each library against lockstep's path in alternating batches) and
  // timed again against lockstep in a second round, which gives the ratio.
  // The maximum of several noisy medians overstates the fastest library (the
  // winner's curse): on the 2-vCPU AMD EPYC VM, where lockstep's f32 path is
  // oneDNN's own sgemm, one run of README's table measured OpenBLAS at 42.6
  // GF/s and lockstep at 37.9 at the mlp's dgrad shape (ratio 0.890), while
  // bench_gemm_libraries in the same hour had oneDNN fastest at that shape
  // (38.0 against OpenBLAS's 35.0). The per-library columns stay the first
  // round's.
  const std::vector<kernels::cpu::GemmLibrary> libraries = kernels::cpu::gemm_libraries();
  auto raw_call = [&](kernels::cpu::GemmLibrary library) {
    return [&, library] {
      kernels::cpu::raw_sgemm(library, s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f,
                              a.data_as<float>(), a.dim(1), b.data_as<float>(), b.dim(1), 0.0f,
                              c.data_as<float>(), c.dim(1));
    };
  };
  std::vector<std::pair<double, double>> first;  // per library: lockstep's seconds, its own
  for (kernels::cpu::GemmLibrary library : libraries)
    first.push_back(bench::compare_seconds(ours, raw_call(library), no_sync, trials, batch_s));
  std::size_t fastest = 0;
  for (std::size_t i = 0; i < first.size(); ++i)
    if (first[i].second < first[fastest].second) fastest = i;
  const auto [t_ours, t_raw] =
      libraries.size() > 1  // the second round
          ? bench::compare_seconds(ours, raw_call(libraries[fastest]), no_sync, trials, batch_s)
          : first[0];
  Result r{flop / t_ours / 1e9,
           flop / t_raw / 1e9,
           kernels::cpu::gemm_library_name(libraries[fastest]),
           {}};
  for (const auto& timing : first) r.library_gflops.push_back(flop / timing.second / 1e9);
  return r;
}

#if LOCKSTEP_WITH_CUDA
cudaDataType_t cuda_type(DType t) {
  return t == DType::f16 ? CUDA_R_16F : t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
}

Result run_cuda(const Shape3& s, DType type, int trials, double batch_s) {
  const Device gpu = Device::cuda(0);
  Stream stream = Stream::create(gpu);
  Tensor a = random_tensor(s.trans_a ? core::Shape{s.k, s.m} : core::Shape{s.m, s.k}, type, gpu, 1);
  Tensor b = random_tensor(s.trans_b ? core::Shape{s.n, s.k} : core::Shape{s.k, s.n}, type, gpu, 2);
  Tensor c = Tensor::zeros({s.m, s.n}, type, gpu);
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    LOCKSTEP_CHECK_CUBLAS(cublasCreate(&h));
    return h;
  }();
  LOCKSTEP_CHECK_CUBLAS(cublasSetStream(handle, stream.handle()));
  const float alpha = 1.0f, beta = 0.0f;
  auto ours = [&] { ops::matmul(a, b, c, {.trans_a = s.trans_a, .trans_b = s.trans_b}, stream); };
  // Row-major through column-major cuBLAS: C^T = op(B)^T op(A)^T.
  auto raw = [&] {
    LOCKSTEP_CHECK_CUBLAS(cublasGemmEx(
        handle, s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, s.n,
        s.m, s.k, &alpha, b.data(), cuda_type(type), b.dim(1), a.data(), cuda_type(type), a.dim(1),
        &beta, c.data(), cuda_type(type), c.dim(1), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  auto sync = [&] { stream.synchronize(); };
  const double flop = 2.0 * s.m * s.n * s.k;
  const auto [t_ours, t_raw] = bench::compare_seconds(ours, raw, sync, trials, batch_s);
  return {flop / t_ours / 1e9, flop / t_raw / 1e9, "cuBLAS", {}};
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_gemm: lockstep GEMM throughput against the raw BLAS call"};
  std::string device_text = "cpu", json_path;
  std::vector<std::string> dtype_names{"f32", "f16", "bf16"};
  std::vector<std::int64_t> squares;
  int threads = 1, trials = 5;
  double batch_s = 0.1;
  app.add_option("--device", device_text, "cpu or cuda")->capture_default_str();
  app.add_option("--dtype", dtype_names, "input dtypes (C is the same type)")
      ->capture_default_str();
  app.add_option("--sizes", squares, "square sizes (default: 128..2048 cpu, 1024..8192 cuda)");
  app.add_option("--threads", threads, "CPU GEMM library threads (cpu)")->capture_default_str();
  app.add_option("--trials", trials, "timed batches per measurement (median reported)")
      ->capture_default_str();
  app.add_option("--batch-seconds", batch_s, "length of one timed batch")->capture_default_str();
  app.add_option("--json", json_path, "write JSON lines here");
  // What each flag accepts (examples/common/flags.h), checked while parsing.
  app.get_option("--device")->check(examples::device_name());
  app.get_option("--dtype")->check(examples::one_of({"f32", "f16", "bf16"}));
  app.get_option("--sizes")->check(examples::within(1, 16384));
  app.get_option("--threads")->check(examples::threads_per_rank());
  app.get_option("--trials")->check(examples::within(1, 1000));
  app.get_option("--batch-seconds")->check(examples::within(1e-3, 60));
  app.get_option("--json")->check(examples::non_empty());
  CLI11_PARSE(app, argc, argv);

  try {
    const Device device = examples::usable_device(device_text);
    examples::use_cpu_threads(threads, true);
    if (squares.empty())
      squares = device.is_cuda() ? std::vector<std::int64_t>{1024, 2048, 4096, 8192}
                                 : std::vector<std::int64_t>{128, 256, 512, 1024, 2048};
    std::vector<Shape3> shapes = device.is_cuda() ? shapes_for(squares, 8192, 4096, 4096)
                                                  : shapes_for(squares, 256, 784, 1024);
    if (!device.is_cuda()) add_cpu_shapes(shapes);
    const std::vector<kernels::cpu::GemmLibrary> libraries = kernels::cpu::gemm_libraries();
    bench::JsonLines json(json_path);
    bool half_on_cpu = false;
    fmt::print("{:<10} {:>6} {:>6} {:>6} {:>5} {:>14}", "shape", "m", "n", "k", "dtype",
               "lockstep GF/s");
    if (device.is_cuda())
      fmt::print(" {:>14}", "cuBLAS GF/s");
    else
      for (kernels::cpu::GemmLibrary l : libraries)
        fmt::print(" {:>14}", fmt::format("{} GF/s", kernels::cpu::gemm_library_name(l)));
    fmt::print(" {:>7}\n", "ratio");
    for (const std::string& name : dtype_names) {
      const DType type = name == "f16" ? DType::f16 : name == "bf16" ? DType::bf16 : DType::f32;
      if (name != dtype_name(type))
        throw InvalidArgument("--dtype '" + name + "' is not f32, f16 or bf16");
      for (const Shape3& s : shapes) {
#if LOCKSTEP_WITH_CUDA
        const Result r = device.is_cuda() ? run_cuda(s, type, trials, batch_s)
                                          : run_cpu(s, type, trials, batch_s);
#else
        const Result r = run_cpu(s, type, trials, batch_s);
#endif
        std::optional<double> ratio;
        if (r.raw_gflops) ratio = r.lockstep_gflops / *r.raw_gflops;
        half_on_cpu |= !r.raw_gflops;
        fmt::print("{:<10} {:>6} {:>6} {:>6} {:>5} {:>14.1f}", s.kind, s.m, s.n, s.k, name,
                   r.lockstep_gflops);
        if (device.is_cuda())
          fmt::print(" {:>14}", r.raw_gflops ? fmt::format("{:.1f}", *r.raw_gflops) : "-");
        else
          for (std::size_t i = 0; i < libraries.size(); ++i)
            fmt::print(" {:>14}", i < r.library_gflops.size()
                                      ? fmt::format("{:.1f}", r.library_gflops[i])
                                      : "-");
        fmt::print(" {:>7}\n", ratio ? fmt::format("{:.3f}", *ratio) : "-");
        json.write({bench::field("bench", "gemm"), bench::field("shape", s.kind),
                    bench::field("m", static_cast<long long>(s.m)),
                    bench::field("n", static_cast<long long>(s.n)),
                    bench::field("k", static_cast<long long>(s.k)), bench::field("dtype", name),
                    bench::field("device", device.str()),
                    bench::field("threads", static_cast<long long>(device.is_cuda() ? 0 : threads)),
                    bench::field("lockstep_gflops", r.lockstep_gflops),
                    bench::field("raw_gflops", r.raw_gflops),
                    bench::field("baseline", r.raw_gflops ? r.baseline : std::string()),
                    bench::field("ratio", ratio)});
      }
    }
    std::string cpu_baseline = "the library call, at each shape the fastest of";
    for (kernels::cpu::GemmLibrary l : libraries)
      cpu_baseline += std::string(l == libraries.front() ? " " : ", ") +
                      kernels::cpu::gemm_library_name(l) + "'s sgemm";
    bench::print_legend(
        device.is_cuda() ? "cublasGemmEx on the same buffers, timed in alternating batches"
                         : cpu_baseline +
                               " on the same buffers, timed in alternating batches (the "
                               "fastest chosen in one round, timed again in a second for the "
                               "ratio); lockstep runs " +
                               kernels::cpu::cpu_gemm_kernels().describe(),
        "lockstep GF/s / baseline GF/s: higher is better, 1 is parity",
        half_on_cpu ? "f16/bf16 on the CPU: no CPU library's sgemm takes half precision" : "");
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_gemm: {}\n", e.what());
    return 1;
  }
  return 0;
}
