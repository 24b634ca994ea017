// load_weights against files laid out as h5py writes a PyTorch state_dict
// (`f[f"model/{name}"] = t.numpy()` for every entry, BatchNorm's buffers and
// its int64 num_batches_tracked included), written here through the HDF5 C
// API: the buffers take effect (eval output against PyTorch's formula in
// float64), a missing or an unused entry is refused by name, a partial load
// is allowed on request and reported, and lockstep's own checkpoints load as
// before (Note [weights files] in engine/checkpoint.h).
#include <hdf5.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/containers.h"
#include "engine/nn/embedding.h"
#include "engine/nn/linear.h"
#include "engine/optim/sgd.h"
#include "engine/parameter_store.h"
#include "tests/temp_dir.h"

using namespace lockstep;
using namespace lockstep::engine;
using test::TempDir;
namespace fs = std::filesystem;

namespace {

// One dataset as h5py writes a tensor's numpy array: contiguous,
// little-endian, a 0-dim tensor as a scalar dataspace. `path` is the
// dataset's path in the file ("model/bn.weight").
struct Entry {
  std::string path;
  core::Shape shape;
  std::vector<double> values;
  DType type = DType::f32;  // f32 or i64 (torch.long)
};

void write_file(const fs::path& file, const std::vector<Entry>& entries) {
  const hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(f >= 0);
  const hid_t links = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(links, 1);  // as h5py makes "model/" on first use
  for (const Entry& e : entries) {
    const std::vector<hsize_t> dims(e.shape.begin(), e.shape.end());
    const hid_t space = dims.empty()
                            ? H5Screate(H5S_SCALAR)
                            : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const bool is_float = e.type == DType::f32;
    const hid_t set = H5Dcreate2(f, e.path.c_str(), is_float ? H5T_IEEE_F32LE : H5T_STD_I64LE,
                                 space, links, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(set >= 0);
    std::vector<float> floats(e.values.begin(), e.values.end());
    std::vector<std::int64_t> integers(e.values.begin(), e.values.end());
    REQUIRE(H5Dwrite(set, is_float ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT64, H5S_ALL, H5S_ALL,
                     H5P_DEFAULT,
                     is_float ? static_cast<const void*>(floats.data()) : integers.data()) >= 0);
    H5Dclose(set);
    H5Sclose(space);
  }
  H5Pclose(links);
  REQUIRE(H5Fclose(f) >= 0);
}

// bn BatchNorm2d(3) -> Flatten -> fc Linear(12, 2), named as PyTorch names
// nn.Sequential(OrderedDict(bn=..., flat=..., fc=...)).
struct Net {
  Sequential model;
  Net() {
    model.emplace<BatchNorm2d>("bn", 3);
    model.emplace<Flatten>("flat");
    model.emplace<Linear>("fc", 12, 2);
    model.assign_names();
  }
  std::vector<float> floats(const std::string& name) {
    for (Parameter* p : model.parameters())
      if (p->name == name) return p->value.to_vector<float>();
    for (Buffer* b : model.buffers())
      if (b->name == name) return b->value.to_vector<float>();
    FAIL("no parameter or buffer " << name);
    return {};
  }
  std::int64_t batches_tracked() {
    for (Buffer* b : model.buffers())
      if (b->name == "bn.num_batches_tracked") return b->value.to_vector<std::int64_t>().at(0);
    FAIL("no bn.num_batches_tracked");
    return -1;
  }
};

const std::vector<double> kBnWeight{1.5, 0.5, -1.0}, kBnBias{0.1, -0.2, 0.3},
    kRunningMean{0.25, -1.0, 2.0}, kRunningVar{4.0, 0.25, 9.0}, kFcBias{0.5, -0.5};

std::vector<double> fc_weight() {
  std::vector<double> w(24);
  for (int k = 0; k < 24; ++k) w[k] = 0.05 * (k % 7) - 0.15;
  return w;
}

// model.state_dict() of the PyTorch twin of Net, in its order.
std::vector<Entry> state_dict() {
  return {{"model/bn.weight", {3}, kBnWeight},
          {"model/bn.bias", {3}, kBnBias},
          {"model/bn.running_mean", {3}, kRunningMean},
          {"model/bn.running_var", {3}, kRunningVar},
          {"model/bn.num_batches_tracked", {}, {7}, DType::i64},
          {"model/fc.weight", {2, 12}, fc_weight()},
          {"model/fc.bias", {2}, kFcBias}};
}

std::vector<Entry> without(std::vector<Entry> entries, const std::string& path) {
  std::erase_if(entries, [&](const Entry& e) { return e.path == path; });
  return entries;
}

// PyTorch's eval-mode BatchNorm2d (eps 1e-5) then Linear, in float64, on x [2, 3, 2, 2].
std::vector<double> reference(const std::vector<double>& x, const std::vector<double>& mean,
                              const std::vector<double>& var) {
  const std::vector<double> w = fc_weight();
  std::vector<double> out;
  for (int n = 0; n < 2; ++n) {
    std::vector<double> features(12);
    for (int c = 0; c < 3; ++c)
      for (int s = 0; s < 4; ++s)
        features[c * 4 + s] =
            kBnWeight[c] * (x[n * 12 + c * 4 + s] - mean[c]) / std::sqrt(var[c] + 1e-5) +
            kBnBias[c];
    for (int o = 0; o < 2; ++o) {
      double sum = kFcBias[o];
      for (int j = 0; j < 12; ++j) sum += w[o * 12 + j] * features[j];
      out.push_back(sum);
    }
  }
  return out;
}

std::vector<double> input_values() {
  std::vector<double> x(24);
  for (int k = 0; k < 24; ++k) x[k] = 0.5 * ((k * 5) % 11) - 2.0;
  return x;
}

std::vector<float> eval_output(Net& net) {
  net.model.eval();
  Context ctx;
  const std::vector<double> x = input_values();
  return net.model
      .forward(core::Tensor::from_vector(std::vector<float>(x.begin(), x.end()), {2, 3, 2, 2},
                                         DType::f32),
               ctx)
      .to_vector<float>();
}

}  // namespace

TEST_CASE("load_weights takes a whole PyTorch state_dict and eval uses its running statistics",
          "[engine][checkpoint]") {
  TempDir dir;
  write_file(dir / "state_dict.h5", state_dict());
  Net net;
  load_weights(dir / "state_dict.h5", net.model, core::Stream());
  CHECK(net.floats("bn.running_mean") == std::vector<float>{0.25f, -1.0f, 2.0f});
  CHECK(net.floats("bn.running_var") == std::vector<float>{4.0f, 0.25f, 9.0f});
  CHECK(net.batches_tracked() == 7);
  const std::vector<double> want = reference(input_values(), kRunningMean, kRunningVar);
  // The file's statistics move the output far from the default ones' (mean 0, var 1).
  const std::vector<double> defaults = reference(input_values(), {0, 0, 0}, {1, 1, 1});
  double largest_change = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    largest_change = std::max(largest_change, std::fabs(want[i] - defaults[i]));
  REQUIRE(largest_change > 0.5);
  const std::vector<float> got = eval_output(net);
  REQUIRE(got.size() == want.size());
  // f32 arithmetic on values below 10, 12-term sums: a few ulps of f32.
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("output " << i << ": got " << got[i] << ", want " << want[i]);
    CHECK(std::fabs(got[i] - want[i]) <= 1e-5 * (1.0 + std::fabs(want[i])));
  }
}

