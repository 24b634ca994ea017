// Every bad input the reader can meet gives its own lockstep::Error naming the
// file and the dataset: no shards, unreadable, truncated or corrupt files,
// missing datasets, inputs and labels of different length, dtype or shape
// differing across shards, unsupported dtypes, labels out of range, targets
// out of binary cross-entropy's range.
#include <catch2/catch.hpp>

#include <fmt/core.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "io/dataset.h"
#include "io/hdf5.h"
#include "io/shard_fixtures.h"

using namespace lockstep;
using namespace lockstep::io;
using test::TempDir;
namespace fs = std::filesystem;

namespace {

void flip_bytes(const fs::path& path, std::uint64_t offset, int count) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  for (int i = 0; i < count; ++i) {
    file.seekg(static_cast<std::streamoff>(offset + i));
    const char c = static_cast<char>(file.get() ^ 0xff);
    file.seekp(static_cast<std::streamoff>(offset + i));
    file.put(c);
  }
}

std::uint64_t object_header_address(const fs::path& path, const char* name) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  H5O_info_t info;
  H5Oget_info_by_name(file, name, &info, H5P_DEFAULT);
  H5Fclose(file);
  return info.addr;
}

// A file's bytes, and where the body of the first message of `type` lies in
// the (version 1) object header of dataset `name`: 0 if it has none.
struct HeaderMessage {
  std::vector<char> bytes;
  std::uint64_t body = 0;
};
HeaderMessage find_message(const fs::path& path, const char* name, unsigned char type) {
  HeaderMessage found{std::vector<char>(fs::file_size(path))};
  std::ifstream(path, std::ios::binary).read(found.bytes.data(), found.bytes.size());
  const std::vector<char>& bytes = found.bytes;
  for (std::uint64_t at = object_header_address(path, name) + 16;
       at + 8 < bytes.size() && found.body == 0;) {
    const auto length =
        static_cast<unsigned char>(bytes[at + 2]) | static_cast<unsigned char>(bytes[at + 3]) << 8;
    if (static_cast<unsigned char>(bytes[at]) == type) found.body = at + 8;
    at += 8 + length;
  }
  return found;
}

// A shard with only the datasets given (name, dtype, shape).
struct Part {
  const char* name;
  DType type;
  core::Shape shape;
};
void write_parts(const fs::path& path, std::initializer_list<Part> parts) {
  const hid_t file = test::create_file(path, {});
  for (const Part& p : parts) {
    std::vector<std::uint8_t> zeros(core::shape_numel(p.shape) * dtype_size(p.type));
    test::write_dataset(file, p.name, p.type, p.shape, zeros.data(), {});
  }
  H5Fclose(file);
}

template <typename E>
void require_error(const fs::path& path, std::initializer_list<std::string> fragments) {
  try {
    Dataset::open(path);
    FAIL("no error opening " << path);
  } catch (const E& e) {
    for (const std::string& f : fragments) CHECK_THAT(e.what(), Catch::Contains(f));
  }
}

}  // namespace

TEST_CASE("a missing path or a directory without shards is an IoError", "[io][errors]") {
  TempDir dir;
  require_error<IoError>(dir / "nowhere", {"does not exist", "nowhere"});
  std::ofstream(dir / "readme.txt") << "not a shard";
  require_error<IoError>(dir.path(), {"no shards", dir.path().string(), "lockstep-shard"});
  CHECK_THROWS_AS(Dataset::open(std::vector<fs::path>{}), IoError);
  fs::create_directory(dir / "folder.h5");
  CHECK_THROWS_WITH(Dataset::open(std::vector<fs::path>{dir / "folder.h5"}),
                    Catch::Contains("not a regular file"));
}

