// Checked reads of HDF5 files lockstep may not have written (io/hdf5.h,
// Note [hostile files]): the superblock check made before HDF5 opens a file,
// extents, dataset and attribute names gathered without letting exceptions
// cross HDF5's callbacks, and type-, rank- and size-checked reads.
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <exception>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "io/hdf5.h"
#include "kernels/checked_math.h"
#include "kernels/half.h"

namespace lockstep::io {
namespace {

namespace fs = std::filesystem;

constexpr std::array<unsigned char, 8> kSignature = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
constexpr std::uint64_t kUndefinedAddress = ~std::uint64_t{0};
constexpr std::size_t kMaxStringBytes = 64 * 1024;

std::string quoted(const fs::path& file) { return fmt::format("'{}'", file.string()); }

// Reads up to `bytes` at `offset`; returns how many were read.
std::size_t read_at(int fd, void* out, std::size_t bytes, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, static_cast<char*>(out) + done, bytes - done,
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

std::uint64_t little_endian_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Wraps an HDF5 callback's body: no exception crosses into HDF5's C frames.
// The first one is kept in `error` and the iteration stopped (return -1); the
// caller rethrows it once HDF5 has returned.
template <typename Body>
herr_t guarded(std::exception_ptr& error, Body&& body) noexcept {
  try {
    body();
    return 0;
  } catch (...) {
    error = std::current_exception();
    return -1;
  }
}

struct NameList {
  std::vector<std::string> names;
  std::exception_ptr error;
};

herr_t collect_attribute(hid_t, const char* name, const H5A_info_t*, void* data) noexcept {
  auto& list = *static_cast<NameList*>(data);
  return guarded(list.error, [&] { list.names.emplace_back(name); });
}

std::vector<std::string> finish(NameList& list, herr_t status, const std::string& object,
                                const char* what) {
  if (list.error) std::rethrow_exception(list.error);
  if (status < 0)
    throw IoError(object + ": HDF5 cannot list its " + what + ": " + hdf5_error_stack() +
                  " (the file is damaged: re-create it)");
  std::sort(list.names.begin(), list.names.end());
  return std::move(list.names);
}

// Note [float conversion]: HDF5 1.10 converts f64 to f32 by sending values
// above FLT_MAX to infinity, where round-to-nearest keeps those within half
// an ulp at FLT_MAX; and its soft f16 conversion is not the one lockstep's
// kernels use. So HDF5 only delivers the stored values in native byte order
// (double, or half bits) and the conversion to f32 is C++'s (f64: the
// current rounding mode, nearest-even) and kernels/half.h's (f16: exact).

// Whether `type` is an IEEE binary float of `bits` (16, 32 or 64) in either byte order.
bool is_ieee_float(hid_t type, std::size_t bits) {
  struct Fields {
    std::size_t spos, epos, esize, mpos, msize, ebias;
  };
  constexpr Fields f16{15, 10, 5, 0, 10, 15}, f32{31, 23, 8, 0, 23, 127},
      f64{63, 52, 11, 0, 52, 1023};
  const Fields want = bits == 16 ? f16 : bits == 32 ? f32 : f64;
  if (H5Tget_class(type) != H5T_FLOAT || H5Tget_size(type) * 8 != bits ||
      H5Tget_precision(type) != bits || H5Tget_offset(type) != 0)
    return false;
  Fields got{};
  LOCKSTEP_CHECK_HDF5(H5Tget_fields(type, &got.spos, &got.epos, &got.esize, &got.mpos, &got.msize));
  got.ebias = H5Tget_ebias(type);
  return got.spos == want.spos && got.epos == want.epos && got.esize == want.esize &&
         got.mpos == want.mpos && got.msize == want.msize && got.ebias == want.ebias;
}

// A local heap (file format specification, III.D): "HEAP", version 0, then
// its data segment's size and address. HDF5 1.10 allocates the declared size
// before it reads a byte, so a damaged size is an allocation of any size.
template <typename Fail>
void check_local_heap(int fd, std::uint64_t base, std::uint64_t bytes, std::uint64_t heap,
                      const Fail& fail) {
  std::array<unsigned char, 32> header{};
  if (heap > bytes || bytes - heap < header.size() ||
      read_at(fd, header.data(), header.size(), base + heap) != header.size() ||
      std::memcmp(header.data(), "HEAP", 4) != 0 || header[4] != 0)
    fail(fmt::format("has no valid local heap for its root group at address {}", heap));
  const std::uint64_t size = little_endian_u64(&header[8]), at = little_endian_u64(&header[24]);
  if (size > bytes || at > bytes - size)
    fail(fmt::format("has a root group heap of {} bytes at address {}, outside its {} bytes", size,
                     at, bytes));
  // The free list: HDF5 1.10 follows it to its end marker (1) and allocates an
  // entry per block, so a list that loops back is an allocation without end
  // (the checkpoint fuzzer: 1.4 GB in 44 million entries). Its blocks are at
  // least 16 bytes and lie apart inside the segment, so a list longer than
  // size / 16 has a loop.
  constexpr std::uint64_t kFreeListEnd = 1, kFreeBlock = 16;
  std::uint64_t free_block = little_endian_u64(&header[16]);
  for (std::uint64_t blocks = 0; free_block != kFreeListEnd; ++blocks) {
    std::array<unsigned char, kFreeBlock> entry{};
    if (blocks > size / kFreeBlock || free_block > size || size - free_block < kFreeBlock ||
        read_at(fd, entry.data(), entry.size(), base + at + free_block) != entry.size())
      fail(
          fmt::format("has a heap at address {} whose free list is damaged (block {} at offset {} "
                      "of {} bytes)",
                      heap, blocks, free_block, size));
    free_block = little_endian_u64(&entry[0]);
  }
}

// Note [object headers]: the messages of an object's header (format
// specification IV.A.1.a, version 1 headers, continuation chunks followed),
// checked before HDF5 decodes any of them: each must lie inside its chunk; an
// attribute message must hold its name, ended by a NUL, datatype and
// dataspace (HDF5 1.10 decodes a dataspace size larger than its message by
// reading freed memory, and copies a name with strdup; the checkpoint
// fuzzer); no datatype may have member names (compound, enum, array or
// sequence types: HDF5 copies the names with strdup too; the checkpoint
// fuzzer); and no message may live in a shared-message heap (HDF5 1.10 reads
// such a message through a NULL buffer when the file has no shared-message
// table; the shard fuzzer), a feature neither h5py nor lockstep writes. The
// root's header is checked before the file is opened, every other object's
// once it is open (check_object_headers). Version 2 headers carry a checksum
// HDF5 verifies.
template <typename Fail>
void check_object_header(int fd, std::uint64_t base, std::uint64_t bytes, std::uint64_t object,
                         const std::string& name, const Fail& fail) {
  // Datatypes with member names (compound, enum, and arrays or sequences of
  // them): HDF5 1.10 copies each name with strdup, unbounded. lockstep reads
  // numbers and strings only, so these are refused unread.
  const auto check_datatype = [&](const unsigned char* t, const std::string& where) {
    const unsigned kind = t[0] & 0x0f;
    if (kind == 6 || kind == 8 || kind == 10 || (kind == 9 && (t[1] & 0x0f) != 1))
      fail(
          fmt::format("has a datatype of HDF5 class {} in {} (a compound, enum, array or "
                      "sequence); lockstep reads numbers and strings",
                      kind, where));
  };
  std::array<unsigned char, 16> prefix{};
  if (object > bytes || bytes - object < prefix.size() ||
      read_at(fd, prefix.data(), prefix.size(), base + object) != prefix.size() || prefix[0] != 1)
    return;  // not a version 1 header: HDF5 checks it
  std::vector<std::pair<std::uint64_t, std::uint64_t>> chunks{
      {object + 16,
       prefix[8] | prefix[9] << 8 | prefix[10] << 16 | std::uint64_t{prefix[11]} << 24}};
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const auto [at, size] = chunks[c];
    if (c >= 64 || at > bytes || size > bytes - at)
      fail(fmt::format("has a header chunk of {} bytes at address {} for {}, outside the file",
                       size, at, name));
    std::vector<unsigned char> chunk(size);
    if (read_at(fd, chunk.data(), chunk.size(), base + at) != chunk.size())
      fail(fmt::format("ends inside the header of {}", name));
    for (std::size_t p = 0; p + 8 <= chunk.size();) {
      const unsigned type = chunk[p] | chunk[p + 1] << 8, length = chunk[p + 2] | chunk[p + 3] << 8;
      const bool shared = (chunk[p + 4] & 0x02) != 0;
      const unsigned char* m = chunk.data() + p + 8;
      if (length > chunk.size() - p - 8)
        fail(fmt::format("has a header message of {} bytes past its chunk in {}", length, name));
      // A shared message starts with its sharing version and kind; HDF5 1.10
      // reads kind 1, "in the shared-message heap", from versions 2 and 3.
      if (shared && length >= 2 && m[0] >= 2 && m[1] == 1)
        fail(
            fmt::format("keeps a header message of {} in a shared-message heap (a feature "
                        "lockstep does not read)",
                        name));
      if (type == 0x10 && length >= 16)
        chunks.emplace_back(little_endian_u64(m), little_endian_u64(m + 8));
      // The symbol table message names the heap HDF5 reads the group's link
      // names from, which need not be the superblock's cached one (the shard
      // fuzzer: a NULL read in H5HL_protect).
      if (type == 0x11 && length >= 16)
        check_local_heap(fd, base, bytes, little_endian_u64(m + 8), fail);
      if (type == 0x0c && !shared) {
        const auto pad = [&](std::uint64_t n) { return m[0] == 1 ? (n + 7) / 8 * 8 : n; };
        const std::uint64_t header = m[0] == 1 ? 8 : m[0] == 2 ? 8 : 9;
        const std::uint64_t need = length < 8 ? ~std::uint64_t{0}
                                              : header + pad(m[2] | m[3] << 8) +
                                                    pad(m[4] | m[5] << 8) + pad(m[6] | m[7] << 8);
        if (m[0] < 1 || m[0] > 3 || need > length)
          fail(fmt::format("has an attribute message of {} bytes that needs {} in {}", length, need,
                           name));
        // HDF5 copies the name with strdup: it must end inside its field.
        const unsigned name_bytes = m[2] | m[3] << 8;
        if (name_bytes == 0 || m[header + name_bytes - 1] != 0)
          fail(fmt::format("has an attribute name that does not end in its {} bytes in {}",
                           name_bytes, name));
        if ((m[4] | m[5] << 8) >= 2)
          check_datatype(
              m + header + pad(name_bytes),
              fmt::format("attribute '{}' of {}", reinterpret_cast<const char*>(m + header), name));
      }
      if (type == 0x03 && !shared && length >= 2) check_datatype(m, name);
      p += 8 + length;
    }
  }
}

// Note [object walk]: HDF5 1.10's H5Ovisit recurses through groups without
// bound. A damaged group that links back to itself, with a reference count of
// 1 so that HDF5 does not remember it, recurses until the stack overflows or
// crawls building ever longer path names (both fuzzers found it). lockstep
// walks groups itself, one level at a time with H5Literate, visiting each
// header address once and at most kMaxGroupDepth deep, and follows hard links
// only: a soft or external link could name any object, or any file.
constexpr int kMaxGroupDepth = 16;

struct Link {
  std::string name;
  haddr_t address;
};
struct LinkList {
  std::vector<Link> links;
  std::exception_ptr error;
};

herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* data) noexcept {
  auto& list = *static_cast<LinkList*>(data);
  return guarded(list.error, [&] {
    const std::string_view n(name);
    if (info->type != H5L_TYPE_HARD)
      throw IoError(
          fmt::format("'{}' is a soft or external link; lockstep reads files whose "
                      "objects are all hard links",
                      n));
    if (n.empty() || n == "." || n.find('/') != std::string_view::npos)
      throw IoError(fmt::format("has a link named '{}', which no HDF5 writer makes", n));
    list.links.push_back({std::string(n), info->u.address});
  });
}

struct Object {
  std::string path;  // relative to the walked group
  H5O_type_t type;
};

// Every object below `group` (Note [object walk]); before_open(path, header
// address) runs on each before HDF5 decodes its header.
template <typename BeforeOpen>
std::vector<Object> walk_objects(hid_t group, const std::string& object,
                                 const BeforeOpen& before_open) {
  H5O_info_t top{};
  LOCKSTEP_CHECK_HDF5(H5Oget_info2(group, &top, H5O_INFO_BASIC));
  std::set<haddr_t> seen{top.addr};
  std::vector<Object> found;
  std::vector<std::pair<std::string, int>> groups{{"", 0}};  // path, depth
  while (!groups.empty()) {
    const auto [prefix, depth] = groups.back();
    groups.pop_back();
    Hdf5Id opened;
    if (!prefix.empty())
      opened = Hdf5Id(LOCKSTEP_CHECK_HDF5(H5Gopen2(group, prefix.c_str(), H5P_DEFAULT)));
    const hid_t here = prefix.empty() ? group : opened.get();
    LinkList list;
    const herr_t status =
        H5Literate(here, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_link, &list);
    const std::string where = prefix.empty() ? object : object + ", group '" + prefix + "'";
    if (list.error) {
      try {
        std::rethrow_exception(list.error);
      } catch (const IoError& e) {
        throw IoError(where + ": " + e.what() + " (re-create the file)");
      }
    }
    if (status < 0)
      throw IoError(where + ": HDF5 cannot list its links: " + hdf5_error_stack() +
                    " (the file is damaged: re-create it)");
    for (const Link& link : list.links) {
      if (!seen.insert(link.address).second) continue;
      const std::string path = prefix.empty() ? link.name : prefix + "/" + link.name;
      before_open(path, link.address);
      H5O_info_t info{};
      if (H5Oget_info_by_name2(here, link.name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0)
        throw IoError(
            fmt::format("{}: HDF5 cannot read the object header of '{}': {} (the file "
                        "is damaged: re-create it)",
                        where, path, hdf5_error_stack()));
      found.push_back({path, info.type});
      if (info.type != H5O_TYPE_GROUP) continue;
      if (depth + 1 >= kMaxGroupDepth)
        throw IoError(fmt::format("{}: group '{}' is nested {} deep; lockstep reads at most {}",
                                  object, path, depth + 1, kMaxGroupDepth));
      groups.emplace_back(path, depth + 1);
    }
  }
  return found;
}

// Note [object headers]: every object below the root, checked before HDF5
// opens it.
void check_object_headers(hid_t file, const fs::path& path, const std::string& what) {
  const Hdf5Id fcpl(LOCKSTEP_CHECK_HDF5(H5Fget_create_plist(file)));
  hsize_t base = 0, size = 0;
  LOCKSTEP_CHECK_HDF5(H5Pget_userblock(fcpl.get(), &base));
  LOCKSTEP_CHECK_HDF5(H5Fget_filesize(file, &size));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw IoError(fmt::format("cannot reopen {} {}: {}", what, quoted(path), std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const auto fail = [&](const std::string& why) {
    throw IoError(
        fmt::format("{} {} {} (the file is damaged: re-create it)", what, quoted(path), why));
  };
  walk_objects(file, what + " " + quoted(path), [&](const std::string& name, haddr_t address) {
    check_object_header(fd, base, size > base ? size - base : 0, address, "'" + name + "'", fail);
  });
}

}  // namespace

void check_hdf5_file(const fs::path& file, const std::string& what) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw IoError("cannot open " + what + " " + quoted(file) + ": " + std::strerror(errno) +
                  " (check the path and its permissions)");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode))
    throw IoError(what + " " + quoted(file) + " is not a regular file");
  const auto size = static_cast<std::uint64_t>(info.st_size);
  const auto fail = [&](const std::string& why) {
    throw IoError(
        fmt::format("{} {} ({} bytes) {} (it is not an HDF5 file, or it is damaged: "
                    "re-create it)",
                    what, quoted(file), size, why));
  };

