// DataLoader (io/loader.h): the worker pool, the buffer pool and the
// hand-over to the consumer (Note [loader pipeline]).
#include "io/loader.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "engine/core/log.h"
#include "engine/core/memory.h"
#include "engine/core/ops.h"
#include "engine/core/trace.h"
#include "io/image_decode.h"
#include "kernels/error.h"
#include "kernels/image.h"

#if LOCKSTEP_WITH_CUDA
#include "kernels/cuda/check.h"
#endif

namespace lockstep::io {
namespace {

constexpr float kU8Scale = 1.0f / 255.0f;
constexpr std::size_t kLabelsAlignment = 64;

// One buffer of the pool, and the batch it holds between a worker and next().
struct Slot {
  core::Tensor inputs, labels;            // cpu: the tensors handed out
  core::Tensor staging;                   // cpu with scale_u8: the u8 rows, scaled into `inputs`
  std::shared_ptr<core::Storage> pinned;  // cuda: inputs, then labels
  core::Event copied;                     // cuda: the copy out of `pinned` has finished
  void* host_inputs = nullptr;
  void* host_labels = nullptr;        // i64 labels or tokens, or f32 targets (State::label_dtype)
  std::vector<std::int32_t> windows;  // token shards: the rows read, [B, T+1]
  MicroBatch rows;
  std::vector<std::uint8_t> encoded;  // images: one row's file, then its pixels
  DecodedImage decoded;
  std::exception_ptr error;
  bool lent = false;  // cpu: handed out and still referenced by the consumer
};

bool referenced_elsewhere(const core::Tensor& t) { return t.storage().use_count() > 1; }

// u8 rows to f32 x * kU8Scale in one pass: bit for bit what ops::cast then
// ops::scale give (the widening is exact, the product is the same f32 one),
// without their two sweeps and per-element dtype dispatch.
void scale_u8(const core::Tensor& u8, core::Tensor& f32) {
  const auto* in = u8.data_as<std::uint8_t>();
  float* out = f32.data_as<float>();
  for (std::int64_t i = 0; i < u8.numel(); ++i) out[i] = kU8Scale * static_cast<float>(in[i]);
}

}  // namespace

struct DataLoader::State {
  Dataset dataset;
  LoaderOptions options;
  DistributedSampler sampler;
  core::Shape batch_shape;
  core::Shape label_shape;         // [B], [B, ...target_shape] or [B, T] for token shards
  DType label_dtype = DType::i64;  // f32 for target shards
  DType out_dtype;
  DType host_dtype =
      DType::u8;  // what workers write: the dataset's, f32 images (cpu), u8 images (cuda)
  std::vector<Slot> slots;

  // Shared with the workers, under `mutex`.
  std::mutex mutex;
  std::condition_variable work_cv, ready_cv;
  std::deque<int> free;              // oldest first (Note [buffer reuse order])
  std::map<std::int64_t, int> done;  // batch -> slot, assembled or failed
  std::int64_t next_assign = 0, end_assign = 0;
  int busy = 0;               // slots in workers' hands
  std::int64_t awaited = -1;  // the batch next() is blocked on, if any
  bool stop = false;
  std::vector<std::thread> workers;

  // The consumer's side.
  bool started = false;
  std::int64_t epoch = 0, next_out = 0, end_epoch = 0;
  std::exception_ptr failure;
  LoaderStats stats;
  core::Stream copy_stream, consumer_stream;
  core::Event allocated;
  std::optional<Batch> prefetched;  // cuda: copy issued, not yet handed out

  State(Dataset d, LoaderOptions o)
      : dataset(std::move(d)), options(std::move(o)), sampler(dataset.size(), options.sampler) {}

