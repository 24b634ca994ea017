// The fused cross-entropy on CUDA (Note [fused cross-entropy] in
// kernels/classification.h) against its CPU twin, the unfused composition:
// gpt2's shape (1024 and 8192 rows of 50,304 classes, rows 16-byte aligned)
// and odd ones (1001 and 13 classes: rows start at every offset mod 16, so the
// scalar head, the packs and the tail all run), bf16 and f16, in place and
// into a buffer misaligned against the logits (scalar stores), with ignored
// rows, ties and label smoothing; the same bits on a second run; and its time
// at gpt2's shape beside the unfused path's, printed for docs/gpu-results.md.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/classification.h"
#include "kernels/elementwise.h"
#include "kernels/half.h"
#include "support/xent_cases.h"

using namespace lockstep;
using namespace lockstep::core;

namespace {

const Device kGpu = Device::cuda(0);

float widen(DType type, std::uint16_t b) {
  return type == DType::bf16 ? kernels::bf16_bits_to_f32(b) : kernels::f16_bits_to_f32(b);
}

struct Fused {
  std::vector<std::uint16_t> grad;
  float loss = 0, count = 0, correct = 0;
};

// The CUDA kernel on `c`: in place, or into a buffer one element past a
// 256-byte boundary (2 bytes off the logits' alignment: scalar stores).
Fused run_cuda(const kernels::ClassificationShape& s, DType type, const test::XentCase& c,
               float dloss, bool in_place) {
  const std::int64_t n = s.rows * s.classes;
  Tensor logits = Tensor::from_host(c.bits.data(), {n}, type, kGpu);
  const Tensor labels = Tensor::from_host(c.label_bytes.data(), {s.rows}, s.label_type, kGpu);
  Tensor out = in_place ? logits : Tensor::empty({n + 1}, type, kGpu);
  void* dlogits = in_place ? logits.data() : static_cast<std::uint16_t*>(out.data()) + 1;
  Tensor results = Tensor::empty({3}, DType::f32, kGpu);
  Tensor workspace =
      Tensor::empty({static_cast<std::int64_t>(kernels::cuda::fused_xent_workspace_bytes(s.rows))},
                    DType::u8, kGpu);
  float* r = results.data_as<float>();
  kernels::cuda::softmax_xent_fused(s, type, logits.data(), labels.data(), dloss, dlogits, r, r + 1,
                                    r + 2, workspace.data(), nullptr);
  Fused f;
  const auto all = out.to_vector<std::uint16_t>();
  f.grad.assign(all.begin() + (in_place ? 0 : 1), all.end());
  const auto v = results.to_vector<float>();
  f.loss = v[0], f.count = v[1], f.correct = v[2];
  return f;
}

// Tolerances, CUDA against the twin. The count and the hits: exactly (the
// same labels; the argmax of the same values under one rule, Note [first
// argmax]). The loss: 1e-5 relative (both sum f32 exponentials, each within
// a few ulp of exp, in f64 and round each row's loss to f32). Each gradient
// element (p - target) scale: each side's f32 value is within 2^-20 (p +
// target) scale of the exact one (tests/engine/test_losses.cpp's twin test
// says why), so the two within 2^-19 (p + target) scale, where p <= |g| /
// scale + target; each is then rounded to the dtype, which adds at most one
// ulp of it: 2^-7 (bf16) or 2^-10 (f16) of the larger relative, or f16's
// subnormal spacing 2^-24.
void require_close(const Fused& gpu, const Fused& cpu, const test::XentCase& c,
                   const kernels::ClassificationShape& s, DType type, double scale) {
  CHECK(gpu.count == cpu.count);
  CHECK(gpu.correct == cpu.correct);
  CHECK(gpu.loss == Approx(cpu.loss).epsilon(1e-5));
  REQUIRE(gpu.grad.size() == cpu.grad.size());
  const double ulp = type == DType::bf16 ? 0x1p-7 : 0x1p-10;
  const double sub = type == DType::f16 ? 0x1p-24 : 0.0;
  std::size_t differ = 0;
  for (std::size_t k = 0; k < cpu.grad.size(); ++k) {
    if (gpu.grad[k] == cpu.grad[k]) continue;
    ++differ;
    const double g = widen(type, gpu.grad[k]), want = widen(type, cpu.grad[k]);
    const double target =
        test::xent_target(c.labels, s.classes, s.ignore_index, s.label_smoothing, k);
    const double f32_error =
        0x1p-19 * (std::max(std::fabs(g), std::fabs(want)) + 2 * target * scale);
    INFO("element " << k << ": cuda " << g << ", cpu " << want << " (" << differ
                    << " elements differ so far)");
    REQUIRE(std::fabs(g - want) <= ulp * std::max(std::fabs(g), std::fabs(want)) + f32_error + sub);
  }
}

void check_case(std::int64_t rows, std::int64_t classes, DType type, DType label_type,
                float smoothing, float dloss, bool in_place) {
  INFO(rows << " x " << classes << " " << dtype_name(type) << " labels " << dtype_name(label_type)
            << ", smoothing " << smoothing << (in_place ? ", in place" : ", misaligned output"));
  const test::XentCase c = test::make_xent_case(rows, classes, type, label_type, -100, 17);
  const kernels::ClassificationShape s{rows, classes, -100, label_type, smoothing};
  Fused cpu;
  cpu.grad.resize(c.bits.size());
  kernels::cpu::softmax_xent_fused(s, type, c.bits.data(), c.label_bytes.data(), dloss,
                                   cpu.grad.data(), &cpu.loss, &cpu.count, &cpu.correct);
  REQUIRE(cpu.correct >= 1);
  const Fused gpu = run_cuda(s, type, c, dloss, in_place);
  require_close(gpu, cpu, c, s, type, dloss / cpu.count);
}

}  // namespace

