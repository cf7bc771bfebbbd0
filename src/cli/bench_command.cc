// `multislice bench collectives`: see bench/collectives_bench.h.
#include <cstdio>

#include "bench/collectives_bench.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "runtime/launcher.h"
#include "runtime/runtime.h"

namespace multislice::cli {
namespace {

struct BenchFlags {
  std::string accelerator_type = "cpu-2";
  int num_slices = 2;
  std::string min_bytes = "1K", max_bytes = "256M";
  int step_factor = 2;
  int iters = 5, warmup_iters = 1;
  std::string dtype = "float32";
  std::vector<std::string> ops, paths, baselines;
  int dcn_timeout_seconds = 60;
  bool json = false;
};

std::vector<std::string> SplitList(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const std::string& item : items) {
    size_t start = 0;
    for (size_t comma; (comma = item.find(',', start)) != std::string::npos;
         start = comma + 1) {
      out.push_back(item.substr(start, comma - start));
    }
    out.push_back(item.substr(start));
  }
  return out;
}

int RunBench(const BenchFlags& flags, const std::vector<std::string>& argv) {
  bench::CollectivesBenchOptions options;
  options.min_bytes = ParseByteSize(flags.min_bytes);
  options.max_bytes = ParseByteSize(flags.max_bytes);
  if (options.min_bytes < 0) {
    std::fprintf(stderr,
                 "multislice bench collectives: --minbytes: '%s' is not a "
                 "byte size (e.g. 1K, 64M)\n",
                 flags.min_bytes.c_str());
    return 2;
  }
  if (options.max_bytes < 0) {
    std::fprintf(stderr,
                 "multislice bench collectives: --maxbytes: '%s' is not a "
                 "byte size (e.g. 1K, 64M)\n",
                 flags.max_bytes.c_str());
    return 2;
  }
  options.step_factor = flags.step_factor;
  options.iters = flags.iters;
  options.warmup_iters = flags.warmup_iters;
  options.json = flags.json;
  if (!flags.ops.empty()) options.ops = SplitList(flags.ops);
  if (!flags.paths.empty()) options.paths = SplitList(flags.paths);
  if (!flags.baselines.empty()) options.baselines = SplitList(flags.baselines);
  if (options.baselines.size() == 1 && options.baselines[0] == "none") {
    options.baselines.clear();
  }
  auto dtype = ParseDType(flags.dtype, "--dtype");
  if (!dtype.ok()) {
    std::fprintf(stderr, "multislice bench collectives: %s\n",
                 dtype.status().message().c_str());
    return 2;
  }
  options.dtype = *dtype;
  if (Status s = bench::ValidateCollectivesBenchOptions(options); !s.ok()) {
    std::fprintf(stderr, "multislice bench collectives: %s\n",
                 s.message().c_str());
    return 2;
  }
  if (flags.dcn_timeout_seconds < 1) {
    std::fprintf(stderr,
                 "multislice bench collectives: --dcn_timeout_seconds: "
                 "expected at least 1, got %d\n",
                 flags.dcn_timeout_seconds);
    return 2;
  }
  if (flags.num_slices < 1) {
    std::fprintf(stderr,
                 "multislice bench collectives: --num_slices: expected at "
                 "least 1, got %d\n",
                 flags.num_slices);
    return 2;
  }
  auto type = mesh::ParseAcceleratorType(flags.accelerator_type);
  if (!type.ok()) {
    std::fprintf(stderr, "multislice bench collectives: %s\n",
                 type.status().message().c_str());
    return 2;
  }
  runtime::LocalJobOptions job;
  job.num_slices = flags.num_slices;
  job.accelerator_type = flags.accelerator_type;
  job.argv = argv;
  // Slice 0 worker 0 prints the table (or the JSON) alone; unprefixed, so
  // that nccl-tests parsers read it. The others print nothing on stdout.
  job.raw_stdout_of_first_worker = true;
  return runtime::RunLocalJob(job, [&](const runtime::WorkerEnv& env) {
    runtime::RuntimeOptions rt_options;
    rt_options.env = env;
    rt_options.parallelism.dcn = {1, -1, 1, 1, 1};
    rt_options.parallelism.ici = {1, 1, 1, -1, 1};
    rt_options.timeout = std::chrono::seconds(flags.dcn_timeout_seconds);
    auto rt = runtime::Runtime::Create(rt_options);
    if (!rt.ok()) {
      std::fprintf(stderr, "multislice bench collectives: %s: %s\n",
                   env.name().c_str(), rt.status().message().c_str());
      return ExitCodeFor(rt.status());
    }
    return bench::RunCollectivesBench(**rt, options);
  });
}

}  // namespace

