// bench_loader: samples/s and GB/s of the DataLoader reading one random
// permutation of a dataset in batches, against baselines measured in the same
// run on the same batches: the floor (one pread per row, by the same number of
// threads, at the offsets HDF5 reports) and h5py's sorted fancy indexing
// (bench/bench_loader_h5py.py under Debian's /usr/bin/python3). With
// --device cuda also the batches delivered to GPU memory against raw preads
// plus a plain cudaMemcpyAsync, and the loader's pinned host-to-device copy
// against a plain cudaMemcpyAsync of pinned memory. On encoded-image shards
// (lockstep-shard images) it measures images/s decoded and augmented
// (random-resized-crop, flip, normalisation) by the loader, against
// TurboJPEG's decode alone on the same threads and, with --torch-python,
// torchvision's DataLoader with as many worker processes (image_bench); with
// --threads-sweep, the loader's images/s at each of several thread counts,
// delivered to the device that --device names (on cuda: pinned buffers and
// the loader's copy stream, normalised on the GPU), and how many threads a
// rate such as ResNet-50's on one GPU (--target-images-per-s) needs
// (thread_sweep).
#include <fcntl.h>
#include <fmt/core.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/report.h"
#include "engine/core/memory.h"
#include "examples/common/flags.h"
#include "io/image_decode.h"
#include "io/loader.h"
#include "io/shard_writer.h"

#if LOCKSTEP_WITH_CUDA
#include "kernels/cuda/check.h"
#endif

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Reads every shard once, so that every measurement starts from a warm page cache.
void warm_page_cache(const io::Dataset& data) {
  std::vector<char> buffer(16 << 20);
  for (const io::ShardInfo& shard : data.shards()) {
    std::ifstream file(shard.path, std::ios::binary);
    while (file.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) ||
           file.gcount() > 0) {
    }
  }
}

// Encoded images: the first one decoded, whose size and channels the header reports.
io::DecodedImage first_image(const io::Dataset& data) {
  std::vector<std::uint8_t> encoded;
  data.read_encoded(0, encoded);
  io::DecodedImage image;
  io::decode_image(encoded, image);
  return image;
}

// The floor: per shard an fd and the file offset of row 0 of 'inputs', asked
// of HDF5 directly; then one pread per row, nothing else.
class RawReader {
 public:
  explicit RawReader(const io::Dataset& data) : row_bytes_(data.sample_bytes()) {
    for (const io::ShardInfo& shard : data.shards()) {
      const hid_t file = H5Fopen(shard.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      const hid_t set = file < 0 ? -1 : H5Dopen2(file, "inputs", H5P_DEFAULT);
      const haddr_t offset = set < 0 ? HADDR_UNDEF : H5Dget_offset(set);
      if (set >= 0) H5Dclose(set);
      if (file >= 0) H5Fclose(file);
      if (offset == HADDR_UNDEF)
        throw IoError("the pread baseline needs contiguous shards; '" + shard.path.string() +
                      "' is not (write the dataset with lockstep-shard)");
      shards_.push_back(
          {::open(shard.path.c_str(), O_RDONLY | O_CLOEXEC), offset, shard.first_row + shard.rows});
    }
  }
  ~RawReader() {
    for (const Shard& s : shards_) ::close(s.fd);
  }
  void read_row(std::int64_t row, void* dst) const {
    std::size_t i = 0;
    while (row >= shards_[i].end) ++i;
    const std::int64_t first = i == 0 ? 0 : shards_[i - 1].end;
    const auto offset = static_cast<off_t>(shards_[i].offset + (row - first) * row_bytes_);
    if (::pread(shards_[i].fd, dst, row_bytes_, offset) != static_cast<ssize_t>(row_bytes_))
      throw IoError("pread baseline: short read");
  }

 private:
  struct Shard {
    int fd;
    std::uint64_t offset;
    std::int64_t end;
  };
  std::size_t row_bytes_;
  std::vector<Shard> shards_;
};

// Seconds for as many threads as `buffers` (one batch each) to read every
// batch of `order`, thread t taking batches t, t + threads, ...;
// `after_batch(t)` runs on the reading thread after each batch.
template <typename AfterBatch>
double raw_epoch(const RawReader& reader, const std::vector<std::int64_t>& order,
                 std::int64_t batch, std::size_t row_bytes, const std::vector<std::byte*>& buffers,
                 AfterBatch&& after_batch) {
  const std::int64_t batches = static_cast<std::int64_t>(order.size()) / batch;
  const int threads = static_cast<int>(buffers.size());
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (std::int64_t b = t; b < batches; b += threads) {
        for (std::int64_t i = 0; i < batch; ++i)
          reader.read_row(order[b * batch + i], buffers[t] + i * row_bytes);
        after_batch(t);
      }
    });
  for (std::thread& t : pool) t.join();
  return seconds_since(start);
}

