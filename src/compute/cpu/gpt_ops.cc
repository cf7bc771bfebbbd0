// The GPT-2 layer kernels of gpt_ops.h. Formulas:
//
//   encoder     out[b,t] = wte[tok[b,t]] + wpe[t]
//   layernorm   y = (x - mu) * rstd * w + beta,  rstd = 1/sqrt(var + 1e-5)
//               dx = rstd * (g - avg(g) - xhat * avg(g * xhat)),  g = dy * w
//   gelu        y = x/2 (1 + tanh(u)) = x sigmoid(2u),
//               u = sqrt(2/pi) (x + 0.044715 x^3)
//               dy/dx = s + x s (1 - s) 2 du/dx,  s = sigmoid(2u)
//   attention   S = Q K^T / sqrt(hs),  P = causal row softmax of S,  O = P V
//               dP = dO V^T,  dV = P^T dO,  dS = P (dP - rowsum(dP P)),
//               dQ = dS K / sqrt(hs),  dK = dS^T Q / sqrt(hs)
//   residual    y = a + b,  da = db = dy
//   x-entropy   p = softmax(z),  L = -log p[target],
//               dz = dL (p - onehot(target))
//
// The element-wise and row kernels are written on GCC vector types of 16 f32
// lanes and compiled three times (AVX-512, AVX2, baseline) by
// isa::Dispatch, as elementwise.cc is; a row's last < 16 elements go
// through the same vector code, zero-padded and masked. Reductions keep 16
// partial sums and add them in a fixed order, so results are deterministic.
// exp is compute/elementwise.cc's: Cody-Waite range reduction and a degree-7
// polynomial, within about 1 ulp of f32.
#include "compute/gpt_ops.h"

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/isa_dispatch.h"
#include "compute/cpu/vec16.h"
#include "compute/elementwise.h"
#include "compute/matmul.h"