void AddBenchCommand(CLI::App& root, CommandTable& table) {
  CLI::App* bench =
      root.add_subcommand("bench", "Benchmarks (see docs/performance.md).");
  bench->require_subcommand(1);
  CLI::App* coll = bench->add_subcommand(
      "collectives",
      "nccl-tests tables (all_reduce_perf's format, so its parsers read "
      "them) of all_reduce, reduce_scatter and all_gather over the ICI, DCN "
      "and two-level paths, with Gloo and Open MPI baselines and the host's "
      "memory bandwidth measured in the same run as comment lines. Only "
      "slice 0 worker 0 prints.\n"
      "The mesh is data across slices, fsdp inside them: path ici = fsdp, "
      "dcn = data, two-level = (data, fsdp).\n"
      "Examples:\n"
      "  multislice bench collectives --num_slices 2 --accelerator_type "
      "cpu-2 --maxbytes 64M\n"
      "  multislice bench collectives --num_slices 1 --accelerator_type "
      "cpu-2 --ops all_reduce --paths ici --minbytes 64M --maxbytes 64M "
      "--iters 10 --baselines none\n"
      "  multislice bench collectives --json > collectives.json");
  auto flags = std::make_shared<BenchFlags>();
  coll->add_option(FlagNames("accelerator_type"), flags->accelerator_type,
                   "Devices per slice, as cpu-N.")
      ->capture_default_str();
  AddIntFlag(coll, "num_slices", &flags->num_slices,
             "Slices to launch on this machine.")
      ->capture_default_str();
  coll->add_option("--minbytes,--min_bytes,-b", flags->min_bytes,
                   "Smallest size (bytes; K, M, G suffixes).")
      ->capture_default_str();
  coll->add_option("--maxbytes,--max_bytes,-e", flags->max_bytes,
                   "Largest size.")
      ->capture_default_str();
  AddIntFlag(coll, "stepfactor", &flags->step_factor,
             "Multiply the size by this between rows.")
      ->capture_default_str();
  AddIntFlag(coll, "iters", &flags->iters, "Timed repetitions per size.")
      ->capture_default_str();
  AddIntFlag(coll, "warmup_iters", &flags->warmup_iters,
             "Untimed repetitions first.")
      ->capture_default_str();
  coll->add_option(FlagNames("dtype"), flags->dtype,
                   "float32 (the default) or bfloat16; also f32, bf16.")
      ->capture_default_str();
  coll->add_option(FlagNames("ops"), flags->ops,
                   "Comma-separated: all_reduce, reduce_scatter, all_gather "
                   "(default all).");
  coll->add_option(FlagNames("paths"), flags->paths,
                   "Comma-separated: ici, dcn, two-level (default all).");
  coll->add_option(FlagNames("baselines"), flags->baselines,
                   "Comma-separated: gloo-flat, mpi-flat, or none (default "
                   "both).");
  AddIntFlag(coll, "dcn_timeout_seconds", &flags->dcn_timeout_seconds,
             "A peer that does not answer for this long ends the run.")
      ->capture_default_str();
  coll->add_flag(FlagNames("json"), flags->json,
                 "Print one JSON object instead of the table.");
  table[coll] = [flags] { return RunBench(*flags, CommandLine()); };
  AddBenchCheckpointCommand(*bench, table);
}

}  // namespace multislice::cli
