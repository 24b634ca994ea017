// Formats and throws library-call failures for the check macros.
#include "kernels/error.h"

#include <string>

namespace lockstep::detail {

void throw_library_error(const char* library, long code, const std::string& library_message,
                         const char* call, const char* file, int line) {
  std::string message = std::string(library) + " error " + std::to_string(code) + " (" +
                        library_message + ") in " + call + " at " + file + ":" +
                        std::to_string(line);
  throw LibraryError(library, code, message);
}

}  // namespace lockstep::detail
