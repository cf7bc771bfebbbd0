// How long a collective may take before the hang digest (runtime/
// hang_watch.h) is written: hang_timeout_seconds when set, else 5 times the
// median of the recent step times, at least 30 s; always below the DCN
// timeout (at most 80 % of it), so that the digest comes before a
// collective's own timeout ends the job without one.
#pragma once

#include <chrono>
#include <deque>

namespace multislice::train {

class HangThreshold {
 public:
  // fixed_seconds: 0 for the automatic threshold.
  HangThreshold(double fixed_seconds, std::chrono::milliseconds dcn_timeout);

  // Records a step's wall time and returns the threshold from now on.
  std::chrono::milliseconds After(double step_seconds);

  static constexpr int kStepsKept = 64;
  static constexpr double kStepMultiple = 5;
  static constexpr double kMinimumSeconds = 30;

 private:
  const double fixed_seconds_;
  const std::chrono::milliseconds dcn_timeout_;
  std::deque<double> recent_;
};

}  // namespace multislice::train
