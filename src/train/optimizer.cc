#include "train/optimizer.h"

#include <cmath>
#include <utility>

#include "compute/adamw.h"
#include "model/schedule.h"

namespace multislice::train {

ShardOptimizer::ShardOptimizer(const TrainConfig& config,
                               std::vector<uint8_t> decay_mask,
                               int64_t shard_begin, int num_devices)
    : config_(config),
      decay_mask_(std::move(decay_mask)),
      shard_begin_(shard_begin),
      inv_devices_(1.0f / static_cast<float>(num_devices)) {}

double ShardOptimizer::MeanNorm(double summed_squared_norm) const {
  return std::sqrt(summed_squared_norm) * static_cast<double>(inv_devices_);
}

double ShardOptimizer::Apply(int64_t step, double mean_norm,
                             DeviceBuffers& b) const {
  compute::AdamWOptions adam;
  adam.beta1 = static_cast<float>(config_.adam_b1);
  adam.beta2 = static_cast<float>(config_.adam_b2);
  adam.eps = static_cast<float>(config_.adam_eps);
  adam.weight_decay = static_cast<float>(config_.adam_weight_decay);
  // The clipped mean gradient, scaled inside the AdamW pass.
  adam.grad_scale =
      model::ClipScale(
          mean_norm, static_cast<float>(config_.gradient_clipping_threshold)) *
      inv_devices_;
  const double lr = model::LearningRate(
      step, config_.steps, config_.warmup_steps, config_.learning_rate,
      config_.cosine_learning_rate_final_fraction);
  adam.lr = static_cast<float>(lr);
  compute::AdamWUpdate(b.shard.data(), b.gradient, b.adam_m.data(),
                       b.adam_v.data(), static_cast<int64_t>(b.shard.size()),
                       adam, step, decay_mask_.data() + shard_begin_);
  return lr;
}

}  // namespace multislice::train
