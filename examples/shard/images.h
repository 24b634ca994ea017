// lockstep-shard images: JPEG and PNG files packed, undecoded, into
// encoded-image shards (docs/data-format.md), classes named by folders as
// torchvision's ImageFolder names them.
#pragma once

#include <filesystem>

struct ImagesOptions {
  // A directory CLASS/.../FILE (ImageFolder), or a text file listing one
  // image path a line (relative paths from the list's directory), each
  // image's class being the name of the folder it is in.
  std::filesystem::path src;
  std::filesystem::path out;
  int shards = 1;
};

// Writes OUT/shard-*.h5 and OUT/classes.txt; returns the exit code.
int images(const ImagesOptions& options);
