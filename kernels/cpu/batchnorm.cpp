// CPU BatchNorm (kernels/batchnorm.h): per channel, two passes in f64 (mean,
// then squared deviations), so the statistics are as exact as f32 inputs
// allow. Also the argument checks both backends share.
#include <cmath>
#include <string>

#include "kernels/batchnorm.h"
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

}  // namespace

void batchnorm_forward_training(const BatchNormShape& s, const float* x, const float* weight,
                                const float* bias, float* y, float* save_mean, float* save_rstd,
                                double momentum, float* running_mean, float* running_var) {
  validate_batchnorm(s, true);
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

}  // namespace cpu
}  // namespace lockstep::kernels
