// The gradient synchroniser across ranks. Each rank writes synthetic
// gradients, a known function of (rank, segment, index), segment by segment
// with mark_ready, so every rank can compute the mean over all ranks in f64
// itself. Also: parameters and buffers from rank 0, no_sync accumulation,
// a least-squares gradient over N ranks against the one-rank gradient of the
// whole batch, a model that differs on one rank, and a missing report.
#include <fmt/core.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "comm/comm_test_support.h"
#include "comm/gradient_synchronizer.h"
#include "mpi/mpi_world.h"

using namespace lockstep;
using comm::GradientSynchronizer;
using core::Tensor;

namespace {

// Ready order of a small MLP with an embedding: odd sizes on purpose.
const std::vector<std::pair<std::string, core::Shape>> kParameters = {
    {"fc3.bias", {5}},          {"fc3.weight", {5, 64}}, {"fc2.bias", {64}},
    {"fc2.weight", {64, 128}},  {"fc1.bias", {128}},     {"fc1.weight", {128, 37}},
    {"embed.weight", {301, 17}}};

comm::SynchronizedModel make_model(
    const std::vector<std::pair<std::string, core::Shape>>& parameters = kParameters) {
  std::int64_t total = 0;
  comm::SynchronizedModel model;
  model.segments = test::aligned_segments(parameters, total);
  model.parameters = Tensor::zeros({total}, DType::f32);
  model.gradients = Tensor::zeros({total}, DType::f32);
  return model;
}

// Rank r's gradient for segment s (micro-batch m), uniform in [-1, 1].
std::vector<float> gradient(int rank, std::size_t segment, std::int64_t numel, int micro = 0) {
  std::mt19937 rng(static_cast<unsigned>(rank * 1000 + segment * 10 + micro));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> g(static_cast<std::size_t>(numel));
  for (float& x : g) x = dist(rng);
  return g;
}

// Writes this rank's gradients in `order`, reporting each segment after it.
void backward(GradientSynchronizer& sync, Tensor& grads, const std::vector<std::size_t>& order,
              int rank, int micro = 0, bool accumulate = false) {
  float* g = grads.data_as<float>();
  for (std::size_t s : order) {
    const auto& seg = sync.segments()[s];
    const std::vector<float> values = gradient(rank, s, seg.numel, micro);
    for (std::int64_t i = 0; i < seg.numel; ++i)
      g[seg.offset + i] =
          (accumulate ? g[seg.offset + i] : 0.0f) + values[static_cast<std::size_t>(i)];
    sync.mark_ready(s);
  }
}

std::vector<std::size_t> ready_order(std::size_t count, int kind, int rank) {
  std::vector<std::size_t> order(count);
  for (std::size_t i = 0; i < count; ++i) order[i] = i;
  if (kind == 1) std::reverse(order.begin(), order.end());
  if (kind == 2)
    std::shuffle(order.begin(), order.end(), std::mt19937(17u + static_cast<unsigned>(rank)));
  return order;
}

// Unit roundoff of a wire format: the largest relative error of one rounding.
double unit_roundoff(DType wire) {
  return wire == DType::bf16  ? std::ldexp(1.0, -8)
         : wire == DType::f16 ? std::ldexp(1.0, -11)
                              : std::ldexp(1.0, -24);
}

// Counts elements whose average differs from the f64 mean of all ranks'
// (micro-batch-summed) gradients by more than the stated tolerance:
// (size + 1) roundings of the wire type on the mean of magnitudes (each rank's
// rounding to the wire type, the partial sums, the division), plus f16's
// subnormal spacing per rounding.
// With ZeRO-1 (`owned`: this rank's chunks) only the shard is checked.
std::size_t far_from_mean(const GradientSynchronizer& sync, const Tensor& grads, int size,
                          DType wire, int micro_batches,
                          const std::vector<comm::FlatRange>* owned = nullptr) {
  auto checked = [&](std::int64_t i) {
    if (!owned) return true;
    for (const comm::FlatRange& r : *owned)
      if (i >= r.offset && i < r.offset + r.numel) return true;
    return false;
  };
  const float* g = grads.data_as<float>();
  std::size_t far = 0;
  for (std::size_t s = 0; s < sync.segments().size(); ++s) {
    const auto& seg = sync.segments()[s];
    std::vector<double> sum(static_cast<std::size_t>(seg.numel)), magnitude(sum.size());
    for (int r = 0; r < size; ++r)
      for (int m = 0; m < micro_batches; ++m) {
        const auto values = gradient(r, s, seg.numel, m);
        for (std::size_t i = 0; i < sum.size(); ++i) {
          sum[i] += values[i];
          magnitude[i] += std::fabs(values[i]);
        }
      }
    for (std::size_t i = 0; i < sum.size(); ++i) {
      const double tol = (size + 1) * (unit_roundoff(wire) * magnitude[i] / size +
                                       micro_batches * std::ldexp(1.0, -24));
      const std::int64_t at = seg.offset + static_cast<std::int64_t>(i);
      if (checked(at) && std::fabs(g[at] - sum[i] / size) > tol) ++far;
    }
  }
  return far;
}

// Whether every rank holds the same bits in `t`.
bool same_on_every_rank(comm::Communicator& comm, const Tensor& t) {
  Tensor all = Tensor::empty({t.numel() * comm.size()}, t.dtype());
  comm.allgather(t, all);
  for (int r = 1; r < comm.size(); ++r)
    if (std::memcmp(all.data(), static_cast<const char*>(all.data()) + r * t.nbytes(), t.nbytes()))
      return false;
  return true;
}

}  // namespace

