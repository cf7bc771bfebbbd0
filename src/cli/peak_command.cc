// `multislice peak`: one device's limits on this host, measured now: oneDNN
// matmul GFLOP/s (bf16 and f32, a square 2048^3 and the matmuls of the
// shardings workload), alone and with every device of the host running at
// once, and the host's memory bandwidth. The shardings workload's
// utilisation is its FLOP/s per device over these (../shared/
// benchmarking.md), so they are measured by the same binary and kernels.
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/membw.h"
#include "bench/peak.h"
#include "cli/command.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/platform.h"
#include "common/cpu_isa.h"
#include "common/status.h"
#include "compute/matmul.h"

namespace multislice::cli {
namespace {

struct PeakFlags {
  int embedding_dimension = 1024;
  int batch_size = 2048;
  int square = 2048;
  int reps = 10;
  int devices = 0;  // 0: one per CPU of this process
  long long membw_bytes = 256LL << 20;
  bool variants = false;
  bool json = false;
  std::string dtype;  // empty: both
};

// One measured matmul: alone, and with `devices` device threads at once.
struct Row {
  std::string group, name;
  compute::GemmDesc desc;
  bench::MatmulPeak alone, together;
};

int CpuCount() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}

double LoadAverage() {
  std::ifstream loadavg("/proc/loadavg");
  double one_minute = -1;
  loadavg >> one_minute;
  return one_minute;
}

std::string Types(const compute::GemmDesc& d) {
  return std::string(Name(d.ab_type)) + "->" + std::string(Name(d.c_type));
}

std::string Shape(const compute::GemmDesc& d) {
  std::string s = std::to_string(d.m) + "x" + std::to_string(d.n) + "x" +
                  std::to_string(d.k);
  if (d.transpose_a) s += " A^T";
  if (d.transpose_b) s += " B^T";
  if (d.beta != 0.0f) s += " +C";
  return s;
}

std::string Rate(const bench::MatmulPeak& p) {
  char text[96];
  std::snprintf(text, sizeof(text), "%6.1f [%6.1f, %6.1f] cpu %.2f",
                p.median_gflops, p.min_gflops, p.max_gflops, p.cpu_share);
  return text;
}

nlohmann::json RateJson(const bench::MatmulPeak& p) {
  return {{"devices", p.threads},          {"median_gflops", p.median_gflops},
          {"min_gflops", p.min_gflops},    {"max_gflops", p.max_gflops},
          {"cpu_share", p.cpu_share},      {"reps", p.reps},
          {"round_gflops", p.round_gflops}};
}

// The rows to measure, in print order, for the dtypes asked for.
std::vector<Row> PlanRows(const PeakFlags& flags,
                          const std::vector<DType>& dtypes) {
  std::vector<Row> rows;
  for (DType t : dtypes) {
    Row row;
    row.group = "square";
    row.name = "square";
    row.desc.m = row.desc.n = row.desc.k = flags.square;
    row.desc.ab_type = t;
    row.desc.c_type = DType::kF32;
    rows.push_back(row);
  }
  // The workload keeps bf16 activations (bf16 out) or runs all in f32.
  for (DType t : dtypes) {
    for (const bench::WorkloadGemm& g : bench::ShardingsLayerGemms(
             flags.embedding_dimension, flags.batch_size, t, t)) {
      Row row;
      row.group = "layer " + std::string(Name(t));
      row.name = g.name;
      row.desc = g.desc;
      rows.push_back(row);
      if (!flags.variants) continue;
      if (g.desc.sigmoid) {
        row.name = "  without sigmoid";
        row.desc.sigmoid = false;
        rows.push_back(row);
      }
      row.name = "  with beta=1";
      row.desc = g.desc;
      row.desc.sigmoid = false;
      row.desc.beta = 1.0f;
      rows.push_back(row);
    }
  }
  return rows;
}

// GFLOP/s of a whole layer: its FLOPs over the sum of its matmuls' median
// times (the ceiling for the workload's matmul time).
double LayerRate(const std::vector<Row>& rows, const std::string& group,
                 bool together) {
  double flops = 0, seconds = 0;
  for (const Row& row : rows) {
    // Only the six matmuls as the workload runs them, not the variants.
    if (row.group != group || row.name.rfind("  ", 0) == 0) continue;
    const bench::MatmulPeak& p = together ? row.together : row.alone;
    const double f = bench::GemmFlops(row.desc);
    flops += f;
    seconds += f / (p.median_gflops * 1e9);
  }
  return seconds > 0 ? flops / seconds / 1e9 : 0;
}

int RunPeak(const PeakFlags& flags) {
  auto bad = [](const std::string& message) {
    std::fprintf(stderr, "multislice peak: %s\n", message.c_str());
    return 2;
  };
  if (flags.embedding_dimension < 1) {
    return bad("--embedding_dimension: expected at least 1, got " +
               std::to_string(flags.embedding_dimension));
  }
  if (flags.batch_size < 1) {
    return bad("--batch_size: expected at least 1, got " +
               std::to_string(flags.batch_size));
  }
  if (flags.square < 1) {
    return bad("--square: expected at least 1, got " +
               std::to_string(flags.square));
  }
  if (flags.reps < 1) {
    return bad("--reps: expected at least 1, got " +
               std::to_string(flags.reps));
  }
  if (flags.devices < 0) {
    return bad("--devices: expected 0 (one per CPU) or more, got " +
               std::to_string(flags.devices));
  }
  const int cpus = CpuCount();
  const int devices = flags.devices > 0 ? flags.devices : cpus;
  if (flags.membw_bytes < 4096LL * devices) {
    return bad("--membw_bytes: expected at least 4K per device, got " +
               std::to_string(flags.membw_bytes));
  }

  std::vector<DType> dtypes = {DType::kBF16, DType::kF32};
  if (!flags.dtype.empty()) {
    auto dtype = ParseDType(flags.dtype, "--dtype");
    if (!dtype.ok()) return bad(dtype.status().message());
    dtypes = {*dtype};
  }
  const double load = LoadAverage();
  std::vector<Row> rows = PlanRows(flags, dtypes);
  if (!flags.json) {
    for (const std::string& note :
         PlatformNotes(dtypes.front(), !flags.dtype.empty())) {
      std::printf("multislice peak: %s\n", note.c_str());
    }
    std::printf("multislice peak: one device (one thread) of this host\n");
    std::printf("host    %s, %d CPUs, load average %.2f before the run\n",
                CpuModelName().c_str(), cpus, load);
    std::printf("ISA     %s (this CPU: %s)\n",
                std::string(IsaName(ActiveIsa())).c_str(),
                std::string(IsaName(DetectedIsa())).c_str());
    for (DType t : dtypes) {
      std::printf("matmul  %s: %s\n", std::string(Name(t)).c_str(),
                  compute::MatmulRouteName(t).c_str());
    }
    std::printf("oneDNN  %s, ISA %s\n\n", compute::DnnlVersion().c_str(),
                compute::DnnlIsaName());
    std::printf(
        "matmul GFLOP/s per device: the best of %d rounds' medians [min, max "
        "of every call]; cpu = the device thread's CPU share (1.00: it had a "
        "core to itself)\n",
        bench::kPeakRounds);
    std::printf("%-22s %-24s %-18s %-34s %d devices at once\n", "matmul",
                "m x n x k", "types", "1 device", devices);
  }
  double worst_share = 1;
  std::string group;
  for (Row& row : rows) {
    if (!flags.json && row.group != group) {
      group = row.group;
      if (group != "square") {
        std::printf("shardings %s (d=%d, b=%d per device, unsharded):\n",
                    group.c_str(), flags.embedding_dimension, flags.batch_size);
      }
    }
    Result<bench::MatmulPeak> alone =
        bench::MeasureMatmulPeak(row.desc, flags.reps);
    if (!alone.ok()) {
      std::fprintf(stderr, "multislice peak: %s\n",
                   alone.status().message().c_str());
      return ExitCodeFor(alone.status());
    }
    row.alone = *alone;
    Result<bench::MatmulPeak> together =
        bench::MeasureConcurrentMatmulPeak(row.desc, flags.reps, devices);
    if (!together.ok()) {
      std::fprintf(stderr, "multislice peak: %s\n",
                   together.status().message().c_str());
      return ExitCodeFor(together.status());
    }
    row.together = *together;
    worst_share =
        std::min({worst_share, row.alone.cpu_share, row.together.cpu_share});
    if (!flags.json) {
      std::printf("%-22s %-24s %-18s %-34s %s  %s\n", row.name.c_str(),
                  Shape(row.desc).c_str(), Types(row.desc).c_str(),
                  Rate(row.alone).c_str(), Rate(row.together).c_str(),
                  row.alone.impl.c_str());
      std::fflush(stdout);
    }
  }
  const bench::MemoryBandwidth membw_one =
      bench::MeasureMemoryBandwidth(1, flags.membw_bytes, 5);
  const bench::MemoryBandwidth membw_all =
      bench::MeasureMemoryBandwidth(cpus, flags.membw_bytes, 5);

  std::vector<std::string> layer_groups;
  for (DType t : dtypes)
    layer_groups.push_back("layer " + std::string(Name(t)));
  if (flags.json) {
    nlohmann::json out;
    out["host"] = {{"cpu_model", CpuModelName()},
                   {"cpus", cpus},
                   {"load_average_before", load}};
    out["onednn"] = {{"version", compute::DnnlVersion()},
                     {"isa", compute::DnnlIsaName()}};
    out["isa"] = std::string(IsaName(ActiveIsa()));
    out["detected_isa"] = std::string(IsaName(DetectedIsa()));
    for (DType t : dtypes) {
      out["matmul"][std::string(Name(t))] = compute::MatmulRouteName(t);
    }
    out["devices_at_once"] = devices;
    out["embedding_dimension"] = flags.embedding_dimension;
    out["batch_size"] = flags.batch_size;
    out["matmuls"] = nlohmann::json::array();
    for (const Row& row : rows) {
      out["matmuls"].push_back(
          {{"group", row.group},
           {"name", row.name.substr(row.name.find_first_not_of(' '))},
           {"m", row.desc.m},
           {"n", row.desc.n},
           {"k", row.desc.k},
           {"transpose_a", row.desc.transpose_a},
           {"transpose_b", row.desc.transpose_b},
           {"ab_type", Name(row.desc.ab_type)},
           {"c_type", Name(row.desc.c_type)},
           {"beta", row.desc.beta},
           {"sigmoid", row.desc.sigmoid},
           {"impl", row.alone.impl},
           {"flops_per_call", bench::GemmFlops(row.desc)},
           {"alone", RateJson(row.alone)},
           {"together", RateJson(row.together)}});
    }
    for (const std::string& g : layer_groups) {
      out["layer_gflops"][g.substr(6)] = {
          {"alone", LayerRate(rows, g, false)},
          {"together", LayerRate(rows, g, true)}};
    }
    out["memory_bandwidth_gbps"] = nlohmann::json::array();
    for (const bench::MemoryBandwidth& m : {membw_one, membw_all}) {
      out["memory_bandwidth_gbps"].push_back({{"threads", m.threads},
                                              {"bytes", m.bytes},
                                              {"median", m.median_gbps},
                                              {"min", m.min_gbps},
                                              {"max", m.max_gbps}});
    }
    out["min_cpu_share"] = worst_share;
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("\n");
  for (const std::string& g : layer_groups) {
    std::printf(
        "shardings %s: the 6 matmuls together reach %.1f GFLOP/s per device "
        "alone, %.1f with %d devices at once\n",
        g.c_str(), LayerRate(rows, g, false), LayerRate(rows, g, true),
        devices);
  }
  std::printf(
      "memory bandwidth (y += x, 2 x %lld MiB, 2 reads + 1 write): 1 thread "
      "%.1f GB/s [%.1f, %.1f], %d threads %.1f GB/s [%.1f, %.1f]\n",
      flags.membw_bytes >> 20, membw_one.median_gbps, membw_one.min_gbps,
      membw_one.max_gbps, membw_all.threads, membw_all.median_gbps,
      membw_all.min_gbps, membw_all.max_gbps);
  if (worst_share < 0.9) {
    std::printf(
        "warning: a device thread had only %.0f%% of a CPU in some runs: "
        "other processes (or more devices than CPUs) shared the cores, so "
        "those rates understate the device; rerun on an idle machine\n",
        100 * worst_share);
  }
  return 0;
}

}  // namespace

void AddPeakCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "peak",
      "One device's limits on this host, measured now: oneDNN matmul "
      "GFLOP/s (bfloat16 and float32; a square matmul and the six matmuls of "
      "one "
      "shardings layer), with one device alone and with every device of the "
      "host running at once, and the host's memory bandwidth. These are the "
      "peaks the shardings workload's utilisation is measured against.\n"
      "Examples:\n"
      "  multislice peak\n"
      "  multislice peak -d 2048 -b 4096 --variants --json\n"
      "  multislice peak --dtype float32\n"
      "  MULTISLICE_MAX_ISA=avx2 multislice peak   # as on an AVX2-only CPU");
  auto flags = std::make_shared<PeakFlags>();
  PeakFlags& f = *flags;
  AddIntFlag(cmd, "embedding_dimension", &f.embedding_dimension,
             "-d: the shardings workload's D_EMB (D_FF = 4 * D_EMB).");
  AddIntFlag(cmd, "batch_size", &f.batch_size,
             "-b: the shardings workload's batch per device.");
  AddIntFlag(cmd, "square", &f.square,
             "Size of the square matmul (square x square x square).");
  AddIntFlag(cmd, "reps", &f.reps, "Timed calls per matmul and device.");
  AddIntFlag(cmd, "devices", &f.devices,
             "Devices (threads) at once for the second column (0: one per "
             "CPU).");
  AddSizeFlag(cmd, "membw_bytes", &f.membw_bytes,
              "Size of each array of the memory bandwidth test.");
  AddBoolFlag(cmd, "variants", &f.variants,
              "Also time each layer matmul without its fused sigmoid and "
              "with beta=1 (accumulating into C).");
  AddStringFlag(cmd, "dtype", &f.dtype,
                "Measure only bfloat16 or float32 matmuls (also bf16, f32; "
                "default: both).");
  AddBoolFlag(cmd, "json", &f.json, "Print one JSON object.");
  table[cmd] = [flags] { return RunPeak(*flags); };
  CommandFlagAliases()["peak"] = {{"-d", "--embedding_dimension"},
                                  {"-b", "--batch_size"}};
}

}  // namespace multislice::cli