TEST_CASE("cuda fused cross-entropy matches its cpu twin at odd shapes, in place or not",
          "[gpu][classification]") {
  // dloss: the f16 loss scale 2^16 over 3 micro-batches, or bf16's 1/3.
  for (const DType type : {DType::bf16, DType::f16}) {
    const float dloss = type == DType::f16 ? 65536.0f / 3.0f : 1.0f / 3.0f;
    for (const float smoothing : {0.0f, 0.1f}) {
      check_case(7, 1001, type, DType::i64, smoothing, dloss, true);
      check_case(7, 1001, type, DType::i32, smoothing, dloss, false);
      check_case(37, 13, type, DType::i64, smoothing, dloss, true);
      check_case(64, 50304, type, DType::i64, smoothing, dloss, false);
    }
  }
}

TEST_CASE("cuda fused cross-entropy matches its cpu twin at gpt2's shape",
          "[gpu][classification]") {
  // 1024 x 50304 for both dtypes and smoothings; the whole 8192-row batch
  // (824 MB of bf16 logits) once, in place as the step runs it.
  for (const DType type : {DType::bf16, DType::f16}) {
    const float dloss = type == DType::f16 ? 65536.0f : 1.0f;
    for (const float smoothing : {0.0f, 0.1f})
      check_case(1024, 50304, type, DType::i64, smoothing, dloss, true);
  }
  check_case(8192, 50304, DType::bf16, DType::i64, 0.0f, 1.0f, true);
}

TEST_CASE("cuda fused cross-entropy gives the same bits on a second run", "[gpu][classification]") {
  const std::int64_t rows = 301, classes = 1001;
  const test::XentCase c = test::make_xent_case(rows, classes, DType::bf16, DType::i64, -100, 23);
  const kernels::ClassificationShape s{rows, classes, -100, DType::i64, 0.1f};
  const Fused a = run_cuda(s, DType::bf16, c, 0.5f, true),
              b = run_cuda(s, DType::bf16, c, 0.5f, true);
  CHECK(a.grad == b.grad);
  CHECK(a.loss == b.loss);
  CHECK(a.correct == b.correct);
  // Ignored rows are zeros, and no row is left unwritten.
  for (std::int64_t i = 0; i < rows; i += 5)
    for (std::int64_t j = 0; j < classes; ++j) REQUIRE(a.grad[i * classes + j] == 0);
}

