// Matmul peak measurement: see peak.h.
//
// Each measuring thread owns its A, B and C (filled before timing, so their
// pages exist and hold ordinary numbers, not denormals), calls Gemm twice
// untimed (the first creates the primitive), then times each call on its own
// with a steady clock. Threads meet at a barrier before every call so that
// concurrent runs really overlap, which is the case the per-device peak of a
// multi-device host is about.
#include "bench/peak.h"

#include <time.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "compute/random.h"

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

}  // namespace

double GemmFlops(const GemmDesc& desc) {
  return 2.0 * static_cast<double>(desc.m) * static_cast<double>(desc.n) *
         static_cast<double>(desc.k);
}

Result<MatmulPeak> MeasureMatmulPeak(const GemmDesc& desc, int reps) {
  return MeasureConcurrentMatmulPeak(desc, reps, 1);
}

Result<MatmulPeak> MeasureConcurrentMatmulPeak(const GemmDesc& desc, int reps,
                                               int threads) {
  if (reps < 1) {
    return InvalidArgument("reps: expected at least 1, got " +
                           std::to_string(reps));
  }
  if (threads < 1) {
    return InvalidArgument("threads: expected at least 1, got " +
                           std::to_string(threads));
  }
  constexpr int kWarmupCalls = 2;
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> seconds(threads), cpu_shares(threads);
  std::vector<Status> status(threads);
  std::string impl;
  std::barrier sync(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      compute::SetSingleThreaded();
      Buffers buf = MakeBuffers(desc, 1000 + t);
      for (int call = 0; call < kWarmupCalls + reps; ++call) {
        sync.arrive_and_wait();
        // A thread that failed keeps meeting the barrier so others finish.
        if (!status[t].ok()) continue;
        const double cpu_start = ThreadCpuSeconds();
        const auto start = Clock::now();
        status[t] =
            compute::Gemm(desc, buf.a.data(), buf.b.data(), buf.c.data());
        const double elapsed =
            std::chrono::duration<double>(Clock::now() - start).count();
        const double cpu = ThreadCpuSeconds() - cpu_start;
        if (call >= kWarmupCalls) {
          seconds[t].push_back(elapsed);
          cpu_shares[t].push_back(cpu / elapsed);
        }
      }
      if (t == 0 && status[t].ok()) {
        Result<std::string> name = compute::GemmImplName(desc);
        if (name.ok()) impl = *name;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (const Status& s : status) RETURN_IF_ERROR(s);
  std::vector<double> gflops, shares;
  const double flops = GemmFlops(desc);
  for (int t = 0; t < threads; ++t) {
    for (double s : seconds[t]) gflops.push_back(flops / s / 1e9);
    shares.insert(shares.end(), cpu_shares[t].begin(), cpu_shares[t].end());
  }
  std::sort(gflops.begin(), gflops.end());
  MatmulPeak peak;
  peak.desc = desc;
  peak.threads = threads;
  peak.reps = reps;
  peak.median_gflops = gflops[gflops.size() / 2];
  peak.min_gflops = gflops.front();
  peak.max_gflops = gflops.back();
  peak.cpu_share = Median(shares);
  peak.impl = impl;
  return peak;
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
