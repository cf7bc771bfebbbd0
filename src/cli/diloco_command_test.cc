// DiLoCo end to end: `multislice train` with the diloco axis against the
// algorithm written out as a plain loop on one device per replica (each
// replica's inner AdamW steps on its rows of the global batch, the mean
// pseudo-gradient, the outer Nesterov SGD in double, fragments of whole
// layers for Streaming DiLoCo), on 2 replicas x fsdp 2; resume in the middle
// of a period (with a fragment's sync in flight) bitwise; one replica with
// outer lr 1 and momentum 0 is the plain run; and the wire types.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/train_test_fixture.h"
#include "compute/adamw.h"
#include "model/decoder.h"
#include "model/schedule.h"
#include "train/config.h"
#include "train/data.h"
#include "train/trainer.h"

namespace multislice {
namespace {

using testing_util::ExpectClose;
using testing_util::LoadState;
using testing_util::Losses;
using testing_util::MaxRelativeDifference;
using testing_util::ReadFile;
using testing_util::Spawn;
using testing_util::WaitExit;
using testing_util::With;

// The DiLoCo keys of a run, for the run and for the reference loop.
struct DilocoKeys {
  int replicas = 2;
  int sync_period = 2;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  int fragments = 1;  // > 1: Streaming DiLoCo
  int overlap = 0;
  double alpha = 0;

