#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <thread>

#include "compute/adamw.h"
#include "compute/matmul.h"
#include "model/gpt.h"
#include "model/schedule.h"
#include "model/tensor_shard.h"
#include "runtime/comm/types.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/diloco.h"
#include "train/metrics.h"
#include "train/model_step.h"
#include "train/optimizer.h"
#include "train/parallel_plan.h"
#include "train/replica_restore.h"
#include "train/reporter.h"
#include "train/run_directory.h"
#include "train/state_saver.h"
#include "train/train_state.h"

namespace multislice::train {
namespace {

using Clock = std::chrono::steady_clock;

using runtime::DType;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Where this worker keeps its in-memory replica: MULTISLICE_HOST_MEMORY_DIR
// (set per host by an agent) or, for local slices that share one machine,
// /dev/shm/multislice-<uid>/local-slice<S>; then <run_name>/worker<W>.
std::string ReplicaDirectory(const TrainConfig& c,
                             const runtime::WorkerEnv& env) {
  const char* base = std::getenv("MULTISLICE_HOST_MEMORY_DIR");
  const std::string dir =
      base && *base ? std::string(base)
                    : "/dev/shm/multislice-" + std::to_string(::getuid()) +
                          "/local-slice" + std::to_string(env.slice_id);
  return dir + "/" + c.run_name + "/worker" + std::to_string(env.worker_id);
}

// "data=2 fsdp=2 tensor=1".
std::string MeshText(const mesh::DeviceMesh& mesh) {
  std::string text;
  for (size_t a = 0; a < mesh.axis_names.size(); ++a) {
    text += (a ? " " : "") + mesh.axis_names[a] + "=" +
            std::to_string(mesh.shape[a]);
  }
  return text;
}

// A key's number as written: "0.3", "1e-05".
std::string FormatNumber(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

bool SameModel(const model::gpt::GptConfig& a, const model::gpt::GptConfig& b) {
  return a.vocab_size == b.vocab_size && a.max_seq_len == b.max_seq_len &&
         a.emb_dim == b.emb_dim && a.num_heads == b.num_heads &&
         a.num_layers == b.num_layers && a.mlp_dim == b.mlp_dim;
}

// Test seams, read from the environment (never set in production):
//   MULTISLICE_TEST_STEP_DELAY_MS=n       sleep n ms after every step, so a
//                                         test can kill a run mid-training;
//   MULTISLICE_TEST_PAUSE_CHECKPOINT=k    the k-th save of this process
//                                         (1-based) stops forever after
//                                         writing its files, before the
//                                         commit, so a test can kill it there.
//   MULTISLICE_TEST_KILL_AFTER_STEP=p:s   process p kills itself (SIGKILL)
//                                         after step s, so a test can lose
//                                         a slice at a known step.
int64_t EnvInt(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::strtoll(v, nullptr, 10) : 0;
}

// The step after which MULTISLICE_TEST_KILL_AFTER_STEP kills `process`, or
// 0.
int64_t KillAfterStep(int process) {
  const char* v = std::getenv("MULTISLICE_TEST_KILL_AFTER_STEP");
  const std::string spec = v ? v : "";
  const size_t colon = spec.find(':');
  if (colon == std::string::npos ||
      std::atoi(spec.substr(0, colon).c_str()) != process) {
    return 0;
  }
  return std::atoll(spec.substr(colon + 1).c_str());
}

// A barrier of every live process of the job through the rendezvous store,
// for the checkpoint writer thread (device collectives belong to device
// threads). Each barrier of a save is named by its step and phase, so a
// process that rejoined the job meets the others at the next save.
std::function<Status(const std::string&)> StoreBarrier(runtime::Runtime& rt) {
  auto count = std::make_shared<std::atomic<int64_t>>(0);
  const int host = rt.process_index(), hosts = rt.process_count();
  const auto timeout = rt.timeout();
  const int64_t pause_save = EnvInt("MULTISLICE_TEST_PAUSE_CHECKPOINT");
  return [&rt, count, host, hosts, timeout,
          pause_save](const std::string& barrier) -> Status {
    const int64_t call = (*count)++;
    if (pause_save > 0 && call == 3 * (pause_save - 1) + 1) {
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    if (hosts == 1) return OkStatus();
    const std::string name = "ckpt/barrier/" + barrier;
    try {
      rt.store().set(name + "/" + std::to_string(host), {'1'});
      std::vector<std::string> keys;
      for (int h : rt.live_processes()) {
        keys.push_back(name + "/" + std::to_string(h));
      }
      rt.store().wait(keys, timeout);
    } catch (const std::exception& e) {
      return Unavailable(name + ": " + e.what());
    }
    return OkStatus();
  };
}

// A device's iterator over `file`: its `rows` rows of the global batch,
// those of batch shard `shard`, with the run's seed plus seed_offset.
Result<DataIterator> OpenData(const TrainConfig& config,
                              const std::string& file, int global_rows,
                              int shard, int rows, uint64_t seed_offset) {
  DataIteratorOptions o;
  o.token_file = file;
  o.global_rows = global_rows;
  o.row_begin = shard * rows;
  o.rows = rows;
  o.seq_len = config.max_target_length;
  o.seed = static_cast<uint64_t>(config.seed) + seed_offset;
  return DataIterator::Create(o);
}

// Every device must agree on the checkpoint step it restored.
Status AgreeOnRestoredStep(ParallelPlan& plan, int64_t restored_step,
                           const std::string& checkpoint_dir) {
  float agreed[2] = {static_cast<float>(restored_step),
                     -static_cast<float>(restored_step)};
  RETURN_IF_ERROR(
      plan.ReduceOverAll(agreed, 2, "resume-step", comm::ReduceOp::kMin));
  if (agreed[0] == -agreed[1]) return OkStatus();
  return FailedPrecondition(
      "hosts restored different checkpoint steps (" +
      std::to_string(-agreed[1]) + " and " + std::to_string(agreed[0]) +
      "); check that every host sees the same checkpoint directory " +
      checkpoint_dir);
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

// Moves the complete steps after `start_step` (they failed to load) to
// DIR/corrupt-<step>-attempt<A>-<pid>, with a warning each.
void MoveAsideUnreadableSteps(const CheckpointManager& checkpoints,
                              const std::string& dir, int64_t start_step,
                              int attempt) {
  auto steps = checkpoints.CompleteSteps();
  if (!steps.ok()) return;
  for (int64_t step : *steps) {
    if (step <= start_step) continue;
    const std::string from = dir + "/" + std::to_string(step);
    const std::string to = dir + "/corrupt-" + std::to_string(step) +
                           "-attempt" + std::to_string(attempt) + "-" +
                           std::to_string(::getpid());
    std::error_code ec;
    std::filesystem::rename(from, to, ec);
    std::fprintf(stderr,
                 "multislice train: warning: checkpoint step %lld could not "
                 "be read; %s\n",
                 static_cast<long long>(step),
                 ec ? ("left in place: " + ec.message()).c_str()
                    : ("moved to " + to).c_str());
  }
}

// A resumed run whose schedule keys changed since its last start says so
// (run_directory.h): config.json still holds that start's values here.
void WarnOfScheduleChange(const std::string& run_dir, const TrainConfig& config,
                          int64_t restored_step) {
  std::ifstream in(run_dir + "/config.json");
  const nlohmann::json previous = nlohmann::json::parse(in, nullptr, false);
  const std::string note = ScheduleChangeNote(previous, config, restored_step);
  if (note.empty()) return;
  std::fprintf(stderr, "multislice train: warning: %s\n", note.c_str());
}

}  // namespace

std::string CheckpointDirectory(const TrainConfig& config) {
  return RunDirectory(config) + "/checkpoints";
}

model::gpt::GptConfig GptConfigOf(const TrainConfig& c) {
  model::gpt::GptConfig m;
  m.vocab_size = c.vocab_size;
  m.max_seq_len = c.max_target_length;
  m.emb_dim = c.emb_dim;
  m.num_heads = c.num_heads;
  m.num_layers = c.num_decoder_layers;
  m.mlp_dim = c.mlp_dim;
  return m;
}

double StepFlopsPerDevice(const TrainConfig& c) {
  const double C = c.emb_dim, L = c.num_decoder_layers, T = c.max_target_length;
  const double matmul_params =
      L * (C * 3 * C + C * C + 2 * C * c.mlp_dim) + C * c.vocab_size;
  const double tokens = static_cast<double>(c.per_device_batch_size) * T;
  return tokens * (6 * matmul_params + 12 * L * T * C);
}

namespace {

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
  void FreeReplicas();

  runtime::Runtime& rt_;
  const TrainerOptions& options_;
  const TrainConfig& config_;
  TrainSummary* const summary_;
  const Clock::time_point start_ = Clock::now();
  const model::gpt::GptConfig model_;
  int64_t num_parameters_ = 0;  // once the model is validated
  const int num_devices_, global_rows_;
  const bool printer_;  // process 0
  CheckpointOptions ckpt_options_;
  std::unique_ptr<CheckpointManager> checkpoints_, replicas_;
  std::optional<FullState> restored_;
  int64_t restored_step_ = 0;
  std::optional<RestoredState> replica_;  // this host's, when newer
  std::unique_ptr<Reporter> reporter_;
  std::unique_ptr<StateSaver> saver_;
  std::atomic<int64_t> current_step_{0};  // device 0's, for out-of-memory
};

Trainer::Trainer(runtime::Runtime& rt, const TrainerOptions& options,
                 TrainSummary* summary)
    : rt_(rt),
      options_(options),
      config_(options.config),
      summary_(summary),
      model_(GptConfigOf(options.config)),
      num_devices_(static_cast<int>(rt.devices().size())),
      global_rows_(options.config.per_device_batch_size * num_devices_),
      printer_(rt.process_index() == 0) {}

Status Trainer::Run() {
  RETURN_IF_ERROR(model::gpt::ValidateConfig(model_));
  if (rt_.too_late_to_join()) {
    std::fprintf(stderr,
                 "multislice train: %s was started again, but the other slices "
                 "finished training before it could rejoin\n",
                 rt_.env().name().c_str());
    return OkStatus();
  }
  num_parameters_ = model::gpt::NumParameters(model_);
  RETURN_IF_ERROR(RestoreCheckpoint());
  OpenReplicas();
  reporter_ = std::make_unique<Reporter>(
      options_, StepFlopsPerDevice(config_),
      static_cast<double>(global_rows_) * config_.max_target_length,
      rt_.env().attempt);
  if (printer_) RETURN_IF_ERROR(StartRunDirectory());
  saver_ = std::make_unique<StateSaver>(SaverOptions());
  return rt_.RunOnDevices([&](int local) {
    return CatchOutOfMemory([&] { return TrainOnDevice(local); }, current_step_,
                            options_);
  });
}

// The loop of one device thread.
Status Trainer::TrainOnDevice(int local) {
  compute::SetSingleThreaded();
  ASSIGN_OR_RETURN(std::unique_ptr<Device> d, StartDevice(local));
  const int64_t step_delay_ms = EnvInt("MULTISLICE_TEST_STEP_DELAY_MS");
  const int64_t kill_after = KillAfterStep(rt_.process_index());
  for (int64_t step = d->start_step + 1; step <= config_.steps; ++step) {
    if (local == 0) current_step_ = step;
    ASSIGN_OR_RETURN(StepResult r, TrainStep(*d, step));
    if (r.stop) return saver_->Stop(local, step);
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
    if (d->outer && (replica_step || checkpoint_step)) {
      RETURN_IF_ERROR(d->outer->Settle());
    }
    if (replica_step) {
      saver_->SaveReplica(local, step, d->shard(true), d->train_data.state());
    }
    if (checkpoint_step) {
      const bool outer_writer = d->plan.diloco_rank() == LowestLiveReplica();
      saver_->SaveCheckpoint(
          local, step, d->plan.data_rank() == 0, d->shard(outer_writer),
          d->train_data.state(),
          outer_writer ? StandIns(*d) : std::vector<StateShard>{});
    }
    if (step == d->admission.at) RETURN_IF_ERROR(AdmitSlices(*d, step));
    if (step_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms));
    }
    if (step == kill_after) {
      std::fflush(stdout);
      std::fflush(stderr);
      ::raise(SIGKILL);
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
  const Batch batch = d.train_data.At(step - 1);
  RETURN_IF_ERROR(d.plan.GatherWeights(d.state));
  ASSIGN_OR_RETURN(float loss, d.step->Train(batch, d.plan, d.state));
  // In one all-reduce over the replica (the whole mesh without DiLoCo): the
  // replica's mean loss, the squared norm of its summed gradient (data
  // replicas hold equal shards: each adds 1/data) and the failure flag.
  float stats[3] = {
      loss * d.plan.ReplicaLossShare(),
      static_cast<float>(d.plan.ShardSquaredNorm(d.state.gradient)),
      saver_->FaultFlag(d.local)};
  RETURN_IF_ERROR(d.plan.ReduceOverReplica(stats, 3, "loss-and-norm"));
  StepResult r;
  ASSIGN_OR_RETURN(r.stop, StopsAt(d, step, stats[2]));
  if (r.stop) return r;
  r.record.step = step;
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

// Whether the job stops after this step: a process has failed. DiLoCo's
// replicas meet only where a sync starts (every period / fragments steps)
// and at the last step, so a failure in one replica stops every one there;
// without DiLoCo the step's flag is the whole mesh's.
// With diloco_continue_on_failure the same max also carries, one flag per
// slice, the lost slices whose restarted workers ask to rejoin.
Result<bool> Trainer::StopsAt(Device& d, int64_t step, float replica_fault) {
  if (d.plan.diloco_size() == 1) return replica_fault > 0;
  if (!d.outer->SyncStartsAfter(step) && step != config_.steps) return false;
  const bool rejoins = config_.diloco_continue_on_failure;
  std::vector<float> flags(1 + (rejoins ? rt_.env().num_slices : 0));
  RETURN_IF_ERROR(AcrossReplicas([&] {
    std::fill(flags.begin(), flags.end(), 0.0f);
    flags[0] = replica_fault;
    if (rejoins && d.local == 0 && step < config_.steps) {
      for (int slice : rt_.RejoinRequests()) flags[1 + slice] = 1;
    }
    return d.plan.ReduceOverAll(flags.data(), static_cast<int>(flags.size()),
                                "diloco-fault", runtime::ReduceOp::kMax);
  }));
  if (flags[0] > 0) return true;
  if (!rejoins) return false;
  if (step < config_.steps) {
    ScheduleAdmission(d, step, flags.data() + 1);
  } else if (d.local == 0) {
    rt_.CloseAdmissions();
  }
  return false;
}

// The slices that asked are admitted once this step's sync has landed
// (overlap_steps later, when nothing is in flight), if training goes on
// after that.
void Trainer::ScheduleAdmission(Device& d, int64_t step,
                                const float* requests) {
  Device::Admission& a = d.admission;
  a.slices.clear();
  for (int slice = 0; slice < rt_.env().num_slices; ++slice) {
    if (requests[slice] > 0) a.slices.push_back(slice);
  }
  const int64_t at = step + config_.num_communication_overlapping_steps;
  if (a.slices.empty() || at >= config_.steps) return;
  a.at = at;
  a.generation = rt_.membership_generation();
}

// After `step` the survivors take the admitted slices back: no save
// may be in flight (its barriers count the members), the runtime connects
// the next generation with them, and their replicas get the lowest
// survivor's state. A loss since the decision leaves them waiting for the
// next one.
Status Trainer::AdmitSlices(Device& d, int64_t step) {
  Device::Admission& a = d.admission;
  a.at = -1;
  saver_->WaitForSaves(d.local);
  if (!rt_.AllLocalDevicesOk(rt_.membership_generation() == a.generation)) {
    return OkStatus();
  }
  RETURN_IF_ERROR(rt_.AdmitSlices(a.generation, a.slices, step));
  RETURN_IF_ERROR(ShareRejoinState(d, /*joining=*/false));
  if (d.reporter_thread) {
    for (int slice : a.slices) {
      std::fprintf(stderr,
                   "multislice train: slice %d rejoined after step %lld\n",
                   slice, static_cast<long long>(step));
    }
  }
  return OkStatus();
}

// The replicas that join take the moments and outer state of the lowest
// replica that trained on, and the outer parameters as their own (as at a
// restart: replica_restore.h). Every replica of the new generation calls it.
Status Trainer::ShareRejoinState(Device& d, bool joining) {
  float lowest = joining ? 1e9f : static_cast<float>(d.plan.diloco_rank());
  RETURN_IF_ERROR(d.plan.ReduceOverDiloco(&lowest, 1, "rejoin-root",
                                          runtime::ReduceOp::kMin));
  const int root_replica = static_cast<int>(lowest);
  int root = root_replica;  // its rank among the replicas left
  for (int slice : rt_.lost_slices()) root -= slice < root_replica ? 1 : 0;
  return RejoinFromReplica(
      d.plan, root, /*complete=*/!joining,
      {d.state.shard.data(), d.state.adam_m.data(), d.state.adam_v.data(),
       d.outer->outer().data(), d.outer->momentum().data()});
}

// A restarted slice's device: it starts after the step the survivors
// admitted it at, from their state, with its data at that step.
Status Trainer::JoinRunningJob(Device& d) {
  const int64_t step = *rt_.joined_step();
  RETURN_IF_ERROR(ShareRejoinState(d, /*joining=*/true));
  d.start_step = step;
  d.outer->Resume(step);
  IteratorState at = d.train_data.state();
  at.step = step;
  RETURN_IF_ERROR(d.train_data.Restore(at));
  if (d.local == 0) {
    std::fprintf(stderr,
                 "multislice train: %s rejoined after step %lld at the outer "
                 "parameters\n",
                 rt_.env().name().c_str(), static_cast<long long>(step));
  }
  return OkStatus();
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

// Runs op, a collective across DiLoCo's replicas. With
// diloco_continue_on_failure, when it fails and the survivors agree that
// slices were lost (Runtime::DropLostSlices), it runs again over the
// replicas left, after `resend` (which restarts work op waits for); the
// first failure is returned when none was lost or the agreement failed.
Status Trainer::AcrossReplicas(const std::function<Status()>& op,
                               const std::function<Status()>& resend) {
  for (int tries = 0;; ++tries) {
    const int generation = rt_.membership_generation();
    Status s = op();
    if (!config_.diloco_continue_on_failure) return s;
    // A collective can succeed on one device of a process and fail on
    // another (one that had nothing to send to the lost peer): they retry
    // together, or their shared-memory groups would fall out of step.
    if (!rt_.AllLocalDevicesOk(s.ok()) && s.ok()) {
      s = Aborted("another device of this process lost a peer");
    }
    if (s.ok() || tries >= rt_.env().num_slices) return s;
    Result<int> lost = rt_.DropLostSlices(generation);
    if (!lost.ok()) {
      return s.WithContext(
          "and the survivors did not agree on the slices "
          "lost (" +
          lost.status().message() + ")");
    }
    if (*lost == 0 && rt_.membership_generation() == generation) return s;
    if (resend) RETURN_IF_ERROR(resend());
  }
}

// With lost slices (one DiLoCo replica each): the lowest replica left,
// which writes the outer state and stands in for the lost ones.
int Trainer::LowestLiveReplica() const {
  const std::vector<int> lost = rt_.lost_slices();
  int replica = 0;
  while (std::find(lost.begin(), lost.end(), replica) != lost.end()) ++replica;
  return replica;
}

// The shards this device writes for the replicas that are gone: the outer
// parameters with this replica's AdamW moments, the state a rejoin gives a
// replica that lost its memory (docs/diloco.md), so that the checkpoint
// resumes onto every slice again.
std::vector<StateShard> Trainer::StandIns(const Device& d) const {
  std::vector<StateShard> stand_ins;
  for (int slice : rt_.lost_slices()) {
    StateShard s = d.shard(/*with_outer=*/false);
    s.replica = slice;
    s.params = d.outer->outer().data();
    stand_ins.push_back(s);
  }
  return stand_ins;
}

// Whether the save of `step` is skipped because slice 0 was lost: its
// process commits every checkpoint. Every survivor decides alike: the
// slices are dropped at the same collective everywhere.
bool Trainer::SkipsSaveWhileLost(int local, int64_t step) const {
  const std::vector<int> lost = rt_.lost_slices();
  if (std::find(lost.begin(), lost.end(), 0) == lost.end()) return false;
  if (local == 0 && rt_.process_index() == rt_.live_processes().front()) {
    std::fprintf(stderr,
                 "multislice train: warning: no checkpoint at step %lld: "
                 "slice 0 was lost, and its worker 0 commits the "
                 "checkpoints\n",
                 static_cast<long long>(step));
  }
  return true;
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

// The device's shard of the restored checkpoint, or of the initial weights
// (the whole model's, the tensor rank's part of them).
// The plan's shard of a whole-model buffer (the tensor rank's and stage's
// part of it first).
void Trainer::TakeShard(const ParallelPlan& plan,
                        const std::vector<float>& whole, float* out) const {
  const int64_t begin = plan.shard_begin(), count = plan.shard_count();
  const int t = plan.tensor_size();
  const model::gpt::PipelineStage stage = plan.ModelStage();
  if (t == 1 && stage.count == 1) {
    std::copy_n(whole.begin() + begin, count, out);
    return;
  }
  std::vector<float> local(static_cast<size_t>(plan.num_parameters()));
  model::gpt::ExtractTensorShard(model_, t, plan.tensor_rank(), whole.data(),
                                 local.data(), stage);
  std::copy_n(local.begin() + begin, count, out);
}

void Trainer::InitShard(const ParallelPlan& plan, DeviceBuffers& state) const {
  if (restored_) {
    // A DiLoCo checkpoint holds each replica's own inner state.
    const int r = plan.diloco_rank();
    const bool own = restored_->diloco_replicas > 1 && r > 0;
    const InnerState* inner = own ? &restored_->more_replicas[r - 1] : nullptr;
    TakeShard(plan, inner ? inner->params : restored_->params,
              state.shard.data());
    TakeShard(plan, inner ? inner->adam_m : restored_->adam_m,
              state.adam_m.data());
    TakeShard(plan, inner ? inner->adam_v : restored_->adam_v,
              state.adam_v.data());
    return;
  }
  if (plan.tensor_size() == 1 && plan.stage_size() == 1) {
    model::gpt::InitParameters(model_, static_cast<uint64_t>(config_.seed),
                               state.weights);
    if (plan.sharded()) {
      std::copy_n(state.full.begin() + plan.shard_begin(), plan.shard_count(),
                  state.shard.begin());
    }
    return;
  }
  std::vector<float> whole(static_cast<size_t>(num_parameters_));
  model::gpt::InitParameters(model_, static_cast<uint64_t>(config_.seed),
                             whole.data());
  TakeShard(plan, whole, state.shard.data());
}

// DiLoCo's outer optimizer on the device's shard: its outer copy starts as
// the device's starting parameters, or as the checkpoint's outer state.
Status Trainer::StartOuterOptimizer(Device& d) {
  if (!config_.enable_diloco) return OkStatus();
  OuterOptimizerOptions o;
  o.learning_rate = config_.diloco_outer_lr;
  o.momentum = config_.diloco_outer_momentum;
  o.replica_axes = {"diloco"};
  ASSIGN_OR_RETURN(o.wire, runtime::ParseWireType(config_.diloco_wire_dtype,
                                                  "key 'diloco_wire_dtype'"));
  o.sync_period = config_.diloco_sync_period;
  o.resendable = config_.diloco_continue_on_failure;
  if (config_.enable_streaming_diloco) {
    ASSIGN_OR_RETURN(
        auto fragments,
        LayerFragments(model_, d.plan.tensor_size(), d.plan.ModelStage(),
                       config_.num_diloco_fragments));
    o.fragments =
        ShardFragments(fragments, d.plan.shard_begin(), d.plan.shard_count());
    o.overlap_steps = config_.num_communication_overlapping_steps;
    o.alpha = config_.communication_overlapping_alpha;
  }
  d.outer = std::make_unique<OuterOptimizer>(o, d.state.shard.data(),
                                             d.plan.shard_count());
  if (!restored_ || restored_->diloco_replicas == 0) return OkStatus();
  TakeShard(d.plan, restored_->outer, d.outer->outer().data());
  TakeShard(d.plan, restored_->outer_momentum, d.outer->momentum().data());
  if (!restored_->outer_pending.empty() && !d.outer->pending().empty()) {
    TakeShard(d.plan, restored_->outer_pending, d.outer->pending().data());
  }
  d.outer->Resume(restored_step_);
  return OkStatus();
}

// The state a save takes from the device.
StateShard Trainer::Device::shard(bool with_outer) const {
  StateShard s;
  s.begin = plan.shard_begin();
  s.params = state.shard.data();
  s.adam_m = state.adam_m.data();
  s.adam_v = state.adam_v.data();
  s.count = plan.shard_count();
  s.tensor_rank = plan.tensor_rank();
  s.tensor_size = plan.tensor_size();
  s.stage = plan.stage_rank();
  s.stages = plan.stage_size();
  s.replica = plan.diloco_rank();
  s.replicas = plan.diloco_size();
  if (outer && with_outer) {
    s.outer = outer->outer().data();
    s.outer_momentum = outer->momentum().data();
    if (!outer->pending().empty()) s.outer_pending = outer->pending().data();
  }
  return s;
}

// The device's plan, state (restored, from a replica, or initialised),
// data and model; the step every device resumes after.
Result<std::unique_ptr<Trainer::Device>> Trainer::StartDevice(int local) {
  ASSIGN_OR_RETURN(ParallelPlan plan,
                   ParallelPlan::Create(rt_.collectives(local), model_));
  // The wire key is for the data axis across slices (DCN) only.
  if (rt_.parallelism().dcn[mesh::kData] > 1) {
    ASSIGN_OR_RETURN(runtime::WireType wire,
                     runtime::ParseWireType(config_.dcn_gradient_wire_dtype,
                                            "key 'dcn_gradient_wire_dtype'"));
    plan.set_gradient_wire(wire);
  }
  DeviceBuffers state = plan.Allocate();
  InitShard(plan, state);
  const int rows = RowsPerDevice(plan);
  ASSIGN_OR_RETURN(DataIterator train_data,
                   OpenData(config_, options_.dataset_dir + "/train.bin",
                            global_rows_, plan.batch_shard(), rows, 0));
  if (restored_) RETURN_IF_ERROR(train_data.Restore(restored_->iterator));
  ASSIGN_OR_RETURN(DataIterator val_data,
                   OpenData(config_, options_.dataset_dir + "/val.bin",
                            global_rows_, plan.batch_shard(), rows, 1));
  const int t = plan.tensor_size();
  const int64_t begin = plan.shard_begin();
  const int divisor = plan.gradient_shards();
  const model::gpt::PipelineStage stage = plan.ModelStage();
  std::unique_ptr<ModelStep> step = MakeModelStep(plan, StepOptions(plan));
  std::unique_ptr<Device> d(new Device{
      local,
      printer_ && local == 0,
      std::move(plan),
      std::move(state),
      std::move(train_data),
      std::move(val_data),
      std::move(step),
      ShardOptimizer(config_, model::gpt::WeightDecayMask(model_, t, stage),
                     begin, divisor),
      restored_step_,
      nullptr,
      {}});
  RETURN_IF_ERROR(StartOuterOptimizer(*d));
  const bool joining = rt_.joined_step().has_value();
  RETURN_IF_ERROR(joining ? JoinRunningJob(*d) : RestoreReplica(*d));
  if (d->reporter_thread) {
    reporter_->LoadHistory(d->start_step);
    summary_->first_step = d->start_step + 1;
    summary_->last_step = d->start_step;
  }
  if (joining) return d;  // the others are past their start
  RETURN_IF_ERROR(
      AgreeOnRestoredStep(d->plan, restored_step_, ckpt_options_.directory));
  // Complete steps newer than the one restored failed to load: move them
  // aside, so that this run can save those steps again.
  if (d->reporter_thread && config_.enable_checkpointing) {
    MoveAsideUnreadableSteps(*checkpoints_, ckpt_options_.directory,
                             d->start_step, rt_.env().attempt);
  }
  return d;
}

// In-memory recovery of a newer step than the checkpoint's, with its line.
Status Trainer::RestoreReplica(Device& d) {
  if (d.reporter_thread) {
    summary_->restored_step = restored_ ? restored_step_ : int64_t{-1};
    summary_->restored_from = restored_ ? "checkpoint" : "none";
  }
  if (!replicas_) return OkStatus();
  std::vector<ExtraShard> outer_state;
  if (d.outer) {
    outer_state = {{"outer", d.outer->outer().data()},
                   {"outer_momentum", d.outer->momentum().data()}};
    if (!d.outer->pending().empty()) {
      outer_state.push_back({"outer_pending", d.outer->pending().data()});
    }
  }
  ASSIGN_OR_RETURN(
      ReplicaRestore r,
      RestoreFromReplicas(d.plan, replica_ ? &*replica_ : nullptr,
                          restored_step_, global_rows_, d.state, outer_state));
  if (r.step >= 0) {
    d.start_step = r.step;
    if (d.outer) d.outer->Resume(r.step);
  }
  if (!d.reporter_thread) return OkStatus();
  if (r.step >= 0) {
    summary_->restored_step = r.step;
    summary_->restored_from = "replica";
    if (!options_.quiet && r.root >= 0) {
      std::printf(
          "multislice train: restored step %lld from the in-memory replica "
          "of data rank %d over the data axis (the newest checkpoint is step "
          "%lld)\n",
          static_cast<long long>(r.step), r.root,
          static_cast<long long>(restored_step_));
    }
    if (!options_.quiet && r.rejoin_root >= 0) {
      std::printf(
          "multislice train: DiLoCo replica(s) without an in-memory copy of "
          "step %lld rejoin at the outer parameters of replica %d (their "
          "inner steps since its last sync are lost)\n",
          static_cast<long long>(r.step), r.rejoin_root);
    }
    std::fflush(stdout);
  } else if (r.uncovered_step >= 0) {
    std::fprintf(stderr,
                 "multislice train: warning: an in-memory replica of step "
                 "%lld does not cover every shard; restoring the checkpoint "
                 "of step %lld\n",
                 static_cast<long long>(r.uncovered_step),
                 static_cast<long long>(restored_step_));
  }
  return OkStatus();
}

// The newest readable checkpoint, if any, checked against this run.
Status Trainer::RestoreCheckpoint() {
  ckpt_options_.directory = CheckpointDirectory(config_);
  ckpt_options_.host = rt_.process_index();
  ckpt_options_.host_count = rt_.process_count();
  ckpt_options_.max_to_keep = config_.max_num_checkpoints_to_keep;
  ckpt_options_.async = config_.async_checkpointing;
  ckpt_options_.barrier = StoreBarrier(rt_);
  if (config_.diloco_continue_on_failure) {
    ckpt_options_.absent_hosts = [this] {
      std::vector<int> absent;
      for (int p = 0; p < rt_.process_count(); ++p) {
        if (rt_.dcn_rank_of(p) < 0) absent.push_back(p);
      }
      return absent;
    };
  }
  checkpoints_ = std::make_unique<CheckpointManager>(ckpt_options_);
  // A rejoining slice takes the running job's state instead.
  if (!config_.enable_checkpointing || rt_.joined_step()) return OkStatus();
  std::vector<std::string> warnings;
  Result<FullState> state = LoadLatestFullState(*checkpoints_, &warnings);
  if (printer_) {
    for (const std::string& w : warnings) {
      std::fprintf(stderr, "multislice train: warning: %s\n", w.c_str());
    }
  }
  if (!state.ok()) {
    return state.status().code() == StatusCode::kNotFound ? OkStatus()
                                                          : state.status();
  }
  if (!SameModel(state->model, model_)) {
    return InvalidArgument("the checkpoint in " + ckpt_options_.directory +
                           " holds another model size (emb_dim " +
                           std::to_string(state->model.emb_dim) + ", layers " +
                           std::to_string(state->model.num_layers) +
                           ", max_seq_len " +
                           std::to_string(state->model.max_seq_len) +
                           ") than this config; use another run_name");
  }
  if (state->iterator.global_rows != global_rows_) {
    return InvalidArgument(
        "the checkpoint was saved with a global batch of " +
        std::to_string(state->iterator.global_rows) +
        " rows and this mesh has " + std::to_string(global_rows_) +
        " (per_device_batch_size " +
        std::to_string(config_.per_device_batch_size) + " x " +
        std::to_string(num_devices_) +
        " devices); choose per_device_batch_size so that they match");
  }
  if (Status s = CheckDilocoState(*state); !s.ok()) return s;
  if (state->step > config_.steps) {
    return InvalidArgument("the checkpoint is at step " +
                           std::to_string(state->step) +
                           ", beyond steps=" + std::to_string(config_.steps));
  }
  restored_step_ = state->step;
  restored_ = std::move(*state);
  return OkStatus();
}

// (sync period, fragments, overlap steps): what decides which fragment is
// in flight after a step.
std::vector<int> Trainer::DilocoSchedule() const {
  return {config_.diloco_sync_period,
          config_.enable_streaming_diloco ? config_.num_diloco_fragments : 1,
          config_.num_communication_overlapping_steps};
}

// A DiLoCo checkpoint resumes only as DiLoCo with as many replicas and the
// same kind of outer state (a plain one starts DiLoCo from its weights),
// and with a fragment in flight only under the schedule it was saved in.
Status Trainer::CheckDilocoState(const FullState& state) const {
  if (state.diloco_replicas == 0) return OkStatus();
  if (!state.outer_pending.empty() && !state.diloco_schedule.empty() &&
      config_.enable_diloco && state.diloco_schedule != DilocoSchedule()) {
    const std::vector<int>& s = state.diloco_schedule;
    return InvalidArgument(
        "the checkpoint in " + ckpt_options_.directory +
        " has a fragment sync in flight under diloco_sync_period " +
        std::to_string(s[0]) + ", num_diloco_fragments " +
        std::to_string(s[1]) + " and num_communication_overlapping_steps " +
        std::to_string(s[2]) +
        ", and this run changes them; resume it with those values (the "
        "fragment in flight depends on them), or use another run_name");
  }
  const int replicas = rt_.parallelism().size(mesh::kDiloco);
  const bool pending = config_.enable_streaming_diloco &&
                       config_.num_communication_overlapping_steps > 0;
  if (config_.enable_diloco && state.diloco_replicas == replicas &&
      state.outer_pending.empty() != pending) {
    return OkStatus();
  }
  return InvalidArgument(
      "the checkpoint in " + ckpt_options_.directory + " holds " +
      std::to_string(state.diloco_replicas) + " DiLoCo replica(s)" +
      (state.outer_pending.empty() ? "" : " with a fragment sync in flight") +
      " and this run has " +
      (config_.enable_diloco
           ? std::to_string(replicas) + " (" + (pending ? "with" : "without") +
                 " overlapped fragment syncs)"
           : std::string("DiLoCo off")) +
      "; resume it with the same enable_diloco, diloco axis and "
      "num_communication_overlapping_steps, or use another run_name");
}

// In-memory recovery: this host's replica, when newer than the checkpoint.
void Trainer::OpenReplicas() {
  if (!config_.enable_in_memory_recovery) return;
  CheckpointOptions replica_options;
  replica_options.directory = ReplicaDirectory(config_, rt_.env());
  replica_options.max_to_keep = 1;
  replica_options.async = true;
  replicas_ = std::make_unique<CheckpointManager>(replica_options);
  Result<int64_t> latest = replicas_->LatestCompleteStep();
  if (!latest.ok() || *latest <= restored_step_ || *latest > config_.steps) {
    return;
  }
  Result<RestoredState> state = replicas_->Restore(*latest, 0);
  if (state.ok()) {
    replica_ = std::move(*state);
  } else {
    std::fprintf(stderr,
                 "multislice train: warning: ignoring the in-memory replica: "
                 "%s\n",
                 state.status().message().c_str());
  }
}

// Process 0: the run directory, its config.json and metrics, the first
// lines.
Status Trainer::StartRunDirectory() {
  const std::string run_dir = RunDirectory(config_);
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) {
    return Internal(run_dir +
                    ": cannot create the run directory: " + ec.message());
  }
  if (restored_) WarnOfScheduleChange(run_dir, config_, restored_step_);
  RETURN_IF_ERROR(WriteFileAtomically(run_dir + "/config.json",
                                      ToJson(config_).dump(2) + "\n")
                      .WithContext("cannot write the run's config"));
  RETURN_IF_ERROR(reporter_->Open(run_dir));
  if (options_.quiet) return OkStatus();
  std::printf(
      "multislice train: %s, %lld parameters, mesh %s, %d device(s), "
      "global batch %d x %d tokens, %s\n",
      run_dir.c_str(), static_cast<long long>(num_parameters_),
      MeshText(rt_.mesh()).c_str(), num_devices_, global_rows_,
      config_.max_target_length,
      options_.platform.empty() ? (config_.dtype + " matmuls").c_str()
                                : options_.platform.c_str());
  for (const std::string& note : options_.notes) {
    std::printf("multislice train: %s\n", note.c_str());
  }
  if (const int p = rt_.parallelism().size(mesh::kStage); p > 1) {
    const int m = PipelineMicrobatches(config_, p);
    std::printf(
        "multislice train: pipeline of %d stages (%d layer%s each), %s, %d "
        "microbatches of %d rows: bubble (p-1)/(m+p-1) = %.1f %%\n",
        p, config_.num_decoder_layers / p,
        config_.num_decoder_layers / p == 1 ? "" : "s",
        config_.pipeline_parallel_schedule.c_str(), m,
        config_.per_device_batch_size * p *
            rt_.parallelism().size(mesh::kTensor) / m,
        100.0 * BubbleFraction(p, m));
  }
  if (config_.enable_diloco) PrintDilocoLine();
  if (rt_.parallelism().dcn[mesh::kTensor] > 1) {
    // The seed: "we do not recommend tensor parallelism across slices,
    // because it needs a lot of bandwidth between them".
    std::fprintf(stderr,
                 "multislice train: warning: dcn_tensor_parallelism=%d: "
                 "tensor parallelism all-reduces activations four times per "
                 "layer and step, which needs far more bandwidth than DCN "
                 "gives; prefer dcn_data_parallelism or dcn_fsdp_parallelism "
                 "across slices\n",
                 rt_.parallelism().dcn[mesh::kTensor]);
  }
  if (restored_) {
    std::printf(
        "multislice train: resumed from checkpoint step %lld (saved with "
        "mesh shape %s on %d slice(s))\n",
        static_cast<long long>(restored_step_),
        restored_->saved_mesh.contains("shape")
            ? restored_->saved_mesh["shape"].dump().c_str()
            : "?",
        restored_->saved_mesh.value("num_slices", 0));
  }
  std::fflush(stdout);
  return OkStatus();
}

// "DiLoCo: 2 replicas, an outer step every 36 steps (Nesterov SGD, lr 0.3,
// momentum 0.9), pseudo-gradients as int8 on the wire", and the streaming
// fragments.
void Trainer::PrintDilocoLine() const {
  const TrainConfig& c = config_;
  std::string line =
      "DiLoCo: " + std::to_string(rt_.parallelism().size(mesh::kDiloco)) +
      " replica(s), an outer step every " +
      std::to_string(c.diloco_sync_period) + " steps (Nesterov SGD, lr " +
      FormatNumber(c.diloco_outer_lr) + ", momentum " +
      FormatNumber(c.diloco_outer_momentum) + "), pseudo-gradients as " +
      std::string(runtime::Name(
          *runtime::ParseWireType(c.diloco_wire_dtype, "diloco_wire_dtype"))) +
      " on the wire";
  if (c.enable_streaming_diloco) {
    line += "; streaming: " + std::to_string(c.num_diloco_fragments) +
            " fragments of whole layers, one every " +
            std::to_string(c.diloco_sync_period / c.num_diloco_fragments) +
            " steps, each landing " +
            std::to_string(c.num_communication_overlapping_steps) +
            " step(s) later, mixed with alpha " +
            FormatNumber(c.communication_overlapping_alpha);
  }
  std::printf("multislice train: %s\n", line.c_str());
}

StateSaverOptions Trainer::SaverOptions() {
  StateSaverOptions o;
  o.checkpoints = checkpoints_.get();
  o.replicas = replicas_.get();
  o.local_count = static_cast<int>(rt_.local_devices().size());
  o.model = model_;
  o.axis_names = rt_.mesh().axis_names;
  o.mesh_shape = rt_.mesh().shape;
  o.num_slices = rt_.env().num_slices;
  for (size_t a = 0; a < rt_.mesh().axis_names.size(); ++a) {
    if (rt_.mesh().axis_names[a] == "tensor") {
      o.tensor_parallelism = rt_.mesh().shape[a];
    }
    if (rt_.mesh().axis_names[a] == "stage") {
      o.pipeline_parallelism = rt_.mesh().shape[a];
    }
  }
  if (config_.enable_diloco) {
    o.diloco_replicas = rt_.parallelism().size(mesh::kDiloco);
    o.diloco_pending = config_.enable_streaming_diloco &&
                       config_.num_communication_overlapping_steps > 0;
    if (o.diloco_pending) o.diloco_schedule = DilocoSchedule();
  }
  o.row_begin = rt_.local_devices()[0] * config_.per_device_batch_size;
  o.rows = o.local_count * config_.per_device_batch_size;
  if (printer_) {
    // The metrics up to a step durable before the step commits.
    o.before_checkpoint = [this] { return reporter_->SyncMetrics(); };
  }
  return o;
}

// The run is complete and checkpointed: free the host memory.
void Trainer::FreeReplicas() {
  if (!replicas_) return;
  (void)replicas_->Wait();
  std::error_code ec;
  const std::filesystem::path replica_dir =
      ReplicaDirectory(config_, rt_.env());
  std::filesystem::remove_all(replica_dir, ec);
  // The run's directory too, once its last worker has gone (remove() leaves
  // a non-empty directory alone).
  std::filesystem::remove(replica_dir.parent_path(), ec);
}

}  // namespace

Status RunTrainer(runtime::Runtime& rt, const TrainerOptions& options,
                  TrainSummary* summary) {
  return Trainer(rt, options, summary).Run();
}

}  // namespace multislice::train
