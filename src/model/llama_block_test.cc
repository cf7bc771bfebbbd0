// The Llama family's decoder against a plain-loop implementation of its
// definition in double, written here from the formulas (Llama 2's and
// MaxText's: RMSNorm, rotary embeddings on q and k by rotating halves,
// grouped key/value heads, SwiGLU or GeGLU, tied or untied head), and the
// parameter counts of the published shapes (CTest runs it again under each
// ISA cap).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "compute/random.h"
#include "model/decoder.h"
#include "model/decoder_testing.h"

namespace multislice::model {
namespace {

using testing::GemmaShape;
using testing::LlamaShape;

TEST(LlamaBlockTest, PublishedShapesHaveTheirParameterCounts) {
  // Llama 2 7B, Mistral 7B and Gemma 2B as their model cards count them.
  const DecoderConfig llama2_7b =
      LlamaShape(32000, 4096, 4096, 32, 32, 128, 32, 11008);
  EXPECT_EQ(NumParameters(llama2_7b), int64_t{6738415616});
  DecoderConfig mistral_7b =
      LlamaShape(32000, 32768, 4096, 32, 8, 128, 32, 14336);
  mistral_7b.block = BlockKind::kMistral;
  EXPECT_EQ(NumParameters(mistral_7b), int64_t{7241732096});
  const DecoderConfig gemma_2b =
      GemmaShape(256000, 8192, 2048, 8, 1, 256, 18, 16384);
  EXPECT_EQ(NumParameters(gemma_2b), int64_t{2506172416});
  // MaxText pads Gemma's vocabulary of 256,000 to 256,128 rows.
  DecoderConfig padded = gemma_2b;
  padded.vocab_size = 256128;
  EXPECT_EQ(NumParameters(padded), int64_t{2506172416} + 128 * 2048);
}

// The decoder's logits by the definition, in double.
class Reference {
 public:
  Reference(const DecoderConfig& c, const std::vector<float>& params)
      : c_(c), p_(params), layout_(ParameterLayout(c)) {}

  std::vector<double> Logits(const std::vector<int32_t>& tokens) const {
    const int T = static_cast<int>(tokens.size()), C = c_.emb_dim;
    std::vector<std::vector<double>> x(T, std::vector<double>(C));
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < C; ++i) x[t][i] = W("wte", tokens[t] * C + i);
    }
    for (int l = 0; l < c_.num_layers; ++l) Layer(l, x);
    const std::string head = c_.tied_embedding ? "wte" : "lm_head";
    const double scale = c_.tied_embedding && c_.normalize_embedding_logits
                             ? 1.0 / std::sqrt(double{1.0} * C)
                             : 1.0;
    std::vector<double> logits;
    for (int t = 0; t < T; ++t) {
      const std::vector<double> y = Norm(x[t], "lnf.w");
      for (int v = 0; v < c_.vocab_size; ++v) {
        double s = 0;
        for (int i = 0; i < C; ++i) s += y[i] * W(head, v * C + i);
        logits.push_back(s * scale);
      }
    }
    return logits;
  }