  std::vector<std::string> Overrides() const {
    std::vector<std::string> o = {
        "enable_diloco=true",
        "diloco_sync_period=" + std::to_string(sync_period),
        "diloco_outer_lr=" + std::to_string(outer_lr),
        "diloco_outer_momentum=" + std::to_string(outer_momentum)};
    if (fragments > 1 || overlap > 0) {
      o.push_back("enable_streaming_diloco=true");
      o.push_back("num_diloco_fragments=" + std::to_string(fragments));
      o.push_back("num_communication_overlapping_steps=" +
                  std::to_string(overlap));
      o.push_back("communication_overlapping_alpha=" + std::to_string(alpha));
    }
    return o;
  }
};

// What the reference loop ends with.
struct Reference {
  std::vector<double> losses;  // replica 0's, per step (what is reported)
  std::vector<double> outer;
  std::vector<std::vector<float>> inner;  // by replica
};

// The fragment of each parameter: layer l of L in l * F / L, the
// embeddings with fragment 0, the final LayerNorm with F - 1.
std::vector<int> FragmentOf(const model::DecoderConfig& model, int fragments) {
  std::vector<int> of(model::NumParameters(model), 0);
  for (const model::ParamTensor& p : model::ParameterLayout(model)) {
    int f = 0;  // wte, wpe
    // The final norm and an untied head: the last fragment.
    if (p.name.rfind("lnf", 0) == 0 || p.name == "lm_head") f = fragments - 1;
    if (p.name[0] == 'h' &&
        std::isdigit(static_cast<unsigned char>(p.name[1]))) {
      f = std::stoi(p.name.substr(1)) * fragments / model.num_layers;
    }
    std::fill_n(of.begin() + p.offset, p.size, f);
  }
  return of;
}

// What happens to the last replica in the reference loop.
struct Loss {
  int64_t rejoin_after = 0;  // > 0: replica 1 (the dropped one, with
                             // drop_after) restarts after that step at the
                             // outer parameters with replica 0's moments
                             // (it lost its host's memory)
  int64_t drop_after = 0;    // > 0: replica `dropped` (-1: the last) leaves
                             // after that step and the syncs average the
                             // others (until it rejoins)
  int dropped = -1;
};

// DiLoCo on config (the run's keys) written out: every replica one device,
// the run's global batch from `devices` devices.
Reference RunReference(const TrainConfig& config, const std::string& dataset,
                       const DilocoKeys& k, Loss loss_of = {},
                       int devices = 4) {
  const model::DecoderConfig model = train::DecoderConfigOf(config);
  const int64_t n = model::NumParameters(model);
  const int global_rows = config.per_device_batch_size * devices;
  const int rows = global_rows / k.replicas;
  const int T = config.max_target_length;
  std::vector<float> start(n);
  model::InitParameters(model, static_cast<uint64_t>(config.seed),
                        start.data());
  const std::vector<uint8_t> mask = model::WeightDecayMask(model);
  const std::vector<int> fragment = FragmentOf(model, k.fragments);
  Reference ref;
  ref.outer.assign(start.begin(), start.end());
  std::vector<double> momentum(n, 0.0), delta(n, 0.0);
  ref.inner.assign(k.replicas, start);
  std::vector<std::vector<float>> m(k.replicas, std::vector<float>(n, 0.0f));
  std::vector<std::vector<float>> v = m;
  std::vector<train::DataIterator> data;
  for (int r = 0; r < k.replicas; ++r) {
    train::DataIteratorOptions o;
    o.token_file = dataset + "/train.bin";
    o.global_rows = global_rows;
    o.row_begin = r * rows;
    o.rows = rows;
    o.seq_len = T;
    o.seed = static_cast<uint64_t>(config.seed);
    auto it = train::DataIterator::Create(o);
    EXPECT_TRUE(it.ok()) << it.status().message();
    data.push_back(std::move(*it));
  }
  model::Decoder gpt(model);
  std::vector<float> grads(n);
  const int gap = k.sync_period / k.fragments;
  auto starts = [&](int64_t t, int f) {
    return t % k.sync_period == ((f + 1) * gap) % k.sync_period;
  };
  for (int64_t step = 1; step <= config.steps; ++step) {
    const int dropped = loss_of.dropped < 0 ? k.replicas - 1 : loss_of.dropped;
    std::vector<int> live;
    for (int r = 0; r < k.replicas; ++r) {
      const bool away = loss_of.drop_after > 0 && step > loss_of.drop_after &&
                        (loss_of.rejoin_after <= loss_of.drop_after ||
                         step <= loss_of.rejoin_after);
      if (r != dropped || !away) {
        live.push_back(r);
      }
    }
    const auto alive = static_cast<double>(live.size());
    double loss = 0;
    for (int r : live) {
      const train::Batch b = data[r].At(step - 1);
      auto l = gpt.Forward(ref.inner[r].data(), b.inputs.data(),
                           b.targets.data(), rows, T);
      EXPECT_TRUE(l.ok());
      if (r == 0) loss = *l;
      EXPECT_TRUE(gpt.Backward(ref.inner[r].data(), grads.data()).ok());
      double sq = 0;
      for (float g : grads) sq += static_cast<double>(g) * g;
      compute::AdamWOptions adam;
      adam.beta1 = static_cast<float>(config.adam_b1);
      adam.beta2 = static_cast<float>(config.adam_b2);
      adam.eps = static_cast<float>(config.adam_eps);
      adam.weight_decay = static_cast<float>(config.adam_weight_decay);
      adam.grad_scale = model::ClipScale(
          std::sqrt(sq),
          static_cast<float>(config.gradient_clipping_threshold));
      adam.lr = static_cast<float>(model::LearningRate(
          step, config.steps, config.warmup_steps, config.learning_rate,
          config.cosine_learning_rate_final_fraction));
      compute::AdamWUpdate(ref.inner[r].data(), grads.data(), m[r].data(),
                           v[r].data(), n, adam, step, mask.data());
    }
    ref.losses.push_back(loss);
    for (int f = 0; f < k.fragments; ++f) {
      // Start: this fragment's mean pseudo-gradient from the inner values.
      if (starts(step, f)) {
        for (int64_t i = 0; i < n; ++i) {
          if (fragment[i] != f) continue;
          delta[i] = 0;
          for (int r : live) {
            delta[i] += (ref.outer[i] - ref.inner[r][i]) / alive;
          }
        }
      }
      // Land: the outer step and the mix, overlap steps after the start.
      if (step > k.overlap && starts(step - k.overlap, f)) {
        for (int64_t i = 0; i < n; ++i) {
          if (fragment[i] != f) continue;
          momentum[i] = k.outer_momentum * momentum[i] + delta[i];
          ref.outer[i] -=
              k.outer_lr * (delta[i] + k.outer_momentum * momentum[i]);
          for (int r : live) {
            ref.inner[r][i] = static_cast<float>(k.alpha * ref.inner[r][i] +
                                                 (1 - k.alpha) * ref.outer[i]);
          }
        }
      }
    }
    if (step == loss_of.rejoin_after) {
      const int back = loss_of.drop_after > 0 ? dropped : 1;
      for (int64_t i = 0; i < n; ++i) {
        ref.inner[back][i] = static_cast<float>(ref.outer[i]);
      }
      m[back] = m[0];
      v[back] = v[0];
    }
  }
  return ref;
}

class DilocoCommandTest : public testing_util::TrainRunTest {
 protected:
  // The mesh of the tests: 2 slices of cpu-2, fsdp 2 inside each, DiLoCo
  // (keys.replicas of them) over the slices, or data parallelism.
  std::vector<std::string> Mesh(const DilocoKeys& keys) const {
    return {"per_device_batch_size=2",
            "ici_fsdp_parallelism=2",
            "dcn_diloco_parallelism=" + std::to_string(keys.replicas),
            "dcn_data_parallelism=" + std::to_string(2 / keys.replicas),
            "--num_slices",
            "2",
            "--accelerator_type",
            "cpu-2"};
  }

