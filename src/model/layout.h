// The decoder's parameters as one flat f32 buffer: every tensor at a fixed
// offset, for the whole model, one tensor-parallel rank or one pipeline
// stage; the initial values; the weight-decay mask.
//
// Order: the embeddings (wte [V,C]; gpt3 also wpe [max_seq_len,C]), the
// layers' tensors (model/block.h lists each block's, named "h<l>.<name>"),
// the final norm (lnf.w, and gpt3's lnf.b [C]), and, for an untied head,
// lm_head [V,C] (logits = x lm_head^T, as Hugging Face stores it). Linear
// weights are [in, out].
//
// With tensor parallelism t the layout of one rank: the same tensors in the
// same order, a split tensor holding its rank's share (ParamTensor::split;
// model/tensor_shard.h maps it to the whole tensor), every other tensor
// whole. With pipeline stages (PipelineStage) the layout of one stage: the
// tensors it holds, in the same order, contiguous from 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/decoder_config.h"

namespace multislice::model {

// How tensor parallelism (Megatron) splits a tensor over t ranks.
enum class TensorSplit {
  kWhole,    // every rank holds all of it
  kColumns,  // each column block (e.g. q | k | v) split t ways by columns
  kRows,     // split t ways by rows (the first dimension)
};

// How InitParameters fills a tensor.
enum class TensorInit {
  kNormal,     // normal, std 0.02
  kResidual,   // normal, std 0.02 / sqrt(2 num_layers): projections into the
               // residual stream
  kEmbedding,  // normal, std 1/sqrt(C): the Llama family's wte (MaxText's
               // variance scaling over C), whose tied logits may be divided by
               // sqrt(C)
  kZero,       // biases
  kOne,        // norm weights
};

// One tensor of the flat buffer: elements [offset, offset + size),
// row-major with `shape` (the rank's share under tensor parallelism).
struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t size = 0;
  TensorSplit split = TensorSplit::kWhole;
  // kColumns: the widths of the whole tensor's column blocks, in order
  // (one block: the whole width); each is split t ways.
  std::vector<int64_t> column_blocks;
  TensorInit init = TensorInit::kNormal;
};

// Which part of the network a pipeline stage runs (GPipe/Megatron): stage s
// of p holds the L / p consecutive layers [s L/p, (s+1) L/p); the first
// stage also the embeddings, the last the final norm and the head. A tied
// head's weight is wte: the last stage holds its own copy, and the two
// copies stay equal because the trainer sums their gradients (both stages
// then apply the same update). p = 1 is the whole model.
struct PipelineStage {
  int index = 0;
  int count = 1;
  bool first() const { return index == 0; }
  bool last() const { return index == count - 1; }
};

std::vector<ParamTensor> ParameterLayout(const DecoderConfig& config,
                                         int tensor_parallelism = 1,
                                         const PipelineStage& stage = {});
int64_t NumParameters(const DecoderConfig& config, int tensor_parallelism = 1,
                      const PipelineStage& stage = {});

// kInvalidArgument naming the values unless `stages` (>= 1) divides
// num_layers.
Status ValidatePipeline(const DecoderConfig& config, int stages);

// Writes all NumParameters(config) values by each tensor's TensorInit.
// Tensor i of the whole layout draws from counter-based stream i of `seed`
// (compute/random.h), so the result depends only on (config, seed).
void InitParameters(const DecoderConfig& config, uint64_t seed, float* params);

// 1 for the tensors AdamW should decay (the 2-D weights and embeddings), 0
// for biases and norm weights; one entry per value of the rank's and the
// stage's layout.
std::vector<uint8_t> WeightDecayMask(const DecoderConfig& config,
                                     int tensor_parallelism = 1,
                                     const PipelineStage& stage = {});

}  // namespace multislice::model
