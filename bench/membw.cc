#include "bench/membw.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "common/isa_dispatch.h"

namespace multislice::bench {
namespace {

// y += x, vectorised by GCC for the active ISA level.
struct AddIntoKernel {
  MS_KERNEL void operator()(auto, float* __restrict y,
                            const float* __restrict x, size_t n) const {
    for (size_t i = 0; i < n; ++i) y[i] += x[i];
  }
};

void AddInto(float* y, const float* x, size_t n) {
  isa::Dispatch<AddIntoKernel>(y, x, n);
}

}  // namespace

MemoryBandwidth MeasureMemoryBandwidth(int threads, size_t bytes, int reps) {
  const size_t n = bytes / sizeof(float) / threads;
  std::vector<double> seconds(reps + 1);
  std::barrier sync(threads);
  std::vector<std::thread> workers;
  using Clock = std::chrono::steady_clock;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      // Each thread touches its own arrays first, so pages are local to it.
      std::vector<float> x(n, 1.0f), y(n, 2.0f);
      for (int r = 0; r <= reps; ++r) {
        sync.arrive_and_wait();
        auto start = Clock::now();
        AddInto(y.data(), x.data(), n);
        sync.arrive_and_wait();
        if (t == 0) {
          seconds[r] =
              std::chrono::duration<double>(Clock::now() - start).count();
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  seconds.erase(seconds.begin());  // warm-up
  std::vector<double> gbps;
  const double moved = 3.0 * static_cast<double>(n) * threads * sizeof(float);
  for (double s : seconds) gbps.push_back(moved / s / 1e9);
  std::sort(gbps.begin(), gbps.end());
  MemoryBandwidth result;
  result.median_gbps = gbps[gbps.size() / 2];
  result.min_gbps = gbps.front();
  result.max_gbps = gbps.back();
  result.threads = threads;
  result.bytes = n * threads * sizeof(float);
  return result;
}

}  // namespace multislice::bench
