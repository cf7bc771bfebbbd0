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

#include <algorithm>
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
template <typename Tag>
MS_INLINE void StoreBf16(Tag tag, std::uint16_t* p, const F16& v, int n) {
  const H16 h = vec::RoundToBf16(tag, v);
  std::memcpy(p, &h, static_cast<size_t>(n) * sizeof(std::uint16_t));
}
// Lanes [0, n) true.
template <typename Tag>
MS_INLINE I16 LaneMask(Tag tag, int n) {
  const I16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return vec::Less(tag, iota, I16{} + n);
}
// Pairwise, in a fixed order: lanes i and i + 8, then i and i + 4, then
// (0 + 2) + (1 + 3). Through half-width vectors and a copy, never by
// indexing the 64-byte vector: GCC keeps a 64-byte vector whose lanes are
// indexed in memory on AVX2, moved through general registers on every use
// of the loop that built it (LayerNorm ran at 1.5 ns an element).
MS_INLINE float HSum(const F16& v) {
  typedef float F8 __attribute__((vector_size(32)));
  typedef float F4 __attribute__((vector_size(16)));
  F8 halves[2];
  std::memcpy(halves, &v, sizeof(v));
  const F8 s8 = halves[0] + halves[1];
  F4 quarters[2];
  std::memcpy(quarters, &s8, sizeof(s8));
  const F4 s4 = quarters[0] + quarters[1];
  float s[4];
  std::memcpy(s, &s4, sizeof(s4));
  return (s[0] + s[2]) + (s[1] + s[3]);
}
MS_INLINE float HMax(const F16& v) {
  float lanes[kLanes];
  std::memcpy(lanes, &v, sizeof(v));
  float m = lanes[0];
  for (int i = 1; i < kLanes; ++i) m = lanes[i] > m ? lanes[i] : m;
  return m;
}
// exp(a) for a <= 0; below -104 the result underflows to 0 anyway, so a is
// clamped there (-inf and NaN give 0).
template <typename Tag>
MS_INLINE F16 ExpNonPositive(Tag tag, F16 a) {
  a = vec::Max(tag, a, Splat(-104.0f));
  return compute::vec::ExpNonPositive(a);
}

// s = sigmoid(z) and 1 - s, each without cancellation.
template <typename Tag>
MS_INLINE void Sigmoid(Tag tag, const F16& z, F16& s, F16& one_minus_s) {
  F16 az = reinterpret_cast<F16>(reinterpret_cast<U16>(z) & 0x7fffffffu);
  az = vec::Min(tag, az, Splat(104.0f));   // also maps NaN to 104
  const F16 t = ExpNonPositive(tag, -az);  // exp(-|z|) in (0, 1]
  const F16 inv = 1.0f / (1.0f + t);
  const I16 positive = vec::GreaterEq(tag, z, F16{});
  s = vec::Select(tag, positive, Splat(1.0f), t) * inv;
  one_minus_s = vec::Select(tag, positive, t, Splat(1.0f)) * inv;
}

// ---- element-wise kernels -------------------------------------------------

template <typename Tag>
MS_INLINE F16 Gelu(Tag tag, const F16& x) {
  const F16 z = (2.0f * kGeluScale) * (x + kGeluCubic * x * x * x);
  F16 s, oms;
  Sigmoid(tag, z, s, oms);
  return x * s;
}

struct GeluForwardKernel {
  MS_KERNEL void operator()(auto tag, float* out, const float* inp,
                            std::int64_t n) const {
    std::int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      Store(out + i, Gelu(tag, Load(inp + i)));
    }
    if (i < n) {
      const int rest = static_cast<int>(n - i);
      StorePart(out + i, Gelu(tag, LoadPart(inp + i, rest)), rest);
    }
  }
};

// GELU'(x); with `value`, also GELU(x) = x s from the same sigmoid.
template <typename Tag>
MS_INLINE F16 GeluGrad(Tag tag, const F16& x, F16* value = nullptr) {
  const F16 z = (2.0f * kGeluScale) * (x + kGeluCubic * x * x * x);
  F16 s, oms;
  Sigmoid(tag, z, s, oms);
  if (value != nullptr) *value = x * s;
  const F16 dz_dx = (2.0f * kGeluScale) * (1.0f + (3.0f * kGeluCubic) * x * x);
  const F16 tail = (x * s) * (oms * dz_dx);
  // Where the sigmoid saturates (|z| >= 104, so |x| > 13) the second term is
  // below 1e-40 of the first; dropping it there keeps huge x finite (x * 0
  // still propagates a NaN x).
  const F16 az = reinterpret_cast<F16>(reinterpret_cast<U16>(z) & 0x7fffffffu);
  return s +
         vec::Select(tag, vec::Less(tag, az, Splat(104.0f)), tail, x * 0.0f);
}

