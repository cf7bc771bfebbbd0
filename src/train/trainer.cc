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
#include "train/gradient_buckets.h"
#include "train/metrics.h"
#include "train/run_directory.h"
#include "train/train_state.h"

namespace multislice::train {
namespace {

using Clock = std::chrono::steady_clock;

// The smallest all-reduce of the gradient the backward pass starts (64 Ki
// floats, 256 KiB): a layer of the quickstart model is one bucket; LayerNorm
// and bias ranges join the next layer's.
constexpr int64_t kGradientBucketElements = int64_t{1} << 16;
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

// Printing and files of process 0 (device 0's thread only).
class Reporter {
 public:
  Reporter(const TrainerOptions& options, double flops_per_step, int attempt)
      : options_(options), flops_per_step_(flops_per_step), attempt_(attempt) {}

  // Opens metrics.jsonl; its earlier records give this start's resume
  // index (metrics.h) and the plot's history.
  Status Open(const std::string& run_dir) {
    ASSIGN_OR_RETURN(metrics_, MetricsWriter::Open(run_dir));
    run_dir_ = run_dir;
    auto records = MetricsWriter::ReadAll(metrics_->path());
    if (records.ok()) history_ = std::move(*records);
    resume_ = NextResumeIndex(history_);
    return OkStatus();
  }

  // Records step `step` (metrics.jsonl, the plot's points, the summary) and
  // prints its line. A metrics record that could not be written is the
  // error returned (the rest is done all the same).
  Status Step(int64_t step, int64_t first_step, double loss, double lr,
              double norm, double seconds, double tokens_per_step,
              std::optional<double> val_loss, TrainSummary* summary) {
    const double tflops = flops_per_step_ / seconds / 1e12;
    const double mfu =
        options_.peak_flops_per_device > 0
            ? flops_per_step_ / seconds / options_.peak_flops_per_device
            : 0;
    nlohmann::json record = {
        {"step", step},
        {"loss", loss},
        {"lr", lr},
        {"grad_norm", norm},
        {"step_time_s", seconds},
        {"tokens_per_s", tokens_per_step / seconds},
        {"tflops_per_device", tflops},
        {"attempt", attempt_},
        {kResumeField, resume_},
        {"time", std::chrono::duration<double>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()}};
    if (mfu > 0) record["mfu"] = mfu;
    if (val_loss) record["val_loss"] = *val_loss;
    Status written;
    if (metrics_) {
      written = metrics_->Write(record).WithContext(
          "the metrics record of step " + std::to_string(step) +
          " could not be written");
    }
    train_points_.emplace_back(step, loss);
    if (val_loss) val_points_.emplace_back(step, *val_loss);

    summary->last_step = step;
    summary->final_loss = loss;
    summary->losses.push_back(loss);
    if (val_loss) summary->final_val_loss = *val_loss;
    if (step > first_step) {
      later_seconds_ += seconds;
      later_mfu_ += mfu;
      ++later_steps_;
      summary->mean_step_seconds = later_seconds_ / later_steps_;
      summary->mean_mfu = later_mfu_ / later_steps_;
      summary->tokens_per_second = tokens_per_step / summary->mean_step_seconds;
    }
    if (step == first_step) {
      first_step_start_ =
          Clock::now() - std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(seconds));
    }
    if (!options_.quiet) {
      Print(step, first_step, loss, lr, norm, seconds, tokens_per_step,
            val_loss, tflops, mfu);
    }
    return written;
  }

  // Makes the records written so far durable (at checkpoints and at the
  // end), so that a failed write-back is reported too.
  Status SyncMetrics() {
    if (!metrics_) return OkStatus();
    return metrics_->Sync().WithContext("the metrics could not be saved");
  }

