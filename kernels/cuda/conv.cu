// CUDA convolution (kernels/conv.h) on cuDNN's legacy API, plus the per-channel
// bias kernels. Each (device, shape, dtype, pass, settings) is planned once:
// descriptors and the chosen algorithm are cached, so a training step makes
// no algorithm queries after the first.
//
// Note [conv algorithm choice]: a new plan's candidates come from cuDNN's
// timing (cudnnFind*AlgorithmEx, fastest first) when conv_autotune(), which
// is the default outside deterministic runs (kernels/conv.h), and otherwise
// from cudnnGet*Algorithm_v7 (heuristics: no timing, no allocation, the same
// answer after a restart): in deterministic runs, with
// set_conv_autotune(false), and while the planning stream is being captured
// into a CUDA graph (timing synchronises the stream, which capture forbids;
// such a plan is kept under the untimed key, so a later uncaptured use of the
// shape still times it, and a capture after warm-up finds the timed plans).
// Timing runs every algorithm on scratch operands taken with cudaMallocAsync
// from the stream's pool, the one the engine allocates from: zero-filled x, w
// and y, and a workspace of kAlgoWorkspaceLimitBytes (an algorithm that needs
// more reports ALLOC_FAILED and is passed over). Find*Ex overwrites its
// output operand (y, dx or dw) with arbitrary values, with no alpha or beta,
// so it never touches a live tensor: a dw that accumulates across
// micro-batches would be lost. Without the memory for the trials the plan
// takes the heuristic's choice. The stream is synchronised before the trials,
// so that earlier work does not count in the first. Ranks time apart and may
// choose differently; rank-invariant runs are deterministic, hence untimed.
// Either way the first candidate that succeeded, needs at most
// kAlgoWorkspaceLimitBytes, is deterministic when deterministic() is set,
// and, for f32, does not use tensor cores is taken. f32 runs with
// CUDNN_FMA_MATH: true f32, as our f32 GEMMs (cuDNN's default would allow
// TF32 on Ampere and later). f16 and bf16 run with f32 accumulation (compute
// type CUDNN_DATA_FLOAT) and take the math type paired with the algorithm.
// conv2d_plan_descriptions() says, per plan, which was taken and how.
//
// Note [16-bit weight gradient]: under autocast cuDNN writes the weight
// gradient in the data type, into scratch past the algorithm's workspace, and
// a kernel adds it to the f32 gradient (or writes it, on a stale gradient).
// cuDNN cannot write or accumulate an f32 dw from f16/bf16 x and dy in the
// legacy API: x, dy and dw share one data type in every supported
// configuration (PSEUDO_HALF_CONFIG: all HALF with FLOAT compute), and the
// filter descriptor's type is the only type dw has. The round trip costs 12
// bytes per weight (ResNet-18: 11.2M weights, 134 MB, ~0.07 ms a step).
//
// Note [channels-last convolution]: with Conv2dShape::channels_last, x, y,
// dx and dy are described to cuDNN as CUDNN_TENSOR_NHWC, and so is the
// filter, which cuDNN then reads and writes in KRSC order ([out, kh, kw,
// in/groups]). cuDNN's tensor-core kernels are NHWC kernels: given NCHW
// operands it runs them between its own layout transforms (the legacy
// API's "Tensor Transformations"), and it picks its fast NHWC kernels when
// x, w and y are all NHWC; PyTorch's channels_last does the same (the weight
// made contiguous in the input's memory format), so this path runs what
// PyTorch runs. Our weights stay KCRS (the checkpoint layout, Note
// [channels-last on the CPU] has the CPU side), so:
// - forward and backward_data transpose w (in the compute type, usually the
//   layer's bf16 copy) into KRSC scratch past the algorithm's workspace
//   (layout.h's batched_transpose(K, C/g, R*S)), then call cuDNN on it;
// - backward_filter lets cuDNN write a KRSC gradient into scratch (in the
//   data type, Note [16-bit weight gradient], or f32 for f32), then
//   batched_transpose_add_f32(K, R*S, C/g) adds it, transposed, to the f32
//   KCRS dw (or writes it, without `accumulate`): for 16-bit types the same
//   bytes as the NCHW path's cast-add, permuted; for f32 a 4-byte scratch
//   round trip more than NCHW's beta = 1.
// conv2d_workspace_bytes counts the scratch (weights x the type's size,
// after the algorithm's workspace aligned to 256 bytes). The plans are keyed
// and described by the layout; algorithm choice (Note [conv algorithm
// choice]) is the same, timed or heuristic, deterministic filtered.
// Cost by arithmetic, ResNet-50 under bf16 autocast: 23.5M conv weights (of
// 25.6M parameters; fc is a GEMM), 4 bytes moved per weight per transpose:
// forward and backward_data add 2 x 94 MB = 188 MB a step, about 0.04 ms at
// the H200's 4.8 TB/s (0.06 ms at a transpose's ~3 TB/s); backward_filter's
// transpose-add moves what the NCHW cast-add moves. Against that, NCHW
// activations make cuDNN transform x and y (dy and dx) around every
// tensor-core call, each a read and a write of the activation.
// The bias (rare before BatchNorm) is added channel-minor (index i % C);
// its gradient is channel_bias_grad_nhwc, the [rows, C] column sum.
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/bias.h"
#include "kernels/conv.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/check_cudnn.h"
#include "kernels/cuda/cudnn_handle.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/layout.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::from_f32;
using detail::kThreads;
using detail::to_f32;

