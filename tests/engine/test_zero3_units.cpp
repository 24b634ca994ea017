// ZeRO-3's units and the store's layout for them (engine/zero3.h, Note
// [parameter units]): the default units, the alignment of each piece, and
// the refusal of units that are not one run of the ready order.
#include <catch2/catch.hpp>

#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/gpt.h"
#include "engine/nn/linear.h"
#include "engine/parameter_store.h"
#include "engine/zero3.h"

using namespace lockstep;
using namespace lockstep::engine;

TEST_CASE("the default units are the outermost Sequential's children with parameters",
          "[engine][zero]") {
  Sequential mlp;
  mlp.emplace<Linear>("fc1", 6, 40);
  mlp.emplace<GELU>("act");
  mlp.emplace<Linear>("fc2", 40, 4);
  const std::vector<Module*> units = default_units(mlp);
  REQUIRE(units.size() == 2);  // the GELU has no parameters
  CHECK(units[0] == mlp.children()[0]);
  CHECK(units[1] == mlp.children()[2]);

  // GPT's root is no Sequential: its blocks are the units, and the
  // embeddings, final norm and head are left resident.
  GPT gpt(GptConfig{.layers = 3, .heads = 2, .embed_dim = 16, .block_size = 8, .vocab = 11});
  const std::vector<Module*> blocks = default_units(gpt);
  REQUIRE(blocks.size() == 3);
  CHECK(blocks == gpt.blocks().children());
  ParameterStore store(gpt, core::Device::cpu(), {}, ParameterStore::Gradients::groups,
                       ParameterUnits{blocks, 3});
  int resident = 0;
  std::int64_t end = 0;
  for (const ParameterStore::Piece& piece : store.pieces()) {
    CHECK(piece.range.offset == end);  // the pieces tile the layout
    CHECK(piece.range.offset % (3 * 64) == 0);
    CHECK(piece.range.numel % (3 * 64) == 0);
    end = piece.range.offset + piece.range.numel;
    resident += piece.unit < 0 ? 1 : 0;
    for (std::size_t i = piece.first_slot; i < piece.end_slot; ++i) {
      const ParameterStore::Slot& s = store.slots()[i];
      CHECK(s.offset >= piece.range.offset);
      CHECK(s.offset + s.numel <= end);
      if (piece.unit >= 0)
        CHECK(s.parameter->name.rfind("transformer.h." + std::to_string(piece.unit) + ".", 0) == 0);
    }
  }
  CHECK(store.pieces().size() == 3 + static_cast<std::size_t>(resident));
  CHECK(resident >= 1);
  CHECK(end == (store.size() + 3 * 64 - 1) / (3 * 64) * (3 * 64));
}

namespace {

// Two Linears whose parameters report ready interleaved (a.weight,
// b.weight, a.bias, b.bias): neither child is one run of the ready order.
class Interleaved : public Module {
 public:
  Interleaved() : Module("Interleaved") {
    a_ = &add_child("a", std::make_unique<Linear>(4, 4));
    b_ = &add_child("b", std::make_unique<Linear>(4, 4));
  }
  void append_ready_order(std::vector<Parameter*>& out) override {
    const std::vector<Parameter*> a = a_->parameters(), b = b_->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      out.push_back(a[i]);
      out.push_back(b[i]);
    }
  }
  Module* a_;
  Module* b_;
};

}  // namespace

TEST_CASE("units that overlap or are not one run of the ready order are refused",
          "[engine][zero]") {
  Sequential outer;
  auto inner = std::make_unique<Sequential>();
  Sequential* block = inner.get();
  inner->emplace<Linear>("fc1", 4, 4);
  inner->emplace<Linear>("fc2", 4, 4);
  outer.add("block", std::move(inner));
  outer.emplace<Linear>("fc3", 4, 4);
  // The block and one of its layers: fc1's parameters in two units.
  CHECK_THROWS_WITH(
      ParameterStore(outer, core::Device::cpu(), {}, ParameterStore::Gradients::groups,
                     ParameterUnits{{block, block->children()[0]}, 2}),
      Catch::Contains("units must not nest or overlap"));
  CHECK_THROWS_WITH(ParameterStore(outer, core::Device::cpu(), {},
                                   ParameterStore::Gradients::groups, ParameterUnits{{block}, 0}),
                    Catch::Contains("Units::ranks is 0"));
  Interleaved split;
  CHECK_THROWS_WITH(
      ParameterStore(split, core::Device::cpu(), {}, ParameterStore::Gradients::groups,
                     ParameterUnits{{split.a_}, 2}),
      Catch::Contains("are not one run in ready order") && Catch::Contains("a.bias"));
}
