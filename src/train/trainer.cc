#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
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
#include "runtime/comm/types.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/metrics.h"
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
int64_t EnvInt(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::strtoll(v, nullptr, 10) : 0;
}

// A barrier of every process of the job through the rendezvous store, for
// the checkpoint writer thread (device collectives belong to device threads).
// Every process calls it the same number of times (three per save), so the
// n-th call of each meets the n-th call of the others.
std::function<Status()> StoreBarrier(runtime::Runtime& rt) {
  auto count = std::make_shared<std::atomic<int64_t>>(0);
  const int host = rt.process_index(), hosts = rt.process_count();
  const auto timeout = rt.timeout();
  const int64_t pause_save = EnvInt("MULTISLICE_TEST_PAUSE_CHECKPOINT");
  return [&rt, count, host, hosts, timeout, pause_save]() -> Status {
    const int64_t call = (*count)++;
    if (pause_save > 0 && call == 3 * (pause_save - 1) + 1) {
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    if (hosts == 1) return OkStatus();
    const std::string name = "ckpt/barrier/" + std::to_string(call);
    try {
      rt.store().set(name + "/" + std::to_string(host), {'1'});
      std::vector<std::string> keys;
      for (int h = 0; h < hosts; ++h) {
        keys.push_back(name + "/" + std::to_string(h));
      }
      rt.store().wait(keys, timeout);
    } catch (const std::exception& e) {
      return Unavailable(name + ": " + e.what());
    }
    return OkStatus();
  };
}

// A device's iterator over `file`: its per_device_batch_size rows of the
// global batch (device id order), the run's seed plus seed_offset.
Result<DataIterator> OpenData(const TrainConfig& config,
                              const std::string& file, int global_rows,
                              int device_id, uint64_t seed_offset) {
  DataIteratorOptions o;
  o.token_file = file;
  o.global_rows = global_rows;
  o.row_begin = device_id * config.per_device_batch_size;
  o.rows = config.per_device_batch_size;
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

Status RunTrainer(runtime::Runtime& rt, const TrainerOptions& options,
                  TrainSummary* summary) {
  const Clock::time_point start = Clock::now();
  const TrainConfig& config = options.config;
  const model::gpt::GptConfig model_config = GptConfigOf(config);
  RETURN_IF_ERROR(model::gpt::ValidateConfig(model_config));
  const int64_t N = model::gpt::NumParameters(model_config);
  const int num_devices = static_cast<int>(rt.devices().size());
  const int local_count = static_cast<int>(rt.local_devices().size());
  const int global_rows = config.per_device_batch_size * num_devices;
  const bool printer = rt.process_index() == 0;
  const std::string run_dir = RunDirectory(config);
  const DType matmul_type = MatmulDType(config);

  for (size_t a = 0; a < rt.mesh().axis_names.size(); ++a) {
    if (rt.mesh().axis_names[a] == "tensor" && rt.mesh().shape[a] != 1) {
      return InvalidArgument(
          "tensor parallelism " + std::to_string(rt.mesh().shape[a]) +
          ": multislice train shards with data and fsdp only; set "
          "ici_tensor_parallelism and dcn_tensor_parallelism to 1");
    }
  }

  // Checkpoints: restore the newest readable step, if any.
  CheckpointOptions ckpt_options;
  ckpt_options.directory = CheckpointDirectory(config);
  ckpt_options.host = rt.process_index();
  ckpt_options.host_count = rt.process_count();
  ckpt_options.max_to_keep = config.max_num_checkpoints_to_keep;
  ckpt_options.async = config.async_checkpointing;
  ckpt_options.barrier = StoreBarrier(rt);
  CheckpointManager checkpoints(ckpt_options);
  std::optional<FullState> restored;
  if (config.enable_checkpointing) {
    std::vector<std::string> warnings;
    Result<FullState> state = LoadLatestFullState(checkpoints, &warnings);
    if (printer) {
      for (const std::string& w : warnings) {
        std::fprintf(stderr, "multislice train: warning: %s\n", w.c_str());
      }
    }
    if (state.ok()) {
      if (!SameModel(state->model, model_config)) {
        return InvalidArgument(
            "the checkpoint in " + ckpt_options.directory +
            " holds another model size (emb_dim " +
            std::to_string(state->model.emb_dim) + ", layers " +
            std::to_string(state->model.num_layers) + ", max_seq_len " +
            std::to_string(state->model.max_seq_len) +
            ") than this config; use another run_name");
      }
      if (state->iterator.global_rows != global_rows) {
        return InvalidArgument(
            "the checkpoint was saved with a global batch of " +
            std::to_string(state->iterator.global_rows) +
            " rows and this mesh has " + std::to_string(global_rows) +
            " (per_device_batch_size " +
            std::to_string(config.per_device_batch_size) + " x " +
            std::to_string(num_devices) +
            " devices); choose per_device_batch_size so that they match");
      }
      restored = std::move(*state);
    } else if (state.status().code() != StatusCode::kNotFound) {
      return state.status();
    }
  }
  const int64_t restored_step = restored ? restored->step : 0;
  if (restored_step > config.steps) {
    return InvalidArgument("the checkpoint is at step " +
                           std::to_string(restored_step) +
                           ", beyond steps=" + std::to_string(config.steps));
  }

  // In-memory recovery: this host's replica, when newer than the checkpoint.
  std::unique_ptr<CheckpointManager> replicas;
  std::optional<RestoredState> replica;
  if (config.enable_in_memory_recovery) {
    CheckpointOptions replica_options;
    replica_options.directory = ReplicaDirectory(config, rt.env());
    replica_options.max_to_keep = 1;
    replica_options.async = true;
    replicas = std::make_unique<CheckpointManager>(replica_options);
    Result<int64_t> latest = replicas->LatestCompleteStep();
    if (latest.ok() && *latest > restored_step && *latest <= config.steps) {
      Result<RestoredState> state = replicas->Restore(*latest, 0);
      if (state.ok()) {
        replica = std::move(*state);
      } else {
        std::fprintf(stderr,
                     "multislice train: warning: ignoring the in-memory "
                     "replica: %s\n",
                     state.status().message().c_str());
      }
    }
  }

  const double flops_per_step = StepFlopsPerDevice(config);
  const double tokens_per_step =
      static_cast<double>(global_rows) * config.max_target_length;
  Reporter reporter(options, flops_per_step, tokens_per_step, rt.env().attempt);
  if (printer) {
    std::error_code ec;
    std::filesystem::create_directories(run_dir, ec);
    if (ec) {
      return Internal(run_dir +
                      ": cannot create the run directory: " + ec.message());
    }
    if (restored) WarnOfScheduleChange(run_dir, config, restored_step);
    RETURN_IF_ERROR(WriteFileAtomically(run_dir + "/config.json",
                                        ToJson(config).dump(2) + "\n")
                        .WithContext("cannot write the run's config"));
    RETURN_IF_ERROR(reporter.Open(run_dir));
    if (!options.quiet) {
      std::printf(
          "multislice train: %s, %lld parameters, mesh %s, %d device(s), "
          "global batch %d x %d tokens, %s\n",
          run_dir.c_str(), static_cast<long long>(N),
          MeshText(rt.mesh()).c_str(), num_devices, global_rows,
          config.max_target_length,
          options.platform.empty() ? (config.dtype + " matmuls").c_str()
                                   : options.platform.c_str());
      for (const std::string& note : options.notes) {
        std::printf("multislice train: %s\n", note.c_str());
      }
      if (restored) {
        std::printf(
            "multislice train: resumed from checkpoint step %lld "
            "(saved with mesh shape %s on %d slice(s))\n",
            static_cast<long long>(restored_step),
            restored->saved_mesh.contains("shape")
                ? restored->saved_mesh["shape"].dump().c_str()
                : "?",
            restored->saved_mesh.value("num_slices", 0));
      }
      std::fflush(stdout);
    }
  }

  const std::string train_file = options.dataset_dir + "/train.bin";
  const std::string val_file = options.dataset_dir + "/val.bin";
  const std::vector<uint8_t> decay_mask =
      model::gpt::WeightDecayMask(model_config);
  // The step device 0 is in, for the out-of-memory message.
  std::atomic<int64_t> current_step{0};
  StateSaverOptions saver_options;
  saver_options.checkpoints = &checkpoints;
  saver_options.replicas = replicas.get();
  saver_options.local_count = local_count;
  saver_options.model = model_config;
  saver_options.axis_names = rt.mesh().axis_names;
  saver_options.mesh_shape = rt.mesh().shape;
  saver_options.num_slices = rt.env().num_slices;
  saver_options.row_begin =
      rt.local_devices()[0] * config.per_device_batch_size;
  saver_options.rows = local_count * config.per_device_batch_size;
  if (printer) {
    // The metrics up to a step durable before the step commits.
    saver_options.before_checkpoint = [&] { return reporter.SyncMetrics(); };
  }
  StateSaver saver(std::move(saver_options));

  auto train_on_device = [&](int local) -> Status {
    compute::SetSingleThreaded();
    const int device_id = rt.local_devices()[local];
    const bool reporter_thread = printer && local == 0;
    ASSIGN_OR_RETURN(ParallelPlan plan,
                     ParallelPlan::Create(rt.collectives(local), N));
    DeviceBuffers state = plan.Allocate();
    const int64_t begin = plan.shard_begin(), count = plan.shard_count();
    if (restored) {
      std::copy_n(restored->params.begin() + begin, count, state.shard.begin());
      std::copy_n(restored->adam_m.begin() + begin, count,
                  state.adam_m.begin());
      std::copy_n(restored->adam_v.begin() + begin, count,
                  state.adam_v.begin());
    } else {
      model::gpt::InitParameters(
          model_config, static_cast<uint64_t>(config.seed), state.weights);
      if (plan.sharded()) {
        std::copy_n(state.full.begin() + begin, count, state.shard.begin());
      }
    }
    ASSIGN_OR_RETURN(DataIterator train_data,
                     OpenData(config, train_file, global_rows, device_id, 0));
    if (restored) RETURN_IF_ERROR(train_data.Restore(restored->iterator));
    ASSIGN_OR_RETURN(DataIterator val_data,
                     OpenData(config, val_file, global_rows, device_id, 1));

    int64_t start_step = restored_step;
    bool from_replica = false;
    if (replicas) {
      ASSIGN_OR_RETURN(ReplicaRestore r,
                       RestoreFromReplicas(plan, replica ? &*replica : nullptr,
                                           restored_step, global_rows, state));
      if (r.step >= 0) {
        start_step = r.step;
        from_replica = true;
      }
      if (reporter_thread && !options.quiet && r.step >= 0) {
        std::printf(
            "multislice train: restored step %lld from the in-memory "
            "replica of data rank %d over the data axis (the newest "
            "checkpoint is step %lld)\n",
            static_cast<long long>(start_step), r.root,
            static_cast<long long>(restored_step));
        std::fflush(stdout);
      } else if (reporter_thread && r.uncovered_step >= 0) {
        std::fprintf(stderr,
                     "multislice train: warning: an in-memory replica of "
                     "step %lld does not cover every shard; restoring the "
                     "checkpoint of step %lld\n",
                     static_cast<long long>(r.uncovered_step),
                     static_cast<long long>(restored_step));
      }
    }
    if (reporter_thread) {
      reporter.LoadHistory(start_step);
      summary->restored_step =
          from_replica || restored ? start_step : int64_t{-1};
      summary->restored_from =
          from_replica ? "replica" : (restored ? "checkpoint" : "none");
      summary->first_step = start_step + 1;
      summary->last_step = start_step;
    }
    RETURN_IF_ERROR(
        AgreeOnRestoredStep(plan, restored_step, ckpt_options.directory));
    // Complete steps newer than the one restored failed to load: move them
    // aside, so that this run can save those steps again.
    if (reporter_thread && config.enable_checkpointing) {
      MoveAsideUnreadableSteps(checkpoints, ckpt_options.directory, start_step,
                               rt.env().attempt);
    }

    model::gpt::GptModel gpt(model_config, matmul_type);
    const int B = config.per_device_batch_size, T = config.max_target_length;

    auto evaluate = [&]() -> Result<double> {
      RETURN_IF_ERROR(plan.GatherWeights(state));
      float sum = 0;
      for (int k = 0; k < config.eval_batches; ++k) {
        const Batch batch = val_data.At(k);
        ASSIGN_OR_RETURN(float loss,
                         gpt.Forward(state.weights, batch.inputs.data(),
                                     batch.targets.data(), B, T));
        sum += loss;
      }
      float mean = sum / static_cast<float>(config.eval_batches * num_devices);
      RETURN_IF_ERROR(plan.ReduceOverAll(&mean, 1, "val-loss"));
      return static_cast<double>(mean);
    };
    const StateShard my_shard{begin, state.shard.data(), state.adam_m.data(),
                              state.adam_v.data(), count};
    ShardOptimizer optimizer(config, model::gpt::WeightDecayMask(model_config),
                             begin, num_devices);
    const float inv_devices = 1.0f / static_cast<float>(num_devices);
    const int64_t step_delay_ms = EnvInt("MULTISLICE_TEST_STEP_DELAY_MS");

    for (int64_t step = start_step + 1; step <= config.steps; ++step) {
      const Clock::time_point step_start = Clock::now();
      if (local == 0) current_step = step;
      const Batch batch = train_data.At(step - 1);
      RETURN_IF_ERROR(plan.GatherWeights(state));
      ASSIGN_OR_RETURN(float loss,
                       gpt.Forward(state.weights, batch.inputs.data(),
                                   batch.targets.data(), B, T));
      RETURN_IF_ERROR(plan.ReduceGradients(
          [&](const model::gpt::GptModel::GradientReady& ready, float* grads) {
            return gpt.Backward(state.weights, grads, ready);
          },
          state));
      // The mean loss and the squared norm of the summed gradient, in one
      // all-reduce (data replicas hold equal shards: each adds 1/data).
      const double sumsq = compute::SumOfSquares(state.gradient, count);
      float stats[3] = {loss * inv_devices,
                        static_cast<float>(sumsq / plan.data_size()),
                        saver.FaultFlag(local)};
      RETURN_IF_ERROR(plan.ReduceOverAll(stats, 3, "loss-and-norm"));
      if (stats[2] > 0) return saver.Stop(local, step);
      const double norm = optimizer.MeanNorm(static_cast<double>(stats[1]));
      const double lr = optimizer.Apply(step, norm, state);
      const double seconds = SecondsSince(step_start);
      RETURN_IF_ERROR(train_data.Restore([&] {
        IteratorState s = train_data.state();
        s.step = step;
        return s;
      }()));

      std::optional<double> val_loss;
      if (config.eval_interval > 0 &&
          (step % config.eval_interval == 0 || step == config.steps)) {
        ASSIGN_OR_RETURN(val_loss, evaluate());
      }
      if (reporter_thread) {
        if (step == start_step + 1) {
          summary->seconds_to_first_step = SecondsSince(start);
        }
        Status recorded =
            reporter.Step({step, stats[0], lr, norm, seconds, val_loss},
                          start_step + 1, summary);
        if (!recorded.ok()) saver.SetFault(recorded);
        if (val_loss) reporter.Plot();
      }
      if (replicas && step % config.in_memory_replica_period == 0) {
        saver.SaveReplica(local, step, my_shard, train_data.state());
      }
      if (config.enable_checkpointing &&
          (step % config.checkpoint_period == 0 || step == config.steps)) {
        saver.SaveCheckpoint(local, step, plan.data_rank() == 0, my_shard,
                             train_data.state());
      }
      if (step_delay_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms));
      }
    }
    RETURN_IF_ERROR(saver.Finish(local, config.steps));
    if (local == 0) {
      if (replicas) {
        // The run is complete and checkpointed: free the host memory.
        (void)replicas->Wait();
        std::error_code ec;
        const std::filesystem::path replica_dir =
            ReplicaDirectory(config, rt.env());
        std::filesystem::remove_all(replica_dir, ec);
        // The run's directory too, once its last worker has gone (remove()
        // leaves a non-empty directory alone).
        std::filesystem::remove(replica_dir.parent_path(), ec);
      }
    }
    if (reporter_thread) reporter.Plot();
    return OkStatus();
  };
  return rt.RunOnDevices([&](int local) {
    return CatchOutOfMemory([&] { return train_on_device(local); },
                            current_step, options);
  });
}

}  // namespace multislice::train
