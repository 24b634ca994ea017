// Validators shared by the flags of every lockstep program (examples/ and
// bench/): one place for the checks they all need, so that a zero, negative,
// NaN, huge or empty value is refused while parsing, with a message naming
// the flag (CLI11 prefixes it), the value and what is allowed. It lives beside
// the programs a user copies from because flags are a program's business: the
// library checks its arguments in API terms.
#pragma once

#include <fmt/core.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "examples/common/cli.h"

#include "engine/core/device.h"
#include "engine/core/trace.h"
#include "engine/models.h"
#include "kernels/error.h"
#include "kernels/gemm.h"

namespace lockstep::examples {

// Largest values the common flags accept: far above any real use, low
// enough that sizes derived from them cannot overflow 64 bits.
inline constexpr double kMaxThreads = 1024;  // CPU threads per rank
inline constexpr double kMaxRows = 1 << 30;  // samples in one micro-batch
inline constexpr double kMaxSteps = 1e12;    // steps, intervals in steps
inline constexpr double kMaxEpochs = 1e6;    // times the steps of an epoch: below 2^63
inline constexpr double kMaxSeed = 1.8446744073709551615e19;  // 2^64 - 1

// A finite number in [lo, hi]. CLI::Range is not enough: NaN passes its
// comparisons. The flag's type (integer or not) is CLI11's own check.
inline CLI::Validator within(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long double value = std::strtold(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size())
          return fmt::format("'{}' is not a number (allowed: {:.15g} to {:.15g})", text, lo, hi);
        if (!std::isfinite(value) || errno == ERANGE || value < lo || value > hi)
          return fmt::format("{} is outside the allowed range {:.15g} to {:.15g}", text, lo, hi);
        return {};
      },
      fmt::format("in [{:.15g}, {:.15g}]", lo, hi));
}

// A path or name: an empty value is refused rather than read as "none".
inline CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? "an empty value is not allowed (leave the flag out instead)" : "";
      },
      "not empty");
}

// One of `names`; the message lists them.
inline CLI::Validator one_of(std::vector<std::string> names) {
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return CLI::Validator(
      [names, list](std::string& text) -> std::string {
        for (const std::string& n : names)
          if (text == n) return {};
        return fmt::format("'{}' is not allowed (allowed: {})", text, list);
      },
      "one of " + list);
}

// A window of steps, FIRST:LAST (core::trace::parse_step_window).
inline CLI::Validator step_window() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          core::trace::parse_step_window(text, "window");
          return {};
        } catch (const std::exception& e) {
          return e.what();
        }
      },
      "FIRST:LAST");
}

// Starts the trace of --trace DIR --trace-steps WINDOW; errors name the
// flags. Programs of several ranks call it right after a barrier, so that
// every rank's clock_sync is the same moment.
inline void start_trace(int rank, const std::string& dir, const std::string& steps) {
  const core::trace::StepWindow window = core::trace::parse_step_window(steps, "--trace-steps");
  try {
    core::trace::enable(dir, rank, window);
  } catch (const std::exception& e) {
    throw InvalidArgument(fmt::format("--trace {}: {}", dir, e.what()));
  }
}

// The flags several programs share.
inline CLI::Validator threads_per_rank() { return within(1, kMaxThreads); }
inline CLI::Validator device_name() { return one_of({"cpu", "cuda"}); }
// The device a --device value names, checked usable here, with the flag in
// the message where the library's (core::require_usable) speaks of devices.
inline core::Device usable_device(const std::string& text) {
  const core::Device device = core::parse_device(text);
  if (device.is_cuda() && core::cuda_device_count() == 0)
    throw InvalidArgument("--device " + text + ", but no GPU is usable here (use --device cpu)");
  core::require_usable(device);
  return device;
}
inline CLI::Validator precision_name() { return one_of({"fp32", "fp16", "bf16"}); }
inline CLI::Validator seed_value() { return within(0, kMaxSeed); }
inline CLI::Validator model_name() {
  std::vector<std::string> names;
  for (const engine::ModelPreset& preset : engine::model_presets()) names.push_back(preset.name);
  return one_of(std::move(names));
}

// --checkpoint, --allow-partial-weights and --model of the programs that
// load a checkpoint or a weights file into a preset (lockstep-export,
// lockstep-predict; Note [weights files] in engine/checkpoint.h). Without
// `language_models`, the GPT presets are refused while parsing. `partial_note`
// ends --allow-partial-weights' help with what else records a partial load.
inline void add_weights_flags(CLI::App& app, std::string& checkpoint, bool& allow_partial,
                              std::string& model, bool language_models,
                              const std::string& partial_note) {
  app.add_option("--checkpoint", checkpoint,
                 "a lockstep checkpoint, or a PyTorch state_dict under /model (docs/models.md): "
                 "every parameter and buffer of the model, nothing left over")
      ->required()
      ->check(non_empty() & CLI::ExistingFile);
  app.add_flag("--allow-partial-weights", allow_partial,
               "load the entries the model and the file both have, keep the model's others as "
               "initialised, and say what was skipped" +
                   partial_note);
  std::string presets;
  for (const engine::ModelPreset& p : engine::model_presets())
    if (!p.language_model || language_models)
      presets += fmt::format("{}{} (input {})", presets.empty() ? "" : ", ", p.name,
                             core::shape_str(p.sample_shape));
  CLI::Option* option =
      app.add_option("--model", model, "the preset the checkpoint was trained as: " + presets)
          ->required()
          ->check(model_name());
  if (!language_models)
    option->check(CLI::Validator(
        [](std::string& name) -> std::string {
          return engine::model_preset(name).language_model
                     ? name +
                           " is a language model: this program takes the image and feature "
                           "presets (sample a language model with lockstep-train "
                           "--sample-tokens, or call engine::Predictor::predict with tokens)"
                     : "";
        },
        "", "not a language model"));
}

// The programs' --threads: the CPU GEMM library's threads; the library
// itself from the environment's LOCKSTEP_CPU_GEMM (onednn or openblas; Note
// [CPU GEMM libraries] in kernels/gemm.h), the build's default without it;
// and on the `lead` rank a warning when OpenBLAS runs generic kernels on this
// processor (Note [BLAS kernels]), naming the environment variable that fixes it.
inline void use_cpu_threads(int threads, bool lead) {
  if (const char* library = std::getenv("LOCKSTEP_CPU_GEMM"); library && *library)
    kernels::cpu::parse_gemm_library(library, "LOCKSTEP_CPU_GEMM");
  kernels::cpu::set_gemm_threads(threads);
  const std::string advice = kernels::cpu::cpu_gemm_kernels().advice();
  if (lead && !advice.empty()) fmt::print(stderr, "warning: {}\n", advice);
}

}  // namespace lockstep::examples
