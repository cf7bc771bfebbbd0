// What the decoder's tests share: the shapes of each block kind, a fixed
// batch, and AdamW training on it. Tests only.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "compute/adamw.h"
#include "compute/random.h"
#include "model/decoder.h"
#include "model/schedule.h"

namespace multislice::model::testing {

// A Llama block: SwiGLU, rotary embeddings (a short timescale, so that
// short test sequences rotate visibly), an untied head.
inline DecoderConfig LlamaShape(int V, int T, int C, int heads, int kv_heads,
                                int head_dim, int L, int mlp) {
  DecoderConfig c;
  c.block = BlockKind::kLlama2;
  c.vocab_size = V;
  c.max_seq_len = T;
  c.emb_dim = C;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.num_layers = L;
  c.mlp_dim = mlp;
  c.mlp_activation = Activation::kSilu;
  c.gated_mlp = true;
  c.tied_embedding = false;
  c.rope_max_timescale = 100;
  return c;
}

// A Gemma block: GeGLU, a tied head whose logits are divided by sqrt(C).
inline DecoderConfig GemmaShape(int V, int T, int C, int heads, int kv_heads,
                                int head_dim, int L, int mlp) {
  DecoderConfig c = LlamaShape(V, T, C, heads, kv_heads, head_dim, L, mlp);
  c.block = BlockKind::kGemma;
  c.mlp_activation = Activation::kGelu;
  c.tied_embedding = true;
  c.normalize_embedding_logits = true;
  c.norm_epsilon = 1e-6;
  return c;
}

// A fixed batch of B rows of T tokens; targets are the next token.
struct Batch {
  std::vector<int32_t> tokens, targets;
};

inline Batch MakeBatch(int B, int T, int V, uint64_t seed) {
  std::vector<int32_t> stream;
  for (int i = 0; i < B * (T + 1); ++i) {
    stream.push_back(static_cast<int32_t>(
        compute::UniformAt(seed, 7, static_cast<uint64_t>(i)) * V));
  }
  Batch b;
  for (int r = 0; r < B; ++r) {
    for (int t = 0; t < T; ++t) {
      b.tokens.push_back(stream[r * (T + 1) + t]);
      b.targets.push_back(stream[r * (T + 1) + t + 1]);
    }
  }
  return b;
}

// Trains on one fixed batch of 2 rows with clipped AdamW; returns the losses
// of every step.
inline std::vector<float> Train(const DecoderConfig& c, uint64_t seed,
                                int steps, DType matmul_type = DType::kF32) {
  const int B = 2, T = c.max_seq_len;
  const int64_t n = NumParameters(c);
  std::vector<float> params(n), grads(n), m(n, 0.0f), v(n, 0.0f);
  InitParameters(c, seed, params.data());
  const std::vector<uint8_t> mask = WeightDecayMask(c);
  const Batch batch = MakeBatch(B, T, c.vocab_size, seed + 1);
  Decoder model(c, matmul_type);
  std::vector<float> losses;
  for (int step = 1; step <= steps; ++step) {
    Result<float> loss = model.Forward(params.data(), batch.tokens.data(),
                                       batch.targets.data(), B, T);
    EXPECT_TRUE(loss.ok());
    losses.push_back(*loss);
    EXPECT_TRUE(model.Backward(params.data(), grads.data()).ok());
    const float scale = ClipScale(compute::GlobalNorm(grads.data(), n), 1.0f);
    for (float& g : grads) g *= scale;
    compute::AdamWOptions options;
    options.lr = 1e-2f;
    options.weight_decay = 0.0f;
    compute::AdamWUpdate(params.data(), grads.data(), m.data(), v.data(), n,
                         options, step, mask.data());
  }
  return losses;
}

}  // namespace multislice::model::testing
