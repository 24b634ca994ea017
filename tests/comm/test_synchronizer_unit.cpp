// The gradient synchroniser on one rank: when buckets start (a recording
// communicator logs every collective the communication thread issues), in
// which order, what no_sync and finish do, the errors for misuse, and what a
// 16-bit wire format does to the gradients (against comm_test_support.h's
// independent roundings). The multi-rank averages are in tests/mpi.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "comm/comm_test_support.h"
#include "comm/gradient_synchronizer.h"
#include "comm/self_communicator.h"
#include "kernels/error.h"

using namespace lockstep;
using comm::GradientSynchronizer;
using comm::ReduceOp;
using core::Tensor;

namespace {

struct Call {
  std::string op;
  const void* data;
  std::int64_t count;
  DType dtype;
  std::string context;
};

// What every copy of a RecordingCommunicator (the original and its
// duplicates, used by two threads) has been asked to do.
struct CallLog {
  std::mutex mutex;
  std::vector<Call> calls;

  void add(Call call) {
    std::lock_guard lock(mutex);
    calls.push_back(std::move(call));
  }
  std::vector<Call> of(const std::string& op) {
    std::lock_guard lock(mutex);
    std::vector<Call> matching;
    for (const Call& c : calls)
      if (c.op == op) matching.push_back(c);
    return matching;
  }
  // Waits (up to 10 s) until `n` calls of `op` have been made.
  bool wait_for(const std::string& op, std::size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (of(op).size() < n)
      if (std::chrono::steady_clock::now() > deadline)
        return false;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
  }
};

// One rank; collectives are the identity, as for Self, and are logged.
class RecordingCommunicator final : public comm::Communicator {
 public:
  RecordingCommunicator(std::shared_ptr<CallLog> log, std::string label)
      : Communicator(0, 1, core::Device::cpu(), std::move(label), nullptr), log_(std::move(log)) {}
  const char* backend() const override { return "recording"; }

 private:
  void record(const char* op, const void* data, std::int64_t count, DType dtype) {
    log_->add({op, data, count, dtype, comm::OperationContext::current()});
  }
  void do_allreduce(void* data, std::int64_t count, DType dtype, ReduceOp op,
                    const core::Stream&) override {
    record(op == ReduceOp::avg ? "allreduce-avg" : "allreduce-sum", data, count, dtype);
  }
  void do_broadcast(void* data, std::int64_t count, DType dtype, int,
                    const core::Stream&) override {
    record("broadcast", data, count, dtype);
  }
  void do_allgather(const void* send, void* recv, std::int64_t count, DType dtype,
                    const core::Stream&) override {
    std::memmove(recv, send, static_cast<std::size_t>(count) * dtype_size(dtype));
    record("allgather", send, count, dtype);
  }
  void do_reduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype, ReduceOp,
                         const core::Stream&) override {
    std::memmove(recv, send, static_cast<std::size_t>(count) * dtype_size(dtype));
    record("reduce_scatter", send, count, dtype);
  }
  void do_alltoall(const void* send, void* recv, std::int64_t count, DType dtype,
                   const core::Stream&) override {
    std::memcpy(recv, send, static_cast<std::size_t>(count) * dtype_size(dtype));
    record("alltoall", send, count, dtype);
  }
  void do_barrier() override { record("barrier", nullptr, 0, DType::u8); }
  std::unique_ptr<Communicator> do_duplicate(std::string label) override {
    return std::make_unique<RecordingCommunicator>(log_, std::move(label));
  }

  std::shared_ptr<CallLog> log_;
};

// comm_test_support.h's six parameters in ready order; with caps of 1024 then
// 4096 floats the buckets are {0}, {1, 2}, {3}, {4, 5} (worked out in
// test_buckets.cpp).
comm::SynchronizedModel six_parameter_model() {
  std::int64_t total = 0;
  comm::SynchronizedModel model;
  model.segments = test::six_segments(total);
  model.parameters = Tensor::zeros({total}, DType::f32);
  model.gradients = Tensor::zeros({total}, DType::f32);
  return model;
}

comm::SynchronizerOptions small_caps(DType wire = DType::f32) {
  comm::SynchronizerOptions options;
  options.first_bucket_cap_bytes = 4096;
  options.bucket_cap_bytes = 16384;
  options.wire_dtype = wire;
  return options;
}

const float* at(const Tensor& t, std::int64_t offset) { return t.data_as<float>() + offset; }

}  // namespace

