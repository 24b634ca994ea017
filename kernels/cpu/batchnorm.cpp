// CPU BatchNorm (kernels/batchnorm.h): per channel, two passes in f64 (mean,
// then squared deviations), so the statistics are as exact as f32 inputs
// allow. Also the argument checks both backends share, and the fused calls'
// twin (Note [fused batchnorm]): the unfused f32 ops composed.
//
// Note [cpu channels-last batchnorm]: with spatial == 1 (an NHWC activation
// as [rows, C], Note [channels-last batchnorm] in the CUDA file) the loops run
// row by row with one accumulator per channel instead of channel by channel,
// which read with a stride of C. Each channel still adds its values in row
// order, the order for_channel gives, and each value's expression is the
// same, so both loops give the same bits; and rows n * H * W + hw run in the
// NCHW loop's (n, hw) order, so NHWC statistics equal NCHW ones bit for bit.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/activation.h"
#include "kernels/batchnorm.h"
#include "kernels/elementwise.h"
#include "kernels/error.h"

namespace lockstep::kernels {

void validate_batchnorm(const BatchNormShape& s, bool training) {
  if (s.batch <= 0 || s.channels <= 0 || s.spatial <= 0)
    throw InvalidArgument("batchnorm: sizes must be positive, got batch " +
                          std::to_string(s.batch) + ", channels " + std::to_string(s.channels) +
                          ", spatial " + std::to_string(s.spatial));
  if (!(s.eps > 0.0))
    throw InvalidArgument("batchnorm: eps must be positive, got " + std::to_string(s.eps));
  if (training && s.batch * s.spatial < 2)
    throw InvalidArgument("batchnorm: training needs more than one value per channel, got batch " +
                          std::to_string(s.batch) + " x spatial " + std::to_string(s.spatial) +
                          " (use a larger batch, or eval mode)");
}

namespace cpu {
namespace {

// Calls f(value index) for every element of channel c, batch-major.
template <typename F>
void for_channel(const BatchNormShape& s, std::int64_t c, F&& f) {
  for (std::int64_t n = 0; n < s.batch; ++n)
    for (std::int64_t i = (n * s.channels + c) * s.spatial, end = i + s.spatial; i < end; ++i) f(i);
}

// The spatial == 1 forms (Note [cpu channels-last batchnorm]).
void forward_training_rows(const BatchNormShape& s, const float* x, const float* weight,
                           const float* bias, float* y, float* save_mean, float* save_rstd,
                           double momentum, float* running_mean, float* running_var) {
  const std::int64_t rows = s.batch, C = s.channels;
  const double count = static_cast<double>(rows);
  const auto channels = static_cast<std::size_t>(C);
  std::vector<double> sum(channels, 0.0), squares(channels, 0.0), mean(channels), scale(channels);
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t c = 0; c < C; ++c) sum[c] += x[n * C + c];
  for (std::int64_t c = 0; c < C; ++c) mean[c] = sum[c] / count;
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      squares[c] += (x[n * C + c] - mean[c]) * (x[n * C + c] - mean[c]);
  for (std::int64_t c = 0; c < C; ++c) {
    const double var = squares[c] / count;
    const double rstd = 1.0 / std::sqrt(var + s.eps);
    save_mean[c] = static_cast<float>(mean[c]);
    save_rstd[c] = static_cast<float>(rstd);
    scale[c] = rstd * weight[c];
    if (running_mean) {
      running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean[c]);
      const double unbiased = squares[c] / (count - 1.0);
      running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
    }
  }
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      y[n * C + c] = static_cast<float>((x[n * C + c] - mean[c]) * scale[c] + bias[c]);
}

void forward_inference_rows(const BatchNormShape& s, const float* x, const float* weight,
                            const float* bias, const float* running_mean, const float* running_var,
                            float* y) {
  const std::int64_t C = s.channels;
  std::vector<double> scale(static_cast<std::size_t>(C)), mean(static_cast<std::size_t>(C));
  for (std::int64_t c = 0; c < C; ++c) {
    scale[c] = weight[c] / std::sqrt(static_cast<double>(running_var[c]) + s.eps);
    mean[c] = running_mean[c];
  }
  for (std::int64_t n = 0; n < s.batch; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      y[n * C + c] = static_cast<float>((x[n * C + c] - mean[c]) * scale[c] + bias[c]);
}

void backward_rows(const BatchNormShape& s, const float* x, const float* dy, const float* weight,
                   const float* save_mean, const float* save_rstd, float* dx, float* dweight,
                   float* dbias) {
  const std::int64_t rows = s.batch, C = s.channels;
  const double count = static_cast<double>(rows);
  const auto channels = static_cast<std::size_t>(C);
  std::vector<double> mean(channels), rstd(channels), sum_dy(channels, 0.0),
      sum_dy_xhat(channels, 0.0), scale(channels), mean_dy(channels), mean_dy_xhat(channels);
  for (std::int64_t c = 0; c < C; ++c) {
    mean[c] = save_mean[c];
    rstd[c] = save_rstd[c];
  }
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t i = n * C + c;
      sum_dy[c] += dy[i];
      sum_dy_xhat[c] += dy[i] * (x[i] - mean[c]) * rstd[c];
    }
  for (std::int64_t c = 0; c < C; ++c) {
    scale[c] = weight[c] * rstd[c];
    mean_dy[c] = sum_dy[c] / count;
    mean_dy_xhat[c] = sum_dy_xhat[c] / count;
  }
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t i = n * C + c;
      const double xhat = (x[i] - mean[c]) * rstd[c];
      dx[i] = static_cast<float>(scale[c] * (dy[i] - mean_dy[c] - xhat * mean_dy_xhat[c]));
    }
  for (std::int64_t c = 0; c < C; ++c) {
    dweight[c] = static_cast<float>(dweight[c] + sum_dy_xhat[c]);
    dbias[c] = static_cast<float>(dbias[c] + sum_dy[c]);
  }
}

}  // namespace