  TrainConfig Config(const std::vector<std::string>& overrides) const {
    auto c = LoadTrainConfig(data_->path() + "/tiny.yml", overrides);
    EXPECT_TRUE(c.ok()) << c.status().message();
    return c.ok() ? *c : TrainConfig{};
  }

  // diloco_continue_on_failure: slice `lost_slice` (default the last) dies
  // after step 3; the
  // others go on (the launcher records it gone, they agree on it, connect a
  // DCN communicator of their own and resend the sync in flight), average
  // only their own pseudo-gradients from the sync of step 4 on, and finish
  // the run: exit 0, their losses the loop with that replica dropped
  // after step 3 (and not the loop without the drop), and a sentence naming
  // the lost slice. `mesh` has one replica per slice, `devices` in all.
  void ExpectSurvivorsTrainOn(const std::string& name, const DilocoKeys& keys,
                              const std::vector<std::string>& mesh, int devices,
                              int lost_slice = -1) {
    const std::vector<std::string> common =
        With(keys.Overrides(),
             {"steps=8", "diloco_continue_on_failure=true",
              "diloco_max_slice_restarts=0", "checkpoint_period=100",
              "eval_interval=4", "run_name=" + name});
    const int lost_replica = lost_slice < 0 ? keys.replicas - 1 : lost_slice;
    const std::string last = std::to_string(lost_replica);
    testing_util::Child run = Spawn(
        Args(With(mesh, common)),
        {"MULTISLICE_TEST_KILL_AFTER_STEP=" + last + ":3"}, dir_.path(), name);
    ASSERT_EQ(WaitExit(run, 240), 0) << ReadFile(run.err);
    const std::string err = ReadFile(run.err);
    EXPECT_NE(err.find("slice " + last + " was lost; the other slices went on"),
              std::string::npos)
        << err;
    std::string out = ReadFile(run.out);
    out = out.substr(out.rfind("\n{") + 1);
    const nlohmann::json summary = nlohmann::json::parse(out);
    const TrainConfig config =
        Config(With(common, {"per_device_batch_size=2"}));
    const Reference ref =
        RunReference(config, DatasetDir(), keys,
                     Loss{.drop_after = 3, .dropped = lost_replica}, devices);
    ExpectClose(Losses(summary), ref.losses, 1e-5, name);
    const Reference whole =
        RunReference(config, DatasetDir(), keys, {}, devices);
    EXPECT_GT(std::fabs(whole.losses[5] - ref.losses[5]), 1e-4) << name;
    // The checkpoint of step 8 has every replica: the survivors' own, and
    // for the lost one the outer parameters with replica 0's moments (what
    // a rejoin would give it), so it resumes onto every slice again.
    const train::FullState state = LoadState(RunDir(name), 8);
    ASSERT_EQ(state.more_replicas.size(), size_t(keys.replicas - 1)) << name;
    const std::vector<float> outer(ref.outer.begin(), ref.outer.end());
    EXPECT_LT(MaxRelativeDifference(state.outer, outer), 1e-4) << name;
    EXPECT_LT(MaxRelativeDifference(state.params, ref.inner[0]), 1e-4) << name;
    const train::InnerState& lost = state.more_replicas[lost_replica - 1];
    EXPECT_EQ(lost.params, state.outer) << name;
    EXPECT_EQ(lost.adam_m, state.adam_m) << name;
    EXPECT_EQ(lost.adam_v, state.adam_v) << name;
    // tokens/s counts the replicas left: all of the batch before the loss,
    // (K - 1) / K of it from step 4, the first the lost replica missed.
    std::ifstream metrics(RunDir(name) + "/metrics.jsonl");
    const double batch = 2.0 * devices * config.max_target_length;
    for (std::string line; std::getline(metrics, line);) {
      const nlohmann::json r = nlohmann::json::parse(line);
      const double share =
          r["step"] <= 3 ? 1.0 : (keys.replicas - 1.0) / keys.replicas;
      EXPECT_NEAR(
          r["tokens_per_s"].get<double>() * r["step_time_s"].get<double>(),
          batch * share, 1e-6 * batch)
          << name << " step " << r["step"];
    }
    const nlohmann::json resumed =
        Train(With(With(mesh, common), {"steps=10"}), name + "-resumed");
    EXPECT_EQ(resumed.value("restored_step", int64_t{-1}), 8) << name;
    EXPECT_EQ(Losses(resumed).size(), 2u) << name;
  }

