// The Llama-family kernels of llama_ops.h. Formulas:
//
//   rmsnorm   y = x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps)
//             dx = rstd * (g - xhat * avg(g * xhat)),  g = dy * w,
//             xhat = x * rstd,  dw = dy * xhat
//   rope      (x1, x2) -> (x1 c - x2 s, x2 c + x1 s); its transpose, the
//             rotation by -angle, is the backward
//   swiglu    h = silu(g) u,  silu(g) = g sigmoid(g),
//             silu'(g) = s (1 + g (1 - s)),  s = sigmoid(g)
//   geglu     h = gelu(g) u (GPT-2's GELU, kernel_math.h)
//             dg = dh u act'(g),  du = dh act(g)
//
// Written on the 16-lane vectors of kernel_math.h and compiled for every ISA
// level by isa::Dispatch; a row's last < 16 elements go through the same
// code, zero-padded. Reductions keep 16 partial sums and add them in a fixed
// order.
#include "compute/llama_ops.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/isa_dispatch.h"
#include "compute/cpu/kernel_math.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace multislice::compute::llama {
namespace {

using namespace compute::kernels;  // NOLINT: the kernels' vocabulary

// Lambdas do not take the target attribute of the kernel they are written
// in; inlined, they are compiled for its ISA.
#define MS_LAMBDA_INLINE __attribute__((always_inline))

// Calls f(i, n) for each run [i, i + n) of 16 (the last one shorter) of
// [0, count).
template <typename F>
MS_INLINE void ForEachVector(int count, F f) {
  int i = 0;
  for (; i + kLanes <= count; i += kLanes) f(i, kLanes);
  if (i < count) f(i, count - i);
}

MS_INLINE F16 LoadN(const float* p, int n) {
  return n == kLanes ? Load(p) : LoadPart(p, n);
}
MS_INLINE void StoreN(float* p, const F16& v, int n) {
  if (n == kLanes) {
    Store(p, v);
  } else {
    StorePart(p, v, n);
  }
}

struct RmsNormForwardKernel {
  MS_KERNEL void operator()(auto tag, float* out, float* rstd, const float* inp,
                            const float* weight, std::int64_t N, int C,
                            float eps) const {
    for (std::int64_t r = 0; r < N; ++r) {
      const float* x = inp + r * C;
      float* y = out + r * C;
      vec::Carry16<decltype(tag)> squares;
      ForEachVector(C, [&](int i, int n) MS_LAMBDA_INLINE {
        const F16 v = LoadN(x + i, n);
        squares += v * v;
      });
      const float s =
          1.0f / std::sqrt(HSum(squares.Get()) / static_cast<float>(C) + eps);
      ForEachVector(C, [&](int i, int n) MS_LAMBDA_INLINE {
        StoreN(y + i, LoadN(x + i, n) * s * LoadN(weight + i, n), n);
      });
      rstd[r] = s;
    }
  }
};

struct RmsNormBackwardKernel {
  MS_KERNEL void operator()(auto tag, float* dinp, float* dweight,
                            const float* dout, const float* inp,
                            const float* weight, const float* rstd,
                            std::int64_t N, int C) const {
    for (std::int64_t r = 0; r < N; ++r) {
      const float* x = inp + r * C;
      const float* dy = dout + r * C;
      float* dx = dinp + r * C;
      const float s = rstd[r];
      // Padding lanes have dy = 0, so g = 0 there.
      vec::Carry16<decltype(tag)> gx_acc;
      ForEachVector(C, [&](int i, int n) MS_LAMBDA_INLINE {
        const F16 xhat = LoadN(x + i, n) * s;
        gx_acc += LoadN(dy + i, n) * LoadN(weight + i, n) * xhat;
      });
      const float g_xhat_avg = HSum(gx_acc.Get()) / static_cast<float>(C);
      ForEachVector(C, [&](int i, int n) MS_LAMBDA_INLINE {
        const F16 xhat = LoadN(x + i, n) * s;
        const F16 dyv = LoadN(dy + i, n);
        const F16 g = dyv * LoadN(weight + i, n);
        StoreN(dweight + i, LoadN(dweight + i, n) + dyv * xhat, n);
        StoreN(dx + i, LoadN(dx + i, n) + s * (g - xhat * g_xhat_avg), n);
      });
    }
  }
};

struct RopeKernel {
  MS_KERNEL void operator()(auto, float* x, std::int64_t stride, int B, int T,
                            int heads, int D, const float* cos,
                            const float* sin, bool inverse) const {
    const int half = D / 2;
    const float sign = inverse ? -1.0f : 1.0f;
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        float* row = x + (static_cast<std::int64_t>(b) * T + t) * stride;
        const float* c_t = cos + static_cast<std::int64_t>(t) * half;
        const float* s_t = sin + static_cast<std::int64_t>(t) * half;
        for (int h = 0; h < heads; ++h) {
          float* x1 = row + static_cast<std::int64_t>(h) * D;
          float* x2 = x1 + half;
          ForEachVector(half, [&](int i, int n) MS_LAMBDA_INLINE {
            const F16 a = LoadN(x1 + i, n), bv = LoadN(x2 + i, n);
            const F16 c = LoadN(c_t + i, n), s = LoadN(s_t + i, n) * sign;
            StoreN(x1 + i, a * c - bv * s, n);
            StoreN(x2 + i, bv * c + a * s, n);
          });
        }
      }
    }
  }
};

