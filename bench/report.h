// Output shared by the benchmark binaries: a table on stdout for people, with
// a legend under it (what the baseline is, which way `ratio` goes, why a
// baseline cell reads "-"), and, with --json FILE, one JSON object per
// measurement for programs (field names carry their units; `ratio` is
// lockstep / baseline, higher is better).
#pragma once

#include <fmt/core.h>
#include <fmt/os.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::bench {

// One JSON value, already formatted: numbers, quoted strings or null.
struct JsonField {
  std::string key;
  std::string value;
};

inline JsonField field(std::string key, const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) quoted += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return {std::move(key), quoted + "\""};
}
inline JsonField field(std::string key, const char* text) {
  return field(std::move(key), std::string(text));
}
inline JsonField field(std::string key, double v) {
  return {std::move(key), fmt::format("{:.6g}", v)};
}
inline JsonField field(std::string key, long long v) {
  return {std::move(key), fmt::format("{}", v)};
}
inline JsonField field(std::string key, std::optional<double> v) {
  return v ? field(std::move(key), *v) : JsonField{std::move(key), "null"};
}

// The legend printed under a table: `baseline` says what lockstep is measured
// against, `ratio` which way the ratio goes, and `no_baseline` (when not
// empty) why some baseline cells read "-".
inline void print_legend(const std::string& baseline, const std::string& ratio,
                         const std::string& no_baseline = "") {
  fmt::print("baseline: {}\nratio:    {}\n", baseline, ratio);
  if (!no_baseline.empty()) fmt::print("\"-\":      {}\n", no_baseline);
}

// Appends JSON lines to a file, or does nothing when no file was asked for.
class JsonLines {
 public:
  explicit JsonLines(const std::string& path) {
    if (!path.empty()) file_ = std::fopen(path.c_str(), "w");
    if (!path.empty() && !file_) throw std::runtime_error("cannot open --json file " + path);
  }
  ~JsonLines() {
    if (file_) std::fclose(file_);
  }
  JsonLines(const JsonLines&) = delete;
  JsonLines& operator=(const JsonLines&) = delete;

  void write(const std::vector<JsonField>& fields) {
    if (!file_) return;
    std::string line = "{";
    for (std::size_t i = 0; i < fields.size(); ++i)
      line += fmt::format("{}\"{}\": {}", i ? ", " : "", fields[i].key, fields[i].value);
    fmt::print(file_, "{}}}\n", line);
    std::fflush(file_);
  }

 private:
  std::FILE* file_ = nullptr;
};

// Seconds per call of `run`: calls are timed in batches, so that `sync` (a
// GPU stream synchronisation, or nothing) is paid once per batch. The batch
// size makes one batch last about `min_batch_s`.
class Timer {
 public:
  template <typename Run, typename Sync>
  static int calibrate(Run&& run, Sync&& sync, double min_batch_s) {
    run();
    sync();  // warm-up: first-call planning and allocation are not measured
    int calls = 1;
    while (true) {
      const double s = batch_seconds(run, sync, calls);
      if (s >= min_batch_s || calls >= (1 << 20)) return calls;
      calls *= s > 0 ? std::max(2, static_cast<int>(min_batch_s / s) + 1) : 2;
    }
  }
  template <typename Run, typename Sync>
  static double batch_seconds(Run&& run, Sync&& sync, int calls) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) run();
    sync();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// Median seconds per call of `ours` and of `baseline`, measured in alternating
// batches so that clock drift and other load hit both alike.
template <typename Ours, typename Baseline, typename Sync>
std::pair<double, double> compare_seconds(Ours&& ours, Baseline&& baseline, Sync&& sync, int trials,
                                          double min_batch_s) {
  const int ours_calls = Timer::calibrate(ours, sync, min_batch_s);
  const int base_calls = Timer::calibrate(baseline, sync, min_batch_s);
  std::vector<double> a, b;
  for (int t = 0; t < trials; ++t) {
    a.push_back(Timer::batch_seconds(ours, sync, ours_calls) / ours_calls);
    b.push_back(Timer::batch_seconds(baseline, sync, base_calls) / base_calls);
  }
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return {a[a.size() / 2], b[b.size() / 2]};
}

// Median seconds per call of `run` alone (when no baseline exists).
template <typename Run, typename Sync>
double median_seconds(Run&& run, Sync&& sync, int trials, double min_batch_s) {
  const int calls = Timer::calibrate(run, sync, min_batch_s);
  std::vector<double> s;
  for (int t = 0; t < trials; ++t) s.push_back(Timer::batch_seconds(run, sync, calls) / calls);
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

}  // namespace lockstep::bench
