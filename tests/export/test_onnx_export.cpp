// Unit tests of engine::export_onnx: what it refuses (a module without a
// mapping, options out of range), a user's mapping through the public
// interface, and the graph's structure read back with the ONNX schema
// (initializer names and types, the tied head stored once). The numbers are
// checked against ONNX Runtime by check_onnx.py.
#include <onnx/onnx_pb.h>

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "engine/checkpoint.h"
#include "engine/checkpoint_file.h"
#include "engine/export/onnx_export.h"
#include "engine/models.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/optim/sgd.h"
#include "engine/parameter_store.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

// A user's layer: y = -x.
class Negate : public Module {
 public:
  explicit Negate(std::string type = "Negate") : Module(std::move(type)) {}
  core::Tensor forward(const core::Tensor& x, Context&) override { return x; }
  core::Tensor backward(const core::Tensor& dy, Context&) override { return dy; }
};

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("lockstep-test-onnx-" + std::to_string(::getpid()) + "-" + name);
}

onnx::ModelProto read_model(const std::filesystem::path& path) {
  onnx::ModelProto m;
  std::ifstream in(path, std::ios::binary);
  REQUIRE(m.ParseFromIstream(&in));
  return m;
}

std::unique_ptr<Sequential> mlp_with(std::unique_ptr<Module> custom) {
  auto net = std::make_unique<Sequential>();
  net->emplace<Linear>("fc1", 4, 3);
  net->add("custom", std::move(custom));
  net->emplace<Linear>("fc2", 3, 2);
  net->assign_names();
  initialize(*net, 1);
  return net;
}

ExportOptions features(std::int64_t n) {
  ExportOptions o;
  o.sample_shape = {n};
  return o;
}

}  // namespace

TEST_CASE("export refuses a module without a mapping, naming it", "[export]") {
  auto net = mlp_with(std::make_unique<Negate>("Unmapped"));
  const auto path = temp_file("unmapped.onnx");
  CHECK_THROWS_WITH(export_onnx(*net, path, features(4)),
                    Catch::Contains("Unmapped 'custom' has no ONNX mapping") &&
                        Catch::Contains("register_onnx_mapping"));
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp"));
}

TEST_CASE("a user's mapping exports through the same interface as the built-ins", "[export]") {
  register_onnx_mapping("Negate", [](Module&, const OnnxValue& x, OnnxGraph& g) {
    return g.op("Neg", {x.name}, x.dtype, x.shape);
  });
  CHECK(has_onnx_mapping("Negate"));
  auto net = mlp_with(std::make_unique<Negate>());
  const auto path = temp_file("negate.onnx");
  export_onnx(*net, path, features(4));
  const onnx::ModelProto m = read_model(path);
  std::vector<std::string> ops, names;
  for (const auto& n : m.graph().node()) {
    ops.push_back(n.op_type());
    names.push_back(n.name());
  }
  // The model's forward order: Gemm (fc1), the user's Neg, Gemm (fc2), the output.
  CHECK(ops == std::vector<std::string>{"Gemm", "Neg", "Gemm", "Identity"});
  CHECK_THAT(names[1], Catch::Contains("custom/Neg"));
  CHECK(m.graph().input(0).type().tensor_type().shape().dim(0).dim_param() == "batch");
  std::filesystem::remove(path);
}