  void worker_loop(int worker);
  void assemble(std::int64_t batch, Slot& slot);
  void split_windows(Slot& slot) const;
  void assemble_images(Slot& slot) const;
  void stop_workers();
  void reclaim_lent();
  int wait_for(std::int64_t batch);
  Batch hand_out(int slot, std::int64_t batch);
  Batch copy_to_device(int slot, std::int64_t batch);
  void prefetch(std::int64_t batch);
  void drain_device();
};

void DataLoader::State::worker_loop(int worker) {
  core::trace::set_thread_name(fmt::format("loader {}", worker));
  std::unique_lock lock(mutex);
  while (true) {
    work_cv.wait(lock, [&] { return stop || (next_assign < end_assign && !free.empty()); });
    if (stop) return;
    const std::int64_t batch = next_assign++;
    // Note [buffer reuse order]: on cuda the oldest free buffer, whose copy
    // has most likely finished; on the cpu the newest, whose memory is most
    // likely still in cache (rotating through all D buffers costs the reads
    // about a fifth of their speed when the batches are a few MB).
    int index;
    if (options.device.is_cuda()) {
      index = free.front();
      free.pop_front();
    } else {
      index = free.back();
      free.pop_back();
    }
    ++busy;
    lock.unlock();
    Slot& slot = slots[index];
    slot.error = nullptr;
    try {
      core::trace::Span span("load batch", "data");
      assemble(batch, slot);
    } catch (...) {
      slot.error = std::current_exception();
    }
    lock.lock();
    --busy;
    if (slot.error) end_assign = std::min(end_assign, batch + 1);  // nothing after it is needed
    done[batch] = index;
    if (batch == awaited) {  // the consumer waits for no other batch
      lock.unlock();         // so that it does not wake only to wait for the mutex
      ready_cv.notify_one();
      lock.lock();
    }
  }
}

void DataLoader::State::assemble(std::int64_t batch, Slot& slot) {
  // A new thread's current GPU is GPU 0: without this, every rank's workers
  // would create a context there and wait on events from another device.
  // Set per batch (a no-op when already current) so that a failure reaches
  // the consumer as this batch's error.
  core::set_current_device(options.device);
  slot.copied.synchronize();
  slot.rows = sampler.micro_batch(batch);
  if (options.images.enabled()) {
    assemble_images(slot);
  } else if (dataset.format().is_tokens()) {
    dataset.read_inputs(slot.rows.indices, slot.windows.data());
    split_windows(slot);
  } else if (dataset.format().has_targets) {
    dataset.read_inputs(slot.rows.indices, slot.host_inputs);
    const std::vector<float>& targets = dataset.targets();
    const auto per_row = static_cast<std::size_t>(core::shape_numel(dataset.format().target_shape));
    auto* out = static_cast<float*>(slot.host_labels);
    for (std::size_t i = 0; i < slot.rows.indices.size(); ++i)
      std::copy_n(targets.data() + static_cast<std::size_t>(slot.rows.indices[i]) * per_row,
                  per_row, out + i * per_row);
  } else {
    dataset.read_inputs(slot.rows.indices, slot.host_inputs);
    const std::vector<std::int64_t>& labels = dataset.labels();
    auto* out = static_cast<std::int64_t*>(slot.host_labels);
    for (std::size_t i = 0; i < slot.rows.indices.size(); ++i)
      out[i] = labels[static_cast<std::size_t>(slot.rows.indices[i])];
  }
  if (options.transform) {
    HostBatch host{
        slot.host_inputs,
        host_dtype,
        batch_shape,
        dataset.format().has_targets ? nullptr : static_cast<std::int64_t*>(slot.host_labels),
        slot.rows.indices,
        slot.rows.valid,
        epoch,
        batch};
    options.transform(host);
  }
  if (slot.staging.defined()) scale_u8(slot.staging, slot.inputs);
}

// Note [image batches]: each row of an image batch is read (an encoded
// shard's file, decoded in this worker thread; or a u8 shard's [C, H, W]
// row), its crop chosen from (seed, epoch, global sample index) alone (Note
// [keyed augmentation] in image_transform.cpp) and the image's full size
// (from its header: a JPEG is then decoded at the scale the crop allows,
// Note [scaled decode], and only the rows and columns the crop reads, Note
// [cropped decode] in image_decode.cpp), and resampled, flipped and
// normalised straight into the f32 batch: no intermediate image. The labels
// come from memory as for any shard. For a cuda loader the crop is rounded
// to u8 instead, copied (a quarter of the bytes over PCIe) and normalised on
// the device (kernels/image.h): its values differ from the cpu loader's by
// that rounding (at most 0.5 / (255 std)). A damaged image, or one whose channels
// are not the model's, fails its batch naming the shard and the row.
void DataLoader::State::assemble_images(Slot& slot) const {
  const ImageOptions& o = options.images;
  const ShardFormat& format = dataset.format();
  const std::vector<std::int64_t>& labels = dataset.labels();
  auto* out_labels = static_cast<std::int64_t*>(slot.host_labels);
  auto* out = static_cast<float*>(slot.host_inputs);
  auto* out_u8 = static_cast<std::uint8_t*>(slot.host_inputs);
  const std::int64_t per_image = o.channels * o.height * o.width;
  const auto check_channels = [&](std::int64_t row, std::int64_t channels) {
    if (channels != o.channels)
      throw InvalidArgument(fmt::format(
          "{}: the image has {} channel{} ({}), but the model takes {} (images decode to 1 "
          "channel when grayscale and 3 when colour: convert the images, or pick a model of {} "
          "input channel{})",
          dataset.describe_row(row), channels, channels == 1 ? "" : "s",
          channels == 1 ? "grayscale" : "colour", o.channels, channels, channels == 1 ? "" : "s"));
  };
  for (std::size_t i = 0; i < slot.rows.indices.size(); ++i) {
    const std::int64_t row = slot.rows.indices[i];
    out_labels[i] = labels[static_cast<std::size_t>(row)];
    PixelView view;
    CropBox box;
    if (format.encoded) {
      dataset.read_encoded(row, slot.encoded);
      try {
        const ImageHeader header = read_image_header(slot.encoded);
        check_channels(row, header.channels);
        box = choose_crop(o, header.height, header.width, epoch, row);
        const int scale = header.jpeg ? decode_scale(box, o) : 1;  // Note [scaled decode]
        box = scaled_box(box, scale);
        if (header.jpeg) {  // Note [cropped decode] in image_decode.cpp
          const std::int64_t height = (header.height + scale - 1) / scale;
          const std::int64_t width = (header.width + scale - 1) / scale;
          decode_image_region(slot.encoded, slot.decoded, scale,
                              crop_source_region(box, o, height, width));
        } else {
          decode_image(slot.encoded, slot.decoded);
        }
      } catch (const DecodeError& e) {
        throw IoError(
            fmt::format("{}, dataset 'inputs': {} (re-encode the image, or leave it "
                        "out of the shards)",
                        dataset.describe_row(row), e.what()));
      }
      const DecodedImage& d = slot.decoded;
      view = {d.pixels.data(),      d.channels, d.image_height, d.image_width, 1,
              d.width * d.channels, d.channels, d.y0,           d.x0};
    } else {
      slot.encoded.resize(format.sample_bytes());
      dataset.read_inputs(std::span(&row, 1), slot.encoded.data());
      const core::Shape& shape = format.sample_shape;
      view = {slot.encoded.data(), shape[0], shape[1], shape[2], shape[1] * shape[2], shape[2], 1};
      check_channels(row, view.channels);
      box = choose_crop(o, view.height, view.width, epoch, row);
    }
    const auto at = static_cast<std::int64_t>(i) * per_image;
    if (host_dtype == DType::u8)
      crop_resize_u8(view, box, o, out_u8 + at);
    else
      crop_resize_normalize(view, box, o, out + at);
  }
}

// Token windows [B, T+1] to inputs (the first T) and targets (the last T),
// checking each token against the vocabulary (num_classes) when one is given.
void DataLoader::State::split_windows(Slot& slot) const {
  const std::int64_t seq = batch_shape[1], vocab = options.num_classes;
  auto* inputs = static_cast<std::int32_t*>(slot.host_inputs);
  auto* targets = static_cast<std::int64_t*>(slot.host_labels);
  for (std::size_t r = 0; r < slot.rows.indices.size(); ++r) {
    const std::int32_t* window = slot.windows.data() + r * (seq + 1);
    for (std::int64_t t = 0; t <= seq; ++t)
      if (window[t] < 0 || (vocab > 0 && window[t] >= vocab))
        throw InvalidArgument(fmt::format(
            "{}, dataset 'inputs', column {}: token {} is outside [0, {}) (write the shards with "
            "the model's vocabulary, or pick the model that fits them)",
            dataset.describe_row(slot.rows.indices[r]), t, window[t],
            vocab > 0 ? std::to_string(vocab) : std::string("2^31")));
    std::copy(window, window + seq, inputs + r * seq);
    std::copy(window + 1, window + seq + 1, targets + r * seq);
  }
}

void DataLoader::State::stop_workers() {
  {
    std::lock_guard lock(mutex);
    stop = true;
  }
  work_cv.notify_all();
  for (std::thread& t : workers) t.join();
  workers.clear();
  stop = false;
}

// A cpu slot comes back once the consumer holds no reference to its tensors.
void DataLoader::State::reclaim_lent() {
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) {
    Slot& slot = slots[i];
    if (!slot.lent || referenced_elsewhere(slot.inputs) || referenced_elsewhere(slot.labels))
      continue;
    slot.lent = false;
    free.push_back(i);
    work_cv.notify_one();
  }
}

