// Links the installed lockstep and multiplies two small matrices with it.
#include <cstdio>

#include "engine/core/ops.h"
#include "engine/core/tensor.h"

int main() {
  using namespace lockstep::core;
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}, lockstep::DType::f32);
  Tensor c = Tensor::zeros({2, 2}, lockstep::DType::f32);
  ops::matmul(a, a, c);
  const auto v = c.to_vector<float>();
  std::printf("consumer: [[%g, %g], [%g, %g]]\n", v[0], v[1], v[2], v[3]);
  return v == std::vector<float>{7, 10, 15, 22} ? 0 : 1;
}
