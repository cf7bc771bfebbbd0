// The training checkpoint's DiLoCo state (train_state.h) through a real
// CheckpointManager on a temporary directory, saved by two hosts at once:
// every replica's inner state and the outer state are written as the
// trainer's shards would be (each (replica, stage, tensor rank) part cut
// from a whole-model buffer by ExtractTensorShard, then split over fsdp 2,
// the shards spread over both hosts), and LoadFullState must give back the
// whole buffers, each value a known function of (kind, replica, position).
// Missing shards and blobs, and corrupt "diloco" metadata, must be one
// sentence each; a checkpoint without DiLoCo loads as before.
#include "train/train_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/temp_dir.h"
#include "model/tensor_shard.h"

namespace multislice::train {
namespace {

// 400 parameters: small enough that every value below is exact in f32.
model::DecoderConfig TinyModel() { return model::GptShape(8, 4, 4, 2, 2, 8); }

enum Kind { kParams, kAdamM, kAdamV, kOuter, kMomentum, kPending };

// The value of `kind` of `replica` at whole-model position i.
float Value(Kind kind, int replica, int64_t i) {
  return static_cast<float>(kind * 100000 + replica * 10000 + i) + 0.25f;
}

std::vector<float> Whole(Kind kind, int replica) {
  std::vector<float> out(
      static_cast<size_t>(model::NumParameters(TinyModel())));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = Value(kind, replica, static_cast<int64_t>(i));
  }
  return out;
}

// How the test run was split, and what it saves.
struct Layout {
  int replicas = 2;  // diloco_replicas; 0 without DiLoCo
  int stages = 1;
  int tensor = 2;
  bool pending = true;
  // Outer state on every replica's shards (replica r's with values of r,
  // which the loader must ignore), not only on replica 0's.
  bool outer_on_every_replica = false;
};

// Where one shard sits: the same (replica, stage, tensor rank, fsdp rank)
// as on the trainer's mesh.
struct Position {
  int replica, stage, rank, fsdp;
};

constexpr int kFsdp = 2;
constexpr int64_t kStep = 7;

// Writes step kStep of `layout` on two hosts into `dir`. `edit` may change
// a shard (return false to leave it out); `edit_meta` a host's metadata.
struct Writer {
  Layout layout;
  std::function<bool(const Position&, StateShard&)> edit;
  std::function<void(int host, nlohmann::json&)> edit_meta;

  // The fsdp shard f of a part of n values: [n f / 2, n (f + 1) / 2).
  static int64_t ShardBegin(int64_t n, int f) { return n * f / kFsdp; }