  // HDF5 looks for its signature at 0, 512, 1024, 2048 ... (after a user block).
  std::uint64_t base = kUndefinedAddress;
  for (std::uint64_t at = 0; at + kSignature.size() <= size; at = at == 0 ? 512 : at * 2) {
    std::array<unsigned char, 8> bytes{};
    if (read_at(fd, bytes.data(), bytes.size(), at) == bytes.size() && bytes == kSignature) {
      base = at;
      break;
    }
  }
  if (base == kUndefinedAddress)
    fail("has no HDF5 signature at offset 0 or at a user-block boundary");

  // The superblock (HDF5 file format specification, section II.A).
  std::array<unsigned char, 100> sb{};
  const std::size_t got = read_at(fd, sb.data(), sb.size(), base);
  const int version = got > 8 ? sb[8] : -1;
  std::size_t need = 0, offsets_size = 0, lengths_size = 0;
  std::uint64_t base_address = 0, eof = 0, root = 0, extension = kUndefinedAddress;
  std::uint64_t root_heap = kUndefinedAddress;  // versions 0 and 1: the root group's local heap
  std::uint64_t driver = kUndefinedAddress;     // versions 0 and 1: the driver information block
  if (version == 0 || version == 1) {
    const std::size_t at = version == 0 ? 24 : 28;  // the first address field
    need = at + 4 * 8 + 40;  // 4 addresses, then the root's symbol table entry
    offsets_size = sb[13];
    lengths_size = sb[14];
    base_address = little_endian_u64(&sb[at]);
    eof = little_endian_u64(&sb[at + 16]);
    root = little_endian_u64(&sb[at + 40]);
    driver = little_endian_u64(&sb[at + 24]);
    // Cache type 1: the scratch pad holds the root's B-tree and local heap addresses.
    if (sb[at + 48] == 1 && sb[at + 49] == 0 && sb[at + 50] == 0 && sb[at + 51] == 0)
      root_heap = little_endian_u64(&sb[at + 64]);
  } else if (version == 2 || version == 3) {
    need = 48;  // through the 4-byte checksum
    offsets_size = sb[9];
    lengths_size = sb[10];
    base_address = little_endian_u64(&sb[12]);
    extension = little_endian_u64(&sb[20]);
    eof = little_endian_u64(&sb[28]);
    root = little_endian_u64(&sb[36]);
  } else {
    fail(fmt::format("has superblock version {}; HDF5 1.8 to 1.12 write versions 0 to 3", version));
  }
  if (got < need) fail("ends inside its superblock");
  if (offsets_size != 8 || lengths_size != 8)
    fail(
        fmt::format("uses {}-byte addresses and {}-byte lengths; lockstep reads files with 8-byte "
                    "ones (HDF5's default)",
                    offsets_size, lengths_size));
  if (base_address != base)
    fail(fmt::format("has its signature at byte {} but a base address of {}", base, base_address));
  // The end-of-file address counts the user block; the others are relative to it.
  if (eof == kUndefinedAddress || eof > size)
    fail(fmt::format("is truncated: its superblock says it ends at byte {}", eof));
  if (eof <= base) fail(fmt::format("ends at byte {}, before its superblock", eof));
  if (root == kUndefinedAddress || root >= eof - base)
    fail(fmt::format("has its root group at address {}, outside its {} bytes", root, eof - base));
  if (extension != kUndefinedAddress && extension >= eof - base)
    fail(fmt::format("has a superblock extension at address {}, outside its {} bytes", extension,
                     eof - base));
  if (root_heap != kUndefinedAddress) check_local_heap(fd, base, eof - base, root_heap, fail);
  // The driver information block (II.B): HDF5 1.10 allocates the size it
  // declares before reading it (the shard fuzzer: 1.9 GB for a 2 KB file).
  if (driver != kUndefinedAddress) {
    std::array<unsigned char, 16> block{};
    const std::uint64_t bytes = eof - base;
    if (driver > bytes || bytes - driver < block.size() ||
        read_at(fd, block.data(), block.size(), base + driver) != block.size())
      fail(fmt::format("has a driver information block at address {}, outside its {} bytes", driver,
                       bytes));
    const std::uint64_t declared =
        block[4] | block[5] << 8 | block[6] << 16 | std::uint64_t{block[7]} << 24;
    if (declared > bytes - driver - block.size())
      fail(
          fmt::format("has a driver information block of {} bytes at address {}, past its {} "
                      "bytes",
                      declared, driver, bytes));
  }
  check_object_header(fd, base, eof - base, root, "the root group", fail);
}

