// AdamW optimiser, gradient-norm clipping and the learning-rate schedule for
// the GPT-2 training loop (`multislice train`).
//
// Plain functions on caller-owned f32 arrays; reentrant, no state, no threads.
#ifndef MULTISLICE_MODEL_ADAMW_H_
#define MULTISLICE_MODEL_ADAMW_H_

#include <cstdint>

namespace multislice::model {

struct AdamWOptions {
  float lr = 0.0f;  // this step's learning rate (see LearningRate)
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // decoupled: p -= lr * weight_decay * p
};

// One AdamW step over n parameters, in place on params, m and v (the first
// and second moments, zero before step 1). step is 1-based (it sets the bias
// corrections 1 - beta^step). With mhat = m / (1 - beta1^step) and
// vhat = v / (1 - beta2^step):
//   p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p)
// where wd = weight_decay if decay_mask is null or decay_mask[i] != 0, else 0.
void AdamWUpdate(float* params, const float* grads, float* m, float* v,
                 int64_t n, const AdamWOptions& options, int64_t step,
                 const uint8_t* decay_mask);

// sqrt(sum g[i]^2), accumulated in double.
double GlobalNorm(const float* g, int64_t n);

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

#endif  // MULTISLICE_MODEL_ADAMW_H_
