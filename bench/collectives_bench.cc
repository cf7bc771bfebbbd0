#include "bench/collectives_bench.h"

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench/membw.h"
#include "common/bf16.h"
#include "runtime/comm/reduce.h"
#include "runtime/launcher.h"

namespace multislice::bench {
namespace {

using comm::DType;
using comm::ReduceOp;
using runtime::Axes;
using runtime::AxisGroup;
using runtime::DeviceCollectives;
using Clock = std::chrono::steady_clock;

const Axes kAllAxes = {"data", "fsdp", "tensor"};

Axes AxesOfPath(const std::string& path) {
  if (path == "ici") return {"fsdp"};
  if (path == "dcn") return {"data"};
  return {"data", "fsdp"};  // two-level, and the flat baselines' group
}

double BusFactor(const std::string& op, int n) {
  if (n <= 1) return 0;
  return op == "all_reduce" ? 2.0 * (n - 1) / n
                            : static_cast<double>(n - 1) / n;
}

// Bytes each device should send over DCN for one collective of S bytes.
double DcnFormula(const std::string& op, const AxisGroup& g, double s) {
  const double m = g.dcn_size, k = g.ici_size;
  if (m <= 1) return 0;
  const double per_column = op == "all_reduce" ? 2 * (m - 1) / m : (m - 1) / m;
  return per_column * s / k;
}

float Pattern(int device, size_t i) {
  return static_cast<float>(static_cast<int>((device * 7 + i * 3) % 11)) - 5.0f;
}

void SetValue(DType t, void* buf, size_t i, float v) {
  if (t == DType::kF32) {
    static_cast<float*>(buf)[i] = v;
  } else {
    static_cast<bf16*>(buf)[i] = bf16(v);
  }
}
float GetValue(DType t, const void* buf, size_t i) {
  if (t == DType::kF32) return static_cast<const float*>(buf)[i];
  return static_cast<float>(static_cast<const bf16*>(buf)[i]);
}

struct Stats {
  double median_us = 0, min_us = 0, max_us = 0;
};
Stats Summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), us.back()};
}

struct Row {
  std::string op, path;
  long long bytes = 0;
  size_t count = 0;
  int group_size = 1;
  Stats oop, ip;
  long long wrong_oop = 0, wrong_ip = 0;
  double gloo_busbw = -1;  // same group, Gloo's own all-reduce
  double ici_bytes = 0, dcn_bytes = 0, dcn_formula = 0;
};

// What one device does for the whole benchmark. Each device thread owns one.
class DeviceRunner {
 public:
  DeviceRunner(runtime::Runtime& rt, int local,
               const CollectivesBenchOptions& options)
      : rt_(rt),
        device_(rt.local_devices()[local]),
        coll_(rt.collectives(local)),
        options_(options),
        es_(comm::SizeOf(options.dtype)) {
    // Pre-touched buffers of the largest size, reused for every case.
    in_.assign(static_cast<size_t>(options.max_bytes), std::byte{1});
    out_.assign(static_cast<size_t>(options.max_bytes), std::byte{1});
  }

  Status Barrier() { return coll_.Barrier(kAllAxes, "bench:barrier").Wait(); }

