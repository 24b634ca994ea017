// Tensor and its overflow-checked sizes, memory accounting, device parsing, the version check and
// the Generator, on the CPU.
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/log.h"
#include "engine/core/memory.h"
#include "engine/core/ops.h"
#include "engine/core/random.h"
#include "engine/core/tensor.h"
#include "engine/core/versions.h"
#include "kernels/philox.h"

using namespace lockstep;
using namespace lockstep::core;

TEST_CASE("views share storage and stay inside it", "[core][tensor]") {
  Tensor flat = Tensor::zeros({10}, DType::f32);
  Tensor w = flat.view(2, {2, 3});
  w.fill_(5.0);
  const auto values = flat.to_vector<float>();
  CHECK(values == std::vector<float>{0, 0, 5, 5, 5, 5, 5, 5, 0, 0});
  CHECK(w.storage() == flat.storage());
  CHECK_THROWS_WITH(flat.view(8, {3}), Catch::Contains("[3]") && Catch::Contains("[10]"));
  CHECK_THROWS_AS(flat.view(-1, {1}), InvalidArgument);
}

TEST_CASE("typed access checks the dtype", "[core][tensor]") {
  Tensor t = Tensor::from_vector<std::int32_t>({1, 2, 3}, {3}, DType::i32);
  CHECK(t.data_as<std::int32_t>()[2] == 3);
  CHECK_THROWS_WITH(t.data_as<float>(), Catch::Contains("i32"));
  CHECK_THROWS_WITH((Tensor::from_vector<float>({1, 2}, {3}, DType::f32)), Catch::Contains("[3]"));
}

TEST_CASE("casts and copies round-trip", "[core][tensor]") {
  Tensor x = Tensor::from_vector<float>({0.5f, -2.0f, 1024.0f}, {3}, DType::f32);
  Tensor h = x.cast(DType::f16);
  CHECK(h.dtype() == DType::f16);
  CHECK(h.cast(DType::f32).to_vector<float>() == x.to_vector<float>());
  Tensor y = Tensor::empty({3}, DType::f32);
  y.copy_from(x);
  CHECK(y.to_vector<float>() == x.to_vector<float>());
  Tensor wrong = Tensor::empty({4}, DType::f32);
  CHECK_THROWS_WITH(wrong.copy_from(x), Catch::Contains("[3]") && Catch::Contains("[4]"));
}

TEST_CASE("matmul checks shapes and computes op(a) op(b)", "[core][ops]") {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32);
  Tensor b = Tensor::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2}, DType::f32);
  Tensor c = Tensor::zeros({2, 2}, DType::f32);
  ops::matmul(a, b, c);
  CHECK(c.to_vector<float>() == std::vector<float>{4, 5, 10, 11});
  ops::matmul(a, a, c, {.trans_b = true, .beta = 1.0f});  // c += a a^T
  CHECK(c.to_vector<float>() == std::vector<float>{18, 37, 42, 88});
  Tensor bad = Tensor::zeros({3, 3}, DType::f32);
  CHECK_THROWS_WITH(ops::matmul(a, a, bad), Catch::Contains("[2, 3]"));
}

TEST_CASE("memory statistics count current and peak bytes and allocations", "[core][memory]") {
  reset_peak_memory(Device::cpu());
  const MemoryStats before = memory_stats(Device::cpu());
  {
    Tensor big = Tensor::empty({1 << 20}, DType::f32);
    CHECK(memory_stats(Device::cpu()).current_bytes == before.current_bytes + (4u << 20));
    CHECK(reinterpret_cast<std::uintptr_t>(big.data()) % 64 == 0);
  }
  const MemoryStats after = memory_stats(Device::cpu());
  CHECK(after.current_bytes == before.current_bytes);
  CHECK(after.peak_bytes >= before.current_bytes + (4u << 20));
  CHECK(after.allocations == before.allocations + 1);  // one tensor; a view allocates nothing
  const Tensor small = Tensor::empty({8}, DType::f32);
  const Tensor view = small.view(2, {4});
  CHECK(memory_stats(Device::cpu()).allocations == before.allocations + 2);
}