  void Print(int64_t step, int64_t first_step, double loss, double lr,
             double norm, double seconds, double tokens_per_step,
             std::optional<double> val_loss, double tflops, double mfu) {
    const TrainConfig& c = options_.config;
    const bool log = step % c.log_period == 0 || step == c.steps || val_loss;
    std::string line;
    if (log) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "step %lld/%d  loss %.4f  lr %.2e  norm %.3f  %.3f s  "
                    "%.0f tokens/s  %.3f TFLOP/s",
                    static_cast<long long>(step), c.steps, loss, lr, norm,
                    seconds, tokens_per_step / seconds, tflops);
      line = buf;
      if (mfu > 0) {
        // Above 100 %: the start-up peak was measured low; say so.
        std::snprintf(buf, sizeof buf, "  MFU %.1f%%%s", 100 * mfu,
                      mfu > 1 ? " (above the measured peak)" : "");
        line += buf;
      }
      if (val_loss) {
        std::snprintf(buf, sizeof buf, "  val_loss %.4f", *val_loss);
        line += buf;
      }
      if (!options_.show_progress && step < c.steps) {
        // Without a terminal's progress bar, each line says how long the
        // rest will take at the pace so far (evaluations and checkpoints
        // included).
        const double per_step = SecondsSince(first_step_start_) /
                                static_cast<double>(step - first_step + 1);
        line += "  ETA " +
                FormatDuration(per_step * static_cast<double>(c.steps - step));
      }
    }
    if (options_.show_progress) {
      if (!log) {
        if (SecondsSince(last_bar_) < 0.2 && step != c.steps) return;
      }
      last_bar_ = Clock::now();
      std::printf("\r\033[K%s%s%s", line.c_str(), log ? "\n" : "",
                  ProgressBar(step, c.steps, SecondsSince(start_), 30).c_str());
      if (step == c.steps) std::printf("\n");
    } else if (log) {
      std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
  }

  void Plot() {
    // No points (a finished run whose metrics.jsonl is gone): keep the plot.
    if (run_dir_.empty() || (train_points_.empty() && val_points_.empty())) {
      return;
    }
    Status s =
        WriteLossPlotSvg(run_dir_ + "/loss.svg", train_points_, val_points_,
                         "multislice train: " + options_.config.run_name);
    // The plot is redrawn from the points at the next evaluation: a failure
    // costs no data, so it is a warning and training goes on.
    if (!s.ok()) {
      std::fprintf(stderr, "multislice train: warning: %s\n",
                   s.message().c_str());
    }
  }

  // Earlier starts' points up to the step resumed from, each step's record
  // that counts (metrics.h), so the plot shows the whole run, also when
  // there is nothing left to train.
  void LoadHistory(int64_t up_to_step) {
    for (const nlohmann::json& r : CurrentStepRecords(history_)) {
      const int64_t step = r.value("step", int64_t{-1});
      if (step < 1 || step > up_to_step) continue;
      const auto x = static_cast<double>(step);
      if (r.contains("loss") && r["loss"].is_number()) {
        train_points_.emplace_back(x, r["loss"].get<double>());
      }
      if (r.contains("val_loss") && r["val_loss"].is_number()) {
        val_points_.emplace_back(x, r["val_loss"].get<double>());
      }
    }
    history_.clear();
  }

 private:
  const TrainerOptions& options_;
  const double flops_per_step_;
  const int attempt_;
  int64_t resume_ = 0;
  std::vector<nlohmann::json> history_;  // metrics.jsonl at Open
  std::optional<MetricsWriter> metrics_;
  std::string run_dir_;
  std::vector<std::pair<double, double>> train_points_, val_points_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point first_step_start_ = Clock::now();
  Clock::time_point last_bar_{};
  double later_seconds_ = 0, later_mfu_ = 0;
  int64_t later_steps_ = 0;
};

// What the device threads of one process share.
struct ProcessState {
  explicit ProcessState(int local_count) : barrier(local_count) {
    shards.resize(local_count);
  }
  std::barrier<> barrier;
  std::vector<std::optional<StateShard>> shards;  // by local index
  std::mutex mu;
  // The first failure of this process that stops the job at the next step
  // (see trainer.h), without the last good checkpoint, which is added when
  // the run stops.
  Status fault;
  // The step device 0 is in, for the out-of-memory message.
  std::atomic<int64_t> step{0};

  void SetFault(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (fault.ok()) fault = s;
  }
  Status Fault() {
    std::lock_guard<std::mutex> lock(mu);
    return fault;
  }
};

// "; the last good checkpoint is step 10" (after any save in flight).
std::string LastGoodCheckpoint(const CheckpointManager& checkpoints) {
  Result<int64_t> step = checkpoints.LatestCompleteStep();
  if (!step.ok()) return "; there is no complete checkpoint yet";
  return "; the last good checkpoint is step " + std::to_string(*step);
}