TEST_CASE(
    "gradients are averaged over ranks for every bucket cap, wire format, ready order and "
    "host overlap",
    "[mpi][synchronizer]") {
  comm::Communicator& comm = test::mpi_world().host();
  struct Caps {
    std::size_t first, rest;
  };
  // One parameter per bucket; a few buckets; one bucket for all. Overlap on
  // every rank, on none, and on even ranks only (ranks may choose apart).
  for (Caps caps : {Caps{0, 0}, Caps{4096, 16384}, Caps{1 << 30, 1 << 30}})
    for (DType wire : {DType::f32, DType::bf16, DType::f16})
      for (int order_kind : {0, 1, 2})
        for (int overlap_kind : {0, 1, 2}) {
          const bool overlap = overlap_kind == 0 || (overlap_kind == 2 && comm.rank() % 2 == 0);
          comm::SynchronizedModel model = make_model();
          Tensor grads = model.gradients;
          GradientSynchronizer sync(comm, std::move(model),
                                    {.bucket_cap_bytes = caps.rest,
                                     .first_bucket_cap_bytes = caps.first,
                                     .wire_dtype = wire,
                                     .host_overlap = overlap});
          if (caps.rest == 0) CHECK(sync.buckets().size() == kParameters.size());
          if (caps.rest == (1 << 30)) CHECK(sync.buckets().size() == 1);
          for (int step = 0; step < 2; ++step) {
            sync.begin_step(step);
            backward(sync, grads, ready_order(kParameters.size(), order_kind, comm.rank()),
                     comm.rank());
            sync.finish();
          }
          INFO("caps " << caps.first << "/" << caps.rest << ", wire " << dtype_name(wire)
                       << ", order " << order_kind << ", overlap " << overlap);
          CHECK(far_from_mean(sync, grads, comm.size(), wire, 1) == 0);
          CHECK(same_on_every_rank(comm, grads));
        }
}

