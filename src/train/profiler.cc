#include "train/profiler.h"

#include <cstdio>
#include <filesystem>

namespace multislice::train {

StepProfiler::StepProfiler(const TrainConfig& config, runtime::Runtime& rt)
    : rt_(rt),
      skip_(config.skip_first_n_steps_for_profiler),
      steps_(config.profiler_steps),
      path_(RunDirectory(config) + "/profile/slice" +
            std::to_string(rt.env().slice_id) + "-worker" +
            std::to_string(rt.env().worker_id) + ".trace.json") {
  for (int id : rt.local_devices()) {
    trace_.NameDevice(
        id, "device " + std::to_string(id) + " (" + rt.env().name() + ")");
  }
}

void StepProfiler::SetFirstStep(int64_t first_step) {
  first_ = first_step + skip_;
  last_ = first_ + steps_ - 1;
}

bool StepProfiler::Traces(int64_t step) const {
  return step >= first_ && step <= last_;
}

void StepProfiler::BeginStep(int local, int64_t step) {
  const int device = rt_.local_devices()[local];
  runtime::SetThreadTrace(Traces(step) ? &trace_ : nullptr, device);
  if (step == last_ + 1 &&
      ++past_window_ == static_cast<int>(rt_.local_devices().size())) {
    // Every local device has ended its last traced step (its span closes
    // with the iteration); a collective's phase still running on a stream
    // may be left out.
    if (Status s = Finish(); !s.ok()) {
      std::fprintf(stderr, "multislice train: warning: %s\n",
                   s.message().c_str());
    }
  }
}

void StepProfiler::CheckpointWritten(int64_t step, int64_t start_us,
                                     int64_t end_us) {
  if (!Traces(step) || written_) return;
  trace_.Add(rt_.local_devices()[0], runtime::Track::kCheckpointWrite,
             "checkpoint write step " + std::to_string(step), start_us, end_us);
}

Status StepProfiler::Finish() {
  if (written_.exchange(true) || trace_.size() == 0) return OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(
      std::filesystem::path(path_).parent_path(), ec);
  return trace_.WriteJson(path_).WithContext("the profiler's trace");
}

}  // namespace multislice::train
