// CPU row-block copies (kernels/dim_copy.h): one memcpy per row.
#include <cstring>

#include "kernels/dim_copy.h"

namespace lockstep::kernels::cpu {

void copy_rows(const RowCopy& c) {
  const auto row_bytes = static_cast<std::size_t>(c.row_elems) * c.element_bytes;
  if (row_bytes == 0) return;
  const auto* src = static_cast<const char*>(c.src);
  auto* dst = static_cast<char*>(c.dst);
  for (std::int64_t r = 0; r < c.rows; ++r)
    std::memcpy(dst + static_cast<std::size_t>(r * c.dst_stride) * c.element_bytes,
                src + static_cast<std::size_t>(r * c.src_stride) * c.element_bytes, row_bytes);
}

}  // namespace lockstep::kernels::cpu