TEST_CASE(
    "ZeRO-1 leaves each rank the mean of its shard, and gather brings every rank's shard back",
    "[mpi][synchronizer][zero]") {
  comm::Communicator& comm = test::mpi_world().host();
  struct Caps {
    std::size_t first, rest;
  };
  for (Caps caps : {Caps{0, 0}, Caps{4096, 16384}, Caps{1 << 30, 1 << 30}})
    for (DType wire : {DType::f32, DType::bf16})
      for (int order_kind : {0, 2})
        for (bool overlap : {true, false}) {
          comm::SynchronizedModel model = make_model();
          Tensor grads = model.gradients, params = model.parameters;
          GradientSynchronizer sync(comm, std::move(model),
                                    {.bucket_cap_bytes = caps.rest,
                                     .first_bucket_cap_bytes = caps.first,
                                     .wire_dtype = wire,
                                     .host_overlap = overlap,
                                     .zero_stage = 1});
          const std::vector<comm::FlatRange> owned = sync.shard_layout().owned();
          INFO("caps " << caps.first << "/" << caps.rest << ", wire " << dtype_name(wire)
                       << ", order " << order_kind << ", overlap " << overlap);
          for (int step = 0; step < 2; ++step) {
            sync.begin_step(step);
            backward(sync, grads, ready_order(kParameters.size(), order_kind, comm.rank()),
                     comm.rank());
            sync.finish();
            CHECK(far_from_mean(sync, grads, comm.size(), wire, 1, &owned) == 0);
            // Each rank writes its shard of the parameters (and junk elsewhere):
            // afterwards every rank holds every shard.
            float* p = params.data_as<float>();
            for (std::int64_t i = 0; i < params.numel(); ++i) p[i] = -1.0f - comm.rank();
            for (const comm::FlatRange& r : owned)
              for (std::int64_t i = r.offset; i < r.offset + r.numel; ++i)
                p[i] = 0.5f * static_cast<float>(i) + static_cast<float>(step);
            sync.gather(params);
            std::int64_t wrong = 0;
            for (std::int64_t i = 0; i < params.numel(); ++i)
              wrong += p[i] != 0.5f * static_cast<float>(i) + static_cast<float>(step);
            CHECK(wrong == 0);
          }
        }
}

TEST_CASE("no_sync micro-batches accumulate locally; the last one averages the sums",
          "[mpi][synchronizer]") {
  comm::Communicator& comm = test::mpi_world().host();
  comm::SynchronizedModel model = make_model();
  Tensor grads = model.gradients;
  GradientSynchronizer sync(comm, std::move(model),
                            {.bucket_cap_bytes = 16384, .first_bucket_cap_bytes = 4096});
  const auto order = ready_order(kParameters.size(), 0, comm.rank());
  sync.begin_step(0);
  grads.fill_(0.0);
  for (int micro = 0; micro < 3; ++micro) {
    std::optional<GradientSynchronizer::NoSync> guard;
    if (micro < 2) guard.emplace(sync.no_sync());
    backward(sync, grads, order, comm.rank(), micro, /*accumulate=*/true);
    if (micro == 0) {
      // Nothing was communicated: the buffer holds this rank's own gradients.
      const auto& seg = sync.segments()[3];
      const auto mine = gradient(comm.rank(), 3, seg.numel, 0);
      CHECK(std::memcmp(grads.data_as<float>() + seg.offset, mine.data(),
                        mine.size() * sizeof(float)) == 0);
    }
  }
  sync.finish();
  CHECK(far_from_mean(sync, grads, comm.size(), DType::f32, 3) == 0);
}