// What a device thread returns when the job stops for a process's failure
// found at step `step`: that failure with the last good checkpoint, or, in
// the processes that did not fail, kAborted.
Status StopStatus(const Status& fault, int64_t step,
                  const CheckpointManager& checkpoints) {
  if (!fault.ok()) {
    return Internal(fault.message() + LastGoodCheckpoint(checkpoints));
  }
  return Aborted("stopped at step " + std::to_string(step) +
                 ": another worker of the job failed (its message says why)");
}

// Runs a device thread's training, turning an allocation that fails into
// one sentence about memory instead of std::terminate.
Status CatchOutOfMemory(const std::function<Status()>& train,
                        const ProcessState& shared,
                        const TrainerOptions& options) {
  try {
    return train();
  } catch (const std::bad_alloc&) {
    const int64_t step = shared.step.load();
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
  Reporter reporter(options, flops_per_step, rt.env().attempt);
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
  const int data_size = [&] {
    int d = 1;
    for (size_t a = 0; a < rt.mesh().axis_names.size(); ++a) {
      if (rt.mesh().axis_names[a] == "data") d = rt.mesh().shape[a];
    }
    return d;
  }();
  ProcessState shared(local_count);
  const double tokens_per_step =
      static_cast<double>(global_rows) * config.max_target_length;

  auto train_on_device = [&](int local) -> Status {
    compute::SetSingleThreaded();
    runtime::DeviceCollectives& coll = rt.collectives(local);
    const int device_id = rt.local_devices()[local];
    ASSIGN_OR_RETURN(const runtime::AxisGroup* fsdp, coll.Group({"fsdp"}));
    ASSIGN_OR_RETURN(const runtime::AxisGroup* data, coll.Group({"data"}));
    const runtime::Axes kAll = {"data", "fsdp"};
    const comm::Segment seg =
        comm::PartitionSegment(static_cast<size_t>(N), fsdp->size, fsdp->rank);
    const auto begin = static_cast<int64_t>(seg.offset);
    const auto count = static_cast<int64_t>(seg.count);

    // With one fsdp member the shard is the whole buffer: the weights are
    // used in place and the gradient is reduced in place, without copies.
    const bool sharded = fsdp->size > 1;
    std::vector<float> full(sharded ? static_cast<size_t>(N) : 0);
    std::vector<float> grads(static_cast<size_t>(N));
    std::vector<float> shard(seg.count), adam_m(seg.count), adam_v(seg.count),
        grad_shard(sharded ? seg.count : 0);
    float* const weights = sharded ? full.data() : shard.data();
    float* const gradient = sharded ? grad_shard.data() : grads.data();
    if (restored) {
      std::copy_n(restored->params.begin() + begin, count, shard.begin());
      std::copy_n(restored->adam_m.begin() + begin, count, adam_m.begin());
      std::copy_n(restored->adam_v.begin() + begin, count, adam_v.begin());
    } else {
      model::gpt::InitParameters(model_config,
                                 static_cast<uint64_t>(config.seed), weights);
      if (sharded) std::copy_n(full.begin() + begin, count, shard.begin());
    }

    DataIteratorOptions data_options;
    data_options.token_file = train_file;
    data_options.global_rows = global_rows;
    data_options.row_begin = device_id * config.per_device_batch_size;
    data_options.rows = config.per_device_batch_size;
    data_options.seq_len = config.max_target_length;
    data_options.seed = static_cast<uint64_t>(config.seed);
    ASSIGN_OR_RETURN(DataIterator train_data,
                     DataIterator::Create(data_options));
    if (restored) RETURN_IF_ERROR(train_data.Restore(restored->iterator));
    data_options.token_file = val_file;
    data_options.seed = static_cast<uint64_t>(config.seed) + 1;
    ASSIGN_OR_RETURN(DataIterator val_data, DataIterator::Create(data_options));

    // In-memory recovery: when every shard has a data replica whose host
    // memory holds a newer step than the checkpoint, the lowest such data
    // rank broadcasts it over the data axis (DCN for a repaired slice).
    int64_t start_step = restored_step;
    bool from_replica = false;
    if (replicas) {
      const std::string at = "." + std::to_string(begin);
      const Blob* parts[3] = {nullptr, nullptr, nullptr};
      float have = -1;
      if (replica && replica->metadata.contains("iterator") &&
          replica->metadata["iterator"].value("global_rows", 0) ==
              global_rows) {
        const char* names[3] = {"params", "adam_m", "adam_v"};
        bool all = true;
        for (int i = 0; i < 3; ++i) {
          auto it = replica->blobs.find(names[i] + at);
          all = all && it != replica->blobs.end() &&
                it->second.data.size() ==
                    static_cast<size_t>(count) * sizeof(float);
          if (all) parts[i] = &it->second;
        }
        if (all) have = static_cast<float>(replica->step);
      }
      float newest = have;
      RETURN_IF_ERROR(coll.AllReduce(kAll, &newest, &newest, 1, DType::kF32,
                                     comm::ReduceOp::kMax, "replica-step")
                          .Wait());
      if (newest > static_cast<float>(restored_step)) {
        const bool mine = have == newest;
        float covered = mine ? 1.0f : 0.0f;
        RETURN_IF_ERROR(coll.AllReduce({"data"}, &covered, &covered, 1,
                                       DType::kF32, comm::ReduceOp::kMax,
                                       "replica-covered")
                            .Wait());
        RETURN_IF_ERROR(coll.AllReduce(kAll, &covered, &covered, 1, DType::kF32,
                                       comm::ReduceOp::kMin, "replica-covered")
                            .Wait());
        if (covered == 1.0f) {
          float root = mine ? static_cast<float>(data->rank) : 1e9f;
          RETURN_IF_ERROR(coll.AllReduce({"data"}, &root, &root, 1, DType::kF32,
                                         comm::ReduceOp::kMin, "replica-root")
                              .Wait());
          std::vector<float>* targets[3] = {&shard, &adam_m, &adam_v};
          for (int i = 0; i < 3; ++i) {
            if (mine) {
              std::memcpy(targets[i]->data(), parts[i]->data.data(),
                          parts[i]->data.size());
            }
            RETURN_IF_ERROR(coll.Broadcast({"data"}, static_cast<int>(root),
                                           targets[i]->data(), seg.count,
                                           DType::kF32, "replica-state")
                                .Wait());
          }
          start_step = static_cast<int64_t>(newest);
          from_replica = true;
          if (printer && local == 0 && !options.quiet) {
            std::printf(
                "multislice train: restored step %lld from the in-memory "
                "replica of data rank %d over the data axis (the newest "
                "checkpoint is step %lld)\n",
                static_cast<long long>(start_step), static_cast<int>(root),
                static_cast<long long>(restored_step));
            std::fflush(stdout);
          }
        } else if (printer && local == 0) {
          std::fprintf(stderr,
                       "multislice train: warning: an in-memory replica of "
                       "step %lld does not cover every shard; restoring the "
                       "checkpoint of step %lld\n",
                       static_cast<long long>(newest),
                       static_cast<long long>(restored_step));
        }
      }
    }
    if (printer && local == 0) {
      reporter.LoadHistory(start_step);
      summary->restored_step =
          from_replica || restored ? start_step : int64_t{-1};
      summary->restored_from =
          from_replica ? "replica" : (restored ? "checkpoint" : "none");
      summary->first_step = start_step + 1;
      summary->last_step = start_step;
    }

    const bool reporter_thread_for_cleanup =
        printer && local == 0 && config.enable_checkpointing;
    // Every device must agree on the step it resumes from.
    {
      float agreed[2] = {static_cast<float>(restored_step),
                         -static_cast<float>(restored_step)};
      RETURN_IF_ERROR(coll.AllReduce(kAll, agreed, agreed, 2, DType::kF32,
                                     comm::ReduceOp::kMin, "resume-step")
                          .Wait());
      if (agreed[0] != -agreed[1]) {
        return FailedPrecondition(
            "hosts restored different checkpoint steps (" +
            std::to_string(-agreed[1]) + " and " + std::to_string(agreed[0]) +
            "); check that every host sees the same checkpoint directory " +
            ckpt_options.directory);
      }
    }

    // Complete steps newer than the one restored failed to load: move them
    // aside, so that this run can save those steps again.
    if (reporter_thread_for_cleanup) {
      MoveAsideUnreadableSteps(checkpoints, ckpt_options.directory, start_step,
                               rt.env().attempt);
    }

    model::gpt::GptModel gpt(model_config, matmul_type);
    const int B = config.per_device_batch_size, T = config.max_target_length;
    const bool reporter_thread = printer && local == 0;

    auto gather_weights = [&]() -> Status {
      if (!sharded) return OkStatus();
      return coll
          .AllGather({"fsdp"}, shard.data(), full.data(),
                     static_cast<size_t>(N), DType::kF32, "weights")
          .Wait();
    };
    auto evaluate = [&]() -> Result<double> {
      RETURN_IF_ERROR(gather_weights());
      float sum = 0;
      for (int k = 0; k < config.eval_batches; ++k) {
        const Batch batch = val_data.At(k);
        ASSIGN_OR_RETURN(float loss, gpt.Forward(weights, batch.inputs.data(),
                                                 batch.targets.data(), B, T));
        sum += loss;
      }
      float mean = sum / static_cast<float>(config.eval_batches * num_devices);
      RETURN_IF_ERROR(coll.AllReduce(kAll, &mean, &mean, 1, DType::kF32,
                                     comm::ReduceOp::kSum, "val-loss")
                          .Wait());
      return static_cast<double>(mean);
    };
    // A save that fails, at once (sync) or later in the writer (async, see
    // the poll below), is this process's fault: the job stops at the next
    // step. A process with a fault already abstains, so that the step is
    // not committed.
    auto save = [&](int64_t step) {
      if (data->rank == 0) {
        shared.shards[local] = StateShard{begin, shard.data(), adam_m.data(),
                                          adam_v.data(), count};
      }
      shared.barrier.arrive_and_wait();
      if (local == 0) {
        std::vector<StateShard> mine;
        for (auto& s : shared.shards) {
          if (s) mine.push_back(*s);
          s.reset();
        }
        IteratorState iterator = train_data.state();
        iterator.row_begin = rt.local_devices()[0] * B;
        iterator.rows = local_count * B;
        // The metrics up to this step durable before the step commits.
        if (reporter_thread && shared.Fault().ok()) {
          if (Status s = reporter.SyncMetrics(); !s.ok()) shared.SetFault(s);
        }
        const Status fault = shared.Fault();
        Status s =
            fault.ok()
                ? checkpoints.Save(
                      step, ShardBlobs(mine),
                      StateMetadata(step, model_config, rt.mesh().axis_names,
                                    rt.mesh().shape, rt.env().num_slices, mine,
                                    iterator))
                : checkpoints.Abstain(step, fault);
        if (!s.ok()) shared.SetFault(s);
      }
      shared.barrier.arrive_and_wait();  // the copy is done: go on training
    };

    auto save_replica = [&](int64_t step) {
      shared.shards[local] =
          StateShard{begin, shard.data(), adam_m.data(), adam_v.data(), count};
      shared.barrier.arrive_and_wait();
      if (local == 0) {
        std::vector<StateShard> all;
        for (auto& s : shared.shards) {
          all.push_back(*s);
          s.reset();
        }
        IteratorState iterator = train_data.state();
        iterator.row_begin = rt.local_devices()[0] * B;
        iterator.rows = local_count * B;
        Status s = replicas->Save(
            step, ShardBlobs(all),
            StateMetadata(step, model_config, rt.mesh().axis_names,
                          rt.mesh().shape, rt.env().num_slices, all, iterator));
        if (!s.ok()) shared.SetFault(s.WithContext("in-memory replica"));
      }
      shared.barrier.arrive_and_wait();
    };

    // Device 0's share of the step's failure flag: a background save that
    // has failed since the last step, or any other fault of this process.
    auto fault_flag = [&]() -> float {
      if (local != 0) return 0.0f;
      if (Status s = checkpoints.Poll(); !s.ok()) shared.SetFault(s);
      if (replicas) {
        if (Status s = replicas->Poll(); !s.ok()) {
          shared.SetFault(s.WithContext("in-memory replica"));
        }
      }
      return shared.Fault().ok() ? 0.0f : 1.0f;
    };
    // Every device of the job gets here at the same step (the flag is in
    // the step's all-reduce); a save still in flight may finish first.
    auto stop = [&](int64_t step) -> Status {
      if (local == 0) {
        if (Status s = checkpoints.Wait(); !s.ok()) shared.SetFault(s);
      }
      shared.barrier.arrive_and_wait();
      return StopStatus(shared.Fault(), step, checkpoints);
    };

    // The backward pass and the sum of the gradient over data (and its
    // reduce-scatter over fsdp). Unsharded, each bucket's all-reduce starts
    // once the backward has finished its layers, so the DCN transfer of the
    // last layers overlaps the backward of the first ones. Sharded, the
    // reduce-scatter needs the whole gradient first (the shards are
    // contiguous ranges of the flat buffer), so nothing overlaps yet.
    auto reduce_gradients = [&]() -> Status {
      if (!sharded && data->size == 1) {
        return gpt.Backward(weights, grads.data());
      }
      if (!sharded) {
        GradientBuckets buckets(coll, {"data"}, grads.data(),
                                kGradientBucketElements);
        RETURN_IF_ERROR(
            gpt.Backward(weights, grads.data(),
                         [&](int64_t o, int64_t c) { buckets.Ready(o, c); }));
        return buckets.Finish();
      }
      RETURN_IF_ERROR(gpt.Backward(weights, grads.data()));  // writes all
      runtime::CollectiveHandle scatter = coll.ReduceScatter(
          {"fsdp"}, grads.data(), grad_shard.data(), static_cast<size_t>(N),
          DType::kF32, comm::ReduceOp::kSum, "grads");
      runtime::CollectiveHandle reduce =
          coll.AllReduce({"data"}, gradient, gradient, seg.count, DType::kF32,
                         comm::ReduceOp::kSum, "grads", scatter);
      RETURN_IF_ERROR(scatter.Wait());
      return reduce.Wait();
    };

    compute::AdamWOptions adam;
    adam.beta1 = static_cast<float>(config.adam_b1);
    adam.beta2 = static_cast<float>(config.adam_b2);
    adam.eps = static_cast<float>(config.adam_eps);
    adam.weight_decay = static_cast<float>(config.adam_weight_decay);
    const float inv_devices = 1.0f / static_cast<float>(num_devices);
    const int64_t step_delay_ms = EnvInt("MULTISLICE_TEST_STEP_DELAY_MS");

    for (int64_t step = start_step + 1; step <= config.steps; ++step) {
      const Clock::time_point step_start = Clock::now();
      if (local == 0) shared.step = step;
      const Batch batch = train_data.At(step - 1);
      RETURN_IF_ERROR(gather_weights());
      ASSIGN_OR_RETURN(float loss, gpt.Forward(weights, batch.inputs.data(),
                                               batch.targets.data(), B, T));
      RETURN_IF_ERROR(reduce_gradients());
      // The mean loss and the squared norm of the summed gradient, in one
      // all-reduce (data replicas hold equal shards: each adds 1/data).
      const double sumsq = compute::SumOfSquares(gradient, count);
      float stats[3] = {loss * inv_devices,
                        static_cast<float>(sumsq / data_size), fault_flag()};
      RETURN_IF_ERROR(coll.AllReduce(kAll, stats, stats, 3, DType::kF32,
                                     comm::ReduceOp::kSum, "loss-and-norm")
                          .Wait());
      if (stats[2] > 0) return stop(step);
      const double norm = std::sqrt(static_cast<double>(stats[1])) *
                          static_cast<double>(inv_devices);
      // The clipped mean gradient, scaled inside the AdamW pass.
      adam.grad_scale =
          model::ClipScale(
              norm, static_cast<float>(config.gradient_clipping_threshold)) *
          inv_devices;
      const double lr = model::LearningRate(
          step, config.steps, config.warmup_steps, config.learning_rate,
          config.cosine_learning_rate_final_fraction);
      adam.lr = static_cast<float>(lr);
      compute::AdamWUpdate(shard.data(), gradient, adam_m.data(), adam_v.data(),
                           count, adam, step, decay_mask.data() + begin);
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
            reporter.Step(step, start_step + 1, stats[0], lr, norm, seconds,
                          tokens_per_step, val_loss, summary);
        if (!recorded.ok()) shared.SetFault(recorded);
        if (val_loss) reporter.Plot();
      }
      if (replicas && step % config.in_memory_replica_period == 0) {
        save_replica(step);
      }
      if (config.enable_checkpointing &&
          (step % config.checkpoint_period == 0 || step == config.steps)) {
        save(step);
      }
      if (step_delay_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms));
      }
    }
    if (local == 0) {
      // The last step's failures have no next step to stop at.
      if (Status s = checkpoints.Wait(); !s.ok()) shared.SetFault(s);
      if (reporter_thread && shared.Fault().ok()) {
        if (Status s = reporter.SyncMetrics(); !s.ok()) shared.SetFault(s);
      }
      if (Status fault = shared.Fault(); !fault.ok()) {
        return StopStatus(fault, config.steps, checkpoints);
      }
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
    return CatchOutOfMemory([&] { return train_on_device(local); }, shared,
                            options);
  });
}

}  // namespace multislice::train
