// bench_allreduce: lockstep's allreduce against the raw library call on the
// same buffers in the same run (MPI_Allreduce on host buffers, ncclAllReduce
// on a GPU), 4 KiB to 256 MiB, with nccl-tests' algbw and busbw. (The
// synchroniser's overlap with a real backward pass is bench_scaling's question.)
// Run it under mpiexec (e.g. mpiexec -n 2); rank 0 prints and writes JSON.
#include <fmt/core.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "bench/report.h"
#include "comm/host_buffer.h"
#include "comm/world.h"
#include "examples/common/flags.h"

#if LOCKSTEP_WITH_CUDA
#include "comm/detail/check_nccl.h"
#include "comm/detail/nccl_communicator.h"
#endif

using namespace lockstep;
using comm::ReduceOp;
using core::Tensor;

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  std::vector<std::int64_t> sizes;
  int trials = 5;
  bool huge_pages = true;
  bench::JsonLines* json = nullptr;
};

// The slowest rank's seconds: a collective is as fast as its last rank.
double slowest(MPI_Comm comm, double seconds) {
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
  return seconds;
}

// Median seconds per call of `ours` and `raw`, in alternating batches. Every
// rank runs the same number of calls (a collective cannot be calibrated per
// rank): enough for about 64 MiB per batch, at least 2 and at most 20000.
template <typename Ours, typename Raw, typename Sync>
std::pair<double, std::optional<double>> time_pair(MPI_Comm comm, std::int64_t bytes, int trials,
                                                   Ours&& ours, std::optional<Raw> raw,
                                                   Sync&& sync) {
  const int calls = static_cast<int>(std::clamp<std::int64_t>((64 << 20) / bytes, 2, 20000));
  auto batch = [&](auto&& run) {
    MPI_Barrier(comm);
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) run();
    sync();
    return slowest(comm, std::chrono::duration<double>(Clock::now() - start).count()) / calls;
  };
  batch(ours);  // warm-up: connections, first-touch of pages
  if (raw) batch(*raw);
  std::vector<double> a, b;
  for (int t = 0; t < trials; ++t) {
    a.push_back(batch(ours));
    if (raw) b.push_back(batch(*raw));
  }
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::optional<double> raw_s;
  if (raw) raw_s = b[b.size() / 2];
  return {a[a.size() / 2], raw_s};
}

void report_row(const Config& config, int ranks, const std::string& device, std::int64_t bytes,
                DType dtype, ReduceOp op, double ours_s, std::optional<double> raw_s) {
  const double bus_factor = ranks > 1 ? 2.0 * (ranks - 1) / ranks : 0.0;
  const double algbw = static_cast<double>(bytes) / ours_s / 1e9;
  std::optional<double> raw_busbw, ratio;
  if (raw_s) {
    raw_busbw = static_cast<double>(bytes) / *raw_s / 1e9 * bus_factor;
    ratio = *raw_s / ours_s;  // equals the busbw ratio, and is defined at one rank
  }
  fmt::print("{:>11} {:>5} {:>4} {:>11.1f} {:>9.2f} {:>9.2f} {:>11} {:>9} {:>7}\n", bytes,
             dtype_name(dtype), comm::reduce_op_name(op), ours_s * 1e6, algbw, algbw * bus_factor,
             raw_s ? fmt::format("{:.1f}", *raw_s * 1e6) : "-",
             raw_busbw ? fmt::format("{:.2f}", *raw_busbw) : "-",
             ratio ? fmt::format("{:.3f}", *ratio) : "-");
  config.json->write(
      {bench::field("bench", "allreduce"), bench::field("device", device),
       bench::field("ranks", static_cast<long long>(ranks)),
       bench::field("size_bytes", static_cast<long long>(bytes)),
       bench::field("dtype", dtype_name(dtype)), bench::field("op", comm::reduce_op_name(op)),
       bench::field("huge_pages", config.huge_pages ? "yes" : "no"),
       bench::field("lockstep_time_us", ours_s * 1e6), bench::field("lockstep_algbw_gbs", algbw),
       bench::field("lockstep_busbw_gbs", algbw * bus_factor),
       bench::field("raw_time_us", raw_s ? std::optional(*raw_s * 1e6) : std::nullopt),
       bench::field("raw_busbw_gbs", raw_busbw), bench::field("ratio", ratio)});
}

