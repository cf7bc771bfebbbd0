// Tests of llama_ops: every forward against a plain loop of its formula in
// double, every backward against central finite differences of its forward
// (on sizes with a partial 16-lane vector), the rotation's inverse and its
// relative-position property, on every ISA level.
#include "compute/llama_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/isa_testing.h"
#include "compute/op_testing.h"

namespace multislice::compute::llama {
namespace {

using LlamaOpsTest = IsaLevelTest;
using namespace compute::testing;  // NOLINT

constexpr float kEps = 1e-5f;

TEST_P(LlamaOpsTest, RmsNormForwardMatchesReference) {
  for (int C : {8, 16, 37}) {
    const int N = 5;
    const auto inp = Random(N * C, 1, -3.0f, 3.0f);
    const auto w = Random(C, 2);
    std::vector<float> out(N * C), rstd(N);
    RmsNormForward(out.data(), rstd.data(), inp.data(), w.data(), N, C, kEps);
    for (int r = 0; r < N; ++r) {
      double ss = 0;
      for (int i = 0; i < C; ++i) ss += double{inp[r * C + i]} * inp[r * C + i];
      const double s = 1.0 / std::sqrt(ss / C + kEps);
      EXPECT_NEAR(rstd[r], s, 1e-6 * s);
      for (int i = 0; i < C; ++i) {
        EXPECT_NEAR(out[r * C + i], inp[r * C + i] * s * w[i], 2e-6)
            << "C=" << C << " row " << r << " col " << i;
      }
    }
  }
}

TEST_P(LlamaOpsTest, RmsNormBackwardMatchesFiniteDifferences) {
  for (int C : {8, 21}) {
    const int N = 3;
    auto inp = Random(N * C, 3, -2.0f, 2.0f);
    auto w = Random(C, 4);
    const auto r = Random(N * C, 5);
    std::vector<float> out(N * C), rstd(N);
    auto f = [&] {
      RmsNormForward(out.data(), rstd.data(), inp.data(), w.data(), N, C, kEps);
      return Dot(out, r);
    };
    f();
    auto dinp = Seeded(inp.size());
    auto dw = Seeded(w.size());
    RmsNormBackwardAccumulate(dinp.data(), dw.data(), r.data(), inp.data(),
                              w.data(), rstd.data(), N, C);
    ExpectGradient(inp, f, dinp, "dinp C=" + std::to_string(C));
    ExpectGradient(w, f, dw, "dweight C=" + std::to_string(C));
  }
}

TEST_P(LlamaOpsTest, RopeTableIsMaxTextsTimescales) {
  const int T = 7, D = 12;
  std::vector<float> cos(T * D / 2), sin(T * D / 2);
  RopeTable(cos.data(), sin.data(), T, D, 10000.0);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < D / 2; ++i) {
      // MaxText: timescale = 1 * (10000 / 1)^(2i / D), angle = t / timescale.
      const double angle = t / std::pow(10000.0, 2.0 * i / D);
      EXPECT_FLOAT_EQ(cos[t * D / 2 + i], static_cast<float>(std::cos(angle)));
      EXPECT_FLOAT_EQ(sin[t * D / 2 + i], static_cast<float>(std::sin(angle)));
    }
  }
}

// Rotates a [B, T, stride] buffer's first `heads` heads by a plain loop.
std::vector<double> ReferenceRope(const std::vector<float>& x, int64_t stride,
                                  int B, int T, int heads, int D,
                                  double max_timescale) {
  std::vector<double> y(x.begin(), x.end());
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < heads; ++h) {
        const int64_t base = (int64_t{b} * T + t) * stride + int64_t{h} * D;
        for (int i = 0; i < D / 2; ++i) {
          const double angle = t / std::pow(max_timescale, 2.0 * i / D);
          const double x1 = x[base + i], x2 = x[base + i + D / 2];
          y[base + i] = x1 * std::cos(angle) - x2 * std::sin(angle);
          y[base + i + D / 2] = x2 * std::cos(angle) + x1 * std::sin(angle);
        }
      }
    }
  }
  return y;
}

TEST_P(LlamaOpsTest, RopeMatchesReferenceAndInverseUndoesIt) {
  struct Case {
    int B, T, heads, D, stride;
  };
  for (const Case& c :
       {Case{2, 5, 3, 8, 30}, Case{1, 9, 2, 40, 100}, Case{2, 3, 1, 64, 64}}) {
    SCOPED_TRACE("D=" + std::to_string(c.D));
    const auto x = Random(int64_t{c.B} * c.T * c.stride, 7, -2.0f, 2.0f);
    std::vector<float> cos(c.T * c.D / 2), sin(cos.size());
    RopeTable(cos.data(), sin.data(), c.T, c.D, 500.0);
    std::vector<float> y = x;
    Rope(y.data(), c.stride, c.B, c.T, c.heads, c.D, cos.data(), sin.data());
    const std::vector<double> want =
        ReferenceRope(x, c.stride, c.B, c.T, c.heads, c.D, 500.0);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y[i], want[i], 2e-6) << i;  // columns past the heads kept
    }
    Rope(y.data(), c.stride, c.B, c.T, c.heads, c.D, cos.data(), sin.data(),
         /*inverse=*/true);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], x[i], 4e-6) << i;
  }
}

