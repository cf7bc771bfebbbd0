// GPT-2 layer operations for one device, in f32, forward and backward.
//
// Plain functions on caller-owned, row-major float arrays, in the manner of
// llm.c: B = batch, T = sequence length, C = channels, NH = attention heads,
// V = vocabulary size, N = B * T rows. The weight matrix multiplications live
// in model/; these are the remaining element-wise, normalisation and loss
// kernels of a GPT-2 block and of the decoder's ends (attention is
// attention.h), explicit 16-lane vector loops (AVX-512, AVX2 or baseline
// SSE2, as common/cpu_isa.h chooses), deterministic for a given ISA level.
//
// Contracts shared by every function:
//  * Pointers are non-null and address at least the stated number of
//    elements; outputs do not alias inputs unless a function says so.
//  * Every backward ACCUMULATES (+=) into its gradient outputs, so the caller
//    zeroes gradients once per step.
//  * Token ids and targets lie in [0, V); positions use the first T rows of
//    wpe.
//  * Functions are reentrant and keep no state (beyond compute::Gemm's
//    per-thread primitive cache); no threads are started.
#ifndef MULTISLICE_COMPUTE_GPT_OPS_H_
#define MULTISLICE_COMPUTE_GPT_OPS_H_

#include <cstdint>

namespace multislice::compute::gpt {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
void EncoderForward(float* out, const std::int32_t* tokens, const float* wte,
                    const float* wpe, int B, int T, int C);
// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:].
void EncoderBackward(float* dwte, float* dwpe, const float* dout,
                     const std::int32_t* tokens, int B, int T, int C);

// Per row of C values: mean = sum(x)/C, rstd = 1/sqrt(var + eps) with the
// biased variance, out = (x - mean) * rstd * weight + bias. mean and rstd
// (N each) are saved for the backward.
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                      const float* weight, const float* bias, std::int64_t N,
                      int C, float eps = 1e-5f);
// With xhat = (x - mean) * rstd and g = dout * weight:
// dbias += dout, dweight += dout * xhat,
// dinp += rstd * (g - avg(g) - xhat * avg(g * xhat)).
void LayerNormBackward(float* dinp, float* dweight, float* dbias,
                       const float* dout, const float* inp, const float* weight,
                       const float* mean, const float* rstd, std::int64_t N,
                       int C);

// GPT-2's tanh approximation:
// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed as the
// identical x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) (within 2 ulp).
void GeluForward(float* out, const float* inp, std::int64_t n);
// dinp += dout * d(out)/dx of the formula above.
void GeluBackward(float* dinp, const float* inp, const float* dout,
                  std::int64_t n);
// The forward that keeps only what the backward needs: GELU(x) into out
// (when non-null) and its bf16 rounding into out16 (when non-null), and x
// overwritten with GELU'(x), from the one sigmoid both share; the backward
// is then a multiply (GptModel folds it into the next matmul's epilogue).
// Values equal GeluForward's and GeluBackward's, the plain forms above and
// the definitions it is tested against.
void GeluForwardSaveGrad(float* x, float* out, std::uint16_t* out16,
                         std::int64_t n);

// dbias += the column sums of dout [N, OC].
void BiasBackward(float* dbias, const float* dout, std::int64_t N, int OC);

// Per row i: probs[i,:] = softmax(logits[i,:]) (max-subtracted),
// losses[i] = -log(probs[i, targets[i]]).
void CrossEntropyForward(float* losses, float* probs, const float* logits,
                         const std::int32_t* targets, std::int64_t N, int V);
// Backward through softmax and NLL together:
// dlogits[i,v] += dlosses[i] * (probs[i,v] - [v == targets[i]]).
void CrossEntropySoftmaxBackward(float* dlogits, const float* dlosses,
                                 const float* probs,
                                 const std::int32_t* targets, std::int64_t N,
                                 int V);
// The same written (=) rather than accumulated, for a dlogits that holds
// nothing yet (saves zeroing N x V values first).
void CrossEntropySoftmaxGrad(float* dlogits, const float* dlosses,
                             const float* probs, const std::int32_t* targets,
                             std::int64_t N, int V);

}  // namespace multislice::compute::gpt

#endif  // MULTISLICE_COMPUTE_GPT_OPS_H_