  // Trains `keys` for `steps` and checks the losses, every replica's
  // parameters and the outer parameters at the end against the loop.
  void ExpectReference(const std::string& name, const DilocoKeys& keys,
                       int steps, const std::vector<std::string>& model = {}) {
    const std::vector<std::string> common = With(
        With(keys.Overrides(), {"steps=" + std::to_string(steps),
                                "checkpoint_period=" + std::to_string(steps)}),
        model);
    const nlohmann::json run =
        Train(With(With(Mesh(keys), common), {"run_name=" + name}), name);
    const Reference ref = RunReference(
        Config(With(common, {"per_device_batch_size=2"})), DatasetDir(), keys);
    ExpectClose(Losses(run), ref.losses, 1e-5, name);
    const train::FullState state = LoadState(RunDir(name), steps);
    ASSERT_EQ(state.diloco_replicas, keys.replicas) << name;
    ASSERT_EQ(state.more_replicas.size(), size_t(keys.replicas - 1));
    const std::vector<float> outer(ref.outer.begin(), ref.outer.end());
    EXPECT_LT(MaxRelativeDifference(state.outer, outer), 1e-4) << name;
    EXPECT_LT(MaxRelativeDifference(state.params, ref.inner[0]), 1e-4) << name;
    EXPECT_LT(
        MaxRelativeDifference(state.more_replicas[0].params, ref.inner[1]),
        1e-4)
        << name;
  }
};

// Plain DiLoCo: 3 outer steps of period 2.
TEST_F(DilocoCommandTest, DilocoMatchesTheAlgorithmWrittenOut) {
  ExpectReference("diloco", DilocoKeys{}, 6);
}

// The same with the Llama block (grouped key/value heads, SwiGLU, an untied
// head, which belongs to the last fragment with the final norm) and with
// the Gemma block (a normalised tied head).
TEST_F(DilocoCommandTest, LlamaAndGemmaDilocoMatchTheAlgorithmWrittenOut) {
  ExpectReference("diloco-llama", DilocoKeys{}, 6,
                  {"decoder_block=llama2", "num_heads=4", "num_kv_heads=2",
                   "head_dim=16", "logits_via_embedding=false"});
  ExpectReference(
      "diloco-gemma", DilocoKeys{}, 6,
      {"decoder_block=gemma", "num_heads=4", "num_kv_heads=2", "head_dim=16",
       "logits_via_embedding=true", "normalize_embedding_logits=true"});
}

// Streaming DiLoCo: 2 fragments (one layer each), period 4, each sync
// landing one step after it starts and mixed half and half.
DilocoKeys Streaming() {
  DilocoKeys keys;
  keys.sync_period = 4;
  keys.fragments = 2;
  keys.overlap = 1;
  keys.alpha = 0.5;
  return keys;
}

// Streaming DiLoCo for 3 rounds; and with the Llama block.
TEST_F(DilocoCommandTest, StreamingDilocoMatchesTheAlgorithmWrittenOut) {
  ExpectReference("streaming", Streaming(), 12);
  ExpectReference("streaming-llama", Streaming(), 12,
                  {"decoder_block=llama2", "num_heads=4", "num_kv_heads=2",
                   "head_dim=16", "logits_via_embedding=false"});
}

// A checkpoint at step 6, while fragment 0's sync (started at step 6) is in
// flight, resumes to the same losses and state as the run that went on.
TEST_F(DilocoCommandTest, ResumeMidPeriodIsBitwiseExact) {
  const DilocoKeys keys = Streaming();
  const std::vector<std::string> args =
      With(With(Mesh(keys), keys.Overrides()),
           {"steps=8", "checkpoint_period=6", "run_name=resume"});
  const nlohmann::json whole = Train(args, "whole");
  const train::FullState end = LoadState(RunDir("resume"), 8);
  const train::FullState at6 = LoadState(RunDir("resume"), 6);
  EXPECT_FALSE(at6.outer_pending.empty());
  std::filesystem::remove_all(RunDir("resume") + "/checkpoints/8");
  const nlohmann::json resumed = Train(args, "resumed");
  EXPECT_EQ(resumed.value("restored_step", -1), 6);
  const std::vector<double> all = Losses(whole), tail = Losses(resumed);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0], all[6]);
  EXPECT_EQ(tail[1], all[7]);
  const train::FullState again = LoadState(RunDir("resume"), 8);
  EXPECT_EQ(again.outer, end.outer);
  EXPECT_EQ(again.outer_momentum, end.outer_momentum);
  EXPECT_EQ(again.params, end.params);
  ASSERT_EQ(again.more_replicas.size(), 1u);
  EXPECT_EQ(again.more_replicas[0].params, end.more_replicas[0].params);
  EXPECT_EQ(again.more_replicas[0].adam_v, end.more_replicas[0].adam_v);
  // Another schedule cannot resume a fragment in flight: one sentence.
  EXPECT_EQ(at6.diloco_schedule, (std::vector<int>{4, 2, 1}));
  std::filesystem::remove_all(RunDir("resume") + "/checkpoints/8");
  testing_util::Child changed = Spawn(
      Args(With(args, {"diloco_sync_period=6"})), {}, dir_.path(), "changed");
  EXPECT_EQ(WaitExit(changed, 120), 2);
  EXPECT_NE(ReadFile(changed.err)
                .find("has a fragment sync in flight under diloco_sync_period "
                      "4, num_diloco_fragments 2 and "
                      "num_communication_overlapping_steps 1, and this run "
                      "changes them"),
            std::string::npos)
      << ReadFile(changed.err);
}