TEST_CASE("a file that is not HDF5, truncated or corrupt names itself", "[io][errors]") {
  TempDir dir;
  std::ofstream(dir / "text.h5") << "hello";
  require_error<IoError>(dir / "text.h5", {"text.h5", "not an HDF5 file"});

  test::write_shard(dir / "good.h5", 0, 200, {64}, DType::u8);
  const auto size = fs::file_size(dir / "good.h5");

  fs::copy_file(dir / "good.h5", dir / "cut.h5");
  fs::resize_file(dir / "cut.h5", size / 2);
  require_error<IoError>(dir / "cut.h5", {"cut.h5", "truncated", "re-create"});

  fs::copy_file(dir / "good.h5", dir / "signature.h5");
  flip_bytes(dir / "signature.h5", 1, 3);
  require_error<IoError>(dir / "signature.h5", {"signature.h5", "not an HDF5 file"});

  fs::copy_file(dir / "good.h5", dir / "header.h5");
  flip_bytes(dir / "header.h5", object_header_address(dir / "header.h5", "inputs"), 16);
  require_error<IoError>(dir / "header.h5",
                         {"header.h5", "object header of 'inputs'", "re-create"});
}

TEST_CASE("a damaged superblock is refused before HDF5 opens the file", "[io][errors]") {
  TempDir dir;
  test::write_shard(dir / "good.h5", 0, 20, {4}, DType::u8);  // superblock version 0
  const auto size = fs::file_size(dir / "good.h5");
  const auto patched = [&](const char* name, std::uint64_t at, std::vector<unsigned char> bytes) {
    fs::copy_file(dir / "good.h5", dir / name);
    std::fstream file(dir / name, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(at));
    file.write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return dir / name;
  };
  // Version 0: version at byte 8, address and length sizes at 13 and 14, the
  // end-of-file address at 40, the root group's object header address at 64.
  const auto le64 = [](std::uint64_t v) {
    std::vector<unsigned char> b(8);
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    return b;
  };
  require_error<IoError>(patched("version.h5", 8, {9}), {"version.h5", "superblock version 9"});
  require_error<IoError>(patched("offsets.h5", 13, {4}), {"4-byte addresses"});
  require_error<IoError>(patched("eof.h5", 40, le64(size + 4096)), {"eof.h5", "truncated"});
  require_error<IoError>(patched("root.h5", 64, le64(size * 2)), {"root group at address"});
  require_error<IoError>(patched("before.h5", 40, le64(0)), {"before its superblock"});
  // The root group's local heap (its address at byte 88): a data segment of
  // 96 GB, which HDF5 1.10 would allocate before reading (found by fuzzing).
  std::uint64_t heap = 0;
  {
    std::ifstream file(dir / "good.h5", std::ios::binary);
    file.seekg(88);
    file.read(reinterpret_cast<char*>(&heap), 8);
  }
  require_error<IoError>(patched("heap.h5", heap + 8, le64(std::uint64_t{96} << 30)),
                         {"heap.h5", "root group heap"});
  require_error<IoError>(patched("heap_sig.h5", heap, {'H', 'E', 'A', 'X'}), {"local heap"});
  fs::copy_file(dir / "good.h5", dir / "short.h5");
  fs::resize_file(dir / "short.h5", 30);
  require_error<IoError>(dir / "short.h5", {"short.h5", "ends inside its superblock"});
  CHECK_NOTHROW(Dataset::open(dir / "good.h5"));
}

