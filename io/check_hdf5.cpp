// The HDF5 lock and the error-stack walk behind LOCKSTEP_CHECK_HDF5 (io/check_hdf5.h).
#include "io/check_hdf5.h"

#include <string>

namespace lockstep::io {
namespace {

std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

std::string error_text(hid_t id) {
  char text[256] = {};
  H5E_type_t type;
  if (H5Eget_msg(id, &type, text, sizeof text) < 0) return "?";
  return text;
}

herr_t append_frame(unsigned n, const H5E_error2_t* frame, void* out) {
  auto& text = *static_cast<std::string*>(out);
  if (n > 0) text += "; ";
  text += std::string(frame->func_name ? frame->func_name : "?") + ": " +
          (frame->desc && *frame->desc ? frame->desc : "error") + " (" +
          error_text(frame->maj_num) + " / " + error_text(frame->min_num) + ")";
  return 0;
}

}  // namespace

Hdf5Lock::Hdf5Lock() : lock_(hdf5_mutex()) {
  static thread_local const bool quiet = H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0;
  (void)quiet;
}

namespace detail {

std::string hdf5_error_stack() {
  Hdf5Lock lock;
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, append_frame, &text);
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? "no HDF5 error stack" : text;
}

void throw_hdf5_error(long code, const char* call, const char* file, int line) {
  lockstep::detail::throw_library_error("HDF5", code, hdf5_error_stack(), call, file, line);
}

}  // namespace detail
}  // namespace lockstep::io
