// Causal attention of attention.h: per (batch row, query head) the score,
// softmax and value matmuls through compute::Gemm, with Q, K and V read in
// place from qkv by their strides, and the causal softmax and its backward
// as 16-lane row kernels (kernel_math.h) compiled for every ISA level.
//
//   S = Q K^T / sqrt(hd),  P = causal row softmax of S,  O = P V
//   dP = dO V^T,  dV += P^T dO,  dS = P (dP - rowsum(dP P)),
//   dQ += dS K / sqrt(hd),  dK += dS^T Q / sqrt(hd)
//
// Grouped query heads change only where a head's K and V columns start: a
// key/value head's gradients accumulate (beta 1) over the query heads that
// read it, in head order, so the result is deterministic.
#include "compute/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/isa_dispatch.h"
#include "compute/cpu/kernel_math.h"
#include "compute/elementwise.h"
#include "compute/matmul.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace multislice::compute {
namespace {

using namespace compute::kernels;  // NOLINT: the kernels' vocabulary

// The causal softmax of a T x T score matrix (row stride T), in place: row t
// over columns [0, t], the rest zeroed; and its bf16 copy into s16 when
// non-null, row by row while the row is in L1.
struct CausalSoftmaxKernel {
  MS_KERNEL void operator()(auto tag, float* s, int T,
                            std::uint16_t* s16) const {
    float mx;
    for (int t = 0; t < T; ++t) {
      const std::int64_t row = static_cast<std::int64_t>(t) * T;
      SoftmaxRow(tag, s + row, s + row, t + 1, T, &mx);
      if (s16 != nullptr) RowToBf16(tag, s16 + row, s + row, T);
    }
  }
};

// dP (T x T, in place) -> dS = P * (dP - rowsum(dP * P)) over the causal
// part; entries above the diagonal (where P = 0) become 0. With ds16, also
// its bf16 copy.
struct CausalSoftmaxBackwardKernel {
  MS_KERNEL void operator()(auto tag, float* dp, const float* p, int T,
                            std::uint16_t* ds16) const {
    for (int t = 0; t < T; ++t) {
      float* d = dp + static_cast<std::int64_t>(t) * T;
      const float* a = p + static_cast<std::int64_t>(t) * T;
      const int n = t + 1;
      vec::Carry16<decltype(tag)> acc;
      int i = 0;
      for (; i + kLanes <= n; i += kLanes) acc += Load(d + i) * Load(a + i);
      const int rest = n - i;
      if (rest) acc += LoadPart(d + i, rest) * LoadPart(a + i, rest);
      const float dot = HSum(acc.Get());
      for (i = 0; i + kLanes <= n; i += kLanes) {
        Store(d + i, Load(a + i) * (Load(d + i) - dot));
      }
      if (rest) {
        StorePart(d + i, LoadPart(a + i, rest) * (LoadPart(d + i, rest) - dot),
                  rest);
      }
      if (T > n)
        std::memset(d + n, 0, static_cast<size_t>(T - n) * sizeof(float));
      if (ds16 != nullptr) {
        RowToBf16(tag, ds16 + static_cast<std::int64_t>(t) * T, d, T);
      }
    }
  }
};

// Operands of the per-head matmuls: f32 arrays, or their bf16 copies.
struct HeadOperands {
  DType type;
  const void* qkv;   // [N, W]
  const void* dout;  // [N, heads hd] (backward only)
  void* p16;         // T*T bf16 (bf16 only)
  void* ds16;        // T*T bf16 (bf16 only)
  std::size_t elem;  // bytes per element of qkv / dout
};

const void* Offset(const void* base, std::int64_t elements, std::size_t elem) {
  return static_cast<const unsigned char*>(base) + elements * elem;
}

GemmDesc Desc(DType type, std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmDesc d;
  d.m = m;
  d.n = n;
  d.k = k;
  d.ab_type = type;
  d.c_type = DType::kF32;
  return d;
}

HeadOperands Operands(float* scratch, const float* qkv,
                      const std::uint16_t* given_qkv16, const float* dout,
                      const AttentionShape& s, DType type) {
  HeadOperands ops{type, qkv, dout, nullptr, nullptr, sizeof(float)};
  if (type == DType::kF32) return ops;
  const std::int64_t N = static_cast<std::int64_t>(s.B) * s.T;
  const std::int64_t TT = static_cast<std::int64_t>(s.T) * s.T;
  std::uint16_t* qkv16 = reinterpret_cast<std::uint16_t*>(scratch + TT);
  std::uint16_t* dout16 = qkv16 + N * s.qkv_width();
  ops.p16 = dout16 + N * s.out_width();
  ops.ds16 = static_cast<std::uint16_t*>(ops.p16) + TT;
  if (given_qkv16 != nullptr) {
    ops.qkv = given_qkv16;
  } else {
    ToBf16(qkv, qkv16, N * s.qkv_width());
    ops.qkv = qkv16;
  }
  if (dout != nullptr) {
    ToBf16(dout, dout16, N * s.out_width());
    ops.dout = dout16;
  }
  ops.elem = 2;
  return ops;
}

// Where query head h of batch row b reads and writes: element offsets of its
// first q, k and v values in qkv and of its output columns in out.
struct HeadColumns {
  std::int64_t q, k, v, o;
};

HeadColumns ColumnsOf(const AttentionShape& s, int b, int h) {
  const std::int64_t row0 = static_cast<std::int64_t>(b) * s.T;
  const std::int64_t hd = s.head_dim;
  const int g = h / (s.heads / s.kv_heads);
  HeadColumns c;
  c.q = row0 * s.qkv_width() + h * hd;
  c.k = row0 * s.qkv_width() + (s.heads + g) * hd;
  c.v = row0 * s.qkv_width() + (s.heads + s.kv_heads + g) * hd;
  c.o = row0 * s.out_width() + h * hd;
  return c;
}

// The causal structure in the per-head matmuls: queries in blocks of
// kCausalBlock rows, each against only the keys at or before its last row
// (block [r0, r1) against keys [0, r1)), and in the backward keys in blocks
// against only the queries at or after them. With T = 128 that is 3/4 of the
// full T x T products (the rest is masked to zero anyway) in twice as many
// calls; smaller blocks save more products but pay more per call.
constexpr int kCausalBlock = 64;

}  // namespace

