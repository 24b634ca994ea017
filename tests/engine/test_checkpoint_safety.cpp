// Checkpoint saving under faults (Notes [checkpoint retention], [checkpoint
// commit], [checkpoint image], [checkpoint lock]): a fresh run refuses a used
// directory, retention keeps the newest, a full tmpfs (mounted here as root)
// leaves earlier checkpoints, no temporaries and no HDF5 identifier open at
// any free space or inode count, symlinks at temporary names are never written
// through, and a directory's lock has one holder at a time.
#include <fmt/core.h>
#include <hdf5.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/checkpoint_file.h"
#include "engine/core/output_file.h"
#include "io/hdf5.h"
#include "io/shard_fixtures.h"

using namespace lockstep;
using namespace lockstep::engine;
using test::TempDir;
namespace fs = std::filesystem;

namespace {

CheckpointContents contents_of(std::int64_t elements, float value) {
  CheckpointContents c;
  c.tensors["/model/w"] = core::Tensor::zeros({elements}, DType::f32);
  c.tensors["/model/w"].fill_(value);
  c.attributes["step"] = std::int64_t{1};
  return c;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A tmpfs of `size` mounted at a fresh directory, unmounted when the test ends
// (also when it fails). mounted() is false where mounting is not allowed.
class SmallTmpfs {
 public:
  explicit SmallTmpfs(const std::string& size) {
    const std::string options = "size=" + size + ",mode=0700";
    if (::mount("lockstep-test", dir_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
                options.c_str()) == 0)
      mounted_ = true;
    else
      reason_ = std::strerror(errno);
  }
  ~SmallTmpfs() {
    if (mounted_ && ::umount(dir_.path().c_str()) != 0) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& reason() const { return reason_; }
  const fs::path& path() const { return dir_.path(); }
  // Unmounts now; false when something still holds a file open there.
  bool unmount() {
    if (!mounted_) return true;
    mounted_ = ::umount(dir_.path().c_str()) != 0;
    return !mounted_;
  }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string reason_;
};

}  // namespace

TEST_CASE("a fresh run refuses a directory that already holds checkpoints",
          "[engine][checkpoint]") {
  TempDir dir;
  CheckpointDirectory(dir.path(), 2, CheckpointStart::fresh).save(100, contents_of(4, 1));
  try {
    CheckpointDirectory(dir.path(), 2, CheckpointStart::fresh);
    FAIL("a fresh run accepted a directory holding ckpt-100.h5");
  } catch (const CheckpointDirectoryInUse& e) {
    CHECK(e.newest().filename() == "ckpt-100.h5");
    CHECK_THAT(e.what(), Catch::Contains(dir.path().string()) && Catch::Contains("ckpt-100.h5") &&
                             Catch::Contains("resume") && Catch::Contains("another directory"));
  }
  CHECK_NOTHROW(CheckpointDirectory(dir.path(), 2, CheckpointStart::resume));
  // Other files do not count as checkpoints.
  TempDir other;
  std::ofstream(other / "notes.txt") << "x";
  std::ofstream(other / "ckpt-007.h5") << "not a name save() writes";
  CHECK_NOTHROW(CheckpointDirectory(other.path(), 2, CheckpointStart::fresh));
}

TEST_CASE("retention never deletes the checkpoint just written nor a newer one",
          "[engine][checkpoint]") {
  // The bug this guards against: a run resumed from an early checkpoint into
  // a directory holding later ones pruned by count, and with keep_last 1
  // deleted the checkpoint it had just written.
  TempDir dir;
  CheckpointDirectory first(dir.path(), 5, CheckpointStart::fresh);
  for (int step : {10, 20, 100}) first.save(step, contents_of(4, static_cast<float>(step)));
  CheckpointDirectory resumed(dir.path(), 1, CheckpointStart::resume);
  const fs::path written = resumed.save(21, contents_of(4, 21));
  CHECK(fs::exists(written));
  CHECK_NOTHROW(verify_checkpoint(written));
  // keep_last 1 = only the new one among steps <= 21; step 100 is left alone.
  CHECK(names_in(dir.path()) == std::vector<std::string>{"ckpt-100.h5", "ckpt-100.h5.crc32",
                                                         "ckpt-21.h5", "ckpt-21.h5.crc32"});
  CHECK(resumed.latest_good()->filename() == "ckpt-100.h5");
  // keep_last 3 keeps the new one and two older ones.
  CheckpointDirectory three(dir.path(), 3, CheckpointStart::resume);
  for (int step : {22, 23, 24}) three.save(step, contents_of(4, static_cast<float>(step)));
  std::vector<std::string> steps;
  for (const fs::path& p : three.list()) steps.push_back(p.filename().string());
  CHECK(steps == std::vector<std::string>{"ckpt-22.h5", "ckpt-23.h5", "ckpt-24.h5", "ckpt-100.h5"});
}

TEST_CASE("a symlink planted at a temporary name is never written through",
          "[engine][checkpoint]") {
  TempDir dir, elsewhere;
  const fs::path victim = elsewhere / "victim.txt";
  std::ofstream(victim) << "precious";
  // The exclusive creators refuse the name and leave the target alone.
  fs::create_symlink(victim, dir / "link");
  CHECK_THROWS_WITH(core::create_exclusive(dir / "link"), Catch::Contains("already there"));
  {
    io::Hdf5Lock lock;
    CHECK_THROWS_WITH(io::create_hdf5_file(dir / "link"), Catch::Contains("already there"));
  }
  fs::create_symlink(elsewhere / "absent.h5", dir / "dangling");
  CHECK_THROWS_AS(core::create_exclusive(dir / "dangling"), IoError);
  CHECK_FALSE(fs::exists(elsewhere / "absent.h5"));
  CHECK(test::file_text(victim) == "precious");

  // save() removes whatever is at its temporary names (the links, not their
  // targets) before creating them exclusively, under the lock.
  CheckpointDirectory ckpts(dir.path(), 3, CheckpointStart::fresh, CheckpointLock::hold);
  fs::create_symlink(victim, dir / ".ckpt-7.h5.tmp");
  fs::create_symlink(victim, dir / ".ckpt-7.h5.crc32.tmp");
  const fs::path file = ckpts.save(7, contents_of(8, 7));
  CHECK(test::file_text(victim) == "precious");
  CHECK(fs::is_regular_file(fs::symlink_status(file)));
  CHECK_FALSE(fs::exists(fs::symlink_status(dir / ".ckpt-7.h5.tmp")));
  CHECK(read_checkpoint(file).tensors.at("/model/w").to_vector<float>() ==
        std::vector<float>(8, 7.0f));
}

TEST_CASE("a full disk fails the save and keeps earlier checkpoints, with no temporaries",
          "[engine][checkpoint]") {
  SmallTmpfs disk("256k");
  if (!disk.mounted()) {
    WARN("cannot mount a tmpfs (" << disk.reason()
                                  << "; needs root): the full-disk test did not run");
    return;
  }
  {
    CheckpointDirectory ckpts(disk.path() / "ckpts", 3, CheckpointStart::fresh);
    const fs::path good = ckpts.save(1, contents_of(1024, 1.5f));  // 4 KiB of weights
    // 1 MiB of weights cannot fit in 256 KiB.
    CHECK_THROWS_WITH(ckpts.save(2, contents_of(256 * 1024, 2.5f)),
                      Catch::Contains("ckpt-2.h5") && Catch::Contains("earlier checkpoints") &&
                          Catch::Contains("No space left on device"));
    CHECK(names_in(disk.path() / "ckpts") ==
          std::vector<std::string>{"ckpt-1.h5", "ckpt-1.h5.crc32"});
    CHECK(read_checkpoint(good).tensors.at("/model/w").to_vector<float>() ==
          std::vector<float>(1024, 1.5f));
    // A disk already full to the last block: the save fails at its first write.
    {
      std::ofstream filler(disk.path() / "filler", std::ios::binary);
      const std::string block(1024, 'x');
      while (filler.write(block.data(), block.size()) && filler.flush()) {
      }
    }
    CHECK_THROWS_AS(ckpts.save(3, contents_of(16, 3)), IoError);
    fs::remove(disk.path() / "filler");
    CHECK(names_in(disk.path() / "ckpts") ==
          std::vector<std::string>{"ckpt-1.h5", "ckpt-1.h5.crc32"});
    CHECK(ckpts.latest_good()->filename() == "ckpt-1.h5");
  }
  // Nothing holds a file open on the full disk: HDF5 closed the failed file.
  CHECK(disk.unmount());
}

TEST_CASE("a directory's lock refuses a second holder by name until the first lets go",
          "[engine][checkpoint]") {
  TempDir dir;
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  const std::string me = fmt::format("host {} pid {} started ", host, ::getpid());
  {
    CheckpointDirectory first(dir.path(), 3, CheckpointStart::fresh, CheckpointLock::hold);
    CHECK_THAT(test::file_text(dir / kLockFileName), Catch::StartsWith(me));
    try {
      CheckpointDirectory second(dir.path(), 3, CheckpointStart::resume, CheckpointLock::hold);
      FAIL("a second holder took the lock");
    } catch (const CheckpointDirectoryLocked& e) {
      CHECK_THAT(e.holder(), Catch::StartsWith(me));
      CHECK_THAT(e.what(), Catch::Contains(dir.path().string()) && Catch::Contains(me) &&
                               Catch::Contains("another directory"));
    }
    // A reader takes no lock; its save leaves a temporary it finds alone
    // (it may be the holder's) and fails.
    std::ofstream(dir / ".ckpt-5.h5.tmp") << "the holder's";
    CHECK_THROWS_WITH(
        CheckpointDirectory(dir.path(), 3, CheckpointStart::resume).save(5, contents_of(4, 5)),
        Catch::Contains(".ckpt-5.h5.tmp") && Catch::Contains("already there"));
    CHECK(test::file_text(dir / ".ckpt-5.h5.tmp") == "the holder's");
    // The holder removes it as a leftover.
    CHECK_NOTHROW(first.save(5, contents_of(4, 5)));
    CHECK(names_in(dir.path()) ==
          std::vector<std::string>{"ckpt-5.h5", "ckpt-5.h5.crc32", kLockFileName});
  }
  // Released with its holder; the lock file stays and the next holder rewrites it.
  CheckpointDirectory again(dir.path(), 3, CheckpointStart::resume, CheckpointLock::hold);
  CHECK_THAT(test::file_text(dir / kLockFileName), Catch::StartsWith(me));
}

TEST_CASE("a save that runs out of space in any phase leaves HDF5 no identifier open",
          "[engine][checkpoint]") {
  SmallTmpfs disk("4m");
  if (!disk.mounted()) {
    WARN("cannot mount a tmpfs (" << disk.reason()
                                  << "; needs root): the full-disk sweep did not run");
    return;
  }
  // Many small datasets and attributes (HDF5 keeps them in its caches until
  // the flush on close) and a large one (written through at H5Dwrite).
  CheckpointContents big = contents_of(32 * 1024, 2.5f);
  for (int i = 0; i < 40; ++i) {
    big.tensors["/optimizer/p" + std::to_string(i) + "/exp_avg"] =
        core::Tensor::zeros({300}, DType::f32);
    big.attributes["config.field" + std::to_string(i)] = std::string(200, 'a' + i % 26);
  }
  const fs::path dir = disk.path() / "ckpts";
  CheckpointDirectory ckpts(dir, 3, CheckpointStart::fresh, CheckpointLock::hold);
  const fs::path good = ckpts.save(1, contents_of(1024, 1.5f));
  const auto before = names_in(dir);
  auto free_bytes = [&] {
    struct statvfs s {};
    REQUIRE(::statvfs(disk.path().c_str(), &s) == 0);
    return static_cast<std::uint64_t>(s.f_bavail) * s.f_frsize;
  };
  const std::uint64_t page = 4096;
  int failed = 0;
  bool saved = false;
  // Free space from 0 up, a page at a time, until the save fits: every
  // phase of the save (create, datasets, attributes, the flush on close,
  // fsync, the checksum file) meets the full disk at some size.
  for (std::uint64_t pages = 0; pages < 1000 && !saved; ++pages) {
    INFO("free pages: " << pages);
    {
      std::ofstream filler(disk.path() / "filler", std::ios::binary | std::ios::trunc);
      const std::uint64_t fill = free_bytes() - pages * page;
      const std::string block(page, 'x');
      for (std::uint64_t written = 0; written < fill; written += page)
        filler.write(block.data(), static_cast<std::streamsize>(std::min(page, fill - written)));
    }
    try {
      ckpts.save(2, big);
      saved = true;
    } catch (const IoError& e) {
      ++failed;
      CHECK_THAT(e.what(), Catch::Contains("ckpt-2.h5") && Catch::Contains("earlier checkpoints"));
      CHECK(names_in(dir) == before);
    }
    {
      io::Hdf5Lock lock;
      CHECK(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) == 0);
    }
    fs::remove(disk.path() / "filler");
  }
  CHECK(failed > 10);  // the image and then the checksum file met the full disk
  REQUIRE(saved);
  CHECK(read_checkpoint(good).tensors.at("/model/w").to_vector<float>() ==
        std::vector<float>(1024, 1.5f));
  CHECK(read_checkpoint(dir / "ckpt-2.h5").tensors.at("/model/w").to_vector<float>() ==
        std::vector<float>(32 * 1024, 2.5f));
}

TEST_CASE("a save that runs out of inodes fails cleanly at either file's creation",
          "[engine][checkpoint]") {
  for (const int free_inodes : {0, 1}) {  // the image's temporary; the checksum file's
    INFO("free inodes: " << free_inodes);
    SmallTmpfs disk("4m,nr_inodes=64");
    if (!disk.mounted()) {
      WARN("cannot mount a tmpfs (" << disk.reason()
                                    << "; needs root): the inode test did not run");
      return;
    }
    const fs::path dir = disk.path() / "ckpts";
    CheckpointDirectory ckpts(dir, 3, CheckpointStart::fresh, CheckpointLock::hold);
    const fs::path good = ckpts.save(1, contents_of(1024, 1.5f));
    const auto before = names_in(dir);
    auto inodes_left = [&] {
      struct statvfs s {};
      REQUIRE(::statvfs(disk.path().c_str(), &s) == 0);
      return static_cast<int>(s.f_favail);
    };
    for (int i = 0; inodes_left() > free_inodes; ++i)
      std::ofstream(disk.path() / ("filler-" + std::to_string(i)));
    CHECK_THROWS_WITH(
        ckpts.save(2, contents_of(64, 2.5f)),
        Catch::Contains(free_inodes == 0 ? ".ckpt-2.h5.tmp" : ".ckpt-2.h5.crc32.tmp") &&
            Catch::Contains("earlier checkpoints are untouched") &&
            Catch::Contains("No space left on device"));
    CHECK(names_in(dir) == before);
    {
      io::Hdf5Lock lock;
      CHECK(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) == 0);
    }
    CHECK(read_checkpoint(good).tensors.at("/model/w").to_vector<float>() ==
          std::vector<float>(1024, 1.5f));
  }
}
