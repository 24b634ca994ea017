// test::TempDir: a directory of a test's own under TMPDIR, made by mkdtemp
// and removed with everything in it when the object goes, also when the test
// throws. The name has a fixed length (lockstep-test- and six characters).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace lockstep::test {

class TempDir {
 public:
  TempDir() {
    namespace fs = std::filesystem;
    std::string pattern = (fs::temp_directory_path() / "lockstep-test-XXXXXX").string();
    if (!mkdtemp(pattern.data()))
      throw std::runtime_error("TempDir: cannot make a directory like " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace lockstep::test
