// The MPI communicator's collectives across ranks. Each rank's data is a known
// function of (rank, index), so every rank computes the expected result
// itself. Float data are multiples of 1/8 below 2 in magnitude: exact in f16
// and bf16, with exact sums over a few ranks, so sums compare exactly and
// means with the independently rounded exact mean (see mismatches()).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "comm/comm_test_support.h"
#include "comm/detail/check_mpi.h"
#include "mpi/mpi_world.h"

using namespace lockstep;
using comm::ReduceOp;
using core::Tensor;

namespace {

const std::int64_t kSizes[] = {0, 1, 2, 3, 17, 1000, 65537, 300001};

double value(int rank, std::int64_t i) {
  return static_cast<double>((i * 7 + rank * 13) % 33 - 16) / 8;
}

double round_to(DType dtype, double x) {
  return dtype == DType::f16    ? test::round_f16(x)
         : dtype == DType::bf16 ? test::round_bf16(x)
                                : static_cast<double>(static_cast<float>(x));
}

// A host tensor of n elements copied from `data`; Tensor::from_host needs a
// non-null source even for none.
Tensor host_tensor(const void* data, std::int64_t n, DType dtype) {
  return n == 0 ? Tensor::empty({0}, dtype) : Tensor::from_host(data, {n}, dtype);
}

// Rank `rank`'s data for index i in [first, first + n), in `dtype`.
Tensor rank_data(int rank, std::int64_t first, std::int64_t n, DType dtype) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<float>(value(rank, first + i));
  return host_tensor(v.data(), n, DType::f32).cast(dtype);
}

// The expected reduction at index i: the exact sum, or the exact mean rounded once.
double expected(int size, std::int64_t i, ReduceOp op, DType dtype) {
  double sum = 0;
  for (int r = 0; r < size; ++r) sum += value(r, i);
  return op == ReduceOp::sum ? sum : round_to(dtype, sum / size);
}

// Sums are exact. A mean is the exact sum times the f32 reciprocal of the
// size: within one f32 ulp of the exact mean; rounded to f16 or bf16 it is
// the correctly rounded mean, since these means (m / 24 and the like) lie
// far from every 16-bit rounding boundary compared with that ulp.
std::size_t mismatches(const Tensor& got, std::int64_t first, int size, ReduceOp op) {
  if (got.numel() == 0) return 0;  // to_vector needs a non-null destination
  const std::vector<float> v = got.cast(DType::f32).to_vector<float>();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double want = expected(size, first + static_cast<std::int64_t>(i), op, got.dtype());
    const float near = static_cast<float>(want);
    const double ulp = std::nextafter(near, INFINITY) - near;
    const bool f32_mean = op == ReduceOp::avg && got.dtype() == DType::f32;
    wrong += f32_mean ? std::fabs(v[i] - want) > ulp : static_cast<double>(v[i]) != want;
  }
  return wrong;
}

// memcmp, for buffers that may be empty (and then null).
bool same_bytes(const void* a, const void* b, std::size_t bytes) {
  return bytes == 0 || std::memcmp(a, b, bytes) == 0;
}

// Bytes that differ from rank to rank, for the collectives that only move data.
std::vector<std::uint8_t> rank_bytes(int rank, std::size_t count) {
  std::vector<std::uint8_t> bytes(count);
  for (std::size_t i = 0; i < count; ++i)
    bytes[i] = static_cast<std::uint8_t>(rank * 31 + i * 7 + 1);
  return bytes;
}

const DType kAllTypes[] = {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8};

}  // namespace

TEST_CASE("allreduce sums and averages every float dtype across ranks", "[mpi][collectives]") {
  comm::Communicator& comm = test::mpi_world().host();
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
      for (std::int64_t n : kSizes) {
        Tensor x = rank_data(comm.rank(), 0, n, dtype);
        comm.allreduce(x, op);
        INFO(dtype_name(dtype) << " " << comm::reduce_op_name(op) << " of " << n);
        CHECK(mismatches(x, 0, comm.size(), op) == 0);
      }
}

TEST_CASE("allreduce results are the same bits on every rank", "[mpi][collectives]") {
  // Random f32 data: sums are rounded, in an order MPI chooses. Every rank
  // must still get identical bits (replicas stay identical), close to the
  // f64 sum: within (size - 1) roundings of the sum of magnitudes.
  comm::Communicator& comm = test::mpi_world().host();
  const std::int64_t n = 100003;
  auto random_values = [](int rank, std::int64_t count) {
    std::mt19937 rng(static_cast<unsigned>(rank) + 100);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(static_cast<std::size_t>(count));
    for (float& x : v) x = dist(rng);
    return v;
  };
  Tensor x = Tensor::from_vector(random_values(comm.rank(), n), {n}, DType::f32);
  comm.allreduce(x, ReduceOp::sum);
  Tensor all = Tensor::empty({n * comm.size()}, DType::f32);
  comm.allgather(x, all);
  const std::vector<float> gathered = all.to_vector<float>();
  std::size_t differ = 0;
  for (int r = 1; r < comm.size(); ++r)
    if (std::memcmp(gathered.data(), gathered.data() + r * n, n * sizeof(float)) != 0) ++differ;
  CHECK(differ == 0);
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < comm.size(); ++r) inputs.push_back(random_values(r, n));
  std::size_t far = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double sum = 0, magnitude = 0;
    for (const auto& in : inputs) {
      sum += in[static_cast<std::size_t>(i)];
      magnitude += std::fabs(in[static_cast<std::size_t>(i)]);
    }
    if (std::fabs(gathered[static_cast<std::size_t>(i)] - sum) >
        comm.size() * std::ldexp(magnitude, -24))
      ++far;
  }
  CHECK(far == 0);
}