TEST_CASE("export refuses opsets outside 17..21 and precisions other than f32 and f16",
          "[export]") {
  auto net = make_model("mlp");
  ExportOptions o;
  o.sample_shape = {1, 28, 28};
  const auto path = temp_file("opset.onnx");
  for (int opset : {16, 22}) {
    o.opset = opset;
    CHECK_THROWS_WITH(export_onnx(*net, path, o),
                      Catch::Contains("opset " + std::to_string(opset) + " is outside 17..21"));
  }
  o.opset = kOnnxDefaultOpset;
  o.precision = DType::bf16;
  CHECK_THROWS_WITH(export_onnx(*net, path, o), Catch::Contains("precision bf16"));
  o.precision = DType::f32;
  o.sample_shape = {1, 28, 27};
  CHECK_THROWS_WITH(export_onnx(*net, path, o),
                    Catch::Contains("Linear 'fc1'") && Catch::Contains("784"));
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("initializers carry the parameter names, the tied head is stored once", "[export]") {
  auto gpt = make_model("gpt-tiny");
  initialize(*gpt, 3);
  ExportOptions o;
  o.sample_shape = {128};
  o.input_dtype = DType::i64;
  o.dynamic_sequence = true;
  o.precision = DType::f16;
  const auto path = temp_file("gpt.onnx");
  export_onnx(*gpt, path, o);
  const onnx::ModelProto m = read_model(path);
  std::set<std::string> parameter_names;  // independent: the model's own list
  for (Parameter* p : gpt->parameters()) parameter_names.insert(p->name);
  std::set<std::string> initializers;
  for (const auto& t : m.graph().initializer()) {
    if (parameter_names.count(t.name())) {
      CHECK(t.data_type() == onnx::TensorProto::FLOAT16);
      CHECK(initializers.insert(t.name()).second);  // once each
    }
  }
  CHECK(initializers == parameter_names);
  CHECK(parameter_names.count("transformer.wte.weight") == 1);
  CHECK(m.graph().input(0).type().tensor_type().shape().dim(1).dim_param() == "seq");
  CHECK(m.opset_import(0).version() == 17);
  std::filesystem::remove(path);
}

TEST_CASE("an f16 export refuses a weight beyond f16's range, naming it", "[export]") {
  auto net = mlp_with(std::make_unique<Sequential>());
  Parameter* weight = net->parameters().front();
  REQUIRE(weight->name == "fc1.weight");
  weight->value.data_as<float>()[5] = 1e5f;  // f16's largest finite value is 65504
  ExportOptions o = features(4);
  const auto path = temp_file("overflow.onnx");
  CHECK_NOTHROW(export_onnx(*net, path, o));  // f32 holds it
  o.precision = DType::f16;
  CHECK_THROWS_WITH(export_onnx(*net, path, o),
                    Catch::Contains("'fc1.weight' element 5") && Catch::Contains("65504"));
  std::filesystem::remove(path);
}

TEST_CASE("a checkpoint of another preset is refused before anything is exported", "[export]") {
  // What lockstep-export does: load the checkpoint into the named preset.
  auto mlp = make_model("mlp");
  initialize(*mlp, 2);
  ParameterStore store(*mlp, core::Device::cpu());
  SGD sgd(store, single_group(store, 0.1, 0.0));
  const auto dir = temp_file("ckpt");
  const CheckpointDirectory checkpoints(dir, 1, CheckpointStart::fresh);
  const auto file = checkpoints.save(0, capture_checkpoint(*mlp, sgd, TrainingState{}, {}));
  auto cnn = make_model("cnn");
  CHECK_THROWS_WITH(load_weights(file, *cnn, {}), Catch::Contains("conv1.weight"));
  auto resnet = make_model("resnet");
  CHECK_THROWS_WITH(load_weights(file, *resnet, {}), Catch::Contains("conv1.weight"));
  auto same = make_model("mlp");
  CHECK_NOTHROW(load_weights(file, *same, {}));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a model with activation checkpointing exports the plain model's graph", "[export]") {
  // Checkpointed changes how backward runs, not what forward computes: the
  // graph, node names and initializers included, is the same bytes.
  for (const std::string name : {"gpt-tiny", "resnet"}) {
    INFO(name);
    const ModelPreset& preset = model_preset(name);
    ExportOptions o;
    o.sample_shape = preset.sample_shape;
    if (preset.language_model) o.input_dtype = DType::i64;
    std::string graphs[2];
    for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
      auto model = make_model(name, ModelOptions{.activation_checkpointing = checkpointed == 1});
      initialize(*model, 3);
      const auto path = temp_file(name + std::to_string(checkpointed) + ".onnx");
      export_onnx(*model, path, o);
      graphs[checkpointed] = read_model(path).graph().SerializeAsString();
      std::filesystem::remove(path);
    }
    CHECK(graphs[1] == graphs[0]);
  }
}

