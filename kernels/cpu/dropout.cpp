// CPU dropout mask application (kernels/dropout.h).
#include "kernels/dropout.h"

#include <bit>
#include <cstdint>

#include "kernels/detail/cpu_float.h"

namespace lockstep::kernels::cpu {

void apply_mask(const void* x, const std::uint8_t* mask, void* y, DType type, std::int64_t n,
                float scale) {
  detail::require_float(type, "apply_mask");
  // x[i] is loaded whatever the mask says: a load under the condition may not
  // be speculated, so the loop would branch on random bits and mispredict on
  // a fraction p of the elements. The f32 loop selects with a bit mask (all
  // ones or zero, giving +0.0f as the select did), which GCC vectorises; a
  // select on the u8 mask it leaves scalar.
  if (type == DType::f32) {
    const auto* in = static_cast<const float*>(x);
    auto* out = static_cast<float*>(y);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint32_t keep_bits = 0u - static_cast<std::uint32_t>(mask[i] != 0);
      out[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(in[i] * scale) & keep_bits);
    }
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const float kept = detail::load_f32(x, type, i) * scale;
    detail::store_f32(y, type, i, mask[i] ? kept : 0.0f);
  }
}

}  // namespace lockstep::kernels::cpu
