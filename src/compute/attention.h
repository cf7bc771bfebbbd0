// Causal self-attention for one device, forward and backward, with grouped
// query heads (GQA): every decoder block of model/ runs its attention here.
//
// The projections' output qkv [B,T,W] holds, per row, the queries of every
// head, then the keys and the values of every key/value head:
//   q  columns [h hd, (h+1) hd)                     for h in [0, heads)
//   k  columns [heads hd + g hd, ...)               for g in [0, kv_heads)
//   v  columns [(heads + kv_heads) hd + g hd, ...)
// W = (heads + 2 kv_heads) hd; query head h reads key/value head
// g = h / (heads / kv_heads) (kv_heads divides heads; kv_heads == heads is
// plain multi-head attention, GPT-2's qkv with hd = C / heads). For query t
// and key t2 <= t: s = q.k / sqrt(hd), att[b,h,t,t2] = softmax of s over
// t2 <= t, out[b,t,h hd + i] = sum_t2 att[b,h,t,t2] v[b,t2,g hd + i];
// out is [B,T,heads hd]. Entries with t2 > t of att are written as zero.
//
// Per (b, h) this is two matmuls, S = Q K^T / sqrt(hd) into att (then the
// causal softmax in place) and O = P V into the head's columns of out, with
// Q, K, V read in place from qkv through compute::Gemm on the calling
// thread. matmul_type kF32 keeps them exact f32; kBF16 rounds their operands
// (Q, K, V and P) to bf16, accumulating in f32. `scratch` holds
// AttentionScratchSize(shape, matmul_type) floats. With kBF16, qkv16 may
// give ToBf16(qkv) (e.g. kept from the forward for the backward); otherwise
// qkv is rounded into scratch.
//
// Not thread-safe per scratch buffer; reentrant otherwise.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"

namespace multislice::compute {

struct AttentionShape {
  int B = 1, T = 1;  // batch rows and sequence length
  int heads = 1;     // query heads
  int kv_heads = 1;  // key/value heads; divides heads
  int head_dim = 1;  // hd
  // Row widths of qkv and of out.
  std::int64_t qkv_width() const {
    return static_cast<std::int64_t>(heads + 2 * kv_heads) * head_dim;
  }
  std::int64_t out_width() const {
    return static_cast<std::int64_t>(heads) * head_dim;
  }
};

std::int64_t AttentionScratchSize(const AttentionShape& shape,
                                  DType matmul_type);

// att holds B heads T T floats. kInternal if a matmul fails.
Status AttentionForward(float* out, float* att, float* scratch,
                        const float* qkv, const AttentionShape& shape,
                        DType matmul_type = DType::kF32,
                        const std::uint16_t* qkv16 = nullptr);

// Accumulates into dqkv [B,T,W] from dout [B,T,heads hd]; att is the
// forward's saved softmax. Per (b, h): dP = dO V^T, dV += P^T dO,
// dS = P * (dP - rowsum(dP * P)), dQ += dS K / sqrt(hd),
// dK += dS^T Q / sqrt(hd) (a key/value head sums the gradients of every
// query head that reads it). Same scratch and matmul_type as the forward.
Status AttentionBackward(float* dqkv, float* scratch, const float* dout,
                         const float* qkv, const float* att,
                         const AttentionShape& shape,
                         DType matmul_type = DType::kF32,
                         const std::uint16_t* qkv16 = nullptr);

}  // namespace multislice::compute