TEST_CASE("load_weights refuses a weights file without a buffer the model has, naming it",
          "[engine][checkpoint]") {
  TempDir dir;
  write_file(dir / "no_var.h5", without(state_dict(), "model/bn.running_var"));
  Net net;
  CHECK_THROWS_WITH(load_weights(dir / "no_var.h5", net.model, core::Stream()),
                    Catch::Contains("bn.running_var") && Catch::Contains("no_var.h5") &&
                        Catch::Contains("missing"));
  // Nothing was loaded: the refusal comes before any copy.
  CHECK(net.floats("bn.running_mean") == std::vector<float>{0, 0, 0});
  CHECK(net.floats("bn.weight") == std::vector<float>{1, 1, 1});
}

TEST_CASE("load_weights refuses a weights file with entries the model does not have, naming them",
          "[engine][checkpoint]") {
  TempDir dir;
  std::vector<Entry> entries = state_dict();
  entries.push_back({"model/head.weight", {2}, {1, 2}});
  write_file(dir / "extra.h5", entries);
  Net net;
  CHECK_THROWS_WITH(load_weights(dir / "extra.h5", net.model, core::Stream()),
                    Catch::Contains("/model/head.weight") && Catch::Contains("extra.h5") &&
                        Catch::Contains("unused"));
  // Many: the first eight by name, and how many more.
  for (int i = 0; i < 10; ++i) entries.push_back({"model/z" + std::to_string(i), {1}, {0}});
  write_file(dir / "extras.h5", entries);
  CHECK_THROWS_WITH(load_weights(dir / "extras.h5", net.model, core::Stream()),
                    Catch::Contains("11 of the file's entries are unused") &&
                        Catch::Contains("/model/head.weight") && Catch::Contains("/model/z6") &&
                        !Catch::Contains("/model/z7") && Catch::Contains("and 3 more"));
}

