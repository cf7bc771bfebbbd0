// The decoder-only language model of `multislice train` on one device, in
// f32: embeddings, a stack of blocks of one kind (model/block.h: GPT-2's,
// Llama's, Gemma's), the final norm and the head, forward to a mean
// cross-entropy loss and backward into a flat gradient buffer
// (model/layout.h). The matrix multiplications go through compute::Gemm
// (oneDNN), on the calling thread only.
//
//   x = wte[token] (+ wpe[t] for gpt3); per layer x = block(x);
//   logits = norm(x) @ W^T, W = wte (tied) or lm_head
//   (divided by sqrt(C) for a tied head with normalize_embedding_logits).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "model/block.h"
#include "model/decoder_config.h"
#include "model/layout.h"

namespace multislice::model {

class MatmulRunner;

// Not thread-safe: one model per device thread. Buffers are sized by the
// (B, T) of the last Forward and reused while they stay the same.
class Decoder {
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
  explicit Decoder(const DecoderConfig& config, DType matmul_type = DType::kF32,
                   TensorParallel tensor = {}, PipelineStage stage = {});
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

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
  // grads as soon as the pass has written it for the last time: the final
  // norm and an untied head, then the layers from the last to the first,
  // then the embeddings (a tied wte is final only at the end: the head and
  // the embedding both add to it). The ranges are disjoint, cover every
  // parameter, and each begins where the next one ends, so a caller can
  // start reducing the last layers' gradients while the first layers'
  // backward still computes.
  //
  // On a pipeline stage before the last, output_grad [B,T,C] is the
  // gradient of the loss with respect to output() (the next stage's
  // input_grad()), and the pass needs only a successful Forward. With a tied
  // head, the first stage's wte gradient is the embedding's part only and
  // the last stage's the head's: the whole gradient of the tied weight is
  // their sum.
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

  const DecoderConfig& config() const { return config_; }

 private:
  struct Activations;
  Status CheckForwardInputs(const int32_t* tokens, const int32_t* targets,
                            const float* input, int B, int T) const;
  void Resize(int B, int T);
  void EmbedForward(const float* params, const int32_t* tokens,
                    const float* input);
  Result<float> HeadForward(const float* params, const int32_t* targets);
  Status HeadBackward(const float* params, float* grads);
  void EmbedBackward(float* grads);
  LayerParams Layer(const float* params, int l) const;
  int64_t LayerOffset(int l) const;
  // Offset of layout tensor `index`; -1 indices are absent tensors.
  const ParamTensor& Tensor(int index) const { return layout_[index]; }
  float HeadScale() const;

  DecoderConfig config_;
  TensorParallel tensor_;
  PipelineStage stage_;
  // This stage's layers, tensors per layer, and the layout indices of the
  // decoder's own tensors (-1 if absent on this stage).
  int num_layers_, tensors_per_layer_, first_layer_tensor_;
  int wte_, wpe_, lnf_w_, lnf_b_, lm_head_;
  std::vector<ParamTensor> layout_;
  std::unique_ptr<MatmulRunner> matmul_;
  std::unique_ptr<DecoderBlock> block_;
  std::unique_ptr<Activations> acts_;
  int B_ = 0, T_ = 0;
  bool have_loss_ = false;
  bool have_forward_ = false;
};

}  // namespace multislice::model
