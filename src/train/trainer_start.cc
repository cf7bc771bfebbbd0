// A device's start: the newest checkpoint or in-memory replica (or the
// initial weights), the outer optimizer, the run directory and the saver.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "model/tensor_shard.h"
#include "train/imported_checkpoint.h"
#include "train/replica_restore.h"
#include "train/run_directory.h"
#include "train/trainer_internal.h"

namespace multislice::train::internal {
namespace {

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

bool SameModel(const model::DecoderConfig& a, const model::DecoderConfig& b) {
  return a == b;
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

// How this start reached its first step, for goodput (metrics.h): the
// runtime's start-up as the caller measured it (else from the trainer's
// start, `trainer_start`) and the restores' seconds.
StartTimes ThisStart(const TrainerOptions& options,
                     Clock::time_point trainer_start, double restore_seconds) {
  StartTimes t;
  t.start_time = options.runtime_start_time;
  t.runtime_init_seconds = options.runtime_init_seconds;
  if (t.start_time <= 0) {
    t.start_time = std::chrono::duration<double>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count() -
                   SecondsSince(trainer_start);
    t.runtime_init_seconds = 0;
  }
  t.restore_seconds = restore_seconds;
  return t;
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

// The plan's shard of a whole-model buffer (the tensor rank's and stage's
// part of it first).
void Trainer::TakeShard(const ParallelPlan& plan,
                        const std::vector<float>& whole, float* out) const {
  const int64_t begin = plan.shard_begin(), count = plan.shard_count();
  const int t = plan.tensor_size();
  const model::PipelineStage stage = plan.ModelStage();
  if (t == 1 && stage.count == 1) {
    std::copy_n(whole.begin() + begin, count, out);
    return;
  }
  std::vector<float> local(static_cast<size_t>(plan.num_parameters()));
  model::ExtractTensorShard(model_, t, plan.tensor_rank(), whole.data(),
                            local.data(), stage);
  std::copy_n(local.begin() + begin, count, out);
}

// The device's shard of the restored checkpoint, or of the initial weights
// (the whole model's, the tensor rank's part of them).
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
    model::InitParameters(model_, static_cast<uint64_t>(config_.seed),
                          state.weights);
    if (plan.sharded()) {
      std::copy_n(state.full.begin() + plan.shard_begin(), plan.shard_count(),
                  state.shard.begin());
    }
    return;
  }
  std::vector<float> whole(static_cast<size_t>(num_parameters_));
  model::InitParameters(model_, static_cast<uint64_t>(config_.seed),
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
  const model::PipelineStage stage = plan.ModelStage();
  std::unique_ptr<ModelStep> step = MakeModelStep(plan, StepOptions(plan));
  std::unique_ptr<Device> d(new Device{
      local,
      printer_ && local == 0,
      std::move(plan),
      std::move(state),
      std::move(train_data),
      std::move(val_data),
      std::move(step),
      ShardOptimizer(config_, model::WeightDecayMask(model_, t, stage), begin,
                     divisor),
      restored_step_,
      nullptr,
      {}});
  RETURN_IF_ERROR(StartOuterOptimizer(*d));
  const bool joining = rt_.joined_step().has_value();
  const Clock::time_point restore_start = Clock::now();
  RETURN_IF_ERROR(joining ? JoinRunningJob(*d) : RestoreReplica(*d));
  if (d->reporter_thread) {
    reporter_->NoteStart(ThisStart(
        options_, start_, restore_seconds_ + SecondsSince(restore_start)));
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
  if (profiler_) {
    ckpt_options_.on_written = [this](int64_t step, int64_t start,
                                      int64_t end) {
      profiler_->CheckpointWritten(step, start, end);
    };
  }
  checkpoints_ = std::make_unique<CheckpointManager>(ckpt_options_);
  // A rejoining slice takes the running job's state instead.
  if (!config_.enable_checkpointing || rt_.joined_step()) return OkStatus();
  std::vector<std::string> warnings;
  const Clock::time_point load_start = Clock::now();
  Result<FullState> state = LoadLatestFullState(*checkpoints_, &warnings);
  restore_seconds_ += SecondsSince(load_start);
  if (printer_) {
    for (const std::string& w : warnings) {
      std::fprintf(stderr, "multislice train: warning: %s\n", w.c_str());
    }
  }
  if (!state.ok()) {
    return state.status().code() == StatusCode::kNotFound ? OkStatus()
                                                          : state.status();
  }
  // An imported checkpoint (multislice import) gives its weights only: the
  // run starts at step 0 with fresh moments and its own batches.
  ASSIGN_OR_RETURN(
      const bool imported,
      StartFromImportedWeights(ckpt_options_.directory, global_rows_,
                               static_cast<uint64_t>(config_.seed),
                               model_.max_seq_len, *state));
  if (imported && !SameModel(state->model, model_)) {
    return InvalidArgument("the imported checkpoint in " +
                           ckpt_options_.directory +
                           " holds another model than this config; train it "
                           "with model_name=<its run directory>/model.yml, "
                           "the model file multislice import wrote");
  }
  if (!SameModel(state->model, model_)) {
    return InvalidArgument("the checkpoint in " + ckpt_options_.directory +
                           " holds another model (decoder_block " +
                           model::BlockName(state->model.block) + ", emb_dim " +
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
  const Clock::time_point load_start = Clock::now();
  Result<RestoredState> state = replicas_->Restore(*latest, 0);
  restore_seconds_ += SecondsSince(load_start);
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

}  // namespace multislice::train::internal
