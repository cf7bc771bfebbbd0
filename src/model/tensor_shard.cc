#include "model/tensor_shard.h"

#include <algorithm>
#include <vector>

namespace multislice::model::gpt {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

enum class Split { kWhole, kColumns, kQkvColumns, kRows };

Split SplitOf(const std::string& name) {
  if (EndsWith(name, "qkv.w") || EndsWith(name, "qkv.b")) {
    return Split::kQkvColumns;
  }
  if (EndsWith(name, "fc.w") || EndsWith(name, "fc.b")) return Split::kColumns;
  if (EndsWith(name, "attn_proj.w") || EndsWith(name, "fc_proj.w")) {
    return Split::kRows;
  }
  return Split::kWhole;
}

// Calls copy(whole_index, local_index, count) for each run of values of
// tensor `w` (whole) that its rank-r part `l` holds.
template <typename Copy>
void ForEachRun(const ParamTensor& w, const ParamTensor& l, int t, int r,
                const Copy& copy) {
  const Split split = SplitOf(w.name);
  if (split == Split::kWhole) {
    copy(w.offset, l.offset, w.size);
    return;
  }
  if (split == Split::kRows) {
    // The rank's rows of [rows, cols]: one contiguous run.
    copy(w.offset + r * l.size, l.offset, l.size);
    return;
  }
  const int64_t whole_cols = w.shape.back();
  const int64_t n_rows = w.shape.size() == 2 ? w.shape[0] : 1;
  const int blocks = split == Split::kQkvColumns ? 3 : 1;
  const int64_t block = whole_cols / blocks, part = block / t;
  const int64_t local_cols = part * blocks;
  for (int64_t i = 0; i < n_rows; ++i) {
    for (int b = 0; b < blocks; ++b) {
      copy(w.offset + i * whole_cols + b * block + r * part,
           l.offset + i * local_cols + b * part, part);
    }
  }
}

// The local layout (a stage's) holds a subsequence of the whole model's
// tensors, in the same order.
template <typename Copy>
void ForEachTensorRun(const GptConfig& config, int t, int r,
                      const PipelineStage& stage, const Copy& copy) {
  const std::vector<ParamTensor> whole = ParameterLayout(config);
  const std::vector<ParamTensor> local = ParameterLayout(config, t, stage);
  size_t w = 0;
  for (const ParamTensor& l : local) {
    while (whole[w].name != l.name) ++w;
    ForEachRun(whole[w], l, t, r, copy);
  }
}

}  // namespace

Status ValidateTensorParallelism(const GptConfig& config,
                                 int tensor_parallelism) {
  const int t = tensor_parallelism;
  if (t < 1) {
    return InvalidArgument("tensor parallelism " + std::to_string(t) +
                           ": expected at least 1");
  }
  if (config.num_heads % t != 0 || config.mlp_dim % t != 0) {
    return InvalidArgument(
        "tensor parallelism " + std::to_string(t) + " must divide num_heads (" +
        std::to_string(config.num_heads) + ") and mlp_dim (" +
        std::to_string(config.mlp_dim) +
        "): each rank holds whole heads and an equal part of the MLP");
  }
  return OkStatus();
}

void ExtractTensorShard(const GptConfig& config, int t, int rank,
                        const float* whole, float* local,
                        const PipelineStage& stage) {
  ForEachTensorRun(config, t, rank, stage,
                   [&](int64_t w, int64_t l, int64_t n) {
                     std::copy_n(whole + w, n, local + l);
                   });
}

void InsertTensorShard(const GptConfig& config, int t, int rank,
                       const float* local, float* whole,
                       const PipelineStage& stage) {
  ForEachTensorRun(config, t, rank, stage,
                   [&](int64_t w, int64_t l, int64_t n) {
                     std::copy_n(local + l, n, whole + w);
                   });
}

bool IsReplicatedTensor(const std::string& name) {
  return SplitOf(name) == Split::kWhole;
}

}  // namespace multislice::model::gpt