int DataLoader::State::wait_for(std::int64_t batch) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex);
  auto it = done.find(batch);
  while (it == done.end()) {
    if (!options.device.is_cuda()) {
      reclaim_lent();
      if (next_assign <= batch && free.empty() && busy == 0)
        throw InvalidArgument(fmt::format(
            "DataLoader: the consumer still holds all {} batches the pool can lend (drop "
            "batches, and tensors taken from them, before asking for more, or set "
            "LoaderOptions::held_batches to the batches kept at once, e.g. the Trainer's "
            "accumulation)",
            slots.size()));
    }
    awaited = batch;
    ready_cv.wait(lock);
    it = done.find(batch);
  }
  awaited = -1;
  const int index = it->second;
  done.erase(it);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.wait_s += waited;
  stats.max_wait_s = std::max(stats.max_wait_s, waited);
  if (slots[index].error) {
    failure = slots[index].error;
    free.push_back(index);
    std::rethrow_exception(failure);
  }
  return index;
}

Batch DataLoader::State::hand_out(int index, std::int64_t batch) {
  Slot& slot = slots[index];
  {
    std::lock_guard lock(mutex);
    slot.lent = true;
  }
  // The slot's rows are not read again: assemble() replaces them on refill.
  return {.inputs = slot.inputs,
          .labels = slot.labels,
          .indices = std::move(slot.rows.indices),
          .valid = slot.rows.valid,
          .epoch = epoch,
          .index = batch,
          .ready = {}};
}

