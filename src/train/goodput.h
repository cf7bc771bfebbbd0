// Goodput of a training run or job: the share of its wall time spent on
// productive training, and where the rest went, in the badput buckets of
// Google's ml-goodput-measurement (issue 18; issue 6's `multislice job`).
//
// Inputs are the trainer's metrics.jsonl step records (metrics.h lists
// their fields) and, for a job, the queued resource's states as the job
// runner observed them. Every record lays intervals of wall time out:
//   - its step, [time - step_time_s, time]: first data_wait_s
//     (DATA_LOADING_SYNC), then, for the first step of a start, what it
//     took beyond the median step of that start (PROGRAM_STARTUP), the rest
//     productive; or WASTED_PROGRESS_FROM_DISRUPTION when the step was
//     trained again later. A step counts once, in its record of the highest
//     "resume" (metrics.h: the trainer's start in the run directory), the
//     latest of those, as CurrentStepRecords;
//   - checkpoint_block_s just before its step: the part of the saves after
//     the previous step that blocked training
//     (UNPRODUCTIVE_CHECKPOINT_SAVE_TIME);
//   - in the first record of each start, from its start_time: runtime_init_s
//     (TPU_INITIALIZATION), restore_s (UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME)
//     and training_prep_s (TRAINING_PREP), up to its first step.
// Each start after the first (a new attempt of a job, or a new resume
// within one: a trainer started again by hand or by a script) follows a
// disruption: from the end of the failed start's last step to the new
// start's start_time (its first step's start in files without it) is
// INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, split by the states into
// detection (until the queued resource is first seen out of ACTIVE), repair
// (until ACTIVE again) and restart (until the new start). Without states (a
// plain `train` run) the split is unknown and the gap is "unsplit".
// Where intervals overlap, the one that begins first keeps the overlap, so
// no second is counted twice; OTHER is the rest of the wall time
// (evaluation, the last save, the runner's polling, provisioning), and the
// buckets with the productive time sum to the wall time. A window clips
// every interval to itself.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace multislice::train {

struct StateObservation {
  double time = 0;    // Unix seconds
  std::string state;  // e.g. "ACTIVE", "PROVISIONING"
  int attempt = 0;    // 0: not known
};

// ml-goodput-measurement's BadputType, those a CPU trainer has.
enum class Badput {
  kTpuInitialization,
  kTrainingPrep,
  kProgramStartup,
  kDataLoadingSync,
  kCheckpointSave,
  kCheckpointRestore,
  kWastedProgress,
  kInfrastructureRecovery,
  kOther,
};
inline constexpr int kBadputCount = 9;

// "TPU_INITIALIZATION", ..., ml-goodput-measurement's spelling.
const char* BadputName(Badput b);

// INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION's parts; they sum to it.
struct RecoverySplit {
  double detection_seconds = 0;
  double repair_seconds = 0;
  double restart_seconds = 0;
  double unsplit_seconds = 0;  // no state observed the transition
};

struct Goodput {
  double start = 0, end = 0;  // the interval measured, Unix seconds
  double wall_seconds = 0;
  double productive_seconds = 0;
  std::array<double, kBadputCount> badput{};  // seconds, by Badput
  RecoverySplit recovery;
  int64_t steps = 0;             // distinct steps that count, in the window
  int64_t recomputed_steps = 0;  // records of steps trained again later
  int failures = 0;              // disruptions whose last step is in it
  double goodput = 0;            // productive_seconds / wall_seconds

  // Issue 6's summary, kept for its readers (bench/job_goodput.sh, the
  // Slurm test, docs/performance.md): whole step times, and each
  // disruption from the failed start's last step to the new start's first
  // step (so restart includes the new start's initialisation, restore and
  // preparation); other is the rest.
  double training_seconds = 0, recomputed_seconds = 0;
  double detection_seconds = 0, repair_seconds = 0, restart_seconds = 0;
  double other_seconds = 0;

  double seconds(Badput b) const { return badput[static_cast<int>(b)]; }
  // The fields above; the buckets under "badput" by name, recovery's with
  // its parts; goodput as "goodput_percent".
  nlohmann::json ToJson() const;
};

// `records`: metrics.jsonl as MetricsWriter::ReadAll returns it (records
// without "step" are ignored); records ending outside [start, end] are
// another job's. `states`: observations in time order. The buckets cover
// [max(start, window_start), end]. kInvalidArgument when end <= start or
// the window is empty.
Result<Goodput> ComputeGoodput(double start, double end,
                               const std::vector<nlohmann::json>& records,
                               const std::vector<StateObservation>& states,
                               double window_start = 0);

// From the first start's start_time (its first step's start in files
// without it) to the end of the last step: the run's span in Unix seconds;
// nullopt without step records.
std::optional<std::pair<double, double>> RecordSpan(
    const std::vector<nlohmann::json>& records);

// The productive seconds of the records that count for steps 1..up_to_step:
// what a resumed start inherits from the earlier ones (the Reporter's
// rolling goodput).
double ProductiveSecondsUpTo(const std::vector<nlohmann::json>& records,
                             int64_t up_to_step);

}  // namespace multislice::train
