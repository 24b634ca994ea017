// CUDA softmax cross-entropy and accuracy (kernels/classification.h). One
// block per row computes the row's softmax and loss, or its argmax, into the
// workspace; one block then adds the rows in order (f64): deterministic, no
// host sync. The backward gives a block each row, so no element needs a
// division to find its row. softmax_xent_fused does all three in one row
// kernel over 16-bit logits in place (Note [fused cross-entropy]).
#include <cstdint>

#include "kernels/classification.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"

namespace lockstep::kernels::cuda {
namespace {

using detail::from_f32;
using detail::kThreads;
using detail::to_f32;

__device__ std::int64_t label_at(const ClassificationShape& s, const void* labels, std::int64_t i) {
  return s.label_type == DType::i32 ? static_cast<const std::int32_t*>(labels)[i]
                                    : static_cast<const std::int64_t*>(labels)[i];
}

// The row's label when it counts (see the header on out-of-range labels), else -1.
__device__ std::int64_t counted_label(const ClassificationShape& s, const void* labels,
                                      std::int64_t i) {
  const std::int64_t label = label_at(s, labels, i);
  return (label == s.ignore_index || label < 0 || label >= s.classes) ? -1 : label;
}

// row_loss[i], row_counted[i] for one row per block.
// Note [one-pass row statistics]: the softmax's exponentials are f32 and its
// row sums f64, as the CPU twin's (kernels/detail/vector_softmax.h). Each
// thread reads its columns once for both statistics: a running max and the
// f64 sum of expf(x - running max), rescaled when the max rises; the block then
// takes the largest max and rescales each thread's sum to it before adding
// them in a fixed tree. A second read writes the probabilities. The first
// version read the row three times with an f64 exp per logit twice: 5.55 ms
// at gpt2's 16K x 50304 on the H200 (docs/gpu-results.md), three times the
// GEMM that makes the logits.
__global__ void xent_rows(ClassificationShape s, const float* logits, const void* labels,
                          float* probs, float* row_loss, float* row_counted) {
  __shared__ double lanes[kThreads];
  const std::int64_t i = blockIdx.x;
  const float* row = logits + i * s.classes;
  float m = -INFINITY;
  double e = 0.0, total = 0.0;  // total: the row's sum of logits, for label smoothing
  for (std::int64_t j = threadIdx.x; j < s.classes; j += kThreads) {
    const float x = row[j];
    if (x > m) {
      e = e * static_cast<double>(expf(m - x)) + 1.0;
      m = x;
    } else if (x != -INFINITY) {  // -inf adds nothing (and -inf - -inf would be NaN)
      e += static_cast<double>(expf(x - m));
    }
    total += static_cast<double>(x);
  }
  const float max = static_cast<float>(detail::block_max(static_cast<double>(m), lanes));
  if (e != 0.0) e *= static_cast<double>(expf(m - max));
  const double sum = detail::block_sum(e, lanes);
  const double shifted_sum = s.label_smoothing > 0.0f ? detail::block_sum(total, lanes) -
                                                            static_cast<double>(s.classes) * max
                                                      : 0.0;
  const auto inv = static_cast<float>(1.0 / sum);
  for (std::int64_t j = threadIdx.x; j < s.classes; j += kThreads)
    probs[i * s.classes + j] = expf(row[j] - max) * inv;
  if (threadIdx.x == 0) {
    const std::int64_t label = counted_label(s, labels, i);
    row_counted[i] = label < 0 ? 0.0f : 1.0f;
    const double lse = log(sum);
    double loss = label < 0 ? 0.0 : lse - static_cast<double>(row[label] - max);
    if (label >= 0 && s.label_smoothing > 0.0f)
      loss = (1.0 - s.label_smoothing) * loss +
             s.label_smoothing * (lse - shifted_sum / static_cast<double>(s.classes));
    row_loss[i] = static_cast<float>(loss);
  }
}

// out_a = sum(a) / max(sum(b), 1) or sum(a) (divide = false); out_b = sum(b).
__global__ void finish_rows(const float* a, const float* b, std::int64_t rows, bool divide,
                            float* out_a, float* out_b) {
  __shared__ double lanes[kThreads];
  double sa = 0.0, sb = 0.0;
  for (std::int64_t i = threadIdx.x; i < rows; i += kThreads) {
    sa += a[i];
    sb += b[i];
  }
  const double ta = detail::block_sum(sa, lanes), tb = detail::block_sum(sb, lanes);
  if (threadIdx.x == 0) {
    *out_a = static_cast<float>(divide ? (tb > 0 ? ta / tb : 0.0) : ta);
    if (out_b) *out_b = static_cast<float>(tb);
  }
}

__global__ void xent_backward_kernel(ClassificationShape s, const float* probs, const void* labels,
                                     const float* count, float dloss, float* dlogits) {
  const float scale = *count > 0 ? dloss / *count : 0.0f;
  const float off = s.label_smoothing / static_cast<float>(s.classes);
  const float on = 1.0f - s.label_smoothing + off;
  for (std::int64_t i = blockIdx.x; i < s.rows; i += gridDim.x) {
    const std::int64_t label = counted_label(s, labels, i);
    const float* p = probs + i * s.classes;
    float* out = dlogits + i * s.classes;
    for (std::int64_t j = threadIdx.x; j < s.classes; j += kThreads)
      out[j] = label < 0 ? 0.0f : (p[j] - (j == label ? on : off)) * scale;
  }
}

// Note [first argmax]: the CPU keeps best = 0 and moves to j where row[j] >
// row[best], so it returns 0 when row[0] is NaN and otherwise the first index
// of the largest non-NaN value. Here each thread takes the first largest
// non-NaN value of its strided columns, and the block combines candidates by
// (larger value, then smaller index): a total order, so the tree's shape does
// not change the winner, which is the CPU's.
struct Candidate {
  float value;
  std::int64_t index;  // -1: no non-NaN value seen
};

__device__ Candidate better(Candidate a, Candidate b) {
  if (a.index < 0) return b;
  if (b.index < 0) return a;
  if (a.value != b.value) return a.value > b.value ? a : b;
  return a.index < b.index ? a : b;
}

// The block's best candidate lands in indices[0] (-1 when no thread saw a
// non-NaN value). Every thread of the block calls it; the arrays hold
// kThreads entries, and the last barrier lets the caller read indices[0].
__device__ void block_best(Candidate mine, float* values, std::int64_t* indices) {
  values[threadIdx.x] = mine.value;
  indices[threadIdx.x] = mine.index;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const Candidate c = better({values[threadIdx.x], indices[threadIdx.x]},
                                 {values[threadIdx.x + stride], indices[threadIdx.x + stride]});
      values[threadIdx.x] = c.value;
      indices[threadIdx.x] = c.index;
    }
    __syncthreads();
  }
}

