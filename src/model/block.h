// A decoder block: one layer of the residual stream, x -> x + f(x), forward
// and backward on one device (the decoder, model/decoder.h, runs a stage's
// layers through one DecoderBlock). Each kind of model/decoder_config.h is
// one implementation: GptBlock (gpt3, gpt_block.h) and LlamaBlock (llama2,
// mistral and gemma, llama_block.h).
//
// A block lists the tensors of one layer (BlockTensors), keeps the
// activations of every layer it ran forward until their backward, and
// computes through the shared MatmulRunner (its bf16 or f32 matmuls) and the
// kernels of compute/. Under tensor parallelism a block is its rank's part
// (Megatron: attention heads and MLP columns split, the row-parallel
// projections' partial sums all-reduced).
//
// Not thread-safe: one block per model, one model per device thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/decoder_config.h"
#include "model/layout.h"

namespace multislice::model {

class MatmulRunner;

// One tensor of a layer: `name` without the "h<l>." prefix, the rank's
// shape, and how it is split and initialised (layout.h).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  TensorSplit split = TensorSplit::kWhole;
  std::vector<int64_t> column_blocks;
  TensorInit init = TensorInit::kNormal;
};

// The tensors of one layer of config's block on a rank of t, in layout
// order.
std::vector<TensorSpec> BlockTensors(const DecoderConfig& config, int t);

// Where each of `tensors` starts in its layer, counting from 0.
std::vector<int64_t> TensorOffsets(const std::vector<TensorSpec>& tensors);

// kInvalidArgument naming the values unless the block's heads, key/value
// heads and MLP width divide by t (>= 1).
Status ValidateBlockTensorParallelism(const DecoderConfig& config, int t);

// How one rank of t takes part in a Megatron-style tensor-parallel model:
// all_reduce sums a buffer over the t ranks in place, every rank getting the
// same values; the forward pass calls it after the attention's and the
// MLP's output projections, the backward pass on the input gradients of
// their input projections. If set, start_all_reduce starts the same
// all-reduce and returns what waits for it: the backward overlaps each
// input gradient's all-reduce with the weight gradient's matmul (Megatron's
// overlap; the forward's results are needed at once).
struct TensorParallel {
  using Wait = std::function<Status()>;
  int size = 1;
  int rank = 0;
  std::function<Status(float* buf, int64_t count)> all_reduce;
  std::function<Wait(float* buf, int64_t count)> start_all_reduce;

  // Sums buf over the group (nothing without tensor parallelism); the Start
  // form returns what waits for the sum.
  Status AllReduce(float* buf, int64_t count) const;
  Wait StartAllReduce(float* buf, int64_t count) const;
};

// A layer's parameters: its first tensor in the flat f32 buffer and, with
// bf16 matmuls, the same offset of the buffer's bf16 copy (else null).
struct LayerParams {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
};

class DecoderBlock {
 public:
  virtual ~DecoderBlock() = default;

  // Sizes the activations of the stage's layers for B x T tokens; called
  // before the first Forward and whenever (B, T) change.
  virtual void Resize(int B, int T) = 0;

  // Layer l's output (Output(l), [B,T,C]) from its input `in` [B,T,C],
  // keeping what Backward(l) needs; `in` must stay unchanged until then.
  // kInternal if a matmul or a tensor all-reduce fails.
  virtual Status Forward(int l, const LayerParams& params, const float* in) = 0;
  virtual const float* Output(int l) const = 0;

  // dresidual [B,T,C] holds d(loss)/d(Output(l)) on entry and
  // d(loss)/d(in) on exit; grads (the layer's first tensor in the gradient
  // buffer) gets every entry of the layer's gradient written (=). Needs
  // Forward(l) since the last Resize, on the same params and in.
  virtual Status Backward(int l, const LayerParams& params, float* grads,
                          const float* in, float* dresidual) = 0;
};

// The block of config's kind for the stage's `layers` layers, on rank
// tensor.rank of tensor.size, running its matmuls through `matmul` (which
// must outlive it).
std::unique_ptr<DecoderBlock> MakeBlock(const DecoderConfig& config, int layers,
                                        TensorParallel tensor,
                                        MatmulRunner* matmul);

}  // namespace multislice::model
