// StepReadback (engine/step_readback.h).
#include "engine/step_readback.h"

#include <cstring>

#include "kernels/error.h"
#include "kernels/reduce.h"

namespace lockstep::engine {
namespace {

std::size_t round_up(std::size_t bytes, std::size_t to) { return (bytes + to - 1) / to * to; }

}  // namespace

std::string embedding_index_error(const std::string& module, std::int64_t index,
                                  std::int64_t position, std::int64_t vocab) {
  return module + ": index " + std::to_string(index) + " at position " + std::to_string(position) +
         " is outside the vocabulary [0, " + std::to_string(vocab) +
         ") (the data's token ids must be below the model's vocabulary size: check that the "
         "data was tokenized with this model's tokenizer, or build the model with a larger "
         "vocabulary)";
}

kernels::IndexReport IndexChecks::add(std::string module, core::Tensor indices,
                                      std::int64_t vocab) {
  const auto tag = static_cast<std::uint64_t>(lookups_.size());
  if (!word_.defined() || tag >= (std::uint64_t{1} << kernels::kIndexReportTagBits) ||
      indices.numel() > (std::int64_t{1} << kernels::kIndexReportPositionBits))
    return {};
  lookups_.push_back({std::move(module), std::move(indices), vocab});
  return {static_cast<std::uint64_t*>(word_.data()), tag};
}

void IndexChecks::check(std::uint64_t word, const core::Stream& stream) const {
  if (!kernels::index_report_bad(word)) return;
  const std::uint64_t tag = kernels::index_report_tag(word);
  const std::int64_t position = kernels::index_report_position(word);
  if (tag >= lookups_.size())
    throw InvalidArgument("an embedding lookup of this step (tag " + std::to_string(tag) +
                          ", position " + std::to_string(position) +
                          ") met an index outside its vocabulary, but the step registered " +
                          std::to_string(lookups_.size()) +
                          " lookups (a lookup kept its report "
                          "past the step: report this as a bug)");
  const Lookup& lookup = lookups_[static_cast<std::size_t>(tag)];
  const std::int64_t index = lookup.indices.view(position, {1})
                                 .cast(DType::i64, stream)
                                 .to_vector<std::int64_t>(stream)[0];
  throw InvalidArgument(embedding_index_error(lookup.module, index, position, lookup.vocab) +
                        "; the step was refused: no parameter was updated");
}

StepReadback::StepReadback(std::int64_t ranges, std::int64_t chunks, core::Device device,
                           const core::Stream& stream) {
  // [loss f32][rows f32][flag i32][pad][sums f64 x ranges][chunks f32 x chunks][pad]
  // [index report u64] | workspace
  constexpr std::size_t sums_at = 16;
  const std::size_t chunks_at = sums_at + static_cast<std::size_t>(ranges) * sizeof(double);
  index_word_at_ = round_up(chunks_at + static_cast<std::size_t>(chunks) * sizeof(float), 8);
  read_bytes_ = index_word_at_ + sizeof(std::uint64_t);
  const std::size_t workspace_bytes = kernels::cuda::kReduceWorkspaceBytes;
  buffer_ = core::Tensor::empty({static_cast<std::int64_t>(read_bytes_ + workspace_bytes)},
                                DType::u8, device, stream);
  loss_total_ = buffer_.view_bytes(0, {1}, DType::f32);
  rows_total_ = buffer_.view_bytes(4, {1}, DType::f32);
  nonfinite_ = buffer_.view_bytes(8, {1}, DType::i32);
  sum_squares_ = buffer_.view_bytes(sums_at, {ranges}, DType::i64);
  chunk_losses_ = buffer_.view_bytes(chunks_at, {chunks}, DType::f32);
  index_checks_ = IndexChecks(buffer_.view_bytes(index_word_at_, {1}, DType::i64));
  workspace_ = buffer_.view_bytes(read_bytes_, {kernels::cuda::kReduceBlocks}, DType::i64);
  host_.resize(read_bytes_);
  values_.sum_squares.resize(static_cast<std::size_t>(ranges));
  values_.chunk_losses.resize(static_cast<std::size_t>(chunks));
}

void StepReadback::clear(const core::Stream& stream) {
  buffer_.view(0, {static_cast<std::int64_t>(read_bytes_)}).fill_(0.0, stream);
  index_checks_.clear();
}

const StepReadback::Values& StepReadback::read(const core::Stream& stream) {
  buffer_.view(0, {static_cast<std::int64_t>(read_bytes_)}).copy_to_host(host_.data(), stream);
  float loss = 0.0f, rows = 0.0f;
  std::int32_t flag = 0;
  std::memcpy(&loss, host_.data(), sizeof loss);
  std::memcpy(&rows, host_.data() + 4, sizeof rows);
  std::memcpy(&flag, host_.data() + 8, sizeof flag);
  values_.loss_total = loss;
  values_.rows_total = static_cast<std::int64_t>(rows);
  values_.nonfinite = flag != 0;
  // An empty slot's vector has no storage: memcpy may not be given its null.
  const std::size_t sums_bytes = values_.sum_squares.size() * sizeof(double);
  if (sums_bytes > 0) std::memcpy(values_.sum_squares.data(), host_.data() + 16, sums_bytes);
  if (!values_.chunk_losses.empty())
    std::memcpy(values_.chunk_losses.data(), host_.data() + 16 + sums_bytes,
                values_.chunk_losses.size() * sizeof(float));
  std::memcpy(&values_.bad_index, host_.data() + index_word_at_, sizeof values_.bad_index);
  return values_;
}

}  // namespace lockstep::engine
