// The Llama block (MaxText's decoder_block llama2, and mistral and gemma,
// which differ in their configuration only): pre-RMSNorm, fused q|k|v
// without biases and with grouped key/value heads, rotary position
// embeddings on q and k, causal attention, and a gated MLP
// (act(x W_gate) * (x W_up)) W_down with act SiLU (SwiGLU) or GELU (GeGLU):
//
//   x += attn_proj(attention(rope(qkv(attn_norm(x)))))
//   x += down(act(gate(mlp_norm(x))) * up(mlp_norm(x)))
//
// Its tensors, per layer, on a rank of t: attn_norm.w [C], qkv.w
// [C, (heads + 2 kv_heads) hd / t] (columns: q | k | v), attn_proj.w
// [heads hd / t, C], mlp_norm.w [C], gate_up.w [C, 2 mlp / t] (columns:
// gate | up), down.w [mlp / t, C]. qkv and gate_up are split by columns in
// each block, attn_proj and down by rows (their partial sums all-reduced);
// rank 0 adds the residual.
#pragma once

#include <memory>
#include <vector>

#include "model/block.h"

namespace multislice::model {

std::vector<TensorSpec> LlamaBlockTensors(const DecoderConfig& config, int t);

std::unique_ptr<DecoderBlock> MakeLlamaBlock(const DecoderConfig& config,
                                             int layers, TensorParallel tensor,
                                             MatmulRunner* matmul);

}  // namespace multislice::model