// The vector types below are passed between inline functions of this file
// only, never across an ABI boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace multislice::compute::gpt {
namespace {

constexpr float kLayerNormEps = 1e-5f;
// sqrt(2 / pi), the scale inside GPT-2's tanh-approximate GELU.
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

constexpr int kLanes = 16;
using compute::vec::F16;
using compute::vec::H16;
using compute::vec::I16;
using compute::vec::Splat;
using compute::vec::U16;

#define MS_INLINE [[gnu::always_inline]] inline

MS_INLINE F16 Load(const float* p) {
  F16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
MS_INLINE void Store(float* p, const F16& v) { std::memcpy(p, &v, sizeof(v)); }
// The first n (< 16) elements of p, the other lanes zero.
MS_INLINE F16 LoadPart(const float* p, int n) {
  F16 v = {};
  std::memcpy(&v, p, static_cast<size_t>(n) * sizeof(float));
  return v;
}
MS_INLINE void StorePart(float* p, const F16& v, int n) {
  std::memcpy(p, &v, static_cast<size_t>(n) * sizeof(float));
}
// The first n (<= 16) lanes rounded to bf16 (nearest even, NaN kept a quiet
// NaN: exactly compute::Convert).
MS_INLINE void StoreBf16(std::uint16_t* p, const F16& v, int n) {
  const U16 u = reinterpret_cast<U16>(v);
  const U16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U16 nan = (u >> 16) | 0x40u;
  const H16 h = __builtin_convertvector(
      (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded, H16);
  std::memcpy(p, &h, static_cast<size_t>(n) * sizeof(std::uint16_t));
}
// Lanes [0, n) true.
MS_INLINE I16 LaneMask(int n) {
  const I16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return iota < n;
}
MS_INLINE float HSum(const F16& v) {
  // Pairwise, in a fixed order.
  float s[8];
  for (int i = 0; i < 8; ++i) s[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) s[i] += s[i + 4];
  return (s[0] + s[2]) + (s[1] + s[3]);
}
MS_INLINE float HMax(const F16& v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
MS_INLINE F16 Max(const F16& a, const F16& b) { return a > b ? a : b; }

// exp(a) for a <= 0; below -104 the result underflows to 0 anyway, so a is
// clamped there (-inf gives 0).
MS_INLINE F16 ExpNonPositive(F16 a) {
  a = a > -104.0f ? a : Splat(-104.0f);
  return compute::vec::ExpNonPositive(a);
}

// s = sigmoid(z) and 1 - s, each without cancellation.
MS_INLINE void Sigmoid(const F16& z, F16& s, F16& one_minus_s) {
  F16 az = reinterpret_cast<F16>(reinterpret_cast<U16>(z) & 0x7fffffffu);
  az = az < 104.0f ? az : Splat(104.0f);  // also maps NaN to 104
  const F16 t = ExpNonPositive(-az);      // exp(-|z|) in (0, 1]
  const F16 inv = 1.0f / (1.0f + t);
  const auto positive = z >= 0.0f;
  s = (positive ? Splat(1.0f) : t) * inv;
  one_minus_s = (positive ? t : Splat(1.0f)) * inv;
}

// ---- element-wise kernels -------------------------------------------------

struct GeluFwd {
  MS_INLINE F16 operator()(const F16& x) const {
    const F16 z = (2.0f * kGeluScale) * (x + kGeluCubic * x * x * x);
    F16 s, oms;
    Sigmoid(z, s, oms);
    return x * s;
  }
};

struct GeluForwardKernel {
  MS_KERNEL void operator()(auto, float* out, const float* inp,
                            std::int64_t n) const {
    std::int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      Store(out + i, GeluFwd{}(Load(inp + i)));
    if (i < n) {
      const int rest = static_cast<int>(n - i);
      StorePart(out + i, GeluFwd{}(LoadPart(inp + i, rest)), rest);
    }
  }
};

MS_INLINE F16 GeluGrad(const F16& x) {
  const F16 z = (2.0f * kGeluScale) * (x + kGeluCubic * x * x * x);
  F16 s, oms;
  Sigmoid(z, s, oms);
  const F16 dz_dx = (2.0f * kGeluScale) * (1.0f + (3.0f * kGeluCubic) * x * x);
  const F16 tail = (x * s) * (oms * dz_dx);
  // Where the sigmoid saturates (|z| >= 104, so |x| > 13) the second term is
  // below 1e-40 of the first; dropping it there keeps huge x finite (x * 0
  // still propagates a NaN x).
  const F16 az = reinterpret_cast<F16>(reinterpret_cast<U16>(z) & 0x7fffffffu);
  return s + (az < 104.0f ? tail : x * 0.0f);
}

struct GeluBackwardKernel {
  MS_KERNEL void operator()(auto, float* dinp, const float* inp,
                            const float* dout, std::int64_t n) const {
    std::int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      Store(dinp + i,
            Load(dinp + i) + GeluGrad(Load(inp + i)) * Load(dout + i));
    }
    if (i < n) {
      const int rest = static_cast<int>(n - i);
      const F16 g =
          GeluGrad(LoadPart(inp + i, rest)) * LoadPart(dout + i, rest);
      StorePart(dinp + i, LoadPart(dinp + i, rest) + g, rest);
    }
  }
};

struct GeluForwardBf16Kernel {
  MS_KERNEL void operator()(auto, float* out, std::uint16_t* out16,
                            const float* inp, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; i += kLanes) {
      const int rest = n - i < kLanes ? static_cast<int>(n - i) : kLanes;
      const F16 x = rest == kLanes ? Load(inp + i) : LoadPart(inp + i, rest);
      const F16 y = GeluFwd{}(x);
      if (out != nullptr) StorePart(out + i, y, rest);
      StoreBf16(out16 + i, y, rest);
    }
  }
};

struct GeluBackwardBf16Kernel {
  MS_KERNEL void operator()(auto, float* dinp, std::uint16_t* dinp16,
                            const float* inp, const float* dout,
                            std::int64_t n) const {
    for (std::int64_t i = 0; i < n; i += kLanes) {
      const int rest = n - i < kLanes ? static_cast<int>(n - i) : kLanes;
      const bool full = rest == kLanes;
      const F16 x = full ? Load(inp + i) : LoadPart(inp + i, rest);
      const F16 dy = full ? Load(dout + i) : LoadPart(dout + i, rest);
      const F16 g = GeluGrad(x) * dy;
      StorePart(dinp + i, g, rest);
      if (dinp16 != nullptr) StoreBf16(dinp16 + i, g, rest);
    }
  }
};

// y[i] = f(y[i], x[i]) over n elements.
template <typename F>
MS_INLINE void Update(float* y, const float* x, std::int64_t n, F f) {
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Store(y + i, f(Load(y + i), Load(x + i)));
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    StorePart(y + i, f(LoadPart(y + i, rest), LoadPart(x + i, rest)), rest);
  }
}

// out = a + b over n elements (out may alias a or b).
MS_INLINE void Add(float* out, const float* a, const float* b, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    Store(out + i, Load(a + i) + Load(b + i));
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    StorePart(out + i, LoadPart(a + i, rest) + LoadPart(b + i, rest), rest);
  }
}

