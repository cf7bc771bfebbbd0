// `multislice shardings`: MaxText's shardings.py (spec section 3.3) on any
// ICI x DCN mesh; see model/shardings.h for the model and its sharding.
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "bench/peak.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/platform.h"
#include "cli/progress.h"
#include "compute/matmul.h"
#include "model/shardings.h"
#include "runtime/launcher.h"
#include "runtime/runtime.h"

namespace multislice::cli {
namespace {

struct ShardingsFlags {
  model::ShardingsConfig config;
  mesh::ParallelismConfig parallelism;
  std::string accelerator_type;  // default cpu-<ici product>
  std::string dtype;             // empty: bfloat16, not asked for explicitly
  std::string profiler_path;
  int embedding_dimension = 1024;
  int batch_size = 2048;
  int num_layers = 4;
  int steps = 5;
  int seed = 0;
  int dcn_timeout_seconds = 60;
  bool skip_dcn = false;
  bool json = false;
};

// Python's repr of a float: the shortest text that reads back the same.
std::string Repr(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, end);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string ReprList(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + Repr(v[i]);
  return s + "]";
}

std::string Megabytes(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

// The device list as shardings.py prints jax.devices().
std::string DeviceList(const runtime::Runtime& rt) {
  std::string s = "[";
  for (const mesh::Device& d : rt.devices()) {
    s += (d.id ? ", " : "") + mesh::ToString(d, rt.accelerator());
  }
  return s + "]";
}

int Fail(const Status& s) {
  std::fprintf(stderr, "multislice shardings: %s\n", s.message().c_str());
  return ExitCodeFor(s);
}

// On a terminal, a line redrawn in place on stdout (relayed as is by the
// launcher); otherwise lines on stderr, so that stdout stays the original's
// report (and --json one object).
Progress::Options ProgressOptions(const ShardingsFlags& flags) {
  Progress::Options options;
  options.prefix = "shardings";
  options.in_place = !flags.json && runtime::ShowProgress();
  options.out = options.in_place ? stdout : stderr;
  return options;
}

// The body of one worker: measure the peak, train, report.
int RunWorker(const ShardingsFlags& flags, const runtime::WorkerEnv& env) {
  runtime::RuntimeOptions options;
  options.env = env;
  options.parallelism = flags.parallelism;
  options.timeout = std::chrono::seconds(flags.dcn_timeout_seconds);
  auto rt_or = runtime::Runtime::Create(options);
  if (!rt_or.ok()) return Fail(rt_or.status());
  runtime::Runtime& rt = **rt_or;
  const int num_devices = static_cast<int>(rt.devices().size());
  auto shapes_or = model::ComputeShardingsShapes(flags.config, rt.parallelism(),
                                                 num_devices);
  if (!shapes_or.ok()) return Fail(shapes_or.status());
  const model::ShardingsShapes& shapes = *shapes_or;
  const bool printer = rt.process_index() == 0;
  const bool text = printer && !flags.json;

  runtime::Trace trace;
  if (!flags.profiler_path.empty()) {
    rt.set_trace(&trace);
    for (int id : rt.local_devices()) {
      const mesh::Device& d = rt.devices()[id];
      trace.NameDevice(id, "device " + std::to_string(id) + " (" +
                               runtime::WorkerName(d.slice_index, d.host) +
                               ")");
    }
  }
  if (text) {
    std::printf("multislice shardings: %s\n",
                PlatformText(flags.config.dtype).c_str());
    for (const std::string& note :
         PlatformNotes(flags.config.dtype, !flags.dtype.empty())) {
      std::printf("multislice shardings: %s\n", note.c_str());
    }
    std::printf("Devices: %s (num_devices: %d)\n", DeviceList(rt).c_str(),
                num_devices);
    std::printf("Decided on mesh shape: %s\n",
                mesh::FormatDeviceArray(rt.mesh()).c_str());
    std::printf(
        "total %s GB, parameters %s GB, activations %s GB\n",
        Repr((shapes.parameter_bytes + shapes.activation_bytes) / 1e9).c_str(),
        Repr(shapes.parameter_bytes / 1e9).c_str(),
        Repr(shapes.activation_bytes / 1e9).c_str());
    std::fflush(stdout);
  }

  const int local_count = static_cast<int>(rt.local_devices().size());
  const int total_steps = flags.steps + 1;  // one untimed warm-up first
  // The first worker says where the run is, so that no phase is silent.
  std::unique_ptr<Progress> progress;
  if (printer) progress = std::make_unique<Progress>(ProgressOptions(flags));
  if (progress) {
    progress->Phase(
        "measuring the matmul peak (2048^3, every device of this host at "
        "once)");
  }
  // The peak of one device while every device of this host measures its own
  // at once (what a device can do when all of them train), on the shape
  // `multislice peak` reports: 2048^3, f32 accumulation and output.
  const compute::GemmDesc square{.m = 2048,
                                 .n = 2048,
                                 .k = 2048,
                                 .ab_type = flags.config.dtype,
                                 .c_type = DType::kF32};
  auto square_peak = bench::MeasureConcurrentMatmulPeak(
      square, 5, local_count, bench::PeakTime::kStartup);
  if (!square_peak.ok()) return Fail(square_peak.status());
  // And on this workload's own six matmuls (unsharded shapes of one device).
  auto layer_peak = bench::MeasureShardingsLayerRate(
      flags.config.embedding_dimension, flags.config.batch_size,
      flags.config.dtype, 3, local_count);
  if (!layer_peak.ok()) return Fail(layer_peak.status());
  if (progress) progress->Phase("creating the weights and inputs");
  // Utilisation is against the better of the two.
  const double peak_gflops = std::max(square_peak->median_gflops, *layer_peak);
  std::vector<std::vector<model::StepStats>> stats(
      local_count, std::vector<model::StepStats>(total_steps));
  std::vector<float> slowest(total_steps);
  Status status = rt.RunOnDevices([&](int local) -> Status {
    compute::SetSingleThreaded();
    model::ShardingsDevice device(rt, local, flags.config, shapes);
    RETURN_IF_ERROR(device.Init());
    Progress* steps = local == 0 ? progress.get() : nullptr;
    if (steps) steps->StartSteps(total_steps, 1);
    for (int step = 0; step < total_steps; ++step) {
      RETURN_IF_ERROR(device.Step(&stats[local][step]));
      if (steps) steps->StepDone(step + 1, stats[local][step].seconds);
    }
    // Step time = the slowest device's, as the original's single program.
    std::vector<float> seconds(total_steps);
    for (int step = 0; step < total_steps; ++step) {
      seconds[step] = static_cast<float>(stats[local][step].seconds);
    }
    RETURN_IF_ERROR(rt.collectives(local)
                        .AllReduce({"data", "fsdp", "tensor"}, seconds.data(),
                                   seconds.data(), seconds.size(), DType::kF32,
                                   comm::ReduceOp::kMax, "timings")
                        .Wait());
    if (local == 0) slowest = seconds;
    return OkStatus();
  });
  if (progress) progress->Stop();
  if (!status.ok()) return Fail(status);

  if (!flags.profiler_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(flags.profiler_path, ec);
    const std::string path = flags.profiler_path + "/trace_slice" +
                             std::to_string(env.slice_id) + "_worker" +
                             std::to_string(env.worker_id) + ".json";
    if (Status s = trace.WriteJson(path); !s.ok()) return Fail(s);
    if (text) std::printf("profile written to %s\n", path.c_str());
  }
  if (!printer) return 0;

  std::vector<double> timings(slowest.begin() + 1, slowest.end());
  double average = 0;
  for (double t : timings) average += t;
  average /= timings.size();
  std::vector<double> sorted = timings;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double tflops = shapes.tflop_per_device / average;
  const double peak_tflops = peak_gflops / 1e3;
  double ici_bytes = 0, between_hosts = 0, dcn_bytes = 0;
  for (int step = 1; step < total_steps; ++step) {
    ici_bytes += stats[0][step].ici_bytes;
    between_hosts += stats[0][step].ici_between_hosts_bytes;
    dcn_bytes += stats[0][step].dcn_bytes;
  }
  ici_bytes /= flags.steps;
  between_hosts /= flags.steps;
  dcn_bytes /= flags.steps;
  const double first_loss = stats[0][0].loss;
  if (!flags.json) {
    std::printf("average time: %s, timings (seconds) %s\n",
                Repr(average).c_str(), ReprList(timings).c_str());
    std::printf("time is %s seconds, TFLOP is %s, TFLOP/s is %s\n",
                Repr(average).c_str(), Repr(shapes.tflop_per_device).c_str(),
                Repr(tflops).c_str());
    std::printf(
        "per device: %.3f TFLOP/s is %.1f%% of the measured %s matmul peak "
        "%.3f TFLOP/s (the better of 2048^3: %.3f and this layer's six "
        "matmuls: %.3f; best of 3 rounds with %d device(s) of this host at "
        "once, %s)\n",
        tflops, 100 * tflops / peak_tflops,
        std::string(Name(flags.config.dtype)).c_str(), peak_tflops,
        square_peak->median_gflops / 1e3, *layer_peak / 1e3,
        square_peak->threads,
        compute::MatmulRouteName(flags.config.dtype).c_str());
    if (tflops > peak_tflops) {
      // Never a figure above 100 % without saying why it can be.
      std::printf(
          "note: the step ran at %.1f%% of the peak measured at start: that "
          "measurement came out low (matmul timings vary by a few per cent "
          "between runs), so read the utilisation as about 100%%\n",
          100 * tflops / peak_tflops);
    }
    std::printf("median step %.4f s (min %.4f, max %.4f)\n", median,
                sorted.front(), sorted.back());
    std::printf("first step loss: %s\n", Repr(first_loss).c_str());
    const std::string hosts_part =
        rt.accelerator().hosts_per_slice() > 1
            ? " (" + Megabytes(between_hosts) + " of it between hosts)"
            : "";
    std::printf("sent per device per step: ICI %s%s, DCN %s\n",
                Megabytes(ici_bytes).c_str(), hosts_part.c_str(),
                Megabytes(dcn_bytes).c_str());
    return 0;
  }
  nlohmann::json out;
  out["devices"] = DeviceList(rt);
  out["num_devices"] = num_devices;
  out["num_slices"] = env.num_slices;
  out["accelerator_type"] = env.accelerator_type;
  out["axis_names"] = rt.mesh().axis_names;
  out["mesh_shape"] = rt.mesh().shape;
  out["device_ids"] = rt.mesh().device_ids;
  out["dtype"] = Name(flags.config.dtype);
  out["embedding_dimension"] = flags.config.embedding_dimension;
  out["batch_size"] = flags.config.batch_size;
  out["num_layers"] = flags.config.num_layers;
  out["total_gb"] = (shapes.parameter_bytes + shapes.activation_bytes) / 1e9;
  out["parameters_gb"] = shapes.parameter_bytes / 1e9;
  out["activations_gb"] = shapes.activation_bytes / 1e9;
  out["parameter_bytes_per_device"] = shapes.parameter_bytes_per_device;
  out["timings_s"] = timings;
  out["average_time_s"] = average;
  out["step_time_s"] = average;
  out["median_step_time_s"] = median;
  out["min_step_time_s"] = sorted.front();
  out["max_step_time_s"] = sorted.back();
  out["tflop_per_device"] = shapes.tflop_per_device;
  out["tflops_per_device"] = tflops;
  out["peak_tflops_per_device"] = peak_tflops;
  out["square_peak_tflops_per_device"] = square_peak->median_gflops / 1e3;
  out["layer_peak_tflops_per_device"] = *layer_peak / 1e3;
  out["peak_devices_at_once"] = square_peak->threads;
  out["square_peak_rounds_tflops"] = nlohmann::json::array();
  for (double g : square_peak->round_gflops) {
    out["square_peak_rounds_tflops"].push_back(g / 1e3);
  }
  out["utilization"] = tflops / peak_tflops;
  out["platform"] = PlatformJson(flags.config.dtype);
  out["isa"] = out["platform"]["isa"];
  out["first_step_loss"] = first_loss;
  out["ici_bytes_per_device_per_step"] = ici_bytes;
  out["ici_between_hosts_bytes_per_device_per_step"] = between_hosts;
  out["dcn_bytes_per_device_per_step"] = dcn_bytes;
  out["skip_dcn"] = flags.skip_dcn;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int Run(ShardingsFlags flags) {
  flags.config.dtype = DType::kBF16;
  if (!flags.dtype.empty()) {
    auto dtype = ParseDType(flags.dtype, "--dtype");
    if (!dtype.ok()) return Fail(dtype.status());
    flags.config.dtype = *dtype;
  }
  if (flags.steps < 1) {
    return Fail(InvalidArgument("--steps: expected at least 1, got " +
                                std::to_string(flags.steps)));
  }
  if (flags.dcn_timeout_seconds < 1) {
    return Fail(
        InvalidArgument("--dcn_timeout_seconds: expected at least 1, "
                        "got " +
                        std::to_string(flags.dcn_timeout_seconds)));
  }
  if (Status s = mesh::CheckParallelismValues(flags.parallelism); !s.ok()) {
    return Fail(s);
  }
  flags.config.embedding_dimension = flags.embedding_dimension;
  flags.config.batch_size = flags.batch_size;
  flags.config.num_layers = flags.num_layers;
  flags.config.seed = static_cast<uint64_t>(flags.seed);
  flags.config.skip_dcn = flags.skip_dcn;
  int ici_product = 1, num_slices = 1;
  for (int v : flags.parallelism.ici) ici_product *= v;
  for (int v : flags.parallelism.dcn) {
    if (v < 0) {
      return Fail(InvalidArgument(
          "the number of slices is the product of the DCN parallelism, so "
          "every --dcn_*_parallelism needs a value (got -1)"));
    }
    num_slices *= v;
  }
  if (flags.accelerator_type.empty()) {
    if (ici_product < 0) {
      return Fail(InvalidArgument(
          "--accelerator_type is required when an ICI parallelism value is "
          "-1 (for example --accelerator_type cpu-4)"));
    }
    flags.accelerator_type = "cpu-" + std::to_string(ici_product);
  }
  auto type = mesh::ParseAcceleratorType(flags.accelerator_type);
  if (!type.ok()) return Fail(type.status());
  // Check the mesh and sizes here, before starting any worker.
  auto resolved = mesh::ResolveParallelism(
      flags.parallelism, type->devices_per_slice(), num_slices);
  if (!resolved.ok()) return Fail(resolved.status());
  auto shapes = model::ComputeShardingsShapes(
      flags.config, *resolved, type->devices_per_slice() * num_slices);
  if (!shapes.ok()) return Fail(shapes.status());

  runtime::LocalJobOptions job;
  job.num_slices = num_slices;
  job.accelerator_type = flags.accelerator_type;
  job.argv = CommandLine();
  job.raw_stdout_of_first_worker = true;
  return runtime::RunLocalJob(job, [&](const runtime::WorkerEnv& env) {
    return RunWorker(flags, env);
  });
}

}  // namespace

void AddShardingsCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "shardings",
      "The seed's example workload (MaxText's shardings.py): a stack of "
      "dense layers trained on a mesh of your choosing, reporting TFLOP/s.\n"
      "Same flags and meaning as the original (--batch_size is per device). "
      "The number of slices is the DCN product; on one machine the slices "
      "are launched as local worker processes.\n"
      "The defaults are sized for a 2-core CPU machine; the original's TPU "
      "defaults are -d 2048 -b 131072 -n 4 -if 4.\n"
      "Examples:\n"
      "  multislice shardings -d 1024 -b 2048 -n 4\n"
      "  multislice shardings -if 2          # 2 devices in one slice, FSDP\n"
      "  multislice shardings -dd 2          # 2 slices, data parallel over "
      "DCN\n"
      "  multislice shardings -dd 2 -if 2 --profiler_path /tmp/prof");
  auto flags = std::make_shared<ShardingsFlags>();
  ShardingsFlags& f = *flags;
  AddIntFlag(cmd, "embedding_dimension", &f.embedding_dimension,
             "-d: D_EMB; D_FF = 4 * D_EMB.");
  AddIntFlag(cmd, "batch_size", &f.batch_size,
             "-b: batch per device; BATCH = devices * batch_size.");
  AddIntFlag(cmd, "num_layers", &f.num_layers, "-n: number of layers.");
  AddParallelismFlags(cmd, &f.parallelism);
  AddStringFlag(cmd, "profiler_path", &f.profiler_path,
                "-p: write a Chrome trace per worker here (opens in "
                "Perfetto): one row per device, compute/ICI/DCN tracks.");
  AddStringFlag(cmd, "accelerator_type", &f.accelerator_type,
                "Devices per slice, cpu-N (default: N = the ICI product).");
  AddStringFlag(cmd, "dtype", &f.dtype,
                "bfloat16 (the default) or float32; also bf16, f32.");
  AddIntFlag(cmd, "steps", &f.steps, "Timed steps after one warm-up.");
  AddIntFlag(cmd, "seed", &f.seed, "Seed of X and the weights.");
  AddIntFlag(cmd, "dcn_timeout_seconds", &f.dcn_timeout_seconds,
             "A peer that does not answer for this long ends the run.");
  AddBoolFlag(cmd, "skip_dcn", &f.skip_dcn,
              "Diagnostic: skip collectives that cross slices, to measure "
              "how well DCN traffic hides behind compute (results wrong).");
  AddBoolFlag(cmd, "json", &f.json, "Print one JSON object.");
  table[cmd] = [flags] { return Run(*flags); };
  CommandFlagAliases()["shardings"] = {
      {"-d", "--embedding_dimension"},
      {"-b", "--batch_size"},
      {"-n", "--num_layers"},
      {"-p", "--profiler_path"},
      {"-dd", "--dcn_data_parallelism"},
      {"-df", "--dcn_fsdp_parallelism"},
      {"-dt", "--dcn_tensor_parallelism"},
      {"-id", "--ici_data_parallelism"},
      {"-if", "--ici_fsdp_parallelism"},
      {"-it", "--ici_tensor_parallelism"},
  };
}

}  // namespace multislice::cli
