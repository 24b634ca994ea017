// Argument checks shared by the CPU and CUDA attention pieces (kernels/attention.h).
#include <string>

#include "kernels/attention.h"
#include "kernels/error.h"

namespace lockstep::kernels {

void validate_attention(const AttentionShape& s) {
  if (s.batch <= 0 || s.seq <= 0 || s.heads <= 0 || s.head_dim <= 0 || s.parts <= 0)
    throw InvalidArgument("attention: sizes batch=" + std::to_string(s.batch) +
                          " seq=" + std::to_string(s.seq) + " heads=" + std::to_string(s.heads) +
                          " head_dim=" + std::to_string(s.head_dim) +
                          " parts=" + std::to_string(s.parts) + " must all be positive");
  if (!is_floating(s.type))
    throw InvalidArgument(std::string("attention: dtype ") + dtype_name(s.type) +
                          " is not f32, f16 or bf16");
}

}  // namespace lockstep::kernels
