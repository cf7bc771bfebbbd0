#include "model/adamw.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace multislice::model {

void AdamWUpdate(float* params, const float* grads, float* m, float* v,
                 int64_t n, const AdamWOptions& options, int64_t step,
                 const uint8_t* decay_mask) {
  const double t = static_cast<double>(std::max<int64_t>(step, 1));
  const float correction1 =
      static_cast<float>(1.0 - std::pow(double{options.beta1}, t));
  const float correction2 =
      static_cast<float>(1.0 - std::pow(double{options.beta2}, t));
  for (int64_t i = 0; i < n; ++i) {
    const float g = grads[i];
    m[i] = options.beta1 * m[i] + (1.0f - options.beta1) * g;
    v[i] = options.beta2 * v[i] + (1.0f - options.beta2) * g * g;
    const float m_hat = m[i] / correction1;
    const float v_hat = v[i] / correction2;
    const bool decay = decay_mask == nullptr || decay_mask[i] != 0;
    const float wd = decay ? options.weight_decay : 0.0f;
    params[i] -= options.lr *
                 (m_hat / (std::sqrt(v_hat) + options.eps) + wd * params[i]);
  }
}

double GlobalNorm(const float* g, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double{g[i]} * g[i];
  return std::sqrt(sum);
}

float ClipScale(double norm, float threshold) {
  if (threshold <= 0.0f || !(norm > threshold)) return 1.0f;
  return static_cast<float>(threshold / norm);
}

double LearningRate(int64_t step, int64_t total_steps, int64_t warmup_steps,
                    double peak_lr, double final_fraction) {
  step = std::max<int64_t>(step, 0);
  if (warmup_steps > 0 && step < warmup_steps) {
    return peak_lr * static_cast<double>(step) /
           static_cast<double>(warmup_steps);
  }
  const int64_t warmup = std::max<int64_t>(warmup_steps, 0);
  const int64_t decay_steps = total_steps - warmup;
  if (decay_steps <= 0) return peak_lr;
  const double progress = std::clamp(
      static_cast<double>(step - warmup) / static_cast<double>(decay_steps),
      0.0, 1.0);
  const double final_lr = peak_lr * final_fraction;
  return final_lr + (peak_lr - final_lr) * 0.5 *
                        (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace multislice::model