struct GeluBackwardKernel {
  MS_KERNEL void operator()(auto tag, float* dinp, const float* inp,
                            const float* dout, std::int64_t n) const {
    std::int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      Store(dinp + i,
            Load(dinp + i) + GeluGrad(tag, Load(inp + i)) * Load(dout + i));
    }
    if (i < n) {
      const int rest = static_cast<int>(n - i);
      const F16 g =
          GeluGrad(tag, LoadPart(inp + i, rest)) * LoadPart(dout + i, rest);
      StorePart(dinp + i, LoadPart(dinp + i, rest) + g, rest);
    }
  }
};

// GELU(x) and GELU'(x) from one sigmoid.
template <typename Tag>
MS_INLINE void GeluAndGrad(Tag tag, const F16& x, F16& y, F16& dy) {
  dy = GeluGrad(tag, x, &y);
}

struct GeluForwardSaveGradKernel {
  MS_KERNEL void operator()(auto tag, float* x, float* out,
                            std::uint16_t* out16, std::int64_t n) const {
    std::int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      F16 y, dy;
      GeluAndGrad(tag, Load(x + i), y, dy);
      if (out != nullptr) Store(out + i, y);
      if (out16 != nullptr) StoreBf16(tag, out16 + i, y, kLanes);
      Store(x + i, dy);
    }
    if (i < n) {
      const int rest = static_cast<int>(n - i);
      F16 y, dy;
      GeluAndGrad(tag, LoadPart(x + i, rest), y, dy);
      if (out != nullptr) StorePart(out + i, y, rest);
      if (out16 != nullptr) StoreBf16(tag, out16 + i, y, rest);
      StorePart(x + i, dy, rest);
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
  MS_KERNEL void operator()(auto tag, float* out, float* mean, float* rstd,
                            const float* inp, const float* weight,
                            const float* bias, std::int64_t N, int C) const {
    const int full = C / kLanes * kLanes;
    const int rest = C - full;
    const I16 tail = LaneMask(tag, rest);
    for (std::int64_t r = 0; r < N; ++r) {
      const float* x = inp + r * C;
      float* y = out + r * C;
      vec::Carry16<decltype(tag)> sum;
      for (int i = 0; i < full; i += kLanes) sum += Load(x + i);
      if (rest) sum += LoadPart(x + full, rest);
      const float mu = HSum(sum.Get()) / static_cast<float>(C);
      vec::Carry16<decltype(tag)> squares;
      for (int i = 0; i < full; i += kLanes) {
        const F16 d = Load(x + i) - mu;
        squares += d * d;
      }
      if (rest) {
        const F16 d =
            vec::Select(tag, tail, LoadPart(x + full, rest) - mu, F16{});
        squares += d * d;
      }
      const float s =
          1.0f / std::sqrt(HSum(squares.Get()) / static_cast<float>(C) +
                           kLayerNormEps);
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
  MS_KERNEL void operator()(auto tag, float* dinp, float* dweight, float* dbias,
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
      vec::Carry16<decltype(tag)> g_acc, gx_acc;
      int i = 0;
      for (; i + kLanes <= C; i += kLanes) {
        const F16 xhat = (Load(x + i) - mu) * s;
        const F16 g = Load(dy + i) * Load(weight + i);
        g_acc += g;
        gx_acc += g * xhat;
      }
      if (i < C) {
        const int n = C - i;
        const F16 xhat = (LoadPart(x + i, n) - mu) * s;
        const F16 g = LoadPart(dy + i, n) * LoadPart(weight + i, n);
        g_acc += g;
        gx_acc += g * xhat;
      }
      const float g_avg = HSum(g_acc.Get()) / static_cast<float>(C);
      const float g_xhat_avg = HSum(gx_acc.Get()) / static_cast<float>(C);
      for (i = 0; i + kLanes <= C; i += kLanes) {
        const F16 xhat = (Load(x + i) - mu) * s;
        const F16 dyv = Load(dy + i);
        const F16 g = dyv * Load(weight + i);
        Store(dbias + i, Load(dbias + i) + dyv);
        Store(dweight + i, Load(dweight + i) + dyv * xhat);
        Store(dx + i, Load(dx + i) + s * (g - g_avg - xhat * g_xhat_avg));
      }
      if (i < C) {
        const int n = C - i;
        const F16 xhat = (LoadPart(x + i, n) - mu) * s;
        const F16 dyv = LoadPart(dy + i, n);
        const F16 g = dyv * LoadPart(weight + i, n);
        StorePart(dbias + i, LoadPart(dbias + i, n) + dyv, n);
        StorePart(dweight + i, LoadPart(dweight + i, n) + dyv * xhat, n);
        StorePart(dx + i,
                  LoadPart(dx + i, n) + s * (g - g_avg - xhat * g_xhat_avg), n);
      }
    }
  }
};

// ---- softmax rows ----------------------------------------------------------

// In place over p[0, n): p = exp(p - max) / sum; returns the sum of
// exp(p - max) and sets *row_max. p[n, len) is set to zero (len >= n >= 1).
template <typename Tag>
MS_INLINE float SoftmaxRow(Tag tag, float* p, int n, int len, float* row_max) {
  const int full = n / kLanes * kLanes;
  const int rest = n - full;
  const I16 tail = LaneMask(tag, rest);
  const F16 neg_inf = Splat(-INFINITY);
  vec::Carry16<Tag> m(neg_inf);
  for (int i = 0; i < full; i += kLanes) {
    m.Set(vec::Max(tag, m.Get(), Load(p + i)));
  }
  if (rest) {
    m.Set(vec::Max(tag, m.Get(),
                   vec::Select(tag, tail, LoadPart(p + full, rest), neg_inf)));
  }
  const float mx = HMax(m.Get());
  vec::Carry16<Tag> sum;
  for (int i = 0; i < full; i += kLanes) {
    const F16 e = ExpNonPositive(tag, Load(p + i) - mx);
    sum += e;
    Store(p + i, e);
  }
  F16 e_tail = {};
  if (rest) {
    e_tail = vec::Select(
        tag, tail, ExpNonPositive(tag, LoadPart(p + full, rest) - mx), F16{});
    sum += e_tail;
  }
  const float denom = HSum(sum.Get());
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
template <typename Tag>
MS_INLINE void RowToBf16(Tag tag, std::uint16_t* y, const float* x, int n) {
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    StoreBf16(tag, y + i, Load(x + i), kLanes);
  if (i < n) StoreBf16(tag, y + i, LoadPart(x + i, n - i), n - i);
}

// ... and its bf16 copy into s16 when non-null, row by row while the row is
// in L1.
struct CausalSoftmaxKernel {
  MS_KERNEL void operator()(auto tag, float* s, int T,
                            std::uint16_t* s16) const {
    float mx;
    for (int t = 0; t < T; ++t) {
      const std::int64_t row = static_cast<std::int64_t>(t) * T;
      SoftmaxRow(tag, s + row, t + 1, T, &mx);
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

struct CrossEntropyForwardKernel {
  MS_KERNEL void operator()(auto tag, float* losses, float* probs,
                            const float* logits, const std::int32_t* targets,
                            std::int64_t N, int V) const {
    for (std::int64_t r = 0; r < N; ++r) {
      const float* z = logits + r * V;
      float* p = probs + r * V;
      std::memcpy(p, z, static_cast<size_t>(V) * sizeof(float));
      float max_logit;
      const float denom = SoftmaxRow(tag, p, V, V, &max_logit);
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

void GeluForwardSaveGrad(float* x, float* out, std::uint16_t* out16,
                         std::int64_t n) {
  isa::Dispatch<GeluForwardSaveGradKernel>(x, out, out16, n);
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

// The causal structure in the per-head matmuls: queries in blocks of
// kCausalBlock rows, each against only the keys at or before its last row
// (block [r0, r1) against keys [0, r1)), and in the backward keys in blocks
// against only the queries at or after them. With T = 128 that is 3/4 of the
// full T x T products (the rest is masked to zero anyway) in twice as many
// calls; smaller blocks save more products but pay more per call.
constexpr int kCausalBlock = 64;

Status AttentionForward(float* out, float* att, float* scratch,
                        const float* qkv, int B, int T, int C, int NH,
                        DType matmul_type, const std::uint16_t* qkv16) {
  const int hs = C / NH;
  const std::int64_t TT = static_cast<std::int64_t>(T) * T;
  const std::int64_t C3 = 3 * static_cast<std::int64_t>(C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const HeadOperands ops =
      Operands(scratch, qkv, qkv16, nullptr, B, T, C, matmul_type);
  for (int b = 0; b < B; ++b) {
    const std::int64_t row0 = static_cast<std::int64_t>(b) * T;
    for (int h = 0; h < NH; ++h) {
      const std::int64_t head = static_cast<std::int64_t>(h) * hs;
      float* p = att + (static_cast<std::int64_t>(b) * NH + h) * TT;
      const std::int64_t q = row0 * C3 + head, k = q + C, v = q + 2 * C;
      for (int r0 = 0; r0 < T; r0 += kCausalBlock) {
        const int r1 = std::min(T, r0 + kCausalBlock);
        // S[r0:r1, 0:r1] = scale Q[r0:r1] K[0:r1]^T (K stored [n, k]).
        compute::GemmDesc s_desc = Desc(matmul_type, r1 - r0, r1, hs);
        s_desc.transpose_b = true;
        s_desc.lda = s_desc.ldb = C3;
        s_desc.ldc = T;
        s_desc.alpha = scale;
        RETURN_IF_ERROR(compute::Gemm(s_desc,
                                      Offset(ops.qkv, q + r0 * C3, ops.elem),
                                      Offset(ops.qkv, k, ops.elem),
                                      p + static_cast<std::int64_t>(r0) * T));
      }
      std::uint16_t* p16 = static_cast<std::uint16_t*>(ops.p16);
      isa::Dispatch<CausalSoftmaxKernel>(p, T, p16);
      const void* pa = p16 != nullptr ? static_cast<const void*>(p16) : p;
      for (int r0 = 0; r0 < T; r0 += kCausalBlock) {
        const int r1 = std::min(T, r0 + kCausalBlock);
        // O[r0:r1] = P[r0:r1, 0:r1] V[0:r1], into the head's columns of out.
        compute::GemmDesc o_desc = Desc(matmul_type, r1 - r0, hs, r1);
        o_desc.lda = T;
        o_desc.ldb = C3;
        o_desc.ldc = C;
        RETURN_IF_ERROR(compute::Gemm(
            o_desc, Offset(pa, static_cast<std::int64_t>(r0) * T, ops.elem),
            Offset(ops.qkv, v, ops.elem), out + (row0 + r0) * C + head));
      }
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
  for (int b = 0; b < B; ++b) {
    const std::int64_t row0 = static_cast<std::int64_t>(b) * T;
    for (int h = 0; h < NH; ++h) {
      const std::int64_t head = static_cast<std::int64_t>(h) * hs;
      const float* p = att + (static_cast<std::int64_t>(b) * NH + h) * TT;
      const std::int64_t q = row0 * C3 + head, k = q + C, v = q + 2 * C;
      const std::int64_t d_o = row0 * C + head;
      float* dq = dqkv + q;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      for (int r0 = 0; r0 < T; r0 += kCausalBlock) {
        const int r1 = std::min(T, r0 + kCausalBlock);
        // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T (V stored [n, k]).
        compute::GemmDesc dp_desc = Desc(matmul_type, r1 - r0, r1, hs);
        dp_desc.transpose_b = true;
        dp_desc.lda = C;
        dp_desc.ldb = C3;
        dp_desc.ldc = T;
        RETURN_IF_ERROR(compute::Gemm(dp_desc,
                                      Offset(ops.dout, d_o + r0 * C, ops.elem),
                                      Offset(ops.qkv, v, ops.elem),
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
        compute::GemmDesc dv_desc = Desc(matmul_type, c1 - c0, hs, T - c0);
        dv_desc.transpose_a = true;
        dv_desc.lda = T;
        dv_desc.ldb = C;
        dv_desc.ldc = C3;
        dv_desc.beta = 1.0f;
        RETURN_IF_ERROR(compute::Gemm(
            dv_desc,
            Offset(pa, static_cast<std::int64_t>(c0) * T + c0, ops.elem),
            Offset(ops.dout, d_o + c0 * C, ops.elem), dv + c0 * C3));
      }
      std::uint16_t* ds16 = static_cast<std::uint16_t*>(ops.ds16);
      isa::Dispatch<CausalSoftmaxBackwardKernel>(dp, p, T, ds16);
      const void* ds = ds16 != nullptr ? static_cast<const void*>(ds16) : dp;
      for (int r0 = 0; r0 < T; r0 += kCausalBlock) {
        const int r1 = std::min(T, r0 + kCausalBlock);
        // dQ[r0:r1] += scale dS[r0:r1, 0:r1] K[0:r1].
        compute::GemmDesc dq_desc = Desc(matmul_type, r1 - r0, hs, r1);
        dq_desc.lda = T;
        dq_desc.ldb = C3;
        dq_desc.ldc = C3;
        dq_desc.alpha = scale;
        dq_desc.beta = 1.0f;
        RETURN_IF_ERROR(compute::Gemm(
            dq_desc, Offset(ds, static_cast<std::int64_t>(r0) * T, ops.elem),
            Offset(ops.qkv, k, ops.elem), dq + r0 * C3));
        // dK[c0:c1] += scale dS[c0:T, c0:c1]^T Q[c0:T] (c = the same block).
        const int c0 = r0, c1 = r1;
        compute::GemmDesc dk_desc = Desc(matmul_type, c1 - c0, hs, T - c0);
        dk_desc.transpose_a = true;
        dk_desc.lda = T;
        dk_desc.ldb = C3;
        dk_desc.ldc = C3;
        dk_desc.alpha = scale;
        dk_desc.beta = 1.0f;
        RETURN_IF_ERROR(compute::Gemm(
            dk_desc,
            Offset(ds, static_cast<std::int64_t>(c0) * T + c0, ops.elem),
            Offset(ops.qkv, q + c0 * C3, ops.elem), dk + c0 * C3));
      }
    }
  }
  return OkStatus();
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
