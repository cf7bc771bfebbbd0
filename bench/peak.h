// One device's compute limit: how many GFLOP/s oneDNN's matmul reaches on
// one thread, alone or while other device threads of the host run their own
// matmuls at the same time. `multislice peak` prints these; the shardings
// workload divides its achieved FLOP/s by them (../shared/benchmarking.md:
// the peak is measured by the same binary, same dtype, same thread count).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "compute/matmul.h"

namespace multislice::bench {

struct MatmulPeak {
  compute::GemmDesc desc;
  int threads = 1;  // device threads that ran it at once
  int reps = 0;     // timed calls per thread
  // GFLOP/s of one device (10^9 * 2mnk per second of one call on one
  // thread): the median, min and max over every timed call of every thread.
  double median_gflops = 0;
  double min_gflops = 0;
  double max_gflops = 0;
  // The median over timed calls of (CPU time of the calling thread / wall
  // time): about 1 when each device thread had a core to itself; well below
  // 1 when other processes (or too many device threads) shared the cores, so
  // the rate above understates the device.
  double cpu_share = 0;
  std::string impl;  // oneDNN's implementation, e.g. "brg:avx512_core_bf16"
};

// 2 * m * n * k.
double GemmFlops(const compute::GemmDesc& desc);

// Times `reps` (>= 1) Gemm calls on one new single-threaded thread, after
// two untimed calls, on buffers it allocates and fills first (so no page
// faults or primitive creation are timed). kInvalidArgument for a bad desc
// or reps; kInternal if oneDNN fails.
Result<MatmulPeak> MeasureMatmulPeak(const compute::GemmDesc& desc, int reps);

// The same on `threads` (>= 1) threads at once, each single-threaded with its
// own buffers, every call started together behind a barrier: the per-device
// rate when that many devices share the host.
Result<MatmulPeak> MeasureConcurrentMatmulPeak(const compute::GemmDesc& desc,
                                               int reps, int threads);

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