double loader_epoch(io::DataLoader& loader, const core::Stream& stream) {
  const auto start = Clock::now();
  loader.start_epoch(0);
  while (loader.next()) {
  }
  stream.synchronize();
  return seconds_since(start);
}

struct Row {
  std::string what, baseline;
  double samples_per_s, gbs, baseline_samples_per_s, baseline_gbs, ratio;
};

// Medians of epochs timed in alternation; the ratio is the median of each
// pair's ratio, which a shared machine's changing load disturbs least.
Row compare(std::string what, std::string baseline, const std::vector<double>& ours_s,
            const std::vector<double>& base_s, double samples, double bytes) {
  std::vector<double> ratios;
  for (std::size_t i = 0; i < ours_s.size(); ++i) ratios.push_back(base_s[i] / ours_s[i]);
  const double ours = median(ours_s), base = median(base_s);
  return {std::move(what), std::move(baseline), samples / ours, bytes / ours / 1e9,
          samples / base,  bytes / base / 1e9,  median(ratios)};
}

// h5py reading the same batches: the script prints samples/s and GB/s.
std::optional<std::pair<double, double>> run_h5py(const std::string& python,
                                                  const std::string& script, const fs::path& data,
                                                  const std::vector<std::int64_t>& order,
                                                  std::int64_t batch) {
  const fs::path order_file =
      fs::temp_directory_path() / fmt::format("bench_loader_{}.i64", getpid());
  core::write_file(order_file,
                   std::string_view(reinterpret_cast<const char*>(order.data()),
                                    order.size() * sizeof(std::int64_t)),
                   "the h5py baseline's order file");
  const std::string command = fmt::format("{} {} --data {} --order {} --batch {}", python, script,
                                          data.string(), order_file.string(), batch);
  FILE* pipe = popen(command.c_str(), "r");
  double samples_per_s = 0, gbs = 0;
  const bool parsed = pipe && std::fscanf(pipe, "%lf %lf", &samples_per_s, &gbs) == 2;
  const int status = pipe ? pclose(pipe) : -1;
  fs::remove(order_file);
  if (!parsed || status != 0) {
    fmt::print(stderr, "bench_loader: h5py baseline failed ({}); is python3-h5py installed?\n",
               command);
    return std::nullopt;
  }
  return std::pair{samples_per_s, gbs};
}