TEST_CASE("broadcast copies the root's elements of any dtype to every rank", "[mpi][collectives]") {
  comm::Communicator& comm = test::mpi_world().host();
  for (DType dtype : kAllTypes)
    for (int root = 0; root < comm.size(); ++root)
      for (std::int64_t n : {0, 1, 3, 1001, 300001}) {
        const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dtype);
        const auto mine = rank_bytes(comm.rank(), bytes);
        Tensor x = host_tensor(mine.data(), n, dtype);
        comm.broadcast(x, root);
        INFO(dtype_name(dtype) << " x " << n << " from rank " << root);
        CHECK(same_bytes(x.data(), rank_bytes(root, bytes).data(), bytes));
      }
}

TEST_CASE("allgather places rank r's elements at r * count, for any dtype", "[mpi][collectives]") {
  comm::Communicator& comm = test::mpi_world().host();
  for (DType dtype : kAllTypes)
    for (std::int64_t n : {0, 1, 3, 1001, 100003})
      for (bool in_place : {false, true}) {
        const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dtype);
        Tensor all = Tensor::zeros({n * comm.size()}, dtype);
        const auto mine = rank_bytes(comm.rank(), bytes);
        if (in_place) {
          if (bytes > 0)
            std::memcpy(static_cast<char*>(all.data()) + comm.rank() * bytes, mine.data(), bytes);
          comm.allgather(all.view(n * comm.rank(), {n}), all);
        } else {
          comm.allgather(host_tensor(mine.data(), n, dtype), all);
        }
        std::size_t wrong = 0;
        for (int r = 0; r < comm.size(); ++r)
          wrong += !same_bytes(static_cast<const char*>(all.data()) + r * bytes,
                               rank_bytes(r, bytes).data(), bytes);
        INFO(dtype_name(dtype) << " x " << n << (in_place ? " in place" : ""));
        CHECK(wrong == 0);
      }
}

TEST_CASE("reduce_scatter leaves each rank the reduction of its slice", "[mpi][collectives]") {
  comm::Communicator& comm = test::mpi_world().host();
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
      for (std::int64_t n : {0, 1, 5, 1001, 65537})
        for (bool in_place : {false, true}) {
          Tensor send = rank_data(comm.rank(), 0, n * comm.size(), dtype);
          Tensor recv = in_place ? send.view(n * comm.rank(), {n}) : Tensor::zeros({n}, dtype);
          comm.reduce_scatter(send, recv, op);
          INFO(dtype_name(dtype) << " " << comm::reduce_op_name(op) << " of " << n
                                 << (in_place ? " in place" : ""));
          CHECK(mismatches(recv, n * comm.rank(), comm.size(), op) == 0);
        }
}

TEST_CASE("barrier returns only when every rank has reached it", "[mpi][collectives]") {
  // Rank r arrives r x 100 ms late, so every rank leaves about
  // (size - 1) x 100 ms after the previous barrier; 50 ms absorbs the
  // ranks' skew in leaving that one.
  comm::Communicator& comm = test::mpi_world().host();
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(100 * comm.rank()));
  comm.barrier();
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  CHECK(waited_ms >= 100.0 * (comm.size() - 1) - 50.0);
}

TEST_CASE("a duplicated communicator runs collectives beside the original, from another thread",
          "[mpi][collectives]") {
  comm::Communicator& comm = test::mpi_world().host();
  std::unique_ptr<comm::Communicator> dup = comm.duplicate("second");
  CHECK(dup->label() == "second");
  CHECK(dup->rank() == comm.rank());
  std::size_t wrong_main = 0, wrong_dup = 0;
  auto repeat = [&](comm::Communicator& c, float per_rank, std::size_t& wrong) {
    for (int i = 0; i < 200; ++i) {
      float x[7];
      for (float& v : x) v = per_rank * static_cast<float>(c.rank() + 1);
      c.allreduce(x, 7, DType::f32, ReduceOp::sum);
      const float want = per_rank * static_cast<float>(c.size() * (c.size() + 1) / 2);
      for (float v : x) wrong += v != want;
    }
  };
  std::thread other([&] { repeat(*dup, 2.0f, wrong_dup); });
  repeat(comm, 1.0f, wrong_main);
  other.join();
  CHECK(wrong_main == 0);
  CHECK(wrong_dup == 0);
}

TEST_CASE("an MPI error names the call, the place and MPI's own text", "[mpi][errors]") {
  CHECK_THROWS_WITH(LOCKSTEP_CHECK_MPI(MPI_ERR_COUNT), Catch::Contains("MPI error") &&
                                                           Catch::Contains("invalid count") &&
                                                           Catch::Contains("test_collectives.cpp"));
  // A real failing call: a negative count, returned rather than fatal on
  // lockstep's own communicators (MPI_ERRORS_RETURN).
  MPI_Comm dup = MPI_COMM_NULL;
  REQUIRE(MPI_Comm_dup(MPI_COMM_WORLD, &dup) == MPI_SUCCESS);
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  float x = 0;
  CHECK_THROWS_WITH(LOCKSTEP_CHECK_MPI(MPI_Bcast(&x, -1, MPI_FLOAT, 0, dup)),
                    Catch::Contains("MPI_Bcast(&x, -1, MPI_FLOAT, 0, dup)"));
  MPI_Comm_free(&dup);
}
