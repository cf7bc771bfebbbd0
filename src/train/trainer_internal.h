// The trainer's class, shared by its files: trainer.cc (the loop and a
// step), trainer_start.cc (a device's start: checkpoint, in-memory
// replicas, the run directory, the saver) and trainer_membership.cc
// (DiLoCo's replicas when slices are lost and come back). Not an interface:
// RunTrainer (trainer.h) is.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "model/decoder.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/diloco.h"
#include "train/hang_threshold.h"
#include "train/metrics.h"
#include "train/model_step.h"
#include "train/optimizer.h"
#include "train/parallel_plan.h"
#include "train/profiler.h"
#include "train/reporter.h"
#include "train/state_saver.h"
#include "train/train_state.h"
#include "train/trainer.h"

namespace multislice::train::internal {

using Clock = std::chrono::steady_clock;

// A test seam's value from the environment (trainer.cc lists them), or 0.
int64_t EnvInt(const char* name);

// One process's training: the set-up every device thread shares, then the
// loop on each device.
class Trainer {
 public:
  Trainer(runtime::Runtime& rt, const TrainerOptions& options,
          TrainSummary* summary);

  Status Run();

 private:
  // A device's part of the run.
  struct Device {
    int local;
    bool reporter_thread;  // process 0's device 0
    ParallelPlan plan;
    DeviceBuffers state;
    DataIterator train_data, val_data;
    std::unique_ptr<ModelStep> step;
    ShardOptimizer optimizer;
    int64_t start_step;
    std::unique_ptr<OuterOptimizer> outer;  // DiLoCo's, or null
    // Lost slices that rejoin after step `at` (-1: none), as decided in
    // membership generation `generation`.
    struct Admission {
      int64_t at = -1;
      int generation = 0;
      std::vector<int> slices;
    } admission;
    // The state to save; with_outer: the outer state too (a checkpoint
    // takes it from replica 0 only, an in-memory replica from every one).
    StateShard shard(bool with_outer) const;
  };
  struct StepResult {
    bool stop = false;  // a process of the job has failed
    StepRecord record;
  };

  Status RestoreCheckpoint();
  void OpenReplicas();
  Status StartRunDirectory();
  StateSaverOptions SaverOptions();
  Status TrainOnDevice(int local);
  Result<std::unique_ptr<Device>> StartDevice(int local);
  int RowsPerDevice(const ParallelPlan& plan) const;
  void InitShard(const ParallelPlan& plan, DeviceBuffers& state) const;
  void TakeShard(const ParallelPlan& plan, const std::vector<float>& whole,
                 float* out) const;
  Status RestoreReplica(Device& d);
  Status JoinRunningJob(Device& d);
  Status AdmitSlices(Device& d, int64_t step);
  Status ShareRejoinState(Device& d, bool joining);
  void ScheduleAdmission(Device& d, int64_t step, const float* requests);
  Status StartOuterOptimizer(Device& d);
  Status CheckDilocoState(const FullState& state) const;
  std::vector<int> DilocoSchedule() const;
  void PrintDilocoLine() const;
  uint64_t ProcessDcnBytes() const;
  Result<bool> StopsAt(Device& d, int64_t step, float replica_fault);
  Result<StepResult> TrainStep(Device& d, int64_t step);
  Status RecordBubble(Device& d, StepRecord& record);
  PipelineStepOptions StepOptions(const ParallelPlan& plan) const;
  Result<double> Evaluate(Device& d);
  Status AcrossReplicas(const std::function<Status()>& op,
                        const std::function<Status()>& resend = {});
  bool SkipsSaveWhileLost(int local, int64_t step) const;
  int LowestLiveReplica() const;
  std::vector<StateShard> StandIns(const Device& d) const;
  void Report(Device& d, StepRecord& r);
  void ArmHangWatch(double step_seconds);
  Status ScoreStragglers(Device& d, StepRecord& record);
  DeviceLayout StragglerLayout();
  void FreeReplicas();

  runtime::Runtime& rt_;
  const TrainerOptions& options_;
  const TrainConfig& config_;
  TrainSummary* const summary_;
  const Clock::time_point start_ = Clock::now();
  const model::DecoderConfig model_;
  int64_t num_parameters_ = 0;  // once the model is validated
  const int num_devices_, global_rows_;
  const bool printer_;  // process 0
  CheckpointOptions ckpt_options_;
  std::unique_ptr<CheckpointManager> checkpoints_, replicas_;
  std::optional<FullState> restored_;
  int64_t restored_step_ = 0;
  std::optional<RestoredState> replica_;  // this host's, when newer
  double restore_seconds_ = 0;  // reading them, for goodput (metrics.h)
  std::unique_ptr<Reporter> reporter_;
  std::unique_ptr<StateSaver> saver_;
  std::atomic<int64_t> current_step_{0};  // device 0's, for out-of-memory
  HangThreshold hang_threshold_;          // local device 0's
  std::unique_ptr<StragglerDetector> stragglers_;  // the reporter thread's
  std::unique_ptr<StepProfiler> profiler_;         // with the profiler key
  // By local device: the compute seconds (wall less waits in collectives)
  // of its steps since the last straggler scores.
  std::vector<std::vector<double>> compute_seconds_;
  // Test seams read once (trainer.cc): the step whose loss all-reduce this
  // process skips, and the sleep in each step's compute.
  const int64_t skip_collective_step_, slow_worker_ms_;
};

}  // namespace multislice::train::internal