TEST_CASE("the peak is split by the kind of each allocation's innermost scope", "[core][memory]") {
  // Note [memory kinds]: 1 MiB of parameters, then 2 MiB of activations with
  // 3 MiB of workspace inside their scope; the peak (6 MiB above the start)
  // holds all three, each under its own kind; after the scopes end the
  // thread allocates as `other` again.
  const auto at = [](MemoryKind k) { return static_cast<std::size_t>(k); };
  reset_peak_memory(Device::cpu());
  const MemoryStats before = memory_stats(Device::cpu());
  {
    MemoryKindScope parameters(MemoryKind::parameters);
    const Tensor p = Tensor::empty({1 << 18}, DType::f32);
    MemoryKindScope activations(MemoryKind::activations);
    const Tensor a = Tensor::empty({1 << 19}, DType::f32);
    {
      MemoryKindScope workspace(MemoryKind::workspace);
      const Tensor w = Tensor::empty({3 << 18}, DType::f32);
      CHECK(current_memory_kind() == MemoryKind::workspace);
    }
    CHECK(current_memory_kind() == MemoryKind::activations);
  }
  CHECK(current_memory_kind() == MemoryKind::other);
  const MemoryStats after = memory_stats(Device::cpu());
  CHECK(after.peak_bytes == before.current_bytes + (6u << 20));
  CHECK(after.peak_by_kind[at(MemoryKind::parameters)] ==
        before.peak_by_kind[at(MemoryKind::parameters)] + (1u << 20));
  CHECK(after.peak_by_kind[at(MemoryKind::activations)] ==
        before.peak_by_kind[at(MemoryKind::activations)] + (2u << 20));
  CHECK(after.peak_by_kind[at(MemoryKind::workspace)] ==
        before.peak_by_kind[at(MemoryKind::workspace)] + (3u << 20));
  std::size_t sum = 0;
  for (std::size_t bytes : after.peak_by_kind) sum += bytes;
  CHECK(sum == after.peak_bytes);  // one thread: the split is of one moment
  CHECK(std::string(memory_kind_name(MemoryKind::optimizer_state)) == "optimizer_state");
}

TEST_CASE("each kind's bytes now and its own peak since the reset", "[core][memory]") {
  // A kind's own peak can come at a moment that is not the overall peak:
  // 2 MiB of workspace freed, then 3 MiB of activations allocated.
  const auto at = [](MemoryKind k) { return static_cast<std::size_t>(k); };
  reset_peak_memory(Device::cpu());
  const MemoryStats before = memory_stats(Device::cpu());
  {
    MemoryKindScope workspace(MemoryKind::workspace);
    const Tensor w = Tensor::empty({1 << 19}, DType::f32);
  }
  MemoryKindScope activations(MemoryKind::activations);
  const Tensor a = Tensor::empty({3 << 18}, DType::f32);
  const MemoryStats after = memory_stats(Device::cpu());
  CHECK(after.current_by_kind[at(MemoryKind::activations)] ==
        before.current_by_kind[at(MemoryKind::activations)] + (3u << 20));
  CHECK(after.current_by_kind[at(MemoryKind::workspace)] ==
        before.current_by_kind[at(MemoryKind::workspace)]);
  CHECK(after.kind_peak_bytes[at(MemoryKind::workspace)] ==
        before.current_by_kind[at(MemoryKind::workspace)] + (2u << 20));
  CHECK(after.peak_by_kind[at(MemoryKind::workspace)] ==
        before.current_by_kind[at(MemoryKind::workspace)]);  // at the overall peak it was freed
  std::size_t now = 0;
  for (std::size_t bytes : after.current_by_kind) now += bytes;
  CHECK(now == after.current_bytes);
  reset_peak_memory(Device::cpu());
  CHECK(memory_stats(Device::cpu()).kind_peak_bytes[at(MemoryKind::workspace)] ==
        before.current_by_kind[at(MemoryKind::workspace)]);
}

