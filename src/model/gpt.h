// The GPT-2 model of `multislice train` on one device, in f32.
//
// Owns the parameter layout (every tensor at a fixed offset in one flat f32
// buffer), GPT-2 style initialisation, and GptModel: the forward pass to a
// mean cross-entropy loss and its backward into a flat gradient buffer. The
// layer kernels are gpt_ops.h; the matrix multiplications go through
// compute::Gemm (oneDNN), on the calling thread only.
//
// The network: x = wte[token] + wpe[t]; per layer (pre-LayerNorm)
// x += attn_proj(attention(qkv(ln1(x)))); x += fc_proj(gelu(fc(ln2(x))));
// then a final LayerNorm and logits = lnf(x) @ wte^T (the head is tied to the
// token embedding).
#ifndef MULTISLICE_MODEL_GPT_H_
#define MULTISLICE_MODEL_GPT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace multislice::model::gpt {

struct GptConfig {
  int vocab_size = 256;   // V
  int max_seq_len = 128;  // rows of wpe; the largest T
  int emb_dim = 256;      // C, divisible by num_heads
  int num_heads = 4;      // NH
  int num_layers = 4;     // L
  int mlp_dim = 1024;     // hidden width of the MLP
};

// kInvalidArgument naming the field when a size is not positive or emb_dim is
// not divisible by num_heads.
Status ValidateConfig(const GptConfig& config);

// One tensor of the flat parameter buffer: elements [offset, offset + size),
// row-major with `shape`. Names are "wte", "wpe", "h<l>.ln1.w", "h<l>.ln1.b",
// "h<l>.qkv.w", "h<l>.qkv.b", "h<l>.attn_proj.w", "h<l>.attn_proj.b",
// "h<l>.ln2.w", "h<l>.ln2.b", "h<l>.fc.w", "h<l>.fc.b", "h<l>.fc_proj.w",
// "h<l>.fc_proj.b", "lnf.w", "lnf.b". Linear weights are [in, out].
struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t size = 0;
};

// Every tensor in this fixed order, contiguous from offset 0:
// wte [V,C], wpe [T,C], per layer ln1.w/b [C], qkv.w [C,3C], qkv.b [3C],
// attn_proj.w [C,C], attn_proj.b [C], ln2.w/b [C], fc.w [C,mlp], fc.b [mlp],
// fc_proj.w [mlp,C], fc_proj.b [C]; then lnf.w/b [C].
//
// With tensor parallelism t (tensor_parallel.h) the layout of one rank's
// parameters: the same tensors in the same order, qkv.w [C,3C/t], qkv.b
// [3C/t], attn_proj.w [C/t,C], fc.w [C,mlp/t], fc.b [mlp/t], fc_proj.w
// [mlp/t,C] (its heads' and its MLP columns' share), every other tensor
// whole.
//
// With pipeline stages (PipelineStage) the layout of one stage: the tensors
// it holds, in the same order, contiguous from 0.
struct PipelineStage;
std::vector<ParamTensor> ParameterLayout(const GptConfig& config,
                                         int tensor_parallelism = 1);
std::vector<ParamTensor> ParameterLayout(const GptConfig& config,
                                         int tensor_parallelism,
                                         const PipelineStage& stage);
int64_t NumParameters(const GptConfig& config, int tensor_parallelism = 1);
int64_t NumParameters(const GptConfig& config, int tensor_parallelism,
                      const PipelineStage& stage);

// Which part of the network a pipeline stage runs (GPipe/Megatron): stage s
// of p holds the L / p consecutive layers [s L/p, (s+1) L/p); the first
// stage also the embeddings (wte, wpe), the last the final LayerNorm and the
// head, whose weight is tied to wte: the last stage holds its own copy of
// wte, and the two copies stay equal because the trainer sums their
// gradients (both stages then apply the same update). p = 1 is the whole
// model.
struct PipelineStage {
  int index = 0;
  int count = 1;
  bool first() const { return index == 0; }
  bool last() const { return index == count - 1; }
};

// kInvalidArgument naming the values unless `stages` (>= 1) divides
// num_layers.
Status ValidatePipeline(const GptConfig& config, int stages);

// Writes all NumParameters(config) values: weights (2-D tensors) normal with
// std 0.02, the residual projections (attn_proj.w, fc_proj.w) scaled by
// 1/sqrt(2 * num_layers); biases 0; LayerNorm weights 1. Tensor i of the
// layout draws from counter-based stream i of `seed` (compute/random.h), so
// the result depends only on (config, seed).
void InitParameters(const GptConfig& config, uint64_t seed, float* params);

// 1 for the tensors AdamW should decay (the 2-D weights and embeddings), 0
// for biases and LayerNorm parameters; NumParameters(config) entries.
// With tensor parallelism t, the mask of one rank's layout.
std::vector<uint8_t> WeightDecayMask(const GptConfig& config,
                                     int tensor_parallelism = 1,
                                     const PipelineStage& stage = {});

// How one rank of t takes part in a Megatron-style tensor-parallel model:
// the attention heads and the MLP's hidden units split t ways (qkv and fc
// column-parallel, attn_proj and fc_proj row-parallel), the rest
// replicated. all_reduce sums a buffer over the t ranks in place, every rank
// getting the same values; the forward pass calls it after attn_proj and
// fc_proj, the backward pass on the input gradients of qkv and fc. If set,
// start_all_reduce starts the same all-reduce and returns what waits for
// it: the backward overlaps each input gradient's all-reduce with the
// weight gradient's matmul (Megatron's overlap; the forward's results are
// needed at once).
struct TensorParallel {
  using Wait = std::function<Status()>;
  int size = 1;
  int rank = 0;
  std::function<Status(float* buf, int64_t count)> all_reduce;
  std::function<Wait(float* buf, int64_t count)> start_all_reduce;
};

