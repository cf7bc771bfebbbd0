// The optimizer kernels of the GPT-2 training loop (`multislice train`): one
// AdamW step and the gradient's global norm, on one device's shard. The
// schedule and clipping factor around them are model/schedule.h.
//
// Plain functions on caller-owned f32 arrays; reentrant, no state, no threads.
// Implemented by the CPU backend (compute/cpu/adamw.cc) for every ISA level.
#ifndef MULTISLICE_COMPUTE_ADAMW_H_
#define MULTISLICE_COMPUTE_ADAMW_H_

#include <cstdint>

namespace multislice::compute {

struct AdamWOptions {
  float lr = 0.0f;  // this step's learning rate (model::LearningRate)
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // decoupled: p -= lr * weight_decay * p
  float grad_scale = 1.0f;    // g = grads[i] * grad_scale (e.g. clipping)
};

// One AdamW step over n parameters, in place on params, m and v (the first
// and second moments, zero before step 1). step is 1-based (it sets the bias
// corrections c1 = 1 - beta1^step and c2 = 1 - beta2^step). With
// g = grads[i] * grad_scale, m = beta1 m + (1 - beta1) g,
// v = beta2 v + (1 - beta2) g g:
//   p -= lr * ((m * (1/c1)) / (sqrt(v) * (1/sqrt(c2)) + eps) + wd * p)
// (mhat / (sqrt(vhat) + eps) with mhat = m / c1, vhat = v / c2; the
// reciprocals are computed in double and rounded to f32 once per step)
// where wd = weight_decay if decay_mask is null or decay_mask[i] != 0, else 0.
// Every ISA level gives exactly the values of the plain scalar loop of these
// formulas in f32 (each product and sum rounded separately, correctly rounded
// division and sqrt).
void AdamWUpdate(float* params, const float* grads, float* m, float* v,
                 int64_t n, const AdamWOptions& options, int64_t step,
                 const uint8_t* decay_mask);

// sum g[i]^2, accumulated in double in a fixed order (the same value on
// every ISA level).
double SumOfSquares(const float* g, int64_t n);

// sqrt(SumOfSquares(g, n)).
double GlobalNorm(const float* g, int64_t n);

}  // namespace multislice::compute

#endif  // MULTISLICE_COMPUTE_ADAMW_H_
