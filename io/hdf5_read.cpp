// Checked reads of HDF5 files lockstep may not have written (io/hdf5.h,
// Note [hostile files]): opening a file once its structure is checked
// (io/hdf5_format_check.cpp), a walk of its objects, extents, dataset and attribute names gathered
// without letting exceptions cross HDF5's callbacks, and type-, rank- and size-checked reads.
#include <fmt/core.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/output_file.h"
#include "io/detail/hdf5_format_check.h"
#include "io/hdf5.h"
#include "kernels/checked_math.h"
#include "kernels/half.h"

namespace lockstep::io {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxStringBytes = 64 * 1024;

std::string quoted(const fs::path& file) { return fmt::format("'{}'", file.string()); }

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

// Note [object headers]: the root's header again, now with its group tree
// (Note [group trees]), then every object below it, each before HDF5 decodes it.
void check_object_headers(hid_t file, const fs::path& path, const std::string& what) {
  const detail::ObjectHeaderCheck check(file, path, what);
  H5O_info_t root{};
  LOCKSTEP_CHECK_HDF5(H5Oget_info2(file, &root, H5O_INFO_BASIC));
  check("the root group", root.addr);
  walk_objects(file, what + " " + quoted(path),
               [&](const std::string& name, haddr_t address) { check("'" + name + "'", address); });
}

}  // namespace

Hdf5Id open_hdf5_file(const fs::path& file, const std::string& what) {
  check_hdf5_file(file, what);
  Hdf5Lock lock;
  const hid_t id = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0)
    throw IoError(what + " " + quoted(file) + ": HDF5 cannot open it: " + hdf5_error_stack() +
                  " (the file is damaged or not HDF5: re-create it)");
  Hdf5Id opened(id);
  check_object_headers(opened.get(), file, what);
  core::note_input(file);  // Note [one way to write a file]: no output may replace it
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
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), limits(dims.size());
  LOCKSTEP_CHECK_HDF5(H5Sget_simple_extent_dims(space.get(), dims.data(), limits.data()));
  core::Shape shape;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const hsize_t d = dims[i];
    if (d > static_cast<hsize_t>(INT64_MAX))
      throw IoError(fmt::format("{} has a dimension of {}, too large to be real", object, d));
    // HDF5 never writes an extent past its maximum, and 1.10 does not check
    // one it reads (the shard fuzzer: a 5 x 4 dataset grown to 5 x 524292,
    // 393,000 chunks, through a filter HDF5 lacks: reading a few rows, HDF5's
    // allocations grew past 2 GB).
    if (limits[i] != H5S_UNLIMITED && d > limits[i])
      throw IoError(
          fmt::format("{} has dimension {} of {}, above its maximum {} (the file is "
                      "damaged: re-create it)",
                      object, i, d, limits[i]));
    shape.push_back(static_cast<std::int64_t>(d));
  }
  return shape;
}

