// DiLoCo's outer optimizer on one device's shard (Douillard et al. 2023,
// arXiv 2311.08105; MaxText's enable_diloco), with Streaming DiLoCo's
// fragments, overlap and mixing (Douillard et al. 2025, arXiv 2501.18512;
// torchft's DiLoCo with fragment_sync_delay and fragment_update_alpha).
//
// Each replica (a member of the replica axes, normally the mesh's diloco
// axis) runs inner steps on its own. The shard's values are split into F
// fragments (OuterOptimizerOptions::fragments; one fragment, the whole
// shard, is plain DiLoCo), each synced once per round of H inner steps
// (H = sync_period), staggered by g = H / F steps. With K replicas, tau =
// overlap_steps, alpha the mixing weight, lr and mu the outer learning rate
// and momentum, and t the 1-based inner step:
//
//   start  fragment f after step t when t % H == ((f + 1) g) % H (so
//          fragment F - 1 at multiples of H; F = 1, tau = 0 is DiLoCo's
//          sync every H steps):
//            delta_f = outer_f - inner_f            (the pseudo-gradient)
//            s_f     = sum over replicas of delta_f (an all-reduce, started
//                                                    and left in flight)
//   land   after step t + tau (tau = 0: the step it started at):
//            delta    = s_f / K
//            momentum = mu momentum + delta
//            outer   -= lr (delta + mu momentum)   (Nesterov, as optax.sgd
//                                                   and torch.optim.SGD)
//            inner    = alpha inner + (1 - alpha) outer
//          on the fragment's values only; `inner` there is the replica's
//          value after step t + tau, which kept training while the sum was
//          on the wire. alpha = 0 copies outer exactly, so every replica
//          then holds bitwise the same values of the fragment.
//
// With tau < g (the config checks H % F == 0, 0 <= tau < g, 0 <= alpha <= 1)
// at most one fragment is in flight at a time: each lands before the next
// one starts (with tau = 0 on the step it started).
//
// The outer state (outer parameters, momentum) is sharded like the inner
// weights: each device keeps the outer copy of its own shard, and replicas'
// devices at the same position hold the same shard, so a fragment's sum is
// one all-reduce of its values on that shard (its ranges packed into one
// contiguous buffer, in the order the ranges are listed) over the replica
// axes. A fragment with no values on this shard sends nothing: every member
// of the replica group holds the same shard position, hence the same
// (empty) ranges, so they all skip that all-reduce together. The inner AdamW
// state is each replica's own and stays.
//
// The pseudo-gradient crosses the wire as OuterOptimizerOptions::wire says:
// kF32 through DeviceCollectives::AllReduce, bf16 or int8 through
// CompressedAllReduce, with the error bound of runtime/collectives.h on the
// sum.
//
// Not thread-safe: one optimizer per device thread, called with that
// device's DeviceCollectives.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/decoder.h"
#include "runtime/collectives.h"
#include "runtime/wire.h"

namespace multislice::train {

// Fragments of a buffer: fragment f is the list of ranges [begin, end) of
// positions it holds.
using FragmentRanges = std::vector<std::vector<std::pair<int64_t, int64_t>>>;

struct OuterOptimizerOptions {
  double learning_rate = 0.3;  // diloco_outer_lr
  double momentum = 0.9;       // diloco_outer_momentum (Nesterov)
  runtime::Axes replica_axes = {"diloco"};
  // The wire of the pseudo-gradient's all-reduce: kF32 = AllReduce, else
  // DeviceCollectives::CompressedAllReduce (runtime/collectives.h, wire.h).
  runtime::WireType wire = runtime::WireType::kF32;
  int sync_period = 36;  // H, inner steps per fragment per round
  // The fragments: fragment f is the list of ranges [begin, end) of the
  // device's shard (shard positions) it holds; together they cover
  // [0, count) once. Empty: one fragment, the whole shard (DiLoCo).
  FragmentRanges fragments;
  int overlap_steps = 0;  // tau: a fragment's sync lands tau steps later
  double alpha = 0.0;     // mixing when it lands (above)
  // Keep a copy of the pseudo-gradient in flight, so that Resend can start
  // its all-reduce again (diloco_continue_on_failure).
  bool resendable = false;
};

class OuterOptimizer {
 public:
  // `params`: the shard's starting parameters (count values), the outer
  // copy's first value on every replica; momentum starts at 0. Options that
  // break the rules above (H < 1, H % F != 0, tau outside [0, g), alpha
  // outside [0, 1], fragments not covering [0, count) exactly once) make
  // every AfterInnerStep return kInvalidArgument naming them.
  OuterOptimizer(const OuterOptimizerOptions& options, const float* params,
                 int64_t count);
  // Waits for the all-reduce in flight, if any (it writes into this
  // optimizer's buffer); a failure there is dropped, as the trainer has
  // already stopped or will see it on every other device.
  ~OuterOptimizer();
  OuterOptimizer(OuterOptimizer&&) = default;
  OuterOptimizer(const OuterOptimizer&) = delete;
  OuterOptimizer& operator=(const OuterOptimizer&) = delete;