constexpr std::size_t kAlgoWorkspaceLimitBytes = 256u << 20;
constexpr std::size_t kScratchAlignment = 256;

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      break;
  }
  throw InvalidArgument(std::string("conv2d: dtype ") + dtype_name(t) +
                        " is not supported (use f32, f16 or bf16)");
}

const char* pass_name(ConvPass pass) {
  switch (pass) {
    case ConvPass::forward:
      return "forward";
    case ConvPass::backward_data:
      return "backward data";
    case ConvPass::backward_filter:
      return "backward filter";
  }
  return "?";
}

std::string describe(const Conv2dShape& s, DType type) {
  auto str = [](std::int64_t v) { return std::to_string(v); };
  const std::string x = s.channels_last ? "NHWC x [" + str(s.batch) + ", " + str(s.in_h) + ", " +
                                              str(s.in_w) + ", " + str(s.in_channels) + "]"
                                        : "x [" + str(s.batch) + ", " + str(s.in_channels) + ", " +
                                              str(s.in_h) + ", " + str(s.in_w) + "]";
  return std::string(dtype_name(type)) + " " + x + " w [" + str(s.out_channels) + ", " +
         str(s.in_channels / s.groups) + ", " + str(s.kernel_h) + ", " + str(s.kernel_w) +
         "] stride " + str(s.stride_h) + "x" + str(s.stride_w) + " padding " + str(s.pad_h) + "x" +
         str(s.pad_w) + " dilation " + str(s.dilation_h) + "x" + str(s.dilation_w) + " groups " +
         str(s.groups);
}