Hdf5Id open_hdf5_file(const fs::path& file, const std::string& what) {
  check_hdf5_file(file, what);
  Hdf5Lock lock;
  const hid_t id = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0)
    throw IoError(what + " " + quoted(file) + ": HDF5 cannot open it: " + hdf5_error_stack() +
                  " (the file is damaged or not HDF5: re-create it)");
  Hdf5Id opened(id);
  check_object_headers(opened.get(), file, what);
  return opened;
}

core::Shape extent_of(hid_t object_id, const std::string& object) {
  Hdf5Lock lock;
  const bool is_attribute = H5Iget_type(object_id) == H5I_ATTR;
  const Hdf5Id space(
      LOCKSTEP_CHECK_HDF5(is_attribute ? H5Aget_space(object_id) : H5Dget_space(object_id)));
  const H5S_class_t kind = LOCKSTEP_CHECK_HDF5(H5Sget_simple_extent_type(space.get()));
  if (kind == H5S_SCALAR) return {};
  if (kind != H5S_SIMPLE) throw IoError(object + " has no elements (a null dataspace)");
  const int rank = LOCKSTEP_CHECK_HDF5(H5Sget_simple_extent_ndims(space.get()));
  if (rank > H5S_MAX_RANK)
    throw IoError(fmt::format("{} has rank {}, above HDF5's {}", object, rank, H5S_MAX_RANK));
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  LOCKSTEP_CHECK_HDF5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  core::Shape shape;
  for (hsize_t d : dims) {
    if (d > static_cast<hsize_t>(INT64_MAX))
      throw IoError(fmt::format("{} has a dimension of {}, too large to be real", object, d));
    shape.push_back(static_cast<std::int64_t>(d));
  }
  return shape;
}