#if LOCKSTEP_WITH_CUDA
// The loader's pinned host-to-device copy against a plain cudaMemcpyAsync of
// pinned batches of the same size. Reads must not be the bottleneck here, so
// the loader reads a cache-resident dataset: one shard of 8 batches, listed
// 40 times.
Row measure_h2d(const io::Dataset& data, const io::SamplerOptions& sampler, int threads,
                core::Device device, int trials) {
  const std::int64_t batch = sampler.micro_batch, rows = std::min(8 * batch, data.size());
  const fs::path dir = fs::temp_directory_path() / fmt::format("bench_loader_{}", getpid());
  fs::create_directories(dir);
  std::vector<std::int64_t> first(rows);
  for (std::int64_t i = 0; i < rows; ++i) first[i] = i;
  std::vector<std::byte> inputs(rows * data.sample_bytes());
  data.read_inputs(first, inputs.data());
  io::ShardWriter writer(dir / "hot.h5",
                         {data.format().input_dtype, data.format().sample_shape, DType::i64}, rows);
  writer.append(inputs.data(), data.labels().data(), rows);
  writer.close();
  const io::Dataset hot = io::Dataset::open(std::vector<fs::path>(40, dir / "hot.h5"));
  fs::remove_all(dir);  // the open shard stays readable

  const core::Stream consumer = core::Stream::create(device);
  io::DataLoader loader(
      hot, {.sampler = sampler, .threads = threads, .device = device, .stream = consumer});
  const std::int64_t batches = hot.size() / batch;
  const std::size_t batch_bytes = batch * data.sample_bytes();
  auto host = core::allocate_pinned(batch_bytes);
  auto target = core::allocate(device, batch_bytes, consumer);
  auto plain = [&] {
    const auto start = Clock::now();
    for (std::int64_t b = 0; b < batches; ++b)
      LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(target->data(), host->data(), batch_bytes,
                                          cudaMemcpyHostToDevice, consumer.handle()));
    consumer.synchronize();
    return seconds_since(start);
  };
  std::vector<double> ours, base;
  for (int t = 0; t < trials; ++t) {
    ours.push_back(loader_epoch(loader, consumer));
    base.push_back(plain());
  }
  const double samples = static_cast<double>(batches * batch);
  return compare("h2d (cuda)", "cudaMemcpyAsync", ours, base, samples,
                 samples * static_cast<double>(data.sample_bytes()));
}
#endif

// Images per second of `threads` threads decoding every image in `files`
// once (held in memory: the decode alone, no reads, crops or copies).
double decode_epoch(const std::vector<std::vector<std::uint8_t>>& files, int threads) {
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      io::DecodedImage image;
      for (std::size_t i = t; i < files.size(); i += threads) io::decode_image(files[i], image);
    });
  for (std::thread& t : pool) t.join();
  return static_cast<double>(files.size()) / seconds_since(start);
}

// The training pipeline of ImageNet recipes (random-resized-crop to `size`,
// flip, ImageNet's normalisation) for images of `channels`.
io::ImageOptions imagenet_pipeline(std::int64_t channels, std::int64_t size) {
  io::ImageOptions images{.channels = channels,
                          .height = size,
                          .width = size,
                          .crop = io::CropKind::random_resized,
                          .flip = true,
                          .mean = {0.485f, 0.456f, 0.406f},
                          .std = {0.229f, 0.224f, 0.225f},
                          .seed = 1};
  if (channels == 1) images.mean = {0.5f}, images.std = {0.25f};
  return images;
}

