// DistributedSampler (io/sampler.h).
//
// Note [sampler permutation]: the order of epoch e is a Fisher-Yates shuffle
// (Durstenfeld's, from the last position down) of 0..N-1 driven by the Philox
// stream PhiloxKey{seed, 0x53414D50'00000000 + e} ("SAMP" and the epoch, apart
// from the Generator's stream 0 and dropout's hashed streams; Note [Philox
// stream], kernels/philox.h) from word 0. Step i (i = N-1 down to 1) takes
// the next two words as a 64-bit x (low word first) and swaps positions i and
// j = floor(x * (i+1) / 2^64). The bias of that map is below (i+1) / 2^64, far
// under anything measurable. The order depends on (seed, epoch, N) alone: the
// same on every rank, machine, thread count and restart.
#include "io/sampler.h"

#include <fmt/core.h>

#include <algorithm>
#include <numeric>

#include "kernels/error.h"
#include "kernels/philox.h"

namespace lockstep::io {
namespace {

constexpr std::uint64_t kSamplerStreams = 0x53414D50'00000000;  // "SAMP", then the epoch
constexpr std::int64_t kMaxEpoch = std::int64_t{1} << 32;
constexpr std::int64_t kWordBlock = 8192;

}  // namespace

DistributedSampler::DistributedSampler(std::int64_t dataset_size, const SamplerOptions& options)
    : dataset_size_(dataset_size), options_(options) {
  if (dataset_size < 0)
    throw InvalidArgument(fmt::format("sampler: dataset size {} is negative", dataset_size));
  if (options.micro_batch < 1)
    throw InvalidArgument(fmt::format(
        "sampler: micro-batch {} is below 1 (set SamplerOptions::micro_batch to the rows per rank)",
        options.micro_batch));
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    throw InvalidArgument(
        fmt::format("sampler: rank {} is outside a world of {} (pass the communicator's rank "
                    "and size)",
                    options.rank, options.world_size));
}

std::int64_t DistributedSampler::batches_per_epoch() const {
  const std::int64_t g = global_batch();
  return options_.drop_last ? dataset_size_ / g : (dataset_size_ + g - 1) / g;
}

std::vector<std::int64_t> DistributedSampler::order(std::int64_t epoch) const {
  if (epoch < 0 || epoch >= kMaxEpoch)
    throw InvalidArgument(fmt::format("sampler: epoch {} is outside [0, 2^32)", epoch));
  std::vector<std::int64_t> order(static_cast<std::size_t>(dataset_size_));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  if (!options_.shuffle || dataset_size_ < 2) return order;
  const kernels::PhiloxKey key{options_.seed, kSamplerStreams + static_cast<std::uint64_t>(epoch)};
  std::uint64_t offset = 0;
  const std::int64_t block = std::min(kWordBlock, 2 * (dataset_size_ - 1));
  std::vector<std::uint32_t> words(static_cast<std::size_t>(block));
  std::int64_t used = block;
  for (std::int64_t i = dataset_size_ - 1; i > 0; --i) {
    if (used == block) {
      kernels::cpu::random_words(key, offset, words.data(), block);
      offset += static_cast<std::uint64_t>(block);
      used = 0;
    }
    const std::uint64_t x = words[used] | (std::uint64_t{words[used + 1]} << 32);
    used += 2;
    const auto j = static_cast<std::int64_t>(
        (static_cast<unsigned __int128>(x) * static_cast<std::uint64_t>(i + 1)) >> 64);
    std::swap(order[i], order[j]);
  }
  return order;
}

void DistributedSampler::set_epoch(std::int64_t epoch) {
  if (epoch == epoch_) return;
  order_ = order(epoch);
  epoch_ = epoch;
}

MicroBatch DistributedSampler::micro_batch(std::int64_t batch) const {
  if (epoch_ < 0) throw InvalidArgument("sampler: call set_epoch() before micro_batch()");
  if (batch < 0 || batch >= batches_per_epoch())
    throw InvalidArgument(
        fmt::format("sampler: batch {} is outside the epoch's {}", batch, batches_per_epoch()));
  const std::int64_t b = options_.micro_batch;
  const std::int64_t start = batch * global_batch() + options_.rank * b;
  MicroBatch out;
  out.indices.resize(static_cast<std::size_t>(b));
  for (std::int64_t i = 0; i < b; ++i)
    out.indices[i] = order_[static_cast<std::size_t>((start + i) % dataset_size_)];
  out.valid = std::clamp<std::int64_t>(dataset_size_ - start, 0, b);
  return out;
}

void DistributedSampler::check_position(std::int64_t position) const {
  if (position < 0 || position > epoch_positions() || position % global_batch() != 0)
    throw InvalidArgument(fmt::format(
        "sampler position {} is not a multiple of the global batch {} within the epoch's {} "
        "(resume with the global batch, world size x micro-batch, the checkpoint was saved with)",
        position, global_batch(), epoch_positions()));
}

}  // namespace lockstep::io
