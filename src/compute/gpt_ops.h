// GPT-2 layer operations for one device, in f32, forward and backward.
//
// Plain functions on caller-owned, row-major float arrays, in the manner of
// llm.c: B = batch, T = sequence length, C = channels, NH = attention heads,
// V = vocabulary size, N = B * T rows. The weight matrix multiplications live
// in gpt.cc; these are the remaining element-wise, normalisation, attention
// and loss kernels of a GPT-2 block. Attention runs its per-head products as
// matmuls through compute::Gemm (oneDNN) on the calling thread; the other
// kernels are explicit 16-lane vector loops (AVX-512, AVX2 or baseline SSE2,
// as common/cpu_isa.h chooses), deterministic for a given ISA level.
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

#include "common/dtype.h"
#include "common/status.h"

namespace multislice::compute::gpt {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
void EncoderForward(float* out, const std::int32_t* tokens, const float* wte,
                    const float* wpe, int B, int T, int C);
// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:].
void EncoderBackward(float* dwte, float* dwpe, const float* dout,
                     const std::int32_t* tokens, int B, int T, int C);

// Per row of C values: mean = sum(x)/C, rstd = 1/sqrt(var + 1e-5) with the
// biased variance, out = (x - mean) * rstd * weight + bias. mean and rstd
// (N each) are saved for the backward.
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                      const float* weight, const float* bias, std::int64_t N,
                      int C);
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

// y = x rounded to bf16 (nearest even, NaN kept a NaN), the operands of the
// bf16 matmuls. With AVX512-BF16 (one instruction per 32 values) f32
// subnormals (|x| < 2^-126) round to zero; otherwise as compute::Convert.
void ToBf16(const float* x, std::uint16_t* y, std::int64_t n);

// Causal multi-head self-attention. qkv[b,t,:] holds q (channels [0,C)),
// k ([C,2C)) and v ([2C,3C)); head h uses channels [h*hs, (h+1)*hs) of each,
// hs = C/NH (C must be divisible by NH). For query t and key t2 <= t:
// s = q.k / sqrt(hs), att[b,h,t,t2] = softmax of s over t2 <= t,
// out[b,t,h*hs+i] = sum_t2 att[b,h,t,t2] * v[b,t2,h*hs+i].
// Entries with t2 > t of att are written as zero.
//
// Per (b, h) this is two matmuls, S = Q K^T / sqrt(hs) into att (then the
// causal softmax in place) and O = P V into the head's columns of out, with
// Q, K, V read in place from qkv. matmul_type kF32 keeps them exact f32;
// kBF16 rounds their operands (Q, K, V and P) to bf16, accumulating in f32.
// `scratch` holds AttentionScratchSize(B, T, C, matmul_type) floats. With
// kBF16, qkv16 may give ToBf16(qkv) (e.g. kept from the forward for the
// backward); otherwise qkv is rounded into scratch.
// kInternal if a matmul fails.
std::int64_t AttentionScratchSize(int B, int T, int C, DType matmul_type);
Status AttentionForward(float* out, float* att, float* scratch,
                        const float* qkv, int B, int T, int C, int NH,
                        DType matmul_type = DType::kF32,
                        const std::uint16_t* qkv16 = nullptr);
// Accumulates into dqkv [B,T,3C] from dout [B,T,C]; att [B,NH,T,T] is the
// forward's saved softmax. Per (b, h): dP = dO V^T, dV += P^T dO,
// dS = P * (dP - rowsum(dP * P)), dQ += dS K / sqrt(hs),
// dK += dS^T Q / sqrt(hs). Same scratch and matmul_type as the forward.
Status AttentionBackward(float* dqkv, float* scratch, const float* dout,
                         const float* qkv, const float* att, int B, int T,
                         int C, int NH, DType matmul_type = DType::kF32,
                         const std::uint16_t* qkv16 = nullptr);

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

}  // namespace multislice::compute::gpt

#endif  // MULTISLICE_COMPUTE_GPT_OPS_H_
