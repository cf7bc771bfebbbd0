// The host's memory bandwidth, measured the way ../shared/benchmarking.md
// defines it: `y += x` over f32 arrays, counted as 2 reads + 1 write.
#pragma once

#include <cstddef>

namespace multislice::bench {

struct MemoryBandwidth {
  double median_gbps = 0;  // 10^9 bytes per second
  double min_gbps = 0;
  double max_gbps = 0;
  int threads = 1;
  size_t bytes = 0;  // size of each of x and y, summed over threads
};

// Splits two arrays of `bytes` each over `threads` threads and times `y += x`
// `reps` times after one warm-up; reports the median, min and max.
MemoryBandwidth MeasureMemoryBandwidth(int threads, size_t bytes, int reps);

}  // namespace multislice::bench
