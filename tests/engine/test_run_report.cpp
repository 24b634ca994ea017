// The run header and summary (engine/run_report.h): the deterministic setting
// reaches the kernels' process state; placement is grouped by host; the
// header's batch arithmetic and the summary's figures match sums worked out
// here by hand; the metrics records carry what tools/plot.py reads.
#include <catch2/catch.hpp>

#include <filesystem>

#include "comm/world.h"
#include "engine/run_report.h"
#include "io/shard_fixtures.h"
#include "io/shard_writer.h"
#include "kernels/conv.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;
namespace fs = std::filesystem;

namespace {

comm::World& world() { return test::world_of_one(); }

bool has_line(const std::vector<std::string>& lines, const std::string& text) {
  for (const std::string& l : lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("the deterministic setting reaches the kernels' process state", "[engine][run]") {
  kernels::set_conv_autotune(true);
  set_deterministic_run(true);
  CHECK(kernels::deterministic());
  CHECK_FALSE(kernels::conv_autotune());  // a timed choice can differ run to run
  CHECK(deterministic_run());
  set_deterministic_run(false);
  CHECK_FALSE(kernels::deterministic());
  CHECK_FALSE(deterministic_run());
}

TEST_CASE("placement lists each host once with its ranks and devices", "[engine][run]") {
  const std::vector<RankPlacement> p = {
      {0, "a", "cuda:0"}, {1, "a", "cuda:1"}, {2, "b", "cuda:0"}, {3, "b", "cuda:1"}};
  const std::vector<std::string> lines = describe_placement(p);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "a: ranks 0 1 on cuda:0 cuda:1");
  CHECK(lines[1] == "b: ranks 2 3 on cuda:0 cuda:1");
  const std::vector<RankPlacement> mine = gather_placement(world());
  REQUIRE(mine.size() == 1);
  CHECK(mine[0].device == "cpu");
  CHECK_FALSE(mine[0].host.empty());
}

TEST_CASE("the run header states the batch arithmetic, length and data", "[engine][run]") {
  const fs::path dir = fs::temp_directory_path() / "lockstep-run-header";
  fs::remove_all(dir);
  {
    io::DatasetWriter writer(dir, {DType::f32, {3}, DType::i64}, 10, 2);
    std::vector<float> x(30, 1.0f);
    std::vector<std::int64_t> y(10, 0);
    writer.append(x.data(), y.data(), 10);
    writer.close();
  }
  const io::Dataset data = io::Dataset::open(dir);
  RunHeader h;
  h.program = "prog";
  h.model = "mlp";
  h.device_reason = explain_device(core::Device::cpu(), "cpu", "--device");
  h.threads = 2;
  h.micro_batch = 32;
  h.accumulation = 4;
  h.steps_per_epoch = 7;
  h.total_steps = 21;
  h.length_reason = "--epochs 3";
  h.precision = "bf16";
  h.loss_scaling = true;
  h.zero_stage = 1;
  h.activation_checkpointing = true;
  h.parameter_bytes = 4 << 20;        // 1 Mi f32 parameters
  h.optimizer_state_bytes = 8 << 20;  // AdamW's two floats each
  h.data = {{"train", dir.string(), &data}};
  h.metrics_path = "m.jsonl";
  const auto lines = format_run_header(h, 8, {{0, "h", "cpu"}});
  // ZeRO-1 on 8 ranks: 4P + 4P + 8P / 8 with 4P = 4 MiB (docs/memory.md).
  CHECK(has_line(lines,
                 "model state per rank 9.0 MiB expected (--zero 1): parameters 4.0 MiB + "
                 "gradients 4.0 MiB + optimizer state 8.0 MiB / 8 ranks; "
                 "--activation-checkpointing on"));
  CHECK(has_line(lines, "cpu (asked for by --device)"));
  // 32 per rank x 4 micro-batches x 8 ranks = 1024.
  CHECK(has_line(lines, "32 per rank x 4 accumulation x 8 ranks = global batch 1024"));
  CHECK(has_line(lines, "21 (7 per epoch): --epochs 3"));
  CHECK(has_line(lines, "bf16 with dynamic loss scaling"));
  CHECK(has_line(lines, "10 samples, inputs f32 [3], labels i64, 2 shards read in parallel"));
  CHECK(has_line(lines, "checkpoints  none"));
  CHECK(has_line(lines, "ZeRO-1: optimizer state sharded over 8 ranks"));
  // ZeRO-2 on 8 ranks: 4P + 4P / 8 + 8P / 8 = 4 + 0.5 + 1 MiB (docs/memory.md).
  RunHeader two = h;
  two.zero_stage = 2;
  const auto two_lines = format_run_header(two, 8, {{0, "h", "cpu"}});
  CHECK(has_line(two_lines,
                 "model state per rank 5.5 MiB expected (--zero 2): parameters 4.0 MiB + "
                 "gradients 4.0 MiB / 8 ranks + optimizer state 8.0 MiB / 8 ranks; "
                 "--activation-checkpointing on"));
  CHECK(has_line(two_lines, "ZeRO-2: optimizer state and gradients sharded over 8 ranks"));
  // Shards that are not read by pread say so, with io's reason.
  const io::Dataset locked = io::Dataset::open(dir, {.force_hdf5 = true});
  CHECK(describe_dataset(locked) ==
        "10 samples, inputs f32 [3], labels i64, 2 shards read through HDF5 (read through HDF5 "
        "on request)");
  const std::string record = start_record(h, 8).dump();
  CHECK(record.find(R"("run": "start")") != std::string::npos);
  CHECK(record.find(R"("global_batch": 1024)") != std::string::npos);
  CHECK(record.find(R"("precision": "bf16")") != std::string::npos);
  CHECK(record.find(R"("zero_stage": 1)") != std::string::npos);
  CHECK(record.find(R"("activation_checkpointing": true)") != std::string::npos);
  CHECK(record.find(R"("expected_model_state_bytes": 9437184)") != std::string::npos);
  CHECK(record.find("tokens_per_sample") == std::string::npos);  // not a language model
  fs::remove_all(dir);
}

TEST_CASE("the run summary adds up steps, skips, epochs and the best evaluation", "[engine][run]") {
  const fs::path metrics_path = fs::temp_directory_path() / "lockstep-run-summary.jsonl";
  fs::remove(metrics_path);
  {
    MetricsWriter metrics(metrics_path.string());
    RunHeader h;
    h.program = "prog";
    h.micro_batch = 4;
    RunReport report(world(), h, metrics);
    // Epoch 1: losses 3 and 1; epoch 2: 2, a skipped step (its loss ignored), 4.
    report.record_step(1, 3.0, 4, 0.5, false);
    report.record_step(2, 1.0, 4, 0.5, false);
    report.end_epoch();
    report.record_eval(2, 1, 0.9, 0.70);
    report.record_step(3, 2.0, 4, 0.5, false);
    report.record_step(4, 1e30, 4, 0.5, true);
    report.record_step(5, 4.0, 4, 0.5, false);
    report.end_epoch();
    report.record_eval(5, 2, 1.1, 0.60);
    report.set_last_checkpoint("ck/ckpt-5.h5");
    const RunReport::Summary s = report.summary();
    CHECK(s.steps == 5);
    CHECK(s.skipped_steps == 1);
    CHECK(s.samples == 20);
    CHECK(s.step_s == Approx(2.5));
    REQUIRE(s.last_epoch_train_loss);
    CHECK(*s.last_epoch_train_loss == Approx(3.0));  // (2 + 4) / 2: the skipped step left out
    CHECK(*s.val_accuracy == Approx(0.60));          // the last evaluation
    CHECK(*s.best_val_accuracy == Approx(0.70));     // the best one, and where it was
    CHECK(s.best_val_step == 2);
    CHECK(s.best_val_epoch == 1);
    CHECK(s.epoch_wall_s.size() == 2);
    const auto lines = report.format_summary(s);
    CHECK(has_line(lines, "throughput   8 samples/s"));  // 20 samples in 2.5 s of steps
    CHECK(has_line(lines, "skipped      1 of 5 steps"));
    CHECK(has_line(lines, "accuracy 70.00% at step 2 (epoch 1)"));
    CHECK(has_line(lines, "ck/ckpt-5.h5"));
    // Note [train loss of a part]: the mean says which steps it is over.
    CHECK(has_line(lines, "prog: done at step 5"));
    CHECK(has_line(lines, "(mean of the last epoch's steps, 3 to 5; 1 skipped step left out)"));
    // A stop: "stopped at step N" and why, never "done" (and in the end record below).
    report.set_stopped("on request (a signal)");
    const auto stopped = report.format_summary(report.summary());
    CHECK(has_line(stopped, "prog: stopped at step 5 on request (a signal)"));
    CHECK_FALSE(has_line(stopped, "done"));
    CHECK(report.format_peak_memory({3 * 1024 * 1024}) ==
          "  memory       peak rank 0 3.0 MiB on " + world().device().str());
    // Note [memory kinds]: the kinds in MemoryKind's order, each named.
    CHECK(RunReport::format_peak_split(1, {1 << 20, 1 << 20, 2 << 20, 3 << 20, 0, 512, 0, 2048}) ==
          "  peak split   rank 1: parameters 1.0 MiB, gradients 1.0 MiB, optimizer_state 2.0 "
          "MiB, activations 3.0 MiB, communication 0 B, workspace 512 B, gathered 0 B, other 2.0 "
          "KiB");
    report.finish();
  }
  const std::string text = test::file_text(metrics_path);
  CHECK(text.find(R"({"run": "start")") == 0);
  CHECK(text.find(R"({"run": "end", "step": 5)") != std::string::npos);
  CHECK(text.find(R"("peak_memory_by_kind": [{"parameters": )") != std::string::npos);
  CHECK(text.find(R"("skipped_steps": 1)") != std::string::npos);
  CHECK(text.find(R"("checkpoint": "ck/ckpt-5.h5", "stopped": true, "stop_reason": "on )") !=
        std::string::npos);
  CHECK(text.find(R"("train_loss_steps": [3, 5], "train_loss_whole_epoch": true)") !=
        std::string::npos);
  CHECK(text.find(R"("peak_memory_bytes": [)") != std::string::npos);
  fs::remove(metrics_path);
}

TEST_CASE("the step detail states the breakdown in ms and the peak memory", "[engine][run]") {
  CHECK(format_bytes(812) == "812 B");
  CHECK(format_bytes(3 * 1024) == "3.0 KiB");
  CHECK(format_bytes(126'254'080) == "120.4 MiB");  // 126254080 / 2^20 = 120.405
  CHECK(format_bytes(std::size_t{3} << 30) == "3.00 GiB");
  const core::trace::Breakdown b{0.031, 10.2, 1.3, 0.52};
  CHECK(step_detail(b, 12.4, 2048, "cuda:1") ==
        "data 0.03  compute 10.20  comm 1.30  opt 0.52 ms (of 12.40)  peak 2.0 KiB on cuda:1");
  core::Json record = core::Json::object();
  add_step_detail(record, b, 12.4, 2048);
  CHECK(record.dump() == R"({"data_wait_ms": 0.031, "compute_ms": 10.2, "exposed_comm_ms": 1.3, )"
                         R"("optimizer_ms": 0.52, "step_ms": 12.4, "peak_memory_bytes": 2048})");
}