const auto kAccumulate = [](const F16& y, const F16& x) { return y + x; };

struct ResidualForwardKernel {
  MS_KERNEL void operator()(auto, float* out, const float* a, const float* b,
                            std::int64_t n) const {
    Add(out, a, b, n);
  }
};

struct ResidualBackwardKernel {
  MS_KERNEL void operator()(auto, float* da, float* db, const float* dout,
                            std::int64_t n) const {
    Update(da, dout, n, kAccumulate);
    Update(db, dout, n, kAccumulate);
  }
};

struct BiasForwardKernel {
  MS_KERNEL void operator()(auto, float* out, const float* bias, std::int64_t N,
                            int OC) const {
    for (std::int64_t r = 0; r < N; ++r)
      Update(out + r * OC, bias, OC, kAccumulate);
  }
};

struct BiasBackwardKernel {
  MS_KERNEL void operator()(auto, float* dbias, const float* dout,
                            std::int64_t N, int OC) const {
    for (std::int64_t r = 0; r < N; ++r)
      Update(dbias, dout + r * OC, OC, kAccumulate);
  }
};

struct EncoderForwardKernel {
  MS_KERNEL void operator()(auto, float* out, const std::int32_t* tokens,
                            const float* wte, const float* wpe, int B, int T,
                            int C) const {
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const std::int64_t row = static_cast<std::int64_t>(b) * T + t;
        Add(out + row * C, wte + static_cast<std::int64_t>(tokens[row]) * C,
            wpe + static_cast<std::int64_t>(t) * C, C);
      }
    }
  }
};

struct EncoderBackwardKernel {
  MS_KERNEL void operator()(auto, float* dwte, float* dwpe, const float* dout,
                            const std::int32_t* tokens, int B, int T,
                            int C) const {
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const std::int64_t row = static_cast<std::int64_t>(b) * T + t;
        const float* dout_row = dout + row * C;
        Update(dwte + static_cast<std::int64_t>(tokens[row]) * C, dout_row, C,
               kAccumulate);
        Update(dwpe + static_cast<std::int64_t>(t) * C, dout_row, C,
               kAccumulate);
      }
    }
  }
};

// ---- layernorm -------------------------------------------------------------

struct LayerNormForwardKernel {
  MS_KERNEL void operator()(auto, float* out, float* mean, float* rstd,
                            const float* inp, const float* weight,
                            const float* bias, std::int64_t N, int C) const {
    const int full = C / kLanes * kLanes;
    const int rest = C - full;
    const I16 tail = LaneMask(rest);
    for (std::int64_t r = 0; r < N; ++r) {
      const float* x = inp + r * C;
      float* y = out + r * C;
      F16 acc = {};
      for (int i = 0; i < full; i += kLanes) acc += Load(x + i);
      if (rest) acc += LoadPart(x + full, rest);
      const float mu = HSum(acc) / static_cast<float>(C);
      acc = F16{};
      for (int i = 0; i < full; i += kLanes) {
        const F16 d = Load(x + i) - mu;
        acc += d * d;
      }
      if (rest) {
        const F16 d = tail ? LoadPart(x + full, rest) - mu : F16{};
        acc += d * d;
      }
      const float s =
          1.0f / std::sqrt(HSum(acc) / static_cast<float>(C) + kLayerNormEps);
      for (int i = 0; i < full; i += kLanes) {
        Store(y + i,
              (Load(x + i) - mu) * s * Load(weight + i) + Load(bias + i));
      }
      if (rest) {
        StorePart(y + full,
                  (LoadPart(x + full, rest) - mu) * s *
                          LoadPart(weight + full, rest) +
                      LoadPart(bias + full, rest),
                  rest);
      }
      mean[r] = mu;
      rstd[r] = s;
    }
  }
};