// One replica, an outer step every step with lr 1 and momentum 0: the outer
// step puts back the inner parameters (up to the rounding of
// outer - (outer - inner)), so training is the plain run's. (With two
// replicas it is not data parallelism: the mean of two AdamW updates is not
// the AdamW update of the mean gradient.)
TEST_F(DilocoCommandTest, OneReplicaWithOuterLrOneIsThePlainRun) {
  DilocoKeys keys;
  keys.replicas = 1;
  keys.sync_period = 1;
  keys.outer_lr = 1;
  keys.outer_momentum = 0;
  const std::vector<std::string> common = {"steps=4", "checkpoint_period=4"};
  const nlohmann::json plain =
      Train(With(With(Mesh(keys), common), {"run_name=plain"}), "plain");
  const nlohmann::json diloco =
      Train(With(With(With(Mesh(keys), common), keys.Overrides()),
                 {"run_name=one_replica"}),
            "one_replica");
  ExpectClose(Losses(diloco), Losses(plain), 1e-6, "one replica");
  EXPECT_LT(MaxRelativeDifference(LoadState(RunDir("one_replica"), 4).params,
                                  LoadState(RunDir("plain"), 4).params),
            1e-6);
}

// The per-step gradient all-reduce across slices in int8 and bf16: the
// losses move off the f32 run's (the wire is used) but stay within 1 %.
TEST_F(DilocoCommandTest, CompressedGradientWireStaysCloseToF32) {
  DilocoKeys plain;
  plain.replicas = 1;
  const std::vector<std::string> common = {"steps=6", "checkpoint_period=6"};
  const nlohmann::json f32 =
      Train(With(With(Mesh(plain), common), {"run_name=f32"}), "f32");
  for (const std::string wire : {"bf16", "int8"}) {
    const nlohmann::json run =
        Train(With(With(Mesh(plain), common),
                   {"run_name=" + wire, "dcn_gradient_wire_dtype=" + wire}),
              wire);
    ExpectClose(Losses(run), Losses(f32), 1e-2, wire);
    EXPECT_NE(LoadState(RunDir(wire), 6).params,
              LoadState(RunDir("f32"), 6).params)
        << wire;
  }
}

