// Encoded-image shards: lockstep-shard images packs an image folder (and a
// list) undecoded in ImageFolder's order, h5py's lines in docs/data-format.md
// write the same layout (contiguous and chunked), and damaged offsets are
// refused naming the shard, the dataset and the values.
#include <fmt/core.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "io/dataset.h"
#include "io/encoded_shard_writer.h"
#include "io/shard_fixtures.h"
#include "io/shard_tool.h"
#include "kernels/error.h"

using namespace lockstep;
using namespace lockstep::io;
using test::run_shard_tool;
using test::TempDir;
namespace fs = std::filesystem;

namespace {

bool have_h5py() { return std::system("/usr/bin/python3 -c 'import h5py' 2>/dev/null") == 0; }

int run_python(const fs::path& script, const fs::path& dir) {
  return std::system(("/usr/bin/python3 " + script.string() + " " + dir.string()).c_str());
}

// A fake image file: the JPEG or PNG signature and then `seed`-dependent
// bytes (packing never decodes, so only the signature matters here).
std::string fake_image(bool png, int seed) {
  std::string bytes =
      png ? std::string("\x89PNG\r\n\x1a\n", 8) : std::string("\xFF\xD8\xFF\xE0", 4);
  for (int i = 0; i < 20 + 13 * seed; ++i)
    bytes.push_back(static_cast<char>((seed * 31 + i) % 256));
  return bytes;
}

void write_file(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string encoded(const Dataset& data, std::int64_t row) {
  std::vector<std::uint8_t> bytes;
  data.read_encoded(row, bytes);
  return {bytes.begin(), bytes.end()};
}

}  // namespace

TEST_CASE("lockstep-shard images packs an image folder undecoded in ImageFolder's order",
          "[io][tool][images]") {
  TempDir dir;
  // ImageFolder: classes are the sorted folder names (cat = 0, dog = 1);
  // within a class, files by (folder, name), any depth; other types skipped.
  const std::vector<std::pair<std::string, std::string>> files{
      {"src/dog/b.png", fake_image(true, 1)},
      {"src/dog/a.JPG", fake_image(false, 2)},
      {"src/cat/z.jpeg", fake_image(false, 3)},
      {"src/cat/deep/a.jpg", fake_image(false, 4)},
      {"src/cat/m.png", fake_image(true, 5)}};
  for (const auto& [name, bytes] : files) write_file(dir / name, bytes);
  write_file(dir / "src/cat/notes.txt", "not an image");
  // ImageFolder's order: cat/m.png, cat/z.jpeg, cat/deep/a.jpg, dog/a.JPG, dog/b.png.
  const std::vector<int> order{4, 2, 3, 1, 0};
  const std::vector<std::int64_t> labels{0, 0, 0, 1, 1};
  std::string log;
  REQUIRE(run_shard_tool(fmt::format("images --src {} --out {} --shards 2", (dir / "src").string(),
                                     (dir / "out").string()),
                         &log) == 0);
  CHECK_THAT(log, Catch::Contains("wrote 5 images") && Catch::Contains("2 classes") &&
                      Catch::Contains("1 files of other types skipped"));
  CHECK(test::file_text(dir / "out/classes.txt") == "cat\ndog\n");
  for (const bool force_hdf5 : {false, true}) {
    const Dataset data = Dataset::open(dir / "out", {.force_hdf5 = force_hdf5});
    REQUIRE(data.size() == 5);
    REQUIRE(data.shards().size() == 2);
    CHECK(data.shards()[0].rows == 2);  // shard i holds rows [i*N/S, (i+1)*N/S)
    CHECK(data.shards()[0].layout == (force_hdf5 ? ShardLayout::hdf5 : ShardLayout::contiguous));
    CHECK(data.format().encoded);
    CHECK(data.format().str() == "encoded images, labels i64");
    CHECK(data.labels() == labels);
    for (std::int64_t row = 0; row < 5; ++row)
      CHECK(encoded(data, row) == files[order[row]].second);
    std::vector<std::uint8_t> dst(16);
    CHECK_THROWS_AS(data.read_inputs(std::vector<std::int64_t>{0}, dst.data()), InvalidArgument);
  }

  // A list of paths: the class is the folder's name, the order the list's.
  std::ofstream(dir / "list.txt") << "src/dog/b.png\n" << (dir / "src/cat/m.png").string() << "\n";
  REQUIRE(run_shard_tool(fmt::format("images --src {} --out {}", (dir / "list.txt").string(),
                                     (dir / "listed").string())) == 0);
  const Dataset listed = Dataset::open(dir / "listed");
  CHECK(listed.labels() == std::vector<std::int64_t>{1, 0});
  CHECK(encoded(listed, 0) == files[0].second);

  // A file named as an image that is not one is refused by name.
  write_file(dir / "bad/cat/x.jpg", "GIF89a");
  CHECK(run_shard_tool(fmt::format("images --src {} --out {}", (dir / "bad").string(),
                                   (dir / "bad-out").string()),
                       &log) == 1);
  CHECK_THAT(log, Catch::Contains("bad/cat/x.jpg' does not start as a JPEG or PNG file does"));
  CHECK(run_shard_tool(fmt::format("images --src {} --out {} --shards 9", (dir / "src").string(),
                                   (dir / "nine").string()),
                       &log) == 1);
  CHECK_THAT(log, Catch::Contains("--shards 9 is more than the 5 images"));
}

TEST_CASE(
    "lockstep-shard images refuses an empty class, a class name that is not one line, "
    "and an empty image, naming each",
    "[io][tool][images]") {
  TempDir dir;
  std::string log;
  const auto shard = [&](const fs::path& src, const fs::path& out) {
    return run_shard_tool(fmt::format("images --src {} --out {}", src.string(), out.string()),
                          &log);
  };
  // An empty class folder (a file of another type does not fill it) would
  // renumber emu from 2 to 1: refused naming the folder, before any output.
  write_file(dir / "empty/cat/a.jpg", fake_image(false, 1));
  write_file(dir / "empty/dog/notes.txt", "not an image");
  write_file(dir / "empty/emu/b.png", fake_image(true, 2));
  CHECK(shard(dir / "empty", dir / "empty-out") == 1);
  CHECK_THAT(log, Catch::Contains("class folder '" + (dir / "empty/dog").string() +
                                  "' holds no .jpg, .jpeg or .png file") &&
                      Catch::Contains("torchvision's ImageFolder refuses it too"));
  CHECK(!fs::exists(dir / "empty-out"));

  // Names that are not one line of classes.txt, shown escaped as C escapes them.
  for (const auto& [name, escaped] : std::vector<std::pair<std::string, std::string>>{
           {"a\nb", R"("a\nb" holds the control character '\n')"},
           {"c\rd", R"("c\rd" holds the control character '\r')"},
           {"e\x01", R"("e\x01" holds the control character '\x01')"},
           {"e\x7F", R"("e\x7f" holds the control character '\x7f')"}}) {
    INFO(escaped);
    TempDir tree;
    write_file(tree / "src/cat/a.jpg", fake_image(false, 1));
    write_file(tree / "src" / name / "b.jpg", fake_image(false, 2));
    CHECK(shard(tree / "src", tree / "out") == 1);
    CHECK_THAT(log, Catch::Contains("class folder " + escaped));
    CHECK(!fs::exists(tree / "out/classes.txt"));
  }
  // In a list, an image's class is its folder's name: "." is none.
  write_file(dir / "listed/x.jpg", fake_image(false, 3));
  std::ofstream(dir / "listed/list.txt") << "./x.jpg\n";
  CHECK(shard(dir / "listed/list.txt", dir / "listed-out") == 1);
  CHECK_THAT(log, Catch::Contains("line 1: the class of './x.jpg' is its folder's name, \".\", "
                                  "which is not a folder's name"));

  // An empty image is named by its path, not by its row.
  write_file(dir / "zero/cat/a.jpg", fake_image(false, 1));
  write_file(dir / "zero/cat/b.jpg", "");
  CHECK(shard(dir / "zero", dir / "zero-out") == 1);
  CHECK_THAT(
      log, Catch::Contains("image '" + (dir / "zero/cat/b.jpg").string() + "' is empty (0 bytes)"));
}

TEST_CASE("a val split whose classes differ from its train split's is refused naming both",
          "[io][tool][images]") {
  // Splits sharded by the tool; the expected names are the folders made here.
  TempDir dir;
  const auto split = [&](const std::string& name, const std::vector<std::string>& classes) {
    for (std::size_t k = 0; k < classes.size(); ++k)
      write_file(dir / name / classes[k] / "a.jpg", fake_image(false, static_cast<int>(k)));
    REQUIRE(run_shard_tool(fmt::format("images --src {} --out {}", (dir / name).string(),
                                       (dir / (name + "-shards")).string())) == 0);
    return Dataset::open(dir / (name + "-shards"));
  };
  const Dataset train = split("train", {"cat", "dog", "emu"});
  CHECK(train.class_names() == std::vector<std::string>{"cat", "dog", "emu"});
  CHECK(train.class_names_file() == dir / "train-shards/classes.txt");
  CHECK_NOTHROW(
      check_same_classes(train, "--data T", split("same", {"cat", "dog", "emu"}), "--val-data V"));
  const std::string val_file = (dir / "other-shards/classes.txt").string();
  CHECK_THROWS_WITH(
      check_same_classes(train, "--data T", split("other", {"cat", "eel", "emu"}), "--val-data V"),
      Catch::Contains("--val-data V and --data T number their classes differently: class 1 is "
                      "\"eel\" in '" +
                      val_file + "' but \"dog\" in '" +
                      (dir / "train-shards/classes.txt").string() + "'"));
  CHECK_THROWS_WITH(
      check_same_classes(train, "--data T", split("fewer", {"cat", "dog"}), "--val-data V"),
      Catch::Contains("class 2 is missing from '" + (dir / "fewer-shards/classes.txt").string() +
                      "' (it names 2 classes) but \"emu\" in"));
  // Shards opened as files (or written by h5py, without classes.txt) name no classes.
  const Dataset files =
      Dataset::open(std::vector<fs::path>{dir / "other-shards/shard-00000-of-00001.h5"});
  CHECK(files.class_names().empty());
  CHECK_NOTHROW(check_same_classes(train, "--data T", files, "--val-data V"));
}

TEST_CASE("h5py's lines write the encoded-image layout lockstep reads", "[io][images][h5py]") {
  if (!have_h5py()) {
    WARN("Debian's python3-h5py is not installed: skipping the h5py-written shards");
    return;
  }
  TempDir dir;
  // The lines of docs/data-format.md, on two fake files; a chunked copy
  // (h5py's choice with compression) is read through HDF5.
  std::ofstream(dir / "make.py") << R"(import sys, h5py, numpy as np
out = sys.argv[1]
files = [b'\xff\xd8\xff' + bytes(range(40)), b'\x89PNG\r\n\x1a\n' + bytes(range(7))]
labels = [3, 1]
offsets = np.cumsum([0] + [len(b) for b in files])
with h5py.File(out + '/a.h5', 'w') as f:
    f['inputs'] = np.frombuffer(b''.join(files), dtype='uint8')
    f['offsets'] = offsets.astype('int64')
    f['labels'] = np.asarray(labels, dtype='int64')
with h5py.File(out + '/chunked.h5', 'w') as f:
    f.create_dataset('inputs', data=np.frombuffer(b''.join(files), dtype='uint8'), compression='gzip')
    f['offsets'] = offsets.astype('int64')
    f['labels'] = np.asarray(labels, dtype='int32')
)";
  REQUIRE(run_python(dir / "make.py", dir.path()) == 0);
  for (const char* name : {"a.h5", "chunked.h5"}) {
    const Dataset data = Dataset::open(dir / name);
    CHECK(data.shards()[0].layout ==
          (std::string(name) == "a.h5" ? ShardLayout::contiguous : ShardLayout::hdf5));
    REQUIRE(data.size() == 2);
    CHECK(data.labels() == std::vector<std::int64_t>{3, 1});
    std::string first("\xff\xd8\xff", 3);
    for (int i = 0; i < 40; ++i) first.push_back(static_cast<char>(i));
    CHECK(encoded(data, 0) == first);
    CHECK(encoded(data, 1).size() == 15);
  }
}

