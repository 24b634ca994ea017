// The timeline trace's GPU spans on a real GPU: five traced steps (window 2:4)
// of a small MLP fed by the HDF5 loader on cuda:0, through DataParallelStep
// over a one-rank NCCL world. The file must be valid trace-event JSON (the
// rules tests/programs/trace.sh checks, applied line by line to the writer's
// format), and its stream tracks must hold each top-level module's forward and
// backward and the optimizer (compute stream), each bucket's allreduce (NCCL
// stream) and the host-to-device copies (copy stream), each inside its step's
// host span, in order on its stream, with a positive duration.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/trace.h"
#include "engine/data_parallel_step.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/sgd.h"
#include "io/loader.h"
#include "io/shard_fixtures.h"
#include "support/read_text.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;
namespace trace = lockstep::core::trace;

namespace {

struct TraceEvent {
  std::string name, category;
  double ts_us = 0, dur_us = 0;
  int tid = 0;
  std::int64_t step = 0;
  bool gpu = false;
};

struct TraceFile {
  std::map<int, std::string> tracks;  // tid -> thread or stream name
  std::vector<TraceEvent> spans;      // complete events, in file order
  double anchor_uncertainty_us = -1;
  std::string dropped_gpu_spans;
};

// Every line of the writer's output must be one of these; together they are
// trace.sh's rules: a string name and ph, numeric ts, integer pid and tid, ph
// X (with dur >= 0), i (scope t) or M (process_name or thread_name, with a
// string args.name), and every tid named.
TraceFile parse(const std::string& text) {
  static const std::regex event(
      R"re(\{"name": "((?:[^"\\]|\\.)*)", "cat": "([^"]*)", "ph": "([Xi])", "ts": ([0-9]+\.[0-9]{3}), (?:"dur": ([0-9]+\.[0-9]{3}), |"s": "t", )"pid": 0, "tid": ([0-9]+), "args": \{"step": ([0-9]+)(, "gpu": true)?\}\},?)re");
  static const std::regex meta(
      R"re(\{"name": "(process_name|thread_name)", "ph": "M", "ts": 0, "pid": 0, "tid": ([0-9]+), "args": \{"name": "((?:[^"\\]|\\.)*)"\}\},?)re");
  static const std::regex other(
      R"re("otherData": \{"rank": 0, "clock_sync_us": [0-9.]+, "dropped_events": 0, "dropped_gpu_spans": ([0-9]+), "gpu_anchor_uncertainty_us": ([0-9.]+)\}\})re");
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  REQUIRE(line == "{\"traceEvents\": [");
  TraceFile f;
  std::set<int> used;
  while (std::getline(in, line) && line != "],") {
    std::smatch m;
    if (std::regex_match(line, m, meta)) {
      if (m[1] == "thread_name") f.tracks[std::stoi(m[2])] = m[3];
      continue;
    }
    INFO(line);
    REQUIRE(std::regex_match(line, m, event));
    used.insert(std::stoi(m[6]));
    if (m[3] != "X") continue;
    f.spans.push_back({m[1], m[2], std::stod(m[4]), std::stod(m[5]), std::stoi(m[6]),
                       std::stoll(m[7]), m[8].matched});
  }
  for (int tid : used) CHECK(f.tracks.count(tid) == 1);
  std::smatch m;
  REQUIRE(std::regex_search(text, m, other));
  f.dropped_gpu_spans = m[1];
  f.anchor_uncertainty_us = std::stod(m[2]);
  return f;
}

}  // namespace

TEST_CASE("traced CUDA steps put modules, optimizer, collectives and copies on stream tracks",
          "[gpu][trace]") {
  comm::World& world = test::gpu_world_of_one();
  const core::Device gpu = world.device();
  REQUIRE(gpu.is_cuda());
  test::TempDir shards;
  test::write_shard(shards / "a.h5", 0, 320, {24}, DType::u8);
  const io::Dataset data = io::Dataset::open(shards.path());
  core::Stream stream = core::Stream::create(gpu);
  io::LoaderOptions lo{.sampler = {.micro_batch = 32, .seed = 1}, .threads = 1, .scale_u8 = true};
  lo.device = gpu;
  lo.stream = stream;
  io::DataLoader loader(data, lo);

  Sequential model;
  model.emplace<Linear>("fc1", 24, 40);
  model.emplace<GELU>("act");
  model.emplace<Linear>("fc2", 40, 10);
  model.set_input_grad(false);
  initialize(model, 5);
  ParameterStore store(model, gpu, stream);
  SGD sgd(store, decay_groups(store, 0.05, 0.0), SgdOptions{.momentum = 0.9}, stream);
  LossScaler scaler(LossScalerOptions{.enabled = false});
  StepOptions o;
  o.sync.bucket_cap_bytes = o.sync.first_bucket_cap_bytes = 2048;  // several buckets
  DataParallelStep step(model, store, sgd, make_scheduler("constant", {}), scaler, &world, o,
                        stream);
  const std::size_t buckets = step.synchronizer().buckets().size();
  REQUIRE(buckets > 1);

  test::TempDir dir;
  trace::enable(dir.path(), 0, trace::parse_step_window("2:4", "window"));
  loader.start_epoch(0);
  for (std::int64_t s = 1; s <= 5; ++s) {
    trace::set_step(s);
    trace::Span host_step("step", "step");
    std::optional<io::Batch> batch;
    {
      trace::Span wait("data wait", trace::Part::data);
      batch = loader.next();
    }
    REQUIRE(batch);
    const MicroBatch micro{batch->inputs, batch->labels};
    step.run({&micro, 1});
    // The step's compute stream (which waited for the NCCL stream) is done
    // when the host span ends, so every GPU span of the step lies inside it.
    stream.synchronize();
  }
  // Step 5, not traced, waited for every copy issued in step 4 (the prefetch of its batch).
  const double run_end_us =
      std::chrono::duration<double, std::micro>(trace::Clock::now().time_since_epoch()).count();
  trace::set_step(0);
  const TraceFile f = parse(test::read_text(trace::finish()));
  CHECK(f.dropped_gpu_spans == "0");

  // The host's step spans, by step.
  std::map<std::int64_t, const TraceEvent*> host_steps;
  for (const TraceEvent& e : f.spans)
    if (!e.gpu && e.name == "step") host_steps[e.step] = &e;
  REQUIRE(host_steps.size() == 3);
  REQUIRE(host_steps.count(2) == 1);
  REQUIRE(host_steps.count(4) == 1);

  // Tolerance: the anchor's half-width (written by the trace) for where the
  // host and device clocks meet, plus 20 us for CUDA events' resolution
  // (about 0.5 us), the devices' drift within a second (parts per million)
  // and the ns rounding of the file: a GPU span can only start after the host
  // enqueued it and end before the host saw its stream done.
  const double tolerance_us = f.anchor_uncertainty_us + 20.0;
  INFO("anchor uncertainty " << f.anchor_uncertainty_us << " us");
  std::map<std::string, std::vector<const TraceEvent*>> by_track;
  std::map<std::string, int> count;  // "<track>/<name>"
  for (const TraceEvent& e : f.spans) {
    if (!e.gpu) continue;
    const std::string track = f.tracks.at(e.tid);
    INFO(track << ": " << e.name << " at step " << e.step);
    by_track[track].push_back(&e);
    ++count[track + "/" + e.name];
    REQUIRE(host_steps.count(e.step) == 1);  // inside the window 2:4
    const TraceEvent& host = *host_steps[e.step];
    CHECK(e.ts_us >= host.ts_us - tolerance_us);
    // A copy issued in step s may be the prefetch of the next batch: it ends
    // before the next step's data wait does, hence before that step's end.
    double end_us = host.ts_us + host.dur_us;
    if (e.name == "host-to-device copy")
      end_us = host_steps.count(e.step + 1)
                   ? host_steps[e.step + 1]->ts_us + host_steps[e.step + 1]->dur_us
                   : run_end_us;
    CHECK(e.ts_us + e.dur_us <= end_us + tolerance_us);
    // Kernels and copies take time; a one-rank allreduce may do nothing at all.
    if (e.category == "comm")
      CHECK(e.dur_us >= 0.0);
    else
      CHECK(e.dur_us > 0.0);
  }
  for (const char* name : {"forward fc1", "forward act", "forward fc2", "backward fc2",
                           "backward act", "backward fc1", "optimizer"}) {
    INFO(name);
    CHECK(count["cuda compute stream/" + std::string(name)] == 3);
  }
  for (std::size_t b = 0; b < buckets; ++b)
    CHECK(count["nccl stream/allreduce bucket " + std::to_string(b)] == 3);
  // Batches 3 and 4 are copied in the window (each in its step, or as the
  // prefetch in the step before); batch 2's copy may be step 1's prefetch.
  CHECK(count["copy stream/host-to-device copy"] >= 2);
  // On one stream, work runs in the order it was queued: each span begins
  // after the one before it ended (the file keeps a stream's spans in the
  // order they began). 1 us: the two ends come from different floats.
  for (const auto& [track, spans] : by_track) {
    INFO(track);
    for (std::size_t i = 1; i < spans.size(); ++i)
      CHECK(spans[i]->ts_us >= spans[i - 1]->ts_us + spans[i - 1]->dur_us - 1.0);
  }
}
