// `multislice train CONFIG.yml key=value ...`: the GPT-2 trainer of
// train/trainer.h, MaxText style. On a plain machine it launches the slices
// as local worker processes; started by an agent (the worker variables set)
// it is one worker of a multi-host job.
//
// Before anything big is allocated, the memory the configuration needs is
// checked against what the host has (train/memory.h): by the launcher of
// local slices for all of them together, and by every worker for itself.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>

#include "bench/peak.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/platform.h"
#include "compute/matmul.h"
#include "model/tensor_shard.h"
#include "runtime/launcher.h"
#include "runtime/runtime.h"
#include "runtime/slurm_env.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/data.h"
#include "train/dataset.h"
#include "train/memory.h"
#include "train/run_directory.h"
#include "train/trainer.h"

namespace multislice::cli {
namespace {

constexpr char kName[] = "multislice train";

struct TrainFlags {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string accelerator_type;
  int num_slices = 0;  // 0: from the config's dcn_* values
  int timeout_seconds = 60;
  bool json = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "%s: %s\n", kName, s.message().c_str());
  return ExitCodeFor(s);
}

mesh::ParallelismConfig Parallelism(const TrainConfig& c) {
  mesh::ParallelismConfig p;
  p.ici = {c.ici_diloco_parallelism, c.ici_data_parallelism,
           c.ici_pipeline_parallelism, c.ici_fsdp_parallelism,
           c.ici_tensor_parallelism};
  p.dcn = {c.dcn_diloco_parallelism, c.dcn_data_parallelism,
           c.dcn_pipeline_parallelism, c.dcn_fsdp_parallelism,
           c.dcn_tensor_parallelism};
  return p;
}

// A device thread's failure ends the worker at once (no other device thread
// is left waiting on a dead peer) with the trainer's sentence as it is.
void ExitOnDeviceError(const Status& s) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s\n", kName, s.message().c_str());
  std::fflush(stderr);
  ::_exit(ExitCodeFor(s));
}

double UnixSeconds() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t FileBytes(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<uint64_t>(size);
}

// What one worker process holds: `local_devices` of `devices`, an fsdp axis
// of `fsdp` and a tensor axis of `tensor`, the dataset in `dataset_dir`.
train::WorkerShape ShapeOf(const TrainConfig& config, int local_devices,
                           int devices, int fsdp, int tensor, int stages,
                           const std::string& dataset_dir) {
  train::WorkerShape shape;
  shape.local_devices = local_devices;
  shape.devices = devices;
  shape.fsdp = fsdp;
  shape.tensor = tensor;
  shape.stages = stages;
  if (config.enable_checkpointing) {
    CheckpointOptions options;
    options.directory = train::CheckpointDirectory(config);
    shape.restoring = CheckpointManager(options).LatestCompleteStep().ok();
  }
  shape.dataset_bytes = FileBytes(dataset_dir + "/train.bin") +
                        FileBytes(dataset_dir + "/val.bin");
  shape.bf16_via_f32 =
      compute::ActiveBf16Route() == compute::Bf16Route::kViaF32;
  return shape;
}

// The estimate for `processes` workers of `shape` against the host's
// available memory; kInvalidArgument (one sentence) when it does not fit.
// `note` gets both in words, for a later out-of-memory message.
Status CheckMemory(const TrainConfig& config, const train::WorkerShape& shape,
                   int processes, train::MemoryEstimate* estimate,
                   std::string* note) {
  *estimate = train::EstimateWorkerMemory(config, shape);
  ASSIGN_OR_RETURN(train::AvailableMemory available,
                   train::AvailableHostMemory(train::SystemMemorySources()));
  *note = "this configuration needs " +
          train::DescribeEstimate(*estimate, processes) + " and " +
          train::FormatBytes(available.bytes) + " was available at start (" +
          available.source + ")";
  return train::CheckHostMemory(*estimate, processes, available);
}