void print_header(bool rank0, const char* raw_name) {
  if (!rank0) return;
  fmt::print("{:>11} {:>5} {:>4} {:>11} {:>9} {:>9} {:>11} {:>9} {:>7}\n", "bytes", "dtype", "op",
             "lockstep us", "algbw", "busbw", fmt::format("{} us", raw_name), "raw busbw", "ratio");
}

// Host buffers: lockstep's MPI communicator against MPI_Allreduce on the same
// buffer. MPI has no 16-bit float type, so those rows have no baseline. MPI
// has no average either: the avg baseline is what a program would write,
// MPI_SUM and then a pass multiplying by 1/size.
void run_host(comm::World& world, const Config& config, const std::vector<DType>& dtypes) {
  MPI_Comm raw_comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw_comm);
  const bool rank0 = world.rank() == 0;
  print_header(rank0, "MPI");
  for (DType dtype : dtypes)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      if (dtype != DType::f32 && op == ReduceOp::avg) continue;
      for (std::int64_t bytes : config.sizes) {
        const std::int64_t count = bytes / static_cast<std::int64_t>(dtype_size(dtype));
        Tensor buffer = config.huge_pages ? comm::empty_host_buffer({count}, dtype)
                                          : Tensor::empty({count}, dtype);
        buffer.fill_(0.0);  // sums of zeros stay zero however often they run
        void* data = buffer.data();
        auto ours = [&] { world.host().allreduce(data, count, dtype, op); };
        std::optional<std::function<void()>> raw;
        const float reciprocal = 1.0f / static_cast<float>(world.size());
        if (dtype == DType::f32)
          raw = [&] {
            MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                          raw_comm);
            if (op == ReduceOp::sum) return;
            float* x = static_cast<float*>(data);
            for (std::int64_t i = 0; i < count; ++i) x[i] *= reciprocal;
          };
        const auto [ours_s, raw_s] = time_pair(raw_comm, bytes, config.trials, ours, raw, [] {});
        if (rank0) report_row(config, world.size(), "cpu", bytes, dtype, op, ours_s, raw_s);
      }
    }
  MPI_Comm_free(&raw_comm);
}

