// The process-wide fusion switch (kernels/fusion.h).
#include "kernels/fusion.h"

#include <atomic>

namespace lockstep::kernels {
namespace {
std::atomic<bool> fused_on{true};
}  // namespace

void set_fused_kernels(bool on) { fused_on = on; }
bool fused_kernels() { return fused_on; }

}  // namespace lockstep::kernels