std::int64_t AttentionScratchSize(const AttentionShape& s, DType matmul_type) {
  const std::int64_t TT = static_cast<std::int64_t>(s.T) * s.T;
  if (matmul_type == DType::kF32) return TT;
  const std::int64_t N = static_cast<std::int64_t>(s.B) * s.T;
  // dP in f32, then bf16 qkv [N,W], dout [N,heads hd], P and dS [T,T]: two
  // bf16 per float.
  return TT + (N * (s.qkv_width() + s.out_width()) + 2 * TT + 1) / 2;
}

Status AttentionForward(float* out, float* att, float* scratch,
                        const float* qkv, const AttentionShape& s,
                        DType matmul_type, const std::uint16_t* qkv16) {
  const int T = s.T, hd = s.head_dim;
  const std::int64_t TT = static_cast<std::int64_t>(T) * T;
  const std::int64_t W = s.qkv_width();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const HeadOperands ops =
      Operands(scratch, qkv, qkv16, nullptr, s, matmul_type);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.heads; ++h) {
      const HeadColumns c = ColumnsOf(s, b, h);
      float* p = att + (static_cast<std::int64_t>(b) * s.heads + h) * TT;
      for (int r0 = 0; r0 < T; r0 += kCausalBlock) {
        const int r1 = std::min(T, r0 + kCausalBlock);
        // S[r0:r1, 0:r1] = scale Q[r0:r1] K[0:r1]^T (K stored [n, k]).
        GemmDesc s_desc = Desc(matmul_type, r1 - r0, r1, hd);
        s_desc.transpose_b = true;
        s_desc.lda = s_desc.ldb = W;
        s_desc.ldc = T;
        s_desc.alpha = scale;
        RETURN_IF_ERROR(Gemm(s_desc, Offset(ops.qkv, c.q + r0 * W, ops.elem),
                             Offset(ops.qkv, c.k, ops.elem),
                             p + static_cast<std::int64_t>(r0) * T));
      }
      std::uint16_t* p16 = static_cast<std::uint16_t*>(ops.p16);
      isa::Dispatch<CausalSoftmaxKernel>(p, T, p16);
      const void* pa = p16 != nullptr ? static_cast<const void*>(p16) : p;
      for (int r0 = 0; r0 < T; r0 += kCausalBlock) {
        const int r1 = std::min(T, r0 + kCausalBlock);
        // O[r0:r1] = P[r0:r1, 0:r1] V[0:r1], into the head's columns of out.
        GemmDesc o_desc = Desc(matmul_type, r1 - r0, hd, r1);
        o_desc.lda = T;
        o_desc.ldb = W;
        o_desc.ldc = s.out_width();
        RETURN_IF_ERROR(Gemm(
            o_desc, Offset(pa, static_cast<std::int64_t>(r0) * T, ops.elem),
            Offset(ops.qkv, c.v, ops.elem), out + c.o + r0 * s.out_width()));
      }
    }
  }
  return OkStatus();
}