TEST_CASE("a bucket is reduced once its last segment is ready, buckets in order",
          "[comm][synchronizer]") {
  auto log = std::make_shared<CallLog>();
  RecordingCommunicator comm(log, "world");
  comm::SynchronizedModel model = six_parameter_model();
  const Tensor grads = model.gradients;
  GradientSynchronizer sync(comm, std::move(model), small_caps());
  REQUIRE(sync.buckets().size() == 4);
  sync.begin_step(1);

  // Bucket 1 is complete first, but bucket 0 must start before it (Note
  // [bucket order]).
  sync.mark_ready(2);
  sync.mark_ready(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(log->of("allreduce-avg").empty());
  sync.mark_ready(0);
  REQUIRE(log->wait_for("allreduce-avg", 2));
  auto calls = log->of("allreduce-avg");
  CHECK(calls[0].data == at(grads, 0));
  CHECK(calls[0].count == 1000);
  CHECK(calls[0].context == "gradient bucket 1 of 4: head.weight .. head.weight, 4.0 kB");
  CHECK(calls[1].data == at(grads, 1024));
  CHECK(calls[1].count == 364);
  CHECK(calls[1].context == "gradient bucket 2 of 4: head.bias .. mid.weight, 1.5 kB");

  sync.mark_ready(5);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(log->of("allreduce-avg").size() == 2);
  sync.mark_ready(3);
  REQUIRE(log->wait_for("allreduce-avg", 3));
  CHECK(log->of("allreduce-avg")[2].data == at(grads, 1408));
  sync.mark_ready(4);
  sync.finish();
  calls = log->of("allreduce-avg");
  REQUIRE(calls.size() == 4);
  CHECK(calls[3].data == at(grads, 6464));
  CHECK(calls[3].count == 2064);
  CHECK(calls[3].dtype == DType::f32);
}

TEST_CASE("no_sync backward passes communicate nothing", "[comm][synchronizer]") {
  auto log = std::make_shared<CallLog>();
  RecordingCommunicator comm(log, "world");
  GradientSynchronizer sync(comm, six_parameter_model(), small_caps());
  for (int step = 0; step < 2; ++step) {
    sync.begin_step(step);
    for (int micro = 0; micro < 3; ++micro) {
      std::optional<GradientSynchronizer::NoSync> guard;
      if (micro < 2) guard.emplace(sync.no_sync());
      for (std::size_t s = 0; s < 6; ++s) sync.mark_ready(s);
      if (micro < 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        CHECK(log->of("allreduce-avg").size() == 4u * step);
      }
    }
    sync.finish();
    CHECK(log->of("allreduce-avg").size() == 4u * (step + 1));
  }
}

TEST_CASE("finish names the first parameter never reported, after reducing every bucket",
          "[comm][synchronizer]") {
  auto log = std::make_shared<CallLog>();
  RecordingCommunicator comm(log, "world");
  GradientSynchronizer sync(comm, six_parameter_model(), small_caps());
  sync.begin_step(4);
  for (std::size_t s : {0, 1, 2, 4}) sync.mark_ready(s);
  CHECK_THROWS_WITH(sync.finish(),
                    Catch::Contains("step 4") &&
                        Catch::Contains("parameter 'body.weight' (segment 3 of 6)") &&
                        Catch::Contains("'stem.weight'") &&
                        Catch::Contains("must then call report_ready(ctx) on that module"));
  CHECK(log->of("allreduce-avg").size() == 4);  // every bucket, as on the other ranks
  sync.begin_step(5);                           // the synchroniser is usable again
  for (std::size_t s = 0; s < 6; ++s) sync.mark_ready(s);
  sync.finish();
  CHECK(log->of("allreduce-avg").size() == 8);
}

TEST_CASE("misuse of the step protocol is an error that says what to do", "[comm][synchronizer]") {
  comm::SelfCommunicator comm;
  GradientSynchronizer sync(comm, six_parameter_model(), small_caps());
  CHECK_THROWS_WITH(sync.mark_ready(0), Catch::Contains("outside a step"));
  CHECK_THROWS_WITH(sync.finish(), Catch::Contains("begin_step"));
  sync.begin_step(0);
  CHECK_THROWS_WITH(sync.begin_step(1), Catch::Contains("step 0 is open"));
  CHECK_THROWS_WITH(sync.mark_ready(6), Catch::Contains("6 gradient segments"));
  sync.mark_ready(3);
  CHECK_THROWS_WITH(sync.mark_ready(3),
                    Catch::Contains("'body.weight'") && Catch::Contains("twice"));
  {
    auto guard = sync.no_sync();
    CHECK_NOTHROW(sync.mark_ready(3));  // accumulation passes only check the index
    CHECK_THROWS_WITH(sync.mark_ready(7), Catch::Contains("6 gradient segments"));
    CHECK_THROWS_WITH(sync.finish(), Catch::Contains("inside no_sync"));
  }
  for (std::size_t s : {0, 1, 2, 4, 5}) sync.mark_ready(s);
  CHECK_NOTHROW(sync.finish());
}

TEST_CASE("buffers and parameters are broadcast from rank 0, buffers packed per dtype",
          "[comm][synchronizer]") {
  auto log = std::make_shared<CallLog>();
  RecordingCommunicator comm(log, "world");
  comm::SynchronizedModel model = six_parameter_model();
  const Tensor params = model.parameters;
  const Tensor count = Tensor::from_vector<std::int64_t>({42}, {1}, DType::i64);
  const Tensor mean = Tensor::from_vector<float>({1, 2, 3, 4}, {4}, DType::f32);
  const Tensor var = Tensor::from_vector<float>({5, 6, 7, 8}, {4}, DType::f32);
  model.buffers = {{"bn.mean", mean}, {"bn.var", var}, {"bn.count", count}};
  GradientSynchronizer sync(comm, std::move(model), small_caps());
  // The model check comes first: one allgather of every rank's digest
  // (Note [agreement]); ranks that agree broadcast nothing for it.
  CHECK(log->of("allgather").size() == 1);
  auto broadcasts = log->of("broadcast");
  REQUIRE(broadcasts.size() == 3);  // the parameters, the f32 pack, bn.count
  CHECK(broadcasts[0].data == params.data());
  CHECK(broadcasts[0].count == params.numel());
  CHECK(broadcasts[1].count == 8);
  CHECK(broadcasts[1].dtype == DType::f32);
  CHECK(broadcasts[2].data == count.data());
  CHECK(broadcasts[2].dtype == DType::i64);
  sync.begin_step(0);
  CHECK(log->of("broadcast").size() == 5);
  CHECK(mean.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  CHECK(var.to_vector<float>() == std::vector<float>{5, 6, 7, 8});
  CHECK(log->of("allgather").size() == 1);
}

TEST_CASE("with one rank, a 16-bit wire format rounds each gradient once", "[comm][synchronizer]") {
  comm::SelfCommunicator comm;
  for (DType wire : {DType::f32, DType::bf16, DType::f16}) {
    comm::SynchronizedModel model = six_parameter_model();
    Tensor grads = model.gradients;
    const auto segments = model.segments;
    GradientSynchronizer sync(comm, std::move(model), small_caps(wire));
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-20, 10);
    float* g = grads.data_as<float>();
    std::vector<float> before(static_cast<std::size_t>(grads.numel()));
    for (std::size_t i = 0; i < before.size(); ++i)
      before[i] = g[i] = std::ldexp(mantissa(rng), exponent(rng));
    sync.begin_step(0);
    for (std::size_t s = 0; s < segments.size(); ++s) sync.mark_ready(s);
    sync.finish();
    std::size_t wrong = 0;
    for (const auto& s : segments)
      for (std::int64_t i = s.offset; i < s.offset + s.numel; ++i) {
        const double x = before[static_cast<std::size_t>(i)];
        const double want = wire == DType::bf16  ? test::round_bf16(x)
                            : wire == DType::f16 ? test::round_f16(x)
                                                 : x;
        if (static_cast<double>(g[i]) != want) ++wrong;
      }
    INFO("wire " << dtype_name(wire));
    CHECK(wrong == 0);
  }
}

TEST_CASE("the synchroniser rejects models it cannot synchronise", "[comm][synchronizer]") {
  comm::SelfCommunicator comm;
  auto model = six_parameter_model();
  model.gradients = Tensor::zeros({model.parameters.numel() + 1}, DType::f32);
  CHECK_THROWS_WITH(GradientSynchronizer(comm, model), Catch::Contains("same size"));
  model = six_parameter_model();
  model.gradients = Tensor::zeros({model.parameters.numel()}, DType::f16);
  CHECK_THROWS_AS(GradientSynchronizer(comm, model), InvalidArgument);
  model = six_parameter_model();
  model.parameters = Tensor();
  CHECK_THROWS_WITH(GradientSynchronizer(comm, model), Catch::Contains("must both be given"));
  model = six_parameter_model();
  CHECK_THROWS_WITH(GradientSynchronizer(comm, model, small_caps(DType::i32)),
                    Catch::Contains("wire_dtype i32"));
  model.segments.back().offset = model.parameters.numel();
  CHECK_THROWS_WITH(GradientSynchronizer(comm, model), Catch::Contains("'stem.weight'"));
  model = six_parameter_model();
  model.buffers = {{"bn.mean", Tensor()}};
  CHECK_THROWS_WITH(GradientSynchronizer(comm, model), Catch::Contains("buffer 'bn.mean'"));
}