void batchnorm_forward_training(const BatchNormShape& s, const float* x, const float* weight,
                                const float* bias, float* y, float* save_mean, float* save_rstd,
                                double momentum, float* running_mean, float* running_var) {
  validate_batchnorm(s, true);
  if (s.spatial == 1)
    return forward_training_rows(s, x, weight, bias, y, save_mean, save_rstd, momentum,
                                 running_mean, running_var);
  const double count = static_cast<double>(s.batch * s.spatial);
  for (std::int64_t c = 0; c < s.channels; ++c) {
    double sum = 0.0;
    for_channel(s, c, [&](std::int64_t i) { sum += x[i]; });
    const double mean = sum / count;
    double squares = 0.0;
    for_channel(s, c, [&](std::int64_t i) { squares += (x[i] - mean) * (x[i] - mean); });
    const double var = squares / count;
    const double rstd = 1.0 / std::sqrt(var + s.eps);
    save_mean[c] = static_cast<float>(mean);
    save_rstd[c] = static_cast<float>(rstd);
    const double scale = rstd * weight[c];
    for_channel(
        s, c, [&](std::int64_t i) { y[i] = static_cast<float>((x[i] - mean) * scale + bias[c]); });
    if (running_mean) {
      running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
      const double unbiased = squares / (count - 1.0);
      running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
    }
  }
}

void batchnorm_forward_inference(const BatchNormShape& s, const float* x, const float* weight,
                                 const float* bias, const float* running_mean,
                                 const float* running_var, float* y) {
  validate_batchnorm(s, false);
  if (s.spatial == 1)
    return forward_inference_rows(s, x, weight, bias, running_mean, running_var, y);
  for (std::int64_t c = 0; c < s.channels; ++c) {
    const double scale = weight[c] / std::sqrt(static_cast<double>(running_var[c]) + s.eps);
    const double mean = running_mean[c];
    for_channel(
        s, c, [&](std::int64_t i) { y[i] = static_cast<float>((x[i] - mean) * scale + bias[c]); });
  }
}

void batchnorm_backward(const BatchNormShape& s, const float* x, const float* dy,
                        const float* weight, const float* save_mean, const float* save_rstd,
                        float* dx, float* dweight, float* dbias) {
  validate_batchnorm(s, true);
  if (s.spatial == 1)
    return backward_rows(s, x, dy, weight, save_mean, save_rstd, dx, dweight, dbias);
  const double count = static_cast<double>(s.batch * s.spatial);
  for (std::int64_t c = 0; c < s.channels; ++c) {
    const double mean = save_mean[c], rstd = save_rstd[c];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for_channel(s, c, [&](std::int64_t i) {
      sum_dy += dy[i];
      sum_dy_xhat += dy[i] * (x[i] - mean) * rstd;
    });
    // dx = w rstd (dy - mean(dy) - xhat mean(dy xhat)), the batch statistics'
    // own dependence on x included.
    const double scale = weight[c] * rstd;
    const double mean_dy = sum_dy / count, mean_dy_xhat = sum_dy_xhat / count;
    for_channel(s, c, [&](std::int64_t i) {
      const double xhat = (x[i] - mean) * rstd;
      dx[i] = static_cast<float>(scale * (dy[i] - mean_dy - xhat * mean_dy_xhat));
    });
    dweight[c] = static_cast<float>(dweight[c] + sum_dy_xhat);
    dbias[c] = static_cast<float>(dbias[c] + sum_dy);
  }
}