TEST_CASE("a damaged group B-tree is refused before HDF5 reads it", "[io][errors]") {
  // Note [group trees] (io/hdf5_format_check.cpp). The root group's B-tree
  // address is at byte 80 of a version 0 superblock; in the tree node, the
  // entry count is at +6 and the first child (a symbol node) at +32; in that
  // symbol node, the entry count at +6 and the first entry's object header
  // address at +16.
  TempDir dir;
  test::write_shard(dir / "good.h5", 0, 20, {4}, DType::u8);
  const auto size = fs::file_size(dir / "good.h5");
  const auto read_u64 = [&](std::uint64_t at) {
    std::uint64_t v = 0;
    std::ifstream file(dir / "good.h5", std::ios::binary);
    file.seekg(static_cast<std::streamoff>(at));
    file.read(reinterpret_cast<char*>(&v), 8);
    return v;
  };
  const auto patched = [&](const char* name, std::uint64_t at, std::uint64_t value, int bytes) {
    fs::copy_file(dir / "good.h5", dir / name);
    std::fstream file(dir / name, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(at));
    file.write(reinterpret_cast<const char*>(&value), bytes);
    return dir / name;
  };
  const std::uint64_t tree = read_u64(80), symbols = read_u64(tree + 32);
  // The undefined address: HDF5 1.10 read it through a NULL buffer (a SEGV).
  require_error<IoError>(patched("undefined.h5", tree + 32, ~std::uint64_t{0}, 8),
                         {"undefined.h5", "damaged symbol node at address 18446744073709551615",
                          "the root group", "re-create it"});
  require_error<IoError>(patched("children.h5", tree + 6, 0xffff, 2),
                         {"children.h5", "B-tree node", "65535 children, above 32"});
  require_error<IoError>(patched("entries.h5", symbols + 6, 0xffff, 2),
                         {"entries.h5", "65535 entries, above 2 * 4"});
  require_error<IoError>(patched("header.h5", symbols + 16, size * 2, 8),
                         {"header.h5", fmt::format("an object header at address {}", size * 2)});
  require_error<IoError>(patched("cycle.h5", tree + 5, 1, 1), {"cycle.h5", "B-tree node"});
  CHECK_NOTHROW(Dataset::open(dir / "good.h5"));
}

TEST_CASE("a chunked layout HDF5 would divide by zero with is refused", "[io][errors]") {
  // A version 3 layout message: version, class 2, the chunk's rank (the
  // dataspace's plus one), the B-tree's address, then 4 bytes a dimension.
  TempDir dir;
  test::Layout chunked;
  chunked.chunked = true;
  test::write_shard(dir / "good.h5", 0, 20, {4}, DType::u8, DType::i64, chunked);
  HeaderMessage found = find_message(dir / "good.h5", "inputs", 0x08);
  std::vector<char>& bytes = found.bytes;
  const std::uint64_t layout = found.body;
  REQUIRE(layout != 0);
  REQUIRE(bytes[layout] == 3);
  REQUIRE(bytes[layout + 1] == 2);
  REQUIRE(bytes[layout + 2] == 3);  // [rows, 4] and the element
  const auto patched = [&](const char* name, std::uint64_t at, char value) {
    std::vector<char> copy = bytes;
    copy[at] = value;
    std::ofstream(dir / name, std::ios::binary).write(copy.data(), copy.size());
    return dir / name;
  };
  require_error<IoError>(
      patched("rank.h5", layout + 2, 0),
      {"rank.h5", "chunks of 0 dimensions for a dataspace of rank 2", "'inputs'"});
  for (int b = 0; b < 4; ++b) bytes[layout + 11 + 4 + b] = 0;  // the second dimension: 0
  require_error<IoError>(patched("zero.h5", layout + 11, bytes[layout + 11]),
                         {"zero.h5", "chunk dimension 1 of size 0"});
  CHECK_NOTHROW(Dataset::open(dir / "good.h5"));
}

