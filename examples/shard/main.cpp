// lockstep-shard: writes datasets in lockstep's shard format (docs/data-format.md).
//   lockstep-shard fashion-mnist --src DIR --out DIR --shards N
//   lockstep-shard synthetic --out DIR --count N --shape 3,64,64 --dtype u8 --classes K ...
//   lockstep-shard text --src FILE... --out DIR --seq T --shards S [--val-fraction F]
//   lockstep-shard images --src DIR_OR_LIST --out DIR --shards S
// A program to copy from when converting your own data: read samples in
// order, hand them to io::DatasetWriter in pieces, close it.
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "examples/common/flags.h"
#include "idx_file.h"
#include "images.h"
#include "io/shard_writer.h"
#include "kernels/error.h"
#include "kernels/half.h"
#include "kernels/philox.h"
#include "progress.h"
#include "text.h"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kPieceBytes = 64 << 20;  // samples generated per append, in bytes
// The largest sample --shape may describe: the converter holds whole samples
// in memory, and a bigger one is a mistyped shape rather than a dataset.
constexpr std::int64_t kMaxSampleBytes = std::int64_t{1} << 31;

int fashion_mnist(const fs::path& src, const fs::path& out, int shards) {
  examples::convert_idx(src / "train-images-idx3-ubyte.gz", src / "train-labels-idx1-ubyte.gz",
                        out / "train", shards, "train");
  // Fashion-MNIST's test set (t10k) is the val set of a lockstep run (--val-data).
  examples::convert_idx(src / "t10k-images-idx3-ubyte.gz", src / "t10k-labels-idx1-ubyte.gz",
                        out / "val", shards, "val");
  fmt::print("wrote {} and {}\n", (out / "train").string(), (out / "val").string());
  return 0;
}

struct SyntheticOptions {
  fs::path out;
  std::int64_t count = 0;
  std::vector<std::int64_t> shape{3, 64, 64};
  std::string dtype = "u8";
  std::int64_t classes = 1000;
  int shards = 1;
  std::uint64_t seed = 0;
};