namespace {

// Note [inflated chunks]: HDF5 1.10 copies a whole chunk out of what its
// filters returned, or out of the raw chunk when there are none, even when
// that holds fewer bytes (heap over-reads; found by the shard fuzzer, with
// deflate and with no filter at all). So every chunk of a dataset whose
// filters are deflate, shuffle, both (what h5py writes) or none is looked
// up by its coordinates, as a read finds it, before HDF5 reads any: a chunk
// stored unfiltered must hold exactly one chunk's bytes, and a deflated one
// is read raw and inflated here, and must give exactly that. Every chunk
// must be written: one never written reads as fill values, which for a shard
// are silently wrong samples. Chunks are found with H5Dget_chunk_storage_size
// and H5Dread_chunk, the lookup reads use: H5Dget_chunk_info and
// H5Dget_chunk_info_by_coord walk the index instead, and disagree with it
// when the index lists one offset twice (a heap overflow the shard fuzzer
// found, sizing a buffer by one and reading by the other), and a walk per
// chunk is quadratic: for 32000 one-row chunks 4.6 s against 0.005 s for the
// lookups (HDF5 1.10.8, this machine).
void check_chunks(hid_t dataset, hid_t dcpl, const std::string& object) {
  const int filters = LOCKSTEP_CHECK_HDF5(H5Pget_nfilters(dcpl));
  int deflate_index = -1;
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, values[8] = {};
    std::size_t count = 8;
    const H5Z_filter_t id = LOCKSTEP_CHECK_HDF5(H5Pget_filter2(
        dcpl, static_cast<unsigned>(i), &flags, &count, values, 0, nullptr, nullptr));
    // A filter this HDF5 lacks fails the read of every chunk: refused here,
    // named, before a read can pile up a failure per chunk.
    if (LOCKSTEP_CHECK_HDF5(H5Zfilter_avail(id)) <= 0)
      throw IoError(
          fmt::format("{} is stored through HDF5 filter {}, which this HDF5 does not "
                      "have (re-create the file with gzip, or without compression)",
                      object, id));
    if (id == H5Z_FILTER_DEFLATE && i == filters - 1)
      deflate_index = i;
    else if (id != H5Z_FILTER_SHUFFLE)
      return;  // other pipelines: HDF5's own checks
  }
  const Hdf5Id type(LOCKSTEP_CHECK_HDF5(H5Dget_type(dataset)));
  hsize_t chunk_dims[H5S_MAX_RANK];
  const int rank = LOCKSTEP_CHECK_HDF5(H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk_dims));
  std::uint64_t chunk_bytes = H5Tget_size(type.get());
  for (int d = 0; d < rank; ++d)
    if (__builtin_mul_overflow(chunk_bytes, chunk_dims[d], &chunk_bytes) ||
        chunk_bytes > (std::uint64_t{1} << 32))
      throw IoError(object + " has chunks of more than 4 GiB");
  const Hdf5Id space(LOCKSTEP_CHECK_HDF5(H5Dget_space(dataset)));
  hsize_t dims[H5S_MAX_RANK] = {};
  // H5Pget_chunk leaves out the element's dimension: as many as the dataspace's.
  if (LOCKSTEP_CHECK_HDF5(H5Sget_simple_extent_dims(space.get(), dims, nullptr)) != rank)
    throw IoError(
        fmt::format("{} has chunks of rank {} for a dataspace of another rank (the file is "
                    "damaged: re-create it)",
                    object, rank));
  // The chunk grid: the number of chunks that cover the extent, each checked.
  hsize_t grid[H5S_MAX_RANK] = {}, chunks = 1, written = 0;
  for (int d = 0; d < rank; ++d) {
    if (chunk_dims[d] == 0)
      throw IoError(object + " has a chunk dimension of 0 (the file is damaged: re-create it)");
    grid[d] = dims[d] / chunk_dims[d] + (dims[d] % chunk_dims[d] != 0);
    if (__builtin_mul_overflow(chunks, grid[d], &chunks))
      throw IoError(object +
                    " has more chunks than can be counted (the file is damaged: re-create it)");
  }
  LOCKSTEP_CHECK_HDF5(H5Dget_num_chunks(dataset, space.get(), &written));
  if (written != chunks)
    throw IoError(
        fmt::format("{} has {} chunks written where its shape has {} (a chunk never "
                    "written reads as fill values: re-create the file)",
                    object, written, chunks));
  std::vector<unsigned char> raw, inflated;  // sized once a chunk is known to inflate that far
  hsize_t at[H5S_MAX_RANK] = {};  // the chunk's index in the grid, last dimension fastest
  for (hsize_t c = 0; c < chunks; ++c) {
    hsize_t offset[H5S_MAX_RANK] = {};
    for (int d = 0; d < rank; ++d) offset[d] = at[d] * chunk_dims[d];
    for (int d = rank - 1; d >= 0 && ++at[d] == grid[d]; --d) at[d] = 0;
    hsize_t stored = 0;
    if (H5Dget_chunk_storage_size(dataset, offset, &stored) < 0) {
      H5Eclear2(H5E_DEFAULT);
      throw IoError(
          fmt::format("{} has a chunk at element {} that was never written (the chunk "
                      "index is damaged: re-create the file)",
                      object, offset[0]));
    }
    unsigned mask = 0;  // the filters skipped for this chunk
    if (deflate_index >= 0) {
      if (stored > kMaxExpansion * chunk_bytes + 1024)
        throw IoError(fmt::format("{} has a chunk of {} bytes, more than deflate makes of {}",
                                  object, stored, chunk_bytes));
      raw.resize(stored);
      LOCKSTEP_CHECK_HDF5(H5Dread_chunk(dataset, H5P_DEFAULT, offset, &mask, raw.data()));
    }
    if (deflate_index < 0 || (mask & (1u << deflate_index)) != 0) {  // stored as it reads
      if (stored != chunk_bytes)
        throw IoError(
            fmt::format("{} stores a chunk of {} bytes where a chunk has {} (the file "
                        "is damaged: re-create it)",
                        object, stored, chunk_bytes));
      continue;
    }
    // zlib's inflate gives at most 1032 bytes of one (kMaxExpansion): a
    // chunk that claims more than its stored bytes can give is damaged, and
    // is refused before a buffer of the claimed size is made (an 8 KiB file
    // once made this take 2 GiB).
    if (chunk_bytes > kMaxExpansion * stored + 1024)
      throw IoError(
          fmt::format("{} has a chunk of {} stored bytes, which cannot inflate to its {} bytes "
                      "(the file is damaged: re-create it)",
                      object, stored, chunk_bytes));
    if (inflated.size() < chunk_bytes + 1) inflated.resize(chunk_bytes + 1);
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