// The model for one device: runs the forward pass and keeps its activations
// for the backward.
//
// Not thread-safe: one model per device thread. Buffers are sized by the
// (B, T) of the last Forward and reused while they stay the same.
class GptModel {
 public:
  // matmul_type kBF16 rounds both operands of every matmul to bf16 (the
  // products still accumulate in f32 and every other op stays f32); kF32 is
  // exact f32 throughout. The attention's per-head products are matmuls too.
  // With kBF16 the weights are rounded once per Forward and Backward reuses
  // that copy (hence params unchanged in between), as it reuses the forward's
  // bf16 activations.
  //
  // With tensor.size > 1 the model is rank tensor.rank's part: its params
  // and grads buffers have ParameterLayout(config, tensor.size), and every
  // rank of the group must run Forward and Backward together (each calls
  // tensor.all_reduce twice per layer in each).
  //
  // With stage.count > 1 the model is one pipeline stage (PipelineStage):
  // its buffers have ParameterLayout(config, tensor.size, stage); a stage
  // after the first reads the previous stage's output (`input`) instead of
  // tokens, and a stage before the last returns no loss: its output() goes
  // to the next stage, whose input_grad() comes back as Backward's
  // output_grad.
  explicit GptModel(const GptConfig& config, DType matmul_type = DType::kF32,
                    TensorParallel tensor = {}, PipelineStage stage = {});
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  // Runs the forward pass on tokens [B,T] (ids in [0, V)), 1 <= T <=
  // max_seq_len. With targets [B,T] it returns the mean cross-entropy loss
  // over the B*T positions; with null targets it computes only the logits and
  // returns 0. kInvalidArgument for a bad config, shape or token id;
  // kInternal if a matmul fails. params must stay unchanged until Backward.
  //
  // On a pipeline stage after the first, `input` [B,T,C] replaces tokens
  // (which may be null); a stage before the last ignores targets, returns 0
  // and leaves its output in output().
  Result<float> Forward(const float* params, const int32_t* tokens,
                        const int32_t* targets, int B, int T,
                        const float* input = nullptr);

  // Writes (=) the gradient of the last Forward's mean loss with respect to
  // params into grads (NumParameters entries, any old contents: every entry
  // is written, the weight gradients by their matmuls directly, so nothing
  // needs zeroing first). kFailedPrecondition unless the last Forward had
  // targets and succeeded; kInternal if a matmul fails.
  //
  // `ready`, if set, is called with each range [offset, offset + count) of
  // grads as soon as the pass has written it for the last time: lnf, then
  // the layers from the last to the first, then the embeddings (wte is
  // final only at the end: the head and the encoder both add to it). The
  // ranges are disjoint, cover every parameter, and each begins where the
  // next one ends, so a caller can start reducing the last layers'
  // gradients while the first layers' backward still computes.
  //
  // On a pipeline stage before the last, output_grad [B,T,C] is the
  // gradient of the loss with respect to output() (the next stage's
  // input_grad()), and the pass needs only a successful Forward. The first
  // stage's wte gradient is the encoder's part only and the last stage's
  // the head's: the whole gradient of the tied weight is their sum.
  using GradientReady = std::function<void(int64_t offset, int64_t count)>;
  Status Backward(const float* params, float* grads,
                  const GradientReady& ready = {},
                  const float* output_grad = nullptr);

  // [B,T,V] logits of the last Forward (last stage only).
  const float* logits() const;
  // A stage before the last: [B,T,C], the residual stream after its last
  // layer in the last Forward.
  const float* output() const;
  // A stage after the first: [B,T,C], the gradient with respect to the
  // last Forward's input, from the last Backward.
  const float* input_grad() const;

  const GptConfig& config() const { return config_; }

 private:
  struct Activations;
  class Matmul;
  // Offset in the flat buffer of tensor `index` (0..11, layout order) of
  // this stage's block `layer` (0-based within the stage); LayerEnd: where
  // its last tensor ends.
  int64_t LayerOffset(int layer, int index) const;
  int64_t LayerEnd(int layer) const;
  Status CheckForwardInputs(const int32_t* tokens, const int32_t* targets,
                            const float* input, int B, int T) const;
  // Sets tensor `index` (of the layout) of `grads` to zero.
  void ZeroTensor(float* grads, size_t index) const;

  // Sums buf over the tensor group (nothing without tensor parallelism);
  // the Start form returns what waits for the sum.
  Status TensorAllReduce(float* buf, int64_t count);
  TensorParallel::Wait StartTensorAllReduce(float* buf, int64_t count);

  GptConfig config_;
  TensorParallel tensor_;
  PipelineStage stage_;
  // This stage's layers; the layout indices of its tensors (-1 if absent).
  int num_layers_, layer_base_, wte_, wpe_, lnf_;
  // This rank's attention width (C/t), heads (NH/t) and MLP width (mlp/t).
  int attn_dim_, heads_, mlp_dim_;
  std::vector<ParamTensor> layout_;
  std::unique_ptr<Activations> acts_;
  std::unique_ptr<Matmul> matmul_;
  int B_ = 0, T_ = 0;
  bool have_loss_ = false;
  bool have_forward_ = false;
};

}  // namespace multislice::model::gpt

#endif  // MULTISLICE_MODEL_GPT_H_