__global__ void correct_rows(ClassificationShape s, const float* logits, const void* labels,
                             float* row_correct, float* row_counted) {
  __shared__ float values[kThreads];
  __shared__ std::int64_t indices[kThreads];
  for (std::int64_t i = blockIdx.x; i < s.rows; i += gridDim.x) {
    const float* row = logits + i * s.classes;
    Candidate mine{0.0f, -1};
    for (std::int64_t j = threadIdx.x; j < s.classes; j += kThreads) {
      const float v = row[j];
      if (!isnan(v) && (mine.index < 0 || v > mine.value)) mine = {v, j};
    }
    block_best(mine, values, indices);
    if (threadIdx.x == 0) {
      const std::int64_t best = isnan(row[0]) || indices[0] < 0 ? 0 : indices[0];
      const std::int64_t label = counted_label(s, labels, i);
      row_correct[i] = (label >= 0 && best == label) ? 1.0f : 0.0f;
      row_counted[i] = label >= 0 ? 1.0f : 0.0f;
    }
    __syncthreads();  // the shared arrays are reused for the next row
  }
}

// Note [fused row kernel]: one block per row, for Note [fused cross-entropy].
// Pass 1 reads the row once (Note [one-pass row statistics]: f32 exponentials
// and f64 sums, as the CPU twin's detail::softmax_row, so the two differ by the
// exponentials' few ulp and not by an f32 sum's rounding over 50,304 terms),
// keeping the running max, the f64 sum of exponentials, the f64 sum of logits
// (label smoothing) and the first largest non-NaN logit (Note [first argmax]);
// thread 0 also reads the label's logit and row[0]. The block reductions that
// follow end in __syncthreads, so every read of pass 1 is done before pass 2
// reads each element again and writes its gradient over it (the same thread,
// the same address): in place is safe. Ignored rows (and rows whose label is
// outside [0, classes)) are written with zeros and not read.
// Loads are 16 bytes (8 bf16/f16, 4 f32) from the row's first 16-byte
// boundary, with a scalar head before it and a scalar tail; stores are 16
// bytes too when dlogits has the logits' offset from a 16-byte boundary
// (`packed_store`, always so in place), else scalar. Each thread's share of a
// row depends on the row's address mod 16 only, which the device pool's
// 256-byte allocations fix for a shape: the same bits on every run.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kCount = 16 / static_cast<int>(sizeof(T));
  T v[kCount];
};

