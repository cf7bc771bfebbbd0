#include "runtime/trace.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "common/temp_dir.h"

namespace multislice::runtime {
namespace {

TEST(TraceTest, WritesChromeTraceWithOneRowPerDeviceAndThreeTracks) {
  Trace trace;
  trace.NameDevice(0, "device 0 (slice 0 worker 0)");
  trace.NameDevice(3, "device 3 (slice 1 worker 0)");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        trace.Add(t % 2 == 0 ? 0 : 3, static_cast<Track>(i % 3),
                  "span" + std::to_string(i), 1000 * i, 1000 * i + 500);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  { ScopedSpan span(&trace, 0, Track::kCompute, "scoped"); }
  { ScopedSpan ignored(nullptr, 0, Track::kCompute, "not recorded"); }
  EXPECT_EQ(trace.size(), 401u);

  TempDir dir;
  const std::string path = dir.path() + "/trace.json";
  ASSERT_TRUE(trace.WriteJson(path).ok());
  nlohmann::json doc = nlohmann::json::parse(std::ifstream(path));
  int spans = 0, names = 0, tracks = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") {
      ++spans;
      EXPECT_TRUE(e["pid"] == 0 || e["pid"] == 3);
      EXPECT_GE(e["dur"].get<int64_t>(), 0);
    } else if (e["name"] == "process_name") {
      ++names;
    } else if (e["name"] == "thread_name") {
      ++tracks;
    }
  }
  EXPECT_EQ(spans, 401);
  EXPECT_EQ(names, 2);
  EXPECT_EQ(tracks, 6);
}

TEST(TraceTest, UnwritablePathIsAnError) {
  Trace trace;
  EXPECT_FALSE(trace.WriteJson("/nonexistent-dir/trace.json").ok());
}

}  // namespace
}  // namespace multislice::runtime
