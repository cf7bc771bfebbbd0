// The blocks of each kind, and what every block shares.
#include "model/block.h"

#include <utility>

#include "model/gpt_block.h"
#include "model/llama_block.h"

namespace multislice::model {

std::vector<TensorSpec> BlockTensors(const DecoderConfig& config, int t) {
  if (config.block == BlockKind::kGpt3) return GptBlockTensors(config, t);
  return LlamaBlockTensors(config, t);
}

std::vector<int64_t> TensorOffsets(const std::vector<TensorSpec>& tensors) {
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (const TensorSpec& s : tensors) {
    offsets.push_back(offset);
    int64_t size = 1;
    for (int64_t d : s.shape) size *= d;
    offset += size;
  }
  return offsets;
}

Status ValidateBlockTensorParallelism(const DecoderConfig& c, int t) {
  if (t < 1) {
    return InvalidArgument("tensor parallelism " + std::to_string(t) +
                           ": expected at least 1");
  }
  if (c.num_heads % t != 0 || c.num_kv_heads % t != 0 || c.mlp_dim % t != 0) {
    const bool grouped = c.num_kv_heads != c.num_heads;
    return InvalidArgument(
        "tensor parallelism " + std::to_string(t) + " must divide num_heads (" +
        std::to_string(c.num_heads) + ")" +
        (grouped ? ", num_kv_heads (" + std::to_string(c.num_kv_heads) + ")"
                 : std::string()) +
        " and mlp_dim (" + std::to_string(c.mlp_dim) +
        "): each rank holds whole heads and an equal part of the MLP");
  }
  return OkStatus();
}

Status TensorParallel::AllReduce(float* buf, int64_t count) const {
  if (size == 1) return OkStatus();
  return all_reduce(buf, count);
}

TensorParallel::Wait TensorParallel::StartAllReduce(float* buf,
                                                    int64_t count) const {
  if (size > 1 && start_all_reduce) return start_all_reduce(buf, count);
  Status done = AllReduce(buf, count);
  return [done] { return done; };
}

std::unique_ptr<DecoderBlock> MakeBlock(const DecoderConfig& config, int layers,
                                        TensorParallel tensor,
                                        MatmulRunner* matmul) {
  if (config.block == BlockKind::kGpt3) {
    return MakeGptBlock(config, layers, std::move(tensor), matmul);
  }
  return MakeLlamaBlock(config, layers, std::move(tensor), matmul);
}

}  // namespace multislice::model