namespace {

// Note [inflated chunks]: HDF5 1.10 copies a whole chunk out of what its
// deflate filter returned, even when that inflated to fewer bytes (a heap
// over-read; found by the shard fuzzer). So every chunk of a dataset whose
// filters are deflate, optionally after shuffle (what h5py writes), is read
// raw and inflated here first, and must give exactly one chunk's bytes.
void check_chunks(hid_t dataset, hid_t dcpl, const std::string& object) {
  const int filters = LOCKSTEP_CHECK_HDF5(H5Pget_nfilters(dcpl));
  int deflate_index = -1;
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, values[8] = {};
    std::size_t count = 8;
    const H5Z_filter_t id = LOCKSTEP_CHECK_HDF5(H5Pget_filter2(
        dcpl, static_cast<unsigned>(i), &flags, &count, values, 0, nullptr, nullptr));
    if (id == H5Z_FILTER_DEFLATE && i == filters - 1)
      deflate_index = i;
    else if (id != H5Z_FILTER_SHUFFLE)
      return;  // other pipelines: HDF5's own checks
  }
  if (deflate_index < 0) return;
  const Hdf5Id type(LOCKSTEP_CHECK_HDF5(H5Dget_type(dataset)));
  hsize_t chunk_dims[H5S_MAX_RANK];
  const int rank = LOCKSTEP_CHECK_HDF5(H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk_dims));
  std::uint64_t chunk_bytes = H5Tget_size(type.get());
  for (int d = 0; d < rank; ++d)
    if (__builtin_mul_overflow(chunk_bytes, chunk_dims[d], &chunk_bytes) ||
        chunk_bytes > (std::uint64_t{1} << 32))
      throw IoError(object + " has chunks of more than 4 GiB");
  const Hdf5Id space(LOCKSTEP_CHECK_HDF5(H5Dget_space(dataset)));
  hsize_t chunks = 0;
  LOCKSTEP_CHECK_HDF5(H5Dget_num_chunks(dataset, space.get(), &chunks));
  std::vector<unsigned char> raw, inflated(chunk_bytes + 1);
  for (hsize_t c = 0; c < chunks; ++c) {
    hsize_t offset[H5S_MAX_RANK] = {};
    unsigned mask = 0;
    haddr_t address = 0;
    hsize_t stored = 0;
    LOCKSTEP_CHECK_HDF5(
        H5Dget_chunk_info(dataset, space.get(), c, offset, &mask, &address, &stored));
    // H5Dread_chunk fills as many bytes as the chunk found by its offset
    // holds, not the size listed by index: in a damaged index the two differ
    // (a heap overflow the shard fuzzer found), so the buffer is sized by the
    // offset lookup and the two must agree.
    hsize_t by_offset = 0;
    LOCKSTEP_CHECK_HDF5(H5Dget_chunk_storage_size(dataset, offset, &by_offset));
    if (by_offset != stored)
      throw IoError(
          fmt::format("{} lists a chunk of {} bytes that is stored as {} bytes (the "
                      "chunk index is damaged: re-create the file)",
                      object, stored, by_offset));
    if (stored > kMaxExpansion * chunk_bytes + 1024)
      throw IoError(fmt::format("{} has a chunk of {} bytes, more than deflate makes of {}", object,
                                stored, chunk_bytes));
    raw.resize(stored);
    LOCKSTEP_CHECK_HDF5(H5Dread_chunk(dataset, H5P_DEFAULT, offset, &mask, raw.data()));
    if (mask & (1u << deflate_index)) continue;  // stored uncompressed
    uLongf length = static_cast<uLongf>(inflated.size());
    const int status =
        ::uncompress(inflated.data(), &length, raw.data(), static_cast<uLong>(stored));
    if (status != Z_OK || length != chunk_bytes)
      throw IoError(
          fmt::format("{} has a chunk that does not inflate to its {} bytes (the file "
                      "is damaged: re-create it)",
                      object, chunk_bytes));
  }
}

}  // namespace

