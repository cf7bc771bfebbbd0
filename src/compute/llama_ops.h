// The kernels of the Llama family's blocks (Llama 2, Mistral, Gemma) for one
// device, in f32, forward and backward: RMSNorm, rotary position embeddings
// (RoPE) and the gated MLP's activation (SwiGLU, GeGLU). Attention is
// attention.h and the matmuls are matmul.h. Plain functions on
// caller-owned, row-major float arrays (N rows), explicit 16-lane vector
// loops compiled for AVX-512, AVX2 and the baseline (common/cpu_isa.h),
// deterministic for a given ISA level.
//
// Contracts: pointers are non-null and address the stated sizes; outputs do
// not alias inputs unless a function says so; a backward named Accumulate
// adds (+=) into its gradients, the others write (=). Reentrant, no state.
#pragma once

#include <cstdint>

namespace multislice::compute::llama {

// Per row of C values: rstd = 1 / sqrt(mean(x^2) + eps),
// out = x * rstd * weight. rstd (N values) is saved for the backward.
void RmsNormForward(float* out, float* rstd, const float* inp,
                    const float* weight, std::int64_t N, int C, float eps);
// With xhat = x * rstd and g = dout * weight:
// dweight += dout * xhat, dinp += rstd * (g - xhat * avg(g * xhat)).
void RmsNormBackwardAccumulate(float* dinp, float* dweight, const float* dout,
                               const float* inp, const float* weight,
                               const float* rstd, std::int64_t N, int C);

// The rotation table of rotary embeddings for positions [0, T) and head_dim
// D (even): for position t and pair i < D/2, angle = t / timescale_i with
// timescale_i = max_timescale^(2i / D) (MaxText's and Llama's), computed in
// double; cos and sin are [T, D/2] each.
void RopeTable(float* cos, float* sin, int T, int D, double max_timescale);

// Rotates, in place, `heads` consecutive heads of D channels in each of the
// B T rows of x (row stride `stride` floats; row b T + t at position t):
// within a head, channel i and i + D/2 (i < D/2) are the pair
// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) (the "rotate half"
// convention of MaxText and Hugging Face). inverse rotates by -angle: the
// backward, applied to the gradient.
void Rope(float* x, std::int64_t stride, int B, int T, int heads, int D,
          const float* cos, const float* sin, bool inverse = false);

// The gated MLP's middle: gate_up [N, 2H] holds per row the gate's H
// values, then the up projection's H; h [N, H] = act(gate) * up, written to
// h (when non-null) and its bf16 rounding to h16 (when non-null). act is
// SiLU, x sigmoid(x), or GELU (GPT-2's tanh approximation).
enum class GateActivation { kSilu, kGelu };
void GatedForward(GateActivation act, const float* gate_up, float* h,
                  std::uint16_t* h16, std::int64_t N, int H);
// dgate_up (= ) from dh [N, H]: dgate = dh * up * act'(gate),
// dup = dh * act(gate).
void GatedBackward(GateActivation act, float* dgate_up, const float* dh,
                   const float* gate_up, std::int64_t N, int H);

// out[i,:] = wte[tokens[i],:] (an embedding without positions).
void EmbedForward(float* out, const std::int32_t* tokens, const float* wte,
                  std::int64_t N, int C);
// dwte[tokens[i],:] += dout[i,:].
void EmbedBackwardAccumulate(float* dwte, const float* dout,
                             const std::int32_t* tokens, std::int64_t N, int C);

}  // namespace multislice::compute::llama