// act(g) and, with `grad`, act'(g).
template <typename Tag>
MS_INLINE F16 Activate(Tag tag, GateActivation act, const F16& g,
                       F16* grad = nullptr) {
  if (act == GateActivation::kGelu) {
    F16 value;
    const F16 d = GeluGrad(tag, g, &value);
    if (grad != nullptr) *grad = d;
    return value;
  }
  F16 s, oms;
  Sigmoid(tag, g, s, oms);
  if (grad != nullptr) *grad = s * (1.0f + g * oms);
  return g * s;
}

struct GatedForwardKernel {
  MS_KERNEL void operator()(auto tag, GateActivation act, const float* gate_up,
                            float* h, std::uint16_t* h16, std::int64_t N,
                            int H) const {
    for (std::int64_t r = 0; r < N; ++r) {
      const float* g = gate_up + r * 2 * H;
      const float* u = g + H;
      ForEachVector(H, [&](int i, int n) MS_LAMBDA_INLINE {
        const F16 y = Activate(tag, act, LoadN(g + i, n)) * LoadN(u + i, n);
        if (h != nullptr) StoreN(h + r * H + i, y, n);
        if (h16 != nullptr) StoreBf16(tag, h16 + r * H + i, y, n);
      });
    }
  }
};

struct GatedBackwardKernel {
  MS_KERNEL void operator()(auto tag, GateActivation act, float* dgate_up,
                            const float* dh, const float* gate_up,
                            std::int64_t N, int H) const {
    for (std::int64_t r = 0; r < N; ++r) {
      const float* g = gate_up + r * 2 * H;
      const float* u = g + H;
      float* dg = dgate_up + r * 2 * H;
      float* du = dg + H;
      const float* dy = dh + r * H;
      ForEachVector(H, [&](int i, int n) MS_LAMBDA_INLINE {
        F16 grad;
        const F16 a = Activate(tag, act, LoadN(g + i, n), &grad);
        const F16 d = LoadN(dy + i, n);
        StoreN(dg + i, d * LoadN(u + i, n) * grad, n);
        StoreN(du + i, d * a, n);
      });
    }
  }
};

struct EmbedForwardKernel {
  MS_KERNEL void operator()(auto, float* out, const std::int32_t* tokens,
                            const float* wte, std::int64_t N, int C) const {
    for (std::int64_t r = 0; r < N; ++r) {
      std::memcpy(out + r * C, wte + static_cast<std::int64_t>(tokens[r]) * C,
                  static_cast<size_t>(C) * sizeof(float));
    }
  }
};

struct EmbedBackwardKernel {
  MS_KERNEL void operator()(auto, float* dwte, const float* dout,
                            const std::int32_t* tokens, std::int64_t N,
                            int C) const {
    for (std::int64_t r = 0; r < N; ++r) {
      Update(dwte + static_cast<std::int64_t>(tokens[r]) * C, dout + r * C, C,
             [](const F16& y, const F16& x) { return y + x; });
    }
  }
};

}  // namespace

void RmsNormForward(float* out, float* rstd, const float* inp,
                    const float* weight, std::int64_t N, int C, float eps) {
  isa::Dispatch<RmsNormForwardKernel>(out, rstd, inp, weight, N, C, eps);
}

void RmsNormBackwardAccumulate(float* dinp, float* dweight, const float* dout,
                               const float* inp, const float* weight,
                               const float* rstd, std::int64_t N, int C) {
  isa::Dispatch<RmsNormBackwardKernel>(dinp, dweight, dout, inp, weight, rstd,
                                       N, C);
}

void RopeTable(float* cos, float* sin, int T, int D, double max_timescale) {
  const int half = D / 2;
  for (int i = 0; i < half; ++i) {
    const double timescale =
        std::pow(max_timescale, 2.0 * i / static_cast<double>(D));
    for (int t = 0; t < T; ++t) {
      const double angle = t / timescale;
      cos[static_cast<std::int64_t>(t) * half + i] =
          static_cast<float>(std::cos(angle));
      sin[static_cast<std::int64_t>(t) * half + i] =
          static_cast<float>(std::sin(angle));
    }
  }
}

void Rope(float* x, std::int64_t stride, int B, int T, int heads, int D,
          const float* cos, const float* sin, bool inverse) {
  isa::Dispatch<RopeKernel>(x, stride, B, T, heads, D, cos, sin, inverse);
}

void GatedForward(GateActivation act, const float* gate_up, float* h,
                  std::uint16_t* h16, std::int64_t N, int H) {
  isa::Dispatch<GatedForwardKernel>(act, gate_up, h, h16, N, H);
}

void GatedBackward(GateActivation act, float* dgate_up, const float* dh,
                   const float* gate_up, std::int64_t N, int H) {
  isa::Dispatch<GatedBackwardKernel>(act, dgate_up, dh, gate_up, N, H);
}

void EmbedForward(float* out, const std::int32_t* tokens, const float* wte,
                  std::int64_t N, int C) {
  isa::Dispatch<EmbedForwardKernel>(out, tokens, wte, N, C);
}

void EmbedBackwardAccumulate(float* dwte, const float* dout,
                             const std::int32_t* tokens, std::int64_t N,
                             int C) {
  isa::Dispatch<EmbedBackwardKernel>(dwte, dout, tokens, N, C);
}

}  // namespace multislice::compute::llama