void check_storage(hid_t dataset, const std::string& object) {
  Hdf5Lock lock;
  const Hdf5Id dcpl(LOCKSTEP_CHECK_HDF5(H5Dget_create_plist(dataset)));
  const H5D_layout_t layout = LOCKSTEP_CHECK_HDF5(H5Pget_layout(dcpl.get()));
  if (layout == H5D_CHUNKED) return check_chunks(dataset, dcpl.get(), object);
  if (layout != H5D_CONTIGUOUS && layout != H5D_COMPACT) return;
  if (layout == H5D_CONTIGUOUS && LOCKSTEP_CHECK_HDF5(H5Pget_external_count(dcpl.get())) > 0)
    throw IoError(object +
                  " keeps its data in external files; lockstep reads data inside the file");
  const Hdf5Id type(LOCKSTEP_CHECK_HDF5(H5Dget_type(dataset)));
  const Hdf5Id space(LOCKSTEP_CHECK_HDF5(H5Dget_space(dataset)));
  const hssize_t elements = LOCKSTEP_CHECK_HDF5(H5Sget_simple_extent_npoints(space.get()));
  std::uint64_t need = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(elements),
                             static_cast<std::uint64_t>(H5Tget_size(type.get())), &need))
    need = ~std::uint64_t{0};
  const hsize_t stored = H5Dget_storage_size(dataset);
  const haddr_t offset = layout == H5D_CONTIGUOUS ? H5Dget_offset(dataset) : HADDR_UNDEF;
  H5Eclear2(H5E_DEFAULT);  // unallocated storage has no offset: not an error
  const bool allocated = layout == H5D_COMPACT || offset != HADDR_UNDEF;
  if (allocated && stored != need)
    throw IoError(fmt::format("{} stores {} bytes where its shape needs {} (the file is damaged)",
                              object, stored, need));
  if (offset == HADDR_UNDEF) return;
  const Hdf5Id file(LOCKSTEP_CHECK_HDF5(H5Iget_file_id(dataset)));
  hsize_t file_bytes = 0;
  LOCKSTEP_CHECK_HDF5(H5Fget_filesize(file.get(), &file_bytes));
  if (offset > file_bytes || need > file_bytes - offset)
    throw IoError(
        fmt::format("{} has {} bytes of data at byte {}, beyond the file's {} bytes (the "
                    "file is truncated or damaged)",
                    object, need, offset, file_bytes));
}

