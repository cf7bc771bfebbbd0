// Goodput of a training job: the share of its wall time spent on training
// steps that count, and where the rest went (issue 6, `multislice job`).
//
// Inputs are the trainer's metrics.jsonl records (each step's "step",
// "step_time_s", wall-clock "time" at its end and restart "attempt") and the
// queued resource's state as the job runner observed it over time. A step
// trained more than once (by an attempt that failed after it and a later one
// that resumed from an older checkpoint) counts once, in its record of the
// highest "resume" (metrics.h: the trainer's start in the run directory),
// the latest of those; the earlier runs of it are "recomputed".
//
// For each failure (a change of attempt, or of resume within an attempt: a
// trainer started again by hand or by a retrying script), with t_last the
// end of the failed
// attempt's last step, t_down the first observation of the queued resource
// out of ACTIVE, t_up the first observation of ACTIVE again and t_first the
// end of the new attempt's first step minus that step's time:
//   detection = t_down - t_last, repair = t_up - t_down,
//   restart = t_first - t_up.
// Detection is measured from the last completed step, so it includes the
// part of the interrupted step that was lost. Everything else (start-up,
// checkpoints, evaluation, the runner's polling) is "other".
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace multislice::train {

struct StateObservation {
  double time = 0;    // Unix seconds
  std::string state;  // e.g. "ACTIVE", "PROVISIONING"
  int attempt = 0;    // 0: not known
};

struct Goodput {
  double wall_seconds = 0;
  double training_seconds = 0;  // steps that count, once each
  int64_t steps = 0;            // distinct steps trained
  int64_t recomputed_steps = 0;
  double recomputed_seconds = 0;
  int failures = 0;
  double detection_seconds = 0;
  double repair_seconds = 0;
  double restart_seconds = 0;
  double other_seconds = 0;
  double goodput = 0;  // training_seconds / wall_seconds

  nlohmann::json ToJson() const;
};

// `records`: metrics.jsonl as MetricsWriter::ReadAll returns it (records
// without "step" are ignored). `states`: observations in time order.
// kInvalidArgument when end <= start.
Result<Goodput> ComputeGoodput(double start, double end,
                               const std::vector<nlohmann::json>& records,
                               const std::vector<StateObservation>& states);

}  // namespace multislice::train
