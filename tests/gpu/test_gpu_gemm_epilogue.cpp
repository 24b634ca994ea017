// The CUDA GEMM epilogues (Note [gemm epilogues] in kernels/gemm.h) against
// their CPU twin at GPT-2's shapes (N = 8192 tokens: c_fc 768->3072 with GELU,
// c_proj 3072->768, c_attn 768->2304, and their backward GEMMs) and at odd
// ones (N 7, 37->19), in f32, f16 and bf16, fused where cuBLASLt offers the
// epilogue and with the fallback forced; that the counters say which ran;
// and that a plan made while the stream is captured into a CUDA graph takes
// the heuristic's first algorithm and runs in the graph.
//
// Tolerances, per element, for |CUDA - CPU twin| (both are f32-accumulated
// GEMMs of the same inputs): twice the one-sided GEMM bound
// test::gemm_tolerance with sum |a||b| computed by a GEMM of |A| and |B|; plus
// the epilogue's roundings, which differ between the two: the CPU rounds the
// product to C's type before adding the bias (the fused epilogue adds it in
// f32, or in C's type where cuBLASLt takes no f32 bias), so half an ulp of C's
// type of |pre| and |bias| each; GELU and its derivative through tanh, which
// cuBLASLt may evaluate with the hardware tanh.approx (2^-11 relative), so
// 2^-11 |pre| for GELU and 2^-9 |product| (1 + |pre|) for its derivative. A
// bias gradient adds the sum of its column's element tolerances and an f32
// accumulation bound over the rows (rows x 2^-24 x sum |c|).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/fusion.h"
#include "kernels/gemm.h"
#include "support/reference.h"

using namespace lockstep;
using namespace lockstep::core;
using kernels::GemmArgs;
using kernels::GemmEpilogue;

