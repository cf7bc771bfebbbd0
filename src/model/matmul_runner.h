// The model's matmuls on f32 operands: directly in f32, or in bf16 on bf16
// copies of both operands (accumulation and C stay f32), through
// compute::Gemm on the calling thread. A caller that uses an operand more
// than once passes its bf16 copy (the weights are rounded once per forward,
// an activation once when it is made); other operands are rounded here into
// scratch. Shared by the decoder and its blocks; not thread-safe (one per
// model).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "compute/matmul.h"

namespace multislice::model {

// Grows v to at least n elements, never shrinks it: a scratch vector reused
// at several sizes is then zero-filled only once.
void Reserve(std::vector<uint16_t>& v, int64_t n);

class MatmulRunner {
 public:
  // An f32 operand and, in bf16 mode, optionally its bf16 copy.
  struct Operand {
    const float* f32 = nullptr;
    const uint16_t* bf16 = nullptr;
  };

  explicit MatmulRunner(DType ab_type) : ab_type_(ab_type) {}

  DType type() const { return ab_type_; }

  // In bf16 mode, rounds x[0, n) into `store` and returns {x, store}; in f32
  // mode returns {x, null}.
  Operand Prepare(const float* x, int64_t n, std::vector<uint16_t>& store);

  // C[m,n] (beta 0: =, beta 1: +=) op(A)[m,k] @ op(B)[k,n], dense operands.
  Status Run(compute::GemmDesc desc, Operand a, Operand b, float* c,
             const float* bias = nullptr, const float* d = nullptr);

  // out[N,OC] = inp[N,IC] @ weight[IC,OC] (+ bias) (+ residual[N,OC]): the
  // bias and the residual are added in the matmul's epilogue.
  Status LinearForward(float* out, Operand inp, Operand weight,
                       const float* bias, int64_t N, int64_t IC, int64_t OC,
                       const float* residual = nullptr);

  // dinp[N,IC] (dinp_beta 0: =, 1: +=) dout[N,OC] @ weight^T, times
  // dinp_scale[N,IC] element by element when non-null (an activation's
  // derivative, in the matmul's epilogue); dweight[IC,OC] = inp^T @ dout;
  // dbias[OC] = column sums of dout (when non-null). after_dinp, if set,
  // runs once dinp is written, before the weight gradient.
  Status LinearBackward(float* dinp, float dinp_beta, float* dweight,
                        float* dbias, Operand dout, Operand inp, Operand weight,
                        int64_t N, int64_t IC, int64_t OC,
                        const float* dinp_scale = nullptr,
                        const std::function<void()>& after_dinp = {});

  // The head: logits[N,V] = x[N,C] @ w^T with w stored [V,C], scaled by
  // alpha (a tied head's normalisation).
  Status HeadForward(float* logits, Operand x, Operand w, int64_t N, int64_t C,
                     int64_t V, float alpha);
  // Its backward: dx[N,C] = alpha dlogits @ w, dw[V,C] = alpha dlogits^T @ x
  // (beta 0: =, 1: +=).
  Status HeadBackward(float* dx, float* dw, float dw_beta, Operand dlogits,
                      Operand x, Operand w, int64_t N, int64_t C, int64_t V,
                      float alpha);

 private:
  DType ab_type_;
  std::vector<uint16_t> a16_, b16_;  // bf16 copies of A and B
};

}  // namespace multislice::model
