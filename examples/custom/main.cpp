// A training program of your own, built against an installed lockstep
// (find_package(lockstep)): its own layer, its own model, data it makes in
// memory, its own loop around the library's data-parallel step, and the same
// start header, progress lines, summary and metrics records as lockstep-train
// (engine/run_report.h). Run it directly or under mpirun. Usage: custom [METRICS.jsonl]
#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "comm/world.h"
#include "engine/core/tensor_ops.h"
#include "engine/data_parallel_step.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/adamw.h"
#include "engine/parameter_store.h"
#include "engine/run_report.h"
#include "io/tensor_dataset.h"
#include "kernels/gemm.h"

using namespace lockstep;

// A layer the library does not have: y = x * sigmoid(x) (SiLU). Implementing
// forward and backward is all it takes; containers do the rest. Written with
// the ops of engine/core/tensor_ops.h, it runs on the CPU or a GPU, queued on
// the step's stream.
class SiLU : public engine::Module {
 public:
  SiLU() : Module("SiLU") {}
  core::Tensor forward(const core::Tensor& x, engine::Context& ctx) override {
    input_ = x;
    return core::ops::mul(x, core::ops::sigmoid(x, ctx.stream), ctx.stream);
  }
  core::Tensor backward(const core::Tensor& dy, engine::Context& ctx) override {
    namespace ops = core::ops;
    const core::Stream& stream = ctx.stream;
    const core::Tensor s = ops::sigmoid(input_, stream);
    // dx = dy * s * (1 + x (1 - s))
    const core::Tensor slope =
        ops::add(1.0, ops::mul(input_, ops::sub(1.0, s, stream), stream), stream);
    return ops::mul(ops::mul(dy, s, stream), slope, stream);
  }

 private:
  core::Tensor input_;
};

// Two noisy clusters per class in 2-D: learnable, not linearly separable.
// Every rank makes the same rows (the same seed).
io::TensorDataset make_data(const io::TensorDatasetOptions& options) {
  const std::int64_t n = 2048;
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
  return io::TensorDataset(core::Tensor::from_vector(x, {n, 2}, DType::f32),
                           core::Tensor::from_vector(y, {n}, DType::i64), options);
}

// Trains for kEpochs and returns the last step's loss.
double train(comm::World& world, const std::string& metrics_path) {
  const core::Device device = world.device();
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

  io::TensorDatasetOptions options;
  options.sampler = {
      .micro_batch = kMicroBatch, .world_size = world.size(), .rank = world.rank(), .seed = 3};
  options.device = device;
  io::TensorDataset data = make_data(options);

  // The step averages gradients over the ranks during backward and agrees on
  // the loss. At construction every rank checks that the others have the same
  // settings and data (the dataset's digest) and the same model.
  engine::StepOptions step_options;
  step_options.agreement = data.agreement_fields();
  step_options.agreement.emplace_back("optimizer", "AdamW lr=0.01");
  engine::LossScaler no_scaling(engine::LossScalerOptions{.enabled = false});
  engine::DataParallelStep step(model, store, optimizer, engine::make_scheduler("constant", {}),
                                no_scaling, &world, step_options, core::Stream());

  // The same header, summary and metrics records as lockstep-train.
  engine::MetricsWriter metrics(world.rank() == 0 ? metrics_path : "");
  engine::RunHeader header;
  header.program = "custom";
  header.model = "fc1 (2 -> 32), SiLU, fc2 (32 -> 2)";
  header.device_reason = engine::explain_device(device, "", "");
  header.threads = 1;
  header.loader_threads = 0;
  header.micro_batch = kMicroBatch;
  header.steps_per_epoch = data.batches_per_epoch();
  header.total_steps = kEpochs * header.steps_per_epoch;
  header.length_reason = fmt::format("{} epochs", kEpochs);
  header.precision = "fp32";
  header.metrics_path = metrics_path;
  engine::RunReport report(world, header, metrics);

  engine::EtaClock eta;
  eta.start(0);
  double last_loss = 0;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    data.start_epoch(epoch);
    auto start = std::chrono::steady_clock::now();  // a step's time includes making its batch
    while (auto batch = data.next()) {
      const engine::MicroBatch micro_batch{batch->inputs, batch->labels};
      const engine::StepResult r = step.run({&micro_batch, 1});
      const auto end = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(end - start).count();
      start = end;
      last_loss = r.loss;  // the mean over every rank's rows
      report.record_step(r.step, r.loss, r.samples, seconds, r.skipped);
      if (world.rank() == 0) {
        if (!metrics_path.empty())  // formatted only when written
          metrics.write(
              fmt::format(R"("step": {}, "epoch": {}, "loss": {:.6g}, "samples_per_s": {:.1f})",
                          r.step, epoch + 1, r.loss, r.samples / seconds));
        if (r.step % header.steps_per_epoch == 0)
          std::printf("%s\n", engine::progress_line(r.step, header.total_steps, r.loss, r.lr,
                                                    r.samples / seconds,
                                                    eta.eta_s(r.step, header.total_steps))
                                  .c_str());
      }
    }
    report.end_epoch();
  }
  report.finish();
  return last_loss;
}

int main(int argc, char** argv) {
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    std::fprintf(stderr, "usage: custom [METRICS.jsonl]  (JSON lines as lockstep-train writes)\n");
    return 2;
  }
  auto world = comm::init(argc, argv);
  kernels::cpu::set_gemm_threads(1);  // one compute thread per rank, as the header says
  const double last_loss = train(*world, argc > 1 ? argv[1] : "");
  world->shutdown();
  return last_loss > 0.2 ? 1 : 0;  // the task is easy: say so if not learnt
}
