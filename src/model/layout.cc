// The flat parameter layout of layout.h: the decoder's own tensors here, each
// layer's from its block (BlockTensors).
#include "model/layout.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/dtype.h"
#include "compute/random.h"
#include "model/block.h"

namespace multislice::model {
namespace {

constexpr float kInitStd = 0.02f;

class LayoutBuilder {
 public:
  void Add(std::string name, std::vector<int64_t> shape,
           TensorInit init = TensorInit::kNormal,
           TensorSplit split = TensorSplit::kWhole,
           std::vector<int64_t> column_blocks = {}) {
    int64_t size = 1;
    for (int64_t d : shape) size *= d;
    layout_.push_back({std::move(name), std::move(shape), offset_, size, split,
                       std::move(column_blocks), init});
    offset_ += size;
  }
  std::vector<ParamTensor> Take() { return std::move(layout_); }

 private:
  std::vector<ParamTensor> layout_;
  int64_t offset_ = 0;
};

}  // namespace

std::vector<ParamTensor> ParameterLayout(const DecoderConfig& c, int t,
                                         const PipelineStage& stage) {
  const int64_t V = c.vocab_size, C = c.emb_dim;
  const int per_stage = c.num_layers / stage.count;
  const int first_layer = stage.index * per_stage;
  LayoutBuilder b;
  if (stage.first() || (stage.last() && c.tied_embedding)) {
    b.Add(
        "wte", {V, C},
        UsesLearnedPositions(c) ? TensorInit::kNormal : TensorInit::kEmbedding);
  }
  if (stage.first() && UsesLearnedPositions(c)) {
    b.Add("wpe", {c.max_seq_len, C});
  }
  const std::vector<TensorSpec> block = BlockTensors(c, t);
  for (int l = first_layer; l < first_layer + per_stage; ++l) {
    const std::string prefix = "h" + std::to_string(l) + ".";
    for (const TensorSpec& s : block) {
      b.Add(prefix + s.name, s.shape, s.init, s.split, s.column_blocks);
    }
  }
  if (stage.last()) {
    b.Add("lnf.w", {C}, TensorInit::kOne);
    if (UsesLayerNorm(c)) b.Add("lnf.b", {C}, TensorInit::kZero);
    if (!c.tied_embedding) b.Add("lm_head", {V, C});
  }
  return b.Take();
}

int64_t NumParameters(const DecoderConfig& config, int tensor_parallelism,
                      const PipelineStage& stage) {
  const std::vector<ParamTensor> layout =
      ParameterLayout(config, tensor_parallelism, stage);
  return layout.empty() ? 0 : layout.back().offset + layout.back().size;
}

Status ValidatePipeline(const DecoderConfig& config, int stages) {
  if (stages < 1) {
    return InvalidArgument("pipeline stages " + std::to_string(stages) +
                           ": expected at least 1");
  }
  if (config.num_layers % stages != 0) {
    return InvalidArgument(
        "pipeline stages " + std::to_string(stages) +
        " must divide num_layers (" + std::to_string(config.num_layers) +
        "): each stage holds an equal number of whole layers");
  }
  return OkStatus();
}

void InitParameters(const DecoderConfig& config, uint64_t seed, float* params) {
  const std::vector<ParamTensor> layout = ParameterLayout(config);
  const float residual_scale =
      1.0f / std::sqrt(2.0f * static_cast<float>(config.num_layers));
  for (size_t i = 0; i < layout.size(); ++i) {
    const ParamTensor& t = layout[i];
    float* out = params + t.offset;
    switch (t.init) {
      case TensorInit::kNormal:
      case TensorInit::kResidual:
      case TensorInit::kEmbedding: {
        float scale = kInitStd;
        if (t.init == TensorInit::kResidual) scale *= residual_scale;
        if (t.init == TensorInit::kEmbedding) {
          scale = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
        }
        const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1;
        const int64_t cols = t.shape.back();
        compute::FillBlock(compute::Distribution::kNormal, seed, i, scale, cols,
                           0, 0, rows, cols, /*transposed=*/false, DType::kF32,
                           out, cols);
        break;
      }
      case TensorInit::kZero:
        std::fill(out, out + t.size, 0.0f);
        break;
      case TensorInit::kOne:
        std::fill(out, out + t.size, 1.0f);
        break;
    }
  }
}

std::vector<uint8_t> WeightDecayMask(const DecoderConfig& config,
                                     int tensor_parallelism,
                                     const PipelineStage& stage) {
  const std::vector<ParamTensor> layout =
      ParameterLayout(config, tensor_parallelism, stage);
  std::vector<uint8_t> mask(
      static_cast<size_t>(NumParameters(config, tensor_parallelism, stage)), 0);
  for (const ParamTensor& t : layout) {
    if (t.shape.size() == 2) {
      std::fill(mask.begin() + t.offset, mask.begin() + t.offset + t.size, 1);
    }
  }
  return mask;
}

}  // namespace multislice::model