struct LayerNormBackwardKernel {
  MS_KERNEL void operator()(auto, float* dinp, float* dweight, float* dbias,
                            const float* dout, const float* inp,
                            const float* weight, const float* mean,
                            const float* rstd, std::int64_t N, int C) const {
    for (std::int64_t r = 0; r < N; ++r) {
      const float* x = inp + r * C;
      const float* dy = dout + r * C;
      float* dx = dinp + r * C;
      const float mu = mean[r];
      const float s = rstd[r];
      // Two row averages that the input gradient needs. Padding lanes have
      // dy = 0, so g = 0 there.
      F16 g_acc = {}, gx_acc = {};
      int i = 0;
      for (; i < C; i += kLanes) {
        const int n = C - i < kLanes ? C - i : kLanes;
        const bool part = n < kLanes;
        const F16 xv = part ? LoadPart(x + i, n) : Load(x + i);
        const F16 dyv = part ? LoadPart(dy + i, n) : Load(dy + i);
        const F16 wv = part ? LoadPart(weight + i, n) : Load(weight + i);
        const F16 xhat = (xv - mu) * s;
        const F16 g = dyv * wv;
        g_acc += g;
        gx_acc += g * xhat;
      }
      const float g_avg = HSum(g_acc) / static_cast<float>(C);
      const float g_xhat_avg = HSum(gx_acc) / static_cast<float>(C);
      for (i = 0; i < C; i += kLanes) {
        const int n = C - i < kLanes ? C - i : kLanes;
        if (n == kLanes) {
          const F16 xhat = (Load(x + i) - mu) * s;
          const F16 dyv = Load(dy + i);
          const F16 g = dyv * Load(weight + i);
          Store(dbias + i, Load(dbias + i) + dyv);
          Store(dweight + i, Load(dweight + i) + dyv * xhat);
          Store(dx + i, Load(dx + i) + s * (g - g_avg - xhat * g_xhat_avg));
        } else {
          const F16 xhat = (LoadPart(x + i, n) - mu) * s;
          const F16 dyv = LoadPart(dy + i, n);
          const F16 g = dyv * LoadPart(weight + i, n);
          StorePart(dbias + i, LoadPart(dbias + i, n) + dyv, n);
          StorePart(dweight + i, LoadPart(dweight + i, n) + dyv * xhat, n);
          StorePart(dx + i,
                    LoadPart(dx + i, n) + s * (g - g_avg - xhat * g_xhat_avg),
                    n);
        }
      }
    }
  }
};

// ---- softmax rows ----------------------------------------------------------

// In place over p[0, n): p = exp(p - max) / sum; returns the sum of
// exp(p - max) and sets *row_max. p[n, len) is set to zero (len >= n >= 1).
MS_INLINE float SoftmaxRow(float* p, int n, int len, float* row_max) {
  const int full = n / kLanes * kLanes;
  const int rest = n - full;
  const I16 tail = LaneMask(rest);
  const F16 neg_inf = Splat(-INFINITY);
  F16 m = neg_inf;
  for (int i = 0; i < full; i += kLanes) m = Max(m, Load(p + i));
  if (rest) m = Max(m, tail ? LoadPart(p + full, rest) : neg_inf);
  const float mx = HMax(m);
  F16 sum = {};
  for (int i = 0; i < full; i += kLanes) {
    const F16 e = ExpNonPositive(Load(p + i) - mx);
    sum += e;
    Store(p + i, e);
  }
  F16 e_tail = {};
  if (rest) {
    e_tail = tail ? ExpNonPositive(LoadPart(p + full, rest) - mx) : F16{};
    sum += e_tail;
  }
  const float denom = HSum(sum);
  const float inv = 1.0f / denom;
  for (int i = 0; i < full; i += kLanes) Store(p + i, Load(p + i) * inv);
  if (rest) StorePart(p + full, e_tail * inv, rest);
  if (len > n)
    std::memset(p + n, 0, static_cast<size_t>(len - n) * sizeof(float));
  *row_max = mx;
  return denom;
}