// Note [thread sweep]: one loader per thread count, each timed over whole
// epochs after one that warms it (threads started, pinned buffers made,
// pages cached), batches delivered where training takes them: host tensors
// on the cpu; on cuda u8 batches copied from pinned buffers on the loader's
// stream and normalised on the consumer's, which is synchronised before the
// clock stops. The rate a GPU's step consumes (ResNet-50 at batch 256 in
// fp16 on an H200: about 3000 images/s) is met by the fewest threads whose
// median reaches it; when none does, the best rate per thread says how many
// would at that rate, an estimate (a loader scales by threads until the
// cores, memory bandwidth or the copy run out).
int thread_sweep(const io::Dataset& data, std::int64_t batch, const std::vector<int>& sweep,
                 int trials, std::int64_t size, core::Device device, double target_images_per_s,
                 const std::string& json_path) {
  warm_page_cache(data);
  const io::DecodedImage image = first_image(data);
  const core::Stream consumer = core::Stream::create(device);
  fmt::print(
      "bench_loader (images, thread sweep): {} encoded images ({} x {} x {} first), batch {}, "
      "random-resized-crop to {} x {}, flip, normalise, delivered to {}; median of {} epochs "
      "after a warm one; {} threads (hardware)\n",
      data.size(), image.channels, image.height, image.width, batch, size, size, device.str(),
      trials, std::thread::hardware_concurrency());
  fmt::print("{:>8} {:>12} {:>12} {:>14}\n", "threads", "images/s", "per thread", "consumer wait");
  bench::JsonLines json(json_path);
  std::optional<int> enough;
  double best_per_thread = 0;
  for (const int threads : sweep) {
    io::LoaderOptions options{.sampler = {.micro_batch = batch, .seed = 1},
                              .threads = threads,
                              .device = device,
                              .stream = consumer};
    options.images = imagenet_pipeline(image.channels, size);
    io::DataLoader loader(data, options);
    const double per_epoch = static_cast<double>(loader.batches_per_epoch() * batch);
    std::vector<double> rates;
    for (int t = 0; t <= trials; ++t) {
      const auto start = Clock::now();
      loader.start_epoch(t);
      while (loader.next()) {
      }
      consumer.synchronize();
      if (t > 0) rates.push_back(per_epoch / seconds_since(start));
    }
    const double rate = median(rates);
    const io::LoaderStats stats = loader.stats();
    const double wait_ms =
        1e3 * stats.wait_s / static_cast<double>(std::max<std::int64_t>(1, stats.batches));
    best_per_thread = std::max(best_per_thread, rate / threads);
    if (rate >= target_images_per_s) enough = std::min(enough.value_or(threads), threads);
    fmt::print("{:>8} {:>12.0f} {:>12.0f} {:>11.2f} ms\n", threads, rate, rate / threads, wait_ms);
    json.write(
        {bench::field("bench", "loader_images_threads"), bench::field("device", device.str()),
         bench::field("threads", static_cast<long long>(threads)),
         bench::field("batch", static_cast<long long>(batch)),
         bench::field("size", static_cast<long long>(size)), bench::field("images_per_s", rate),
         bench::field("images_per_s_per_thread", rate / threads),
         bench::field("consumer_wait_ms_per_batch", wait_ms),
         bench::field("target_images_per_s", target_images_per_s)});
  }
  const int estimate =
      best_per_thread > 0 ? static_cast<int>(std::ceil(target_images_per_s / best_per_thread)) : 0;
  if (enough)
    fmt::print(
        "{} images/s (--target-images-per-s) needs {} loader thread{} here, delivered to {}\n",
        target_images_per_s, *enough, *enough == 1 ? "" : "s", device.str());
  else
    fmt::print(
        "{} images/s (--target-images-per-s): no thread count tried reaches it; at the best rate "
        "per thread ({:.0f} images/s) it would take about {} threads\n",
        target_images_per_s, best_per_thread, estimate);
  json.write({bench::field("bench", "loader_images_threads_needed"),
              bench::field("device", device.str()),
              bench::field("target_images_per_s", target_images_per_s),
              bench::field("threads_needed", enough),
              bench::field("threads_estimated", static_cast<long long>(estimate))});
  return 0;
}

