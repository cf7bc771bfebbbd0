// RunTrainer: the training loop of each device thread and one step of it
// (the start is in trainer_start.cc, lost and returning slices in
// trainer_membership.cc).
#include "train/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>

#include "compute/matmul.h"
#include "model/schedule.h"
#include "runtime/comm/types.h"
#include "train/run_directory.h"
#include "train/trainer_internal.h"

namespace multislice::train {

std::string CheckpointDirectory(const TrainConfig& config) {
  return RunDirectory(config) + "/checkpoints";
}

namespace internal {

// Test seams, read from the environment (never set in production):
//   MULTISLICE_TEST_STEP_DELAY_MS=n       sleep n ms after every step, so a
//                                         test can kill a run mid-training;
//   MULTISLICE_TEST_PAUSE_CHECKPOINT=k    the k-th save of this process
//                                         (1-based) stops forever after
//                                         writing its files, before the
//                                         commit, so a test can kill it there.
//   MULTISLICE_TEST_KILL_AFTER_STEP=p:s   process p kills itself (SIGKILL)
//                                         after step s, so a test can lose
//                                         a slice at a known step;
//   MULTISLICE_TEST_STOP_AFTER_STEP=p:s   process p stops itself (SIGSTOP)
//                                         after step s: a hung worker;
//   MULTISLICE_TEST_SKIP_COLLECTIVE=p:s   process p skips step s's
//                                         loss-and-norm all-reduce: workers
//                                         whose programs differ;
//   MULTISLICE_TEST_SLOW_WORKER=p:ms      process p's devices sleep ms in
//                                         every step's compute: a
//                                         straggler.
// In each, p "*" names every process, and "p:n,q:m" several (summed).
int64_t EnvInt(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::strtoll(v, nullptr, 10) : 0;
}

namespace {

using runtime::DType;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The number a "p:n" test seam names for `process` (p "*": every one); a
// list "p:n,q:m" sums what names it; 0 when nothing does.
int64_t Seam(const char* seam, int process) {
  const char* v = std::getenv(seam);
  std::string spec = v ? v : "";
  int64_t total = 0;
  for (size_t start = 0; start < spec.size();) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(start, end - start);
    start = end + 1;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) continue;
    const std::string who = item.substr(0, colon);
    if (who != "*" && std::atoi(who.c_str()) != process) continue;
    total += std::atoll(item.substr(colon + 1).c_str());
  }
  return total;
}

// Runs a device thread's training, turning an allocation that fails into
// one sentence about memory instead of std::terminate.
Status CatchOutOfMemory(const std::function<Status()>& train,
                        const std::atomic<int64_t>& current_step,
                        const TrainerOptions& options) {
  try {
    return train();
  } catch (const std::bad_alloc&) {
    const int64_t step = current_step.load();
    return Internal(
        "out of memory " +
        (step > 0 ? "at step " + std::to_string(step) : "before training") +
        " (an allocation failed)" +
        (options.memory_note.empty() ? "" : "; " + options.memory_note) +
        "; lower per_device_batch_size or max_target_length, or free memory "
        "on the host");
  }
}

}  // namespace

Trainer::Trainer(runtime::Runtime& rt, const TrainerOptions& options,
                 TrainSummary* summary)
    : rt_(rt),
      options_(options),
      config_(options.config),
      summary_(summary),
      model_(DecoderConfigOf(options.config)),
      num_devices_(static_cast<int>(rt.devices().size())),
      global_rows_(options.config.per_device_batch_size * num_devices_),
      printer_(rt.process_index() == 0),
      hang_threshold_(options.config.hang_timeout_seconds, rt.timeout()),
      compute_seconds_(rt.local_devices().size()),
      skip_collective_step_(
          Seam("MULTISLICE_TEST_SKIP_COLLECTIVE", rt.process_index())),
      slow_worker_ms_(Seam("MULTISLICE_TEST_SLOW_WORKER", rt.process_index())) {
}

Status Trainer::Run() {
  RETURN_IF_ERROR(model::ValidateConfig(model_));
  if (rt_.too_late_to_join()) {
    std::fprintf(stderr,
                 "multislice train: %s was started again, but the other slices "
                 "finished training before it could rejoin\n",
                 rt_.env().name().c_str());
    return OkStatus();
  }
  num_parameters_ = model::NumParameters(model_);
  if (!config_.profiler.empty()) {
    profiler_ = std::make_unique<StepProfiler>(config_, rt_);
  }
  RETURN_IF_ERROR(RestoreCheckpoint());
  if (profiler_) {
    profiler_->SetFirstStep(rt_.joined_step().value_or(restored_step_) + 1);
  }
  OpenReplicas();
  reporter_ = std::make_unique<Reporter>(
      options_, StepFlopsPerDevice(config_),
      static_cast<double>(global_rows_) * config_.max_target_length,
      rt_.env().attempt);
  if (printer_) RETURN_IF_ERROR(StartRunDirectory());
  saver_ = std::make_unique<StateSaver>(SaverOptions());
  RETURN_IF_ERROR(rt_.RunOnDevices([&](int local) {
    return CatchOutOfMemory([&] { return TrainOnDevice(local); }, current_step_,
                            options_);
  }));
  return profiler_ ? profiler_->Finish() : OkStatus();
}