TEST_CASE("parameters come from rank 0 at construction, buffers at every step",
          "[mpi][synchronizer]") {
  comm::Communicator& comm = test::mpi_world().host();
  comm::SynchronizedModel model = make_model();
  auto rank_values = [](int rank, std::int64_t n, float scale) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = scale * (rank + 1) + i;
    return v;
  };
  const std::int64_t total = model.parameters.numel();
  std::memcpy(model.parameters.data(), rank_values(comm.rank(), total, 1).data(), total * 4);
  Tensor mean = Tensor::from_vector(rank_values(comm.rank(), 3, 10), {3}, DType::f32);
  Tensor var = Tensor::from_vector(rank_values(comm.rank(), 5, 100), {5}, DType::f32);
  Tensor count = Tensor::from_vector<std::int64_t>({comm.rank() + 7}, {1}, DType::i64);
  model.buffers = {{"bn.running_mean", mean}, {"bn.num_batches", count}, {"bn.running_var", var}};
  const Tensor params = model.parameters;
  GradientSynchronizer sync(comm, std::move(model));
  CHECK(params.to_vector<float>() == rank_values(0, total, 1));
  CHECK(mean.to_vector<float>() == rank_values(0, 3, 10));
  for (int step = 0; step < 2; ++step) {
    // Each rank's forward pass changes its statistics; the step starts from rank 0's.
    mean.copy_from(Tensor::from_vector(rank_values(comm.rank(), 3, 20.0f + step), {3}, DType::f32));
    var.copy_from(Tensor::from_vector(rank_values(comm.rank(), 5, 30.0f + step), {5}, DType::f32));
    count.fill_(static_cast<double>(comm.rank() * 5 + step));
    sync.begin_step(step);
    CHECK(mean.to_vector<float>() == rank_values(0, 3, 20.0f + step));
    CHECK(var.to_vector<float>() == rank_values(0, 5, 30.0f + step));
    CHECK(count.to_vector<std::int64_t>() == std::vector<std::int64_t>{step});
    for (std::size_t s = 0; s < kParameters.size(); ++s) sync.mark_ready(s);
    sync.finish();
  }
}

TEST_CASE("N ranks of batch B average to the one-rank gradient of the whole batch",
          "[mpi][synchronizer]") {
  // Linear least squares, L = 1/(2 M) sum_j ||W x_j + b - t_j||^2 over a batch
  // of M samples: dW = (1/M) sum_j e_j x_j^T, db = (1/M) sum_j e_j with
  // e_j = W x_j + b - t_j. Each rank computes it in f32 on its B samples of
  // the global batch (with and without two accumulation micro-batches, whose
  // losses are scaled by 1/2); the reference is the f64 gradient of all
  // size x B samples. Tolerance: f32 sums of B products, 1e-5 relative to the
  // sum of magnitudes. With average off, each rank divides its loss by the
  // world size itself, as the Trainer does on the CPU.
  comm::Communicator& comm = test::mpi_world().host();
  constexpr int kIn = 5, kOut = 2, kB = 8;
  const int size = comm.size();
  std::mt19937 rng(99);  // the same global batch and weights on every rank
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> w(kOut * kIn), b(kOut), x(size * kB * kIn), t(size * kB * kOut);
  for (auto* v : {&w, &b, &x, &t})
    for (float& e : *v) e = dist(rng);

  auto error = [&](int j, int o) {
    double e = b[o] - t[j * kOut + o];
    for (int i = 0; i < kIn; ++i) e += static_cast<double>(w[o * kIn + i]) * x[j * kIn + i];
    return e;
  };
  std::vector<double> ref_w(kOut * kIn), ref_b(kOut), mag_w(kOut * kIn), mag_b(kOut);
  const int m = size * kB;
  for (int j = 0; j < m; ++j)
    for (int o = 0; o < kOut; ++o) {
      const double e = error(j, o);
      ref_b[o] += e / m;
      mag_b[o] += std::fabs(e) / m;
      for (int i = 0; i < kIn; ++i) {
        ref_w[o * kIn + i] += e * x[j * kIn + i] / m;
        mag_w[o * kIn + i] += std::fabs(e * x[j * kIn + i]) / m;
      }
    }

  for (int micro_batches : {1, 2})
    for (bool average : {true, false}) {
      comm::SynchronizedModel model = make_model({{"fc.bias", {kOut}}, {"fc.weight", {kOut, kIn}}});
      Tensor grads = model.gradients;
      GradientSynchronizer sync(comm, std::move(model), {.average = average});
      const std::int64_t b_at = sync.segments()[0].offset, w_at = sync.segments()[1].offset;
      float* g = grads.data_as<float>();
      sync.begin_step(0);
      grads.fill_(0.0);
      const int per_micro = kB / micro_batches;
      for (int micro = 0; micro < micro_batches; ++micro) {
        std::optional<GradientSynchronizer::NoSync> guard;
        if (micro + 1 < micro_batches) guard.emplace(sync.no_sync());
        // This micro-batch's loss is its mean, scaled by 1/micro_batches.
        const float scale =
            1.0f / static_cast<float>(per_micro * micro_batches * (average ? 1 : size));
        const int first = comm.rank() * kB + micro * per_micro;
        for (int o = 0; o < kOut; ++o) {
          float db = 0, dw[kIn] = {};
          for (int j = first; j < first + per_micro; ++j) {
            float e = b[o] - t[j * kOut + o];
            for (int i = 0; i < kIn; ++i) e += w[o * kIn + i] * x[j * kIn + i];
            db += e;
            for (int i = 0; i < kIn; ++i) dw[i] += e * x[j * kIn + i];
          }
          g[b_at + o] += scale * db;
          for (int i = 0; i < kIn; ++i) g[w_at + o * kIn + i] += scale * dw[i];
        }
        sync.mark_ready(0);  // backward finishes the bias first
        sync.mark_ready(1);
      }
      sync.finish();
      std::size_t far = 0;
      for (int o = 0; o < kOut; ++o) {
        far += std::fabs(g[b_at + o] - ref_b[o]) > 1e-5 * mag_b[o] + 1e-7;
        for (int i = 0; i < kIn; ++i)
          far += std::fabs(g[w_at + o * kIn + i] - ref_w[o * kIn + i]) >
                 1e-5 * mag_w[o * kIn + i] + 1e-7;
      }
      INFO(micro_batches << " micro-batches per step, average " << average);
      CHECK(far == 0);
    }
}

