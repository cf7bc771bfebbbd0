// The unsharded single-device computation of one shardings step, written in
// the plain layouts of the original (X [BATCH, E], weights [F, E]) so that it
// checks the sharded implementation independently: the same seed gives the
// same tensors, and a sharded run must reproduce this loss and these updated
// weights. Same precision policy as the model: storage in the config's dtype,
// matmuls accumulate in f32.
#pragma once

#include <vector>

#include "model/shardings.h"

namespace multislice::model {

struct ReferenceResult {
  double loss = 0;
  // Updated weights per layer, [F, E] row-major, as f32.
  std::vector<std::vector<float>> emb2ff, ff2emb;
};

Result<ReferenceResult> ShardingsReferenceStep(const ShardingsConfig& config,
                                               int64_t batch);

}  // namespace multislice::model
