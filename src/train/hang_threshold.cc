#include "train/hang_threshold.h"

#include <algorithm>
#include <vector>

namespace multislice::train {

HangThreshold::HangThreshold(double fixed_seconds,
                             std::chrono::milliseconds dcn_timeout)
    : fixed_seconds_(fixed_seconds), dcn_timeout_(dcn_timeout) {}

std::chrono::milliseconds HangThreshold::After(double step_seconds) {
  recent_.push_back(step_seconds);
  if (recent_.size() > kStepsKept) recent_.pop_front();
  double seconds = fixed_seconds_;
  if (seconds <= 0) {
    std::vector<double> sorted(recent_.begin(), recent_.end());
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2,
                     sorted.end());
    seconds =
        std::max(kMinimumSeconds, kStepMultiple * sorted[sorted.size() / 2]);
  }
  const auto wanted =
      std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  return std::min(wanted, dcn_timeout_ * 4 / 5);
}

}  // namespace multislice::train