// Sample i is a pure function of (seed, i), so that tests and benchmarks can
// check what they read: its inputs are words [i*W, (i+1)*W) of the Philox
// stream (seed, 0), W = ceil(sample bytes / 4), as bytes (u8) or as uniforms
// in [0, 1) (f32, and f16 rounded from them); its label is word i of stream
// (seed, 1) modulo the class count.
int synthetic(const SyntheticOptions& o) {
  io::ShardFormat format{DType::u8, o.shape, DType::i64};
  if (o.dtype == "f16")
    format.input_dtype = DType::f16;
  else if (o.dtype == "f32")
    format.input_dtype = DType::f32;
  else if (o.dtype != "u8")
    throw InvalidArgument("--dtype '" + o.dtype + "' is not u8, f16 or f32");
  if (o.classes < 1) throw InvalidArgument("--classes must be at least 1");
  if (o.shards > o.count)
    throw InvalidArgument(fmt::format(
        "--shards {} is more than --count {}: every shard needs a sample", o.shards, o.count));
  std::int64_t sample_bytes = static_cast<std::int64_t>(dtype_size(format.input_dtype));
  for (std::int64_t d : o.shape)
    if (__builtin_mul_overflow(sample_bytes, d, &sample_bytes) || sample_bytes > kMaxSampleBytes)
      throw InvalidArgument(fmt::format("--shape {} of {}: a sample would be over {} GiB",
                                        fmt::join(o.shape, ","), o.dtype, kMaxSampleBytes >> 30));
  io::check_format(format);
  const std::int64_t values = core::shape_numel(o.shape);
  const std::int64_t words = (static_cast<std::int64_t>(format.sample_bytes()) + 3) / 4;
  const std::int64_t piece = std::max<std::int64_t>(1, kPieceBytes / format.sample_bytes());
  std::vector<std::uint8_t> inputs(static_cast<std::size_t>(piece) * format.sample_bytes());
  std::vector<std::uint32_t> sample_words(static_cast<std::size_t>(words));
  std::vector<float> uniforms(static_cast<std::size_t>(values));
  std::vector<std::uint32_t> label_words(static_cast<std::size_t>(piece));
  std::vector<std::int64_t> labels(static_cast<std::size_t>(piece));
  io::DatasetWriter writer(o.out, format, o.count, o.shards);
  examples::Progress progress("synthetic", o.count);
  for (std::int64_t done = 0; done < o.count;) {
    const std::int64_t n = std::min(piece, o.count - done);
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint8_t* dst = inputs.data() + i * format.sample_bytes();
      const std::uint64_t offset = static_cast<std::uint64_t>((done + i) * words);
      if (format.input_dtype == DType::u8) {
        kernels::cpu::random_words({o.seed, 0}, offset, sample_words.data(), words);
        std::memcpy(dst, sample_words.data(), format.sample_bytes());
        continue;
      }
      kernels::cpu::uniform({o.seed, 0}, offset, uniforms.data(), values);
      if (format.input_dtype == DType::f32) {
        std::memcpy(dst, uniforms.data(), format.sample_bytes());
        continue;
      }
      for (std::int64_t v = 0; v < values; ++v) {
        const std::uint16_t h = kernels::f32_to_f16_bits(uniforms[v]);
        std::memcpy(dst + 2 * v, &h, 2);
      }
    }
    kernels::cpu::random_words({o.seed, 1}, static_cast<std::uint64_t>(done), label_words.data(),
                               n);
    for (std::int64_t i = 0; i < n; ++i) labels[i] = label_words[i] % o.classes;
    writer.append(inputs.data(), labels.data(), n);
    done += n;
    progress.update(done);
  }
  writer.close();
  fmt::print("wrote {} samples ({}) in {} shards to {}\n", o.count, format.str(), o.shards,
             o.out.string());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lockstep-shard: write datasets as lockstep HDF5 shards (docs/data-format.md)"};
  app.require_subcommand(1);

  std::string src = "/usr/share/datasets/fashion-mnist", fm_out;
  int fm_shards = 1;
  CLI::App* fm =
      app.add_subcommand("fashion-mnist",
                         "convert Fashion-MNIST's gzipped IDX files into OUT/train and OUT/val "
                         "(inputs u8 [N, 1, 28, 28], labels i64)");
  fm->add_option("--src", src, "directory of the IDX files (Debian: dataset-fashion-mnist)")
      ->capture_default_str();
  fm->add_option("--out", fm_out, "output directory")->required();
  fm->add_option("--shards", fm_shards, "shards per split")->capture_default_str();

  SyntheticOptions syn;
  CLI::App* sy = app.add_subcommand(
      "synthetic", "random samples for benchmarks and tests; sample i depends only on (seed, i)");
  sy->add_option("--out", syn.out, "output directory")->required();
  sy->add_option("--count", syn.count, "number of samples")->required();
  sy->add_option("--shape", syn.shape, "per-sample shape, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  sy->add_option("--dtype", syn.dtype, "u8, f16 or f32")->capture_default_str();
  sy->add_option("--classes", syn.classes, "labels are uniform in [0, classes)")
      ->capture_default_str();
  sy->add_option("--shards", syn.shards, "number of shards")->capture_default_str();
  sy->add_option("--seed", syn.seed, "Philox seed")->capture_default_str();

  TextOptions txt;
  CLI::App* tx = app.add_subcommand(
      "text",
      "plain text as byte-level token windows [N, T+1] (vocabulary 256) in OUT/train, and the "
      "held-out tail in OUT/val");
  tx->add_option("--src", txt.sources, "text files, concatenated in this order")->required();
  tx->add_option("--out", txt.out, "output directory")->required();
  tx->add_option("--seq", txt.seq, "T: tokens per training sequence")->required();
  tx->add_option("--shards", txt.shards, "shards of the train split")->capture_default_str();
  tx->add_option("--val-fraction", txt.val_fraction,
                 "fraction of the text, from its end, held out as OUT/val")
      ->capture_default_str();

  ImagesOptions img;
  CLI::App* im = app.add_subcommand(
      "images",
      "JPEG and PNG files packed undecoded as encoded-image shards (classes from folder names, "
      "as torchvision's ImageFolder), and OUT/classes.txt");
  im->add_option("--src", img.src, "a directory CLASS/.../FILE, or a list of image paths")
      ->required();
  im->add_option("--out", img.out, "output directory")->required();
  im->add_option("--shards", img.shards, "number of shards")->capture_default_str();
  im->get_option("--src")->check(examples::non_empty());
  im->get_option("--out")->check(examples::non_empty());
  im->get_option("--shards")->check(examples::within(1, 1e6));

  // What each flag accepts (examples/common/flags.h), checked while parsing.
  fm->get_option("--src")->check(examples::non_empty());
  fm->get_option("--out")->check(examples::non_empty());
  fm->get_option("--shards")->check(examples::within(1, 1e6));
  sy->get_option("--out")->check(examples::non_empty());
  sy->get_option("--count")->check(examples::within(1, 1e12));
  sy->get_option("--shape")->check(examples::within(1, 1 << 30));
  sy->get_option("--dtype")->check(examples::one_of({"u8", "f16", "f32"}));
  sy->get_option("--classes")->check(examples::within(1, 1e12));
  sy->get_option("--shards")->check(examples::within(1, 1e6));
  sy->get_option("--seed")->check(examples::seed_value());
  tx->get_option("--src")->check(examples::non_empty());
  tx->get_option("--out")->check(examples::non_empty());
  tx->get_option("--seq")->check(examples::within(1, 1 << 20));
  tx->get_option("--shards")->check(examples::within(1, 1e6));
  tx->get_option("--val-fraction")->check(examples::within(0, 0.9));
  CLI11_PARSE(app, argc, argv);
  try {
    if (fm->parsed()) return fashion_mnist(src, fm_out, fm_shards);
    if (tx->parsed()) return text(txt);
    if (im->parsed()) return images(img);
    return synthetic(syn);
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep-shard: {}\n", e.what());
    return 1;
  }
}
