#include "train/diloco.h"

#include <algorithm>

namespace multislice::train {

OuterOptimizer::OuterOptimizer(const OuterOptimizerOptions& options,
                               const float* params, int64_t count)
    : options_(options),
      outer_(params, params + count),
      momentum_(static_cast<size_t>(count), 0.0f),
      delta_(static_cast<size_t>(count), 0.0f) {}

Status OuterOptimizer::Sync(runtime::DeviceCollectives& coll, float* inner) {
  const size_t n = outer_.size();
  for (size_t i = 0; i < n; ++i) delta_[i] = outer_[i] - inner[i];
  ASSIGN_OR_RETURN(const runtime::AxisGroup* group,
                   coll.Group(options_.replica_axes));
  RETURN_IF_ERROR(coll.AllReduce(options_.replica_axes, delta_.data(),
                                 delta_.data(), n, runtime::DType::kF32,
                                 runtime::ReduceOp::kSum, "diloco/delta")
                      .Wait());
  const float inv = 1.0f / static_cast<float>(group->size);
  const auto lr = static_cast<float>(options_.learning_rate);
  const auto mu = static_cast<float>(options_.momentum);
  for (size_t i = 0; i < n; ++i) {
    const float delta = delta_[i] * inv;
    momentum_[i] = mu * momentum_[i] + delta;
    outer_[i] -= lr * (delta + mu * momentum_[i]);
  }
  std::copy(outer_.begin(), outer_.end(), inner);
  return OkStatus();
}

}  // namespace multislice::train
