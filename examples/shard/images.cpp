// lockstep-shard images (images.h). Note [ImageFolder order]: classes are the
// sorted names of the source's folders (class i is the i-th name, as
// torchvision's ImageFolder numbers them); within a class, files are ordered
// by (folder, file name) as ImageFolder's sorted os.walk visits them, and
// files whose extension (any case) is not .jpg, .jpeg or .png are skipped.
// Rows are written in that order, shard i holding rows [i*N/S, (i+1)*N/S).
// Each file's first bytes must be a JPEG or PNG signature; nothing is decoded.
//
// Note [class numbering]: a label is a class's place in the sorted names, so
// it means the same class in two splits only if both have the same classes.
// A class folder without an image is refused, as torchvision's ImageFolder
// refuses it (dropped, it would renumber every class after it: a val split
// missing one would disagree with its train split on every later label); a
// class name that cannot stand as one line of classes.txt (empty, "." or
// "..", or holding a newline, a carriage return or another control
// character) is refused, so that line i of classes.txt is always class i.
// lockstep-train compares the two splits' classes.txt (io::check_same_classes).
#include "images.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "engine/core/output_file.h"
#include "io/encoded_shard_writer.h"
#include "kernels/error.h"
#include "progress.h"

using namespace lockstep;
namespace fs = std::filesystem;