#if LOCKSTEP_WITH_CUDA
Batch DataLoader::State::copy_to_device(int index, std::int64_t batch) {
  Slot& slot = slots[index];
  const core::Device device = options.device;
  core::set_current_device(device);
  core::Tensor inputs = core::Tensor::empty(batch_shape, out_dtype, device, consumer_stream);
  core::Tensor labels = core::Tensor::empty(label_shape, label_dtype, device, consumer_stream);
  // Stream-ordered memory may be used on another stream only after that
  // stream has waited for the allocation (memory.h).
  allocated.record(consumer_stream);
  copy_stream.wait(allocated);
  core::trace::Span copy;  // on the host and, traced, on the copy stream's track
  copy.open("host-to-device copy", {}, "data", &copy_stream);
  const cudaStream_t stream = copy_stream.handle();
  const std::size_t input_bytes =
      static_cast<std::size_t>(core::shape_numel(batch_shape)) * dtype_size(host_dtype);
  if (out_dtype == host_dtype) {
    LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(inputs.data(), slot.host_inputs, input_bytes,
                                        cudaMemcpyHostToDevice, stream));
  } else {
    core::Tensor staging = core::Tensor::empty(batch_shape, DType::u8, device, copy_stream);
    LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(staging.data(), slot.host_inputs, input_bytes,
                                        cudaMemcpyHostToDevice, stream));
    if (options.images.enabled()) {  // Note [image batches]: normalised here
      kernels::cuda::normalize_u8(staging.data_as<std::uint8_t>(), inputs.data_as<float>(),
                                  batch_shape[0], batch_shape[2] * batch_shape[3],
                                  channel_affine(options.images), stream);
    } else {
      core::ops::cast(staging, inputs, copy_stream);
      core::ops::scale(inputs, kU8Scale, copy_stream);
    }
  }
  LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(labels.data(), slot.host_labels, labels.nbytes(),
                                      cudaMemcpyHostToDevice, stream));
  slot.copied.record(copy_stream);
  Batch out{.inputs = std::move(inputs),
            .labels = std::move(labels),
            .indices = std::move(slot.rows.indices),  // refilled by assemble()
            .valid = slot.rows.valid,
            .epoch = epoch,
            .index = batch,
            .ready = {}};
  out.ready.record(copy_stream);
  {
    std::lock_guard lock(mutex);
    free.push_back(index);
  }
  work_cv.notify_one();
  return out;
}
#else
Batch DataLoader::State::copy_to_device(int, std::int64_t) {
  throw InvalidArgument(
      "DataLoader: batches on a cuda device, but this build has no CUDA (rebuild with "
      "LOCKSTEP_WITH_CUDA=ON, or load onto the cpu)");
}
#endif

