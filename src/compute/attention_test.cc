// Tests of attention.h: the matmul formulation against the straightforward
// per-query loops in double (llm.c's attention, written for grouped query
// heads), the backward against central finite differences of the forward,
// the causal mask, and bf16 operands, on every ISA level.
#include "compute/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/isa_testing.h"
#include "compute/elementwise.h"
#include "compute/op_testing.h"

namespace multislice::compute {
namespace {

using AttentionTest = IsaLevelTest;
using namespace compute::testing;  // NOLINT

AttentionShape Shape(int B, int T, int heads, int kv_heads, int head_dim) {
  AttentionShape s;
  s.B = B;
  s.T = T;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  return s;
}

std::size_t Rows(const AttentionShape& s) {
  return static_cast<std::size_t>(s.B) * s.T;
}

struct AttentionBuffers {
  AttentionShape shape;
  DType type = DType::kF32;
  std::vector<float> out, att, scratch;

  explicit AttentionBuffers(const AttentionShape& s,
                            DType matmul_type = DType::kF32)
      : shape(s), type(matmul_type) {
    out.assign(Rows(s) * s.out_width(), 0.0f);
    att.assign(static_cast<std::size_t>(s.B) * s.heads * s.T * s.T, 0.0f);
    scratch.assign(AttentionScratchSize(s, type), 0.0f);
  }

  void Forward(const std::vector<float>& qkv,
               const std::uint16_t* qkv16 = nullptr) {
    ASSERT_TRUE(AttentionForward(out.data(), att.data(), scratch.data(),
                                 qkv.data(), shape, type, qkv16)
                    .ok());
  }
  void Backward(std::vector<float>& dqkv, const std::vector<float>& dout,
                const std::vector<float>& qkv,
                const std::uint16_t* qkv16 = nullptr) {
    ASSERT_TRUE(AttentionBackward(dqkv.data(), scratch.data(), dout.data(),
                                  qkv.data(), att.data(), shape, type, qkv16)
                    .ok());
  }
};

// The per-query loops in double. att rows are zero above the diagonal;
// dqkv accumulates from zero.
struct Reference {
  std::vector<double> out, att, dqkv;
};

Reference ReferenceAttention(const std::vector<float>& qkv,
                             const std::vector<float>& dout,
                             const AttentionShape& s) {
  const int B = s.B, T = s.T, NH = s.heads, hd = s.head_dim;
  const int group = s.heads / s.kv_heads;
  const std::size_t W = s.qkv_width(), O = s.out_width();
  const double scale = 1.0 / std::sqrt(double{1.0} * hd);
  Reference r;
  r.out.assign(Rows(s) * O, 0.0);
  r.att.assign(static_cast<std::size_t>(B) * NH * T * T, 0.0);
  r.dqkv.assign(qkv.size(), 0.0);
  auto q_at = [&](int b, int t, int h, int i) {
    return (static_cast<std::size_t>(b) * T + t) * W + h * hd + i;
  };
  auto k_at = [&](int b, int t, int h, int i) {
    return (static_cast<std::size_t>(b) * T + t) * W + (NH + h / group) * hd +
           i;
  };
  auto v_at = [&](int b, int t, int h, int i) {
    return k_at(b, t, h, i) + static_cast<std::size_t>(s.kv_heads) * hd;
  };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        double* a =
            &r.att[((static_cast<std::size_t>(b) * NH + h) * T + t) * T];
        double mx = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0.0;
          for (int i = 0; i < hd; ++i) {
            dot += double{qkv[q_at(b, t, h, i)]} * qkv[k_at(b, t2, h, i)];
          }
          a[t2] = dot * scale;
          mx = std::max(mx, a[t2]);
        }
        double denom = 0.0;
        for (int t2 = 0; t2 <= t; ++t2) {
          a[t2] = std::exp(a[t2] - mx);
          denom += a[t2];
        }
        for (int t2 = 0; t2 <= t; ++t2) a[t2] /= denom;
        double* o = &r.out[(static_cast<std::size_t>(b) * T + t) * O + h * hd];
        for (int t2 = 0; t2 <= t; ++t2) {
          for (int i = 0; i < hd; ++i) o[i] += a[t2] * qkv[v_at(b, t2, h, i)];
        }
        // Backward of this query.
        const float* dy =
            &dout[(static_cast<std::size_t>(b) * T + t) * O + h * hd];
        std::vector<double> da(t + 1);
        for (int t2 = 0; t2 <= t; ++t2) {
          for (int i = 0; i < hd; ++i) {
            da[t2] += double{dy[i]} * qkv[v_at(b, t2, h, i)];
            r.dqkv[v_at(b, t2, h, i)] += a[t2] * dy[i];
          }
        }
        double a_da = 0.0;
        for (int t2 = 0; t2 <= t; ++t2) a_da += a[t2] * da[t2];
        for (int t2 = 0; t2 <= t; ++t2) {
          const double ds = a[t2] * (da[t2] - a_da) * scale;
          for (int i = 0; i < hd; ++i) {
            r.dqkv[q_at(b, t, h, i)] += ds * qkv[k_at(b, t2, h, i)];
            r.dqkv[k_at(b, t2, h, i)] += ds * qkv[q_at(b, t, h, i)];
          }
        }
      }
    }
  }
  return r;
}