TEST_CASE("cuda fused cross-entropy's time at gpt2's 8192 x 50304 beside the unfused path's",
          "[gpu][classification]") {
  // bf16 logits as under autocast, 1024 generated rows repeated 8 times. The
  // unfused path is what CrossEntropyLoss ran before: cast to f32, the f32
  // forward (probabilities), the backward in place, the cast back to bf16.
  // No assertion on time; the figures are printed.
  const std::int64_t rows = 8192, classes = 50304, part = 1024;
  const std::int64_t n = rows * classes;
  const test::XentCase c = test::make_xent_case(part, classes, DType::bf16, DType::i64, -100, 41);
  Tensor logits = Tensor::empty({n}, DType::bf16, kGpu);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(rows));
  for (std::int64_t k = 0; k < rows / part; ++k) {
    const std::size_t bytes = c.bits.size() * sizeof(std::uint16_t);
    REQUIRE(cudaMemcpy(static_cast<char*>(logits.data()) + k * bytes, c.bits.data(), bytes,
                       cudaMemcpyHostToDevice) == cudaSuccess);
    std::copy(c.labels.begin(), c.labels.end(), labels.begin() + k * part);
  }
  const Tensor glabels = Tensor::from_vector(labels, {rows}, DType::i64, kGpu);
  const kernels::ClassificationShape s{rows, classes};
  Tensor results = Tensor::empty({3}, DType::f32, kGpu);
  float* r = results.data_as<float>();
  Tensor workspace =
      Tensor::empty({static_cast<std::int64_t>(kernels::cuda::fused_xent_workspace_bytes(rows))},
                    DType::u8, kGpu);
  auto time_ms = [](int reps, auto&& run) {
    run();
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start, nullptr);
    for (int i = 0; i < reps; ++i) run();
    cudaEventRecord(stop, nullptr);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return static_cast<double>(ms) / reps;
  };
  // In place, as the step runs it: later calls read earlier gradients, the
  // same work.
  const double fused = time_ms(5, [&] {
    kernels::cuda::softmax_xent_fused(s, DType::bf16, logits.data(), glabels.data(), 1.0f,
                                      logits.data(), r, r + 1, r + 2, workspace.data(), nullptr);
  });
  double unfused = 0;
  {
    Tensor x = Tensor::empty({n}, DType::f32, kGpu), probs = Tensor::empty({n}, DType::f32, kGpu);
    Tensor back = Tensor::empty({n}, DType::bf16, kGpu);
    unfused = time_ms(5, [&] {
      kernels::cuda::cast(logits.data(), DType::bf16, x.data(), DType::f32, n, nullptr);
      kernels::cuda::softmax_xent_forward(s, x.data_as<float>(), glabels.data(),
                                          probs.data_as<float>(), r, r + 1, workspace.data(),
                                          nullptr);
      kernels::cuda::softmax_xent_backward(s, probs.data_as<float>(), glabels.data(), r + 1, 1.0f,
                                           probs.data_as<float>(), nullptr);
      kernels::cuda::cast(probs.data(), DType::f32, back.data(), DType::bf16, n, nullptr);
    });
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const double gb = 1e-9 * static_cast<double>(n) * 2;  // one pass over the bf16 logits
  std::printf(
      "cross-entropy bf16 [8192, 50304]: fused in place %.3f ms (3 passes of %.2f GB: %.0f GB/s), "
      "unfused (cast, f32 forward and backward, cast) %.3f ms; peak memory %.2f GB against "
      "%.2f GB\n",
      fused, gb, 3 * gb / (1e-3 * fused), unfused, gb, 5 * gb);
}