void count_batch(std::int64_t* num_batches_tracked) { ++*num_batches_tracked; }

namespace {

void require_fusable(DType type, BatchNormEpilogue epi, const void* identity, const char* op) {
  if (type != DType::f32 && type != DType::f16 && type != DType::bf16)
    throw InvalidArgument(std::string(op) + ": dtype " + dtype_name(type) +
                          " is not supported (use f32, f16 or bf16)");
  if ((epi == BatchNormEpilogue::add_relu) != (identity != nullptr))
    throw InvalidArgument(std::string(op) +
                          ": the identity is given exactly when the epilogue is add_relu");
}

// `n` values of `type` as f32.
std::vector<float> to_f32(const void* src, DType type, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  cast(src, type, out.data(), DType::f32, n);
  return out;
}

// Today's engine order after the normalisation: + identity, then ReLU, in f32;
// then the one rounding to `type`.
void finish_forward(std::vector<float>& y32, DType type, BatchNormEpilogue epi,
                    const void* identity, void* y) {
  const auto n = static_cast<std::int64_t>(y32.size());
  if (epi == BatchNormEpilogue::add_relu) {
    const std::vector<float> id32 = to_f32(identity, type, n);
    add(y32.data(), id32.data(), y32.data(), DType::f32, n);
  }
  if (epi != BatchNormEpilogue::none)
    activation_forward(Activation::relu, y32.data(), y32.data(), DType::f32, n);
  cast(y32.data(), DType::f32, y, type, n);
}

}  // namespace

void batchnorm_fused_forward_training(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                      const void* x, const void* identity, const float* weight,
                                      const float* bias, void* y, float* save_mean,
                                      float* save_rstd, double momentum, float* running_mean,
                                      float* running_var) {
  require_fusable(type, epi, identity, "batchnorm_fused_forward_training");
  validate_batchnorm(s, true);
  const std::int64_t n = s.batch * s.channels * s.spatial;
  const std::vector<float> x32 = to_f32(x, type, n);
  std::vector<float> y32(static_cast<std::size_t>(n));
  batchnorm_forward_training(s, x32.data(), weight, bias, y32.data(), save_mean, save_rstd,
                             momentum, running_mean, running_var);
  finish_forward(y32, type, epi, identity, y);
}

void batchnorm_fused_forward_inference(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                                       const void* x, const void* identity, const float* weight,
                                       const float* bias, const float* running_mean,
                                       const float* running_var, void* y) {
  require_fusable(type, epi, identity, "batchnorm_fused_forward_inference");
  validate_batchnorm(s, false);
  const std::int64_t n = s.batch * s.channels * s.spatial;
  const std::vector<float> x32 = to_f32(x, type, n);
  std::vector<float> y32(static_cast<std::size_t>(n));
  batchnorm_forward_inference(s, x32.data(), weight, bias, running_mean, running_var, y32.data());
  finish_forward(y32, type, epi, identity, y);
}

void batchnorm_fused_backward(const BatchNormShape& s, DType type, BatchNormEpilogue epi,
                              const void* x, const void* y, const void* dy, const float* weight,
                              const float* save_mean, const float* save_rstd, void* dx,
                              void* d_identity, float* dweight, float* dbias) {
  require_fusable(type, BatchNormEpilogue::none, nullptr, "batchnorm_fused_backward");
  if (epi != BatchNormEpilogue::none && !y)
    throw InvalidArgument("batchnorm_fused_backward: a ReLU epilogue needs forward's output y");
  validate_batchnorm(s, true);
  const std::int64_t n = s.batch * s.channels * s.spatial;
  std::vector<float> g32 = to_f32(dy, type, n);
  if (epi != BatchNormEpilogue::none) {
    const std::vector<float> y32 = to_f32(y, type, n);
    activation_backward(Activation::relu, g32.data(), y32.data(), g32.data(), DType::f32, n);
  }
  if (d_identity) cast(g32.data(), DType::f32, d_identity, type, n);
  const std::vector<float> x32 = to_f32(x, type, n);
  std::vector<float> dx32(static_cast<std::size_t>(n));
  std::vector<float> unused(static_cast<std::size_t>(2 * s.channels), 0.0f);
  batchnorm_backward(s, x32.data(), g32.data(), weight, save_mean, save_rstd, dx32.data(),
                     dweight ? dweight : unused.data(), dbias ? dbias : unused.data() + s.channels);
  cast(dx32.data(), DType::f32, dx, type, n);
}

}  // namespace cpu
}  // namespace lockstep::kernels