// The causal softmax of a T x T score matrix (row stride T), in place: row t
// over columns [0, t], the rest zeroed.
// y[0, n) = bf16(x[0, n)).
MS_INLINE void RowToBf16(std::uint16_t* y, const float* x, int n) {
  for (int i = 0; i < n; i += kLanes) {
    const int rest = n - i < kLanes ? n - i : kLanes;
    StoreBf16(y + i, rest == kLanes ? Load(x + i) : LoadPart(x + i, rest),
              rest);
  }
}

// ... and its bf16 copy into s16 when non-null, row by row while the row is
// in L1.
struct CausalSoftmaxKernel {
  MS_KERNEL void operator()(auto, float* s, int T, std::uint16_t* s16) const {
    float mx;
    for (int t = 0; t < T; ++t) {
      const std::int64_t row = static_cast<std::int64_t>(t) * T;
      SoftmaxRow(s + row, t + 1, T, &mx);
      if (s16 != nullptr) RowToBf16(s16 + row, s + row, T);
    }
  }
};

// dP (T x T, in place) -> dS = P * (dP - rowsum(dP * P)) over the causal
// part; entries above the diagonal (where P = 0) become 0. With ds16, also
// its bf16 copy.
struct CausalSoftmaxBackwardKernel {
  MS_KERNEL void operator()(auto, float* dp, const float* p, int T,
                            std::uint16_t* ds16) const {
    for (int t = 0; t < T; ++t) {
      float* d = dp + static_cast<std::int64_t>(t) * T;
      const float* a = p + static_cast<std::int64_t>(t) * T;
      const int n = t + 1;
      F16 acc = {};
      int i = 0;
      for (; i + kLanes <= n; i += kLanes) acc += Load(d + i) * Load(a + i);
      const int rest = n - i;
      if (rest) acc += LoadPart(d + i, rest) * LoadPart(a + i, rest);
      const float dot = HSum(acc);
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
        RowToBf16(ds16 + static_cast<std::int64_t>(t) * T, d, T);
      }
    }
  }
};

struct CrossEntropyForwardKernel {
  MS_KERNEL void operator()(auto, float* losses, float* probs,
                            const float* logits, const std::int32_t* targets,
                            std::int64_t N, int V) const {
    for (std::int64_t r = 0; r < N; ++r) {
      const float* z = logits + r * V;
      float* p = probs + r * V;
      std::memcpy(p, z, static_cast<size_t>(V) * sizeof(float));
      float max_logit;
      const float denom = SoftmaxRow(p, V, V, &max_logit);
      // -log p[target] from the log-sum-exp form, so that a tiny probability
      // does not underflow to log(0).
      losses[r] = std::log(denom) - (z[targets[r]] - max_logit);
    }
  }
};

struct CrossEntropySoftmaxBackwardKernel {
  MS_KERNEL void operator()(auto, float* dlogits, const float* dlosses,
                            const float* probs, const std::int32_t* targets,
                            std::int64_t N, int V) const {
    for (std::int64_t r = 0; r < N; ++r) {
      const float dl = dlosses[r];
      Update(dlogits + r * V, probs + r * V, V,
             [dl](const F16& y, const F16& p) { return y + dl * p; });
      dlogits[r * V + targets[r]] -= dl;
    }
  }
};

// ---- bf16 rounding ---------------------------------------------------------