TEST_CASE("a partial load is allowed on request and reports what it skipped",
          "[engine][checkpoint]") {
  TempDir dir;
  std::vector<Entry> entries = without(state_dict(), "model/bn.running_var");
  entries.push_back({"model/head.weight", {2}, {1, 2}});
  write_file(dir / "partial.h5", entries);
  Net net;
  const WeightsLoadReport report = load_weights(dir / "partial.h5", net.model, core::Stream(),
                                                WeightsLoadOptions{.allow_partial = true});
  CHECK(report.partial());
  CHECK(report.missing == std::vector<std::string>{"bn.running_var"});
  CHECK(report.unused == std::vector<std::string>{"/model/head.weight"});
  CHECK(report.loaded.size() == 6);
  CHECK_THAT(report.summary(),
             Catch::Contains("partial load") && Catch::Contains("6 of the model's 7") &&
                 Catch::Contains("bn.running_var") && Catch::Contains("/model/head.weight"));
  CHECK(net.floats("bn.running_mean") == std::vector<float>{0.25f, -1.0f, 2.0f});
  CHECK(net.floats("bn.running_var") == std::vector<float>{1, 1, 1});  // as constructed
  CHECK(net.floats("fc.bias") == std::vector<float>{0.5f, -0.5f});
  // Sharing nothing with the model is refused even so.
  write_file(dir / "other.h5", {{"model/conv1.weight", {1}, {0}}});
  CHECK_THROWS_WITH(
      load_weights(dir / "other.h5", net.model, core::Stream(),
                   WeightsLoadOptions{.allow_partial = true}),
      Catch::Contains("none of the model's") && Catch::Contains("/model/conv1.weight"));
}

TEST_CASE("load_weights takes the float-only state_dict of earlier docs and says the count is kept",
          "[engine][checkpoint]") {
  // docs/models.md once wrote only floating-point entries: no num_batches_tracked.
  TempDir dir;
  write_file(dir / "floats.h5", without(state_dict(), "model/bn.num_batches_tracked"));
  Net net;
  const WeightsLoadReport report =
      load_weights(dir / "floats.h5", net.model, core::Stream(), WeightsLoadOptions{});
  CHECK_FALSE(report.partial());
  CHECK(report.kept_counters == std::vector<std::string>{"bn.num_batches_tracked"});
  CHECK_THAT(report.summary(), Catch::Contains("num_batches_tracked"));
  CHECK(net.batches_tracked() == 0);
  CHECK(net.floats("bn.running_var") == std::vector<float>{4.0f, 0.25f, 9.0f});
}

TEST_CASE("load_weights reads lockstep checkpoints as before, buffers included",
          "[engine][checkpoint]") {
  TempDir dir;
  Net saved;
  write_file(dir / "source.h5", state_dict());
  load_weights(dir / "source.h5", saved.model, core::Stream());
  ParameterStore store(saved.model, core::Device::cpu());
  SGD sgd(store, single_group(store, 0.1, 0.0), SgdOptions{.momentum = 0.9});
  const fs::path file = CheckpointDirectory(dir / "ckpt", 1, CheckpointStart::fresh)
                            .save(3, capture_checkpoint(saved.model, sgd, TrainingState{}, {}));
  // /model holds the parameters, /buffers the buffers, /optimizer is not weights.
  Net net;
  const WeightsLoadReport report =
      load_weights(file, net.model, core::Stream(), WeightsLoadOptions{});
  CHECK(report.loaded.size() == 7);
  CHECK(report.unused.empty());
  CHECK(net.floats("bn.running_var") == std::vector<float>{4.0f, 0.25f, 9.0f});
  CHECK(net.batches_tracked() == 7);
  CHECK(net.floats("fc.bias") == std::vector<float>{0.5f, -0.5f});
  // A buffer in both places is ambiguous.
  std::vector<Entry> both = state_dict();
  both.push_back({"buffers/bn.running_mean", {3}, {0, 0, 0}});
  write_file(dir / "both.h5", both);
  CHECK_THROWS_WITH(load_weights(dir / "both.h5", net.model, core::Stream()),
                    Catch::Contains("twice") && Catch::Contains("/buffers/bn.running_mean") &&
                        Catch::Contains("/model/bn.running_mean"));
}

TEST_CASE("load_weights takes a tied weight's second name when it holds the same values",
          "[engine][checkpoint]") {
  // GPT's head shares the token embedding's table; PyTorch's state_dict
  // lists it under both names (transformer.wte.weight and lm_head.weight).
  TempDir dir;
  Sequential model;
  auto& wte = model.emplace<Embedding>("wte", 4, 2);
  model.emplace<Linear>("head", wte.weight(), false);
  model.assign_names();
  const std::vector<double> table{1, 2, 3, 4, 5, 6, 7, 8};
  write_file(dir / "tied.h5",
             {{"model/wte.weight", {4, 2}, table}, {"model/head.weight", {4, 2}, table}});
  load_weights(dir / "tied.h5", model, core::Stream());
  CHECK(wte.weight().value.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
  std::vector<double> other = table;
  other[5] = 0.5;
  write_file(dir / "untied.h5",
             {{"model/wte.weight", {4, 2}, table}, {"model/head.weight", {4, 2}, other}});
  CHECK_THROWS_WITH(load_weights(dir / "untied.h5", model, core::Stream()),
                    Catch::Contains("/model/head.weight is tied to /model/wte.weight") &&
                        Catch::Contains("untied.h5"));
}
