// CPU dropout mask application (kernels/dropout.h).
#include "kernels/dropout.h"

#include "kernels/detail/cpu_float.h"

namespace lockstep::kernels::cpu {

void apply_mask(const void* x, const std::uint8_t* mask, void* y, DType type, std::int64_t n,
                float scale) {
  detail::require_float(type, "apply_mask");
  for (std::int64_t i = 0; i < n; ++i)
    detail::store_f32(y, type, i, mask[i] ? detail::load_f32(x, type, i) * scale : 0.0f);
}

}  // namespace lockstep::kernels::cpu