// AVX512-BF16's vcvtne2ps2bf16 rounds 32 values per instruction, to nearest
// even, NaN kept a quiet NaN; it reads f32 subnormals as zero.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void
ToBf16Avx512(const float* x, std::uint16_t* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16),
                                           _mm512_loadu_ps(x + i));
    std::memcpy(y + i, &h, sizeof(h));
  }
  for (; i < n; i += 16) {
    const int rest = n - i < 16 ? static_cast<int>(n - i) : 16;
    const __mmask16 k = static_cast<__mmask16>((1u << rest) - 1u);
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, x + i));
    __m256i bits;
    std::memcpy(&bits, &h, sizeof(h));
    _mm256_mask_storeu_epi16(y + i, k, bits);
  }
}

// ---- attention matmuls -----------------------------------------------------

// Operands of the per-head matmuls: f32 arrays, or their bf16 copies.
struct HeadOperands {
  DType type;
  const void* qkv;   // [N, 3C]
  const void* dout;  // [N, C] (backward only)
  void* p16;         // T*T bf16 (bf16 only)
  void* ds16;        // T*T bf16 (bf16 only)
  std::size_t elem;  // bytes per element of qkv / dout
};

const void* Offset(const void* base, std::int64_t elements, std::size_t elem) {
  return static_cast<const unsigned char*>(base) + elements * elem;
}

compute::GemmDesc Desc(DType type, std::int64_t m, std::int64_t n,
                       std::int64_t k) {
  compute::GemmDesc d;
  d.m = m;
  d.n = n;
  d.k = k;
  d.ab_type = type;
  d.c_type = DType::kF32;
  return d;
}

HeadOperands Operands(float* scratch, const float* qkv,
                      const std::uint16_t* given_qkv16, const float* dout,
                      int B, int T, int C, DType type) {
  HeadOperands ops{type, qkv, dout, nullptr, nullptr, sizeof(float)};
  if (type == DType::kF32) return ops;
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  const std::int64_t TT = static_cast<std::int64_t>(T) * T;
  std::uint16_t* h = reinterpret_cast<std::uint16_t*>(scratch + TT);
  std::uint16_t* qkv16 = h;
  std::uint16_t* dout16 = qkv16 + N * 3 * C;
  ops.p16 = dout16 + N * C;
  ops.ds16 = static_cast<std::uint16_t*>(ops.p16) + TT;
  if (given_qkv16 != nullptr) {
    ops.qkv = given_qkv16;
  } else {
    ToBf16(qkv, qkv16, N * 3 * C);
    ops.qkv = qkv16;
  }
  if (dout != nullptr) {
    ToBf16(dout, dout16, N * C);
    ops.dout = dout16;
  }
  ops.elem = 2;
  return ops;
}

}  // namespace

void EncoderForward(float* out, const std::int32_t* tokens, const float* wte,
                    const float* wpe, int B, int T, int C) {
  isa::Dispatch<EncoderForwardKernel>(out, tokens, wte, wpe, B, T, C);
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout,
                     const std::int32_t* tokens, int B, int T, int C) {
  isa::Dispatch<EncoderBackwardKernel>(dwte, dwpe, dout, tokens, B, T, C);
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                      const float* weight, const float* bias, std::int64_t N,
                      int C) {
  isa::Dispatch<LayerNormForwardKernel>(out, mean, rstd, inp, weight, bias, N,
                                        C);
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias,
                       const float* dout, const float* inp, const float* weight,
                       const float* mean, const float* rstd, std::int64_t N,
                       int C) {
  isa::Dispatch<LayerNormBackwardKernel>(dinp, dweight, dbias, dout, inp,
                                         weight, mean, rstd, N, C);
}

void GeluForward(float* out, const float* inp, std::int64_t n) {
  isa::Dispatch<GeluForwardKernel>(out, inp, n);
}

void GeluBackward(float* dinp, const float* inp, const float* dout,
                  std::int64_t n) {
  isa::Dispatch<GeluBackwardKernel>(dinp, inp, dout, n);
}

void GeluForwardBf16(float* out, std::uint16_t* out16, const float* inp,
                     std::int64_t n) {
  isa::Dispatch<GeluForwardBf16Kernel>(out, out16, inp, n);
}