// The property rotary embeddings exist for: the dot product of a rotated
// query at position t and a rotated key at t2 depends only on t - t2.
TEST_P(LlamaOpsTest, RopeDotProductsDependOnRelativePosition) {
  const int T = 9, D = 16;
  const auto q = Random(D, 8), k = Random(D, 9);
  std::vector<float> cos(T * D / 2), sin(cos.size());
  RopeTable(cos.data(), sin.data(), T, D, 10000.0);
  auto rotated_at = [&](const std::vector<float>& v, int t) {
    std::vector<float> rows(T * D, 0.0f);
    std::copy(v.begin(), v.end(), rows.begin() + t * D);
    Rope(rows.data(), D, 1, T, 1, D, cos.data(), sin.data());
    return std::vector<float>(rows.begin() + t * D, rows.begin() + (t + 1) * D);
  };
  auto dot = [&](int t, int t2) {
    const auto a = rotated_at(q, t), b = rotated_at(k, t2);
    double s = 0;
    for (int i = 0; i < D; ++i) s += double{a[i]} * b[i];
    return s;
  };
  EXPECT_NEAR(dot(5, 2), dot(3, 0), 1e-5);
  EXPECT_NEAR(dot(8, 8), dot(0, 0), 1e-5);
  EXPECT_GT(std::fabs(dot(5, 2) - dot(5, 0)), 1e-4);
}

TEST_P(LlamaOpsTest, RopeBackwardIsTheInverseRotationOfTheGradient) {
  const int B = 1, T = 4, heads = 2, D = 6, stride = 14;
  auto x = Random(B * T * stride, 10);
  const auto r = Random(x.size(), 11);
  std::vector<float> cos(T * D / 2), sin(cos.size());
  RopeTable(cos.data(), sin.data(), T, D, 100.0);
  auto f = [&] {
    std::vector<float> y = x;
    Rope(y.data(), stride, B, T, heads, D, cos.data(), sin.data());
    return Dot(y, r);
  };
  std::vector<float> g = r;
  Rope(g.data(), stride, B, T, heads, D, cos.data(), sin.data(), true);
  for (float& v : g) v += kGradSeed;
  ExpectGradient(x, f, g, "dx");
}

// act(g) in double: SiLU, or GPT-2's tanh-approximate GELU.
double Act(GateActivation act, double g) {
  if (act == GateActivation::kSilu) return g / (1.0 + std::exp(-g));
  return 0.5 * g *
         (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
}

TEST_P(LlamaOpsTest, GatedForwardMatchesReference) {
  for (GateActivation act : {GateActivation::kSilu, GateActivation::kGelu}) {
    for (int H : {16, 23}) {
      const int N = 3;
      const auto gu = Random(N * 2 * H, 12, -6.0f, 6.0f);
      std::vector<float> h(N * H);
      std::vector<std::uint16_t> h16(N * H);
      GatedForward(act, gu.data(), h.data(), h16.data(), N, H);
      for (int r = 0; r < N; ++r) {
        for (int i = 0; i < H; ++i) {
          const double want =
              Act(act, gu[r * 2 * H + i]) * gu[r * 2 * H + H + i];
          ASSERT_NEAR(h[r * H + i], want, 1e-5 * (1 + std::fabs(want)));
          ASSERT_EQ(h16[r * H + i], bf16::FromFloat(h[r * H + i]));
        }
      }
      // Without the f32 output, the bf16 one alone.
      std::vector<std::uint16_t> only16(N * H);
      GatedForward(act, gu.data(), nullptr, only16.data(), N, H);
      EXPECT_EQ(only16, h16);
    }
  }
}

TEST_P(LlamaOpsTest, GatedBackwardMatchesFiniteDifferences) {
  for (GateActivation act : {GateActivation::kSilu, GateActivation::kGelu}) {
    const int N = 2, H = 19;
    auto gu = Random(N * 2 * H, 13, -4.0f, 4.0f);
    const auto r = Random(N * H, 14);
    std::vector<float> h(N * H);
    auto f = [&] {
      GatedForward(act, gu.data(), h.data(), nullptr, N, H);
      return Dot(h, r);
    };
    std::vector<float> dgu(gu.size(), 123.0f);  // written, not accumulated
    GatedBackward(act, dgu.data(), r.data(), gu.data(), N, H);
    for (float& v : dgu) v += kGradSeed;
    ExpectGradient(gu, f, dgu,
                   act == GateActivation::kSilu ? "swiglu" : "geglu");
  }
}

TEST_P(LlamaOpsTest, EmbeddingGathersAndScattersRows) {
  const int V = 7, C = 19, N = 6;
  const auto wte = Random(V * C, 15);
  const std::vector<int32_t> tokens = {3, 0, 3, 6, 1, 3};
  std::vector<float> out(N * C);
  EmbedForward(out.data(), tokens.data(), wte.data(), N, C);
  for (int r = 0; r < N; ++r) {
    for (int i = 0; i < C; ++i) {
      ASSERT_EQ(out[r * C + i], wte[tokens[r] * C + i]);
    }
  }
  const auto dout = Random(N * C, 16);
  std::vector<float> dwte(V * C, 0.5f);
  EmbedBackwardAccumulate(dwte.data(), dout.data(), tokens.data(), N, C);
  for (int v = 0; v < V; ++v) {
    for (int i = 0; i < C; ++i) {
      double want = 0.5;
      for (int r = 0; r < N; ++r) {
        if (tokens[r] == v) want += dout[r * C + i];
      }
      ASSERT_NEAR(dwte[v * C + i], want, 1e-6);
    }
  }
}

MS_INSTANTIATE_ISA_LEVELS(LlamaOpsTest);

}  // namespace
}  // namespace multislice::compute::llama