Status AttentionBackward(float* dqkv, float* scratch, const float* dout,
                         const float* qkv, const float* att,
                         const AttentionShape& s, DType matmul_type,
                         const std::uint16_t* qkv16) {
  const int T = s.T, hd = s.head_dim;
  const std::int64_t TT = static_cast<std::int64_t>(T) * T;
  const std::int64_t W = s.qkv_width(), O = s.out_width();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const HeadOperands ops = Operands(scratch, qkv, qkv16, dout, s, matmul_type);
  float* dp = scratch;  // T x T
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.heads; ++h) {
      const HeadColumns c = ColumnsOf(s, b, h);
      const float* p = att + (static_cast<std::int64_t>(b) * s.heads + h) * TT;
      float* dq = dqkv + c.q;
      float* dk = dqkv + c.k;
      float* dv = dqkv + c.v;
      for (int r0 = 0; r0 < T; r0 += kCausalBlock) {
        const int r1 = std::min(T, r0 + kCausalBlock);
        // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T (V stored [n, k]).
        GemmDesc dp_desc = Desc(matmul_type, r1 - r0, r1, hd);
        dp_desc.transpose_b = true;
        dp_desc.lda = O;
        dp_desc.ldb = W;
        dp_desc.ldc = T;
        RETURN_IF_ERROR(Gemm(dp_desc, Offset(ops.dout, c.o + r0 * O, ops.elem),
                             Offset(ops.qkv, c.v, ops.elem),
                             dp + static_cast<std::int64_t>(r0) * T));
      }
      const void* pa = p;
      if (matmul_type != DType::kF32) {
        ToBf16(p, static_cast<std::uint16_t*>(ops.p16), TT);
        pa = ops.p16;
      }
      for (int c0 = 0; c0 < T; c0 += kCausalBlock) {
        const int c1 = std::min(T, c0 + kCausalBlock);
        // dV[c0:c1] += P[c0:T, c0:c1]^T dO[c0:T] (P stored [k, m]).
        GemmDesc dv_desc = Desc(matmul_type, c1 - c0, hd, T - c0);
        dv_desc.transpose_a = true;
        dv_desc.lda = T;
        dv_desc.ldb = O;
        dv_desc.ldc = W;
        dv_desc.beta = 1.0f;
        RETURN_IF_ERROR(
            Gemm(dv_desc,
                 Offset(pa, static_cast<std::int64_t>(c0) * T + c0, ops.elem),
                 Offset(ops.dout, c.o + c0 * O, ops.elem), dv + c0 * W));
      }
      std::uint16_t* ds16 = static_cast<std::uint16_t*>(ops.ds16);
      isa::Dispatch<CausalSoftmaxBackwardKernel>(dp, p, T, ds16);
      const void* ds = ds16 != nullptr ? static_cast<const void*>(ds16) : dp;
      for (int r0 = 0; r0 < T; r0 += kCausalBlock) {
        const int r1 = std::min(T, r0 + kCausalBlock);
        // dQ[r0:r1] += scale dS[r0:r1, 0:r1] K[0:r1].
        GemmDesc dq_desc = Desc(matmul_type, r1 - r0, hd, r1);
        dq_desc.lda = T;
        dq_desc.ldb = W;
        dq_desc.ldc = W;
        dq_desc.alpha = scale;
        dq_desc.beta = 1.0f;
        RETURN_IF_ERROR(Gemm(
            dq_desc, Offset(ds, static_cast<std::int64_t>(r0) * T, ops.elem),
            Offset(ops.qkv, c.k, ops.elem), dq + r0 * W));
        // dK[c0:c1] += scale dS[c0:T, c0:c1]^T Q[c0:T] (c = the same block).
        const int c0 = r0, c1 = r1;
        GemmDesc dk_desc = Desc(matmul_type, c1 - c0, hd, T - c0);
        dk_desc.transpose_a = true;
        dk_desc.lda = T;
        dk_desc.ldb = W;
        dk_desc.ldc = W;
        dk_desc.alpha = scale;
        dk_desc.beta = 1.0f;
        RETURN_IF_ERROR(
            Gemm(dk_desc,
                 Offset(ds, static_cast<std::int64_t>(c0) * T + c0, ops.elem),
                 Offset(ops.qkv, c.q + c0 * W, ops.elem), dk + c0 * W));
      }
    }
  }
  return OkStatus();
}

}  // namespace multislice::compute