void GeluBackwardOverwrite(float* dinp, std::uint16_t* dinp16, const float* inp,
                           const float* dout, std::int64_t n) {
  isa::Dispatch<GeluBackwardBf16Kernel>(dinp, dinp16, inp, dout, n);
}

void ToBf16(const float* x, std::uint16_t* y, std::int64_t n) {
  if (ActiveIsa() >= Isa::kAvx512Bf16) {
    ToBf16Avx512(x, y, n);
  } else {
    compute::Convert(DType::kF32, x, DType::kBF16, y,
                     static_cast<std::size_t>(n));
  }
}

std::int64_t AttentionScratchSize(int B, int T, int C, DType matmul_type) {
  const std::int64_t TT = static_cast<std::int64_t>(T) * T;
  if (matmul_type == DType::kF32) return TT;
  const std::int64_t N = static_cast<std::int64_t>(B) * T;
  // dP in f32, then bf16 qkv [N,3C], dout [N,C], P and dS [T,T]: two bf16
  // per float.
  return TT + (N * 4 * C + 2 * TT + 1) / 2;
}

Status AttentionForward(float* out, float* att, float* scratch,
                        const float* qkv, int B, int T, int C, int NH,
                        DType matmul_type, const std::uint16_t* qkv16) {
  const int hs = C / NH;
  const std::int64_t TT = static_cast<std::int64_t>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const HeadOperands ops =
      Operands(scratch, qkv, qkv16, nullptr, B, T, C, matmul_type);
  // S = scale * Q K^T: Q [T,hs] and K stored [T,hs] = [n,k], both rows of
  // qkv (leading dimension 3C).
  compute::GemmDesc s_desc = Desc(matmul_type, T, T, hs);
  s_desc.transpose_b = true;
  s_desc.lda = s_desc.ldb = 3 * static_cast<std::int64_t>(C);
  s_desc.alpha = scale;
  // O = P V: P [T,T], V [T,hs] (leading dimension 3C), O into out's columns.
  compute::GemmDesc o_desc = Desc(matmul_type, T, hs, T);
  o_desc.ldb = 3 * static_cast<std::int64_t>(C);
  o_desc.ldc = C;
  for (int b = 0; b < B; ++b) {
    const std::int64_t row0 = static_cast<std::int64_t>(b) * T;
    for (int h = 0; h < NH; ++h) {
      const std::int64_t head = static_cast<std::int64_t>(h) * hs;
      float* p = att + (static_cast<std::int64_t>(b) * NH + h) * TT;
      const void* q = Offset(ops.qkv, row0 * 3 * C + head, ops.elem);
      const void* k = Offset(ops.qkv, row0 * 3 * C + C + head, ops.elem);
      const void* v = Offset(ops.qkv, row0 * 3 * C + 2 * C + head, ops.elem);
      RETURN_IF_ERROR(compute::Gemm(s_desc, q, k, p));
      std::uint16_t* p16 = static_cast<std::uint16_t*>(ops.p16);
      isa::Dispatch<CausalSoftmaxKernel>(p, T, p16);
      const void* pa = p16 != nullptr ? static_cast<const void*>(p16) : p;
      RETURN_IF_ERROR(compute::Gemm(o_desc, pa, v, out + row0 * C + head));
    }
  }
  return OkStatus();
}