const char* algo_name(cudnnConvolutionFwdAlgo_t a) {
  static const char* const names[] = {
      "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
      "WINOGRAD",      "WINOGRAD_NONFUSED"};
  const int i = static_cast<int>(a);
  return i >= 0 && i < CUDNN_CONVOLUTION_FWD_ALGO_COUNT ? names[i] : "?";
}
const char* algo_name(cudnnConvolutionBwdDataAlgo_t a) {
  static const char* const names[] = {"ALGO_0",     "ALGO_1",   "FFT",
                                      "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  const int i = static_cast<int>(a);
  return i >= 0 && i < CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT ? names[i] : "?";
}
const char* algo_name(cudnnConvolutionBwdFilterAlgo_t a) {
  static const char* const names[] = {
      "ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  const int i = static_cast<int>(a);
  return i >= 0 && i < CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT ? names[i] : "?";
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH:
      return "default math";
    case CUDNN_TENSOR_OP_MATH:
      return "tensor-op math";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return "tensor-op math with conversion";
    case CUDNN_FMA_MATH:
      return "FMA math";
  }
  return "? math";
}

struct PlanKey {
  int device;
  Conv2dShape s;
  DType type;
  ConvPass pass;
  bool deterministic, timed;
  auto tie() const {
    return std::tie(device, s.batch, s.in_channels, s.in_h, s.in_w, s.out_channels, s.kernel_h,
                    s.kernel_w, s.stride_h, s.stride_w, s.pad_h, s.pad_w, s.dilation_h,
                    s.dilation_w, s.groups, s.channels_last, type, pass, deterministic, timed);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

struct Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t forward_algo{};
  cudnnConvolutionBwdDataAlgo_t data_algo{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo{};
  std::size_t algo_workspace_bytes = 0;  // what cuDNN needs
  // Past it (aligned): the KRSC weight copy, or the weight gradient's scratch
  // (Notes [16-bit weight gradient], [channels-last convolution]); 0 if none.
  std::size_t filter_scratch_bytes = 0;
  std::size_t workspace_bytes = 0;  // all of it
  std::string description;          // conv2d_plan_descriptions()
  ~Plan() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

struct Cache {
  std::mutex mutex;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

// Leaked on purpose, like the handles (kernels/cuda/cudnn_handle.h).
Cache& cache() {
  static Cache* instance = new Cache;
  return *instance;
}

// The scratch operands cudnnFind*Ex times on (Note [conv algorithm choice]),
// from the stream's pool, handed back in stream order when the plan is made.
class TrialOperands {
 public:
  explicit TrialOperands(CudaStream stream) : stream_(stream) {}
  TrialOperands(const TrialOperands&) = delete;
  TrialOperands& operator=(const TrialOperands&) = delete;
  // Best effort on the way out: a failed free leaves memory in the pool, and
  // a destructor must not throw.
  ~TrialOperands() {
    for (void* p : {x, w, y, workspace})
      if (p && cudaFreeAsync(p, stream_) != cudaSuccess) cudaGetLastError();
  }
  // False (with the CUDA error cleared) when the pool cannot give them.
  bool take(const Conv2dShape& s, DType type) {
    const std::size_t elem = dtype_size(type);
    const auto count = [](std::int64_t v) { return static_cast<std::size_t>(v); };
    return take_zeroed(x, count(s.batch * s.in_channels * s.in_h * s.in_w) * elem) &&
           take_zeroed(
               w, count(s.out_channels * (s.in_channels / s.groups) * s.kernel_h * s.kernel_w) *
                      elem) &&
           take_zeroed(y, count(s.batch * s.out_channels * s.out_h() * s.out_w()) * elem) &&
           take_zeroed(workspace, workspace_bytes);
  }

  void *x = nullptr, *w = nullptr, *y = nullptr, *workspace = nullptr;
  const std::size_t workspace_bytes = kAlgoWorkspaceLimitBytes;

 private:
  bool take_zeroed(void*& p, std::size_t bytes) {
    if (cudaMallocAsync(&p, bytes, stream_) != cudaSuccess) {
      p = nullptr;
      cudaGetLastError();
      return false;
    }
    LOCKSTEP_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, stream_));
    return true;
  }
  CudaStream stream_;
};

// Index of the first acceptable candidate (Note [conv algorithm choice]).
template <typename Perf>
int pick(const std::vector<Perf>& perf, int count, const PlanKey& key) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kAlgoWorkspaceLimitBytes) continue;
    if (key.deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    if (key.type == DType::f32 && p.mathType != CUDNN_FMA_MATH && p.mathType != CUDNN_DEFAULT_MATH)
      continue;
    return i;
  }
  throw LibraryError(
      "cuDNN", CUDNN_STATUS_NOT_SUPPORTED,
      std::string("no cuDNN algorithm for conv2d ") + pass_name(key.pass) + " of " +
          describe(key.s, key.type) + (key.deterministic ? " in deterministic mode" : "") +
          " within a workspace of " + std::to_string(kAlgoWorkspaceLimitBytes >> 20) + " MiB");
}

// Takes candidate `i` of `count`: its math type on the descriptor, and the
// choice described. `trial`: the candidates were timed; else `untimed` says why not.
template <typename Perf>
void take_candidate(Plan& plan, const std::vector<Perf>& perf, int i, int count, DType type,
                    const TrialOperands* trial, const char* untimed) {
  const Perf& p = perf[static_cast<std::size_t>(i)];
  const cudnnMathType_t math = type == DType::f32 ? CUDNN_FMA_MATH : p.mathType;
  LOCKSTEP_CHECK_CUDNN(cudnnSetConvolutionMathType(plan.conv, math));
  char how[128];
  if (trial)
    std::snprintf(how, sizeof how, "timed #%d of %d: %.4f ms", i, count,
                  static_cast<double>(p.time));
  else
    std::snprintf(how, sizeof how, "heuristic #%d of %d (%s)", i, count, untimed);
  plan.description = std::string(algo_name(p.algo)) + " (" +
                     std::to_string(static_cast<int>(p.algo)) + "), " + how + ", " +
                     math_name(math);
}

void choose_algorithm(cudnnHandle_t handle, Plan& plan, const PlanKey& key,
                      const TrialOperands* trial, const char* untimed) {
  int max_count = 0, count = 0;
  switch (key.pass) {
    case ConvPass::forward: {
      LOCKSTEP_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
      if (trial)
        LOCKSTEP_CHECK_CUDNN(cudnnFindConvolutionForwardAlgorithmEx(
            handle, plan.x, trial->x, plan.w, trial->w, plan.conv, plan.y, trial->y, max_count,
            &count, perf.data(), trial->workspace, trial->workspace_bytes));
      else
        LOCKSTEP_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(
            handle, plan.x, plan.w, plan.conv, plan.y, max_count, &count, perf.data()));
      const int i = pick(perf, count, key);
      take_candidate(plan, perf, i, count, key.type, trial, untimed);
      plan.forward_algo = perf[static_cast<std::size_t>(i)].algo;
      LOCKSTEP_CHECK_CUDNN(
          cudnnGetConvolutionForwardWorkspaceSize(handle, plan.x, plan.w, plan.conv, plan.y,
                                                  plan.forward_algo, &plan.algo_workspace_bytes));
      return;
    }
    case ConvPass::backward_data: {
      LOCKSTEP_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
      if (trial)
        LOCKSTEP_CHECK_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx(
            handle, plan.w, trial->w, plan.y, trial->y, plan.conv, plan.x, trial->x, max_count,
            &count, perf.data(), trial->workspace, trial->workspace_bytes));
      else
        LOCKSTEP_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            handle, plan.w, plan.y, plan.conv, plan.x, max_count, &count, perf.data()));
      const int i = pick(perf, count, key);
      take_candidate(plan, perf, i, count, key.type, trial, untimed);
      plan.data_algo = perf[static_cast<std::size_t>(i)].algo;
      LOCKSTEP_CHECK_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize(
          handle, plan.w, plan.y, plan.conv, plan.x, plan.data_algo, &plan.algo_workspace_bytes));
      return;
    }
    case ConvPass::backward_filter: {
      LOCKSTEP_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
      if (trial)
        LOCKSTEP_CHECK_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(
            handle, plan.x, trial->x, plan.y, trial->y, plan.conv, plan.w, trial->w, max_count,
            &count, perf.data(), trial->workspace, trial->workspace_bytes));
      else
        LOCKSTEP_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            handle, plan.x, plan.y, plan.conv, plan.w, max_count, &count, perf.data()));
      const int i = pick(perf, count, key);
      take_candidate(plan, perf, i, count, key.type, trial, untimed);
      plan.filter_algo = perf[static_cast<std::size_t>(i)].algo;
      LOCKSTEP_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(
          handle, plan.x, plan.y, plan.conv, plan.w, plan.filter_algo, &plan.algo_workspace_bytes));
      return;
    }
  }
}