// Refuses a dataset the model cannot train on: a vocabulary beyond
// vocab_size (the embedding must hold every token id), and with
// tokenizer_path set, a dataset tokenized otherwise. `checksum` is
// tokenizer_path's ("" when it is empty); `what` names the dataset.
Status CheckDataset(const TrainConfig& c, const std::string& dir,
                    const std::string& checksum, const std::string& what) {
  const std::string redo =
      "; prepare it again with multislice data prepare "
      "--tokenizer " +
      c.tokenizer_path + " --output " + dir;
  auto info = train::ReadDatasetInfo(dir);
  if (!info.ok() && info.status().code() != StatusCode::kNotFound) {
    return info.status();
  }
  if (!checksum.empty() && (!info.ok() || info->byte_level())) {
    return InvalidArgument(what +
                           " holds byte-level tokens, not tokens of "
                           "tokenizer_path '" +
                           c.tokenizer_path + "'" + redo);
  }
  if (!checksum.empty() && info->tokenizer_checksum != checksum) {
    return InvalidArgument(
        what + " was tokenized with another SentencePiece model (" +
        info->tokenizer_checksum + ") than tokenizer_path '" +
        c.tokenizer_path + "' (" + checksum + ")" + redo);
  }
  for (const char* file : {"train.bin", "val.bin"}) {
    ASSIGN_OR_RETURN(train::TokenFileHeader header,
                     train::ReadTokenFileHeader(dir + "/" + file));
    if (header.vocab_size > static_cast<uint32_t>(c.vocab_size)) {
      return InvalidArgument(
          what + " has a vocabulary of " + std::to_string(header.vocab_size) +
          " tokens (" + file + ") but vocab_size is " +
          std::to_string(c.vocab_size) +
          ": the model's embedding must hold every token id; set "
          "vocab_size=" +
          std::to_string(header.vocab_size) + " or more");
    }
  }
  return OkStatus();
}

// The summary's validation loss, or that there was none (eval_interval <= 0,
// MaxText's -1, or a run shorter than it).
std::string ValLossText(const train::TrainSummary& summary) {
  if (summary.final_val_loss < 0) return "no evaluation";
  char text[64];
  std::snprintf(text, sizeof text, "val_loss %.4f", summary.final_val_loss);
  return text;
}

// The prepared dataset the config names, or the default fortunes corpus,
// prepared on first use under base_output_directory/datasets/ (fortunes, or
// fortunes-<checksum> with tokenizer_path: train::DefaultDatasetDirectory),
// checked by CheckDataset.
Result<std::string> DatasetDirectory(const TrainConfig& c) {
  std::string checksum;
  if (!c.tokenizer_path.empty()) {
    auto tokenizer = train::SentencePieceTokenizer::Load(c.tokenizer_path);
    if (!tokenizer.ok()) {
      return InvalidArgument("tokenizer_path: " + tokenizer.status().message());
    }
    checksum = train::TokenizerChecksum((*tokenizer)->serialized());
  }
  if (!c.dataset_path.empty()) {
    for (const char* file : {"/train.bin", "/val.bin"}) {
      if (!std::filesystem::exists(c.dataset_path + file)) {
        return InvalidArgument("dataset_path: '" + c.dataset_path +
                               "' has no " + (file + 1) +
                               "; prepare it with multislice data prepare "
                               "--output " +
                               c.dataset_path);
      }
    }
    RETURN_IF_ERROR(CheckDataset(c, c.dataset_path, checksum,
                                 "dataset_path: '" + c.dataset_path + "'"));
    return c.dataset_path;
  }
  const std::string dir =
      train::DefaultDatasetDirectory(c.base_output_directory, checksum);
  const std::string what =
      "dataset_path is empty and the default dataset '" + dir + "'";
  if (train::DatasetIsComplete(dir)) {
    RETURN_IF_ERROR(CheckDataset(c, dir, checksum, what));
    return dir;
  }
  if (!std::filesystem::exists(train::kDefaultCorpus)) {
    return InvalidArgument(
        std::string("dataset_path is empty and the default corpus ") +
        train::kDefaultCorpus +
        " is missing; install Debian's fortunes package (scripts/"
        "install_deps.sh does) or set dataset_path");
  }
  // Every worker may get here at once: each stages its own files and
  // renames them, with identical content, so the race is harmless.
  train::PrepareOptions prepare;
  prepare.inputs = {train::kDefaultCorpus};
  prepare.output_dir = dir;
  prepare.tokenizer_path = c.tokenizer_path;
  prepare.add_bos = c.add_bos;
  prepare.add_eos = c.add_eos;
  RETURN_IF_ERROR(train::PrepareDataset(prepare, nullptr));
  RETURN_IF_ERROR(CheckDataset(c, dir, checksum, what));
  return dir;
}