namespace {

const Device kGpu = Device::cuda(0);

double half_ulp(DType t) {
  if (t == DType::bf16) return std::ldexp(1.0, -8);
  if (t == DType::f16) return std::ldexp(1.0, -11);
  return std::ldexp(1.0, -24);
}

std::vector<float> decode_all(const std::vector<std::uint8_t>& bytes, DType type) {
  std::vector<float> out(bytes.size() / dtype_size(type));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = test::decode(bytes, type, static_cast<std::int64_t>(i));
  return out;
}

// One epilogue case: operands as stored, run on both devices.
struct Case {
  GemmEpilogue epilogue;
  bool trans_a, trans_b;
  std::int64_t m, n, k;
  DType ab, c;
  bool accumulate = false;  // the bias gradient's
  float beta = 0.0f;
};

struct Result {
  std::vector<float> c, aux, bias_grad;
};

struct Operands {
  test::RandomMatrix a, b, c0, aux;
  std::vector<float> bias, bias_grad0;
};

Operands make_operands(const Case& k) {
  Operands o;
  o.a = test::random_matrix(k.m * k.k, k.ab, 1);
  o.b = test::random_matrix(k.k * k.n, k.ab, 2);
  o.c0 = test::random_matrix(k.m * k.n, k.c, 3);
  o.aux = test::random_matrix(k.m * k.n, k.c, 4);  // a pre-activation in [-1, 1]
  const std::int64_t length = k.epilogue == GemmEpilogue::bgrad_a ? k.m : k.n;
  o.bias = test::random_matrix(length, DType::f32, 5).values;
  o.bias_grad0 = test::random_matrix(length, DType::f32, 6).values;
  return o;
}

GemmArgs args_for(const Case& k) {
  GemmArgs g;
  g.trans_a = k.trans_a, g.trans_b = k.trans_b;
  g.m = k.m, g.n = k.n, g.k = k.k;
  g.beta = k.beta;
  g.lda = k.trans_a ? k.m : k.k;
  g.ldb = k.trans_b ? k.k : k.n;
  g.ldc = k.n;
  g.ab_type = k.ab, g.c_type = k.c;
  g.epilogue = k.epilogue;
  g.bias_grad_accumulate = k.accumulate;
  return g;
}

Result run_cpu(const Case& k, const Operands& o) {
  GemmArgs g = args_for(k);
  std::vector<std::uint8_t> c = o.c0.bytes, aux = o.aux.bytes;
  std::vector<float> bias_grad = o.bias_grad0;
  g.a = o.a.bytes.data(), g.b = o.b.bytes.data(), g.c = c.data();
  if (k.epilogue == GemmEpilogue::bias || k.epilogue == GemmEpilogue::bias_gelu_aux)
    g.bias = o.bias.data();
  if (k.epilogue == GemmEpilogue::bias_gelu_aux || k.epilogue == GemmEpilogue::dgelu_bgrad)
    g.aux = aux.data();
  if (k.epilogue == GemmEpilogue::dgelu_bgrad || k.epilogue == GemmEpilogue::bgrad_a)
    g.bias_grad = bias_grad.data();
  kernels::cpu::gemm(g);
  return {decode_all(c, k.c), decode_all(aux, k.c), bias_grad};
}

Result run_cuda(const Case& k, const Operands& o) {
  GemmArgs g = args_for(k);
  Tensor a = Tensor::from_host(o.a.bytes.data(), {k.m * k.k}, k.ab, kGpu);
  Tensor b = Tensor::from_host(o.b.bytes.data(), {k.k * k.n}, k.ab, kGpu);
  Tensor c = Tensor::from_host(o.c0.bytes.data(), {k.m * k.n}, k.c, kGpu);
  Tensor aux = Tensor::from_host(o.aux.bytes.data(), {k.m * k.n}, k.c, kGpu);
  Tensor bias = Tensor::from_host(o.bias.data(), {static_cast<std::int64_t>(o.bias.size())},
                                  DType::f32, kGpu);
  Tensor bias_grad = Tensor::from_host(
      o.bias_grad0.data(), {static_cast<std::int64_t>(o.bias_grad0.size())}, DType::f32, kGpu);
  Tensor workspace = Tensor::empty({static_cast<std::int64_t>(kernels::cuda::kGemmWorkspaceBytes)},
                                   DType::u8, kGpu);
  g.a = a.data(), g.b = b.data(), g.c = c.data();
  if (k.epilogue == GemmEpilogue::bias || k.epilogue == GemmEpilogue::bias_gelu_aux)
    g.bias = bias.data_as<float>();
  if (k.epilogue == GemmEpilogue::bias_gelu_aux || k.epilogue == GemmEpilogue::dgelu_bgrad)
    g.aux = aux.data();
  if (k.epilogue == GemmEpilogue::dgelu_bgrad || k.epilogue == GemmEpilogue::bgrad_a)
    g.bias_grad = bias_grad.data_as<float>();
  // The tensors were made on the device's own stream; the GEMM runs on the legacy one.
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  kernels::cuda::gemm(g, workspace.data(), kernels::cuda::kGemmWorkspaceBytes, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  Result r;
  std::vector<std::uint8_t> bytes(c.nbytes());
  c.copy_to_host(bytes.data());
  r.c = decode_all(bytes, k.c);
  aux.copy_to_host(bytes.data());
  r.aux = decode_all(bytes, k.c);
  r.bias_grad.resize(o.bias_grad0.size());
  bias_grad.copy_to_host(r.bias_grad.data());
  return r;
}

// sum_p |op(A)[i, p]| |op(B)[p, j]| (+ |beta c0|) by the CPU GEMM of the magnitudes.
std::vector<float> magnitudes(const Case& k, const Operands& o) {
  std::vector<float> a = o.a.values, b = o.b.values;
  for (float& v : a) v = std::fabs(v);
  for (float& v : b) v = std::fabs(v);
  std::vector<float> mag(k.m * k.n, 0.0f);
  for (std::int64_t i = 0; i < k.m * k.n; ++i) mag[i] = std::fabs(k.beta * o.c0.values[i]);
  GemmArgs g = args_for(k);
  g.epilogue = GemmEpilogue::none;
  g.ab_type = g.c_type = DType::f32;
  g.beta = 1.0f;
  g.a = a.data(), g.b = b.data(), g.c = mag.data();
  kernels::cpu::gemm(g);
  return mag;
}

void check_case(const Case& k) {
  INFO(kernels::gemm_epilogue_name(k.epilogue)
       << " m=" << k.m << " n=" << k.n << " k=" << k.k << " " << dtype_name(k.ab) << "->"
       << dtype_name(k.c) << " accumulate=" << k.accumulate << " beta=" << k.beta);
  const Operands o = make_operands(k);
  const Result cpu = run_cpu(k, o), gpu = run_cuda(k, o);
  const std::vector<float> mag = magnitudes(k, o);
  std::vector<double> c_tol(k.m * k.n);
  for (std::int64_t i = 0; i < k.m * k.n; ++i) {
    const std::int64_t j = i % k.n;
    const double product_tol = 2.0 * test::gemm_tolerance(mag[i], cpu.c[i], k.k, k.c);
    double tol = product_tol;
    switch (k.epilogue) {
      case GemmEpilogue::bias:
        tol += 2.0 * half_ulp(k.c) * (std::fabs(cpu.c[i]) + std::fabs(o.bias[j]));
        break;
      case GemmEpilogue::bias_gelu_aux: {
        const double pre = cpu.aux[i];
        const double pre_tol =
            product_tol + 2.0 * half_ulp(k.c) * (std::fabs(pre) + std::fabs(o.bias[j]));
        if (std::fabs(gpu.aux[i] - pre) > pre_tol)
          FAIL("aux element " << i << ": CUDA " << gpu.aux[i] << ", CPU " << pre << ", tolerance "
                              << pre_tol);
        tol = 1.13 * pre_tol + std::ldexp(1.0, -11) * std::fabs(pre) +
              2.0 * half_ulp(k.c) * std::fabs(cpu.c[i]);
        break;
      }
      case GemmEpilogue::dgelu_bgrad: {
        const double pre = o.aux.values[i], product = mag[i];  // |product| <= its magnitude
        tol = 1.13 * product_tol + std::ldexp(1.0, -9) * product * (1.0 + std::fabs(pre)) +
              2.0 * half_ulp(k.c) * std::fabs(cpu.c[i]);
        break;
      }
      default:
        break;
    }
    c_tol[i] = tol + 1e-30;
    if (std::fabs(gpu.c[i] - cpu.c[i]) > c_tol[i])
      FAIL("element " << i << ": CUDA " << gpu.c[i] << ", CPU twin " << cpu.c[i] << ", tolerance "
                      << c_tol[i]);
  }
  if (k.epilogue == GemmEpilogue::dgelu_bgrad) {
    for (std::int64_t j = 0; j < k.n; ++j) {
      double tol = std::fabs(o.bias_grad0[j]) * std::ldexp(1.0, -23), sum_abs = 0.0;
      for (std::int64_t i = 0; i < k.m; ++i) {
        tol += c_tol[i * k.n + j];
        sum_abs += std::fabs(cpu.c[i * k.n + j]);
      }
      tol += static_cast<double>(k.m) * std::ldexp(1.0, -24) * sum_abs;
      if (std::fabs(gpu.bias_grad[j] - cpu.bias_grad[j]) > tol)
        FAIL("bias gradient " << j << ": CUDA " << gpu.bias_grad[j] << ", CPU " << cpu.bias_grad[j]
                              << ", tolerance " << tol);
    }
  }
  if (k.epilogue == GemmEpilogue::bgrad_a) {
    for (std::int64_t i = 0; i < k.m; ++i) {
      double sum_abs = std::fabs(o.bias_grad0[i]);
      for (std::int64_t p = 0; p < k.k; ++p) sum_abs += std::fabs(o.a.values[p * k.m + i]);
      const double tol = (static_cast<double>(k.k) + 2.0) * std::ldexp(1.0, -24) * sum_abs;
      if (std::fabs(gpu.bias_grad[i] - cpu.bias_grad[i]) > tol)
        FAIL("bias gradient " << i << ": CUDA " << gpu.bias_grad[i] << ", CPU " << cpu.bias_grad[i]
                              << ", tolerance " << tol);
    }
  }
}

// A Linear's forward (x [N, in] W^T, W stored [out, in]), the next layer's dX
// GEMM with GELU's derivative (dy [N, k] W [k, n], W stored [k, n]), and a dW
// GEMM with its bias gradient (dy^T x, dy stored [N, out]).
std::vector<Case> cases(std::int64_t tokens, std::int64_t in, std::int64_t out, DType ab, DType c,
                        bool gelu) {
  std::vector<Case> list;
  list.push_back({gelu ? GemmEpilogue::bias_gelu_aux : GemmEpilogue::bias, false, true, tokens, out,
                  in, ab, c});
  if (gelu) list.push_back({GemmEpilogue::dgelu_bgrad, false, false, tokens, out, in, ab, c});
  for (bool accumulate : {false, true})
    list.push_back({GemmEpilogue::bgrad_a, true, false, out, in, tokens, ab, DType::f32, accumulate,
                    accumulate ? 1.0f : 0.0f});
  if (gelu) list.push_back({GemmEpilogue::dgelu_bgrad, false, false, tokens, out, in, ab, c, true});
  return list;
}

void check_all(std::int64_t tokens, std::int64_t in, std::int64_t out, bool gelu) {
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (const Case& k : cases(tokens, in, out, t, t, gelu)) check_case(k);
}

}  // namespace

TEST_CASE("cuda gemm epilogues match the cpu twin at gpt2's shapes", "[gpu][gemm]") {
  kernels::cpu::set_gemm_threads(8);  // the twin's GEMMs at N = 8192 (restored below)
  kernels::cuda::reset_gemm_epilogue_counts();
  check_all(8192, 768, 3072, true);   // c_fc + GELU, and c_proj's dX with its derivative
  check_all(8192, 3072, 768, false);  // c_proj
  check_all(8192, 768, 2304, false);  // c_attn
  // Which ran: the fused epilogue, or the separate kernels and why (printed
  // for the GPU check's log; both are correct).
  const auto counts = kernels::cuda::gemm_epilogue_counts();
  for (GemmEpilogue e : {GemmEpilogue::bias, GemmEpilogue::bias_gelu_aux, GemmEpilogue::dgelu_bgrad,
                         GemmEpilogue::bgrad_a}) {
    const auto& n = counts[static_cast<std::size_t>(e)];
    WARN(kernels::gemm_epilogue_name(e)
         << ": fused " << n.fused << ", separate " << n.fallback
         << (n.fallback ? " (" + n.last_fallback_reason + ")" : std::string()));
    CHECK(n.fused + n.fallback > 0);
  }
  for (const std::string& line : kernels::cuda::gemm_plan_descriptions()) WARN(line);
  kernels::cpu::set_gemm_threads(1);
}

TEST_CASE("cuda gemm epilogues match the cpu twin at odd shapes", "[gpu][gemm]") {
  check_all(7, 37, 19, true);  // aux ld 19: not a multiple of 8, the separate kernels
  check_all(7, 37, 24, true);
  check_all(37, 19, 7, false);
}

TEST_CASE("cuda gemm epilogues forced to the separate kernels match the cpu twin and say so",
          "[gpu][gemm]") {
  struct Restore {  // the process's settings, also when a check fails
    ~Restore() {
      kernels::set_fused_kernels(true);
      kernels::cpu::set_gemm_threads(1);
    }
  } restore;
  kernels::cpu::set_gemm_threads(8);
  kernels::set_fused_kernels(false);
  kernels::cuda::reset_gemm_epilogue_counts();
  check_all(8192, 768, 3072, true);
  check_all(7, 37, 24, true);
  const auto counts = kernels::cuda::gemm_epilogue_counts();
  for (GemmEpilogue e :
       {GemmEpilogue::bias_gelu_aux, GemmEpilogue::dgelu_bgrad, GemmEpilogue::bgrad_a}) {
    const auto& n = counts[static_cast<std::size_t>(e)];
    CHECK(n.fused == 0);
    CHECK(n.fallback > 0);
    CHECK(n.last_fallback_reason == "disabled");
  }
}

TEST_CASE("a gemm first planned during graph capture takes the heuristic's first and replays",
          "[gpu][gemm]") {
  // Over 1 GFLOP, the size from which new plans are timed outside a capture.
  const Case k{GemmEpilogue::bias, false, true, 1024, 1032, 520, DType::bf16, DType::bf16};
  const Operands o = make_operands(k);
  const Result cpu = run_cpu(k, o);
  Tensor a = Tensor::from_host(o.a.bytes.data(), {k.m * k.k}, k.ab, kGpu);
  Tensor b = Tensor::from_host(o.b.bytes.data(), {k.k * k.n}, k.ab, kGpu);
  Tensor c = Tensor::zeros({k.m * k.n}, k.c, kGpu);
  Tensor bias = Tensor::from_host(o.bias.data(), {k.n}, DType::f32, kGpu);
  Tensor workspace = Tensor::empty({static_cast<std::int64_t>(kernels::cuda::kGemmWorkspaceBytes)},
                                   DType::u8, kGpu);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  GemmArgs g = args_for(k);
  g.a = a.data(), g.b = b.data(), g.c = c.data(), g.bias = bias.data_as<float>();
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  kernels::cuda::gemm(g, workspace.data(), kernels::cuda::kGemmWorkspaceBytes, stream);
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  std::vector<std::uint8_t> bytes(c.nbytes());
  c.copy_to_host(bytes.data());
  const std::vector<float> got = decode_all(bytes, k.c);
  const std::vector<float> mag = magnitudes(k, o);
  for (std::int64_t i = 0; i < k.m * k.n; ++i) {
    const double tol = 2.0 * test::gemm_tolerance(mag[i], cpu.c[i], k.k, k.c) +
                       2.0 * half_ulp(k.c) * (std::fabs(cpu.c[i]) + std::fabs(o.bias[i % k.n]));
    REQUIRE(std::fabs(got[i] - cpu.c[i]) <= tol);
  }
  bool described = false;
  for (const std::string& line : kernels::cuda::gemm_plan_descriptions())
    if (line.find("m=1024 n=1032 k=520") != std::string::npos)
      described = described || line.find("stream capturing") != std::string::npos ||
                  line.find("separate kernels") != std::string::npos ||
                  line.find("heuristic first of 1") != std::string::npos;
  CHECK(described);
}
