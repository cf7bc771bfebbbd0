// MaxText's profiler keys for `train`: with profiler "xplane", each worker
// records profiler_steps steps of this start, after its first
// skip_first_n_steps_for_profiler, into a runtime::Trace and writes it as
// one Chrome/Perfetto trace, <run directory>/profile/slice<S>-worker<W>.
// trace.json: per device, a "step N" span on the compute track with the
// model's layer ops inside it (runtime::OpSpans), the collectives' phases on
// the ICI and DCN tracks, and on the checkpoint track the copy-out of a
// save and its writing (the host's, on its first device's row). Times are
// wall-clock microseconds, one clock for every worker of the job (on one
// machine; across machines, as well as their clocks agree).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"
#include "train/config.h"

namespace multislice::train {

class StepProfiler {
 public:
  StepProfiler(const TrainConfig& config, runtime::Runtime& rt);

  // The first step of this start (the window follows it).
  void SetFirstStep(int64_t first_step);
  bool Traces(int64_t step) const;
  int64_t last_step() const { return last_; }

  // On a device thread before `step`: its compute and the collectives it
  // launches go to the trace while the step is in the window. The last
  // local device to begin the step after the window writes the trace.
  void BeginStep(int local, int64_t step);
  // A save's writing (CheckpointOptions::on_written).
  void CheckpointWritten(int64_t step, int64_t start_us, int64_t end_us);
  // Writes the trace unless written (at the end of training).
  Status Finish();
  const std::string& path() const { return path_; }

 private:
  runtime::Runtime& rt_;
  const int skip_, steps_;
  const std::string path_;
  int64_t first_ = 0, last_ = 0;
  runtime::Trace trace_;
  std::atomic<bool> written_{false};
  std::atomic<int> past_window_{0};  // local devices that began last_ + 1
};

}  // namespace multislice::train