// Slice 1 is killed mid-run and comes back on a fresh host (its in-memory
// replica gone): slice 0 restores its newest step from its own memory, and
// replica 1 rejoins at slice 0's outer parameters instead of both going back
// to the checkpoint. The run from there is the loop with that rejoin.
TEST_F(DilocoCommandTest, LostReplicaRejoinsAtTheOuterParameters) {
  DilocoKeys keys;
  keys.sync_period = 4;
  const std::string run = "rejoin" + std::to_string(::getpid());
  const std::vector<std::string> args = With(
      With(Mesh(keys), keys.Overrides()),
      {"steps=16", "checkpoint_period=100", "enable_in_memory_recovery=true",
       "in_memory_replica_period=1", "run_name=" + run});
  const std::string memory =
      "/dev/shm/multislice-" + std::to_string(::getuid());
  const std::string replica0 = memory + "/local-slice0/" + run;
  const std::string replica1 = memory + "/local-slice1/" + run;
  testing_util::Child victim = Spawn(
      Args(args), {"MULTISLICE_TEST_STEP_DELAY_MS=150"}, dir_.path(), "first");
  ASSERT_TRUE(testing_util::WaitForFile(replica0 + "/worker0/6/COMMITTED", 120))
      << ReadFile(victim.err);
  ASSERT_NO_FATAL_FAILURE(testing_util::KillWorker(victim, 1));
  std::filesystem::remove_all(replica1);
  const nlohmann::json resumed = Train(args, "second");
  const int64_t restored = resumed.value("restored_step", int64_t{-1});
  EXPECT_EQ(resumed.value("restored_from", std::string()), "replica");
  ASSERT_GE(restored, 6);
  ASSERT_LT(restored, 16);
  const Reference ref = RunReference(
      Config(With(keys.Overrides(), {"steps=16", "per_device_batch_size=2"})),
      DatasetDir(), keys, Loss{.rejoin_after = restored});
  const std::vector<double> losses = Losses(resumed);
  ASSERT_EQ(losses.size(), static_cast<size_t>(16 - restored));
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], ref.losses[restored + i],
                1e-5 * ref.losses[restored + i])
        << "step " << restored + i + 1;
  }
  const train::FullState end = LoadState(RunDir(run), 16);
  ASSERT_EQ(end.more_replicas.size(), 1u);
  EXPECT_LT(MaxRelativeDifference(end.more_replicas[0].params, ref.inner[1]),
            1e-4);
  EXPECT_LT(
      MaxRelativeDifference(
          end.outer, std::vector<float>(ref.outer.begin(), ref.outer.end())),
      1e-4);
  std::filesystem::remove_all(replica0);
  std::filesystem::remove_all(replica1);
}