  // Times `iters` runs of one collective (after warm-up), then checks one
  // more run on fresh data. Returns times in microseconds.
  Status Run(const std::string& op, const Axes& axes, size_t count,
             bool in_place, std::vector<double>* times, long long* wrong,
             double* ici_bytes, double* dcn_bytes) {
    ASSIGN_OR_RETURN(const AxisGroup* g, coll_.Group(axes));
    const comm::Segment mine = comm::PartitionSegment(count, g->size, g->rank);
    void* in = in_.data();
    void* out = out_.data();
    if (in_place) {
      if (op == "all_reduce") out = in;
      if (op == "reduce_scatter") out = in_.data() + mine.offset * es_;
      if (op == "all_gather") in = out_.data() + mine.offset * es_;
    }
    auto launch = [&] {
      const std::string label = "bench:" + op;
      if (op == "all_reduce") {
        return coll_.AllReduce(axes, in, out, count, options_.dtype,
                               ReduceOp::kSum, label);
      }
      if (op == "reduce_scatter") {
        return coll_.ReduceScatter(axes, in, out, count, options_.dtype,
                                   ReduceOp::kSum, label);
      }
      return coll_.AllGather(axes, in, out, count, options_.dtype, label);
    };
    times->clear();
    for (int i = 0; i < options_.warmup_iters + options_.iters; ++i) {
      RETURN_IF_ERROR(Barrier());
      auto start = Clock::now();
      RETURN_IF_ERROR(launch().Wait());
      const double us =
          std::chrono::duration<double, std::micro>(Clock::now() - start)
              .count();
      if (i >= options_.warmup_iters) times->push_back(us);
    }
    // Check: fill with the pattern, run once, compare every value.
    const size_t in_count = op == "all_gather" ? mine.count : count;
    const size_t in_offset = op == "all_gather" ? mine.offset : 0;
    for (size_t i = 0; i < in_count; ++i) {
      SetValue(options_.dtype, in, i, Pattern(device_, in_offset + i));
    }
    RETURN_IF_ERROR(Barrier());
    // ICI: everything inside the slice (on the host and between its hosts).
    const uint64_t ici_before =
        coll_.counters().ici_bytes_sent + coll_.counters().slice_net_bytes_sent;
    const uint64_t dcn_before = coll_.counters().dcn_bytes_sent;
    RETURN_IF_ERROR(launch().Wait());
    *ici_bytes =
        static_cast<double>(coll_.counters().ici_bytes_sent +
                            coll_.counters().slice_net_bytes_sent - ici_before);
    *dcn_bytes =
        static_cast<double>(coll_.counters().dcn_bytes_sent - dcn_before);
    auto sum_over_group = [&](size_t i) {
      float acc = 0;
      for (int member : g->members) acc += Pattern(member, i);
      return acc;
    };
    *wrong = 0;
    if (op == "all_reduce") {
      for (size_t i = 0; i < count; ++i) {
        *wrong += GetValue(options_.dtype, out, i) != sum_over_group(i);
      }
    } else if (op == "reduce_scatter") {
      for (size_t i = 0; i < mine.count; ++i) {
        *wrong +=
            GetValue(options_.dtype, out, i) != sum_over_group(mine.offset + i);
      }
    } else {
      for (int s = 0; s < g->size; ++s) {
        const comm::Segment c = comm::PartitionSegment(count, g->size, s);
        for (size_t i = c.offset; i < c.offset + c.count; ++i) {
          *wrong +=
              GetValue(options_.dtype, out, i) != Pattern(g->members[s], i);
        }
      }
    }
    return OkStatus();
  }

  // Connects a Gloo context over the group of `axes` (every device of the
  // job joins one group per call, concurrently).
  Status ConnectGloo(const std::string& name, const Axes& axes) {
    ASSIGN_OR_RETURN(const AxisGroup* g, coll_.Group(axes));
    std::string members;
    for (int m : g->members) members += std::to_string(m) + "-";
    dcn::ConnectOptions connect;
    connect.rank = g->rank;
    connect.size = g->size;
    connect.hostname = rt_.env().hostname();
    connect.key_prefix = "bench/gloo/" + name + "/" + members + "/";
    connect.timeout = rt_.timeout();
    for (int m : g->members) {
      const mesh::Device& d = rt_.devices()[m];
      connect.peer_names.push_back("device " + std::to_string(m) + " (" +
                                   runtime::WorkerName(d.slice_index, d.host) +
                                   ")");
    }
    auto comm = dcn::Communicator::Connect(rt_.store(), connect);
    if (!comm.ok()) return comm.status();
    gloo_[name] = std::move(comm).value();
    return OkStatus();
  }

