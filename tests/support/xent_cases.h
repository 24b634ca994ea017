// Inputs for the fused cross-entropy's tests (Note [fused cross-entropy] in
// kernels/classification.h), shared by the CPU test of its twin and the [gpu]
// test of the CUDA kernel, and PyTorch's cross_entropy formula in float64
// (label_smoothing, ignore_index, reduction 'mean') with the first-argmax
// accuracy, the reference the twin is held to.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/half.h"

namespace lockstep::test {

// Logits [rows, classes] stored as `type` (values: the stored ones, widened)
// and labels, i64 and as `label_type`'s bytes. Logits are uniform in [-8, 8)
// from a hash of the index (fast at gpt2's 412M elements), so 16-bit ties
// are common. Rows cycle through five kinds: ignored (ignore_index); labelled
// with the row's first largest logit (a hit); labelled with the second of two
// equal largest logits (a miss the first-argmax rule must see); labelled with
// a largest logit placed at the last class (a hit in the scalar tail); a
// pseudo-random label.
struct XentCase {
  std::vector<std::uint16_t> bits;  // f16 or bf16 storage
  std::vector<float> values;
  std::vector<std::int64_t> labels;
  std::vector<std::uint8_t> label_bytes;
};

inline std::uint64_t mix64(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline XentCase make_xent_case(std::int64_t rows, std::int64_t classes, DType type,
                               DType label_type, std::int64_t ignore_index, std::uint64_t seed) {
  XentCase c;
  const std::int64_t n = rows * classes;
  c.bits.resize(static_cast<std::size_t>(n));
  c.values.resize(static_cast<std::size_t>(n));
  auto store = [&](std::int64_t k, float v) {
    const std::uint16_t b =
        type == DType::f16 ? kernels::f32_to_f16_bits(v) : kernels::f32_to_bf16_bits(v);
    c.bits[k] = b;
    c.values[k] = type == DType::f16 ? kernels::f16_bits_to_f32(b) : kernels::bf16_bits_to_f32(b);
  };
  for (std::int64_t k = 0; k < n; ++k)
    store(k,
          static_cast<float>(mix64(seed * 0x100000001b3ull + static_cast<std::uint64_t>(k)) >> 40) /
                  static_cast<float>(1 << 24) * 16.0f -
              8.0f);
  c.labels.resize(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t base = i * classes;
    const std::int64_t a = static_cast<std::int64_t>(mix64(seed + 7 * i) % classes);
    const std::int64_t b = static_cast<std::int64_t>(mix64(seed + 7 * i + 1) % classes);
    switch (i % 5) {
      case 0:
        c.labels[i] = ignore_index;
        break;
      case 1: {
        std::int64_t best = 0;
        for (std::int64_t j = 1; j < classes; ++j)
          if (c.values[base + j] > c.values[base + best]) best = j;
        c.labels[i] = best;
        break;
      }
      case 2:
        store(base + std::min(a, b), 9.0f);
        store(base + std::max(a, b), 9.0f);
        c.labels[i] = std::max(a, b);  // a miss unless a == b
        break;
      case 3:
        store(base + classes - 1, 10.0f);
        c.labels[i] = classes - 1;
        break;
      default:
        c.labels[i] = a;
        break;
    }
  }
  if (label_type == DType::i32) {
    std::vector<std::int32_t> narrow(c.labels.begin(), c.labels.end());
    c.label_bytes.assign(reinterpret_cast<const std::uint8_t*>(narrow.data()),
                         reinterpret_cast<const std::uint8_t*>(narrow.data() + narrow.size()));
  } else {
    c.label_bytes.assign(reinterpret_cast<const std::uint8_t*>(c.labels.data()),
                         reinterpret_cast<const std::uint8_t*>(c.labels.data() + c.labels.size()));
  }
  return c;
}

// The target of element k of logits [labels.size(), classes]: (1 - e) onehot
// + e / classes on a counted row, 0 on an ignored one. A gradient element is
// (p - target) scale, so |g| / scale + target bounds its probability p: the
// f32 error of a gradient element is relative to p, not to g.
inline double xent_target(const std::vector<std::int64_t>& labels, std::int64_t classes,
                          std::int64_t ignore_index, double e, std::size_t k) {
  const std::int64_t y = labels[k / static_cast<std::size_t>(classes)];
  if (y == ignore_index) return 0.0;
  return (static_cast<std::int64_t>(k % static_cast<std::size_t>(classes)) == y ? 1 - e : 0.0) +
         e / static_cast<double>(classes);
}

// PyTorch's F.cross_entropy(x, y, ignore_index, label_smoothing=e) in float64:
// per counted row, (1 - e) (lse - x_y) + e mean_c (lse - x_c); the mean over
// counted rows; its gradient times dloss, (softmax - (1 - e) onehot - e / C)
// dloss / counted; and the counted rows whose first largest logit is y.
struct XentReference {
  double loss = 0, count = 0, correct = 0;
  std::vector<double> grad;
};

inline XentReference xent_reference(const std::vector<float>& x,
                                    const std::vector<std::int64_t>& labels, std::int64_t classes,
                                    std::int64_t ignore_index, double e, double dloss) {
  const auto rows = static_cast<std::int64_t>(labels.size());
  XentReference r;
  r.grad.assign(x.size(), 0.0);
  for (std::int64_t i = 0; i < rows; ++i) r.count += labels[i] != ignore_index;
  double total = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t y = labels[i];
    if (y == ignore_index) continue;
    const float* row = x.data() + i * classes;
    double max = row[0], sum = 0, mean_neg_log_p = 0;
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < classes; ++j) {
      max = std::max(max, double{row[j]});
      if (row[j] > row[best]) best = j;
    }
    for (std::int64_t j = 0; j < classes; ++j) sum += std::exp(row[j] - max);
    const double lse = std::log(sum) + max;
    for (std::int64_t j = 0; j < classes; ++j) mean_neg_log_p += (lse - row[j]) / classes;
    total += (1 - e) * (lse - row[y]) + e * mean_neg_log_p;
    r.correct += best == y;
    for (std::int64_t j = 0; j < classes; ++j) {
      const double p = std::exp(row[j] - lse);
      r.grad[i * classes + j] = (p - (j == y ? 1 - e : 0.0) - e / classes) * dloss / r.count;
    }
  }
  r.loss = total / r.count;
  return r;
}

}  // namespace lockstep::test