// A row's elements as [0, head) scalar, packs of Pack<T>::kCount from head,
// [tail, n) scalar.
struct RowSplit {
  std::int64_t head, packs, tail;
};

template <typename T>
__device__ RowSplit split_row(const T* row, std::int64_t n) {
  constexpr int kCount = Pack<T>::kCount;
  const auto misaligned = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(row) % 16);
  std::int64_t head =
      misaligned == 0 ? 0 : (16 - misaligned) / static_cast<std::int64_t>(sizeof(T));
  if (head > n) head = n;
  const std::int64_t packs = (n - head) / kCount;
  return {head, packs, head + packs * kCount};
}

// Calls f(j, x) for each element j of the row this thread owns, in increasing j.
template <typename T, typename F>
__device__ void for_my_elements(const T* row, const RowSplit& r, std::int64_t n, F&& f) {
  constexpr int kCount = Pack<T>::kCount;
  if (threadIdx.x < r.head) f(static_cast<std::int64_t>(threadIdx.x), to_f32(row[threadIdx.x]));
  const auto* packs = reinterpret_cast<const Pack<T>*>(row + r.head);
#pragma unroll 4  // four loads in flight per thread: the statistics wait on the data, not the loads
  for (std::int64_t p = threadIdx.x; p < r.packs; p += kThreads) {
    const Pack<T> pack = packs[p];
#pragma unroll
    for (int k = 0; k < kCount; ++k) f(r.head + p * kCount + k, to_f32(pack.v[k]));
  }
  for (std::int64_t j = r.tail + threadIdx.x; j < n; j += kThreads) f(j, to_f32(row[j]));
}