std::vector<std::string> dataset_names(hid_t group, const std::string& object) {
  Hdf5Lock lock;
  std::vector<std::string> names;
  for (Object& o : walk_objects(group, object, [](const std::string&, haddr_t) {}))
    if (o.type == H5O_TYPE_DATASET) names.push_back(std::move(o.path));
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> attribute_names(hid_t object_id, const std::string& object) {
  Hdf5Lock lock;
  // Note [attribute table]: to iterate a compact attribute list, HDF5 1.10
  // copies every attribute into a table, and when one attribute message does
  // not decode it releases the table's empty slots as attributes: a NULL
  // dereference in H5A__close (found by the checkpoint fuzzer,
  // tests/fuzz/regressions/checkpoint/attribute-table-segv.h5). Asking
  // whether a name no attribute has exists decodes every message without
  // that table and fails cleanly; once it has succeeded the messages are
  // decoded, so the table cannot fail that way. Dense attribute storage is
  // walked in native order, which builds no table at all.
  if (H5Aexists(object_id, "\x01lockstep-probe") < 0)
    throw IoError(object + ": HDF5 cannot read its attributes: " + hdf5_error_stack() +
                  " (the file is damaged: re-create it)");
  NameList list;
  const herr_t status =
      H5Aiterate2(object_id, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect_attribute, &list);
  return finish(list, status, object, "attributes");
}

core::Tensor read_tensor(hid_t dataset, const std::string& object, std::uint64_t max_bytes) {
  Hdf5Lock lock;
  try {
    const Hdf5Id type(LOCKSTEP_CHECK_HDF5(H5Dget_type(dataset)));
    // `stored` is what HDF5 delivers (byte order converted, nothing else);
    // floats are widened or rounded to f32 here (Note [float conversion]).
    std::optional<DType> dtype, stored;
    Hdf5Id memory;
    const bool is_f64 = is_ieee_float(type.get(), 64);
    if (is_f64) {
      dtype = DType::f32;
      memory = Hdf5Id(LOCKSTEP_CHECK_HDF5(H5Tcopy(H5T_NATIVE_DOUBLE)));
    } else if (is_ieee_float(type.get(), 16) || is_ieee_float(type.get(), 32) ||
               H5Tget_class(type.get()) == H5T_INTEGER) {
      stored = dtype_of(type.get());
      dtype = stored == DType::f16 ? DType::f32 : stored;
      if (stored) memory = memory_type(*stored);
    }
    if (!dtype)
      throw IoError(object + " is stored as " + describe_type(type.get()) +
                    "; lockstep reads f16, f32 or f64 (as f32), i32, i64 or u8 (convert it)");
    const core::Shape shape = extent_of(dataset, object);
    std::uint64_t bytes = dtype_size(*dtype);
    for (std::int64_t d : shape)
      if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(d), &bytes) || bytes > max_bytes)
        throw IoError(
            fmt::format("{} has shape {}: more than the {} bytes a file of this size "
                        "can hold (the file is damaged)",
                        object, core::shape_str(shape), max_bytes));
    core::Tensor tensor = core::Tensor::empty(shape, *dtype);
    const auto count = static_cast<std::size_t>(tensor.numel());
    if (count == 0) return tensor;
    check_storage(dataset, object);
    if (is_f64) {
      std::vector<double> values(count);
      LOCKSTEP_CHECK_HDF5(
          H5Dread(dataset, memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
      float* out = tensor.data_as<float>();
      for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<float>(values[i]);
    } else if (stored == DType::f16) {
      std::vector<std::uint16_t> bits(count);
      LOCKSTEP_CHECK_HDF5(
          H5Dread(dataset, memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, bits.data()));
      float* out = tensor.data_as<float>();
      for (std::size_t i = 0; i < count; ++i) out[i] = kernels::f16_bits_to_f32(bits[i]);
    } else {
      LOCKSTEP_CHECK_HDF5(
          H5Dread(dataset, memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, tensor.data()));
    }
    return tensor;
  } catch (const LibraryError& e) {
    throw IoError(object + ": HDF5 cannot read it: " + e.what() +
                  " (the file is damaged: re-create it)");
  }
}

ScalarAttribute read_scalar_attribute(hid_t attribute, const std::string& object) {
  Hdf5Lock lock;
  try {
    const core::Shape shape = extent_of(attribute, object);
    if (std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d != 1; }))
      throw IoError(object + " has shape " + core::shape_str(shape) + "; one value was expected");
    const Hdf5Id type(LOCKSTEP_CHECK_HDF5(H5Aget_type(attribute)));
    const std::size_t size = H5Tget_size(type.get());
    switch (H5Tget_class(type.get())) {
      case H5T_INTEGER:
        if (size > 8) break;
        {
          std::int64_t value = 0;
          LOCKSTEP_CHECK_HDF5(H5Aread(attribute, H5T_NATIVE_INT64, &value));
          return value;
        }
      case H5T_FLOAT:
        if (!is_ieee_float(type.get(), 16) && !is_ieee_float(type.get(), 32) &&
            !is_ieee_float(type.get(), 64))
          break;
        {
          double value = 0;
          LOCKSTEP_CHECK_HDF5(H5Aread(attribute, H5T_NATIVE_DOUBLE, &value));
          return value;
        }
      case H5T_STRING: {
        const htri_t variable = LOCKSTEP_CHECK_HDF5(H5Tis_variable_str(type.get()));
        // Note [global heap]: variable-length strings live in HDF5's global
        // heap, whose collections HDF5 1.10 parses without bounds: an object
        // of size 0 loops forever (found by the checkpoint fuzzer,
        // tests/fuzz/regressions/checkpoint/global-heap-hang.h5). lockstep
        // writes fixed-length strings and reads nothing else.
        if (variable > 0)
          throw IoError(object +
                        " is a variable-length string; lockstep reads fixed-length string "
                        "attributes, as it writes them (write it with numpy.bytes_ in h5py)");
        if (size == 0 || size > kMaxStringBytes) break;
        std::string value(size, '\0');  // read as stored: no conversion, no terminator needed
        LOCKSTEP_CHECK_HDF5(H5Aread(attribute, type.get(), value.data()));
        return value.substr(0, value.find('\0'));
      }
      default:
        break;
    }
    throw IoError(object + " is stored as " + describe_type(type.get()) +
                  "; lockstep reads integers, IEEE floats and strings of up to 64 KiB here");
  } catch (const LibraryError& e) {
    throw IoError(object + ": HDF5 cannot read it: " + e.what() +
                  " (the file is damaged: re-create it)");
  }
}

}  // namespace lockstep::io
