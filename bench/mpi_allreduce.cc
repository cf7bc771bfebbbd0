// The mpi-flat baseline of `multislice bench collectives`: Open MPI's
// MPI_Allreduce (f32 sum) over every rank as one group. Run under mpirun by
// the benchmark; rank 0 prints one JSON object per size:
//   {"bytes": B, "median_us": t, "min_us": t, "max_us": t, "wrong": n}
// Usage: multislice-mpi-allreduce BYTES[,BYTES...] ITERS WARMUP
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 4) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "usage: multislice-mpi-allreduce BYTES[,BYTES...] ITERS "
                   "WARMUP\n");
    }
    MPI_Finalize();
    return 2;
  }
  std::vector<long long> sizes;
  std::stringstream list(argv[1]);
  for (std::string item; std::getline(list, item, ',');) {
    sizes.push_back(std::atoll(item.c_str()));
  }
  const int iters = std::atoi(argv[2]), warmup = std::atoi(argv[3]);
  for (long long bytes : sizes) {
    const size_t count = static_cast<size_t>(bytes) / sizeof(float);
    std::vector<float> in(count, static_cast<float>(rank + 1)), out(count);
    std::vector<double> times;
    for (int i = 0; i < warmup + iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      double start = MPI_Wtime();
      MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT,
                    MPI_SUM, MPI_COMM_WORLD);
      double local = MPI_Wtime() - start, slowest = 0;
      MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (i >= warmup) times.push_back(slowest * 1e6);
    }
    const float want = static_cast<float>(size) * (size + 1) / 2;
    long long wrong = std::count_if(out.begin(), out.end(),
                                    [&](float v) { return v != want; });
    long long total_wrong = 0;
    MPI_Reduce(&wrong, &total_wrong, 1, MPI_LONG_LONG, MPI_SUM, 0,
               MPI_COMM_WORLD);
    std::sort(times.begin(), times.end());
    if (rank == 0) {
      std::printf(
          "{\"bytes\": %lld, \"median_us\": %.3f, \"min_us\": %.3f, "
          "\"max_us\": %.3f, \"wrong\": %lld}\n",
          bytes, times[times.size() / 2], times.front(), times.back(),
          total_wrong);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