  // Gloo's own all-reduce (ring) on the group connected as `name`.
  Status RunGloo(const std::string& name, size_t count,
                 std::vector<double>* times) {
    std::shared_ptr<gloo::Context> context = gloo_.at(name)->gloo_context();
    times->clear();
    for (int i = 0; i < options_.warmup_iters + options_.iters; ++i) {
      RETURN_IF_ERROR(Barrier());
      auto start = Clock::now();
      try {
        gloo::AllreduceOptions opts(context);
        if (options_.dtype == DType::kF32) {
          opts.setInput(reinterpret_cast<float*>(in_.data()), count);
          opts.setOutput(reinterpret_cast<float*>(out_.data()), count);
          opts.setReduceFunction(
              [](void* c, const void* a, const void* b, size_t n) {
                gloo::sum<float>(c, a, b, n);
              });
        } else {
          opts.setInput(reinterpret_cast<uint16_t*>(in_.data()), count);
          opts.setOutput(reinterpret_cast<uint16_t*>(out_.data()), count);
          opts.setReduceFunction(
              [](void* c, const void* a, const void* b, size_t n) {
                comm::Reduce2(DType::kBF16, ReduceOp::kSum, c, a, b, n);
              });
        }
        opts.setTimeout(rt_.timeout());
        gloo::allreduce(opts);
      } catch (const std::exception& e) {
        return Unavailable(std::string("gloo all-reduce: ") + e.what());
      }
      const double us =
          std::chrono::duration<double, std::micro>(Clock::now() - start)
              .count();
      if (i >= options_.warmup_iters) times->push_back(us);
    }
    return OkStatus();
  }

  // Combines per-device values over every device of the job: max or sum.
  Status Combine(std::vector<float>* values, ReduceOp op) {
    return coll_
        .AllReduce(kAllAxes, values->data(), values->data(), values->size(),
                   DType::kF32, op, "bench:combine")
        .Wait();
  }

  DeviceCollectives& collectives() { return coll_; }

 private:
  runtime::Runtime& rt_;
  const int device_;
  DeviceCollectives& coll_;
  const CollectivesBenchOptions& options_;
  const size_t es_;
  std::vector<std::byte> in_, out_;
  std::map<std::string, std::unique_ptr<dcn::Communicator>> gloo_;
};

std::string FormatBytes(double b) {
  char buf[32];
  if (b >= 1 << 20) {
    std::snprintf(buf, sizeof buf, "%.0fM", b / (1 << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof buf, "%.0fK", b / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", b);
  }
  return buf;
}

// nccl-tests' names of the element types.
const char* NcclTypeName(DType t) {
  return t == DType::kF32 ? "float" : "bfloat16";
}

// nccl-tests' time column: fewer decimals as the time grows.
std::string TimeText(double us) {
  char buf[32];
  std::snprintf(buf, sizeof buf,
                us >= 10000 ? "%.0f"
                : us >= 100 ? "%.1f"
                            : "%.2f",
                us);
  return buf;
}

double BusBw(const std::string& op, long long bytes, const Stats& s, int n) {
  return bytes / s.median_us / 1e3 * BusFactor(op, n);
}

// While the table is silent (a large size, a baseline, the memory
// bandwidth), a line on stderr every 4 s says what is being measured, so
// no wait reaches 5 s; stdout stays nccl-tests' format.
class Heartbeat {
 public:
  ~Heartbeat() { Stop(); }
  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }
  // Something was printed; `what` is measured next.
  void Touch(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = Clock::now();
    if (!what.empty()) what_ = what;
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  using Clock = std::chrono::steady_clock;
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!wake_.wait_for(lock, std::chrono::seconds(1),
                           [this] { return stopped_; })) {
      const double quiet =
          std::chrono::duration<double>(Clock::now() - last_).count();
      if (quiet < 4) continue;
      std::fprintf(stderr, "bench collectives: measuring %s (%.0f s)\n",
                   what_.c_str(), quiet);
      std::fflush(stderr);
      last_ = Clock::now();
    }
  }
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopped_ = false;
  Clock::time_point last_ = Clock::now();
  std::string what_ = "the host's memory bandwidth";
  std::thread thread_;
};

// Prints tables on the first device of the job.
class Reporter {
 public:
  Reporter(const CollectivesBenchOptions& options, runtime::Runtime& rt,
           const MemoryBandwidth& membw)
      : options_(options), rt_(rt), membw_(membw) {}

  void Header(long long min_bytes, long long max_bytes) {
    if (options_.json) return;
    heartbeat_.Touch("the first collective");
    std::printf(
        "# multislice bench collectives: nSlices %d accelerator %s nDevices "
        "%d minBytes %lld maxBytes %lld step: %d(factor) warmup iters: %d "
        "iters: %d validation: 1 dtype: %s\n",
        rt_.env().num_slices, rt_.env().accelerator_type.c_str(),
        static_cast<int>(rt_.devices().size()), min_bytes, max_bytes,
        options_.step_factor, options_.warmup_iters, options_.iters,
        NcclTypeName(options_.dtype));
    std::printf(
        "# time: the median of the iterations, each the slowest device's\n");
    std::printf("#\n# Using devices\n");
    for (const mesh::Device& d : rt_.devices()) {
      std::printf("#  Rank %2d Slice %2d Worker %2d device %2d  cpu\n", d.id,
                  d.slice_index, d.host, d.id);
    }
    std::printf(
        "#\n# host memory bandwidth: %.1f GB/s (y += x over %s f32, %d "
        "threads; min %.1f, max %.1f)\n",
        membw_.median_gbps, FormatBytes(membw_.bytes).c_str(), membw_.threads,
        membw_.min_gbps, membw_.max_gbps);
    std::fflush(stdout);
  }