std::string Name(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " heads=" + std::to_string(s.heads) +
         " kv_heads=" + std::to_string(s.kv_heads) +
         " head_dim=" + std::to_string(s.head_dim);
}

// Small shapes for the finite differences; the first is GPT-2's multi-head
// attention (kv_heads == heads), the others grouped and multi-query.
const AttentionShape kSmall[] = {Shape(2, 3, 2, 2, 4), Shape(2, 3, 4, 2, 3),
                                 Shape(1, 4, 2, 1, 5)};

TEST_P(AttentionTest, BackwardMatchesFiniteDifferences) {
  for (const AttentionShape& s : kSmall) {
    SCOPED_TRACE(Name(s));
    auto qkv = Random(Rows(s) * s.qkv_width(), 12, -2.0f, 2.0f);
    const auto r = Random(Rows(s) * s.out_width(), 13);
    AttentionBuffers buf(s);
    auto f = [&] {
      buf.Forward(qkv);
      return Dot(buf.out, r);
    };
    f();
    auto dqkv = Seeded(qkv.size());
    buf.Backward(dqkv, r, qkv);
    ExpectGradient(qkv, f, dqkv, "dqkv");
  }
}

TEST_P(AttentionTest, IsCausal) {
  for (const AttentionShape& s : kSmall) {
    SCOPED_TRACE(Name(s));
    const auto qkv = Random(Rows(s) * s.qkv_width(), 11, -2.0f, 2.0f);
    AttentionBuffers base(s);
    base.Forward(qkv);
    const std::size_t W = s.qkv_width(), O = s.out_width();
    // Changing any input at position t' leaves outputs at t < t' untouched.
    for (int b = 0; b < s.B; ++b) {
      for (int later = 1; later < s.T; ++later) {
        auto changed = qkv;
        for (std::size_t j = 0; j < W; ++j)
          changed[(b * s.T + later) * W + j] += 0.5f;
        AttentionBuffers buf(s);
        buf.Forward(changed);
        for (int t = 0; t < later; ++t) {
          for (std::size_t i = 0; i < O; ++i) {
            EXPECT_EQ(buf.out[(b * s.T + t) * O + i],
                      base.out[(b * s.T + t) * O + i]);
          }
        }
        bool later_changed = false;
        for (std::size_t i = 0; i < O; ++i) {
          later_changed |= buf.out[(b * s.T + later) * O + i] !=
                           base.out[(b * s.T + later) * O + i];
        }
        EXPECT_TRUE(later_changed);
      }
    }
  }
}

