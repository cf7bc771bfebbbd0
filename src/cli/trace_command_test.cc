// `multislice train` with MaxText's profiler keys: one Chrome trace per
// worker, its spans nested per track, the window's steps only, and one
// clock across the workers.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/train_test_fixture.h"

namespace multislice {
namespace {

struct Span {
  std::string name;
  int64_t begin, end;
};

// (device row, track) -> spans, from a Chrome trace's complete events.
using Tracks = std::map<std::pair<int, int>, std::vector<Span>>;

Tracks ReadTrace(const std::string& path) {
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in);  // throws if invalid
  Tracks tracks;
  for (const nlohmann::json& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const int64_t ts = e.at("ts"), dur = e.at("dur");
    tracks[{e.at("pid"), e.at("tid")}].push_back({e.at("name"), ts, ts + dur});
  }
  return tracks;
}

// Two spans of one track are disjoint or one holds the other.
void ExpectNested(const std::vector<Span>& spans, const std::string& where) {
  for (const Span& a : spans) {
    for (const Span& b : spans) {
      const bool disjoint = a.end <= b.begin || b.end <= a.begin;
      const bool a_in_b = b.begin <= a.begin && a.end <= b.end;
      const bool b_in_a = a.begin <= b.begin && b.end <= a.end;
      EXPECT_TRUE(disjoint || a_in_b || b_in_a)
          << where << ": " << a.name << " [" << a.begin << ", " << a.end
          << ") against " << b.name << " [" << b.begin << ", " << b.end << ")";
    }
  }
}

const Span* Find(const std::vector<Span>& spans, const std::string& name) {
  for (const Span& s : spans) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

class TraceCommandTest : public testing_util::TrainRunTest {};

TEST_F(TraceCommandTest, EachWorkerWritesANestedTraceOnOneClock) {
  // Steps 2 and 3 traced (skip 1); step 2 saves, inline so that its write
  // is in the window.
  Train(
      {"steps=5", "run_name=prof", "profiler=xplane",
       "skip_first_n_steps_for_profiler=1", "profiler_steps=2",
       "checkpoint_period=2", "async_checkpointing=false", "--accelerator_type",
       "cpu-2", "ici_fsdp_parallelism=2", "dcn_data_parallelism=2"},
      "prof");
  std::map<int, Tracks> by_worker;
  for (int slice = 0; slice < 2; ++slice) {
    const std::string path = RunDir("prof") + "/profile/slice" +
                             std::to_string(slice) + "-worker0.trace.json";
    by_worker[slice] = ReadTrace(path);
  }
  for (const auto& [slice, tracks] : by_worker) {
    for (int device : {2 * slice, 2 * slice + 1}) {
      const std::string where = "device " + std::to_string(device);
      const std::vector<Span>& compute = tracks.at({device, 0});
      ExpectNested(compute, where + " compute");
      // The window's steps only, and every layer op inside one of them.
      std::vector<std::string> steps;
      for (const Span& s : compute) {
        if (s.name.rfind("step ", 0) == 0) steps.push_back(s.name);
      }
      std::sort(steps.begin(), steps.end());
      EXPECT_EQ(steps, (std::vector<std::string>{"step 2", "step 3"}));
      int ops = 0;
      for (const Span& s : compute) {
        if (s.name.find('/') == std::string::npos) continue;
        ++ops;
        const Span* step2 = Find(compute, "step 2");
        const Span* step3 = Find(compute, "step 3");
        const bool inside =
            (step2 && step2->begin <= s.begin && s.end <= step2->end) ||
            (step3 && step3->begin <= s.begin && s.end <= step3->end);
        EXPECT_TRUE(inside) << where << ": " << s.name;
      }
      EXPECT_GT(ops, 2 * 2 * 2 * 8) << where;  // 2 layers x 2 ways x 2 steps
      EXPECT_TRUE(Find(compute, "layer 1 backward/attention")) << where;
      for (int track : {1, 2}) {  // ICI and DCN: collectives on each
        ASSERT_TRUE(tracks.count({device, track})) << where << " " << track;
        ExpectNested(tracks.at({device, track}), where);
      }
      EXPECT_TRUE(Find(tracks.at({device, 3}), "checkpoint copy-out step 2"))
          << where;
    }
    EXPECT_TRUE(Find(tracks.at({2 * slice, 4}), "checkpoint write step 2"));
  }
  // One clock: the two workers' step 2 overlap (their collectives meet in
  // it), and so do their step 3.
  for (const std::string step : {"step 2", "step 3"}) {
    const Span* a = Find(by_worker[0].at({0, 0}), step);
    const Span* b = Find(by_worker[1].at({2, 0}), step);
    ASSERT_TRUE(a && b);
    EXPECT_LT(std::max(a->begin, b->begin), std::min(a->end, b->end)) << step;
  }
}

TEST_F(TraceCommandTest, WithoutTheKeyNothingIsWritten) {
  Train({"steps=3", "run_name=plain", "--accelerator_type", "cpu-2"}, "plain");
  EXPECT_FALSE(std::filesystem::exists(RunDir("plain") + "/profile"));
}

}  // namespace
}  // namespace multislice