  // The column header of nccl-tests (common.cu), after a line naming the op
  // and path of the rows that follow.
  void Section(const std::string& op, const std::string& path,
               const AxisGroup& g) {
    if (options_.json) return;
    heartbeat_.Touch(op + " over " + path);
    std::printf("#\n# %s, path %s: axes (%s), %d devices per group (%d x %d)\n",
                op.c_str(), path.c_str(), g.axes_label.c_str(), g.size,
                g.dcn_size, g.ici_size);
    PrintColumnHeader();
    section_.clear();
  }

  void Print(const Row& r) {
    rows_.push_back(r);
    if (options_.json) {
      // The table is the progress; with --json, say where we are on stderr.
      if (runtime::ShowProgress()) {
        std::fprintf(stderr, "bench collectives: %s %s %s done\n", r.op.c_str(),
                     r.path.c_str(),
                     FormatBytes(static_cast<double>(r.bytes)).c_str());
      }
      return;
    }
    section_.push_back(r);
    heartbeat_.Touch(r.op + " over " + r.path + " above " +
                     FormatBytes(static_cast<double>(r.bytes)));
    const double busbw = BusBw(r.op, r.bytes, r.oop, r.group_size);
    const double busbw_ip = BusBw(r.op, r.bytes, r.ip, r.group_size);
    bus_sum_ += busbw + busbw_ip;
    bus_count_ += 2;
    std::printf("%12lld  %12zu  %8s  %6s  %6i", r.bytes, r.count,
                NcclTypeName(options_.dtype),
                r.op == "all_gather" ? "none" : "sum", -1);
    PrintTimes(r.bytes, r.oop.median_us, busbw, r.wrong_oop);
    PrintTimes(r.bytes, r.ip.median_us, busbw_ip, r.wrong_ip);
    std::printf("\n");
    std::fflush(stdout);
  }

  // What nccl-tests does not print, for the rows of the section just
  // printed, as comments (parsers skip them): spread, the share of the
  // memory bandwidth, Gloo on the same group, bytes sent per device.
  void EndSection() {
    if (options_.json || section_.empty()) return;
    std::printf("#  %10s  %10s  %10s  %7s  %9s  %7s  %10s  %10s  %10s\n",
                "size(B)", "min(us)", "max(us)", "%membw", "gloo-bus",
                "vs-gloo", "iciB/dev", "dcnB/dev", "formula");
    for (const Row& r : section_) {
      const double busbw = BusBw(r.op, r.bytes, r.oop, r.group_size);
      char gloo[32] = "-", ratio[32] = "-";
      if (r.gloo_busbw > 0) {
        std::snprintf(gloo, sizeof gloo, "%.2f", r.gloo_busbw);
        std::snprintf(ratio, sizeof ratio, "%.2fx", busbw / r.gloo_busbw);
      }
      std::printf(
          "#  %10lld  %10.1f  %10.1f  %6.1f%%  %9s  %7s  %10.0f  %10.0f  "
          "%10.0f\n",
          r.bytes, r.oop.min_us, r.oop.max_us, 100 * busbw / membw_.median_gbps,
          gloo, ratio, r.ici_bytes, r.dcn_bytes, r.dcn_formula);
    }
    section_.clear();
    std::fflush(stdout);
  }

  // Baselines are other libraries' all-reduce, not ours: commented rows, so
  // that the data lines and the average are our collectives only.
  void Baseline(const std::string& name, const std::string& note) {
    heartbeat_.Touch("the " + name + " baseline");
    if (options_.json) {
      baseline_notes_[name] = note;
      return;
    }
    const bool skipped = note.rfind("skipped", 0) == 0;
    std::printf("#\n# all_reduce, baseline %s: %s%s\n", name.c_str(),
                note.c_str(), skipped ? "" : " (rows commented)");
    if (skipped) return;
    std::printf(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %10s %10s %7s\n",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
        "#wrong", "min(us)", "max(us)", "%membw");
  }