// The loop of one device thread.
Status Trainer::TrainOnDevice(int local) {
  compute::SetSingleThreaded();
  ASSIGN_OR_RETURN(std::unique_ptr<Device> d, StartDevice(local));
  const int64_t step_delay_ms = EnvInt("MULTISLICE_TEST_STEP_DELAY_MS");
  const int64_t kill_after =
      Seam("MULTISLICE_TEST_KILL_AFTER_STEP", rt_.process_index());
  const int64_t stop_after =
      Seam("MULTISLICE_TEST_STOP_AFTER_STEP", rt_.process_index());
  double save_seconds = 0;  // what the last step's saves blocked
  const int device = rt_.local_devices()[local];
  for (int64_t step = d->start_step + 1; step <= config_.steps; ++step) {
    if (local == 0) current_step_ = step;
    if (profiler_) profiler_->BeginStep(local, step);
    runtime::ScopedSpan step_span(runtime::ThreadTrace(), device,
                                  runtime::Track::kCompute,
                                  "step " + std::to_string(step));
    ASSIGN_OR_RETURN(StepResult r, TrainStep(*d, step));
    if (r.stop) return saver_->Stop(local, step);
    r.record.checkpoint_seconds = save_seconds;
    if (local == 0) ArmHangWatch(r.record.seconds);
    if (config_.straggler_report_interval > 0 &&
        step % config_.straggler_report_interval == 0) {
      RETURN_IF_ERROR(ScoreStragglers(*d, r.record));
    }
    if (config_.eval_interval > 0 &&
        (step % config_.eval_interval == 0 || step == config_.steps)) {
      ASSIGN_OR_RETURN(r.record.val_loss, Evaluate(*d));
    }
    if (d->reporter_thread) Report(*d, r.record);
    const bool replica_step =
        replicas_ && step % config_.in_memory_replica_period == 0;
    const bool checkpoint_step =
        config_.enable_checkpointing &&
        (step % config_.checkpoint_period == 0 || step == config_.steps) &&
        !SkipsSaveWhileLost(local, step);
    const Clock::time_point save_start = Clock::now();
    if (d->outer && (replica_step || checkpoint_step)) {
      RETURN_IF_ERROR(d->outer->Settle());
    }
    if (replica_step) {
      saver_->SaveReplica(local, step, d->shard(true), d->train_data.state());
    }
    if (checkpoint_step) {
      runtime::ScopedSpan copy_out(
          runtime::ThreadTrace(), device, runtime::Track::kCheckpoint,
          "checkpoint copy-out step " + std::to_string(step));
      const bool outer_writer = d->plan.diloco_rank() == LowestLiveReplica();
      saver_->SaveCheckpoint(
          local, step, d->plan.data_rank() == 0, d->shard(outer_writer),
          d->train_data.state(),
          outer_writer ? StandIns(*d) : std::vector<StateShard>{});
    }
    save_seconds = SecondsSince(save_start);
    if (step == d->admission.at) RETURN_IF_ERROR(AdmitSlices(*d, step));
    if (step_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms));
    }
    if (step == kill_after || step == stop_after) {
      std::fflush(stdout);
      std::fflush(stderr);
      ::raise(step == kill_after ? SIGKILL : SIGSTOP);
    }
  }
  RETURN_IF_ERROR(saver_->Finish(local, config_.steps));
  if (local == 0) FreeReplicas();
  if (d->reporter_thread) reporter_->Plot();
  return OkStatus();
}

// Gather, forward, backward with the gradient reduced, the loss and the
// norm (with the job's failure flag) over every device, the optimizer.
Result<Trainer::StepResult> Trainer::TrainStep(Device& d, int64_t step) {
  const Clock::time_point step_start = Clock::now();
  const uint64_t dcn_before = d.reporter_thread ? ProcessDcnBytes() : 0;
  const double waited_before = d.plan.collectives().progress().wait_seconds();
  const Batch batch = d.train_data.At(step - 1);
  const double data_wait = SecondsSince(step_start);  // goodput's
  if (slow_worker_ms_ > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(slow_worker_ms_));
  }
  RETURN_IF_ERROR(d.plan.GatherWeights(d.state));
  ASSIGN_OR_RETURN(float loss, d.step->Train(batch, d.plan, d.state));
  // In one all-reduce over the replica (the whole mesh without DiLoCo): the
  // replica's mean loss, the squared norm of its summed gradient (data
  // replicas hold equal shards: each adds 1/data) and the failure flag.
  float stats[3] = {
      loss * d.plan.ReplicaLossShare(),
      static_cast<float>(d.plan.ShardSquaredNorm(d.state.gradient)),
      saver_->FaultFlag(d.local)};
  if (step != skip_collective_step_) {
    RETURN_IF_ERROR(d.plan.ReduceOverReplica(stats, 3, "loss-and-norm"));
  }
  StepResult r;
  ASSIGN_OR_RETURN(r.stop, StopsAt(d, step, stats[2]));
  if (r.stop) return r;
  r.record.step = step;
  r.record.data_wait_seconds = data_wait;
  r.record.loss = stats[0];
  r.record.grad_norm = d.optimizer.MeanNorm(static_cast<double>(stats[1]));
  r.record.lr = d.optimizer.Apply(step, r.record.grad_norm, d.state);
  if (d.outer) {
    runtime::DeviceCollectives& coll = d.plan.collectives();
    RETURN_IF_ERROR(AcrossReplicas(
        [&] {
          return d.outer->AfterInnerStep(coll, step, d.state.shard.data());
        },
        [&] { return d.outer->Resend(coll); }));
  }
  r.record.seconds = SecondsSince(step_start);
  compute_seconds_[d.local].push_back(
      r.record.seconds -
      (d.plan.collectives().progress().wait_seconds() - waited_before));
  if (const size_t lost = rt_.lost_slices().size(); lost > 0) {
    r.record.trained_share =
        1.0 - static_cast<double>(lost) / rt_.env().num_slices;
  }
  if (d.reporter_thread) r.record.dcn_bytes = ProcessDcnBytes() - dcn_before;
  if (d.step->pipeline()) RETURN_IF_ERROR(RecordBubble(d, r.record));
  IteratorState next = d.train_data.state();
  next.step = step;
  RETURN_IF_ERROR(d.train_data.Restore(next));
  return r;
}