TEST_CASE("a channels-last model exports the NCHW model's graph", "[export][channels_last]") {
  // Note [channels-last layers]: the layout is how the layers run, not what
  // the model computes on its NCHW input: the same graph, bytes and all.
  for (const std::string name : {"resnet", "resnet50"}) {
    INFO(name);
    ExportOptions o;
    o.sample_shape = name == "resnet" ? core::Shape{3, 32, 32} : core::Shape{3, 64, 64};
    std::string graphs[2];
    for (int channels_last = 0; channels_last < 2; ++channels_last) {
      auto model =
          make_model(name, ModelOptions{.width_divisor = 16, .channels_last = channels_last == 1});
      initialize(*model, 3);
      const auto path = temp_file(name + "-layout" + std::to_string(channels_last) + ".onnx");
      export_onnx(*model, path, o);
      graphs[channels_last] = read_model(path).graph().SerializeAsString();
      std::filesystem::remove(path);
    }
    CHECK(graphs[1] == graphs[0]);
  }
}

TEST_CASE("preprocessing becomes the graph's first nodes: Div 255, Sub mean, Div std", "[export]") {
  // Note [preprocessing in the graph]: the nodes and constants are compared
  // with the values given, read back from the file (exact: f32 constants).
  auto cnn = make_model("cnn");
  initialize(*cnn, 1);
  ExportOptions o;
  o.sample_shape = {1, 28, 28};
  o.input_divisor = 255.0f;
  o.mean = {0.5f};
  o.std = {0.25f};
  const auto path = temp_file("preprocessed.onnx");
  export_onnx(*cnn, path, o);
  const onnx::ModelProto model = read_model(path);
  std::filesystem::remove(path);
  auto constant = [&](const std::string& name) {
    for (const onnx::TensorProto& t : model.graph().initializer())
      if (t.name() == name) {
        std::vector<float> v(t.raw_data().size() / sizeof(float));
        std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
        return v;
      }
    FAIL("no initializer " << name);
    return std::vector<float>{};
  };
  const auto& nodes = model.graph().node();
  REQUIRE(nodes.size() > 3);
  CHECK(nodes[0].op_type() == "Div");
  CHECK(nodes[0].input(0) == "input");
  CHECK(constant(nodes[0].input(1)) == std::vector<float>{255.0f});
  CHECK(nodes[1].op_type() == "Sub");
  CHECK(nodes[1].input(0) == nodes[0].output(0));
  CHECK(constant(nodes[1].input(1)) == std::vector<float>{0.5f});
  CHECK(nodes[2].op_type() == "Div");
  CHECK(constant(nodes[2].input(1)) == std::vector<float>{0.25f});
  CHECK(nodes[3].input(0) == nodes[2].output(0));
}

TEST_CASE("preprocessing that cannot apply to the input is refused naming it", "[export]") {
  auto cnn = make_model("cnn");
  initialize(*cnn, 1);
  ExportOptions o;
  o.sample_shape = {1, 28, 28};
  const auto path = temp_file("refused-preprocessing.onnx");
  o.mean = {0.5f, 0.4f, 0.3f};  // 3 channels for a 1-channel sample
  o.std = {0.2f, 0.2f, 0.2f};
  CHECK_THROWS_WITH(export_onnx(*cnn, path, o),
                    Catch::Contains("3 means and 3 stds") && Catch::Contains("[1, 28, 28]"));
  o.mean = {0.5f};
  o.std = {0.0f};
  CHECK_THROWS_WITH(export_onnx(*cnn, path, o), Catch::Contains("std 0"));
  o.std = {0.5f};
  o.input_divisor = -1.0f;
  CHECK_THROWS_WITH(export_onnx(*cnn, path, o), Catch::Contains("input_divisor -1"));
  auto gpt = make_model("gpt-tiny");
  ExportOptions tokens;
  tokens.sample_shape = {16};
  tokens.input_dtype = DType::i64;
  tokens.input_divisor = 255.0f;
  CHECK_THROWS_WITH(export_onnx(*gpt, path, tokens), Catch::Contains("for float inputs"));
  CHECK_FALSE(std::filesystem::exists(path));
}