// The matmul formulation against the per-query loops, forward and backward,
// on sizes whose rows are not multiples of the 16-lane vectors, past the
// causal block of 64 rows, and with large scores (so that the softmax's max
// subtraction matters).
TEST_P(AttentionTest, MatchesLoopReference) {
  struct Case {
    AttentionShape shape;
    float range;
  };
  for (const Case& c :
       {Case{Shape(2, 37, 3, 3, 16), 1.0f}, Case{Shape(1, 64, 2, 2, 32), 2.0f},
        Case{Shape(2, 17, 1, 1, 24), 4.0f}, Case{Shape(1, 70, 4, 2, 16), 2.0f},
        Case{Shape(2, 33, 6, 1, 8), 2.0f},
        Case{Shape(1, 19, 4, 4, 20), 1.0f}}) {
    const AttentionShape& s = c.shape;
    SCOPED_TRACE(Name(s));
    const auto qkv = Random(Rows(s) * s.qkv_width(), 40, -c.range, c.range);
    const auto dout = Random(Rows(s) * s.out_width(), 41, -1.0f, 1.0f);
    const Reference ref = ReferenceAttention(qkv, dout, s);
    AttentionBuffers buf(s);
    buf.Forward(qkv);
    for (std::size_t i = 0; i < ref.att.size(); ++i) {
      const int t = static_cast<int>(i / s.T % s.T);
      const int t2 = static_cast<int>(i % s.T);
      if (t2 > t) {
        ASSERT_EQ(buf.att[i], 0.0f) << "att[" << i << "] above the diagonal";
      } else {
        ASSERT_NEAR(buf.att[i], ref.att[i], 1e-6 + 1e-5 * ref.att[i]) << i;
      }
    }
    for (std::size_t i = 0; i < ref.out.size(); ++i) {
      ASSERT_NEAR(buf.out[i], ref.out[i], 2e-5 + 1e-5 * std::fabs(ref.out[i]))
          << i;
    }
    auto dqkv = Seeded(qkv.size());
    buf.Backward(dqkv, dout, qkv);
    for (std::size_t i = 0; i < dqkv.size(); ++i) {
      ASSERT_NEAR(dqkv[i] - kGradSeed, ref.dqkv[i],
                  2e-5 + 1e-4 * std::fabs(ref.dqkv[i]))
          << i;
    }

    // bf16 operands: the same values to bf16's ~3 significant digits.
    AttentionBuffers buf16(s, DType::kBF16);
    buf16.Forward(qkv);
    double err = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < ref.out.size(); ++i) {
      err += (buf16.out[i] - ref.out[i]) * (buf16.out[i] - ref.out[i]);
      norm += ref.out[i] * ref.out[i];
    }
    EXPECT_LT(std::sqrt(err), 2e-2 * std::sqrt(norm));
    for (std::size_t i = 0; i < ref.att.size(); ++i) {
      if (i % s.T > i / s.T % s.T) {
        ASSERT_EQ(buf16.att[i], 0.0f);
      }
    }
    auto dqkv16 = std::vector<float>(qkv.size(), 0.0f);
    buf16.Backward(dqkv16, dout, qkv);
    err = norm = 0.0;
    for (std::size_t i = 0; i < dqkv16.size(); ++i) {
      err += (dqkv16[i] - ref.dqkv[i]) * (dqkv16[i] - ref.dqkv[i]);
      norm += ref.dqkv[i] * ref.dqkv[i];
    }
    EXPECT_LT(std::sqrt(err), 3e-2 * std::sqrt(norm));

    // A caller's bf16 copy of qkv gives the same bits as rounding inside.
    std::vector<std::uint16_t> qkv16(qkv.size());
    ToBf16(qkv.data(), qkv16.data(), static_cast<std::int64_t>(qkv.size()));
    AttentionBuffers given(s, DType::kBF16);
    given.Forward(qkv, qkv16.data());
    std::vector<float> dqkv_given(qkv.size(), 0.0f);
    given.Backward(dqkv_given, dout, qkv, qkv16.data());
    EXPECT_EQ(given.out, buf16.out);
    EXPECT_EQ(given.att, buf16.att);
    EXPECT_EQ(dqkv_given, dqkv16);
  }
}

MS_INSTANTIATE_ISA_LEVELS(AttentionTest);

}  // namespace
}  // namespace multislice::compute