  Status Save(const std::string& dir) const {
    const model::DecoderConfig model = TinyModel();
    const int replicas = std::max(layout.replicas, 1);
    // The parts' buffers, alive (and unmoved) until the blobs are copied.
    std::deque<std::vector<float>> parts;
    std::vector<StateShard> host_shards[2];
    for (int r = 0; r < replicas; ++r) {
      for (int stage = 0; stage < layout.stages; ++stage) {
        for (int rank = 0; rank < layout.tensor; ++rank) {
          const model::PipelineStage ps{stage, layout.stages};
          const int64_t n = model::NumParameters(model, layout.tensor, ps);
          const float* local[6];
          for (Kind kind :
               {kParams, kAdamM, kAdamV, kOuter, kMomentum, kPending}) {
            const std::vector<float> whole = Whole(
                kind, kind >= kOuter && !layout.outer_on_every_replica ? 0 : r);
            parts.emplace_back(static_cast<size_t>(n));
            model::ExtractTensorShard(model, layout.tensor, rank, whole.data(),
                                      parts.back().data(), ps);
          }
          for (int k = 0; k < 6; ++k) {
            local[k] = parts[parts.size() - 6 + static_cast<size_t>(k)].data();
          }
          for (int f = 0; f < kFsdp; ++f) {
            const int64_t begin = ShardBegin(n, f);
            StateShard s;
            s.begin = begin;
            s.count = ShardBegin(n, f + 1) - begin;
            s.params = local[kParams] + begin;
            s.adam_m = local[kAdamM] + begin;
            s.adam_v = local[kAdamV] + begin;
            s.tensor_rank = rank;
            s.tensor_size = layout.tensor;
            s.stage = stage;
            s.stages = layout.stages;
            s.replica = r;
            s.replicas = replicas;
            if (layout.replicas > 0 &&
                (r == 0 || layout.outer_on_every_replica)) {
              s.outer = local[kOuter] + begin;
              s.outer_momentum = local[kMomentum] + begin;
              if (layout.pending) s.outer_pending = local[kPending] + begin;
            }
            if (edit && !edit({r, stage, rank, f}, s)) continue;
            // Both hosts hold shards of both replicas and of every part.
            host_shards[(r + f) % 2].push_back(s);
          }
        }
      }
    }
    std::barrier sync_point(2);
    Status results[2];
    std::vector<std::thread> hosts;
    for (int host = 0; host < 2; ++host) {
      hosts.emplace_back([&, host] {
        CheckpointOptions options;
        options.directory = dir;
        options.async = false;
        options.host = host;
        options.host_count = 2;
        options.barrier = [&](const std::string&) {
          sync_point.arrive_and_wait();
          return OkStatus();
        };
        CheckpointManager manager(options);
        IteratorState iterator;
        iterator.rows = 3 + host;
        nlohmann::json meta = StateMetadata(
            kStep, model, {"diloco", "data", "stage", "fsdp", "tensor"},
            {replicas, 1, layout.stages, kFsdp, layout.tensor}, 2,
            host_shards[host], iterator, layout.tensor, layout.stages,
            layout.replicas, layout.pending);
        if (edit_meta) edit_meta(host, meta);
        results[host] =
            manager.Save(kStep, ShardBlobs(host_shards[host]), std::move(meta));
      });
    }
    for (std::thread& t : hosts) t.join();
    return results[0].ok() ? results[1] : results[0];
  }
};

Result<FullState> SaveAndLoad(const Writer& writer) {
  TempDir dir("multislice-train-state-");
  if (!dir.ok()) return Internal("no temporary directory");
  RETURN_IF_ERROR(writer.Save(dir.path()));
  CheckpointOptions options;
  options.directory = dir.path();
  CheckpointManager reader(options);
  return LoadFullState(reader, kStep);
}

// The message of a load that must fail with kInvalidArgument.
std::string LoadError(const Writer& writer) {
  Result<FullState> state = SaveAndLoad(writer);
  if (state.ok()) return "loaded";
  EXPECT_EQ(state.status().code(), StatusCode::kInvalidArgument)
      << state.status().message();
  return state.status().message();
}

void ExpectInner(const std::vector<float>& params,
                 const std::vector<float>& adam_m,
                 const std::vector<float>& adam_v, int replica) {
  EXPECT_EQ(params, Whole(kParams, replica)) << "replica " << replica;
  EXPECT_EQ(adam_m, Whole(kAdamM, replica)) << "replica " << replica;
  EXPECT_EQ(adam_v, Whole(kAdamV, replica)) << "replica " << replica;
}

TEST(TrainStateTest, BlobNamesCarryTheReplicaAfterTheKind) {
  EXPECT_EQ(ShardBlobName("params", 12, 1, 2, 0, 2, 1, 2),
            "params.r1.s0.t1.12");
  EXPECT_EQ(ShardBlobName("outer", 0, 0, 1, 0, 1, 0, 2), "outer.r0.0");
  EXPECT_EQ(ShardBlobName("outer_pending", 5, 1, 2, 0, 1, 3, 4),
            "outer_pending.r3.t1.5");
  // One replica (or none): the names of today.
  EXPECT_EQ(ShardBlobName("outer_momentum", 5, 0, 1, 1, 2, 0, 1),
            "outer_momentum.s1.5");
  EXPECT_EQ(ShardBlobName("adam_v", 9, 1, 2, 1, 2), "adam_v.s1.t1.9");

  StateShard s;
  const float values[3] = {1, 2, 3};
  s.begin = 4;
  s.count = 3;
  s.params = s.adam_m = s.adam_v = values;
  s.replica = 1;
  s.replicas = 2;
  std::vector<std::string> names;
  for (const Blob& b : ShardBlobs({s})) names.push_back(b.name);
  EXPECT_EQ(names, (std::vector<std::string>{"params.r1.4", "adam_m.r1.4",
                                             "adam_v.r1.4"}));
  s.outer = s.outer_momentum = values;
  names.clear();
  for (const Blob& b : ShardBlobs({s})) names.push_back(b.name);
  EXPECT_EQ(names, (std::vector<std::string>{"params.r1.4", "adam_m.r1.4",
                                             "adam_v.r1.4", "outer.r1.4",
                                             "outer_momentum.r1.4"}));
  s.outer_pending = values;
  const std::vector<Blob> blobs = ShardBlobs({s});
  ASSERT_EQ(blobs.size(), 6u);
  EXPECT_EQ(blobs[5].name, "outer_pending.r1.4");
  EXPECT_EQ(blobs[5].shape, std::vector<int64_t>{3});
}

TEST(TrainStateTest, MetadataHoldsDilocoAndEachShardsReplica) {
  StateShard s;
  s.count = 10;
  s.replica = 1;
  s.replicas = 2;
  const nlohmann::json with = StateMetadata(
      3, TinyModel(), {"diloco"}, {2}, 1, {s}, IteratorState(), 1, 1, 2, true);
  EXPECT_EQ(with["diloco"],
            (nlohmann::json{{"replicas", 2}, {"pending", true}}));
  EXPECT_EQ(with["shards"][0].value("replica", -1), 1);
  EXPECT_EQ(with.value("format_version", 0), 1);
  // One replica: "diloco" but no shard "replica"; none: neither.
  const nlohmann::json one = StateMetadata(3, TinyModel(), {"diloco"}, {1}, 1,
                                           {s}, IteratorState(), 1, 1, 1);
  EXPECT_EQ(one["diloco"],
            (nlohmann::json{{"replicas", 1}, {"pending", false}}));
  EXPECT_FALSE(one["shards"][0].contains("replica"));
  const nlohmann::json none =
      StateMetadata(3, TinyModel(), {"data"}, {1}, 1, {s}, IteratorState());
  EXPECT_FALSE(none.contains("diloco"));
  EXPECT_FALSE(none["shards"][0].contains("replica"));
}

// K = 2 replicas x fsdp 2 x tensor 2, without and with 2 pipeline stages,
// the outer state on replica 0's shards (a checkpoint) or on every
// replica's, each with its own values (an in-memory replica's shape: the
// loader takes replica 0's).
TEST(TrainStateTest, EveryReplicaAndTheOuterStateRoundTrip) {
  for (int stages : {1, 2}) {
    for (bool every : {false, true}) {
      SCOPED_TRACE("stages " + std::to_string(stages) + " outer on every " +
                   std::to_string(every));
      Writer w;
      w.layout.stages = stages;
      w.layout.outer_on_every_replica = every;
      Result<FullState> state = SaveAndLoad(w);
      ASSERT_TRUE(state.ok()) << state.status().message();
      EXPECT_EQ(state->step, kStep);
      EXPECT_EQ(state->iterator.rows, 3);  // host 0's
      EXPECT_EQ(state->diloco_replicas, 2);
      ExpectInner(state->params, state->adam_m, state->adam_v, 0);
      ASSERT_EQ(state->more_replicas.size(), 1u);
      const InnerState& one = state->more_replicas[0];
      ExpectInner(one.params, one.adam_m, one.adam_v, 1);
      EXPECT_EQ(state->outer, Whole(kOuter, 0));
      EXPECT_EQ(state->outer_momentum, Whole(kMomentum, 0));
      EXPECT_EQ(state->outer_pending, Whole(kPending, 0));
      EXPECT_EQ(state->saved_mesh["shape"],
                (nlohmann::json{2, 1, stages, 2, 2}));
    }
  }
}

// The files hold what the format says: ".r<replica>" names, the outer
// blobs on replica 0's shards only, "diloco" on both hosts.
TEST(TrainStateTest, TheFilesHoldTheNamedBlobsAndMetadata) {
  TempDir dir("multislice-train-state-");
  ASSERT_TRUE(dir.ok());
  Writer w;
  w.layout.stages = 2;
  ASSERT_TRUE(w.Save(dir.path()).ok());
  CheckpointOptions options;
  options.directory = dir.path();
  CheckpointManager reader(options);
  int outer_blobs = 0, inner_blobs = 0;
  for (int host = 0; host < 2; ++host) {
    Result<RestoredState> restored = reader.Restore(kStep, host);
    ASSERT_TRUE(restored.ok()) << restored.status().message();
    EXPECT_EQ(restored->metadata["diloco"],
              (nlohmann::json{{"replicas", 2}, {"pending", true}}));
    for (const auto& [name, blob] : restored->blobs) {
      if (name.rfind("outer", 0) == 0) {
        ++outer_blobs;
        EXPECT_EQ(name.find(".r0."), name.find('.')) << name;
      } else {
        ++inner_blobs;
      }
    }
  }
  // 2 replicas x 2 stages x 2 tensor ranks x 2 fsdp shards; outer: one
  // replica's 8 shards x 3 kinds.
  EXPECT_EQ(inner_blobs, 16 * 3);
  EXPECT_EQ(outer_blobs, 8 * 3);
  Result<RestoredState> host1 = reader.Restore(kStep, 1);
  ASSERT_TRUE(host1.ok());
  // Host 1 holds replica 0's fsdp shard 1: stage 1, tensor rank 0.
  const int64_t n = model::NumParameters(TinyModel(), 2, {1, 2});
  EXPECT_TRUE(host1->blobs.contains("params.r0.s1.t0." +
                                    std::to_string(Writer::ShardBegin(n, 1))));
  EXPECT_TRUE(host1->blobs.contains("outer_pending.r0.s1.t0." +
                                    std::to_string(Writer::ShardBegin(n, 1))));
  EXPECT_TRUE(host1->blobs.contains("adam_v.r1.s1.t0.0"));
}

TEST(TrainStateTest, WithoutPendingTheOuterPendingIsEmpty) {
  Writer w;
  w.layout.pending = false;
  Result<FullState> state = SaveAndLoad(w);
  ASSERT_TRUE(state.ok()) << state.status().message();
  EXPECT_TRUE(state->outer_pending.empty());
  EXPECT_EQ(state->outer, Whole(kOuter, 0));
  EXPECT_EQ(state->outer_momentum, Whole(kMomentum, 0));
  ExpectInner(state->params, state->adam_m, state->adam_v, 0);
}

// DiLoCo with one replica: names as today, no more_replicas, the outer
// state loaded.
TEST(TrainStateTest, OneReplicaLoadsTheOuterState) {
  Writer w;
  w.layout.replicas = 1;
  w.layout.stages = 2;
  Result<FullState> state = SaveAndLoad(w);
  ASSERT_TRUE(state.ok()) << state.status().message();
  EXPECT_EQ(state->diloco_replicas, 1);
  EXPECT_TRUE(state->more_replicas.empty());
  ExpectInner(state->params, state->adam_m, state->adam_v, 0);
  EXPECT_EQ(state->outer, Whole(kOuter, 0));
  EXPECT_EQ(state->outer_pending, Whole(kPending, 0));
}

TEST(TrainStateTest, ACheckpointWithoutDilocoLoadsAsBefore) {
  for (int stages : {1, 2}) {
    Writer w;
    w.layout.replicas = 0;
    w.layout.stages = stages;
    Result<FullState> state = SaveAndLoad(w);
    ASSERT_TRUE(state.ok()) << state.status().message();
    EXPECT_EQ(state->diloco_replicas, 0);
    EXPECT_TRUE(state->more_replicas.empty());
    EXPECT_TRUE(state->outer.empty());
    EXPECT_TRUE(state->outer_momentum.empty());
    EXPECT_TRUE(state->outer_pending.empty());
    ExpectInner(state->params, state->adam_m, state->adam_v, 0);
  }
  // The missing range is named as before.
  Writer w;
  w.layout.replicas = 0;
  w.layout.stages = 2;
  const int64_t n = model::NumParameters(TinyModel(), 2, {1, 2});
  w.edit = [](const Position& p, StateShard&) {
    return !(p.stage == 1 && p.rank == 0 && p.fsdp == 1);
  };
  EXPECT_EQ(LoadError(w), "checkpoint step 7: parameters [" +
                              std::to_string(Writer::ShardBegin(n, 1)) +
                              ", ...) of stage 1 of tensor rank 0 are in no "
                              "host's shards");
}

TEST(TrainStateTest, AMissingReplicaShardIsNamed) {
  for (int stages : {1, 2}) {
    Writer w;
    w.layout.stages = stages;
    w.edit = [stages](const Position& p, StateShard&) {
      return !(p.replica == 1 && p.stage == stages - 1 && p.rank == 1 &&
               p.fsdp == 1);
    };
    const int64_t n =
        model::NumParameters(TinyModel(), 2, {stages - 1, stages});
    EXPECT_EQ(LoadError(w), "checkpoint step 7: parameters [" +
                                std::to_string(Writer::ShardBegin(n, 1)) +
                                ", ...) of DiLoCo replica 1 " +
                                (stages > 1 ? "of stage 1 " : "") +
                                "of tensor rank 1 are in no host's shards");
  }
  // Replica 0's first shard.
  Writer w;
  w.edit = [](const Position& p, StateShard&) {
    return !(p.replica == 0 && p.rank == 0 && p.fsdp == 0);
  };
  EXPECT_EQ(LoadError(w),
            "checkpoint step 7: parameters [0, ...) of DiLoCo replica 0 of "
            "tensor rank 0 are in no host's shards");
}

// A replica-0 shard without its outer blobs leaves a hole that the same
// position's blobs of replica 1 do not fill.
TEST(TrainStateTest, AMissingOuterBlobIsNamed) {
  for (bool every : {false, true}) {
    Writer w;
    w.layout.outer_on_every_replica = every;
    w.edit = [](const Position& p, StateShard& s) {
      if (p.replica == 0 && p.rank == 1 && p.fsdp == 1) {
        s.outer = s.outer_momentum = nullptr;
      }
      return true;
    };
    const int64_t n = model::NumParameters(TinyModel(), 2);
    EXPECT_EQ(LoadError(w), "checkpoint step 7: DiLoCo outer [" +
                                std::to_string(Writer::ShardBegin(n, 1)) +
                                ", ...) of tensor rank 1 are in no host's "
                                "shards of replica 0");
  }
  // Only the pending blob missing, in the second stage.
  Writer w;
  w.layout.stages = 2;
  w.edit = [](const Position& p, StateShard& s) {
    if (p.replica == 0 && p.stage == 1 && p.rank == 0 && p.fsdp == 0) {
      s.outer_pending = nullptr;
    }
    return true;
  };
  EXPECT_EQ(LoadError(w),
            "checkpoint step 7: DiLoCo outer_pending [0, ...) of stage 1 of "
            "tensor rank 0 are in no host's shards of replica 0");
}

TEST(TrainStateTest, CorruptDilocoMetadataIsOneSentence) {
  struct Case {
    int host;
    std::function<void(nlohmann::json&)> edit;
    std::string expected;
  };
  const std::string h0 = "checkpoint step 7 host 0: ";
  const std::string h1 = "checkpoint step 7 host 1: ";
  const std::string replicas_expected = "; expected an integer in [1, 4096]";
  const std::vector<Case> cases = {
      {0, [](nlohmann::json& m) { m["diloco"] = 5; },
       h0 + "metadata field 'diloco' is 5; expected an object"},
      {1, [](nlohmann::json& m) { m["diloco"] = nlohmann::json::array(); },
       h1 + "metadata field 'diloco' is []; expected an object"},
      {0, [](nlohmann::json& m) { m["diloco"]["replicas"] = 0; },
       h0 + "metadata field 'diloco.replicas' is 0" + replicas_expected},
      {0, [](nlohmann::json& m) { m["diloco"]["replicas"] = -2; },
       h0 + "metadata field 'diloco.replicas' is -2" + replicas_expected},
      {0, [](nlohmann::json& m) { m["diloco"]["replicas"] = 4097; },
       h0 + "metadata field 'diloco.replicas' is 4097" + replicas_expected},
      {0, [](nlohmann::json& m) { m["diloco"]["replicas"] = int64_t{1} << 40; },
       h0 + "metadata field 'diloco.replicas' is 1099511627776" +
           replicas_expected},
      {0, [](nlohmann::json& m) { m["diloco"]["replicas"] = 2.5; },
       h0 + "metadata field 'diloco.replicas' is 2.5" + replicas_expected},
      {0, [](nlohmann::json& m) { m["diloco"]["replicas"] = "2"; },
       h0 + "metadata field 'diloco.replicas' is \"2\"" + replicas_expected},
      {0, [](nlohmann::json& m) { m["diloco"].erase("replicas"); },
       h0 + "metadata field 'diloco.replicas' is missing" + replicas_expected},
      {0, [](nlohmann::json& m) { m["diloco"]["pending"] = "yes"; },
       h0 + "metadata field 'diloco.pending' is \"yes\"; expected true or "
            "false"},
      {1, [](nlohmann::json& m) { m["diloco"]["pending"] = 1; },
       h1 + "metadata field 'diloco.pending' is 1; expected true or false"},
      {0, [](nlohmann::json& m) { m["diloco"].erase("pending"); },
       h0 + "metadata field 'diloco.pending' is missing; expected true or "
            "false"},
      {0,
       [](nlohmann::json& m) {
         m["diloco"]["schedule"] = {4, -1, 1};
       },
       h0 + "metadata field 'diloco.schedule' is [4,-1,1]; expected [sync "
            "period, fragments, overlap steps]: three integers in [0, "
            "1000000]"},
      {1, [](nlohmann::json& m) { m["diloco"]["replicas"] = 3; },
       h1 + "diloco {replicas 3, pending true} differs from host 0's "
            "{replicas 2, pending true}"},
      {1, [](nlohmann::json& m) { m["diloco"]["pending"] = false; },
       h1 + "diloco {replicas 2, pending false} differs from host 0's "
            "{replicas 2, pending true}"},
      {1, [](nlohmann::json& m) { m.erase("diloco"); },
       h1 + "diloco none differs from host 0's {replicas 2, pending true}"},
      // Host 0's shards then name replicas the metadata does not have.
      {0, [](nlohmann::json& m) { m.erase("diloco"); },
       h0 + "a shard has replica 0, but the metadata's diloco is none"},
      {0, [](nlohmann::json& m) { m["diloco"]["replicas"] = 1; },
       h0 + "a shard has replica 0, but the metadata's diloco is {replicas "
            "1, pending true}"},
      {1, [](nlohmann::json& m) { m["shards"][0]["replica"] = 2; },
       h1 + "shard replica 2 is outside [0, 2)"},
      {0, [](nlohmann::json& m) { m["shards"][1]["replica"] = -1; },
       h0 + "shard replica -1 is outside [0, 2)"},
      {0, [](nlohmann::json& m) { m["shards"][0].erase("replica"); },
       h0 + "metadata field 'replica' is missing or not an integer"},
  };
  for (const Case& c : cases) {
    Writer w;
    w.edit_meta = [&](int host, nlohmann::json& meta) {
      if (host == c.host) c.edit(meta);
    };
    EXPECT_EQ(LoadError(w), c.expected);
  }
}

}  // namespace
}  // namespace multislice::train
