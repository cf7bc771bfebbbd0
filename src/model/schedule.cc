// ClipScale and LearningRate of schedule.h.
#include "model/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace multislice::model {

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
