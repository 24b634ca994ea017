// lockstep-gpu-smoke: the first seconds of a GPU session (tools/gpu-check.sh
// run-tests), so that a broken environment costs seconds, not minutes. In
// order: a GPU is usable; a zero-byte device tensor allocates and frees; a
// kernel then launches with no CUDA error left behind; a cuBLASLt GEMM runs;
// the cuDNN version loaded and whether cuDNN's fused attention has plans at
// gpt2's shape (printed; their absence is not a failure, the attention then
// runs unfused); a one-rank NCCL world allreduces. Prints one line per check, line-buffered
// so that the lines before a hang survive its kill; exits 1 at the first that
// fails, naming it.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "comm/world.h"
#include "engine/core/device.h"
#include "engine/core/ops.h"
#include "engine/core/tensor.h"
#include "kernels/sdpa.h"

using namespace lockstep;

namespace {

[[noreturn]] void fail(const std::string& check, const std::string& why) {
  std::printf("smoke: FAILED %s: %s\n", check.c_str(), why.c_str());
  std::exit(1);
}

void pass(const char* check) { std::printf("smoke: ok %s\n", check); }

void no_cuda_error(const char* check) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    fail(check, std::string("cudaGetLastError: ") + cudaGetErrorName(status) + ": " +
                    cudaGetErrorString(status));
}

void run() {
  if (!core::cuda_available())
    fail("device", "no usable GPU (check the driver and CUDA libraries)");
  const core::Device gpu = core::Device::cuda(0);
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, 0) != cudaSuccess) fail("device", "cudaGetDeviceProperties");
  std::printf("smoke: device %s, sm_%d%d\n", props.name, props.major, props.minor);
  pass("device");

  { const core::Tensor empty = core::Tensor::empty({0}, DType::f32, gpu); }
  no_cuda_error("zero-byte free");
  pass("zero-byte free");

  core::Tensor filled = core::Tensor::empty({4096}, DType::f32, gpu);
  filled.fill_(3.0);
  no_cuda_error("kernel launch");
  if (filled.to_vector<float>()[4095] != 3.0f) fail("kernel launch", "fill wrote a wrong value");
  pass("kernel launch");

  const core::Tensor ones = core::Tensor::zeros({64, 32}, DType::f32, gpu);
  core::Tensor product = core::Tensor::empty({64, 64}, DType::f32, gpu);
  core::ops::matmul(ones, ones, product, {.trans_b = true});
  no_cuda_error("gemm");
  if (product.to_vector<float>()[0] != 0.0f) fail("gemm", "0 x 0 gave a nonzero value");
  pass("gemm");

  // cuDNN's fused attention at gpt2's shape (B 8, H 12, T 1024, D 64, bf16).
  std::printf("smoke: cuDNN %zu (cudnnGetVersion)\n", kernels::cuda::cudnn_runtime_version());
  const kernels::SdpaShape gpt2{8, 12, 1024, 64, DType::bf16};
  for (auto [pass_kind, deterministic] :
       {std::pair{kernels::SdpaPass::forward, false}, std::pair{kernels::SdpaPass::backward, false},
        std::pair{kernels::SdpaPass::backward, true}}) {
    std::string why;
    const bool supported = kernels::cuda::sdpa_supported(gpt2, pass_kind, deterministic, &why);
    no_cuda_error("sdpa");
    std::printf("smoke: fused attention %s: %s\n",
                kernels::sdpa_plan_key(0, gpt2, pass_kind, deterministic).str().c_str(),
                supported ? "supported" : ("not supported (" + why + ")").c_str());
  }
  pass("sdpa query");

  int argc = 0;
  char** argv = nullptr;
  const std::unique_ptr<comm::World> world = comm::init(argc, argv);
  if (world->size() != 1)
    fail("nccl", "expected a world of one, got " + std::to_string(world->size()));
  comm::Communicator& nccl = world->for_device(world->device());
  if (std::string(nccl.backend()) != "nccl") fail("nccl", std::string("backend ") + nccl.backend());
  core::Tensor values =
      core::Tensor::from_vector<float>({1.0f, -2.0f, 0.5f, 7.0f}, {4}, DType::f32).to(gpu);
  nccl.allreduce(values, comm::ReduceOp::sum);
  no_cuda_error("nccl");
  if (values.to_vector<float>() != std::vector<float>{1.0f, -2.0f, 0.5f, 7.0f})
    fail("nccl", "a one-rank allreduce changed its input");
  pass("nccl");
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // stdout is a log file: fully buffered otherwise
  try {
    run();
  } catch (const std::exception& e) {
    fail("exception", e.what());
  }
  std::printf("smoke: all passed\n");
  return 0;
}
