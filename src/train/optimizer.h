// The optimizer on a device's shard: the schedule's learning rate, the
// clip of the global gradient norm, and AdamW (compute/adamw.h), for the
// mean over every device of gradients that arrive summed.
#pragma once

#include <cstdint>
#include <vector>

#include "train/config.h"
#include "train/parallel_plan.h"

namespace multislice::train {

class ShardOptimizer {
 public:
  // decay_mask: model::WeightDecayMask of the whole buffer; the plan's
  // shard reads its part. num_devices: the summed gradient's divisor.
  ShardOptimizer(const TrainConfig& config, std::vector<uint8_t> decay_mask,
                 int64_t shard_begin, int num_devices);

  // The global norm of the mean gradient from the squared norm of the sum.
  double MeanNorm(double summed_squared_norm) const;

  // One step (1-based) on b.shard and its moments from b.gradient (the sum
  // over devices of this shard's gradient) whose mean has global norm
  // mean_norm; returns the step's learning rate.
  double Apply(int64_t step, double mean_norm, DeviceBuffers& b) const;

 private:
  const TrainConfig& config_;
  const std::vector<uint8_t> decay_mask_;
  const int64_t shard_begin_;
  const float inv_devices_;
};

}  // namespace multislice::train
