// StateSaver with two device threads and a real checkpoint directory: a
// checkpoint holds data rank 0's shards as the blobs ShardBlobs writes, a
// replica every shard; a fault makes the process abstain (the step is not
// committed), raises device 0's failure flag, and Stop names it with the
// last good checkpoint, while a process without a fault stops kAborted.
#include "train/state_saver.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "common/temp_dir.h"

namespace multislice::train {
namespace {

int64_t Latest(const CheckpointManager& m) {
  Result<int64_t> step = m.LatestCompleteStep();
  return step.ok() ? *step : -1;
}

struct Fixture {
  TempDir dir{"multislice-saver-"};
  CheckpointManager checkpoints{[&] {
    CheckpointOptions o;
    o.directory = dir.path() + "/checkpoints";
    o.async = false;
    return o;
  }()};
  CheckpointManager replicas{[&] {
    CheckpointOptions o;
    o.directory = dir.path() + "/replica";
    o.max_to_keep = 1;
    return o;
  }()};
  // Two shards of a 10-value buffer.
  std::vector<float> params = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<float> m = std::vector<float>(10, 0.5f);
  std::vector<float> v = std::vector<float>(10, 0.25f);
  StateShard Shard(int local) const {
    return {local * 5, params.data() + local * 5, m.data() + local * 5,
            v.data() + local * 5, 5};
  }

  StateSaver MakeSaver(std::function<Status()> before = {}) {
    StateSaverOptions o;
    o.checkpoints = &checkpoints;
    o.replicas = &replicas;
    o.local_count = 2;
    o.axis_names = {"data", "fsdp"};
    o.mesh_shape = {1, 2};
    o.rows = 2;
    o.before_checkpoint = std::move(before);
    return StateSaver(std::move(o));
  }
};

// fn(local) on two threads at once.
void OnTwoDevices(const std::function<void(int)>& fn) {
  std::thread other([&] { fn(1); });
  fn(0);
  other.join();
}

std::vector<float> Floats(const Blob& b) {
  std::vector<float> out(b.data.size() / sizeof(float));
  std::memcpy(out.data(), b.data.data(), b.data.size());
  return out;
}

TEST(StateSaverTest, CheckpointHoldsEveryShardOfDataRankZero) {
  Fixture f;
  int synced = 0;
  StateSaver saver = f.MakeSaver([&] {
    ++synced;
    return OkStatus();
  });
  IteratorState it;
  it.step = 3;
  OnTwoDevices([&](int local) {
    saver.SaveCheckpoint(local, 3, true, f.Shard(local), it);
  });
  EXPECT_EQ(synced, 1);
  ASSERT_EQ(Latest(f.checkpoints), 3);
  Result<RestoredState> r = f.checkpoints.Restore(3, 0);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::vector<Blob> want = ShardBlobs({f.Shard(0), f.Shard(1)});
  ASSERT_EQ(r->blobs.size(), want.size());
  for (const Blob& b : want) {
    ASSERT_TRUE(r->blobs.count(b.name)) << b.name;
    EXPECT_EQ(Floats(r->blobs.at(b.name)), Floats(b)) << b.name;
  }
  EXPECT_EQ(saver.FaultFlag(0), 0.0f);
}

TEST(StateSaverTest, OtherDataRanksAddNothingToTheCheckpoint) {
  Fixture f;
  StateSaver saver = f.MakeSaver();
  OnTwoDevices([&](int local) {
    saver.SaveCheckpoint(local, 1, local == 0, f.Shard(local), {});
  });
  Result<RestoredState> r = f.checkpoints.Restore(1, 0);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->blobs.size(), 3u);  // params, adam_m, adam_v of shard 0
  EXPECT_TRUE(r->blobs.count("params.0"));
}

TEST(StateSaverTest, ReplicaHoldsEveryShard) {
  Fixture f;
  StateSaver saver = f.MakeSaver();
  OnTwoDevices(
      [&](int local) { saver.SaveReplica(local, 2, f.Shard(local), {}); });
  ASSERT_TRUE(f.replicas.Wait().ok());
  Result<RestoredState> r = f.replicas.Restore(2, 0);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->blobs.size(), 6u);
  EXPECT_EQ(Floats(r->blobs.at("params.5")),
            (std::vector<float>{6, 7, 8, 9, 10}));
  EXPECT_FALSE(f.checkpoints.LatestCompleteStep().ok());
}

TEST(StateSaverTest, AFaultAbstainsRaisesTheFlagAndStopsWithTheLastGoodStep) {
  Fixture f;
  StateSaver saver = f.MakeSaver();
  OnTwoDevices([&](int local) {
    saver.SaveCheckpoint(local, 2, true, f.Shard(local), {});
  });
  saver.SetFault(Internal("metrics.jsonl: No space left on device"));
  EXPECT_EQ(saver.FaultFlag(0), 1.0f);
  EXPECT_EQ(saver.FaultFlag(1), 0.0f);  // device 0 speaks for the process
  OnTwoDevices([&](int local) {
    saver.SaveCheckpoint(local, 4, true, f.Shard(local), {});
  });
  EXPECT_EQ(Latest(f.checkpoints), 2);
  std::vector<Status> stops(2);
  OnTwoDevices([&](int local) { stops[local] = saver.Stop(local, 5); });
  for (const Status& s : stops) {
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_EQ(s.message(),
              "metrics.jsonl: No space left on device; the last good "
              "checkpoint is step 2");
  }
  EXPECT_EQ(saver.Finish(0, 5).code(), StatusCode::kInternal);
}

TEST(StateSaverTest, WithoutAFaultStopIsAbortedAndFinishIsOk) {
  Fixture f;
  StateSaver saver = f.MakeSaver();
  std::vector<Status> stops(2);
  OnTwoDevices([&](int local) { stops[local] = saver.Stop(local, 7); });
  EXPECT_EQ(stops[0].code(), StatusCode::kAborted);
  EXPECT_NE(stops[0].message().find("stopped at step 7"), std::string::npos);
  EXPECT_TRUE(saver.Finish(0, 7).ok());
}

TEST(StateSaverTest, AFailingMetricsSyncIsAFaultAndTheStepAbstains) {
  Fixture f;
  StateSaver saver = f.MakeSaver([] { return Internal("sync failed"); });
  OnTwoDevices([&](int local) {
    saver.SaveCheckpoint(local, 1, true, f.Shard(local), {});
  });
  EXPECT_FALSE(f.checkpoints.LatestCompleteStep().ok());
  EXPECT_EQ(saver.Fault().message(), "sync failed");
}

}  // namespace
}  // namespace multislice::train