// Issues the copy of `batch` now if a worker has finished it, so that it
// overlaps whatever the consumer does before asking for it. A failure here
// belongs to `batch`: it is kept for the next call of next(), and the batch
// being handed out now is not lost.
void DataLoader::State::prefetch(std::int64_t batch) {
  int index;
  {
    std::lock_guard lock(mutex);
    const auto it = done.find(batch);
    if (it == done.end() || slots[it->second].error) return;
    index = it->second;
    done.erase(it);
  }
  try {
    prefetched = copy_to_device(index, batch);
  } catch (...) {
    failure = std::current_exception();
  }
}

// Copies still in flight write into buffers and tensors about to be dropped.
void DataLoader::State::drain_device() {
  if (!options.device.is_cuda()) return;
  copy_stream.synchronize();
  prefetched.reset();
}

DataLoader::DataLoader(Dataset dataset, LoaderOptions options)
    : state_(std::make_unique<State>(std::move(dataset), std::move(options))) {
  State& s = *state_;
  const LoaderOptions& o = s.options;
  const ShardFormat& format = s.dataset.format();
  if (o.threads < 1)
    throw InvalidArgument(
        fmt::format("DataLoader: LoaderOptions::threads is {}; it must be at least 1", o.threads));
  if (o.held_batches < 1)
    throw InvalidArgument(fmt::format(
        "DataLoader: LoaderOptions::held_batches is {}; it must be at least 1", o.held_batches));
  if (o.depth < 0)
    throw InvalidArgument(
        fmt::format("DataLoader: LoaderOptions::depth is {}; pass a positive pool size, or 0 for "
                    "the default (io/loader.h)",
                    o.depth));
  // Note [loader pool size]: on the cpu a buffer stays lent while the consumer
  // holds its batch, and the Trainer holds all micro-batches of a step before
  // it computes, so the pool must hold held_batches besides the workers'
  // batches in flight. A consumer cannot usefully hold more than an epoch's
  // batches, which caps the pool whatever held_batches says. On cuda a buffer
  // comes back as soon as its copy is issued: held batches cost no buffer.
  const std::int64_t held =
      o.device.is_cuda()
          ? 1
          : std::min(o.held_batches, std::max<std::int64_t>(1, s.sampler.batches_per_epoch()));
  if (o.depth > 0 && o.depth < held)
    throw InvalidArgument(fmt::format(
        "DataLoader: LoaderOptions::depth {} is below held_batches {}: the consumer would wait "
        "forever for a buffer (raise depth, or pass 0 for the default)",
        o.depth, held));
  if (o.scale_u8 && format.input_dtype != DType::u8)
    throw InvalidArgument(std::string("DataLoader: scale_u8 needs u8 inputs, but the dataset "
                                      "holds ") +
                          dtype_name(format.input_dtype) +
                          " (turn scale_u8 off, or write the shards with u8 inputs)");
  if (format.encoded && !o.images.enabled())
    throw InvalidArgument(
        "DataLoader: the dataset holds encoded images (" + format.str() +
        "), which need LoaderOptions::images (the channels and size to decode and crop them to)");
  if (o.images.enabled()) {
    o.images.check();
    if (o.scale_u8)
      throw InvalidArgument(
          "DataLoader: scale_u8 with LoaderOptions::images (the images' normalisation already "
          "divides by 255: turn scale_u8 off)");
    if (!format.encoded &&
        (format.input_dtype != DType::u8 || format.sample_shape.size() != 3 || !format.has_labels))
      throw InvalidArgument(
          "DataLoader: LoaderOptions::images needs encoded images or u8 images "
          "[C, H, W] with labels, but the dataset holds " +
          format.str());
    if (!format.encoded && format.sample_shape[0] != o.images.channels)
      throw InvalidArgument(fmt::format(
          "DataLoader: the shards' images have {} channels ({}), but the model takes {} (pick a "
          "model of {} input channels, or convert the images)",
          format.sample_shape[0], format.str(), o.images.channels, format.sample_shape[0]));
  }
  core::require_usable(o.device);
  // The pinned pool below and the copy events belong to the loader's device,
  // whatever GPU the constructing thread had current.
  core::set_current_device(o.device);
  if (o.stream.device().is_cuda() && !(o.stream.device() == o.device))
    throw InvalidArgument("DataLoader: a stream of " + o.stream.device().str() +
                          " for batches on " + o.device.str() +
                          " (pass a stream of the loader's device, or none)");
  // Token shards are checked batch by batch (split_windows).
  if (o.num_classes > 0 && format.has_labels) s.dataset.check_labels(o.num_classes);

  const std::int64_t rows = o.sampler.micro_batch;
  s.batch_shape = {rows};
  s.label_shape = {rows};
  if (o.images.enabled()) {
    s.batch_shape.insert(s.batch_shape.end(), {o.images.channels, o.images.height, o.images.width});
  } else if (!format.is_tokens()) {
    s.batch_shape.insert(s.batch_shape.end(), format.sample_shape.begin(),
                         format.sample_shape.end());
    s.label_shape.insert(s.label_shape.end(), format.target_shape.begin(),
                         format.target_shape.end());
  } else {
    s.batch_shape.push_back(format.sample_shape[0] - 1);
    s.label_shape = s.batch_shape;
  }
  s.label_dtype = format.has_targets ? DType::f32 : DType::i64;
  s.out_dtype = o.scale_u8 || o.images.enabled() ? DType::f32 : format.input_dtype;
  s.host_dtype = !o.images.enabled()  ? format.input_dtype
                 : o.device.is_cuda() ? DType::u8
                                      : DType::f32;
  const std::int64_t depth = o.depth > 0 ? o.depth : 2 * std::int64_t{o.threads} + 1 + held;
  s.slots.resize(static_cast<std::size_t>(depth));
  const std::size_t input_bytes =
      static_cast<std::size_t>(core::shape_numel(s.batch_shape)) * dtype_size(s.host_dtype);
  const std::size_t labels_at =
      (input_bytes + kLabelsAlignment - 1) / kLabelsAlignment * kLabelsAlignment;
  const auto label_count = static_cast<std::size_t>(core::shape_numel(s.label_shape));
  for (Slot& slot : s.slots) {
    if (format.is_tokens())
      slot.windows.resize(static_cast<std::size_t>(rows) * format.sample_shape[0]);
    if (o.device.is_cuda()) {
      slot.pinned = core::allocate_pinned(labels_at + label_count * dtype_size(s.label_dtype));
      slot.host_inputs = slot.pinned->data();
      slot.host_labels = static_cast<std::byte*>(slot.pinned->data()) + labels_at;
    } else {
      slot.inputs = core::Tensor::empty(s.batch_shape, s.out_dtype);
      slot.labels = core::Tensor::empty(s.label_shape, s.label_dtype);
      if (o.scale_u8) slot.staging = core::Tensor::empty(s.batch_shape, DType::u8);
      slot.host_inputs = (o.scale_u8 ? slot.staging : slot.inputs).data();
      slot.host_labels = slot.labels.data();
    }
  }
  if (o.device.is_cuda()) {
    s.copy_stream = core::Stream::create(o.device);
    core::trace::set_stream_name(s.copy_stream, "copy stream");
    s.consumer_stream =
        o.stream.device().is_cuda() ? o.stream : core::Stream::default_for(o.device);
  }
  for (const ShardInfo& shard : s.dataset.shards())
    if (shard.layout == ShardLayout::hdf5)
      core::log_info(
          "DataLoader: shard '{}' is {}: read through HDF5 under its lock, one "
          "thread at a time (rewrite it with lockstep-shard for parallel reads)",
          shard.path.string(), shard.layout_reason);
}

