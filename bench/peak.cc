// Matmul peak measurement: see peak.h.
//
// Each measuring thread owns its A, B and C (filled before timing, so their
// pages exist and hold ordinary numbers, not denormals), calls Gemm twice
// untimed (the first creates the primitive), then times each call on its own
// with a steady clock. Threads meet at a barrier before every call so that
// concurrent runs really overlap, which is the case the per-device peak of a
// multi-device host is about.
#include "bench/peak.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "compute/random.h"
#include "runtime/comm/dcn/store.h"
#include "runtime/worker_env.h"

namespace multislice::bench {
namespace {

using compute::GemmDesc;

// The stored size of an operand of `rows` rows with leading dimension `ld`.
size_t Elements(int64_t rows, int64_t ld_or_cols) {
  return static_cast<size_t>(rows) * static_cast<size_t>(ld_or_cols);
}

struct Buffers {
  std::vector<unsigned char> a, b, c;
};

Buffers MakeBuffers(const GemmDesc& d, uint64_t seed) {
  const int64_t a_rows = d.transpose_a ? d.k : d.m;
  const int64_t a_cols = d.transpose_a ? d.m : d.k;
  const int64_t b_rows = d.transpose_b ? d.n : d.k;
  const int64_t b_cols = d.transpose_b ? d.k : d.n;
  const int64_t lda = d.lda ? d.lda : a_cols;
  const int64_t ldb = d.ldb ? d.ldb : b_cols;
  const int64_t ldc = d.ldc ? d.ldc : d.n;
  Buffers buf;
  buf.a.resize(Elements(a_rows, lda) * SizeOf(d.ab_type));
  buf.b.resize(Elements(b_rows, ldb) * SizeOf(d.ab_type));
  buf.c.resize(Elements(d.m, ldc) * SizeOf(d.c_type));
  // Small values, as a model's would be; C too, for beta != 0.
  compute::FillBlock(compute::Distribution::kUniform, seed, 0, 0.01f, a_cols, 0,
                     0, a_rows, a_cols, false, d.ab_type, buf.a.data(), lda);
  compute::FillBlock(compute::Distribution::kUniform, seed, 1, 0.01f, b_cols, 0,
                     0, b_rows, b_cols, false, d.ab_type, buf.b.data(), ldb);
  compute::FillBlock(compute::Distribution::kUniform, seed, 2, 0.01f, d.n, 0, 0,
                     d.m, d.n, false, d.c_type, buf.c.data(), ldc);
  return buf;
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// PeakTime::kStartup: what one round of calls may take (a slow matmul, on
// the baseline ISA or a 2-core machine with 4 devices, gets fewer calls per
// round, down to one) and how long the retakes may go on.
constexpr double kRoundBudgetSeconds = 0.25;
constexpr double kRetakeBudgetSeconds = 3.0;

}  // namespace

int StartupCallsPerRound(int per_round, double call_seconds) {
  if (call_seconds <= 0) return per_round;
  const int fit = static_cast<int>(kRoundBudgetSeconds / call_seconds);
  return std::clamp(fit, 1, per_round);
}

namespace {

// `rounds` rounds of `per_round` timed calls (with kStartup,
// StartupCallsPerRound
// of the last untimed call's time) on `threads` threads at once, after
// kWarmupCalls untimed calls; the best round's median is the rate.
Result<MatmulPeak> MeasureRounds(const GemmDesc& desc, int rounds,
                                 int requested_per_round, int threads,
                                 PeakTime time) {
  constexpr int kWarmupCalls = 2;
  using Clock = std::chrono::steady_clock;
  int per_round = requested_per_round;  // thread 0 sets it after warm-up
  std::vector<std::vector<double>> seconds(threads), cpu_shares(threads);
  std::vector<Status> status(threads);
  std::string impl;
  std::barrier sync(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      compute::SetSingleThreaded();
      Buffers buf = MakeBuffers(desc, 1000 + t);
      // One call, timed into `seconds` and `cpu_shares` when `record`; a
      // thread that failed keeps meeting the barriers so others finish.
      auto call = [&](bool record) {
        sync.arrive_and_wait();
        if (!status[t].ok()) return 0.0;
        const double cpu_start = ThreadCpuSeconds();
        const auto start = Clock::now();
        status[t] =
            compute::Gemm(desc, buf.a.data(), buf.b.data(), buf.c.data());
        const double elapsed =
            std::chrono::duration<double>(Clock::now() - start).count();
        if (record) {
          seconds[t].push_back(elapsed);
          cpu_shares[t].push_back((ThreadCpuSeconds() - cpu_start) / elapsed);
        }
        return elapsed;
      };
      double last_warmup = 0;
      for (int i = 0; i < kWarmupCalls; ++i) last_warmup = call(false);
      if (t == 0 && time == PeakTime::kStartup) {
        per_round = StartupCallsPerRound(requested_per_round, last_warmup);
      }
      sync.arrive_and_wait();  // every thread reads per_round after this
      for (int i = 0; i < rounds * per_round; ++i) call(true);
      if (t == 0 && status[t].ok()) {
        Result<std::string> name = compute::GemmImplName(desc);
        if (name.ok()) impl = *name;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (const Status& s : status) RETURN_IF_ERROR(s);
  const double flops = GemmFlops(desc);
  MatmulPeak peak;
  peak.desc = desc;
  peak.threads = threads;
  peak.reps = rounds * per_round;
  peak.rounds = rounds;
  std::vector<double> all, shares;
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> round;
    for (int t = 0; t < threads; ++t) {
      for (int i = r * per_round; i < (r + 1) * per_round; ++i) {
        round.push_back(flops / seconds[t][i] / 1e9);
      }
    }
    all.insert(all.end(), round.begin(), round.end());
    peak.round_gflops.push_back(Median(round));
    std::vector<double> round_shares;
    for (int t = 0; t < threads; ++t) {
      round_shares.insert(round_shares.end(),
                          cpu_shares[t].begin() + r * per_round,
                          cpu_shares[t].begin() + (r + 1) * per_round);
    }
    peak.round_cpu_shares.push_back(Median(round_shares));
  }
  for (const std::vector<double>& s : cpu_shares) {
    shares.insert(shares.end(), s.begin(), s.end());
  }
  peak.median_gflops =
      *std::max_element(peak.round_gflops.begin(), peak.round_gflops.end());
  peak.min_gflops = *std::min_element(all.begin(), all.end());
  peak.max_gflops = *std::max_element(all.begin(), all.end());
  peak.cpu_share = Median(shares);
  peak.impl = impl;
  return peak;
}

int CpuCount() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}

// The CPU share of the round that gave the peak.
double BestRoundShare(const MatmulPeak& p) {
  const size_t best =
      std::max_element(p.round_gflops.begin(), p.round_gflops.end()) -
      p.round_gflops.begin();
  return p.round_cpu_shares[best];
}

// MeasureRounds, again up to kMaxRetakes times while the best round's
// threads had less of a CPU than they could have (another process took the
// cores): the better of a few measurements counts only if one of them ran
// undisturbed. All rounds are kept; the best round's median is the peak.
Result<MatmulPeak> MeasureBestRounds(const GemmDesc& desc, int per_round,
                                     int threads, PeakTime time) {
  constexpr int kMaxRetakes = 3;
  const auto start = std::chrono::steady_clock::now();
  auto within_budget = [&] {
    return time == PeakTime::kAllCalls ||
           std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
                   .count() < kRetakeBudgetSeconds;
  };
  ASSIGN_OR_RETURN(MatmulPeak peak,
                   MeasureRounds(desc, kPeakRounds, per_round, threads, time));
  const double fair = std::min(1.0, static_cast<double>(CpuCount()) / threads);
  for (int i = 0;
       i < kMaxRetakes && BestRoundShare(peak) < 0.9 * fair && within_budget();
       ++i) {
    ASSIGN_OR_RETURN(MatmulPeak more, MeasureRounds(desc, kPeakRounds,
                                                    per_round, threads, time));
    peak.reps += more.reps;
    peak.rounds += more.rounds;
    peak.round_gflops.insert(peak.round_gflops.end(), more.round_gflops.begin(),
                             more.round_gflops.end());
    peak.round_cpu_shares.insert(peak.round_cpu_shares.end(),
                                 more.round_cpu_shares.begin(),
                                 more.round_cpu_shares.end());
    peak.median_gflops = std::max(peak.median_gflops, more.median_gflops);
    peak.min_gflops = std::min(peak.min_gflops, more.min_gflops);
    peak.max_gflops = std::max(peak.max_gflops, more.max_gflops);
    peak.cpu_share = Median(peak.round_cpu_shares);
  }
  return peak;
}

// A file name for one measurement: the matmul and the call count.
std::string PeakKey(const GemmDesc& d, int per_round, int threads) {
  std::string key = std::to_string(d.m) + "x" + std::to_string(d.n) + "x" +
                    std::to_string(d.k) + "-" + std::string(Name(d.ab_type)) +
                    "-" + std::string(Name(d.c_type));
  if (d.transpose_a) key += "-ta";
  if (d.transpose_b) key += "-tb";
  if (d.sigmoid) key += "-sig";
  if (d.bias) key += "-bias";
  if (d.alpha != 1.0f) key += "-alpha" + std::to_string(d.alpha);
  if (d.beta != 0.0f) key += "-beta" + std::to_string(d.beta);
  if (d.lda || d.ldb || d.ldc) {
    key += "-ld" + std::to_string(d.lda) + "." + std::to_string(d.ldb) + "." +
           std::to_string(d.ldc);
  }
  return key + "-r" + std::to_string(per_round) + "-t" +
         std::to_string(threads);
}

nlohmann::json PeakToJson(const MatmulPeak& p) {
  return {{"threads", p.threads},
          {"reps", p.reps},
          {"rounds", p.rounds},
          {"median_gflops", p.median_gflops},
          {"min_gflops", p.min_gflops},
          {"max_gflops", p.max_gflops},
          {"round_gflops", p.round_gflops},
          {"round_cpu_shares", p.round_cpu_shares},
          {"cpu_share", p.cpu_share},
          {"impl", p.impl},
          {"processes", p.processes}};
}

MatmulPeak PeakFromJson(const GemmDesc& desc, const nlohmann::json& j) {
  MatmulPeak p;
  p.desc = desc;
  p.threads = j.at("threads");
  p.reps = j.at("reps");
  p.rounds = j.at("rounds");
  p.median_gflops = j.at("median_gflops");
  p.min_gflops = j.at("min_gflops");
  p.max_gflops = j.at("max_gflops");
  p.round_gflops = j.at("round_gflops").get<std::vector<double>>();
  p.round_cpu_shares = j.at("round_cpu_shares").get<std::vector<double>>();
  p.cpu_share = j.at("cpu_share");
  p.impl = j.at("impl");
  p.processes = j.at("processes");
  p.measured_here = false;
  return p;
}

// Every worker of the share says it is here, then waits (bounded) for the
// others, so that none of them is busy with other work during the
// measurement.
void MeetOthers(const PeakShare& share, const std::string& key) {
  namespace fs = std::filesystem;
  std::ofstream(share.dir + "/" + key + ".arrived." + share.name).put('\n');
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(share.wait_seconds);
  const std::string prefix = key + ".arrived.";
  while (std::chrono::steady_clock::now() < deadline) {
    int arrived = 0;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(share.dir, ec)) {
      arrived += e.path().filename().string().rfind(prefix, 0) == 0;
    }
    if (arrived >= share.processes) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// One worker (the first to take the lock) measures with the devices of all
// of them; the others wait on the lock, idle, and read its result.
Result<MatmulPeak> MeasureOnceForAll(const GemmDesc& desc, int per_round,
                                     int threads, const PeakShare& share,
                                     PeakTime time) {
  std::error_code ec;
  std::filesystem::create_directories(share.dir, ec);
  if (ec) {
    return Internal("cannot create " + share.dir + ": " + ec.message());
  }
  const std::string key = PeakKey(desc, per_round, threads);
  MeetOthers(share, key);
  const std::string lock_path = share.dir + "/" + key + ".lock";
  const int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) return Internal("cannot open " + lock_path);
  while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  const std::string result_path = share.dir + "/" + key + ".json";
  Result<MatmulPeak> peak = Internal("unset");
  std::ifstream in(result_path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  bool read = false;
  if (!j.is_discarded() && j.is_object()) {
    try {
      peak = PeakFromJson(desc, j);
      read = true;
    } catch (const nlohmann::json::exception&) {
      // Not a result this binary wrote: measure and replace it.
    }
  }
  if (!read) {
    peak = MeasureBestRounds(desc, per_round, threads * share.processes, time);
    if (peak.ok()) {
      peak->processes = share.processes;
      const std::string tmp = result_path + ".tmp";
      std::ofstream(tmp) << PeakToJson(*peak).dump();
      std::filesystem::rename(tmp, result_path, ec);
    }
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return peak;
}

}  // namespace

double GemmFlops(const GemmDesc& desc) {
  return 2.0 * static_cast<double>(desc.m) * static_cast<double>(desc.n) *
         static_cast<double>(desc.k);
}

Result<MatmulPeak> MeasureMatmulPeak(const GemmDesc& desc, int reps) {
  if (reps < 1) {
    return InvalidArgument("reps: expected at least 1, got " +
                           std::to_string(reps));
  }
  return MeasureSharedMatmulPeak(desc, reps, 1, std::nullopt);
}

Result<MatmulPeak> MeasureConcurrentMatmulPeak(const GemmDesc& desc, int reps,
                                               int threads, PeakTime time) {
  return MeasureSharedMatmulPeak(desc, reps, threads, LocalPeakShare(), time);
}

std::optional<PeakShare> LocalPeakShare() {
  auto env = runtime::ReadWorkerEnv(runtime::ProcessEnvironment());
  if (!env.ok() || !env->has_value()) return std::nullopt;
  const runtime::WorkerEnv& e = **env;
  const int processes =
      e.num_slices * static_cast<int>(e.worker_hostnames.size());
  auto store = dcn::ParseStoreAddress(e.coordinator_address);
  if (processes <= 1 || !store.ok() ||
      store->kind != dcn::StoreAddress::Kind::kFile) {
    return std::nullopt;
  }
  PeakShare share;
  share.dir =
      store->path + "/peak/" + e.run_id + "/" + std::to_string(e.attempt);
  share.processes = processes;
  share.name = "slice" + std::to_string(e.slice_id) + "-worker" +
               std::to_string(e.worker_id);
  return share;
}

Result<MatmulPeak> MeasureSharedMatmulPeak(
    const GemmDesc& desc, int reps, int threads,
    const std::optional<PeakShare>& share, PeakTime time) {
  if (reps < 1) {
    return InvalidArgument("reps: expected at least 1, got " +
                           std::to_string(reps));
  }
  if (threads < 1) {
    return InvalidArgument("threads: expected at least 1, got " +
                           std::to_string(threads));
  }
  const int per_round = std::max(3, (reps + kPeakRounds - 1) / kPeakRounds);
  if (!share.has_value() || share->processes <= 1) {
    return MeasureBestRounds(desc, per_round, threads, time);
  }
  return MeasureOnceForAll(desc, per_round, threads, *share, time);
}

std::vector<WorkloadGemm> ShardingsLayerGemms(int64_t embedding_dimension,
                                              int64_t batch_size, DType ab_type,
                                              DType c_type) {
  const int64_t d = embedding_dimension, ff = 4 * embedding_dimension;
  const int64_t b = batch_size;
  auto make = [&](int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                  bool sigmoid) {
    GemmDesc desc;
    desc.m = m;
    desc.n = n;
    desc.k = k;
    desc.transpose_a = ta;
    desc.transpose_b = tb;
    desc.ab_type = ab_type;
    desc.c_type = c_type;
    desc.sigmoid = sigmoid;
    return desc;
  };
  return {
      {"fwd M1=sig(x@W1^T)", make(b, ff, d, false, true, true)},
      {"fwd M2=sig(M1@W2)", make(b, d, ff, false, false, true)},
      {"bwd dW2=M1^T@dZ2", make(ff, d, b, true, false, false)},
      {"bwd dM1=dZ2@W2^T", make(b, ff, d, false, true, false)},
      {"bwd dW1=dZ1^T@x", make(ff, d, b, true, false, false)},
      {"bwd dx=dZ1@W1", make(b, d, ff, false, false, false)},
  };
}

Result<double> MeasureShardingsLayerRate(int64_t embedding_dimension,
                                         int64_t batch_size, DType dtype,
                                         int reps, int threads) {
  double flops = 0, seconds = 0;
  for (const WorkloadGemm& g :
       ShardingsLayerGemms(embedding_dimension, batch_size, dtype, dtype)) {
    ASSIGN_OR_RETURN(MatmulPeak p,
                     MeasureConcurrentMatmulPeak(g.desc, reps, threads));
    const double f = GemmFlops(g.desc);
    flops += f;
    seconds += f / (p.median_gflops * 1e9);
  }
  return flops / seconds / 1e9;
}

}  // namespace multislice::bench