// From the first step on, a collective of this worker in flight for longer
// than the threshold writes the hang digest (runtime/hang_watch.h).
void Trainer::ArmHangWatch(double step_seconds) {
  rt_.ArmHangWatch(hang_threshold_.After(step_seconds),
                   RunDirectory(config_) + "/hang_digest.json");
}

// What this process's devices have sent over DCN so far.
uint64_t Trainer::ProcessDcnBytes() const {
  uint64_t bytes = 0;
  for (size_t local = 0; local < rt_.local_devices().size(); ++local) {
    bytes += rt_.collectives(static_cast<int>(local))
                 .counters()
                 .dcn_bytes_sent.load(std::memory_order_relaxed);
  }
  return bytes;
}

// The pipeline's bubble as the busiest stage sees it: the schedule's wall
// time on this device against the most any device computed in it (stages
// are not equal: the last one also runs the head), so that an uneven split
// is not counted as bubble.
Status Trainer::RecordBubble(Device& d, StepRecord& record) {
  const PipelineStep& pipeline = *d.step->pipeline();
  float busiest = static_cast<float>(pipeline.last_compute_seconds());
  RETURN_IF_ERROR(d.plan.ReduceOverReplica(&busiest, 1, "pipeline-compute",
                                           runtime::ReduceOp::kMax));
  const double wall = pipeline.last_wall_seconds();
  if (wall <= 0) return OkStatus();
  record.pipeline_seconds = wall;
  record.pipeline_bubble = std::max(0.0, 1.0 - busiest / wall);
  return OkStatus();
}

// The mean validation loss over eval_batches batches of every device.
Result<double> Trainer::Evaluate(Device& d) {
  RETURN_IF_ERROR(d.plan.GatherWeights(d.state));
  double loss = 0;
  RETURN_IF_ERROR(AcrossReplicas([&]() -> Status {
    ASSIGN_OR_RETURN(loss, MeanLoss(
                               *d.step, d.plan, d.state.weights,
                               [&](int k) { return d.val_data.At(k); },
                               config_.eval_batches));
    return OkStatus();
  }));
  // The mean over the devices left when slices were lost.
  const int slices = rt_.env().num_slices;
  return loss * slices / static_cast<double>(slices - rt_.lost_slices().size());
}

void Trainer::Report(Device& d, StepRecord& r) {
  if (r.step == d.start_step + 1) {
    summary_->seconds_to_first_step = SecondsSince(start_);
  }
  Status recorded = reporter_->Step(r, d.start_step + 1, summary_);
  if (!recorded.ok()) saver_->SetFault(recorded);
  if (r.val_loss) reporter_->Plot();
}

// The rows of the batch each device trains on: its tensor group's and
// pipeline's share (MaxText: the batch is split over data and fsdp, not
// over tensor or stage).
int Trainer::RowsPerDevice(const ParallelPlan& plan) const {
  return config_.per_device_batch_size * plan.tensor_size() * plan.stage_size();
}

PipelineStepOptions Trainer::StepOptions(const ParallelPlan& plan) const {
  PipelineStepOptions o;
  o.model = model_;
  o.matmul_type = MatmulDType(config_);
  o.schedule = *ParsePipelineSchedule(config_.pipeline_parallel_schedule);
  o.microbatches = PipelineMicrobatches(config_, plan.stage_size());
  o.rows = RowsPerDevice(plan);
  o.seq_len = config_.max_target_length;
  return o;
}

}  // namespace internal

Status RunTrainer(runtime::Runtime& rt, const TrainerOptions& options,
                  TrainSummary* summary) {
  return internal::Trainer(rt, options, summary).Run();
}

}  // namespace multislice::train