int AxisSize(const mesh::DeviceMesh& mesh, const std::string& axis) {
  for (size_t a = 0; a < mesh.axis_names.size(); ++a) {
    if (mesh.axis_names[a] == axis) return mesh.shape[a];
  }
  return 1;
}

int ProcessCount(const runtime::WorkerEnv& env) {
  return env.num_slices * static_cast<int>(env.worker_hostnames.size());
}

// Process 0 of the job (slice 0 worker 0, the one that writes the run
// directory's files) holds its lock until it exits (train/run_directory.h);
// the other workers share the directory. An earlier attempt of the same job
// still stopping is waited for as long as a peer would be.
Result<std::optional<train::RunDirectoryLock>> LockRunDirectory(
    const TrainConfig& config, const runtime::WorkerEnv& env,
    const TrainFlags& flags) {
  if (env.slice_id != 0 || env.worker_id != 0) {
    return std::optional<train::RunDirectoryLock>();
  }
  ASSIGN_OR_RETURN(train::RunDirectoryLock lock,
                   train::RunDirectoryLock::Acquire(
                       RunDirectory(config), {env.run_id, env.attempt},
                       std::chrono::seconds(flags.timeout_seconds)));
  return std::optional<train::RunDirectoryLock>(std::move(lock));
}

int RunWorkerBody(const TrainConfig& config, const runtime::WorkerEnv& env,
                  const TrainFlags& flags) {
  auto lock = LockRunDirectory(config, env, flags);
  if (!lock.ok()) return Fail(lock.status());
  runtime::RuntimeOptions options;
  options.env = env;
  options.parallelism = Parallelism(config);
  options.timeout = std::chrono::seconds(flags.timeout_seconds);
  options.on_device_error = ExitOnDeviceError;
  // Goodput's TPU_INITIALIZATION: the runtime's start-up and the peak below.
  const double runtime_start_time = UnixSeconds();
  const auto runtime_start = std::chrono::steady_clock::now();
  auto rt_or = runtime::Runtime::Create(options);
  if (!rt_or.ok()) return Fail(rt_or.status());
  const std::chrono::duration<double> runtime_seconds =
      std::chrono::steady_clock::now() - runtime_start;
  runtime::Runtime& rt = **rt_or;
  auto dataset = DatasetDirectory(config);
  if (!dataset.ok()) return Fail(dataset.status());

  train::TrainerOptions trainer;
  train::MemoryEstimate memory;
  const train::WorkerShape shape = ShapeOf(
      config, static_cast<int>(rt.local_devices().size()),
      static_cast<int>(rt.devices().size()), AxisSize(rt.mesh(), "fsdp"),
      AxisSize(rt.mesh(), "tensor"), AxisSize(rt.mesh(), "stage"), *dataset);
  if (Status s = CheckMemory(config, shape, 1, &memory, &trainer.memory_note);
      !s.ok()) {
    return Fail(s);
  }
  trainer.config = config;
  trainer.dataset_dir = *dataset;
  trainer.platform = PlatformText(MatmulDType(config));
  const bool dtype_explicit = std::any_of(
      flags.overrides.begin(), flags.overrides.end(),
      [](const std::string& o) { return o.rfind("dtype=", 0) == 0; });
  trainer.notes = PlatformNotes(MatmulDType(config), dtype_explicit);
  trainer.show_progress = !flags.json && runtime::ShowProgress();
  trainer.quiet = flags.json;
  // MFU is against the measured matmul peak of one device while every device
  // of this host measures at once (`multislice peak` reports the same).
  const auto peak_start = std::chrono::steady_clock::now();
  const compute::GemmDesc square{.m = 2048,
                                 .n = 2048,
                                 .k = 2048,
                                 .ab_type = MatmulDType(config),
                                 .c_type = DType::kF32};
  auto peak = bench::MeasureConcurrentMatmulPeak(
      square, 3, static_cast<int>(rt.local_devices().size()),
      bench::PeakTime::kStartup);
  if (!peak.ok()) return Fail(peak.status());
  trainer.peak_flops_per_device = peak->median_gflops * 1e9;
  const std::chrono::duration<double> peak_seconds =
      std::chrono::steady_clock::now() - peak_start;
  trainer.runtime_start_time = runtime_start_time;
  trainer.runtime_init_seconds = (runtime_seconds + peak_seconds).count();

  train::TrainSummary summary;
  Status s = train::RunTrainer(rt, trainer, &summary);
  if (!s.ok()) return Fail(s);
  if (rt.process_index() != 0) return 0;
  if (flags.json) {
    nlohmann::json out = {
        {"run_directory", RunDirectory(config)},
        {"restored_step", summary.restored_step},
        {"restored_from", summary.restored_from},
        {"first_step", summary.first_step},
        {"last_step", summary.last_step},
        {"final_loss", summary.final_loss},
        {"final_val_loss", summary.final_val_loss},
        {"mean_step_time_s", summary.mean_step_seconds},
        {"tokens_per_s", summary.tokens_per_second},
        {"mean_mfu", summary.mean_mfu},
        {"peak_tflops_per_device", trainer.peak_flops_per_device / 1e12},
        {"step_tflop_per_device", train::StepFlopsPerDevice(config) / 1e12},
        {"seconds_to_first_step", summary.seconds_to_first_step},
        {"losses", summary.losses},
        {"platform", PlatformJson(MatmulDType(config))},
        {"memory_estimate_bytes", memory.total()},
    };
    std::printf("%s\n", out.dump().c_str());
  } else if (summary.last_step >= summary.first_step &&
             summary.mean_step_seconds <= 0) {
    // Too few steps for a steady-state figure (the first step of a run is
    // start-up, not counted in the means).
    std::printf(
        "multislice train: done, steps %lld-%lld, loss %.4f, %s "
        "(too few steps for step-time, throughput and MFU figures: the "
        "first step of a run is start-up), first step %.2f s after start; "
        "%s\n",
        static_cast<long long>(summary.first_step),
        static_cast<long long>(summary.last_step), summary.final_loss,
        ValLossText(summary).c_str(), summary.seconds_to_first_step,
        RunDirectory(config).c_str());
  } else if (summary.last_step >= summary.first_step) {
    std::printf(
        "multislice train: done, steps %lld-%lld, loss %.4f, %s, "
        "%.3f s/step, %.0f tokens/s, MFU %.1f%% of %.3f TFLOP/s per device "
        "(%s), first step %.2f s after start; %s\n",
        static_cast<long long>(summary.first_step),
        static_cast<long long>(summary.last_step), summary.final_loss,
        ValLossText(summary).c_str(), summary.mean_step_seconds,
        summary.tokens_per_second, 100 * summary.mean_mfu,
        trainer.peak_flops_per_device / 1e12,
        compute::MatmulRouteName(MatmulDType(config)).c_str(),
        summary.seconds_to_first_step, RunDirectory(config).c_str());
  } else {
    std::printf(
        "multislice train: nothing to do, the checkpoint is at step "
        "%lld of %d; %s\n",
        static_cast<long long>(summary.restored_step), config.steps,
        RunDirectory(config).c_str());
  }
  return 0;
}

