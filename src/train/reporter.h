// What process 0 of a training job tells the user and writes to the run
// directory: each step's line (or a progress bar on a terminal), the
// metrics.jsonl records (with this start's resume index and goodput's
// fields, metrics.h), the loss plot (loss.svg, the earlier starts' points
// included), the Prometheus file (prometheus_metrics_file,
// prometheus_file.h) and the run's TrainSummary. Used by device 0's thread
// only.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "train/metrics.h"
#include "train/stragglers.h"
#include "train/trainer.h"

namespace multislice::train {

// One step's figures, as the loop measured them.
struct StepRecord {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, seconds = 0;
  std::optional<double> val_loss;
  // Bytes the reporting process sent over DCN during the step (the
  // runtime's counters of its devices; 0 on one slice).
  uint64_t dcn_bytes = 0;
  // With pipeline stages: the forward/backward schedule's wall seconds (on
  // the reporting device) and the fraction of it the busiest stage did not
  // compute.
  std::optional<double> pipeline_seconds, pipeline_bubble;
  // The share of the global batch trained: below 1 once DiLoCo replicas
  // were lost (diloco_continue_on_failure); tokens/s count only it.
  double trained_share = 1.0;
  // Every straggler_report_interval steps: the workers found slow
  // (stragglers.h), on the record of the step they were scored after.
  std::vector<StragglerScore> stragglers;
  // Goodput (metrics.h): the part of `seconds` spent waiting for the batch,
  // and how long the saves after the previous step blocked training.
  double data_wait_seconds = 0;
  double checkpoint_seconds = 0;
};

// How this start of the trainer reached its first step (metrics.h's start
// fields): when its runtime start-up began (Unix seconds), how long that
// took and how long restoring took (seconds).
struct StartTimes {
  double start_time = 0;
  double runtime_init_seconds = 0;
  double restore_seconds = 0;
};

class Reporter {
 public:
  // flops_per_step: one device's, for TFLOP/s and MFU; attempt: the
  // worker's restart attempt, recorded in every record.
  Reporter(const TrainerOptions& options, double flops_per_step,
           double tokens_per_step, int attempt);

  // Opens metrics.jsonl; its earlier records give this start's resume
  // index (metrics.h) and the plot's history.
  Status Open(const std::string& run_dir);

  // Earlier starts' points up to the step resumed from, each step's record
  // that counts (metrics.h), so the plot shows the whole run, also when
  // there is nothing left to train.
  // The goodput so far starts from the productive time of those steps.
  void LoadHistory(int64_t up_to_step);

  // This start's way to its first step, recorded with that step.
  void NoteStart(const StartTimes& times) { start_times_ = times; }

  // Records a step (metrics.jsonl, the plot's points, the summary) and
  // prints its line; first_step is this start's first. A metrics record
  // that could not be written is the error returned (the rest is done all
  // the same).
  Status Step(const StepRecord& r, int64_t first_step, TrainSummary* summary);

  // Makes the records written so far durable (at checkpoints and at the
  // end), so that a failed write-back is reported too.
  Status SyncMetrics();

  // Redraws loss.svg; a failure is a warning (the points are kept).
  void Plot();

 private:
  using Clock = std::chrono::steady_clock;
  void Print(const StepRecord& r, int64_t first_step, double tflops, double mfu,
             double goodput);
  nlohmann::json Record(const StepRecord& r, int64_t first_step, double now,
                        double tflops, double mfu, double goodput) const;
  double RollingGoodput(const StepRecord& r, int64_t first_step, double now);
  void WritePrometheus(const StepRecord& r, double mfu, double goodput);
  void PrintStragglers(const StepRecord& r) const;

  const TrainerOptions& options_;
  const double flops_per_step_, tokens_per_step_;
  const int attempt_;
  int64_t resume_ = 0;
  std::vector<nlohmann::json> history_;  // metrics.jsonl at Open
  std::optional<MetricsWriter> metrics_;
  std::string run_dir_;
  std::vector<std::pair<double, double>> train_points_, val_points_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point first_step_start_ = Clock::now();
  Clock::time_point last_bar_{};
  double later_seconds_ = 0, later_mfu_ = 0, later_tokens_ = 0;
  int64_t later_steps_ = 0;
  StartTimes start_times_;
  // The goodput so far: the run's first start (Unix seconds), the
  // productive seconds of the earlier starts' steps kept and of this
  // start's, and this start's first step's compute (counted once the second
  // says what a normal step takes, as goodput.h's PROGRAM_STARTUP).
  double run_start_ = 0;
  double earlier_productive_ = 0, productive_ = 0, first_compute_ = 0;
  uint64_t dcn_bytes_total_ = 0;
  bool prometheus_failing_ = false;  // warned once until it works again
};

}  // namespace multislice::train
