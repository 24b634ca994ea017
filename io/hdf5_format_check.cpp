// The structural checks of HDF5 files made before HDF5 decodes their bytes
// (io/hdf5.h, Note [hostile files]): the superblock, the root's and every
// object's header messages, groups' B-trees and symbol nodes, and local
// heaps. Each guards against a way a damaged file made HDF5 1.10 crash,
// allocate without bound or loop, found by the fuzzers (tests/fuzz) and
// listed in docs/data-format.md.
#include "io/detail/hdf5_format_check.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "io/hdf5.h"

namespace lockstep::io {
namespace {

namespace fs = std::filesystem;

constexpr std::array<unsigned char, 8> kSignature = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
constexpr std::uint64_t kUndefinedAddress = ~std::uint64_t{0};

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

// Note [group trees]: a group in HDF5's original format (a symbol table
// message) keeps its links in a version 1 B-tree of "TREE" nodes whose leaves
// point at symbol nodes, "SNOD" (format specification III.A.1 and III.C).
// HDF5 1.10 reads a node at the undefined address (all ones) through its
// metadata accumulator's NULL buffer (the shard fuzzer: a SEGV in
// H5F__accum_read under H5Literate), and an object header there too. So
// before HDF5 reads a group, lockstep walks its tree: each node once, each
// child one level below its parent, at most 2 * internal K children a node,
// each inside the file; at most 2 * leaf K entries a symbol node, each naming
// an object header inside the file. (HDF5 refuses the counts itself; checking
// them here keeps the walk bounded and names the group.) K are the file's
// (H5Pget_sym_k), so the root's tree is checked once HDF5 has opened the
// file, before anything reads it.
//
// Note [chunk trees]: a chunked dataset of layout version 3 (HDF5 1.8's and
// h5py's default) indexes its chunks in a version 1 B-tree too, whose keys
// hold each chunk's stored size. Without filters HDF5 1.10 reads a chunk
// into a buffer of that size and copies a whole chunk out of it (the shard
// fuzzer: a heap over-read in H5VM_memcpyvv). So the tree is walked the same
// way, at most 2 * K children a node (H5Pget_istore_k), and each chunk of an
// unfiltered dataset must be stored as exactly one chunk's bytes, inside the
// file. Filtered chunks are checked once the dataset is open (Note [inflated
// chunks] in io/hdf5_read.cpp).
struct TreeOrders {
  unsigned group_internal_k = 0, group_leaf_k = 0, chunk_k = 0;  // 0: not known, not checked
};

// Walks the version 1 B-tree of `node_type` (0 groups, 1 chunks) at `root`
// whose keys are `key_bytes` wide; leaf(key, child) runs on each child of a
// leaf node. Fails on a node outside the file, reached twice, of another
// type or level than its parent says, or with more than max_children.
template <typename Leaf, typename Fail>
void walk_v1_btree(int fd, std::uint64_t base, std::uint64_t bytes, std::uint64_t root,
                   unsigned node_type, std::uint64_t key_bytes, unsigned max_children,
                   const std::string& name, const Fail& fail, const Leaf& leaf) {
  const auto damaged = [&](std::uint64_t at, const std::string& why) {
    fail(fmt::format("has a damaged B-tree node at address {} in the {} of {}: {}", at,
                     node_type == 0 ? "links" : "chunk index", name, why));
  };
  struct Node {
    std::uint64_t address;
    int level;  // what the parent says it is; -1 for the root
  };
  std::vector<Node> pending{{root, -1}};
  std::set<std::uint64_t> seen;
  while (!pending.empty()) {
    const Node node = pending.back();
    pending.pop_back();
    std::array<unsigned char, 24> header{};  // signature, type, level, entries, 2 siblings
    if (!seen.insert(node.address).second) damaged(node.address, "reached twice");
    if (node.address > bytes || bytes - node.address < header.size() ||
        read_at(fd, header.data(), header.size(), base + node.address) != header.size())
      damaged(node.address, "outside the file");
    if (std::memcmp(header.data(), "TREE", 4) != 0 || header[4] != node_type)
      damaged(node.address, fmt::format("not a node of type {}", node_type));
    const int level = header[5];
    const unsigned used = header[6] | header[7] << 8;
    if (node.level >= 0 && level != node.level)
      damaged(node.address, fmt::format("level {} under a level {} node", level, node.level + 1));
    for (const std::uint64_t sibling :
         {little_endian_u64(&header[8]), little_endian_u64(&header[16])})
      if (sibling != kUndefinedAddress && sibling >= bytes)
        damaged(node.address, fmt::format("a sibling at address {}", sibling));
    if (used > max_children)
      damaged(node.address, fmt::format("{} children, above {}", used, max_children));
    // Keys and child addresses alternate, a key at each end.
    const std::uint64_t stride = key_bytes + 8;
    std::vector<unsigned char> entries(used * stride + key_bytes);
    if (bytes - node.address - header.size() < entries.size() ||
        read_at(fd, entries.data(), entries.size(), base + node.address + header.size()) !=
            entries.size())
      damaged(node.address, "its children lie past the file's end");
    for (unsigned i = 0; i < used; ++i) {
      const unsigned char* key = &entries[i * stride];
      const std::uint64_t child = little_endian_u64(key + key_bytes);
      if (level > 0)
        pending.push_back({child, level - 1});
      else
        leaf(key, child);
    }
  }
}

template <typename Fail>
void check_group_tree(int fd, std::uint64_t base, std::uint64_t bytes, std::uint64_t root,
                      const TreeOrders& orders, const std::string& name, const Fail& fail) {
  std::set<std::uint64_t> seen;
  const auto check_symbols = [&](const unsigned char*, std::uint64_t node) {
    const auto damaged = [&](const std::string& why) {
      fail(fmt::format("has a damaged symbol node at address {} in the links of {}: {}", node, name,
                       why));
    };
    std::array<unsigned char, 8> symbols{};  // signature, version, reserved, entries
    if (!seen.insert(node).second) damaged("reached twice");
    if (node > bytes || bytes - node < symbols.size() ||
        read_at(fd, symbols.data(), symbols.size(), base + node) != symbols.size() ||
        std::memcmp(symbols.data(), "SNOD", 4) != 0 || symbols[4] != 1)
      damaged("not a version 1 symbol node inside the file");
    const unsigned count = symbols[6] | symbols[7] << 8;
    if (count > 2 * orders.group_leaf_k)
      damaged(fmt::format("{} entries, above 2 * {}", count, orders.group_leaf_k));
    // Each entry: name offset, object header address, cache type, scratch pad.
    std::vector<unsigned char> table(std::size_t{count} * 40);
    if (bytes - node - symbols.size() < table.size() ||
        read_at(fd, table.data(), table.size(), base + node + symbols.size()) != table.size())
      damaged("its entries lie past the file's end");
    for (unsigned e = 0; e < count; ++e) {
      const std::uint64_t object = little_endian_u64(&table[std::size_t{e} * 40 + 8]);
      if (object >= bytes) damaged(fmt::format("an object header at address {}", object));
    }
  };
  walk_v1_btree(fd, base, bytes, root, 0, 8, 2 * orders.group_internal_k, name, fail,
                check_symbols);
}

// The chunk index of an unfiltered dataset (Note [chunk trees]); `rank` counts
// the element's dimension, as the layout message does.
template <typename Fail>
void check_chunk_tree(int fd, std::uint64_t base, std::uint64_t bytes, std::uint64_t root,
                      unsigned rank, std::uint64_t chunk_bytes, const TreeOrders& orders,
                      const std::string& name, const Fail& fail) {
  // A key: the chunk's stored size, its filter mask, then an offset a dimension.
  const auto check_chunk = [&](const unsigned char* key, std::uint64_t chunk) {
    const std::uint64_t stored = key[0] | key[1] << 8 | key[2] << 16 | std::uint64_t{key[3]} << 24;
    if (stored != chunk_bytes || chunk > bytes || bytes - chunk < stored)
      fail(
          fmt::format("has an unfiltered chunk of {} bytes at address {} in {}, where a chunk "
                      "has {} bytes inside the file's {}",
                      stored, chunk, name, chunk_bytes, bytes));
  };
  walk_v1_btree(fd, base, bytes, root, 1, 8 + 8 * std::uint64_t{rank}, 2 * orders.chunk_k, name,
                fail, check_chunk);
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
                         const TreeOrders& orders, const std::string& name, const Fail& fail) {
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
  // A chunked layout (IV.A.2.i, versions 1 to 4): HDF5 1.10 divides by each
  // chunk dimension, and reads as many as the dataspace's rank plus one
  // whatever the message holds (the shard fuzzer: a division by zero in
  // H5D__chunk_set_info).
  int space_rank = -1, chunk_rank = -1;
  bool filtered = false;                         // a filter pipeline message
  std::uint64_t chunk_tree = kUndefinedAddress;  // layout version 3's chunk index
  std::uint64_t chunk_bytes = 1;                 // the product of its chunk dimensions
  const auto check_chunk_layout = [&](const unsigned char* m, std::uint64_t length) {
    const unsigned version = m[0];
    std::uint64_t dims_at = 0, dim_bytes = 4;
    if ((version == 1 || version == 2) && length >= 3 && m[2] == 2) {
      chunk_rank = m[1];
      dims_at = 16;  // version, rank, class, 5 reserved, the B-tree's address
    } else if (version == 3 && length >= 11 && m[1] == 2) {
      chunk_rank = m[2];
      chunk_tree = little_endian_u64(m + 3);
      dims_at = 11;  // version, class, rank, the B-tree's address
    } else if (version == 4 && length >= 5 && m[1] == 2) {
      chunk_rank = m[3];
      dim_bytes = m[4];  // version, class, flags, rank, bytes per dimension
      dims_at = 5;
      if (dim_bytes < 1 || dim_bytes > 8)
        fail(fmt::format("has chunk dimensions of {} bytes in {}", dim_bytes, name));
    } else {
      return;  // not chunked
    }
    if (dims_at + dim_bytes * std::uint64_t(chunk_rank) > length)
      fail(
          fmt::format("has a layout message of {} bytes too short for its {} chunk dimensions "
                      "in {}",
                      length, chunk_rank, name));
    for (int d = 0; d < chunk_rank; ++d) {
      std::uint64_t size = 0;
      for (std::uint64_t b = dim_bytes; b-- > 0;) size = size << 8 | m[dims_at + d * dim_bytes + b];
      if (size == 0) fail(fmt::format("has a chunk dimension {} of size 0 in {}", d, name));
      if (__builtin_mul_overflow(chunk_bytes, size, &chunk_bytes) ||
          chunk_bytes > (std::uint64_t{1} << 32))
        fail(fmt::format("has chunks of more than 4 GiB in {}", name));
    }
  };
  std::array<unsigned char, 16> prefix{};
  if (object > bytes || bytes - object < prefix.size() ||
      read_at(fd, prefix.data(), prefix.size(), base + object) != prefix.size())
    fail(fmt::format("has the header of {} at address {}, outside its {} bytes", name, object,
                     bytes));
  if (prefix[0] != 1) return;  // not a version 1 header: HDF5 checks it
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
      if (type == 0x11 && length >= 16) {
        check_local_heap(fd, base, bytes, little_endian_u64(m + 8), fail);
        if (orders.group_leaf_k > 0)
          check_group_tree(fd, base, bytes, little_endian_u64(m), orders, name, fail);
      }
      if (type == 0x0c && !shared) {
        // Its version and three sizes come first: 8 bytes (the shard fuzzer:
        // a message of 0 bytes at a chunk's end was read past).
        if (length < 8)
          fail(fmt::format("has an attribute message of {} bytes in {}", length, name));
        const auto pad = [&](std::uint64_t n) { return m[0] == 1 ? (n + 7) / 8 * 8 : n; };
        const std::uint64_t header = m[0] == 1 ? 8 : m[0] == 2 ? 8 : 9;
        const std::uint64_t need =
            header + pad(m[2] | m[3] << 8) + pad(m[4] | m[5] << 8) + pad(m[6] | m[7] << 8);
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
      if (type == 0x01 && !shared && length >= 2) space_rank = m[1];
      if (type == 0x08 && length >= 2) check_chunk_layout(m, length);
      if (type == 0x0b) filtered = true;
      p += 8 + length;
    }
  }
  if (chunk_rank >= 0 && space_rank >= 0 && chunk_rank != space_rank + 1)
    fail(
        fmt::format("has chunks of {} dimensions for a dataspace of rank {} in {} (a chunk has "
                    "the rank plus one)",
                    chunk_rank, space_rank, name));
  if (chunk_tree != kUndefinedAddress && !filtered && orders.chunk_k > 0)
    check_chunk_tree(fd, base, bytes, chunk_tree, static_cast<unsigned>(chunk_rank), chunk_bytes,
                     orders, name, fail);
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
  check_object_header(fd, base, eof - base, root, TreeOrders{}, "the root group", fail);
}

namespace detail {

ObjectHeaderCheck::ObjectHeaderCheck(hid_t file, const fs::path& path, const std::string& what)
    : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), what_(what), path_(path) {
  if (fd_ < 0)
    throw IoError(fmt::format("cannot reopen {} {}: {}", what, quoted(path), std::strerror(errno)));
  try {
    const Hdf5Id fcpl(LOCKSTEP_CHECK_HDF5(H5Fget_create_plist(file)));
    hsize_t base = 0, size = 0;
    LOCKSTEP_CHECK_HDF5(H5Pget_userblock(fcpl.get(), &base));
    LOCKSTEP_CHECK_HDF5(H5Fget_filesize(file, &size));
    LOCKSTEP_CHECK_HDF5(H5Pget_sym_k(fcpl.get(), &internal_k_, &leaf_k_));
    LOCKSTEP_CHECK_HDF5(H5Pget_istore_k(fcpl.get(), &chunk_k_));
    base_ = base;
    bytes_ = size > base ? size - base : 0;
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

ObjectHeaderCheck::~ObjectHeaderCheck() { ::close(fd_); }

void ObjectHeaderCheck::operator()(const std::string& name, std::uint64_t address) const {
  const auto fail = [&](const std::string& why) {
    throw IoError(
        fmt::format("{} {} {} (the file is damaged: re-create it)", what_, quoted(path_), why));
  };
  check_object_header(fd_, base_, bytes_, address, TreeOrders{internal_k_, leaf_k_, chunk_k_}, name,
                      fail);
}

}  // namespace detail
}  // namespace lockstep::io
