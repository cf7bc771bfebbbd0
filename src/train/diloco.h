// DiLoCo's outer optimizer on one device's shard (Douillard et al. 2023,
// arXiv 2311.08105; MaxText's enable_diloco): every diloco_sync_period inner
// steps each replica's pseudo-gradient (outer params - inner params) is
// averaged over the replicas, the outer parameters take one step of SGD
// with Nesterov momentum on it, and every replica continues from them:
//
//   delta    = mean over replicas of (outer - inner)
//   momentum = mu * momentum + delta
//   outer   -= lr * (delta + mu * momentum)        (Nesterov, as optax.sgd
//                                                   and torch.optim.SGD)
//   inner    = outer
//
// The outer state (outer parameters, momentum) is sharded like the inner
// weights: each device keeps the outer copy of its own shard, and replicas'
// devices at the same position hold the same shard, so the average is one
// all-reduce of the shard over the replica axis. The inner AdamW state is
// each replica's own and stays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/collectives.h"

namespace multislice::train {

struct OuterOptimizerOptions {
  double learning_rate = 0.3;  // diloco_outer_lr
  double momentum = 0.9;       // diloco_outer_momentum (Nesterov)
  runtime::Axes replica_axes = {"diloco"};
};

class OuterOptimizer {
 public:
  // `params`: the shard's starting parameters (count values), the outer
  // copy's first value on every replica.
  OuterOptimizer(const OuterOptimizerOptions& options, const float* params,
                 int64_t count);

  // One outer step from this replica's inner shard; afterwards inner holds
  // the new outer parameters (equal on every replica, bit for bit).
  Status Sync(runtime::DeviceCollectives& coll, float* inner);

  // The outer state, for checkpoints (count values each).
  std::vector<float>& outer() { return outer_; }
  std::vector<float>& momentum() { return momentum_; }

 private:
  const OuterOptimizerOptions options_;
  std::vector<float> outer_, momentum_, delta_;
};

}  // namespace multislice::train
