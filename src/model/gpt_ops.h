// GPT-2 layer operations for one device, in f32, forward and backward.
//
// Plain functions on caller-owned, row-major float arrays, in the manner of
// llm.c: B = batch, T = sequence length, C = channels, NH = attention heads,
// V = vocabulary size, N = B * T rows. The matrix multiplications live
// elsewhere (oneDNN); these are the remaining element-wise, normalisation,
// attention and loss kernels of a GPT-2 block.
//
// Contracts shared by every function:
//  * Pointers are non-null and address at least the stated number of
//    elements; outputs do not alias inputs unless a function says so.
//  * Every backward ACCUMULATES (+=) into its gradient outputs, so the caller
//    zeroes gradients once per step. Scratch gradients (AttentionBackward's
//    dpreatt and datt) must be zero on entry.
//  * Token ids and targets lie in [0, V); positions use the first T rows of
//    wpe.
//  * Functions are reentrant and keep no state; no threads are started.
#ifndef MULTISLICE_MODEL_GPT_OPS_H_
#define MULTISLICE_MODEL_GPT_OPS_H_

#include <cstdint>

namespace multislice::model::gpt {

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
// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void GeluForward(float* out, const float* inp, std::int64_t n);
// dinp += dout * d(out)/dx of the formula above.
void GeluBackward(float* dinp, const float* inp, const float* dout,
                  std::int64_t n);

// Causal multi-head self-attention. qkv[b,t,:] holds q (channels [0,C)),
// k ([C,2C)) and v ([2C,3C)); head h uses channels [h*hs, (h+1)*hs) of each,
// hs = C/NH (C must be divisible by NH). For query t and key t2 <= t:
// preatt[b,h,t,t2] = q.k / sqrt(hs), att = softmax over t2 <= t,
// out[b,t,h*hs+i] = sum_t2 att[b,h,t,t2] * v[b,t2,h*hs+i].
// Entries with t2 > t of preatt and att are written as zero.
void AttentionForward(float* out, float* preatt, float* att, const float* qkv,
                      int B, int T, int C, int NH);
// Accumulates into dqkv [B,T,3C]; dpreatt and datt [B,NH,T,T] are scratch
// that must be zero on entry. att is the forward's saved softmax.
void AttentionBackward(float* dqkv, float* dpreatt, float* datt,
                       const float* dout, const float* qkv, const float* att,
                       int B, int T, int C, int NH);

// out = a + b (out may alias a or b).
void ResidualForward(float* out, const float* a, const float* b,
                     std::int64_t n);
// da += dout; db += dout.
void ResidualBackward(float* da, float* db, const float* dout, std::int64_t n);

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

}  // namespace multislice::model::gpt

#endif  // MULTISLICE_MODEL_GPT_OPS_H_