TEST_CASE("unfiltered chunks of the wrong size, and unwritten chunks, are refused",
          "[io][errors]") {
  // Note [chunk trees]: the chunk index (layout version 3: its address after
  // version, class and rank) is a version 1 B-tree; its first key, after the
  // node's 24-byte header, starts with the first chunk's stored size.
  TempDir dir;
  test::Layout plain;
  plain.chunked = true;
  plain.gzip = false;
  plain.chunk_rows = 4;
  test::write_shard(dir / "good.h5", 0, 20, {4}, DType::f32, DType::i64, plain);
  const HeaderMessage found = find_message(dir / "good.h5", "inputs", 0x08);
  const std::vector<char>& bytes = found.bytes;
  const std::uint64_t layout = found.body;
  REQUIRE(layout != 0);
  REQUIRE(bytes[layout] == 3);
  std::uint64_t tree = 0;
  std::memcpy(&tree, &bytes[layout + 3], 8);
  REQUIRE(std::string(&bytes[tree], 4) == "TREE");
  REQUIRE(bytes[tree + 24] == 4 * 4 * 4);  // 4 rows of 4 f32
  std::vector<char> copy = bytes;
  copy[tree + 24] = 8;  // HDF5 1.10 read 8 bytes and copied 64 (a heap over-read)
  std::ofstream(dir / "short.h5", std::ios::binary).write(copy.data(), copy.size());
  require_error<IoError>(dir / "short.h5",
                         {"short.h5", "'inputs'", "unfiltered chunk of 8 bytes", "has 64 bytes"});
  CHECK_NOTHROW(Dataset::open(dir / "good.h5"));

  // Rows 0-3 of 20 written, in chunks of 4: four chunks would read as zeros.
  const hid_t file = test::create_file(dir / "partial.h5", {});
  const hsize_t dims[2] = {20, 4}, chunk[2] = {4, 4}, rows[2] = {4, 4}, start[2] = {0, 0};
  const hid_t space = H5Screate_simple(2, dims, nullptr), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 2, chunk);
  const hid_t set =
      H5Dcreate2(file, "inputs", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  const hid_t memory = H5Screate_simple(2, rows, nullptr);
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, rows, nullptr);
  const std::vector<float> values(16, 1.0f);
  REQUIRE(H5Dwrite(set, H5T_NATIVE_FLOAT, memory, space, H5P_DEFAULT, values.data()) >= 0);
  for (hid_t id : {memory, space}) H5Sclose(id);
  H5Dclose(set);
  H5Pclose(dcpl);
  const std::vector<std::int64_t> labels(20, 1);
  test::write_dataset(file, "labels", DType::i64, {20}, labels.data(), {});
  H5Fclose(file);
  require_error<IoError>(dir / "partial.h5",
                         {"partial.h5", "has 1 chunks written where its shape has 5"});
}

