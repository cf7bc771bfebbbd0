// The GPT-2 layer kernels of gpt_ops.h: straightforward loops over contiguous
// rows so that the compiler can vectorise the inner loops. Formulas:
//
//   encoder     out[b,t] = wte[tok[b,t]] + wpe[t]
//   layernorm   y = (x - mu) * rstd * w + beta,  rstd = 1/sqrt(var + 1e-5)
//               dx = rstd * (g - avg(g) - xhat * avg(g * xhat)),  g = dy * w
//   gelu        y = x/2 (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//               dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) du/dx
//   attention   s[t2] = q[t].k[t2] / sqrt(hs) for t2 <= t,  a = softmax(s),
//               o[t] = sum_t2 a[t2] v[t2]
//               da[t2] = do.v[t2],  dv[t2] += a[t2] do,
//               ds[t2] = a[t2] (da[t2] - sum_j a[j] da[j]),
//               dq += sum_t2 ds[t2] k[t2] / sqrt(hs),  dk[t2] += ds[t2] q /
//               sqrt(hs)
//   residual    y = a + b,  da = db = dy
//   x-entropy   p = softmax(z),  L = -log p[target],
//               dz = dL (p - onehot(target))
#include "model/gpt_ops.h"

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace multislice::model::gpt {
namespace {

constexpr float kLayerNormEps = 1e-5f;
// sqrt(2 / pi), the scale inside GPT-2's tanh-approximate GELU.
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

}  // namespace

void EncoderForward(float* out, const std::int32_t* tokens, const float* wte,
                    const float* wpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::int64_t row = static_cast<std::int64_t>(b) * T + t;
      float* out_row = out + row * C;
      const float* token_row = wte + static_cast<std::int64_t>(tokens[row]) * C;
      const float* pos_row = wpe + static_cast<std::int64_t>(t) * C;
      for (int i = 0; i < C; ++i) out_row[i] = token_row[i] + pos_row[i];
    }
  }
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout,
                     const std::int32_t* tokens, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::int64_t row = static_cast<std::int64_t>(b) * T + t;
      const float* dout_row = dout + row * C;
      float* dtoken_row = dwte + static_cast<std::int64_t>(tokens[row]) * C;
      float* dpos_row = dwpe + static_cast<std::int64_t>(t) * C;
      for (int i = 0; i < C; ++i) {
        dtoken_row[i] += dout_row[i];
        dpos_row[i] += dout_row[i];
      }
    }
  }
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                      const float* weight, const float* bias, std::int64_t N,
                      int C) {
  for (std::int64_t r = 0; r < N; ++r) {
    const float* x = inp + r * C;
    float* y = out + r * C;
    float sum = 0.0f;
    for (int i = 0; i < C; ++i) sum += x[i];
    const float mu = sum / C;
    float sq = 0.0f;
    for (int i = 0; i < C; ++i) {
      const float d = x[i] - mu;
      sq += d * d;
    }
    const float s = 1.0f / std::sqrt(sq / C + kLayerNormEps);
    for (int i = 0; i < C; ++i) y[i] = (x[i] - mu) * s * weight[i] + bias[i];
    mean[r] = mu;
    rstd[r] = s;
  }
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias,
                       const float* dout, const float* inp, const float* weight,
                       const float* mean, const float* rstd, std::int64_t N,
                       int C) {
  for (std::int64_t r = 0; r < N; ++r) {
    const float* x = inp + r * C;
    const float* dy = dout + r * C;
    float* dx = dinp + r * C;
    const float mu = mean[r];
    const float s = rstd[r];
    // Two row averages that the input gradient needs.
    float g_sum = 0.0f;
    float g_xhat_sum = 0.0f;
    for (int i = 0; i < C; ++i) {
      const float xhat = (x[i] - mu) * s;
      const float g = dy[i] * weight[i];
      g_sum += g;
      g_xhat_sum += g * xhat;
    }
    const float g_avg = g_sum / C;
    const float g_xhat_avg = g_xhat_sum / C;
    for (int i = 0; i < C; ++i) {
      const float xhat = (x[i] - mu) * s;
      const float g = dy[i] * weight[i];
      dbias[i] += dy[i];
      dweight[i] += dy[i] * xhat;
      dx[i] += s * (g - g_avg - xhat * g_xhat_avg);
    }
  }
}

void GeluForward(float* out, const float* inp, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + std::tanh(u));
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout,
                  std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float th = std::tanh(u);
    const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    const float dy_dx =
        0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
    dinp[i] += dy_dx * dout[i];
  }
}