// RunWorkerBody, with an allocation that fails outside the device threads
// (the restore, the start-up measurement) as one sentence too.
int RunWorker(const TrainConfig& config, const runtime::WorkerEnv& env,
              const TrainFlags& flags) {
  try {
    return RunWorkerBody(config, env, flags);
  } catch (const std::bad_alloc&) {
    return Fail(Internal(
        "out of memory (an allocation failed before training); lower "
        "per_device_batch_size or max_target_length, or free memory on the "
        "host"));
  }
}

// An empty run_name: a name chosen once here (train/run_directory.h) and
// handed to every local worker; the launcher says which, with the command
// that resumes the run, since the same command again would pick another.
Status NameTheRun(const std::optional<runtime::WorkerEnv>& env,
                  const TrainFlags& flags, TrainConfig& config,
                  std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(train::DefaultRunName chosen,
                   train::ChooseRunName(runtime::ProcessEnvironment(),
                                        !env || ProcessCount(*env) == 1));
  config.run_name = chosen.name;
  argv.push_back("run_name=" + config.run_name);
  RETURN_IF_ERROR(ValidateTrainConfig(config));
  if (env) return OkStatus();
  std::fprintf(flags.json ? stderr : stdout,
               "%s: run_name is empty, so this run is named %s (%s); resume "
               "it with: %s\n",
               kName, config.run_name.c_str(),
               chosen.source == "timestamp" ? "a timestamp"
                                            : ("from " + chosen.source).c_str(),
               train::ShellCommand(argv).c_str());
  std::fflush(flags.json ? stderr : stdout);
  return OkStatus();
}