  void BaselineRow(const std::string& name, long long bytes, size_t count,
                   int n, const Stats& s, long long wrong) {
    heartbeat_.Touch("the " + name + " baseline above " +
                     FormatBytes(static_cast<double>(bytes)));
    const double algbw = bytes / s.median_us / 1e3;
    const double busbw = algbw * BusFactor("all_reduce", n);
    baselines_[name].push_back({{"bytes", bytes},
                                {"count", count},
                                {"participants", n},
                                {"time_us", s.median_us},
                                {"min_us", s.min_us},
                                {"max_us", s.max_us},
                                {"algbw_gbps", algbw},
                                {"busbw_gbps", busbw},
                                {"wrong", wrong}});
    if (options_.json) return;
    std::printf(
        "# %10lld  %12zu  %8s  %6s  %6i  %7s  %6.2f  %6.2f  %5s  %10.1f "
        "%10.1f %6.1f%%\n",
        bytes, count, NcclTypeName(options_.dtype), "sum", -1,
        TimeText(s.median_us).c_str(), algbw, busbw,
        wrong < 0 ? "-" : std::to_string(wrong).c_str(), s.min_us, s.max_us,
        100 * busbw / membw_.median_gbps);
    std::fflush(stdout);
  }

  // Free-form lines (skipped paths, notes) as comments.
  // Heartbeats on stderr from now until Finish (the printing process).
  void StartHeartbeat() {
    if (!options_.json) heartbeat_.Start();
  }

  void Note(const std::string& text) {
    if (options_.json) return;
    std::printf("#\n# %s\n", text.c_str());
    std::fflush(stdout);
  }

  void Finish(long long total_wrong) {
    heartbeat_.Stop();
    if (!options_.json) {
      // nccl-tests' closing lines: the average is over every busbw printed,
      // out-of-place and in-place.
      std::printf("# Out of bounds values : %lld %s\n", total_wrong,
                  total_wrong == 0 ? "OK" : "FAILED");
      std::printf("# Avg bus bandwidth    : %g \n",
                  bus_count_ > 0 ? bus_sum_ / bus_count_ : 0.0);
      std::printf("#\n");
      return;
    }
    nlohmann::json out;
    out["num_slices"] = rt_.env().num_slices;
    out["accelerator_type"] = rt_.env().accelerator_type;
    out["num_devices"] = rt_.devices().size();
    out["dtype"] = comm::Name(options_.dtype);
    out["iters"] = options_.iters;
    out["warmup_iters"] = options_.warmup_iters;
    out["memory_bandwidth_gbps"] = {{"median", membw_.median_gbps},
                                    {"min", membw_.min_gbps},
                                    {"max", membw_.max_gbps},
                                    {"threads", membw_.threads},
                                    {"bytes", membw_.bytes}};
    nlohmann::json rows = nlohmann::json::array();
    for (const Row& r : rows_) {
      const double algbw = r.bytes / r.oop.median_us / 1e3;
      const double busbw = algbw * BusFactor(r.op, r.group_size);
      const double algbw_ip = r.bytes / r.ip.median_us / 1e3;
      nlohmann::json row = {
          {"op", r.op},
          {"path", r.path},
          {"bytes", r.bytes},
          {"count", r.count},
          {"participants", r.group_size},
          {"out_of_place",
           {{"time_us", r.oop.median_us},
            {"min_us", r.oop.min_us},
            {"max_us", r.oop.max_us},
            {"algbw_gbps", algbw},
            {"busbw_gbps", busbw},
            {"wrong", r.wrong_oop}}},
          {"in_place",
           {{"time_us", r.ip.median_us},
            {"min_us", r.ip.min_us},
            {"max_us", r.ip.max_us},
            {"algbw_gbps", algbw_ip},
            {"busbw_gbps", algbw_ip * BusFactor(r.op, r.group_size)},
            {"wrong", r.wrong_ip}}},
          {"busbw_over_membw", busbw / membw_.median_gbps},
          {"ici_bytes_per_device", r.ici_bytes},
          {"dcn_bytes_per_device", r.dcn_bytes},
          {"dcn_bytes_formula", r.dcn_formula}};
      if (r.gloo_busbw > 0) {
        row["gloo_same_group_busbw_gbps"] = r.gloo_busbw;
        row["vs_gloo"] = busbw / r.gloo_busbw;
      }
      rows.push_back(row);
    }
    out["results"] = rows;
    out["baselines"] = baselines_;
    out["baseline_notes"] = baseline_notes_;
    out["wrong"] = total_wrong;
    std::printf("%s\n", out.dump(2).c_str());
  }