void AttentionForward(float* out, float* preatt, float* att, const float* qkv,
                      int B, int T, int C, int NH) {
  const int hs = C / NH;
  const std::int64_t qkv_stride = 3 * static_cast<std::int64_t>(C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b) {
    const float* qkv_b = qkv + static_cast<std::int64_t>(b) * T * qkv_stride;
    for (int h = 0; h < NH; ++h) {
      const std::int64_t head_off = static_cast<std::int64_t>(h) * hs;
      for (int t = 0; t < T; ++t) {
        const std::int64_t att_row =
            ((static_cast<std::int64_t>(b) * NH + h) * T + t) * T;
        float* s = preatt + att_row;
        float* a = att + att_row;
        const float* q = qkv_b + t * qkv_stride + head_off;
        // Scores and their maximum, for a stable softmax.
        float max_score = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv_b + t2 * qkv_stride + C + head_off;
          float dot = 0.0f;
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          s[t2] = dot * scale;
          if (s[t2] > max_score) max_score = s[t2];
        }
        float denom = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          a[t2] = std::exp(s[t2] - max_score);
          denom += a[t2];
        }
        const float inv_denom = 1.0f / denom;
        for (int t2 = 0; t2 <= t; ++t2) a[t2] *= inv_denom;
        for (int t2 = t + 1; t2 < T; ++t2) {
          s[t2] = 0.0f;
          a[t2] = 0.0f;
        }
        float* o = out + (static_cast<std::int64_t>(b) * T + t) * C + head_off;
        for (int i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv_b + t2 * qkv_stride + 2 * C + head_off;
          for (int i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
        }
      }
    }
  }
}

void AttentionBackward(float* dqkv, float* dpreatt, float* datt,
                       const float* dout, const float* qkv, const float* att,
                       int B, int T, int C, int NH) {
  const int hs = C / NH;
  const std::int64_t qkv_stride = 3 * static_cast<std::int64_t>(C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b) {
    const std::int64_t qkv_b = static_cast<std::int64_t>(b) * T * qkv_stride;
    for (int h = 0; h < NH; ++h) {
      const std::int64_t head_off = static_cast<std::int64_t>(h) * hs;
      for (int t = 0; t < T; ++t) {
        const std::int64_t att_row =
            ((static_cast<std::int64_t>(b) * NH + h) * T + t) * T;
        const float* a = att + att_row;
        float* da = datt + att_row;
        float* ds = dpreatt + att_row;
        const float* dout_t =
            dout + (static_cast<std::int64_t>(b) * T + t) * C + head_off;
        // Through out = att @ v.
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + qkv_b + t2 * qkv_stride + 2 * C + head_off;
          float* dv = dqkv + qkv_b + t2 * qkv_stride + 2 * C + head_off;
          float dot = 0.0f;
          for (int i = 0; i < hs; ++i) {
            dot += v[i] * dout_t[i];
            dv[i] += a[t2] * dout_t[i];
          }
          da[t2] += dot;
        }
        // Through the softmax: ds = a * (da - <a, da>).
        float a_da = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) a_da += a[t2] * da[t2];
        for (int t2 = 0; t2 <= t; ++t2) ds[t2] += a[t2] * (da[t2] - a_da);
        // Through the scaled scores q.k.
        const float* q = qkv + qkv_b + t * qkv_stride + head_off;
        float* dq = dqkv + qkv_b + t * qkv_stride + head_off;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + qkv_b + t2 * qkv_stride + C + head_off;
          float* dk = dqkv + qkv_b + t2 * qkv_stride + C + head_off;
          const float g = ds[t2] * scale;
          for (int i = 0; i < hs; ++i) {
            dq[i] += g * k[i];
            dk[i] += g * q[i];
          }
        }
      }
    }
  }
}

void ResidualForward(float* out, const float* a, const float* b,
                     std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void ResidualBackward(float* da, float* db, const float* dout, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

void CrossEntropyForward(float* losses, float* probs, const float* logits,
                         const std::int32_t* targets, std::int64_t N, int V) {
  for (std::int64_t r = 0; r < N; ++r) {
    const float* z = logits + r * V;
    float* p = probs + r * V;
    float max_logit = -INFINITY;
    for (int v = 0; v < V; ++v) max_logit = z[v] > max_logit ? z[v] : max_logit;
    float denom = 0.0f;
    for (int v = 0; v < V; ++v) {
      p[v] = std::exp(z[v] - max_logit);
      denom += p[v];
    }
    const float inv_denom = 1.0f / denom;
    for (int v = 0; v < V; ++v) p[v] *= inv_denom;
    // -log p[target] from the log-sum-exp form, so that a tiny probability
    // does not underflow to log(0).
    losses[r] = std::log(denom) - (z[targets[r]] - max_logit);
  }
}

void CrossEntropySoftmaxBackward(float* dlogits, const float* dlosses,
                                 const float* probs,
                                 const std::int32_t* targets, std::int64_t N,
                                 int V) {
  for (std::int64_t r = 0; r < N; ++r) {
    const float* p = probs + r * V;
    float* dz = dlogits + r * V;
    const float dl = dlosses[r];
    for (int v = 0; v < V; ++v) dz[v] += dl * p[v];
    dz[targets[r]] -= dl;
  }
}

}  // namespace multislice::model::gpt
