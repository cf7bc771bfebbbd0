// The GPT-2 block (MaxText's decoder_block gpt3): pre-LayerNorm with biases,
// fused q|k|v with a bias, multi-head causal attention, GELU MLP with biases:
//
//   x += attn_proj(attention(qkv(ln1(x))));  x += fc_proj(gelu(fc(ln2(x))))
//
// Its tensors, per layer: ln1.w, ln1.b [C], qkv.w [C,3A], qkv.b [3A],
// attn_proj.w [A,C], attn_proj.b [C], ln2.w, ln2.b [C], fc.w [C,H], fc.b
// [H], fc_proj.w [H,C], fc_proj.b [C], with A = C/t and H = mlp_dim/t on a
// rank of t (qkv and fc split by columns, attn_proj.w and fc_proj.w by rows;
// rank 0 adds the row-parallel biases and the residual).
#pragma once

#include <memory>
#include <vector>

#include "model/block.h"

namespace multislice::model {

std::vector<TensorSpec> GptBlockTensors(const DecoderConfig& config, int t);

std::unique_ptr<DecoderBlock> MakeGptBlock(const DecoderConfig& config,
                                           int layers, TensorParallel tensor,
                                           MatmulRunner* matmul);

}  // namespace multislice::model