// Three slices of one device, one replica each.
const std::vector<std::string> kThreeSlicesOfOne = {"per_device_batch_size=2",
                                                    "dcn_diloco_parallelism=3",
                                                    "--num_slices",
                                                    "3",
                                                    "--accelerator_type",
                                                    "cpu-1"};

// The last slice of three: two survivors, which average over a DCN
// communicator of their own.
TEST_F(DilocoCommandTest, LostSliceLeavesTheOthersTraining) {
  DilocoKeys keys;
  keys.replicas = 3;
  ExpectSurvivorsTrainOn("lost3", keys, kThreeSlicesOfOne, 3);
}

// The middle slice of three: the survivors' ranks close the gap (slices 0
// and 2 become ranks 0 and 1 of the diloco group and of their new DCN
// communicator).
TEST_F(DilocoCommandTest, AMiddleSliceLostLeavesNoGap) {
  DilocoKeys keys;
  keys.replicas = 3;
  ExpectSurvivorsTrainOn("lost-middle", keys, kThreeSlicesOfOne, 3,
                         /*lost_slice=*/1);
}

// Two slices of fsdp 2: the survivor's two device threads both notice the
// loss, one agrees on it, and the replica then syncs with itself alone.
TEST_F(DilocoCommandTest, LastSurvivorTrainsOnAlone) {
  DilocoKeys keys;
  ExpectSurvivorsTrainOn("lost2", keys, Mesh(keys), 4);
}

// The lost slice is started again by the launcher and rejoins at the next
// sync after its workers asked (the survivors see the request in that
// step's fault check): from then on the syncs average all three replicas
// again. The losses are the loop with replica 2 dropped after step 3 and
// back after the step the run names, at the outer parameters with replica
// 0's moments; tokens/s is the whole batch again from the step after it,
// and the last checkpoint holds replica 2's own state.
TEST_F(DilocoCommandTest, ARestartedSliceRejoinsAtTheNextSync) {
  DilocoKeys keys;
  keys.replicas = 3;
  const std::string name = "rejoin";
  const std::vector<std::string> common = With(
      keys.Overrides(), {"steps=16", "diloco_continue_on_failure=true",
                         "diloco_max_slice_restarts=1", "checkpoint_period=8",
                         "eval_interval=8", "run_name=" + name});
  testing_util::Child run = Spawn(Args(With(kThreeSlicesOfOne, common)),
                                  {"MULTISLICE_TEST_KILL_AFTER_STEP=2:3",
                                   "MULTISLICE_TEST_STEP_DELAY_MS=300"},
                                  dir_.path(), name);
  ASSERT_EQ(WaitExit(run, 240), 0) << ReadFile(run.err);
  const std::string err = ReadFile(run.err);
  EXPECT_NE(err.find("slice 2 was lost and started again (1 time); the other "
                     "slices went on meanwhile"),
            std::string::npos)
      << err;
  const std::string said = "multislice train: slice 2 rejoined after step ";
  const size_t at = err.find(said);
  ASSERT_NE(at, std::string::npos) << err;
  const int64_t rejoined = std::stoll(err.substr(at + said.size()));
  EXPECT_GT(rejoined, 3) << err;
  EXPECT_LT(rejoined, 16) << err;
  EXPECT_EQ(rejoined % keys.sync_period, 0) << err;  // a sync step
  EXPECT_NE(err.find("slice 2 worker 0 rejoined after step " +
                     std::to_string(rejoined) + " at the outer parameters"),
            std::string::npos)
      << err;
  std::string out = ReadFile(run.out);
  out = out.substr(out.rfind("\n{") + 1);
  const nlohmann::json summary = nlohmann::json::parse(out);
  const TrainConfig config = Config(With(common, {"per_device_batch_size=2"}));
  const Reference ref = RunReference(
      config, DatasetDir(), keys,
      Loss{.rejoin_after = rejoined, .drop_after = 3, .dropped = 2}, 3);
  ExpectClose(Losses(summary), ref.losses, 1e-5, name);
  const Reference away = RunReference(config, DatasetDir(), keys,
                                      Loss{.drop_after = 3, .dropped = 2}, 3);
  EXPECT_GT(std::fabs(away.losses.back() - ref.losses.back()), 1e-4);
  std::ifstream metrics(RunDir(name) + "/metrics.jsonl");
  const double batch = 2.0 * 3 * config.max_target_length;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    const double share = r["step"] <= 3 || r["step"] > rejoined ? 1.0 : 2 / 3.0;
    EXPECT_NEAR(
        r["tokens_per_s"].get<double>() * r["step_time_s"].get<double>(),
        batch * share, 1e-6 * batch)
        << "step " << r["step"];
  }
  const train::FullState state = LoadState(RunDir(name), 16);
  ASSERT_EQ(state.more_replicas.size(), 2u);
  const std::vector<float> outer(ref.outer.begin(), ref.outer.end());
  EXPECT_LT(MaxRelativeDifference(state.outer, outer), 1e-4);
  EXPECT_LT(MaxRelativeDifference(state.more_replicas[1].params, ref.inner[2]),
            1e-4);
}