TEST_CASE("a model that differs on one rank fails on every rank, naming it",
          "[mpi][synchronizer]") {
  comm::Communicator& comm = test::mpi_world().host();
  if (comm.size() == 1) return;  // one rank cannot differ from itself
  const int odd = comm.size() - 1;
  auto parameters = kParameters;
  if (comm.rank() == odd) parameters[3].second = {64, 129};
  CHECK_THROWS_WITH(
      GradientSynchronizer(comm, make_model(parameters)),
      Catch::Contains("the model differs across ranks at entry 3") &&
          Catch::Contains("rank 0 has parameter 'fc2.weight' f32 [64, 128] at offset 448") &&
          Catch::Contains(fmt::format("rank {} has parameter 'fc2.weight' f32 [64, 129]", odd)));

  // An extra buffer on one rank: named too, where rank 0's list ends.
  comm::SynchronizedModel model = make_model();
  if (comm.rank() == odd) model.buffers = {{"bn.extra", Tensor::zeros({2}, DType::f32)}};
  CHECK_THROWS_WITH(GradientSynchronizer(comm, std::move(model)),
                    Catch::Contains(fmt::format("rank {} has buffer 'bn.extra' f32 [2]", odd)) &&
                        Catch::Contains("rank 0 has flat buffers of"));
}

TEST_CASE("a parameter no rank reported fails finish on every rank without a hang",
          "[mpi][synchronizer]") {
  comm::Communicator& comm = test::mpi_world().host();
  const bool overlap = GENERATE(true, false);
  GradientSynchronizer sync(
      comm, make_model(),
      {.bucket_cap_bytes = 0, .first_bucket_cap_bytes = 0, .host_overlap = overlap});
  sync.begin_step(3);
  for (std::size_t s = 0; s < kParameters.size(); ++s)
    if (s != 2) sync.mark_ready(s);
  CHECK_THROWS_WITH(sync.finish(), Catch::Contains("parameter 'fc2.bias' (segment 2 of 7)"));
  sync.begin_step(4);  // every rank is still in step with the others
  for (std::size_t s = 0; s < kParameters.size(); ++s) sync.mark_ready(s);
  CHECK_NOTHROW(sync.finish());
}
