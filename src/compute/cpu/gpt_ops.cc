// The GPT-2 layer kernels of gpt_ops.h. Formulas:
//
//   encoder     out[b,t] = wte[tok[b,t]] + wpe[t]
//   layernorm   y = (x - mu) * rstd * w + beta,  rstd = 1/sqrt(var + eps)
//               dx = rstd * (g - avg(g) - xhat * avg(g * xhat)),  g = dy * w
//   gelu        y = x/2 (1 + tanh(u)) = x sigmoid(2u),
//               u = sqrt(2/pi) (x + 0.044715 x^3)
//               dy/dx = s + x s (1 - s) 2 du/dx,  s = sigmoid(2u)
//   residual    y = a + b,  da = db = dy
//   x-entropy   p = softmax(z),  L = -log p[target],
//               dz = dL (p - onehot(target))
//
// The element-wise and row kernels are written on GCC vector types of 16 f32
// lanes (kernel_math.h) and compiled three times (AVX-512, AVX2, baseline) by
// isa::Dispatch, as elementwise.cc is; a row's last < 16 elements go
// through the same vector code, zero-padded and masked. Reductions keep 16
// partial sums and add them in a fixed order, so results are deterministic.
// exp is compute/elementwise.cc's: Cody-Waite range reduction and a degree-7
// polynomial, within about 1 ulp of f32. Attention is attention.cc.
#include "compute/gpt_ops.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/isa_dispatch.h"
#include "compute/cpu/kernel_math.h"

// The vector types below are passed between inline functions of this file
// only, never across an ABI boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace multislice::compute::gpt {
namespace {

using namespace compute::kernels;  // NOLINT: the kernels' vocabulary

// ---- element-wise kernels -------------------------------------------------

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
                            const float* bias, std::int64_t N, int C,
                            float eps) const {
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
          1.0f / std::sqrt(HSum(squares.Get()) / static_cast<float>(C) + eps);
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

struct CrossEntropyForwardKernel {
  MS_KERNEL void operator()(auto tag, float* losses, float* probs,
                            const float* logits, const std::int32_t* targets,
                            std::int64_t N, int V) const {
    for (std::int64_t r = 0; r < N; ++r) {
      const float* z = logits + r * V;
      float* p = probs + r * V;
      float max_logit;
      const float denom = SoftmaxRow(tag, z, p, V, V, &max_logit);
      // -log p[target] from the log-sum-exp form, so that a tiny probability
      // does not underflow to log(0).
      losses[r] = std::log(denom) - (z[targets[r]] - max_logit);
    }
  }
};

// dlogits (+= with kAccumulate, else =) dl (probs - onehot(target)).
template <bool kAccumulate>
struct CrossEntropySoftmaxBackwardKernel {
  MS_KERNEL void operator()(auto, float* dlogits, const float* dlosses,
                            const float* probs, const std::int32_t* targets,
                            std::int64_t N, int V) const {
    for (std::int64_t r = 0; r < N; ++r) {
      const float dl = dlosses[r];
      float* d = dlogits + r * V;
      const float* p = probs + r * V;
      if constexpr (kAccumulate) {
        Update(d, p, V,
               [dl](const F16& y, const F16& pv) { return y + dl * pv; });
      } else {
        int i = 0;
        for (; i + kLanes <= V; i += kLanes) Store(d + i, dl * Load(p + i));
        if (i < V) StorePart(d + i, dl * LoadPart(p + i, V - i), V - i);
      }
      d[targets[r]] -= dl;
    }
  }
};

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
                      int C, float eps) {
  isa::Dispatch<LayerNormForwardKernel>(out, mean, rstd, inp, weight, bias, N,
                                        C, eps);
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
  isa::Dispatch<CrossEntropySoftmaxBackwardKernel<true>>(dlogits, dlosses,
                                                         probs, targets, N, V);
}

void CrossEntropySoftmaxGrad(float* dlogits, const float* dlosses,
                             const float* probs, const std::int32_t* targets,
                             std::int64_t N, int V) {
  isa::Dispatch<CrossEntropySoftmaxBackwardKernel<false>>(dlogits, dlosses,
                                                          probs, targets, N, V);
}

}  // namespace multislice::compute::gpt