TEST_CASE("devices parse and unusable GPUs are refused by name", "[core][device]") {
  CHECK(parse_device("cpu") == Device::cpu());
  CHECK(parse_device("cuda:3") == Device::cuda(3));
  CHECK_THROWS_WITH(parse_device("gpu0"), Catch::Contains("gpu0"));
  CHECK_THROWS_WITH(require_usable(Device::cuda(99)), Catch::Contains("cuda:99"));
  CHECK_THROWS_WITH(parse_log_level("loud"), Catch::Contains("loud"));
}

TEST_CASE("library versions: older major fails, older minor warns", "[core][versions]") {
  CHECK_FALSE(compare_library_version("NCCL", 22809, 22809));
  CHECK_FALSE(compare_library_version("NCCL", 22809, 22900));
  const auto warning = compare_library_version("cuBLASLt", 130100, 130002);
  REQUIRE(warning);
  CHECK_THAT(*warning, Catch::Contains("13.0.2") && Catch::Contains("13.1.0"));
  CHECK_THROWS_WITH(compare_library_version("cuDNN", 91900, 81000),
                    Catch::Contains("8.10.0") && Catch::Contains("9.19.0"));
}

TEST_CASE("a generator's state is all it takes to continue its stream", "[core][random]") {
  Generator g(1234);
  Tensor first = Tensor::empty({100}, DType::f32);
  g.normal(first);
  const GeneratorState saved = g.state();
  CHECK(saved.offset == 100);
  Tensor next = Tensor::empty({37}, DType::f32);
  g.uniform(next);
  Generator resumed;
  resumed.set_state(saved);
  Tensor again = Tensor::empty({37}, DType::f32);
  resumed.uniform(again);
  CHECK(again.to_vector<float>() == next.to_vector<float>());
  Tensor mask = Tensor::empty({5}, DType::u8);
  CHECK_THROWS_WITH(g.bernoulli_mask(mask, 1.5f), Catch::Contains("1.5"));
  CHECK_THROWS_WITH(g.uniform(mask), Catch::Contains("u8"));
}

TEST_CASE("size arithmetic from shapes refuses to overflow", "[core][tensor]") {
  constexpr std::int64_t big = std::int64_t{1} << 32;
  CHECK_THROWS_AS(checked_mul<std::int64_t>(big - 1, big + 1, "x"), InvalidArgument);  // 2^64 - 1
  CHECK_THROWS_WITH(checked_mul<std::int64_t>(big, big / 2, "element count"),
                    Catch::Contains("element count") && Catch::Contains("4294967296 * 2147483648"));
  CHECK(checked_mul<std::int64_t>(big / 2, big / 2 - 1, "x") == (big / 2) * (big / 2 - 1));
  CHECK_THROWS_AS(checked_mul<std::int64_t>(-1, 2, "x"), InvalidArgument);
  CHECK_THROWS_AS(checked_add<std::uint64_t>(~std::uint64_t{0}, 1, "offset"), InvalidArgument);
  CHECK(checked_add<std::uint64_t>(~std::uint64_t{0} - 1, 1, "offset") == ~std::uint64_t{0});

  // 2^21 x 2^21 x 2^21 elements is 2^63: one past the largest count.
  const Shape huge{1 << 21, 1 << 21, 1 << 21};
  CHECK_THROWS_WITH(shape_numel(huge), Catch::Contains("element count"));
  CHECK_THROWS_AS(Tensor::empty(huge, DType::f32), InvalidArgument);
  // 2^61 elements fit an i64 count, but not as f32 bytes.
  CHECK_THROWS_WITH(Tensor::empty({std::int64_t{1} << 61}, DType::f32),
                    Catch::Contains("tensor bytes"));
  CHECK_THROWS_WITH(shape_numel({4, -1}), Catch::Contains("negative"));
  Tensor t = Tensor::zeros({8}, DType::f32);
  CHECK_THROWS_AS(t.view(std::numeric_limits<std::int64_t>::max() - 2, {4}), InvalidArgument);
  CHECK_THROWS_AS(t.view(std::int64_t{1} << 62, {1}), InvalidArgument);
}