TEST_CASE("an extent past its maximum, or an unknown filter, is refused", "[io][errors]") {
  // A dataspace message (version 1): version, rank, flags (bit 0: maxima
  // follow), 5 reserved, then the dimensions and the maxima, 8 bytes each.
  TempDir dir;
  // `filter`: the chunks through a filter this HDF5 does not have (registered
  // as optional, so that HDF5 writes them unfiltered).
  const auto write = [&](const fs::path& path, H5Z_filter_t filter) {
    const hid_t file = test::create_file(path, {});
    const hsize_t dims[2] = {8, 4}, chunk[2] = {4, 4};
    const hid_t space = H5Screate_simple(2, dims, dims), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 2, chunk);
    if (filter != 0) H5Pset_filter(dcpl, filter, H5Z_FLAG_OPTIONAL, 0, nullptr);
    const hid_t set =
        H5Dcreate2(file, "inputs", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    REQUIRE(set >= 0);
    const std::vector<float> values(32, 1.0f);
    REQUIRE(H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
    H5Dclose(set);
    H5Sclose(space);
    H5Pclose(dcpl);
    const std::vector<std::int64_t> labels(8, 1);
    test::write_dataset(file, "labels", DType::i64, {8}, labels.data(), {});
    H5Fclose(file);
  };
  write(dir / "good.h5", 0);
  write(dir / "filter.h5", 1281);
  require_error<IoError>(dir / "filter.h5",
                         {"filter.h5", "filter 1281, which this HDF5 does not have"});

  const HeaderMessage found = find_message(dir / "good.h5", "inputs", 0x01);
  const std::vector<char>& bytes = found.bytes;
  const std::uint64_t dataspace = found.body;
  REQUIRE(dataspace != 0);
  REQUIRE(bytes[dataspace] == 1);
  REQUIRE(bytes[dataspace + 1] == 2);
  REQUIRE((bytes[dataspace + 2] & 1) == 1);
  std::vector<char> copy = bytes;
  copy[dataspace + 8 + 8 + 2] = 1;  // the second dimension: 4 + 65536, its maximum 4
  std::ofstream(dir / "wide.h5", std::ios::binary).write(copy.data(), copy.size());
  require_error<IoError>(dir / "wide.h5",
                         {"wide.h5", "'inputs'", "dimension 1 of 65540, above its maximum 4"});
  CHECK_NOTHROW(Dataset::open(dir / "good.h5"));
}

TEST_CASE("a dataset whose data lives in another file is refused", "[io][errors]") {
  TempDir dir;
  std::ofstream(dir / "secret.bin") << std::string(64, 's');
  const hid_t file = H5Fcreate((dir / "ext.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t input_dims[2] = {4, 16}, label_dims[1] = {4};
  const hid_t input_space = H5Screate_simple(2, input_dims, nullptr);
  const hid_t label_space = H5Screate_simple(1, label_dims, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  REQUIRE(H5Pset_external(dcpl, (dir / "secret.bin").c_str(), 0, 64) >= 0);
  const hid_t inputs =
      H5Dcreate2(file, "inputs", H5T_STD_U8LE, input_space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  const hid_t labels =
      H5Dcreate2(file, "labels", H5T_STD_I64LE, label_space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const std::int64_t values[4] = {0, 1, 2, 3};
  H5Dwrite(labels, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
  for (hid_t id : {inputs, labels}) H5Dclose(id);
  for (hid_t id : {input_space, label_space}) H5Sclose(id);
  H5Pclose(dcpl);
  H5Fclose(file);
  require_error<IoError>(dir / "ext.h5", {"ext.h5", "dataset 'inputs'", "external files"});
}

TEST_CASE("a missing dataset or rows that do not match is an IoError", "[io][errors]") {
  TempDir dir;
  write_parts(dir / "no_labels.h5", {{"inputs", DType::u8, {4, 2}}});
  require_error<IoError>(dir / "no_labels.h5", {"no_labels.h5", "dataset 'labels'", "missing"});
  write_parts(dir / "no_inputs.h5", {{"labels", DType::i64, {4}}});
  require_error<IoError>(dir / "no_inputs.h5", {"dataset 'inputs'", "missing"});
  write_parts(dir / "rows.h5", {{"inputs", DType::u8, {4, 2}}, {"labels", DType::i64, {5}}});
  require_error<IoError>(dir / "rows.h5", {"rows.h5", "'inputs' has 4 rows but 'labels' has 5"});
  write_parts(dir / "rank.h5", {{"inputs", DType::u8, {4, 2}}, {"labels", DType::i64, {4, 1}}});
  require_error<IoError>(dir / "rank.h5", {"dataset 'labels'", "[4, 1]"});
}

TEST_CASE("unsupported dtypes are an IoError saying what is read", "[io][errors]") {
  TempDir dir;
  write_parts(dir / "i32.h5", {{"inputs", DType::i32, {4, 2}}, {"labels", DType::i64, {4}}});
  require_error<IoError>(dir / "i32.h5",
                         {"i32.h5", "dataset 'inputs'", "stored as i32", "u8, f16 or f32"});
  write_parts(dir / "f32labels.h5", {{"inputs", DType::u8, {4, 2}}, {"labels", DType::f32, {4}}});
  require_error<IoError>(dir / "f32labels.h5", {"dataset 'labels'", "stored as f32"});
}

TEST_CASE("shards that disagree on dtype or shape name the odd one", "[io][errors]") {
  TempDir dir;
  test::write_shard(dir / "a.h5", 0, 10, {3, 4}, DType::u8);
  test::write_shard(dir / "b.h5", 10, 10, {3, 4}, DType::f32);
  require_error<IoError>(dir.path(), {"b.h5", "inputs f32 [3, 4]", "a.h5", "inputs u8 [3, 4]"});
  fs::remove(dir / "b.h5");
  test::write_shard(dir / "c.h5", 10, 10, {4, 3}, DType::u8);
  require_error<IoError>(dir.path(), {"c.h5", "[4, 3]"});
  fs::remove(dir / "c.h5");
  test::write_shard(dir / "d.h5", 10, 10, {3, 4}, DType::u8, DType::i32);
  require_error<IoError>(dir.path(), {"d.h5", "labels i32"});
}

TEST_CASE("a label out of range names shard, row and value", "[io][errors]") {
  TempDir dir;
  test::write_shard(dir / "a.h5", 0, 10, {2}, DType::u8);
  test::write_shard(dir / "b.h5", 10, 10, {2}, DType::u8);
  const Dataset data = Dataset::open(dir.path());
  CHECK_NOTHROW(data.check_labels(10));  // labels are (7 i) mod 10
  // Label 9 first appears at sample 7 (7 * 7 = 49).
  CHECK_THROWS_MATCHES(data.check_labels(9), InvalidArgument,
                       Catch::Matchers::Predicate<InvalidArgument>([](const InvalidArgument& e) {
                         const std::string m = e.what();
                         return m.find("a.h5") != std::string::npos &&
                                m.find("row 7: label 9 is outside [0, 9)") != std::string::npos;
                       }));
  CHECK_THROWS_AS(data.check_labels(0), InvalidArgument);
  CHECK_THROWS_AS(data.read_inputs(std::vector<std::int64_t>{20}, nullptr), InvalidArgument);
}

TEST_CASE("targets outside [0, 1] are refused at open for binary cross-entropy, by shard and row",
          "[io][errors]") {
  // Two target shards of 4 rows of 3 targets; b.h5's row 1, value 2 is the
  // one bad target (the place written out by hand).
  TempDir dir;
  const std::vector<float> inputs(4 * 2, 0.5f);
  const auto write = [&](const char* name, std::vector<float> targets) {
    const hid_t file = test::create_file(dir / name, {});
    test::write_dataset(file, "inputs", DType::f32, {4, 2}, inputs.data(), {});
    test::write_dataset(file, "targets", DType::f32, {4, 3}, targets.data(), {});
    H5Fclose(file);
  };
  std::vector<float> targets(4 * 3);
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<float>(i % 5) / 4;
  write("a.h5", targets);
  for (const float bad : {1.5f, -0.5f}) {
    targets[1 * 3 + 2] = bad;
    write("b.h5", targets);
    try {
      Dataset::open(dir.path(), {.probability_targets = true});
      FAIL("target " << bad << " was accepted for binary cross-entropy");
    } catch (const InvalidArgument& e) {
      CHECK_THAT(e.what(), Catch::Contains("b.h5', dataset 'targets', row 1: target " +
                                           fmt::format("{}", bad) +
                                           " (value 2 of the row) is outside [0, 1]"));
    }
    // Any finite target is one for mse, l1 and huber.
    CHECK(Dataset::open(dir.path()).targets()[4 * 3 + 1 * 3 + 2] == bad);  // after a.h5's
  }
  // NaN is refused whatever the loss (as every non-finite target is).
  targets[1 * 3 + 2] = std::nanf("");
  write("b.h5", targets);
  require_error<IoError>(dir / "b.h5", {"b.h5", "row 1 holds nan: targets must be finite"});
  // Labels are not targets: a class-index shard opens as before.
  test::write_shard(dir / "labels.h5", 0, 4, {2}, DType::u8);
  CHECK(Dataset::open(dir / "labels.h5", {.probability_targets = true}).size() == 4);
}

TEST_CASE("LOCKSTEP_CHECK_HDF5 names the call, the place and HDF5's error stack", "[io][errors]") {
  CHECK(LOCKSTEP_CHECK_HDF5(H5Tget_class(H5T_NATIVE_INT)) == H5T_INTEGER);
  Hdf5Lock lock;
  const int line = __LINE__ + 2;
  try {
    LOCKSTEP_CHECK_HDF5(H5Fopen("/nonexistent/lockstep.h5", H5F_ACC_RDONLY, H5P_DEFAULT));
    FAIL("H5Fopen of a missing file succeeded");
  } catch (const LibraryError& e) {
    CHECK(e.library() == "HDF5");
    CHECK(e.code() < 0);
    CHECK_THAT(e.what(), Catch::Contains("H5Fopen(\"/nonexistent/lockstep.h5\""));
    CHECK_THAT(e.what(), Catch::Contains("test_dataset_errors.cpp:" + std::to_string(line)));
    CHECK_THAT(e.what(), Catch::Contains("unable to open file"));
  }
  CHECK(io::hdf5_error_stack() == "no HDF5 error stack");  // the throw cleared it
}
