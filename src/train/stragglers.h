// Straggler detection, after NVIDIA's resiliency extension: every
// straggler_report_interval steps each device's mean compute time a step
// (its step's wall time less its waits in collectives) is gathered, and
// each worker gets two scores in (0, 1]:
//   relative   = the fastest worker's time / this worker's time, a
//                worker's time being the mean of its devices that do the
//                same work (one pipeline stage; the lowest score over the
//                stages it holds);
//   individual = the worker's best time so far / its time now (its slowest
//                stage's).
// Each device's time over the interval is the median of its steps', so a
// step the scheduler delayed once does not make a straggler.
// A worker below either threshold is a straggler.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace multislice::train {

// Which worker holds each device and which devices do the same work.
struct DeviceLayout {
  std::vector<int> process_of_device;
  std::vector<int> group_of_device;              // e.g. the pipeline stage
  std::vector<std::string> worker_names, hosts;  // by process
};

struct StragglerScore {
  int process = 0;
  std::string worker, host;
  double seconds = 0;  // its compute a step (its slowest stage's)
  double relative = 1, individual = 1;
  bool straggler = false;

  nlohmann::json ToJson() const;
};

class StragglerDetector {
 public:
  StragglerDetector(DeviceLayout layout, double relative_threshold,
                    double individual_threshold);

  // seconds: each device's median compute time a step over the interval; a
  // device with none (<= 0, e.g. its slice is lost) is left out. Returns
  // the score of every worker with a device in it, by process.
  std::vector<StragglerScore> Score(const std::vector<float>& seconds);

 private:
  const DeviceLayout layout_;
  const double relative_threshold_, individual_threshold_;
  std::vector<double> best_;  // by process; 0 before its first round
};

}  // namespace multislice::train
