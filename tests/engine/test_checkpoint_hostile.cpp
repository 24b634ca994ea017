// Hostile checkpoint and weights files (Note [hostile files] in io/hdf5.h):
// files crafted with the HDF5 C API, their checksum recomputed by an
// independent CRC-32, so that they reach HDF5; each gives an IoError naming
// the object, never a crash. And weights stored as f16 or f64 load as f32
// (f16 exactly: all 65536 values; f64 rounded to nearest, ties to even).
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "engine/checkpoint.h"
#include "engine/checkpoint_file.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "io/hdf5.h"
#include "io/shard_fixtures.h"

using namespace lockstep;
using namespace lockstep::engine;
using test::TempDir;
namespace fs = std::filesystem;

namespace {

// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), bit by bit.
std::uint32_t crc32_of(const std::string& bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// Rewrites `file`'s checksum file so that the checksum passes.
void recompute_checksum(const fs::path& file) {
  const std::string bytes = test::file_text(file);
  char line[64];
  std::snprintf(line, sizeof line, "crc32 %08x size %zu\n", crc32_of(bytes), bytes.size());
  std::ofstream(file.string() + ".crc32") << line;
}

// A good checkpoint, then `edit` applied to it through the HDF5 C API.
template <typename Edit>
fs::path hostile_checkpoint(const TempDir& dir, Edit edit) {
  CheckpointContents c;
  c.tensors["/model/fc1.weight"] = core::Tensor::zeros({2, 3}, DType::f32);
  c.attributes["step"] = std::int64_t{12};
  c.attributes["precision"] = std::string("fp32");
  const fs::path file = CheckpointDirectory(dir / "ckpts", 1, CheckpointStart::fresh).save(1, c);
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  edit(f);
  REQUIRE(H5Fclose(f) >= 0);
  recompute_checksum(file);
  return file;
}

void replace_attribute(hid_t f, const char* name, hid_t type, hid_t space, const void* data) {
  REQUIRE(H5Adelete(f, name) >= 0);
  const hid_t a = H5Acreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(a >= 0);
  if (data) REQUIRE(H5Awrite(a, type, data) >= 0);
  H5Aclose(a);
}

void replace_weight(hid_t f, hid_t type, hid_t space, hid_t dcpl, const void* data) {
  REQUIRE(H5Ldelete(f, "/model/fc1.weight", H5P_DEFAULT) >= 0);
  const hid_t d = H5Dcreate2(f, "/model/fc1.weight", type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  REQUIRE(d >= 0);
  if (data) REQUIRE(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
  H5Dclose(d);
}

void require_refused(const fs::path& file, std::initializer_list<std::string> fragments) {
  try {
    read_checkpoint(file);
    FAIL("a hostile checkpoint was read");
  } catch (const IoError& e) {
    for (const std::string& f : fragments) CHECK_THAT(e.what(), Catch::Contains(f));
  }
}

}  // namespace

TEST_CASE("attributes of unexpected shape or type are refused by name", "[engine][checkpoint]") {
  TempDir dir;
  const hsize_t three = 3;
  const hid_t vector3 = H5Screate_simple(1, &three, nullptr);
  const std::int64_t values[3] = {1, 2, 3};
  INFO("an array where one value belongs (once a stack overwrite)");
  require_refused(
      hostile_checkpoint(
          dir, [&](hid_t f) { replace_attribute(f, "step", H5T_NATIVE_INT64, vector3, values); }),
      {"attribute 'step'", "shape [3]", "one value"});
  fs::remove_all(dir / "ckpts");

  INFO("a compound attribute");
  const hid_t pair = H5Tcreate(H5T_COMPOUND, 16);
  H5Tinsert(pair, "a", 0, H5T_NATIVE_INT64);
  H5Tinsert(pair, "b", 8, H5T_NATIVE_INT64);
  const hid_t scalar = H5Screate(H5S_SCALAR);
  require_refused(
      hostile_checkpoint(dir,
                         [&](hid_t f) { replace_attribute(f, "precision", pair, scalar, values); }),
      {"attribute 'precision'", "compound"});
  fs::remove_all(dir / "ckpts");

  INFO("a null dataspace");
  const hid_t null_space = H5Screate(H5S_NULL);
  require_refused(
      hostile_checkpoint(
          dir,
          [&](hid_t f) { replace_attribute(f, "step", H5T_NATIVE_INT64, null_space, nullptr); }),
      {"attribute 'step'", "null dataspace"});
  fs::remove_all(dir / "ckpts");

  INFO("a variable-length string (HDF5 1.10 can hang on a damaged global heap)");
  const hid_t variable = H5Tcopy(H5T_C_S1);
  H5Tset_size(variable, H5T_VARIABLE);
  const char* word = "bf16";
  require_refused(
      hostile_checkpoint(
          dir, [&](hid_t f) { replace_attribute(f, "precision", variable, scalar, &word); }),
      {"attribute 'precision'", "variable-length string"});
  fs::remove_all(dir / "ckpts");

  INFO("a one-element array is one value");
  const hsize_t one = 1;
  const hid_t vector1 = H5Screate_simple(1, &one, nullptr);
  const fs::path fine = hostile_checkpoint(
      dir, [&](hid_t f) { replace_attribute(f, "step", H5T_NATIVE_INT64, vector1, &values[2]); });
  const CheckpointContents back = read_checkpoint(fine);
  CHECK(std::get<std::int64_t>(back.attributes.at("step")) == 3);
  CHECK(std::get<std::string>(back.attributes.at("precision")) == "fp32");
  for (hid_t id : {vector3, scalar, null_space, vector1}) H5Sclose(id);
  for (hid_t id : {pair, variable}) H5Tclose(id);
}

TEST_CASE("datasets of unexpected type or impossible size are refused by name",
          "[engine][checkpoint]") {
  TempDir dir;
  const hsize_t dims[2] = {2, 3};
  const hid_t space = H5Screate_simple(2, dims, nullptr);
  INFO("a string dataset");
  const hid_t string8 = H5Tcopy(H5T_C_S1);
  H5Tset_size(string8, 8);
  require_refused(
      hostile_checkpoint(dir,
                         [&](hid_t f) { replace_weight(f, string8, space, H5P_DEFAULT, nullptr); }),
      {"dataset 'model/fc1.weight'", "string"});
  fs::remove_all(dir / "ckpts");

  INFO("i16 weights");
  require_refused(
      hostile_checkpoint(
          dir, [&](hid_t f) { replace_weight(f, H5T_STD_I16LE, space, H5P_DEFAULT, nullptr); }),
      {"dataset 'model/fc1.weight'", "i16"});
  fs::remove_all(dir / "ckpts");

  INFO("a null dataspace");
  const hid_t null_space = H5Screate(H5S_NULL);
  require_refused(
      hostile_checkpoint(
          dir,
          [&](hid_t f) { replace_weight(f, H5T_IEEE_F32LE, null_space, H5P_DEFAULT, nullptr); }),
      {"dataset 'model/fc1.weight'", "null dataspace"});
  fs::remove_all(dir / "ckpts");

  INFO("an unallocated chunked dataset claiming 2^60 elements");
  const hsize_t huge[2] = {hsize_t{1} << 40, hsize_t{1} << 20}, chunk[2] = {1, 1024};
  const hid_t huge_space = H5Screate_simple(2, huge, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 2, chunk);
  require_refused(
      hostile_checkpoint(
          dir, [&](hid_t f) { replace_weight(f, H5T_IEEE_F32LE, huge_space, dcpl, nullptr); }),
      {"dataset 'model/fc1.weight'", "[1099511627776, 1048576]", "more than"});
  H5Pclose(dcpl);
  for (hid_t id : {space, null_space, huge_space}) H5Sclose(id);
  H5Tclose(string8);
}

TEST_CASE("weights stored as f16 or f64 load as f32; other types are refused by name",
          "[engine][checkpoint]") {
  TempDir dir;
  const fs::path file = dir / "weights.h5";
  // Every f16 bit pattern, in h5py's half type.
  std::vector<std::uint16_t> halves(65536);
  for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<std::uint16_t>(i);
  // f64 values whose f32 rounding is known: ties go to the even neighbour.
  struct Case {
    double value;
    float expected;
  };
  const Case doubles[] = {
      {1.0 + 0x1p-24, 1.0f},                           // tie, 1.0 is even
      {1.0 + 3 * 0x1p-24, 0x1.000004p+0f},             // tie, up to the even neighbour
      {1.0 + 0x1p-24 + 0x1p-50, 0x1.000002p+0f},       // just above the tie
      {0x1.fffffep+127 + 0x1p+102, 0x1.fffffep+127f},  // within half an ulp of FLT_MAX
      {0x1.fffffep+127 + 0x1p+103, INFINITY},          // the tie above FLT_MAX
      {1e300, INFINITY},
      {0x1p-149, 0x1p-149f},             // the smallest subnormal
      {0x1p-150, 0.0f},                  // tie with zero, which is even
      {0x1p-150 + 0x1p-170, 0x1p-149f},  // above it
      {-0.0, -0.0f},
      {-2.5, -2.5f},
  };
  {
    const hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hid_t group = H5Gcreate2(f, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t n_half = halves.size(), n_double = std::size(doubles);
    const io::Hdf5Id half = io::file_type(DType::f16);
    const hid_t half_space = H5Screate_simple(1, &n_half, nullptr);
    const hid_t half_set =
        H5Dcreate2(group, "half", half.get(), half_space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Dwrite(half_set, half.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, halves.data()) >= 0);
    std::vector<double> values;
    for (const Case& c : doubles) values.push_back(c.value);
    const hid_t double_space = H5Screate_simple(1, &n_double, nullptr);
    const hid_t double_set = H5Dcreate2(group, "double", H5T_IEEE_F64BE, double_space, H5P_DEFAULT,
                                        H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Dwrite(double_set, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >=
            0);
    for (hid_t id : {half_set, double_set}) H5Dclose(id);
    for (hid_t id : {half_space, double_space}) H5Sclose(id);
    H5Gclose(group);
    H5Fclose(f);
  }
  const auto model = read_group(file, "/model");
  REQUIRE(model.at("half").dtype() == DType::f32);
  const std::vector<float> widened = model.at("half").to_vector<float>();
  for (std::size_t i = 0; i < halves.size(); ++i) {
    // binary16: sign, 5 exponent bits (bias 15), 10 mantissa bits.
    const int exponent = static_cast<int>((i >> 10) & 31), mantissa = static_cast<int>(i & 1023);
    const double magnitude = exponent == 0    ? std::ldexp(mantissa, -24)
                             : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                              : std::ldexp(1024 + mantissa, exponent - 25);
    const double expected = (i & 0x8000) ? -magnitude : magnitude;
    INFO("f16 bits " << i);
    if (std::isnan(expected))
      REQUIRE(std::isnan(widened[i]));
    else
      REQUIRE((widened[i] == expected && std::signbit(widened[i]) == std::signbit(expected)));
  }
  const std::vector<float> rounded = model.at("double").to_vector<float>();
  for (std::size_t i = 0; i < std::size(doubles); ++i) {
    INFO("f64 " << doubles[i].value);
    CHECK(std::memcmp(&rounded[i], &doubles[i].expected, sizeof(float)) == 0);
  }

  // Anything else is refused with its type's name.
  {
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hsize_t two = 2;
    const hid_t space = H5Screate_simple(1, &two, nullptr);
    const hid_t set = H5Dcreate2(f, "/model/wide", H5T_NATIVE_LDOUBLE, space, H5P_DEFAULT,
                                 H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(set);
    H5Sclose(space);
    H5Fclose(f);
  }
  CHECK_THROWS_WITH(read_group(file, "/model"), Catch::Contains("dataset 'wide'") &&
                                                    Catch::Contains("f128") &&
                                                    Catch::Contains("weights.h5"));
}

TEST_CASE("load_weights puts f64 and f16 weights into a model and refuses integers by name",
          "[engine][checkpoint]") {
  TempDir dir;
  Sequential model;
  model.emplace<Linear>("fc", 3, 2);
  model.assign_names();
  const double weights[6] = {0.5, -1.25, 1.0 + 0x1p-24, 3.0, 1e-3, -7.0};
  const std::uint16_t bias[2] = {0x3c00, 0xc000};  // f16 1.0 and -2.0
  const auto write = [&](const fs::path& file, hid_t weight_type) {
    const hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hid_t group = H5Gcreate2(f, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t w_dims[2] = {2, 3}, b_dims[1] = {2};
    const hid_t w_space = H5Screate_simple(2, w_dims, nullptr),
                b_space = H5Screate_simple(1, b_dims, nullptr);
    const hid_t w =
        H5Dcreate2(group, "fc.weight", weight_type, w_space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(w, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, weights);
    const io::Hdf5Id half = io::file_type(DType::f16);
    const hid_t b =
        H5Dcreate2(group, "fc.bias", half.get(), b_space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(b, half.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, bias);
    for (hid_t id : {w, b}) H5Dclose(id);
    for (hid_t id : {w_space, b_space}) H5Sclose(id);
    H5Gclose(group);
    H5Fclose(f);
  };
  write(dir / "f64.h5", H5T_IEEE_F64LE);
  load_weights(dir / "f64.h5", model, core::Stream());
  const std::vector<Parameter*> params = model.parameters();
  const auto value = [&](const std::string& name) {
    for (Parameter* p : params)
      if (p->name == name) return p->value.to_vector<float>();
    FAIL("no parameter " << name);
    return std::vector<float>{};
  };
  CHECK(value("fc.weight") == std::vector<float>{0.5f, -1.25f, 1.0f, 3.0f, 1e-3f, -7.0f});
  CHECK(value("fc.bias") == std::vector<float>{1.0f, -2.0f});
  write(dir / "i64.h5", H5T_STD_I64LE);
  CHECK_THROWS_WITH(load_weights(dir / "i64.h5", model, core::Stream()),
                    Catch::Contains("parameter 'fc.weight'") && Catch::Contains("stored as i64"));
}
