#include "model/tensor_shard.h"

#include <algorithm>
#include <vector>

#include "model/block.h"

namespace multislice::model {
namespace {

// Calls copy(whole_index, local_index, count) for each run of values of
// tensor `w` (whole) that its rank-r part `l` holds.
template <typename Copy>
void ForEachRun(const ParamTensor& w, const ParamTensor& l, int t, int r,
                const Copy& copy) {
  switch (w.split) {
    case TensorSplit::kWhole:
      copy(w.offset, l.offset, w.size);
      return;
    case TensorSplit::kRows:
      // The rank's rows of [rows, cols]: one contiguous run.
      copy(w.offset + r * l.size, l.offset, l.size);
      return;
    case TensorSplit::kColumns:
      break;
  }
  const int64_t whole_cols = w.shape.back();
  const int64_t local_cols = l.shape.back();
  const int64_t n_rows = w.shape.size() == 2 ? w.shape[0] : 1;
  for (int64_t i = 0; i < n_rows; ++i) {
    int64_t whole_begin = 0, local_begin = 0;
    for (int64_t block : w.column_blocks) {
      const int64_t part = block / t;
      copy(w.offset + i * whole_cols + whole_begin + r * part,
           l.offset + i * local_cols + local_begin, part);
      whole_begin += block;
      local_begin += part;
    }
  }
}

// The local layout (a stage's) holds a subsequence of the whole model's
// tensors, in the same order.
template <typename Copy>
void ForEachTensorRun(const DecoderConfig& config, int t, int r,
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

Status ValidateTensorParallelism(const DecoderConfig& config,
                                 int tensor_parallelism) {
  return ValidateBlockTensorParallelism(config, tensor_parallelism);
}

void ExtractTensorShard(const DecoderConfig& config, int t, int rank,
                        const float* whole, float* local,
                        const PipelineStage& stage) {
  ForEachTensorRun(config, t, rank, stage,
                   [&](int64_t w, int64_t l, int64_t n) {
                     std::copy_n(whole + w, n, local + l);
                   });
}

void InsertTensorShard(const DecoderConfig& config, int t, int rank,
                       const float* local, float* whole,
                       const PipelineStage& stage) {
  ForEachTensorRun(config, t, rank, stage,
                   [&](int64_t w, int64_t l, int64_t n) {
                     std::copy_n(local + l, n, whole + w);
                   });
}

}  // namespace multislice::model
