// The learning-rate schedule and gradient clipping factor of the GPT-2
// training loop (`multislice train`); the optimizer kernels they feed are
// compute/adamw.h. Pure scalar functions.
#ifndef MULTISLICE_MODEL_SCHEDULE_H_
#define MULTISLICE_MODEL_SCHEDULE_H_

#include <cstdint>

namespace multislice::model {

// The factor to multiply gradients by so their norm is at most threshold:
// threshold / norm when threshold > 0 and norm > threshold, else 1.
float ClipScale(double norm, float threshold);

// Learning rate for 1-based step `step` (0 gives 0 during warm-up): linear
// from 0 to peak_lr over the first warmup_steps steps (peak at step ==
// warmup_steps), then a cosine from peak_lr down to peak_lr * final_fraction
// at step == total_steps, constant after. warmup_steps >= total_steps means
// warm-up only; warmup_steps <= 0 means no warm-up. Never NaN.
double LearningRate(int64_t step, int64_t total_steps, int64_t warmup_steps,
                    double peak_lr, double final_fraction);

}  // namespace multislice::model

#endif  // MULTISLICE_MODEL_SCHEDULE_H_