std::size_t align_up(std::size_t bytes) {
  return (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
}

std::int64_t weight_count(const Conv2dShape& s) {
  return s.out_channels * (s.in_channels / s.groups) * s.kernel_h * s.kernel_w;
}

// The filter scratch past the algorithm's workspace (Plan::filter_scratch_bytes).
void* filter_scratch(const Plan& plan, void* workspace) {
  return static_cast<char*>(workspace) + align_up(plan.algo_workspace_bytes);
}

// Note [channels-last convolution]: w (KCRS) as cuDNN reads it for the plan:
// itself for NCHW, else transposed to KRSC into the filter scratch.
const void* filter_for(const Plan& plan, const Conv2dShape& s, DType type, const void* w,
                       void* workspace, CudaStream stream) {
  if (!s.channels_last) return w;
  void* krsc = filter_scratch(plan, workspace);
  batched_transpose(type, s.out_channels, s.in_channels / s.groups, s.kernel_h * s.kernel_w, w,
                    krsc, stream);
  return krsc;
}

// key.timed: time the candidates on `stream` if the pool gives the trial
// operands; `untimed` says why a plan that is not timed was not.
std::unique_ptr<Plan> make_plan(cudnnHandle_t handle, const PlanKey& key, CudaStream stream,
                                const char* untimed) {
  const Conv2dShape& s = key.s;
  const cudnnDataType_t type = cudnn_type(key.type);
  // Note [channels-last convolution]: NHWC activations with a KRSC filter.
  const cudnnTensorFormat_t format = s.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  auto plan = std::make_unique<Plan>();
  auto i = [](std::int64_t v) { return static_cast<int>(v); };  // validate_conv2d bounds them
  LOCKSTEP_CHECK_CUDNN(cudnnCreateTensorDescriptor(&plan->x));
  LOCKSTEP_CHECK_CUDNN(cudnnSetTensor4dDescriptor(plan->x, format, type, i(s.batch),
                                                  i(s.in_channels), i(s.in_h), i(s.in_w)));
  LOCKSTEP_CHECK_CUDNN(cudnnCreateTensorDescriptor(&plan->y));
  LOCKSTEP_CHECK_CUDNN(cudnnSetTensor4dDescriptor(plan->y, format, type, i(s.batch),
                                                  i(s.out_channels), i(s.out_h()), i(s.out_w())));
  LOCKSTEP_CHECK_CUDNN(cudnnCreateFilterDescriptor(&plan->w));
  LOCKSTEP_CHECK_CUDNN(cudnnSetFilter4dDescriptor(plan->w, type, format, i(s.out_channels),
                                                  i(s.in_channels / s.groups), i(s.kernel_h),
                                                  i(s.kernel_w)));
  LOCKSTEP_CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&plan->conv));
  LOCKSTEP_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(
      plan->conv, i(s.pad_h), i(s.pad_w), i(s.stride_h), i(s.stride_w), i(s.dilation_h),
      i(s.dilation_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  LOCKSTEP_CHECK_CUDNN(cudnnSetConvolutionGroupCount(plan->conv, i(s.groups)));
  // Set before the query so that the heuristic (or the timing) considers
  // (or, for f32, leaves out) tensor-core kernels; take_candidate() sets the final one.
  LOCKSTEP_CHECK_CUDNN(cudnnSetConvolutionMathType(
      plan->conv, key.type == DType::f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));

  int n = 0, c = 0, h = 0, w = 0;
  LOCKSTEP_CHECK_CUDNN(
      cudnnGetConvolution2dForwardOutputDim(plan->conv, plan->x, plan->w, &n, &c, &h, &w));
  if (n != s.batch || c != s.out_channels || h != s.out_h() || w != s.out_w())
    throw LibraryError("cuDNN", CUDNN_STATUS_BAD_PARAM,
                       "cuDNN's output size " + std::to_string(h) + "x" + std::to_string(w) +
                           " differs from ours for conv2d " + describe(s, key.type));

  if (key.timed) {
    TrialOperands trial(stream);
    if (trial.take(s, key.type)) {
      LOCKSTEP_CHECK_CUDA(cudaStreamSynchronize(stream));
      choose_algorithm(handle, *plan, key, &trial, nullptr);
    } else {
      choose_algorithm(handle, *plan, key, nullptr, "no memory to time");
    }
  } else {
    choose_algorithm(handle, *plan, key, nullptr, untimed);
  }
  // The filter scratch: the KRSC weight copy or weight gradient when
  // channels-last, the 16-bit weight gradient (KCRS) otherwise.
  const bool needs_filter_scratch =
      s.channels_last || (key.pass == ConvPass::backward_filter && key.type != DType::f32);
  plan->filter_scratch_bytes =
      needs_filter_scratch ? static_cast<std::size_t>(weight_count(s)) * dtype_size(key.type) : 0;
  plan->workspace_bytes = plan->filter_scratch_bytes == 0
                              ? plan->algo_workspace_bytes
                              : align_up(plan->algo_workspace_bytes) + plan->filter_scratch_bytes;
  char workspace[64];
  std::snprintf(workspace, sizeof workspace, ", workspace %.2f MiB",
                static_cast<double>(plan->workspace_bytes) / (1 << 20));
  plan->description = "cuda:" + std::to_string(key.device) + " " + pass_name(key.pass) + " " +
                      describe(s, key.type) + ": " + plan->description + workspace;
  return plan;
}

// Whether `stream` is being captured into a CUDA graph; true when CUDA cannot
// say (the legacy stream while a blocking stream captures), so as not to time.
bool capturing(CudaStream stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return capture != cudaStreamCaptureStatusNone;
}

const Plan& plan_for(const Conv2dShape& s, DType type, ConvPass pass, CudaStream stream) {
  validate_conv2d(s);
  int device = 0;
  LOCKSTEP_CHECK_CUDA(cudaGetDevice(&device));
  PlanKey key{device, s, type, pass, deterministic(), conv_autotune()};
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto found = c.plans.find(key);
  if (found != c.plans.end()) return *found->second;
  const char* untimed = key.deterministic ? "deterministic" : "timing off";
  if (key.timed && capturing(stream)) {  // the heuristic's plan, under the untimed key
    key.timed = false;
    untimed = "stream capturing";
    found = c.plans.find(key);
    if (found != c.plans.end()) return *found->second;
  }
  auto plan = make_plan(detail::cudnn_handle(stream), key, stream, untimed);
  return *c.plans.emplace(key, std::move(plan)).first->second;
}

void require_workspace(const Plan& plan, std::size_t given, ConvPass pass) {
  if (given < plan.workspace_bytes)
    throw InvalidArgument(std::string("conv2d ") + pass_name(pass) + ": workspace of " +
                          std::to_string(given) + " bytes, the plan needs " +
                          std::to_string(plan.workspace_bytes) +
                          " (ask conv2d_workspace_bytes with the same settings)");
}

template <typename T>
__global__ void accumulate_kernel(const T* src, float* dst, bool accumulate, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    dst[i] = (accumulate ? dst[i] : 0.0f) + to_f32(src[i]);
}

template <typename T>
__global__ void add_channel_bias_kernel(T* y, const float* bias, std::int64_t channels,
                                        std::int64_t channel_stride, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    y[i] = from_f32<T>(to_f32(y[i]) + bias[(i / channel_stride) % channels]);
}

// One block per channel; f64 partial sums added by a fixed tree: deterministic.
template <typename T>
__global__ void channel_bias_grad_kernel(const T* dy, std::int64_t batch, std::int64_t channels,
                                         std::int64_t spatial, float* db) {
  __shared__ double lanes[kThreads];
  const std::int64_t c = blockIdx.x;
  double acc = 0.0;
  for (std::int64_t j = threadIdx.x; j < batch * spatial; j += kThreads)
    acc += to_f32(dy[((j / spatial) * channels + c) * spatial + j % spatial]);
  lanes[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) lanes[threadIdx.x] += lanes[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[c] = static_cast<float>(db[c] + lanes[0]);
}

}  // namespace

std::size_t conv2d_workspace_bytes(const Conv2dShape& s, DType type, ConvPass pass,
                                   CudaStream stream) {
  return plan_for(s, type, pass, stream).workspace_bytes;
}

void conv2d_forward(const Conv2dShape& s, DType type, const void* x, const void* w,
                    const float* bias, void* y, void* workspace, std::size_t workspace_bytes,
                    CudaStream stream) {
  const Plan& plan = plan_for(s, type, ConvPass::forward, stream);
  require_workspace(plan, workspace_bytes, ConvPass::forward);
  const float one = 1.0f, zero = 0.0f;
  const void* filter = filter_for(plan, s, type, w, workspace, stream);
  LOCKSTEP_CHECK_CUDNN(cudnnConvolutionForward(
      detail::cudnn_handle(stream), &one, plan.x, x, plan.w, filter, plan.conv, plan.forward_algo,
      workspace, plan.algo_workspace_bytes, &zero, plan.y, y));
  if (!bias) return;
  const std::int64_t spatial = s.out_h() * s.out_w(), n = s.batch * s.out_channels * spatial;
  // The channel of element i: (i / spatial) % C in NCHW, i % C in NHWC.
  const std::int64_t channel_stride = s.channels_last ? 1 : spatial;
  detail::dispatch_float(type, "conv2d_forward", [&](auto tag) {
    using T = decltype(tag);
    add_channel_bias_kernel<T><<<detail::grid_for(n), kThreads, 0, stream>>>(
        static_cast<T*>(y), bias, s.out_channels, channel_stride, n);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void conv2d_backward_data(const Conv2dShape& s, DType type, const void* dy, const void* w, void* dx,
                          void* workspace, std::size_t workspace_bytes, CudaStream stream) {
  const Plan& plan = plan_for(s, type, ConvPass::backward_data, stream);
  require_workspace(plan, workspace_bytes, ConvPass::backward_data);
  const float one = 1.0f, zero = 0.0f;
  const void* filter = filter_for(plan, s, type, w, workspace, stream);
  LOCKSTEP_CHECK_CUDNN(cudnnConvolutionBackwardData(
      detail::cudnn_handle(stream), &one, plan.w, filter, plan.y, dy, plan.conv, plan.data_algo,
      workspace, plan.algo_workspace_bytes, &zero, plan.x, dx));
}

void conv2d_backward_filter(const Conv2dShape& s, DType type, const void* x, const void* dy,
                            float* dw, bool accumulate, void* workspace,
                            std::size_t workspace_bytes, CudaStream stream) {
  const Plan& plan = plan_for(s, type, ConvPass::backward_filter, stream);
  require_workspace(plan, workspace_bytes, ConvPass::backward_filter);
  cudnnHandle_t handle = detail::cudnn_handle(stream);
  const float one = 1.0f, zero = 0.0f;
  if (s.channels_last) {  // Note [channels-last convolution]: KRSC scratch, transposed-added
    void* scratch = filter_scratch(plan, workspace);
    LOCKSTEP_CHECK_CUDNN(cudnnConvolutionBackwardFilter(
        handle, &one, plan.x, x, plan.y, dy, plan.conv, plan.filter_algo, workspace,
        plan.algo_workspace_bytes, &zero, plan.w, scratch));
    batched_transpose_add_f32(type, s.out_channels, s.kernel_h * s.kernel_w,
                              s.in_channels / s.groups, scratch, dw, accumulate, stream);
    return;
  }
  if (type == DType::f32) {  // beta = 1: accumulate straight into the f32 gradient; 0: write it
    LOCKSTEP_CHECK_CUDNN(cudnnConvolutionBackwardFilter(
        handle, &one, plan.x, x, plan.y, dy, plan.conv, plan.filter_algo, workspace,
        plan.algo_workspace_bytes, accumulate ? &one : &zero, plan.w, dw));
    return;
  }
  // Note [16-bit weight gradient]: into scratch past the algorithm's
  // workspace, then cast-added into the f32 gradient.
  void* scratch = filter_scratch(plan, workspace);
  LOCKSTEP_CHECK_CUDNN(cudnnConvolutionBackwardFilter(
      handle, &one, plan.x, x, plan.y, dy, plan.conv, plan.filter_algo, workspace,
      plan.algo_workspace_bytes, &zero, plan.w, scratch));
  const std::int64_t n = weight_count(s);
  detail::dispatch_float(type, "conv2d_backward_filter", [&](auto tag) {
    using T = decltype(tag);
    accumulate_kernel<T><<<detail::grid_for(n), kThreads, 0, stream>>>(
        static_cast<const T*>(scratch), dw, accumulate, n);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void channel_bias_grad(const void* dy, DType type, std::int64_t batch, std::int64_t channels,
                       std::int64_t spatial, float* db, CudaStream stream) {
  detail::dispatch_float(type, "channel_bias_grad", [&](auto tag) {
    using T = decltype(tag);
    if (channels == 0) return;
    channel_bias_grad_kernel<T><<<static_cast<unsigned>(channels), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), batch, channels, spatial, db);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

std::size_t channel_bias_grad_nhwc_workspace_bytes(std::int64_t batch, std::int64_t spatial,
                                                   std::int64_t channels) {
  return bias_grad_workspace_bytes(batch * spatial, channels);
}

void channel_bias_grad_nhwc(const void* dy, DType type, std::int64_t batch, std::int64_t spatial,
                            std::int64_t channels, float* db, void* workspace, CudaStream stream) {
  bias_grad(dy, type, batch * spatial, channels, db, workspace, stream);
}

std::vector<std::string> conv2d_plan_descriptions() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  std::vector<std::string> lines;
  for (const auto& [key, plan] : c.plans) lines.push_back(plan->description);
  return lines;
}

}  // namespace lockstep::kernels::cuda