template <typename T>
__global__ void fused_xent_rows(ClassificationShape s, const T* logits, const void* labels,
                                const float* count, float dloss, bool packed_store, T* dlogits,
                                float* row_loss, float* row_counted, float* row_correct) {
  __shared__ double lanes[kThreads];
  __shared__ float values[kThreads];
  __shared__ std::int64_t indices[kThreads];
  const std::int64_t i = blockIdx.x;
  const std::int64_t n = s.classes;
  const T* row = logits + i * n;
  T* out = dlogits + i * n;
  const std::int64_t label = counted_label(s, labels, i);  // the same in every thread
  const RowSplit split = split_row(row, n);
  if (label < 0) {
    const T zero = from_f32<T>(0.0f);
    for (std::int64_t j = threadIdx.x; j < n; j += kThreads) out[j] = zero;
    if (threadIdx.x == 0) row_loss[i] = row_counted[i] = row_correct[i] = 0.0f;
    return;
  }
  // Thread 0's reads of pass 1 (before any write: the note).
  float label_logit = 0.0f, first = 0.0f;
  if (threadIdx.x == 0) {
    label_logit = to_f32(row[label]);
    first = to_f32(row[0]);
  }
  float m = -INFINITY;
  double e = 0.0, total = 0.0;
  Candidate mine{0.0f, -1};
  for_my_elements(row, split, n, [&](std::int64_t j, float x) {
    if (x > m) {
      e = e * static_cast<double>(expf(m - x)) + 1.0;
      m = x;
    } else if (x != -INFINITY) {  // -inf adds nothing (and -inf - -inf would be NaN)
      e += static_cast<double>(expf(x - m));
    }
    total += static_cast<double>(x);
    if (!isnan(x)) mine = better(mine, {x, j});
  });
  const float max = static_cast<float>(detail::block_max(static_cast<double>(m), lanes));
  if (e != 0.0) e *= static_cast<double>(expf(m - max));
  const double sum = detail::block_sum(e, lanes);
  const double shifted_sum = s.label_smoothing > 0.0f
                                 ? detail::block_sum(total, lanes) - static_cast<double>(n) * max
                                 : 0.0;
  block_best(mine, values, indices);
  if (threadIdx.x == 0) {
    const std::int64_t best = isnan(first) || indices[0] < 0 ? 0 : indices[0];
    const double lse = log(sum);
    double loss = lse - static_cast<double>(label_logit - max);
    if (s.label_smoothing > 0.0f)
      loss = (1.0 - s.label_smoothing) * loss +
             s.label_smoothing * (lse - shifted_sum / static_cast<double>(n));
    row_loss[i] = static_cast<float>(loss);
    row_counted[i] = 1.0f;
    row_correct[i] = best == label ? 1.0f : 0.0f;
  }
  // Pass 2, as softmax_xent_backward of the probabilities xent_rows writes:
  // p = expf(x - max) * inv rounded to f32 (__fmul_rn: no fused multiply-add
  // with the target), then (p - target) * scale.
  const auto inv = static_cast<float>(1.0 / sum);
  const float scale = *count > 0 ? dloss / *count : 0.0f;
  const float off = s.label_smoothing / static_cast<float>(n);
  const float on = 1.0f - s.label_smoothing + off;
  auto grad = [&](std::int64_t j, float x) {
    const float p = __fmul_rn(expf(x - max), inv);
    return from_f32<T>((p - (j == label ? on : off)) * scale);
  };
  constexpr int kCount = Pack<T>::kCount;
  if (threadIdx.x < split.head) out[threadIdx.x] = grad(threadIdx.x, to_f32(row[threadIdx.x]));
  const auto* packs = reinterpret_cast<const Pack<T>*>(row + split.head);
#pragma unroll 4
  for (std::int64_t p = threadIdx.x; p < split.packs; p += kThreads) {
    const Pack<T> in = packs[p];
    Pack<T> g;
    const std::int64_t j0 = split.head + p * kCount;
#pragma unroll
    for (int k = 0; k < kCount; ++k) g.v[k] = grad(j0 + k, to_f32(in.v[k]));
    if (packed_store) {
      reinterpret_cast<Pack<T>*>(out + split.head)[p] = g;
    } else {
#pragma unroll
      for (int k = 0; k < kCount; ++k) out[j0 + k] = g.v[k];
    }
  }
  for (std::int64_t j = split.tail + threadIdx.x; j < n; j += kThreads)
    out[j] = grad(j, to_f32(row[j]));
}