Status AttentionBackward(float* dqkv, float* scratch, const float* dout,
                         const float* qkv, const float* att, int B, int T,
                         int C, int NH, DType matmul_type,
                         const std::uint16_t* qkv16) {
  const int hs = C / NH;
  const std::int64_t TT = static_cast<std::int64_t>(T) * T;
  const std::int64_t C3 = 3 * static_cast<std::int64_t>(C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const HeadOperands ops =
      Operands(scratch, qkv, qkv16, dout, B, T, C, matmul_type);
  float* dp = scratch;  // T x T
  // dP = dO V^T: dO [T,hs] (ld C), V stored [T,hs] = [n,k] (ld 3C).
  compute::GemmDesc dp_desc = Desc(matmul_type, T, T, hs);
  dp_desc.transpose_b = true;
  dp_desc.lda = C;
  dp_desc.ldb = C3;
  // dV += P^T dO: P stored [T,T] = [k,m]; dO [T,hs] (ld C); into dqkv (ld 3C).
  compute::GemmDesc dv_desc = Desc(matmul_type, T, hs, T);
  dv_desc.transpose_a = true;
  dv_desc.ldb = C;
  dv_desc.ldc = C3;
  dv_desc.beta = 1.0f;
  // dQ += scale dS K: K [T,hs] (ld 3C).
  compute::GemmDesc dq_desc = Desc(matmul_type, T, hs, T);
  dq_desc.ldb = C3;
  dq_desc.ldc = C3;
  dq_desc.alpha = scale;
  dq_desc.beta = 1.0f;
  // dK += scale dS^T Q: dS stored [T,T] = [k,m]; Q [T,hs] (ld 3C).
  compute::GemmDesc dk_desc = dq_desc;
  dk_desc.transpose_a = true;
  for (int b = 0; b < B; ++b) {
    const std::int64_t row0 = static_cast<std::int64_t>(b) * T;
    for (int h = 0; h < NH; ++h) {
      const std::int64_t head = static_cast<std::int64_t>(h) * hs;
      const float* p = att + (static_cast<std::int64_t>(b) * NH + h) * TT;
      const void* q = Offset(ops.qkv, row0 * C3 + head, ops.elem);
      const void* k = Offset(ops.qkv, row0 * C3 + C + head, ops.elem);
      const void* v = Offset(ops.qkv, row0 * C3 + 2 * C + head, ops.elem);
      const void* d_o = Offset(ops.dout, row0 * C + head, ops.elem);
      float* dq = dqkv + row0 * C3 + head;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      RETURN_IF_ERROR(compute::Gemm(dp_desc, d_o, v, dp));
      const void* pa = p;
      if (matmul_type != DType::kF32) {
        ToBf16(p, static_cast<std::uint16_t*>(ops.p16), TT);
        pa = ops.p16;
      }
      RETURN_IF_ERROR(compute::Gemm(dv_desc, pa, d_o, dv));
      std::uint16_t* ds16 = static_cast<std::uint16_t*>(ops.ds16);
      isa::Dispatch<CausalSoftmaxBackwardKernel>(dp, p, T, ds16);
      const void* ds = ds16 != nullptr ? static_cast<const void*>(ds16) : dp;
      RETURN_IF_ERROR(compute::Gemm(dq_desc, ds, k, dq));
      RETURN_IF_ERROR(compute::Gemm(dk_desc, ds, q, dk));
    }
  }
  return OkStatus();
}

void ResidualForward(float* out, const float* a, const float* b,
                     std::int64_t n) {
  isa::Dispatch<ResidualForwardKernel>(out, a, b, n);
}

void ResidualBackward(float* da, float* db, const float* dout, std::int64_t n) {
  isa::Dispatch<ResidualBackwardKernel>(da, db, dout, n);
}

void BiasForward(float* out, const float* bias, std::int64_t N, int OC) {
  isa::Dispatch<BiasForwardKernel>(out, bias, N, OC);
}

void BiasBackward(float* dbias, const float* dout, std::int64_t N, int OC) {
  isa::Dispatch<BiasBackwardKernel>(dbias, dout, N, OC);
}

void CrossEntropyForward(float* losses, float* probs, const float* logits,
                         const std::int32_t* targets, std::int64_t N, int V) {
  isa::Dispatch<CrossEntropyForwardKernel>(losses, probs, logits, targets, N,
                                           V);
}

void CrossEntropySoftmaxBackward(float* dlogits, const float* dlosses,
                                 const float* probs,
                                 const std::int32_t* targets, std::int64_t N,
                                 int V) {
  isa::Dispatch<CrossEntropySoftmaxBackwardKernel>(dlogits, dlosses, probs,
                                                   targets, N, V);
}

}  // namespace multislice::compute::gpt