TEST_CASE("damaged offsets of an encoded-image shard are refused with their values",
          "[io][images][errors]") {
  if (!have_h5py()) {
    WARN("Debian's python3-h5py is not installed: skipping the damaged shards");
    return;
  }
  TempDir dir;
  std::ofstream(dir / "make.py") << R"(import sys, h5py, numpy as np
out = sys.argv[1]
def shard(name, inputs, offsets, labels=(0, 1), dtype='uint8'):
    with h5py.File(out + '/' + name, 'w') as f:
        f['inputs'] = np.asarray(inputs, dtype=dtype)
        f['offsets'] = np.asarray(offsets, dtype='int64')
        if labels is not None: f['labels'] = np.asarray(labels, dtype='int64')
shard('start.h5', range(10), [2, 5, 10])
shard('backwards.h5', range(10), [0, 6, 5])
shard('past.h5', range(10), [0, 5, 1 << 62])
shard('short.h5', range(10), [0, 10])
shard('end.h5', range(10), [0, 5, 9])
shard('huge.h5', range(10), [0, -(1 << 62), 10])
shard('nolabels.h5', range(10), [0, 5, 10], labels=None)
shard('f32.h5', range(10), [0, 5, 10], dtype='float32')
)";
  REQUIRE(run_python(dir / "make.py", dir.path()) == 0);
  const std::vector<std::pair<const char*, const char*>> cases{
      {"start.h5", "dataset 'offsets': starts at 2"},
      {"backwards.h5", "row 1 spans bytes [6, 5)"},
      {"past.h5", "row 1 spans bytes [5, 4611686018427387904)"},
      {"short.h5", "has shape [2], but 'labels' has 2 rows"},
      {"end.h5", "ends at 9, but 'inputs' holds 10 bytes"},
      {"huge.h5", "row 0 spans bytes [0, -4611686018427387904)"},
      {"nolabels.h5", "no 'labels'"},
      {"f32.h5", "is f32 [10]; an encoded-image shard's inputs are the files' bytes"}};
  for (const auto& [name, message] : cases) {
    INFO(name);
    CHECK_THROWS_WITH(Dataset::open(dir / name),
                      Catch::Contains(std::string(name) + "'") && Catch::Contains(message));
  }
}

TEST_CASE("an encoded shard writer checks each image against the sizes it was given",
          "[io][images]") {
  TempDir dir;
  const std::vector<std::int64_t> sizes{3, 2};
  {
    EncodedShardWriter writer(dir / "s.h5", sizes);
    const std::vector<std::uint8_t> wrong(4, 1);
    CHECK_THROWS_WITH(writer.append(wrong, 0), Catch::Contains("image 0 has 4 bytes, but the "
                                                               "writer was told 3"));
    CHECK_THROWS_AS(writer.close(), InvalidArgument);  // 0 of 2 images
  }
  CHECK(!fs::exists(dir / "s.h5"));
  CHECK(!fs::exists(dir / "s.h5.tmp"));
  const std::vector<std::int64_t> empty_image{0};
  CHECK_THROWS_WITH(EncodedShardWriter(dir / "e.h5", empty_image),
                    Catch::Contains("image 0 has 0 bytes"));
}