 private:
  const CollectivesBenchOptions& options_;
  runtime::Runtime& rt_;
  MemoryBandwidth membw_;
  Heartbeat heartbeat_;
  void PrintColumnHeader() {
    std::printf(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                "
        "       in-place          \n",
        "", "", "", "", "");
    std::printf(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s "
        "%6s\n",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
        "#wrong", "time", "algbw", "busbw", "#wrong");
    std::printf(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  "
        "%5s\n",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
        "(GB/s)", "(GB/s)", "");
  }

  void PrintTimes(long long bytes, double us, double busbw, long long wrong) {
    std::printf("  %7s  %6.2f  %6.2f  %5lld", TimeText(us).c_str(),
                bytes / us / 1e3, busbw, wrong);
  }

  std::vector<Row> rows_, section_;
  double bus_sum_ = 0;
  int bus_count_ = 0;
  nlohmann::json baselines_ = nlohmann::json::object();
  nlohmann::json baseline_notes_ = nlohmann::json::object();
};

std::vector<long long> Sizes(const CollectivesBenchOptions& o) {
  std::vector<long long> sizes;
  for (long long b = o.min_bytes; b <= o.max_bytes; b *= o.step_factor) {
    sizes.push_back(b);
    if (o.step_factor <= 1) break;
  }
  return sizes;
}

// Runs Open MPI's all-reduce over every device of the job; the job must be on
// this machine. Returns rows of JSON from the helper, or an explanation.
Result<std::vector<nlohmann::json>> RunMpiFlat(
    const CollectivesBenchOptions& options, int ranks) {
  const std::string helper =
      (std::filesystem::path(runtime::SelfExecutable()).parent_path() /
       "multislice-mpi-allreduce")
          .string();
  if (::access(helper.c_str(), X_OK) != 0) {
    return NotFound("not built (Open MPI's development files were missing)");
  }
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    return NotFound("mpirun is not installed (Debian package openmpi-bin)");
  }
  std::string sizes;
  for (long long b : Sizes(options)) {
    sizes += (sizes.empty() ? "" : ",") + std::to_string(b);
  }
  // TCP between ranks, as DCN is; one rank per device.
  const std::string command =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun "
      "--oversubscribe --bind-to none --mca btl self,tcp -np " +
      std::to_string(ranks) + " " + helper + " " + sizes + " " +
      std::to_string(options.iters) + " " +
      std::to_string(options.warmup_iters) + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return Internal("cannot run mpirun");
  std::vector<nlohmann::json> rows;
  std::string output;
  char line[4096];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    output += line;
    auto parsed = nlohmann::json::parse(line, nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) rows.push_back(parsed);
  }
  const int status = ::pclose(pipe);
  if (status != 0 || rows.empty()) {
    return Internal("mpirun failed: " + output.substr(0, 500));
  }
  return rows;
}

}  // namespace

Status ValidateCollectivesBenchOptions(const CollectivesBenchOptions& o) {
  for (const std::string& op : o.ops) {
    if (op != "all_reduce" && op != "reduce_scatter" && op != "all_gather") {
      return InvalidArgument("--ops: '" + op +
                             "' is not one of all_reduce, reduce_scatter, "
                             "all_gather");
    }
  }
  for (const std::string& p : o.paths) {
    if (p != "ici" && p != "dcn" && p != "two-level") {
      return InvalidArgument("--paths: '" + p +
                             "' is not one of ici, dcn, two-level");
    }
  }
  for (const std::string& b : o.baselines) {
    if (b != "gloo-flat" && b != "mpi-flat") {
      return InvalidArgument("--baselines: '" + b +
                             "' is not one of gloo-flat, mpi-flat");
    }
  }
  if (o.min_bytes < 4 || o.max_bytes < o.min_bytes) {
    return InvalidArgument(
        "--minbytes/--maxbytes: need 4 <= minbytes <= "
        "maxbytes, got " +
        std::to_string(o.min_bytes) + " and " + std::to_string(o.max_bytes));
  }
  if (o.max_bytes > (4ll << 30)) {
    return InvalidArgument("--maxbytes: " + std::to_string(o.max_bytes) +
                           " is above the 4 GiB limit");
  }
  if (o.step_factor < 2) {
    return InvalidArgument("--stepfactor: expected at least 2, got " +
                           std::to_string(o.step_factor));
  }
  if (o.iters < 1) {
    return InvalidArgument("--iters: expected at least 1, got " +
                           std::to_string(o.iters));
  }
  if (o.warmup_iters < 0) {
    return InvalidArgument("--warmup_iters: expected at least 0, got " +
                           std::to_string(o.warmup_iters));
  }
  return OkStatus();
}