DataLoader::~DataLoader() {
  state_->stop_workers();
  try {
    state_->drain_device();
  } catch (const std::exception& e) {
    core::log_warn("DataLoader: while shutting down: {}", e.what());
  }
}

void DataLoader::do_start_epoch(std::int64_t epoch, std::int64_t position) {
  State& s = *state_;
  s.started = false;
  s.stop_workers();
  s.drain_device();
  s.sampler.check_position(position);
  s.sampler.set_epoch(epoch);
  {
    std::lock_guard lock(s.mutex);
    s.done.clear();
    s.free.clear();
    for (int i = 0; i < static_cast<int>(s.slots.size()); ++i)
      if (!s.slots[i].lent) s.free.push_back(i);
    s.next_assign = position / s.sampler.global_batch();
    s.end_assign = s.sampler.batches_per_epoch();
  }
  s.epoch = epoch;
  s.next_out = s.next_assign;
  s.end_epoch = s.end_assign;
  s.failure = nullptr;
  s.started = true;
  for (int t = 0; t < s.options.threads && s.next_assign < s.end_assign; ++t)
    s.workers.emplace_back([&s, t] { s.worker_loop(t); });
}

std::optional<Batch> DataLoader::next() {
  State& s = *state_;
  if (!s.started)
    throw InvalidArgument(
        "DataLoader::next() before start_epoch() (call start_epoch(epoch) first)");
  if (s.failure) std::rethrow_exception(s.failure);
  if (s.next_out == s.end_epoch) return std::nullopt;
  const std::int64_t batch = s.next_out;
  const bool cuda = s.options.device.is_cuda();
  const bool prefetched = s.prefetched && s.prefetched->index == batch;
  // Throws a worker's error (kept in `failure`), or, before taking anything,
  // the error of a consumer that holds every buffer.
  const int slot = prefetched ? -1 : s.wait_for(batch);
  std::optional<Batch> out;
  try {
    if (prefetched) {
      out = std::move(s.prefetched);
      s.prefetched.reset();
    } else {
      out = cuda ? s.copy_to_device(slot, batch) : s.hand_out(slot, batch);
    }
    if (cuda) s.consumer_stream.wait(out->ready);
  } catch (...) {
    s.failure = std::current_exception();  // the batch is lost: later calls must not wait for it
    throw;
  }
  ++s.next_out;
  {
    std::lock_guard lock(s.mutex);
    ++s.stats.batches;
  }
  if (cuda && s.next_out < s.end_epoch) s.prefetch(s.next_out);
  return out;
}

LoaderPosition DataLoader::position() const {
  return {state_->epoch, state_->next_out * state_->sampler.global_batch()};
}

const DistributedSampler& DataLoader::sampler() const { return state_->sampler; }
const Dataset& DataLoader::dataset() const { return state_->dataset; }
int DataLoader::depth() const { return static_cast<int>(state_->slots.size()); }

LoaderStats DataLoader::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

}  // namespace lockstep::io