#if LOCKSTEP_WITH_CUDA
// Device buffers: lockstep's NCCL communicator against ncclAllReduce on the
// same communicator, buffer and stream.
void run_gpu(comm::World& world, const Config& config, const std::vector<DType>& dtypes) {
  auto& nccl = dynamic_cast<comm::detail::NcclCommunicator&>(world.for_device(world.device()));
  const core::Stream stream = core::Stream::create(world.device());
  const bool rank0 = world.rank() == 0;
  print_header(rank0, "NCCL");
  for (DType dtype : dtypes)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
      for (std::int64_t bytes : config.sizes) {
        const std::int64_t count = bytes / static_cast<std::int64_t>(dtype_size(dtype));
        Tensor buffer = Tensor::zeros({count}, dtype, world.device(), stream);
        void* data = buffer.data();
        const ncclDataType_t type = dtype == DType::f16    ? ncclFloat16
                                    : dtype == DType::bf16 ? ncclBfloat16
                                                           : ncclFloat32;
        auto ours = [&] { nccl.allreduce(data, count, dtype, op, stream); };
        std::optional<std::function<void()>> raw = [&] {
          LOCKSTEP_CHECK_NCCL(ncclAllReduce(data, data, static_cast<std::size_t>(count), type,
                                            op == ReduceOp::sum ? ncclSum : ncclAvg, nccl.handle(),
                                            stream.handle()));
        };
        const auto [ours_s, raw_s] = time_pair(MPI_COMM_WORLD, bytes, config.trials, ours, raw,
                                               [&] { stream.synchronize(); });
        if (rank0)
          report_row(config, world.size(), world.device().str(), bytes, dtype, op, ours_s, raw_s);
      }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "bench_allreduce: lockstep's allreduce against the raw MPI/NCCL call (run under "
      "mpiexec)"};
  std::string device_text = "cpu", json_path;
  std::vector<std::string> dtype_names{"f32", "bf16"};
  Config config;
  bool no_huge_pages = false;
  app.add_option("--device", device_text, "cpu (MPI) or cuda (NCCL)")->capture_default_str();
  app.add_option("--dtype", dtype_names, "f32, bf16, f16")->capture_default_str();
  app.add_option("--sizes", config.sizes, "message sizes in bytes (default 4 KiB..256 MiB, x4)");
  app.add_option("--trials", config.trials, "timed batches per size (median)")
      ->capture_default_str();
  app.add_flag("--no-huge-pages", no_huge_pages, "host buffers on ordinary 4 KiB pages");
  app.add_option("--json", json_path, "write JSON lines here (rank 0)");
  // What each flag accepts (examples/common/flags.h), checked while parsing.
  app.get_option("--device")->check(examples::device_name());
  app.get_option("--dtype")->check(examples::one_of({"f32", "bf16", "f16"}));
  app.get_option("--sizes")->check(examples::within(4, 1LL << 32));
  app.get_option("--trials")->check(examples::within(1, 1000));
  app.get_option("--json")->check(examples::non_empty());
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<comm::World> world;
  try {
    const core::Device device = core::parse_device(device_text);
    world = comm::init(argc, argv, {.use_gpu = device.is_cuda()});
    if (!world->uses_mpi())
      throw InvalidArgument("bench_allreduce needs MPI: run it under mpiexec (e.g. -n 2)");
    if (device.is_cuda() && !world->device().is_cuda())
      throw InvalidArgument("--device cuda: no GPU is bound to this rank");
    config.huge_pages = !no_huge_pages;
    if (config.sizes.empty())
      for (std::int64_t bytes = 4 << 10; bytes <= (std::int64_t{256} << 20); bytes *= 4)
        config.sizes.push_back(bytes);
    std::vector<DType> dtypes;
    for (const std::string& name : dtype_names) {
      const DType type = name == "bf16" ? DType::bf16 : name == "f16" ? DType::f16 : DType::f32;
      if (name != dtype_name(type))
        throw InvalidArgument("--dtype '" + name + "' is not f32, bf16 or f16");
      dtypes.push_back(type);
    }
    bench::JsonLines json(world->rank() == 0 ? json_path : "");
    config.json = &json;
    if (world->rank() == 0)
      fmt::print("allreduce over {} ranks, {} buffers{}\n", world->size(), device.str(),
                 device.is_cuda()    ? ""
                 : config.huge_pages ? " on huge pages"
                                     : " on 4 KiB pages");
#if LOCKSTEP_WITH_CUDA
    if (device.is_cuda())
      run_gpu(*world, config, dtypes);
    else
      run_host(*world, config, dtypes);
#else
    run_host(*world, config, dtypes);
#endif
    if (world->rank() == 0)
      bench::print_legend(
          device.is_cuda() ? "raw ncclAllReduce on the same buffer, timed alternately"
                           : "raw MPI_Allreduce on the same buffer (avg: MPI_SUM, then a pass "
                             "multiplying by 1/size, as a program would write it)",
          "baseline time / lockstep time: higher is better, 1 is parity",
          device.is_cuda() ? "" : "f16/bf16 rows: MPI has no 16-bit float type to compare with");
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_allreduce: {}\n", e.what());
    if (world && world->size() > 1) world->abort(e.what(), 1);
    return 1;
  }
  world->shutdown();
  return 0;
}