int RunCollectivesBench(runtime::Runtime& rt,
                        const CollectivesBenchOptions& options) {
  const bool printer = rt.process_index() == 0;
  const int local_devices = static_cast<int>(rt.local_devices().size());
  MemoryBandwidth membw;
  if (printer) membw = MeasureMemoryBandwidth(local_devices, 256 << 20, 5);
  Reporter reporter(options, rt, membw);

  const size_t es = comm::SizeOf(options.dtype);
  const std::vector<long long> sizes = Sizes(options);
  if (printer) {
    reporter.Header(options.min_bytes, sizes.back());
    reporter.StartHeartbeat();
  }
  const bool want_gloo_flat =
      std::find(options.baselines.begin(), options.baselines.end(),
                "gloo-flat") != options.baselines.end();
  std::mutex mu;
  long long total_wrong = 0;

  Status status = rt.RunOnDevices([&](int local) -> Status {
    DeviceRunner runner(rt, local, options);
    const bool prints = printer && local == 0;
    // Which paths exist on this mesh, and their Gloo twins for all_reduce.
    std::vector<std::string> paths;
    for (const std::string& path : options.paths) {
      ASSIGN_OR_RETURN(const AxisGroup* g,
                       runner.collectives().Group(AxesOfPath(path)));
      // By the levels the group spans: inside slices, across them, both.
      const bool inside = g->ici_size > 1, across = g->dcn_size > 1;
      const bool exists = (path == "ici" && inside && !across) ||
                          (path == "dcn" && across && !inside) ||
                          (path == "two-level" && inside && across);
      if (exists) {
        paths.push_back(path);
      } else if (prints) {
        reporter.Note("path " + path + ": not on this mesh (" +
                      std::to_string(rt.env().num_slices) + " slice(s) of " +
                      std::to_string(rt.accelerator().devices_per_slice()) +
                      " devices), skipped");
      }
    }
    const bool all_reduce = std::find(options.ops.begin(), options.ops.end(),
                                      "all_reduce") != options.ops.end();
    if (all_reduce) {
      for (const std::string& path : paths) {
        RETURN_IF_ERROR(runner.ConnectGloo(path, AxesOfPath(path)));
      }
    }
    if (want_gloo_flat && rt.devices().size() > 1) {
      RETURN_IF_ERROR(runner.ConnectGloo("gloo-flat", kAllAxes));
    }
    for (const std::string& op : options.ops) {
      for (const std::string& path : paths) {
        const Axes axes = AxesOfPath(path);
        ASSIGN_OR_RETURN(const AxisGroup* g, runner.collectives().Group(axes));
        if (prints) reporter.Section(op, path, *g);
        for (long long bytes : sizes) {
          Row row;
          row.op = op;
          row.path = path;
          row.bytes = bytes;
          row.count = static_cast<size_t>(bytes) / es;
          row.group_size = g->size;
          std::vector<double> oop, ip, gloo;
          long long wrong_oop = 0, wrong_ip = 0;
          double ici_oop = 0, dcn_oop = 0, ici_ip = 0, dcn_ip = 0;
          RETURN_IF_ERROR(runner.Run(op, axes, row.count, false, &oop,
                                     &wrong_oop, &ici_oop, &dcn_oop));
          RETURN_IF_ERROR(runner.Run(op, axes, row.count, true, &ip, &wrong_ip,
                                     &ici_ip, &dcn_ip));
          if (op == "all_reduce") {
            RETURN_IF_ERROR(runner.RunGloo(path, row.count, &gloo));
          }
          // Slowest device per iteration; wrong values summed over devices.
          std::vector<float> slowest(oop.begin(), oop.end());
          slowest.insert(slowest.end(), ip.begin(), ip.end());
          slowest.insert(slowest.end(), gloo.begin(), gloo.end());
          slowest.push_back(static_cast<float>(ici_oop));
          slowest.push_back(static_cast<float>(dcn_oop));
          RETURN_IF_ERROR(runner.Combine(&slowest, ReduceOp::kMax));
          std::vector<float> wrong = {static_cast<float>(wrong_oop),
                                      static_cast<float>(wrong_ip)};
          RETURN_IF_ERROR(runner.Combine(&wrong, ReduceOp::kSum));
          if (!prints) continue;
          const size_t n = oop.size();
          row.oop = Summarize({slowest.begin(), slowest.begin() + n});
          row.ip = Summarize({slowest.begin() + n, slowest.begin() + 2 * n});
          if (!gloo.empty()) {
            Stats g_stats =
                Summarize({slowest.begin() + 2 * n, slowest.begin() + 3 * n});
            row.gloo_busbw = bytes / g_stats.median_us / 1e3 *
                             BusFactor("all_reduce", g->size);
          }
          row.ici_bytes = slowest[slowest.size() - 2];
          row.dcn_bytes = slowest.back();
          row.dcn_formula = DcnFormula(op, *g, static_cast<double>(bytes));
          row.wrong_oop = static_cast<long long>(wrong[0]);
          row.wrong_ip = static_cast<long long>(wrong[1]);
          {
            std::lock_guard<std::mutex> lock(mu);
            total_wrong += row.wrong_oop + row.wrong_ip;
          }
          reporter.Print(row);
        }
        if (prints) reporter.EndSection();
      }
    }
    if (want_gloo_flat && rt.devices().size() > 1) {
      if (prints) {
        reporter.Baseline("gloo-flat",
                          "gloo::allreduce (ring) over all " +
                              std::to_string(rt.devices().size()) +
                              " devices as one group, one rank per device");
      }
      for (long long bytes : sizes) {
        std::vector<double> gloo;
        const size_t count = static_cast<size_t>(bytes) / es;
        RETURN_IF_ERROR(runner.RunGloo("gloo-flat", count, &gloo));
        std::vector<float> slowest(gloo.begin(), gloo.end());
        RETURN_IF_ERROR(runner.Combine(&slowest, ReduceOp::kMax));
        if (prints) {
          reporter.BaselineRow("gloo-flat", bytes, count,
                               static_cast<int>(rt.devices().size()),
                               Summarize({slowest.begin(), slowest.end()}), -1);
        }
      }
    }
    return runner.Barrier();
  });
  if (!status.ok()) return 1;

  const bool want_mpi =
      std::find(options.baselines.begin(), options.baselines.end(),
                "mpi-flat") != options.baselines.end();
  if (printer && want_mpi) {
    const int ranks = static_cast<int>(rt.devices().size());
    std::string why;
    if (options.dtype != DType::kF32) why = "MPI has no bf16 type";
    if (rt.store_address().kind != dcn::StoreAddress::Kind::kFile) {
      why = "the job spans machines; run mpi-flat on one machine";
    }
    if (ranks < 2) why = "needs at least 2 devices";
    Result<std::vector<nlohmann::json>> rows =
        why.empty() ? RunMpiFlat(options, ranks)
                    : Result<std::vector<nlohmann::json>>(NotFound(why));
    if (!rows.ok()) {
      reporter.Baseline("mpi-flat", "skipped: " + rows.status().message());
    } else {
      reporter.Baseline("mpi-flat", "Open MPI MPI_Allreduce over " +
                                        std::to_string(ranks) +
                                        " ranks (one per device), btl tcp");
      for (const nlohmann::json& r : *rows) {
        const long long bytes = r["bytes"];
        const long long wrong = r["wrong"];
        total_wrong += wrong;
        reporter.BaselineRow("mpi-flat", bytes, static_cast<size_t>(bytes) / es,
                             ranks, {r["median_us"], r["min_us"], r["max_us"]},
                             wrong);
      }
    }
  }
  if (printer) reporter.Finish(total_wrong);
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace multislice::bench