 private:
  double W(const std::string& name, int64_t i) const {
    for (const ParamTensor& t : layout_) {
      if (t.name == name) return p_[t.offset + i];
    }
    ADD_FAILURE() << "no tensor " << name;
    return 0;
  }
  std::vector<double> Norm(const std::vector<double>& x,
                           const std::string& weight) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / x.size() + c_.norm_epsilon);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * W(weight, i);
    return y;
  }
  // y = x W for W [in, out] stored at `name`.
  std::vector<double> Linear(const std::vector<double>& x,
                             const std::string& name, int out) const {
    std::vector<double> y(out, 0.0);
    for (size_t i = 0; i < x.size(); ++i) {
      for (int j = 0; j < out; ++j) y[j] += x[i] * W(name, i * out + j);
    }
    return y;
  }
  // Rotates head h's pair (i, i + hd/2) of v at position t.
  void Rotate(std::vector<double>& v, int head, int t) const {
    const int hd = c_.head_dim;
    for (int i = 0; i < hd / 2; ++i) {
      const double angle = t / std::pow(c_.rope_max_timescale, 2.0 * i / hd);
      const double a = v[head * hd + i], b = v[head * hd + i + hd / 2];
      v[head * hd + i] = a * std::cos(angle) - b * std::sin(angle);
      v[head * hd + i + hd / 2] = b * std::cos(angle) + a * std::sin(angle);
    }
  }
  double Act(double g) const {
    if (c_.mlp_activation == Activation::kSilu) return g / (1 + std::exp(-g));
    return 0.5 * g *
           (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
  }
  void Layer(int l, std::vector<std::vector<double>>& x) const {
    const std::string p = "h" + std::to_string(l) + ".";
    const int T = static_cast<int>(x.size()), C = c_.emb_dim, hd = c_.head_dim;
    const int NH = c_.num_heads, NKV = c_.num_kv_heads, H = c_.mlp_dim;
    const int W_qkv = (NH + 2 * NKV) * hd;
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      const std::vector<double> qkv =
          Linear(Norm(x[t], p + "attn_norm.w"), p + "qkv.w", W_qkv);
      q[t].assign(qkv.begin(), qkv.begin() + NH * hd);
      k[t].assign(qkv.begin() + NH * hd, qkv.begin() + (NH + NKV) * hd);
      v[t].assign(qkv.begin() + (NH + NKV) * hd, qkv.end());
      for (int h = 0; h < NH; ++h) Rotate(q[t], h, t);
      for (int g = 0; g < NKV; ++g) Rotate(k[t], g, t);
    }
    for (int t = 0; t < T; ++t) {
      std::vector<double> att_out(NH * hd, 0.0);
      for (int h = 0; h < NH; ++h) {
        const int g = h / (NH / NKV);
        std::vector<double> s(t + 1);
        double mx = -INFINITY, denom = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0;
          for (int i = 0; i < hd; ++i)
            dot += q[t][h * hd + i] * k[t2][g * hd + i];
          s[t2] = dot / std::sqrt(double{1.0} * hd);
          mx = std::max(mx, s[t2]);
        }
        for (double& e : s) denom += (e = std::exp(e - mx));
        for (int t2 = 0; t2 <= t; ++t2) {
          for (int i = 0; i < hd; ++i) {
            att_out[h * hd + i] += s[t2] / denom * v[t2][g * hd + i];
          }
        }
      }
      const std::vector<double> proj = Linear(att_out, p + "attn_proj.w", C);
      for (int i = 0; i < C; ++i) x[t][i] += proj[i];
      const std::vector<double> gu =
          Linear(Norm(x[t], p + "mlp_norm.w"), p + "gate_up.w", 2 * H);
      std::vector<double> h(H);
      for (int i = 0; i < H; ++i) h[i] = Act(gu[i]) * gu[H + i];
      const std::vector<double> down = Linear(h, p + "down.w", C);
      for (int i = 0; i < C; ++i) x[t][i] += down[i];
    }
  }

  const DecoderConfig c_;
  const std::vector<float>& p_;
  const std::vector<ParamTensor> layout_;
};

struct Named {
  const char* name;
  DecoderConfig config;
};

TEST(LlamaBlockTest, LogitsMatchThePlainLoopDefinition) {
  const DecoderConfig gemma = GemmaShape(17, 9, 12, 4, 1, 6, 2, 20);
  DecoderConfig llama = LlamaShape(17, 9, 12, 4, 2, 4, 2, 20);
  llama.rope_max_timescale = 50;
  const Named cases[] = {{"llama2 GQA, untied", llama},
                         {"gemma MQA, tied and normalised", gemma}};
  for (const Named& n : cases) {
    SCOPED_TRACE(n.name);
    const DecoderConfig& c = n.config;
    ASSERT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c).message();
    std::vector<float> params(NumParameters(c));
    InitParameters(c, 3, params.data());
    // Norm weights away from 1 and weights larger than the init, so that
    // every term shows.
    for (size_t i = 0; i < params.size(); ++i) {
      params[i] += 0.2f * compute::NormalAt(4, 0, i);
    }
    const std::vector<int32_t> tokens = {3, 16, 0, 7, 7, 2, 11, 5, 9};
    Decoder model(c);
    ASSERT_TRUE(model
                    .Forward(params.data(), tokens.data(), nullptr, 1,
                             static_cast<int>(tokens.size()))
                    .ok());
    const std::vector<double> want = Reference(c, params).Logits(tokens);
    double max_abs = 0;
    for (double w : want) max_abs = std::max(max_abs, std::fabs(w));
    ASSERT_GT(max_abs, 0.1);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(model.logits()[i], want[i], 1e-5 * (1 + max_abs))
          << "logit " << i;
    }
  }
}

TEST(LlamaBlockTest, BadShapesAreOneSentence) {
  DecoderConfig c = LlamaShape(17, 9, 12, 4, 3, 4, 2, 20);
  EXPECT_EQ(ValidateConfig(c).message(),
            "num_kv_heads 3 does not divide num_heads 4: each key/value head "
            "serves an equal group of query heads");
  c.num_kv_heads = 2;
  c.head_dim = 5;
  EXPECT_EQ(ValidateConfig(c).message(),
            "head_dim 5 is odd; rotary embeddings rotate pairs of channels, so "
            "it must be even");
  c.head_dim = 4;
  c.gated_mlp = false;
  EXPECT_EQ(ValidateConfig(c).message(),
            "the llama2 block's MLP is gated: mlp_activations [silu, linear] "
            "or [gelu, linear]");
}

}  // namespace
}  // namespace multislice::model