namespace {

struct Image {
  fs::path path;
  std::string class_name;
  std::int64_t bytes = 0;
  std::int64_t label = 0;
};

// Why class `name` cannot be one line of classes.txt (Note [class
// numbering]), or nothing when it can.
std::string class_name_problem(const std::string& name) {
  const auto control =
      std::find_if(name.begin(), name.end(), [](unsigned char c) { return c < 0x20 || c == 0x7F; });
  if (control != name.end()) return fmt::format("holds the control character {:?}", *control);
  if (name.empty() || name == "." || name == "..") return "is not a folder's name";
  return {};
}

bool is_image_name(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

std::vector<Image> from_folders(const fs::path& root, std::int64_t& skipped) {
  std::vector<Image> found;
  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(root))
    if (entry.is_directory()) classes.push_back(entry.path().filename().string());
  std::sort(classes.begin(), classes.end());
  if (classes.empty())
    throw InvalidArgument("--src '" + root.string() +
                          "' holds no class folders (an image folder is SRC/CLASS/FILE.jpg, "
                          "one folder per class)");
  for (const std::string& name : classes)
    if (const std::string problem = class_name_problem(name); !problem.empty())
      throw InvalidArgument(fmt::format(
          "--src '{}': class folder {:?} {}, but a class name is one line of classes.txt "
          "(rename the folder, in every split, to a name of printable characters)",
          root.string(), name, problem));
  for (const std::string& name : classes) {
    std::vector<Image> in_class;
    for (const auto& entry : fs::recursive_directory_iterator(
             root / name, fs::directory_options::follow_directory_symlink)) {
      if (!entry.is_regular_file()) continue;
      if (!is_image_name(entry.path())) {
        ++skipped;
        continue;
      }
      in_class.push_back({entry.path(), name});
    }
    if (in_class.empty())  // Note [class numbering]
      throw InvalidArgument(fmt::format(
          "class folder '{}' holds no .jpg, .jpeg or .png file: an empty class would renumber "
          "every class after it, so that a split without it disagrees with the others on their "
          "labels (torchvision's ImageFolder refuses it too); put the class's images in it, or "
          "remove the folder from every split",
          (root / name).string()));
    std::sort(in_class.begin(), in_class.end(), [](const Image& a, const Image& b) {
      return std::pair(a.path.parent_path().string(), a.path.filename().string()) <
             std::pair(b.path.parent_path().string(), b.path.filename().string());
    });
    found.insert(found.end(), in_class.begin(), in_class.end());
  }
  return found;
}

std::vector<Image> from_list(const fs::path& list) {
  std::ifstream in(list);
  if (!in) throw IoError("--src '" + list.string() + "': cannot open it (check the path)");
  std::vector<Image> found;
  std::string line;
  for (std::int64_t number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    fs::path path = line;
    if (path.is_relative()) path = list.parent_path() / path;
    if (!is_image_name(path))
      throw InvalidArgument(
          fmt::format("--src '{}', line {}: '{}' is not a .jpg, .jpeg or .png "
                      "file (list images only)",
                      list.string(), number, line));
    const std::string class_name = path.parent_path().filename().string();
    if (class_name.empty())
      throw InvalidArgument(
          fmt::format("--src '{}', line {}: '{}' is in no folder, and its "
                      "folder's name is its class",
                      list.string(), number, line));
    if (const std::string problem = class_name_problem(class_name); !problem.empty())
      throw InvalidArgument(fmt::format(
          "--src '{}', line {}: the class of '{}' is its folder's name, {:?}, which {} (list "
          "images by paths that end in CLASS/FILE, CLASS a name of printable characters)",
          list.string(), number, line, class_name, problem));
    found.push_back({path, class_name});
  }
  return found;
}

std::vector<std::uint8_t> read_image(const Image& image) {
  std::ifstream in(image.path, std::ios::binary);
  if (!in) throw IoError("image '" + image.path.string() + "': cannot open it");
  std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
  if (in.bad()) throw IoError("image '" + image.path.string() + "': reading it failed");
  static constexpr std::array<std::uint8_t, 3> kJpeg{0xFF, 0xD8, 0xFF};
  static constexpr std::array<std::uint8_t, 8> kPng{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  const bool jpeg =
      bytes.size() >= kJpeg.size() && std::equal(kJpeg.begin(), kJpeg.end(), bytes.begin());
  const bool png =
      bytes.size() >= kPng.size() && std::equal(kPng.begin(), kPng.end(), bytes.begin());
  if (!jpeg && !png)
    throw InvalidArgument("image '" + image.path.string() +
                          "' does not start as a JPEG or PNG file does (its name says it is one: "
                          "convert it, or remove it from the source)");
  return bytes;
}

}  // namespace

int images(const ImagesOptions& o) {
  std::error_code error;
  const bool folders = fs::is_directory(o.src, error);
  if (!folders && !fs::is_regular_file(o.src, error))
    throw IoError("--src '" + o.src.string() +
                  "' is neither a directory of class folders nor a list file");
  std::int64_t skipped = 0;
  std::vector<Image> found = folders ? from_folders(o.src, skipped) : from_list(o.src);
  std::vector<std::string> classes;
  for (const Image& image : found) classes.push_back(image.class_name);
  std::sort(classes.begin(), classes.end());
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  const auto total = static_cast<std::int64_t>(found.size());
  if (o.shards > total)
    throw InvalidArgument(
        fmt::format("--shards {} is more than the {} images found in '{}': "
                    "every shard needs an image",
                    o.shards, total, o.src.string()));
  for (Image& image : found) {
    image.label =
        std::lower_bound(classes.begin(), classes.end(), image.class_name) - classes.begin();
    const std::uintmax_t size = fs::file_size(image.path, error);
    if (error) throw IoError("image '" + image.path.string() + "': " + error.message());
    if (size == 0)
      throw InvalidArgument("image '" + image.path.string() +
                            "' is empty (0 bytes): replace it with the image it should be, or "
                            "remove it from the source");
    image.bytes = static_cast<std::int64_t>(size);
  }
  fs::create_directories(o.out, error);
  if (error) throw IoError("cannot create directory '" + o.out.string() + "': " + error.message());
  for (const auto& entry : fs::directory_iterator(o.out))
    if (entry.path().extension() == ".h5")
      throw IoError("directory '" + o.out.string() + "' already holds shards (" +
                    entry.path().filename().string() +
                    "); remove them or write to an empty directory");
  examples::Progress progress("images", total);
  std::int64_t bytes = 0;
  for (int s = 0; s < o.shards; ++s) {
    const std::int64_t begin = total * s / o.shards, end = total * (s + 1) / o.shards;
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = begin; i < end; ++i) sizes.push_back(found[i].bytes);
    io::EncodedShardWriter writer(o.out / fmt::format("shard-{:05d}-of-{:05d}.h5", s, o.shards),
                                  sizes);
    for (std::int64_t i = begin; i < end; ++i) {
      const std::vector<std::uint8_t> image = read_image(found[i]);
      if (static_cast<std::int64_t>(image.size()) != found[i].bytes)
        throw IoError(fmt::format(
            "image '{}' had {} bytes when the source was listed and has {} now (it changed "
            "while being packed: pack a source nothing writes to)",
            found[i].path.string(), found[i].bytes, image.size()));
      writer.append(image, found[i].label);
      bytes += found[i].bytes;
      progress.update(i + 1);
    }
    writer.close();
  }
  std::string names;
  for (const std::string& name : classes) names += name + '\n';
  core::write_file(o.out / "classes.txt", names,
                   "the class list");  // Note [one way to write a file]
  fmt::print("wrote {} images ({} bytes, {} classes{}) in {} shards to {}\n", total, bytes,
             classes.size(),
             skipped ? fmt::format(", {} files of other types skipped", skipped) : std::string(),
             o.shards, o.out.string());
  return 0;
}
