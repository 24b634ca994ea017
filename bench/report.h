// Output shared by the benchmark binaries: a table on stdout for people, with
// a legend under it (what the baseline is, which way `ratio` goes, why a
// baseline cell reads "-"), and, with --json FILE, one JSON object per
// measurement for programs (field names carry their units; `ratio` is
// lockstep / baseline, higher is better).
#pragma once

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/json.h"
#include "engine/core/output_file.h"

namespace lockstep::bench {

// One member of a measurement's JSON object (Note [JSON by a library] in
// engine/core/json.h): numbers, strings, null (an empty optional), arrays.
struct JsonField {
  std::string key;
  core::Json value;
};

inline JsonField field(std::string key, core::Json value) {
  return {std::move(key), std::move(value)};
}

// The fields as one JSON object, in their order.
inline core::Json object(const std::vector<JsonField>& fields) {
  core::Json out = core::Json::object();
  for (const JsonField& f : fields) out.set(f.key, f.value);
  return out;
}

// The legend printed under a table: `baseline` says what lockstep is measured
// against, `ratio` which way the ratio goes, and `no_baseline` (when not
// empty) why some baseline cells read "-".
inline void print_legend(const std::string& baseline, const std::string& ratio,
                         const std::string& no_baseline = "") {
  fmt::print("baseline: {}\nratio:    {}\n", baseline, ratio);
  if (!no_baseline.empty()) fmt::print("\"-\":      {}\n", no_baseline);
}

// JSON lines in a file, or nothing when no file was asked for. The file is
// rewritten whole after each line (core::write_file, Note [one way to write a
// file]): a benchmark cut short leaves the lines measured so far, and a link
// planted at the name, or an input named as the output, is refused.
class JsonLines {
 public:
  explicit JsonLines(std::string path) : path_(std::move(path)) {}

  void write(const std::vector<JsonField>& fields) {
    if (path_.empty()) return;
    text_ += object(fields).dump() + "\n";
    core::write_file(path_, text_, "the --json file");
  }

 private:
  std::string path_;
  std::string text_;
};

// Seconds for `calls` calls of `run`, then `sync` (a GPU stream
// synchronisation, or nothing), paid once per batch.
template <typename Run, typename Sync>
double batch_seconds(Run&& run, Sync&& sync, int calls) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) run();
  sync();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Median seconds per call of each contender, measured in alternating batches
// (one batch of each in turn, `trials` rounds) so that clock drift and other
// load hit all alike. A contender runs `calls` calls and returns their seconds
// (it times itself, as a child process does); each batch lasts about
// `min_batch_s`.
inline std::vector<double> interleaved_medians(
    const std::vector<std::function<double(int calls)>>& contenders, int trials,
    double min_batch_s) {
  std::vector<int> calls;
  for (const auto& run : contenders) {
    run(1);  // warm-up: first-call planning and allocation are not measured
    int n = 1;
    while (true) {
      const double s = run(n);
      if (s >= min_batch_s || n >= (1 << 20)) break;
      n *= s > 0 ? std::max(2, static_cast<int>(min_batch_s / s) + 1) : 2;
    }
    calls.push_back(n);
  }
  std::vector<std::vector<double>> seconds(contenders.size());
  for (int t = 0; t < trials; ++t)
    for (std::size_t c = 0; c < contenders.size(); ++c)
      seconds[c].push_back(contenders[c](calls[c]) / calls[c]);
  std::vector<double> medians;
  for (auto& s : seconds) {
    std::sort(s.begin(), s.end());
    medians.push_back(s[s.size() / 2]);
  }
  return medians;
}

// One contender's seconds per call in each of its timed blocks, in the order
// they ran, with their median and the fastest and slowest block.
struct BlockTimes {
  std::vector<double> seconds;
  double median = 0, low = 0, high = 0;
};

// Note [warm blocks]: contenders that are separate processes (a PyTorch child)
// must not be timed in short batches that alternate with ours: each switch
// leaves the caches, branch predictors and the CPU's frequency to the other
// side, and the first steps after it run slow (on an idle Xeon, PyTorch's mlp
// step ran about 16% slower that way than in a block in its own process, and
// lockstep's about 4%: issue 27). So each contender is timed in blocks of
// `calls` calls lasting at least `block_s` (and at least `min_calls` calls),
// each block preceded by a quarter block of untimed calls that warms it up
// again, the contenders taking turns block by block (ABAB...) for `blocks`
// rounds, so that drift and other load still hit all alike. A contender runs
// `calls` calls and returns their seconds (a child times itself).
inline std::vector<BlockTimes> warm_blocks(
    const std::vector<std::function<double(int calls)>>& contenders, int blocks, double block_s,
    int min_calls) {
  std::vector<int> calls;
  for (const auto& run : contenders) {
    run(1);  // first-call planning and allocation are not measured
    int n = std::max(min_calls, 1);
    while (true) {
      const double s = run(n);
      if (s >= block_s || n >= (1 << 20)) break;
      n = s > 0 ? std::max(n + 1, static_cast<int>(n * 1.1 * block_s / s) + 1) : 2 * n;
    }
    calls.push_back(n);
  }
  std::vector<BlockTimes> times(contenders.size());
  for (int b = 0; b < blocks; ++b)
    for (std::size_t c = 0; c < contenders.size(); ++c) {
      contenders[c](std::max(1, calls[c] / 4));  // warms the caches this contender lost
      times[c].seconds.push_back(contenders[c](calls[c]) / calls[c]);
    }
  for (BlockTimes& t : times) {
    std::vector<double> sorted = t.seconds;
    std::sort(sorted.begin(), sorted.end());
    t.median = sorted[sorted.size() / 2];
    t.low = sorted.front();
    t.high = sorted.back();
  }
  return times;
}

// Median seconds per call of `ours` and of `baseline` (interleaved_medians of
// the two, each batch ended by `sync`).
template <typename Ours, typename Baseline, typename Sync>
std::pair<double, double> compare_seconds(Ours&& ours, Baseline&& baseline, Sync&& sync, int trials,
                                          double min_batch_s) {
  const auto medians =
      interleaved_medians({[&](int calls) { return batch_seconds(ours, sync, calls); },
                           [&](int calls) { return batch_seconds(baseline, sync, calls); }},
                          trials, min_batch_s);
  return {medians[0], medians[1]};
}

// Median seconds per call of `run` alone (when no baseline exists).
template <typename Run, typename Sync>
double median_seconds(Run&& run, Sync&& sync, int trials, double min_batch_s) {
  return interleaved_medians({[&](int calls) { return batch_seconds(run, sync, calls); }}, trials,
                             min_batch_s)[0];
}

}  // namespace lockstep::bench
