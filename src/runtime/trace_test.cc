#include "runtime/trace.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
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
  EXPECT_EQ(tracks, 10);
}

TEST(TraceTest, OpSpansNestInTheirScopeOnTheThreadsTrace) {
  Trace trace;
  { OpSpans none("layer", 0, "forward"); none.Next("ln1"); }
  EXPECT_EQ(trace.size(), 0u);  // no thread trace: nothing
  SetThreadTrace(&trace, 5);
  {
    OpSpans ops("layer", 2, "backward");
    ops.Next("mlp");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ops.Next("attention");
  }
  SetThreadTrace(nullptr, 0);
  TempDir dir;
  ASSERT_TRUE(trace.WriteJson(dir.path() + "/t.json").ok());
  nlohmann::json doc = nlohmann::json::parse(std::ifstream(dir.path() + "/t.json"));
  std::map<std::string, nlohmann::json> spans;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") spans[e["name"]] = e;
  }
  ASSERT_EQ(spans.size(), 3u);
  const auto& scope = spans["layer 2 backward"];
  const auto& mlp = spans["layer 2 backward/mlp"];
  const auto& att = spans["layer 2 backward/attention"];
  EXPECT_EQ(scope["pid"], 5);
  EXPECT_GE(mlp["dur"].get<int64_t>(), 2000);
  EXPECT_LE(scope["ts"].get<int64_t>(), mlp["ts"].get<int64_t>());
  EXPECT_LE(mlp["ts"].get<int64_t>() + mlp["dur"].get<int64_t>(),
            att["ts"].get<int64_t>());
  EXPECT_LE(att["ts"].get<int64_t>() + att["dur"].get<int64_t>(),
            scope["ts"].get<int64_t>() + scope["dur"].get<int64_t>());
}

TEST(TraceTest, UnwritablePathIsAnError) {
  Trace trace;
  EXPECT_FALSE(trace.WriteJson("/nonexistent-dir/trace.json").ok());
}

}  // namespace
}  // namespace multislice::runtime
