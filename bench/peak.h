// One device's compute limit: how many GFLOP/s oneDNN's matmul reaches on
// one thread, alone or while other device threads of the host run their own
// matmuls at the same time. `multislice peak` prints these; the shardings
// workload divides its achieved FLOP/s by them (../shared/benchmarking.md:
// the peak is measured by the same binary, same dtype, same thread count).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "compute/matmul.h"

namespace multislice::bench {

struct MatmulPeak {
  compute::GemmDesc desc;
  int threads = 1;  // device threads that ran it at once (all processes)
  int reps = 0;     // timed calls per thread, over every round
  int rounds = 1;   // measurements, each of reps / rounds calls
  // GFLOP/s of one device (10^9 * 2mnk per second of one call on one
  // thread): the best round's median (the median over that round's calls
  // of every thread), and the min and max over every timed call.
  double median_gflops = 0;
  double min_gflops = 0;
  double max_gflops = 0;
  std::vector<double> round_gflops;      // each round's median, in order
  std::vector<double> round_cpu_shares;  // each round's median cpu_share
  // The median over timed calls of (CPU time of the calling thread / wall
  // time): about 1 when each device thread had a core to itself; well below
  // 1 when other processes (or too many device threads) shared the cores, so
  // the rate above understates the device.
  double cpu_share = 0;
  std::string impl;  // oneDNN's implementation, e.g. "brg:avx512_core_bf16"
  // Worker processes of this job on this machine that the measurement
  // stood for (1: this process alone), and whether this process ran it
  // (false: it read another local worker's result).
  int processes = 1;
  bool measured_here = true;
};

// 2 * m * n * k.
double GemmFlops(const compute::GemmDesc& desc);

// One device alone: Gemm calls on one new single-threaded thread, after two
// untimed calls, on buffers it allocates and fills first (so no page faults
// or primitive creation are timed), in rounds as below, never shared.
// kInvalidArgument for a bad desc or reps; kInternal if oneDNN fails.
Result<MatmulPeak> MeasureMatmulPeak(const compute::GemmDesc& desc, int reps);

// The start-up peak that train, shardings and `peak` divide by: the rate of
// one device while every device of the host runs the same matmul at once.
// `threads` (>= 1) single-threaded threads, each with its own buffers, start
// every call together behind a barrier; kPeakRounds rounds of
// max(3, ceil(reps / kPeakRounds)) calls each after two untimed ones, and
// the best round's median is the peak (a round slowed by a neighbour's
// burst does not count; one round is too noisy on a shared machine). While
// the best round's threads had under 90 % of the CPU they could have had
// (min(1, CPUs / threads): other processes took the cores), up to 3 more
// sets of rounds are measured.
//
// When this process is a worker whose job has other workers on this
// machine (a file:// store: the local launcher's slices, or local hosts),
// they all meet first, then one of them measures with the devices of all
// of them (threads x processes) and the others read its result, so the
// peak is the one every device sees when all of them train, whichever
// worker reports it.
//
// PeakTime::kStartup (train's and shardings' start-up measurement) bounds
// its time: a round gets as many of its calls as fit in 0.25 s (at least
// one; a slow ISA or a crowded machine gets fewer), and the retakes stop
// once 3 s have gone into measuring. kAllCalls (`multislice peak`) makes
// every call asked for.
enum class PeakTime { kAllCalls, kStartup };

// kStartup's timed calls per round: `per_round`, fewer (at least 1) when a
// call takes `call_seconds` and that many would not fit in 0.25 s.
int StartupCallsPerRound(int per_round, double call_seconds);
Result<MatmulPeak> MeasureConcurrentMatmulPeak(
    const compute::GemmDesc& desc, int reps, int threads,
    PeakTime time = PeakTime::kAllCalls);

inline constexpr int kPeakRounds = 3;

// Where the workers of one job on one machine meet to share a measurement.
struct PeakShare {
  std::string dir;           // shared directory (created if missing)
  int processes = 1;         // workers that meet there
  std::string name;          // this worker's name, unique among them
  double wait_seconds = 60;  // for the others to arrive, then go on alone
};

// The share of this process: set when it is a worker of a job with a
// file:// store and more than one worker (its directory, under the store's,
// is keyed by run and attempt); nullopt otherwise.
std::optional<PeakShare> LocalPeakShare();

// MeasureConcurrentMatmulPeak with an explicit share (tests; nullopt:
// measure here with `threads` threads).
Result<MatmulPeak> MeasureSharedMatmulPeak(
    const compute::GemmDesc& desc, int reps, int threads,
    const std::optional<PeakShare>& share, PeakTime time = PeakTime::kAllCalls);

// A matmul of the shardings workload (spec 3.3), named for reports.
struct WorkloadGemm {
  std::string name;  // e.g. "fwd x@W1^T"
  compute::GemmDesc desc;
};

// The six matmuls of one shardings layer on one unsharded device, with
// activations x [b, d], M1 [b, 4d], M2 [b, d] and both weights stored
// [4d, d]: forward x@W1^T and M1@W2 (each with the fused sigmoid), backward
// dW2 = M1^T@dZ2, dM1 = dZ2@W2^T, dW1 = dZ1^T@x, dx = dZ1@W1. A and B are
// `ab_type`, C is `c_type`; beta 0.
std::vector<WorkloadGemm> ShardingsLayerGemms(int64_t embedding_dimension,
                                              int64_t batch_size, DType ab_type,
                                              DType c_type);

// The GFLOP/s of one shardings layer's six matmuls on `threads` devices at
// once: their FLOPs over the sum of their median times. With the 2048^3 rate,
// the ceiling that the workload's utilisation is measured against.
Result<double> MeasureShardingsLayerRate(int64_t embedding_dimension,
                                         int64_t batch_size, DType dtype,
                                         int reps, int threads);

}  // namespace multislice::bench