  // After inner step `step` (1-based) has updated `inner` (count values):
  // lands the sync due at this step, then starts the one due at this step
  // (and, with tau = 0, lands it at once). Every replica calls it at every
  // step, in the same order as its other collectives. `inner` is read at a
  // start and written at a landing; nothing is kept of it in between.
  // kFailedPrecondition when a landing was skipped (a step not called).
  Status AfterInnerStep(runtime::DeviceCollectives& coll, int64_t step,
                        float* inner);

  // After the all-reduce in flight failed because replicas were lost and
  // the runtime left them out of the replica group (the trainer's
  // diloco_continue_on_failure): starts it again, from the pseudo-gradient
  // it started with, over the replicas left. Calling AfterInnerStep for the
  // same step again then finishes that step's work (a fragment that already
  // started at the step does not start twice). kFailedPrecondition without
  // options.resendable.
  Status Resend(runtime::DeviceCollectives& coll);

  // Waits for the all-reduce in flight, if any; its result stays pending
  // until its step (and is what pending() holds). Called before the state
  // is copied into a checkpoint.
  Status Settle();

  // The outer state, count values each: the outer parameters, the
  // momentum, and pending = the reduced sum of the fragment in flight after
  // the last step (at its ranges; 0 elsewhere; all 0 when none; an empty
  // vector when overlap_steps == 0). pending() is only meaningful after
  // Settle().
  std::vector<float>& outer() { return outer_; }
  std::vector<float>& momentum() { return momentum_; }
  std::vector<float>& pending() { return pending_; }

  // After the caller has overwritten outer(), momentum() and pending() with
  // the state saved (after Settle) at `step`: the fragment in flight after
  // `step` (derived from step, H, F and tau) is taken as reduced, landing
  // at its step. Continuing gives bitwise what the uninterrupted run gives.
  void Resume(int64_t step);

  // Counters for the trainer's metrics: the values this device has sent to
  // the pseudo-gradient all-reduces so far, and their size on the wire
  // (runtime::WireBytes of each all-reduce's values; the bytes the links
  // carry are the runtime's TrafficCounters).
  // Whether a fragment's sync starts after inner step `step` (the same on
  // every replica: the schedule depends on the step alone).
  bool SyncStartsAfter(int64_t step) const {
    return FragmentStartingAt(step) >= 0;
  }
  int64_t synced_values() const { return synced_values_; }
  int64_t synced_wire_bytes() const { return synced_wire_bytes_; }

 private:
  struct InFlight {
    int fragment = 0;
    int64_t land_step = 0;
    bool reduced = false;  // the sum is in wire_ (waited, or resumed)
  };

  // The fragment that starts after `step`, or -1.
  int FragmentStartingAt(int64_t step) const;
  Status Start(runtime::DeviceCollectives& coll, int fragment,
               const float* inner);
  // Starts the all-reduce of the first n values of wire_ (of `fragment`).
  void Launch(runtime::DeviceCollectives& coll, size_t n, int fragment);
  Status Land(runtime::DeviceCollectives& coll, float* inner);

  const OuterOptimizerOptions options_;
  Status invalid_;  // the options' error, if any
  FragmentRanges fragments_;
  int64_t fragment_step_ = 1;  // g = H / F
  std::vector<float> outer_, momentum_, pending_;
  std::vector<float> wire_;  // the fragment in flight, packed
  std::vector<float> sent_;  // with options.resendable: wire_ as sent
  size_t sent_count_ = 0;
  int64_t last_start_ = 0;  // the step of the last fragment's start
  std::optional<InFlight> in_flight_;
  runtime::CollectiveHandle handle_;
  int64_t synced_values_ = 0;
  int64_t synced_wire_bytes_ = 0;
};

// The fragments of whole layers of a (stage, tensor rank) flat buffer
// (model::ParameterLayout(model, tensor_size, stage)): fragment f holds
// the global layers [f L / F, (f + 1) L / F) (integer division; the
// tensors named "h<l>."), the tensors before the first layer (wte, wpe) go
// with fragment 0, and lnf with fragment F - 1, except the last stage's copy
// of the tied wte, which goes with fragment 0 like the first stage's wte (so
// both copies of the tied weight sync at the same steps and stay equal).
// Buffer positions, adjacent ranges merged; a fragment may have no range on
// a stage. kInvalidArgument when F < 1 or F > layers.
Result<FragmentRanges> LayerFragments(const model::DecoderConfig& model,
                                      int tensor_size,
                                      model::PipelineStage stage,
                                      int fragments);

// Those fragments cut to the shard [begin, begin + count), in shard
// positions (a fragment may end up with no range).
FragmentRanges ShardFragments(const FragmentRanges& fragments, int64_t begin,
                              int64_t count);

}  // namespace multislice::train
