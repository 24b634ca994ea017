// The segment-table check shared by the CPU and CUDA optimizer steps
// (kernels/optimizer.h).
#include <string>

#include "kernels/error.h"
#include "kernels/optimizer.h"

namespace lockstep::kernels {

void validate_segments(const OptimizerSegment* segments, std::int64_t segment_count,
                       int group_count, const char* op) {
  for (std::int64_t s = 0; s < segment_count; ++s) {
    const OptimizerSegment& segment = segments[s];
    if (segment.group < 0 || segment.group >= group_count)
      throw InvalidArgument(std::string(op) + ": segment " + std::to_string(s) + " at offset " +
                            std::to_string(segment.offset) + " names group " +
                            std::to_string(segment.group) + ", but there are " +
                            std::to_string(group_count) +
                            " groups (build the table from the groups it is stepped with)");
  }
}

}  // namespace lockstep::kernels