// A local job stopped by a signal (Ctrl-C, SIGTERM, a killed worker): the
// newest committed checkpoint and the command that resumes from it.
void PrintResumeHint(const TrainConfig& config, int exit_code,
                     const std::vector<std::string>& argv) {
  if (exit_code < 128) return;
  const int sig = exit_code - 128;
  const std::string what = sig == SIGINT    ? "interrupted (Ctrl-C)"
                           : sig == SIGTERM ? "stopped (SIGTERM)"
                                            : "stopped (a worker got signal " +
                                                  std::to_string(sig) + ": " +
                                                  strsignal(sig) + ")";
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s\n", kName,
               train::ResumeHint(config, what, argv).c_str());
}

int Run(const TrainFlags& flags) {
  auto config_or = LoadTrainConfig(flags.config_path, flags.overrides);
  if (!config_or.ok()) return Fail(config_or.status());
  TrainConfig config = *config_or;
  std::vector<std::string> argv = CommandLine();
  const runtime::EnvLookup lookup = runtime::ProcessEnvironment();
  // A task of a Slurm step without MEGASCALE_*: RunLocalJob forms its worker
  // environment from Slurm's variables once the mesh is known.
  const bool slurm_task =
      runtime::InSlurmStep(lookup) && !lookup("MEGASCALE_SLICE_ID");
  auto env = slurm_task ? Result<std::optional<runtime::WorkerEnv>>(
                              std::optional<runtime::WorkerEnv>())
                        : runtime::ReadWorkerEnv(lookup);
  if (!env.ok()) return Fail(env.status());
  if (Status s = ValidateTrainConfig(config); !s.ok()) return Fail(s);
  if (config.run_name.empty()) {
    if (Status s = NameTheRun(*env, flags, config, argv); !s.ok()) {
      return Fail(s);
    }
  }
  if (flags.timeout_seconds < 1) {
    return Fail(InvalidArgument("--timeout_seconds: expected at least 1, got " +
                                std::to_string(flags.timeout_seconds)));
  }

  if (env->has_value()) {
    // One worker of a job someone else launched (an agent, or by hand).
    return RunWorker(config, **env, flags);
  }

  // The local default: check everything before starting any worker.
  const mesh::ParallelismConfig parallelism = Parallelism(config);
  if (Status s = mesh::CheckParallelismValues(parallelism); !s.ok()) {
    return Fail(s);
  }
  int num_slices = flags.num_slices;
  if (num_slices == 0) {
    num_slices = 1;
    for (int v : parallelism.dcn) {
      if (v < 0) {
        num_slices = 2;  // the local default: two slices
        break;
      }
      num_slices *= v;
    }
  }
  if (num_slices < 1) {
    return Fail(InvalidArgument("--num_slices: expected at least 1, got " +
                                std::to_string(num_slices)));
  }
  std::string accelerator_type = flags.accelerator_type;
  if (accelerator_type.empty()) {
    int ici_product = 1;
    for (int v : parallelism.ici) ici_product *= v < 0 ? 1 : v;
    accelerator_type = "cpu-" + std::to_string(ici_product);
  }
  auto type = mesh::ParseAcceleratorType(accelerator_type);
  if (!type.ok()) return Fail(type.status());
  auto resolved = mesh::ResolveParallelism(
      parallelism, type->devices_per_slice(), num_slices);
  if (!resolved.ok()) return Fail(resolved.status());
  if (Status s = model::ValidateTensorParallelism(
          train::DecoderConfigOf(config), resolved->size(mesh::kTensor));
      !s.ok()) {
    return Fail(InvalidArgument("keys ici_tensor_parallelism (" +
                                std::to_string(resolved->ici[mesh::kTensor]) +
                                ") x dcn_tensor_parallelism (" +
                                std::to_string(resolved->dcn[mesh::kTensor]) +
                                "): " + s.message()));
  }
  // The pipeline and DiLoCo check again with the -1 axes filled.
  if (Status s = CheckPipelineSplit(config, resolved->ici[mesh::kStage],
                                    resolved->dcn[mesh::kStage],
                                    resolved->size(mesh::kTensor));
      !s.ok()) {
    return Fail(s);
  }
  if (Status s = CheckDilocoReplicas(config, resolved->ici[mesh::kDiloco],
                                     resolved->dcn[mesh::kDiloco]);
      !s.ok()) {
    return Fail(s);
  }
  if (Status s = CheckLosableSlices(config, resolved->ici[mesh::kDiloco],
                                    resolved->dcn[mesh::kDiloco], num_slices);
      !s.ok()) {
    return Fail(s);
  }
  // A second training of this run directory is refused before any worker
  // starts (worker 0 takes the lock itself: see LockRunDirectory). Not in a
  // Slurm task: its peers are workers of the same run, and task 0's worker
  // may hold the lock already (the probe would also take it for a moment,
  // failing task 0's own Acquire).
  if (Status s = slurm_task
                     ? OkStatus()
                     : train::RunDirectoryLock::CheckFree(RunDirectory(config));
      !s.ok()) {
    return Fail(s);
  }
  auto dataset = DatasetDirectory(config);
  if (!dataset.ok()) return Fail(dataset.status());
  // Every slice is a process of this machine: all of them must fit (a
  // Slurm task is one host: the worker checks its own share).
  const int devices_per_slice = type->devices_per_slice();
  const train::WorkerShape shape =
      ShapeOf(config, devices_per_slice, devices_per_slice * num_slices,
              resolved->size(mesh::kFsdp), resolved->size(mesh::kTensor),
              resolved->size(mesh::kStage), *dataset);
  train::MemoryEstimate memory;
  std::string note;
  if (Status s = slurm_task
                     ? OkStatus()
                     : CheckMemory(config, shape, num_slices, &memory, &note);
      !s.ok()) {
    return Fail(s);
  }

  runtime::LocalJobOptions job;
  job.num_slices = num_slices;
  job.accelerator_type = accelerator_type;
  job.argv = argv;
  job.raw_stdout_of_first_worker = true;
  job.continue_without_lost_slices = config.diloco_continue_on_failure;
  job.slice_restarts = config.diloco_max_slice_restarts;
  const int code =
      runtime::RunLocalJob(job, [&](const runtime::WorkerEnv& worker_env) {
        return RunWorker(config, worker_env, flags);
      });
  PrintResumeHint(config, code, argv);
  return code;
}

}  // namespace

void AddTrainCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "train",
      "Train a GPT-2 style byte-level language model across slices, "
      "MaxText style: a YAML config overridden by key=value arguments.");
  cmd->footer(
      "Writes base_output_directory/run_name/: config.json, metrics.jsonl, "
      "loss.svg and checkpoints/. Running the same command again resumes "
      "from the newest complete checkpoint, on any mesh (Ctrl-C prints that "
      "checkpoint and the command; an empty run_name is named once and "
      "printed). One training per run directory: worker 0 holds a lock on "
      "run_name/train.lock, and a second training is refused (exit 1). A "
      "checkpoint or "
      "metrics write that fails (a full disk) stops the run at the next step "
      "(exit 1). A configuration whose memory estimate exceeds what the host "
      "has available is refused (exit 2); MULTISLICE_MEMORY_LIMIT_BYTES "
      "overrides the memory available.\n"
      "On one machine the slices are local worker processes: their number "
      "is the product of the dcn_* values (2 when one is -1, or "
      "--num_slices).\n"
      "Examples:\n"
      "  multislice train configs/quickstart.yml\n"
      "  multislice train configs/base.yml run_name=demo steps=100\n"
      "  multislice train configs/base.yml run_name=demo dtype=float32 "
      "ici_fsdp_parallelism=2 --accelerator_type cpu-2 --num_slices 1\n"
      "  multislice generate runs/demo --prompt 'The meaning of life'\n\n"
      "Config keys:\n" +
      DescribeTrainConfigKeys());
  auto flags = std::make_shared<TrainFlags>();
  cmd->add_option("config", flags->config_path, "The YAML config file.")
      ->required();
  cmd->add_option("overrides", flags->overrides,
                  "key=value overrides, applied in order.");
  AddStringFlag(cmd, "accelerator_type", &flags->accelerator_type,
                "Devices per slice, cpu-N (default: N = the product of the "
                "ici_* values, -1 counting as 1).");
  AddIntFlag(cmd, "num_slices", &flags->num_slices,
             "Local slices to launch (0: the product of the dcn_* values, "
             "or 2 when one of them is -1).");
  AddIntFlag(cmd, "timeout_seconds", &flags->timeout_seconds,
             "A peer that does not answer for this long ends the run.");
  AddBoolFlag(cmd, "json", &flags->json,
              "No per-step lines; print one JSON summary at the end.");
  table[cmd] = [flags] { return Run(*flags); };
}

}  // namespace multislice::cli
