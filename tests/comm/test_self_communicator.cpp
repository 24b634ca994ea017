// The one-rank communicator, and the argument checks every communicator
// shares (comm/communicator.cpp). With one rank the sum and the mean are the
// rank's own values and gathers are copies, so expected values are the inputs.
#include <catch2/catch.hpp>

#include <vector>

#include "comm/self_communicator.h"
#include "kernels/error.h"

using namespace lockstep;
using comm::ReduceOp;
using core::Tensor;

TEST_CASE("one rank's collectives return its own values", "[comm][self]") {
  comm::SelfCommunicator self;
  CHECK(self.rank() == 0);
  CHECK(self.size() == 1);
  CHECK(self.device() == core::Device::cpu());
  CHECK(std::string(self.backend()) == "self");
  CHECK(self.watchdog() == nullptr);

  const std::vector<float> values{1.5f, -2.0f, 3.25f};
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    Tensor x = Tensor::from_vector(values, {3}, DType::f32);
    self.allreduce(x, op);
    CHECK(x.to_vector<float>() == values);
  }
  Tensor ints = Tensor::from_vector<std::int64_t>({4, 5}, {2}, DType::i64);
  self.broadcast(ints, 0);
  CHECK(ints.to_vector<std::int64_t>() == std::vector<std::int64_t>{4, 5});

  Tensor send = Tensor::from_vector(values, {3}, DType::f32);
  Tensor recv = Tensor::zeros({3}, DType::f32);
  self.allgather(send, recv);
  CHECK(recv.to_vector<float>() == values);
  Tensor scattered = Tensor::zeros({3}, DType::f32);
  self.reduce_scatter(send, scattered, ReduceOp::avg);
  CHECK(scattered.to_vector<float>() == values);
  self.allgather(recv.data(), recv.data(), 3, DType::f32);  // in place
  CHECK(recv.to_vector<float>() == values);
  self.allreduce(nullptr, 0, DType::bf16, ReduceOp::sum);  // nothing to do is fine
  self.barrier();

  auto dup = self.duplicate("other");
  CHECK(dup->label() == "other");
  CHECK(dup->size() == 1);
}

TEST_CASE("communicators reject bad arguments with messages that name them", "[comm][self]") {
  comm::SelfCommunicator self("world");
  Tensor ints = Tensor::zeros({4}, DType::i32);
  CHECK_THROWS_WITH(self.allreduce(ints, ReduceOp::sum),
                    Catch::Contains("allreduce on 'world'") && Catch::Contains("i32"));
  Tensor send = Tensor::zeros({4}, DType::f32);
  Tensor small = Tensor::zeros({3}, DType::f32);
  CHECK_THROWS_WITH(self.allgather(send, small), Catch::Contains("1 ranks x 4 f32"));
  CHECK_THROWS_WITH(self.reduce_scatter(send, small, ReduceOp::sum),
                    Catch::Contains("reduce_scatter on 'world'") &&
                        Catch::Contains("1 ranks x 3 f32 elements, got 4 f32"));
  Tensor halves = Tensor::zeros({4}, DType::f16);
  CHECK_THROWS_AS(self.allgather(send, halves), InvalidArgument);
  CHECK_THROWS_WITH(self.broadcast(send, 1), Catch::Contains("root 1 is not a rank of 1"));
  CHECK_THROWS_WITH(self.allreduce(nullptr, 5, DType::f32, ReduceOp::sum),
                    Catch::Contains("allreduce on 'world': null buffer for 5 elements"));
  CHECK_THROWS_WITH(self.allreduce(send.data(), -1, DType::f32, ReduceOp::sum),
                    Catch::Contains("allreduce on 'world': negative element count -1"));
  Tensor undefined;
  CHECK_THROWS_WITH(self.broadcast(undefined, 0),
                    Catch::Contains("broadcast on 'world': the tensor is undefined"));
}
