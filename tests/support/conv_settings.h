// ConvSettingsScope: the process-wide convolution settings (kernels::
// set_deterministic, set_conv_autotune) set for one test and restored after.
#pragma once

#include "kernels/conv.h"

namespace lockstep::test {

class ConvSettingsScope {
 public:
  // Keeps the settings as they are, to be restored at the end.
  ConvSettingsScope() = default;
  ConvSettingsScope(bool deterministic, bool timed) {
    kernels::set_deterministic(deterministic);
    kernels::set_conv_autotune(timed);
  }
  // conv_autotune() reads false while deterministic whatever the setting
  // (Note [conv algorithm choice]): a deterministic start restores timing on.
  ~ConvSettingsScope() {
    kernels::set_deterministic(was_deterministic_);
    kernels::set_conv_autotune(was_timed_ || was_deterministic_);
  }
  ConvSettingsScope(const ConvSettingsScope&) = delete;
  ConvSettingsScope& operator=(const ConvSettingsScope&) = delete;

 private:
  bool was_deterministic_ = kernels::deterministic();
  bool was_timed_ = kernels::conv_autotune();
};

}  // namespace lockstep::test