// The image mode (encoded-image shards): the loader's decoded and augmented
// images/s against the decode alone and torchvision's DataLoader.
int image_bench(const io::Dataset& data, std::int64_t batch, int threads, int trials,
                std::int64_t size, const std::string& torch_python, const std::string& torch_src,
                const std::string& json_path) {
  warm_page_cache(data);
  const io::DecodedImage image = first_image(data);
  io::LoaderOptions options{.sampler = {.micro_batch = batch, .seed = 1}, .threads = threads};
  options.images = imagenet_pipeline(image.channels, size);
  io::DataLoader loader(data, options);
  const double per_epoch = static_cast<double>(loader.batches_per_epoch() * batch);
  std::vector<std::vector<std::uint8_t>> files(static_cast<std::size_t>(data.size()));
  for (std::int64_t i = 0; i < data.size(); ++i) data.read_encoded(i, files[i]);
  // Note [interleaved decode baseline]: each loader epoch is followed by an
  // epoch of the decode alone, so that both see the same load on a shared
  // machine; the ratio is the median of the pairs' ratios.
  std::vector<double> rates, decode_rates, ratios;
  for (int t = 0; t <= trials; ++t) {  // the first pair warms up
    const auto start = Clock::now();
    loader.start_epoch(t);
    while (loader.next()) {
    }
    const double rate = per_epoch / seconds_since(start),
                 decode_rate = decode_epoch(files, threads);
    if (t == 0) continue;
    rates.push_back(rate);
    decode_rates.push_back(decode_rate);
    ratios.push_back(rate / decode_rate);
  }
  const double ours = median(rates), decode = median(decode_rates), vs_decode = median(ratios);
  std::optional<double> torchvision;
  if (!torch_python.empty() && !torch_src.empty()) {
    const std::string command =
        fmt::format("{} {}/bench_loader_torchvision.py {} {} {} {} {}", torch_python,
                    LOCKSTEP_BENCH_SOURCE_DIR, torch_src, threads, batch, size, trials);
    if (FILE* pipe = popen(command.c_str(), "r")) {
      double value = 0;
      if (std::fscanf(pipe, "images_per_s %lf", &value) == 1) torchvision = value;
      pclose(pipe);
    }
    if (!torchvision) fmt::print(stderr, "bench_loader: `{}` gave no figure\n", command);
  }
  fmt::print(
      "bench_loader (images): {} encoded images ({} x {} x {} first), batch {}, {} threads, "
      "random-resized-crop to {} x {}, flip, normalise; median of {} epochs, each followed by "
      "one of the decode alone\n",
      data.size(), image.channels, image.height, image.width, batch, threads, size, size, trials);
  fmt::print("{:<34} {:>10} {:>14} {:>8}\n", "", "images/s", "per thread", "ours/it");
  fmt::print("{:<34} {:>10.0f} {:>14.0f} {:>8}\n", "lockstep loader (decode+augment)", ours,
             ours / threads, "");
  fmt::print("{:<34} {:>10.0f} {:>14.0f} {:>8.2f}\n", "TurboJPEG decode alone", decode,
             decode / threads, vs_decode);
  if (torchvision)
    fmt::print("{:<34} {:>10.0f} {:>14.0f} {:>8.2f}\n", "torchvision DataLoader (workers)",
               *torchvision, *torchvision / threads, ours / *torchvision);
  bench::JsonLines json(json_path);
  json.write({bench::field("bench", "loader_images"), bench::field("threads", (long long)threads),
              bench::field("batch", static_cast<long long>(batch)),
              bench::field("size", static_cast<long long>(size)),
              bench::field("lockstep_images_per_s", ours),
              bench::field("decode_images_per_s", decode),
              bench::field("ratio_vs_decode", vs_decode),
              bench::field("torchvision_images_per_s", torchvision)});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_loader: DataLoader throughput against raw pread and h5py"};
  std::string data_dir, json_path, device_text = "cpu", python = "/usr/bin/python3";
  std::string script = LOCKSTEP_BENCH_SOURCE_DIR "/bench_loader_h5py.py";
  std::int64_t batch = 256;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int trials = 9, depth = 0;
  std::uint64_t seed = 1;
  app.add_option("--data", data_dir, "dataset directory (lockstep-shard synthetic ...)")
      ->required();
  app.add_option("--batch", batch, "micro-batch (one rank)")->capture_default_str();
  app.add_option("--threads", threads, "loader threads, and pread baseline threads")
      ->capture_default_str();
  app.add_option("--depth", depth, "loader buffers (0: its default, 2 * threads + 2)")
      ->capture_default_str();
  app.add_option("--device", device_text, "cpu or cuda")->capture_default_str();
  app.add_option("--trials", trials, "epochs per measurement (median reported)")
      ->capture_default_str();
  app.add_option("--seed", seed, "permutation seed")->capture_default_str();
  app.add_option("--python", python, "python with h5py, or '' to skip h5py")->capture_default_str();
  app.add_option("--h5py-script", script, "the h5py side of the benchmark")->capture_default_str();
  app.add_option("--json", json_path, "write JSON lines here");
  // The image mode (encoded-image shards).
  std::int64_t image_size = 224;
  std::string torch_python, torch_src;
  app.add_option("--image-size", image_size, "encoded images: the crop's side")
      ->capture_default_str()
      ->check(examples::within(1, 4096));
  app.add_option("--torch-python", torch_python,
                 "encoded images: a python with torch and torchvision, for their DataLoader")
      ->check(examples::non_empty());
  app.add_option("--torch-src", torch_src,
                 "encoded images: the ImageFolder tree the shards were packed from")
      ->check(examples::non_empty());
  std::vector<int> threads_sweep;
  double target_images_per_s = 3000;
  app.add_option("--threads-sweep", threads_sweep,
                 "encoded images: images/s delivered to --device at each of these loader thread "
                 "counts (e.g. 1,2,4,8,16), and how many reach --target-images-per-s")
      ->delimiter(',')
      ->check(examples::threads_per_rank());
  app.add_option("--target-images-per-s", target_images_per_s,
                 "with --threads-sweep: the rate one GPU's step consumes (ResNet-50 at batch 256, "
                 "fp16, on an H200: about 3000)")
      ->capture_default_str()
      ->check(examples::within(1, 1e7));
  // What each flag accepts (examples/common/flags.h), checked while parsing.
  app.get_option("--data")->check(examples::non_empty());
  app.get_option("--batch")->check(examples::within(1, examples::kMaxRows));
  app.get_option("--threads")->check(examples::threads_per_rank());
  app.get_option("--depth")->check(examples::within(0, 1 << 16));
  app.get_option("--device")->check(examples::device_name());
  app.get_option("--trials")->check(examples::within(1, 1000));
  app.get_option("--seed")->check(examples::seed_value());
  app.get_option("--h5py-script")->check(examples::non_empty());
  app.get_option("--json")->check(examples::non_empty());
  CLI11_PARSE(app, argc, argv);

  try {
    const core::Device device = examples::usable_device(device_text);
    const io::Dataset data = io::Dataset::open(data_dir);
    if (batch > data.size())
      throw InvalidArgument(fmt::format("--batch {} is more than the {} samples of --data {}",
                                        batch, data.size(), data_dir));
    if (!threads_sweep.empty() && !data.format().encoded)
      throw InvalidArgument(fmt::format(
          "--threads-sweep times the image pipeline, but --data {} holds {} (write encoded-image "
          "shards with lockstep-shard images)",
          data_dir, data.format().str()));
    // Encoded images on cuda: the batches on the GPU, as training takes them
    // (the comparison with the decode alone and torchvision is the cpu's).
    if (!threads_sweep.empty() || (data.format().encoded && device.is_cuda()))
      return thread_sweep(data, batch,
                          threads_sweep.empty() ? std::vector<int>{threads} : threads_sweep, trials,
                          image_size, device, target_images_per_s, json_path);
    if (data.format().encoded)
      return image_bench(data, batch, threads, trials, image_size, torch_python, torch_src,
                         json_path);
    const std::size_t row_bytes = data.sample_bytes();
    const io::SamplerOptions sampler{.micro_batch = batch, .seed = seed};
    const std::vector<std::int64_t> order = io::DistributedSampler(data.size(), sampler).order(0);
    const std::int64_t batches = data.size() / batch;
    const double samples = static_cast<double>(batches * batch);
    const double bytes = samples * static_cast<double>(row_bytes);
    warm_page_cache(data);
    const RawReader reader(data);
    std::vector<Row> rows;
    io::DataLoader cpu_loader(data, {.sampler = sampler, .threads = threads, .depth = depth});
    fmt::print(
        "bench_loader: {} samples of {} ({} B), batch {}, {} threads, depth {}, {} batches "
        "({:.2f} GB) per epoch, median of {} epochs\n",
        data.size(), data.format().str(), row_bytes, batch, threads, cpu_loader.depth(), batches,
        bytes / 1e9, trials);
    std::vector<std::vector<std::byte>> host(threads, std::vector<std::byte>(batch * row_bytes));
    std::vector<std::byte*> host_buffers;
    for (auto& h : host) host_buffers.push_back(h.data());
    std::vector<double> ours, floor;
    for (int t = 0; t < trials; ++t) {
      ours.push_back(loader_epoch(cpu_loader, {}));
      floor.push_back(raw_epoch(reader, order, batch, row_bytes, host_buffers, [](int) {}));
    }
    rows.push_back(compare("loader (cpu)", "pread", ours, floor, samples, bytes));
    if (!python.empty())
      if (const auto h5py = run_h5py(python, script, data_dir, order, batch))
        rows.push_back({"loader (cpu)", "h5py", rows[0].samples_per_s, rows[0].gbs, h5py->first,
                        h5py->second, rows[0].samples_per_s / h5py->first});
#if LOCKSTEP_WITH_CUDA
    if (device.is_cuda()) {
      // Batches in GPU memory: the loader against raw preads into pinned
      // buffers, each followed by a plain cudaMemcpyAsync on its thread's stream.
      const core::Stream consumer = core::Stream::create(device);
      io::DataLoader gpu_loader(data, {.sampler = sampler,
                                       .threads = threads,
                                       .depth = depth,
                                       .device = device,
                                       .stream = consumer});
      std::vector<std::shared_ptr<core::Storage>> pinned, on_device;
      std::vector<std::byte*> pinned_buffers;
      std::vector<core::Stream> streams;
      for (int t = 0; t < threads; ++t) {
        pinned.push_back(core::allocate_pinned(batch * row_bytes));
        pinned_buffers.push_back(static_cast<std::byte*>(pinned.back()->data()));
        streams.push_back(core::Stream::create(device));
        on_device.push_back(core::allocate(device, batch * row_bytes, streams.back()));
      }
      auto copy = [&](int t) {
        LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(on_device[t]->data(), pinned[t]->data(),
                                            batch * row_bytes, cudaMemcpyHostToDevice,
                                            streams[t].handle()));
        streams[t].synchronize();
      };
      std::vector<double> gpu, raw_gpu;
      for (int t = 0; t < trials; ++t) {
        gpu.push_back(loader_epoch(gpu_loader, consumer));
        raw_gpu.push_back(raw_epoch(reader, order, batch, row_bytes, pinned_buffers, copy));
      }
      rows.push_back(compare("loader (cuda)", "pread+memcpy", gpu, raw_gpu, samples, bytes));
      rows.push_back(measure_h2d(data, sampler, threads, device, trials));
    }
#endif
    bench::JsonLines json(json_path);
    fmt::print("{:<14} {:>12} {:>8} {:>14} {:>12} {:>8} {:>7}\n", "lockstep", "samples/s", "GB/s",
               "baseline", "samples/s", "GB/s", "ratio");
    for (const Row& row : rows) {
      fmt::print("{:<14} {:>12.0f} {:>8.2f} {:>14} {:>12.0f} {:>8.2f} {:>7.3f}\n", row.what,
                 row.samples_per_s, row.gbs, row.baseline, row.baseline_samples_per_s,
                 row.baseline_gbs, row.ratio);
      json.write({bench::field("bench", "loader"), bench::field("lockstep", row.what),
                  bench::field("baseline", row.baseline), bench::field("device", device.str()),
                  bench::field("batch", static_cast<long long>(batch)),
                  bench::field("threads", static_cast<long long>(threads)),
                  bench::field("depth", static_cast<long long>(cpu_loader.depth())),
                  bench::field("sample_bytes", static_cast<long long>(row_bytes)),
                  bench::field("samples", static_cast<long long>(samples)),
                  bench::field("lockstep_samples_per_s", row.samples_per_s),
                  bench::field("lockstep_gbs", row.gbs),
                  bench::field("baseline_samples_per_s", row.baseline_samples_per_s),
                  bench::field("baseline_gbs", row.baseline_gbs),
                  bench::field("ratio", row.ratio)});
    }
    bench::print_legend(
        "per row, in the baseline column, read in the same run: raw pread of "
        "the same rows (the floor), h5py's sorted fancy indexing",
        "lockstep samples/s / baseline samples/s: higher is better");
    const io::LoaderStats stats = cpu_loader.stats();
    fmt::print("consumer wait (cpu loader): {:.3f} ms per batch\n",
               1e3 * stats.wait_s / std::max<std::int64_t>(1, stats.batches));
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_loader: {}\n", e.what());
    return 1;
  }
  return 0;
}
