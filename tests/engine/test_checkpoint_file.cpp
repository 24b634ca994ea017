// Checkpoint files: round trip, the commit sequence's guarantees, corruption
// caught before HDF5 opens a file, keep-last pruning, and h5py reading ours.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/checkpoint_file.h"
#include "kernels/error.h"

using namespace lockstep;
using namespace lockstep::engine;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("lockstep-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

CheckpointContents sample(float base) {
  CheckpointContents c;
  c.tensors["/model/fc1.weight"] = core::Tensor::from_vector<float>(
      {base, base + 1, base + 2, base + 3, base + 4, base + 5}, {2, 3}, DType::f32);
  c.tensors["/buffers/bn.num_batches_tracked"] =
      core::Tensor::from_vector<std::int64_t>({7}, {}, DType::i64);
  c.tensors["/optimizer/fc1.weight/momentum_buffer"] = core::Tensor::zeros({2, 3}, DType::f32);
  c.attributes["step"] = std::int64_t{12};
  c.attributes["lr"] = 0.05;
  c.attributes["precision"] = std::string("bf16");
  return c;
}

void flip_byte(const fs::path& file, std::uintmax_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("a checkpoint reads back what was written", "[engine][checkpoint]") {
  const fs::path dir = fresh_dir("roundtrip");
  const fs::path file = CheckpointDirectory(dir, 3, CheckpointStart::fresh).save(12, sample(1.0f));
  CHECK(file.filename() == "ckpt-12.h5");
  const CheckpointContents back = read_checkpoint(file);
  REQUIRE(back.tensors.size() == 3);
  CHECK(back.tensors.at("/model/fc1.weight").shape() == core::Shape{2, 3});
  CHECK(back.tensors.at("/model/fc1.weight").to_vector<float>() ==
        std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(back.tensors.at("/buffers/bn.num_batches_tracked").to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{7});
  CHECK(std::get<std::int64_t>(back.attributes.at("step")) == 12);
  CHECK(std::get<double>(back.attributes.at("lr")) == 0.05);
  CHECK(std::get<std::string>(back.attributes.at("precision")) == "bf16");
  const auto model = read_group(file, "/model");
  CHECK(model.count("fc1.weight") == 1);
  fs::remove_all(dir);
}

TEST_CASE("only the last K checkpoints are kept and no temporaries remain",
          "[engine][checkpoint]") {
  const fs::path dir = fresh_dir("keep");
  CheckpointDirectory ckpts(dir, 2, CheckpointStart::fresh);
  for (int step : {10, 20, 30}) ckpts.save(step, sample(static_cast<float>(step)));
  const auto all = ckpts.list();
  REQUIRE(all.size() == 2);
  CHECK(all[0].filename() == "ckpt-20.h5");
  CHECK(all[1].filename() == "ckpt-30.h5");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++files;
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  }
  CHECK(files == 4);  // two checkpoints, two checksum files
  fs::remove_all(dir);
}

TEST_CASE("a damaged checkpoint is refused by name and the previous one is used",
          "[engine][checkpoint]") {
  const fs::path dir = fresh_dir("damage");
  CheckpointDirectory ckpts(dir, 5, CheckpointStart::fresh);
  ckpts.save(1, sample(1));
  const fs::path second = ckpts.save(2, sample(2));
  const fs::path third = ckpts.save(3, sample(3));
  flip_byte(third, fs::file_size(third) / 2);
  CHECK_THROWS_WITH(read_checkpoint(third),
                    Catch::Contains("ckpt-3.h5") && Catch::Contains("corrupt"));
  fs::resize_file(second, fs::file_size(second) / 2);  // truncated
  CHECK_THROWS_AS(verify_checkpoint(second), IoError);
  CHECK(ckpts.latest_good()->filename() == "ckpt-1.h5");
  fs::remove(fs::path(dir / "ckpt-1.h5.crc32"));  // cut short before its checksum
  CHECK_THROWS_WITH(verify_checkpoint(dir / "ckpt-1.h5"), Catch::Contains("no valid checksum"));
  CHECK_FALSE(ckpts.latest_good().has_value());
  CHECK_THROWS_WITH(read_group(dir / "missing.h5", "/model"), Catch::Contains("missing.h5"));
  fs::remove_all(dir);
}

TEST_CASE("h5py reads a checkpoint by parameter name", "[engine][checkpoint]") {
  if (!fs::exists("/usr/bin/python3") ||
      std::system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") != 0) {
    WARN("Debian's python3-h5py is not installed: skipping the h5py cross-check");
    return;
  }
  const fs::path dir = fresh_dir("h5py");
  const fs::path file = CheckpointDirectory(dir, 1, CheckpointStart::fresh).save(5, sample(0.5f));
  const std::string cmd =
      "/usr/bin/python3 -c \"import h5py; f = h5py.File('" + file.string() +
      "', 'r'); w = f['model']['fc1.weight'][()]; "
      "assert w.shape == (2, 3) and abs(w[1, 2] - 5.5) < 1e-6; "
      "assert f.attrs['step'] == 12 and f.attrs['precision'] in (b'bf16', 'bf16')\"";
  CHECK(std::system(cmd.c_str()) == 0);
  fs::remove_all(dir);
}
