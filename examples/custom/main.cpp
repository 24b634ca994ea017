// A training program of your own, built against an installed lockstep
// (find_package(lockstep)): its own layer, its own model, its own loop over
// the library's parts, and the same start header, progress lines, summary
// and metrics records as lockstep-train (engine/run_report.h). Run it
// directly or under mpirun; it makes its data. Usage: custom [METRICS.jsonl]
#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <span>

#include "comm/agreement.h"
#include "comm/gradient_synchronizer.h"
#include "comm/step_agreement.h"
#include "comm/world.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/nn/loss.h"
#include "engine/optim/adamw.h"
#include "engine/parameter_store.h"
#include "engine/run_report.h"
#include "io/loader.h"
#include "io/shard_writer.h"
#include "kernels/gemm.h"

using namespace lockstep;

// A layer the library does not have: y = x * sigmoid(x) (SiLU). Implementing
// forward and backward is all it takes; containers do the rest.
class SiLU : public engine::Module {
 public:
  SiLU() : Module("SiLU") {}
  core::Tensor forward(const core::Tensor& x, engine::Context&) override {
    input_ = x.to(core::Device::cpu());
    core::Tensor y = input_.cast(DType::f32);
    for (float& v : std::span(y.data_as<float>(), y.numel())) v = v / (1.0f + std::exp(-v));
    return y.to(x.device());
  }
  core::Tensor backward(const core::Tensor& dy, engine::Context&) override {
    core::Tensor g = dy.to(core::Device::cpu()).cast(DType::f32);
    const float* x = input_.data_as<float>();
    float* d = g.data_as<float>();
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      const float s = 1.0f / (1.0f + std::exp(-x[i]));
      d[i] *= s * (1.0f + x[i] * (1.0f - s));
    }
    return g.to(dy.device());
  }

 private:
  core::Tensor input_;
};

// Two noisy clusters per class in 2-D: learnable, not linearly separable.
std::filesystem::path make_data(int rank) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("custom-example-" + std::to_string(rank));
  std::filesystem::remove_all(dir);
  const std::int64_t n = 2048;
  io::DatasetWriter writer(dir, {DType::f32, {2}, DType::i64}, n, 2);
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::vector<float> x(2 * n);
  std::vector<std::int64_t> y(n);
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = i % 2;
    const float sign = (i / 2) % 2 ? 1.0f : -1.0f;  // XOR layout
    x[2 * i] = sign + noise(rng);
    x[2 * i + 1] = (y[i] ? sign : -sign) + noise(rng);
  }
  writer.append(x.data(), y.data(), n);
  writer.close();
  return dir;
}

int main(int argc, char** argv) {
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    std::fprintf(stderr, "usage: custom [METRICS.jsonl]  (JSON lines as lockstep-train writes)\n");
    return 2;
  }
  auto world = comm::init(argc, argv);
  const core::Device device = world->device();
  const std::string metrics_path = argc > 1 ? argv[1] : "";
  kernels::cpu::set_gemm_threads(1);  // one compute thread per rank, as the header says
  constexpr int kEpochs = 10;
  constexpr std::int64_t kMicroBatch = 64;

  engine::Sequential model;
  model.emplace<engine::Linear>("fc1", 2, 32);
  model.emplace<SiLU>("act");
  model.emplace<engine::Linear>("fc2", 32, 2);
  model.set_input_grad(false);
  engine::initialize(model, 1);
  engine::ParameterStore store(model, device);
  engine::AdamW optimizer(store, engine::single_group(store, 0.01, 0.0));

  comm::SynchronizedModel shared{store.values(), store.grads(), {}, {}};
  for (const auto& s : store.slots())
    shared.segments.push_back({s.parameter->name, s.offset, s.numel, s.parameter->value.shape()});
  comm::GradientSynchronizer sync(world->for_device(device), shared);

  const std::filesystem::path data_dir = make_data(world->rank());
  const io::Dataset data = io::Dataset::open(data_dir);
  io::LoaderOptions options;
  options.sampler = {
      .micro_batch = kMicroBatch, .world_size = world->size(), .rank = world->rank(), .seed = 3};
  options.device = device;
  // Before the first step every rank checks that the others have the same
  // settings and data (each rank wrote its own copy: same names, sizes, rows).
  comm::NamedValues agreed = data.agreement_fields();
  agreed.emplace_back("optimizer", "AdamW lr=0.01");
  comm::check_agreement(world->host(), agreed);
  io::DataLoader loader(data, options);
  engine::CrossEntropyLoss loss;

  // The same header, summary and metrics records as lockstep-train.
  engine::MetricsWriter metrics(world->rank() == 0 ? metrics_path : "");
  engine::RunHeader header;
  header.program = "custom";
  header.model = "fc1 (2 -> 32), SiLU, fc2 (32 -> 2)";
  header.device_reason = engine::explain_device(device, "", "");
  header.threads = 1;
  header.loader_threads = options.threads;
  header.micro_batch = kMicroBatch;
  header.steps_per_epoch = loader.batches_per_epoch();
  header.total_steps = kEpochs * header.steps_per_epoch;
  header.length_reason = fmt::format("{} epochs", kEpochs);
  header.precision = "fp32";
  header.data = {{"train", data_dir.string(), &data}};
  header.metrics_path = metrics_path;
  engine::RunReport report(*world, header, metrics);

  engine::EtaClock eta;
  eta.start(0);
  std::int64_t step = 0;
  double last_loss = 0;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    loader.start_epoch(epoch);
    auto start = std::chrono::steady_clock::now();  // a step's time includes waiting for its batch
    while (auto batch = loader.next()) {
      store.zero_grad();
      sync.begin_step(step++);
      engine::Context ctx;
      ctx.on_grad_ready = [&](engine::Parameter& p) { sync.mark_ready(store.index_of(p)); };
      const core::Tensor value =
          loss.forward(model.forward(batch->inputs, ctx), batch->labels, ctx);
      model.backward(loss.backward(1.0f, ctx), ctx);
      sync.finish();  // gradients are now averaged over every rank
      optimizer.step();
      // The step's mean loss over every rank's rows (the one collective a step adds).
      const comm::StepTotals totals = comm::agree_on_step(
          world->host(), value.to_vector<float>()[0] * batch->valid, batch->valid);
      const auto end = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(end - start).count();
      start = end;
      last_loss = totals.mean_loss();
      report.record_step(step, last_loss, totals.samples, seconds, false);
      if (world->rank() == 0) {
        if (!metrics_path.empty())  // formatted only when written
          metrics.write(
              fmt::format(R"("step": {}, "epoch": {}, "loss": {:.6g}, "samples_per_s": {:.1f})",
                          step, epoch + 1, last_loss, totals.samples / seconds));
        if (step % header.steps_per_epoch == 0)
          std::printf("%s\n", engine::progress_line(step, header.total_steps, last_loss, 0.01,
                                                    totals.samples / seconds,
                                                    eta.eta_s(step, header.total_steps))
                                  .c_str());
      }
    }
    report.end_epoch();
  }
  report.finish();
  world->shutdown();
  return last_loss > 0.2 ? 1 : 0;  // the task is easy: say so if not learnt
}