// Lost after step 7 of 8: the survivors notice at the last step, where
// they admit no one and close the admissions, so the restarted slice is
// told that training is over and exits 0.
TEST_F(DilocoCommandTest, ASliceBackAfterTheLastSyncFindsTrainingOver) {
  DilocoKeys keys;
  keys.replicas = 3;
  const std::string name = "too-late";
  testing_util::Child run =
      Spawn(Args(With(kThreeSlicesOfOne,
                      With(keys.Overrides(),
                           {"steps=8", "diloco_continue_on_failure=true",
                            "diloco_max_slice_restarts=2",
                            "checkpoint_period=100", "run_name=" + name}))),
            {"MULTISLICE_TEST_KILL_AFTER_STEP=2:7"}, dir_.path(), name);
  ASSERT_EQ(WaitExit(run, 240), 0) << ReadFile(run.err);
  const std::string err = ReadFile(run.err);
  EXPECT_NE(err.find("[slice 2 worker 0] multislice train: slice 2 worker 0 "
                     "was started again, but the other slices finished "
                     "training before it could rejoin"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("slice 2 was lost and started again (1 time)"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("rejoined after"), std::string::npos) << err;
}

// A DiLoCo checkpoint resumes only as DiLoCo with as many replicas (each
// worker finds it in the checkpoint and says the same sentence); the diloco
// axis without enable_diloco is refused before any worker starts.
TEST_F(DilocoCommandTest, MismatchedDilocoIsOneSentenceAndExitCode2) {
  DilocoKeys keys;
  Train(With(With(Mesh(keys), keys.Overrides()),
             {"steps=2", "checkpoint_period=2", "run_name=saved"}),
        "saved");
  DilocoKeys plain;
  plain.replicas = 1;
  struct Case {
    std::vector<std::string> args;
    std::string sentence;
  };
  const std::vector<Case> cases = {
      {With(Mesh(plain), {"steps=4", "run_name=saved"}),
       "holds 2 DiLoCo replica(s) and this run has DiLoCo off; resume it "
       "with the same enable_diloco"},
      {With(Mesh(keys), {"steps=4", "run_name=other"}),
       "keys ici_diloco_parallelism (1) x dcn_diloco_parallelism (2) = 2 "
       "replicas: expected enable_diloco=true"},
  };
  for (const Case& c : cases) {
    testing_util::Child child = Spawn(Args(c.args), {}, dir_.path(), "bad");
    EXPECT_EQ(WaitExit(child, 120), 2) << c.sentence;
    const std::string err = ReadFile(child.err);
    EXPECT_NE(err.find(c.sentence), std::string::npos) << err;
    // Every line is that sentence, but the launcher's about the exit.
    std::istringstream lines(err);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("exited with code 2") != std::string::npos) continue;
      EXPECT_NE(line.find(c.sentence), std::string::npos) << line;
    }
  }
}

}  // namespace
}  // namespace multislice