// count = the labels that count, exactly (f64 sum of ones), before any row
// needs dloss / count.
__global__ void count_labels(ClassificationShape s, const void* labels, float* count) {
  __shared__ double lanes[kThreads];
  double mine = 0.0;
  for (std::int64_t i = threadIdx.x; i < s.rows; i += kThreads)
    mine += counted_label(s, labels, i) >= 0 ? 1.0 : 0.0;
  const double total = detail::block_sum(mine, lanes);
  if (threadIdx.x == 0) *count = static_cast<float>(total);
}

// Blocks for the kernels that stride over rows a block at a time.
unsigned row_grid(std::int64_t rows) {
  constexpr std::int64_t kMaxBlocks = 65536;
  return static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
}

}  // namespace

void softmax_xent_forward(const ClassificationShape& s, const float* logits, const void* labels,
                          float* probs, float* loss, float* count, void* workspace,
                          CudaStream stream) {
  auto* row_loss = static_cast<float*>(workspace);
  float* row_counted = row_loss + s.rows;
  if (s.rows > 0)
    xent_rows<<<static_cast<unsigned>(s.rows), kThreads, 0, stream>>>(s, logits, labels, probs,
                                                                      row_loss, row_counted);
  finish_rows<<<1, kThreads, 0, stream>>>(row_loss, row_counted, s.rows, true, loss, count);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void softmax_xent_backward(const ClassificationShape& s, const float* probs, const void* labels,
                           const float* count, float dloss, float* dlogits, CudaStream stream) {
  if (s.rows * s.classes == 0) return;
  xent_backward_kernel<<<row_grid(s.rows), kThreads, 0, stream>>>(s, probs, labels, count, dloss,
                                                                  dlogits);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void count_correct(const ClassificationShape& s, const float* logits, const void* labels,
                   float* correct, void* workspace, CudaStream stream) {
  auto* row_correct = static_cast<float*>(workspace);
  float* row_counted = row_correct + s.rows;
  if (s.rows > 0)
    correct_rows<<<row_grid(s.rows), kThreads, 0, stream>>>(s, logits, labels, row_correct,
                                                            row_counted);
  finish_rows<<<1, kThreads, 0, stream>>>(row_correct, row_counted, s.rows, false, correct,
                                          nullptr);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

void softmax_xent_fused(const ClassificationShape& s, DType logits_type, const void* logits,
                        const void* labels, float dloss, void* dlogits, float* loss, float* count,
                        float* correct, void* workspace, CudaStream stream) {
  if (s.rows >= (std::int64_t{1} << 31))
    throw InvalidArgument("cross-entropy (fused): " + std::to_string(s.rows) +
                          " rows; the kernel takes one block per row, at most 2^31 - 1 (split "
                          "the batch into micro-batches)");
  auto* row_loss = static_cast<float*>(workspace);
  float* row_counted = row_loss + s.rows;
  float* row_correct = row_counted + s.rows;
  count_labels<<<1, kThreads, 0, stream>>>(s, labels, count);
  const auto offset = reinterpret_cast<std::uintptr_t>(logits) % 16;
  const bool packed_store = reinterpret_cast<std::uintptr_t>(dlogits) % 16 == offset;
  if (s.rows > 0)
    detail::dispatch_float(logits_type, "cross-entropy (fused)", [&](auto zero) {
      using T = decltype(zero);
      fused_xent_rows<T><<<static_cast<unsigned>(s.rows), kThreads, 0, stream>>>(
          s, static_cast<const T*>(logits), labels, count, dloss, packed_store,
          static_cast<T*>(dlogits), row_loss, row_counted, row_correct);
    });
  finish_rows<<<1, kThreads, 0, stream>>>(row_loss, row_counted, s.rows, true, loss, count);
  if (correct)
    finish_rows<<<1, kThreads, 0, stream>>>(row_correct, row_counted, s.rows, false, correct,
                                            nullptr);
  LOCKSTEP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace lockstep::kernels::cuda
