// The decoder's ends (embeddings, final norm, head, loss) and the loop over
// its blocks; the blocks are block.h's.
#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "compute/gpt_ops.h"
#include "compute/llama_ops.h"
#include "model/matmul_runner.h"
#include "model/tensor_shard.h"
#include "runtime/trace.h"

namespace multislice::model {

namespace ops = compute::gpt;
using Operand = MatmulRunner::Operand;

struct Decoder::Activations {
  std::vector<int32_t> tokens, targets;
  std::vector<uint16_t> params16;              // bf16 copy of the parameters
  std::vector<float> encoded;                  // [N,C]
  std::vector<float> lnf, lnf_mean, lnf_rstd;  // [N,C], [N], [N]
  std::vector<uint16_t> lnf_16;
  std::vector<float> logits, probs;  // [N,V]
  std::vector<float> losses;         // [N]
  std::vector<float> dresidual;      // [N,C], gradient of the residual stream
  std::vector<float> dlnf;           // [N,C]
  std::vector<float> dlogits;        // [N,V]
  std::vector<float> dlosses;        // [N]
  std::vector<uint16_t> dlogits16;   // bf16 copy of dlogits
};

namespace {

void Zero(std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); }

// The layout index of tensor `name`, or -1.
int IndexOf(const std::vector<ParamTensor>& layout, const std::string& name) {
  for (size_t i = 0; i < layout.size(); ++i) {
    if (layout[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

Decoder::Decoder(const DecoderConfig& config, DType matmul_type,
                 TensorParallel tensor, PipelineStage stage)
    : config_(config),
      tensor_(std::move(tensor)),
      stage_(stage),
      num_layers_(config.num_layers / std::max(1, stage.count)),
      tensors_per_layer_(static_cast<int>(
          BlockTensors(config, std::max(1, tensor_.size)).size())),
      layout_(ParameterLayout(config, std::max(1, tensor_.size), stage)),
      matmul_(std::make_unique<MatmulRunner>(matmul_type)),
      acts_(std::make_unique<Activations>()) {
  wte_ = IndexOf(layout_, "wte");
  wpe_ = IndexOf(layout_, "wpe");
  lnf_w_ = IndexOf(layout_, "lnf.w");
  lnf_b_ = IndexOf(layout_, "lnf.b");
  lm_head_ = IndexOf(layout_, "lm_head");
  first_layer_tensor_ =
      (stage.first() ? (wte_ >= 0) + (wpe_ >= 0) : (wte_ >= 0 ? 1 : 0));
  block_ = MakeBlock(config_, num_layers_, tensor_, matmul_.get());
}

Decoder::~Decoder() = default;

int64_t Decoder::LayerOffset(int l) const {
  return layout_[first_layer_tensor_ + l * tensors_per_layer_].offset;
}

LayerParams Decoder::Layer(const float* params, int l) const {
  const int64_t offset = LayerOffset(l);
  const bool bf16 = matmul_->type() != DType::kF32;
  return {params + offset, bf16 ? acts_->params16.data() + offset : nullptr};
}

float Decoder::HeadScale() const {
  if (!config_.tied_embedding || !config_.normalize_embedding_logits) {
    return 1.0f;
  }
  return 1.0f / std::sqrt(static_cast<float>(config_.emb_dim));
}

const float* Decoder::logits() const { return acts_->logits.data(); }

const float* Decoder::output() const {
  return num_layers_ > 0 ? block_->Output(num_layers_ - 1)
                         : acts_->encoded.data();
}

const float* Decoder::input_grad() const { return acts_->dresidual.data(); }

Status Decoder::CheckForwardInputs(const int32_t* tokens,
                                   const int32_t* targets, const float* input,
                                   int B, int T) const {
  RETURN_IF_ERROR(ValidateConfig(config_));
  RETURN_IF_ERROR(ValidateTensorParallelism(config_, tensor_.size));
  RETURN_IF_ERROR(ValidatePipeline(config_, stage_.count));
  if (B <= 0) {
    return InvalidArgument("batch size B is " + std::to_string(B) +
                           "; expected > 0");
  }
  if (T <= 0 || T > config_.max_seq_len) {
    return InvalidArgument(
        "sequence length T is " + std::to_string(T) + "; expected 1.." +
        std::to_string(config_.max_seq_len) + " (DecoderConfig.max_seq_len)");
  }
  if (!stage_.first() && input == nullptr) {
    return InvalidArgument("pipeline stage " + std::to_string(stage_.index) +
                           " needs the previous stage's output as input");
  }
  const int V = config_.vocab_size;
  if (!stage_.first()) tokens = nullptr;
  if (!stage_.last()) targets = nullptr;
  for (int64_t i = 0; i < int64_t{B} * T; ++i) {
    const bool bad_token =
        tokens != nullptr && (tokens[i] < 0 || tokens[i] >= V);
    if (bad_token ||
        (targets != nullptr && (targets[i] < 0 || targets[i] >= V))) {
      return InvalidArgument(
          std::string(bad_token ? "token" : "target") + " id " +
          std::to_string(bad_token ? tokens[i] : targets[i]) + " at position " +
          std::to_string(i) + " is outside [0, " + std::to_string(V) + ")");
    }
  }
  return OkStatus();
}

void Decoder::Resize(int B, int T) {
  const int64_t N = int64_t{B} * T, C = config_.emb_dim, V = config_.vocab_size;
  Activations& a = *acts_;
  a.encoded.assign(N * C, 0.0f);
  // The head's buffers on the last stage only.
  const int64_t head = stage_.last() ? N : 0;
  a.lnf.assign(head * C, 0.0f);
  a.lnf_mean.assign(head, 0.0f);
  a.lnf_rstd.assign(head, 0.0f);
  a.logits.assign(head * V, 0.0f);
  a.probs.assign(head * V, 0.0f);
  a.losses.assign(head, 0.0f);
  a.dresidual.assign(N * C, 0.0f);
  a.dlnf.assign(head * C, 0.0f);
  a.dlogits.assign(head * V, 0.0f);
  a.dlosses.assign(head, 0.0f);
  block_->Resize(B, T);
  B_ = B;
  T_ = T;
}

void Decoder::EmbedForward(const float* params, const int32_t* tokens,
                           const float* input) {
  Activations& a = *acts_;
  const int64_t N = int64_t{B_} * T_;
  if (!stage_.first()) {
    std::copy_n(input, N * config_.emb_dim, a.encoded.data());
    return;
  }
  a.tokens.assign(tokens, tokens + N);
  runtime::OpSpans trace("encoder", 0, "forward");
  trace.Next("embed");
  const float* wte = params + Tensor(wte_).offset;
  if (wpe_ >= 0) {
    ops::EncoderForward(a.encoded.data(), tokens, wte,
                        params + Tensor(wpe_).offset, B_, T_, config_.emb_dim);
  } else {
    compute::llama::EmbedForward(a.encoded.data(), tokens, wte, N,
                                 config_.emb_dim);
  }
}

Result<float> Decoder::Forward(const float* params, const int32_t* tokens,
                               const int32_t* targets, int B, int T,
                               const float* input) {
  have_loss_ = have_forward_ = false;
  RETURN_IF_ERROR(CheckForwardInputs(tokens, targets, input, B, T));
  if (B != B_ || T != T_) Resize(B, T);
  // The weights in bf16, once per step (Backward reuses them).
  matmul_->Prepare(params, layout_.back().offset + layout_.back().size,
                   acts_->params16);
  EmbedForward(params, tokens, input);
  const float* residual = acts_->encoded.data();
  for (int l = 0; l < num_layers_; ++l) {
    RETURN_IF_ERROR(block_->Forward(l, Layer(params, l), residual));
    residual = block_->Output(l);
  }
  have_forward_ = true;
  if (!stage_.last()) return 0.0f;
  return HeadForward(params, targets);
}

Result<float> Decoder::HeadForward(const float* params,
                                   const int32_t* targets) {
  Activations& a = *acts_;
  const int64_t N = int64_t{B_} * T_, C = config_.emb_dim,
                V = config_.vocab_size;
  runtime::OpSpans trace("head", 0, "forward");
  trace.Next("lnf");
  const float eps = static_cast<float>(config_.norm_epsilon);
  if (lnf_b_ >= 0) {
    ops::LayerNormForward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(),
                          output(), params + Tensor(lnf_w_).offset,
                          params + Tensor(lnf_b_).offset, N,
                          static_cast<int>(C), eps);
  } else {
    compute::llama::RmsNormForward(a.lnf.data(), a.lnf_rstd.data(), output(),
                                   params + Tensor(lnf_w_).offset, N,
                                   static_cast<int>(C), eps);
  }
  // logits[N,V] = lnf[N,C] @ W^T, W stored [V,C].
  trace.Next("logits");
  const int head = config_.tied_embedding ? wte_ : lm_head_;
  const int64_t w = Tensor(head).offset;
  const bool bf16 = matmul_->type() != DType::kF32;
  RETURN_IF_ERROR(matmul_->HeadForward(
      a.logits.data(), matmul_->Prepare(a.lnf.data(), N * C, a.lnf_16),
      Operand{params + w, bf16 ? a.params16.data() + w : nullptr}, N, C, V,
      HeadScale()));
  if (targets == nullptr) return 0.0f;

  trace.Next("cross_entropy");
  a.targets.assign(targets, targets + N);
  ops::CrossEntropyForward(a.losses.data(), a.probs.data(), a.logits.data(),
                           targets, N, static_cast<int>(V));
  double sum = 0.0;
  for (int64_t i = 0; i < N; ++i) sum += a.losses[i];
  have_loss_ = true;
  return static_cast<float>(sum / static_cast<double>(N));
}

Status Decoder::HeadBackward(const float* params, float* grads) {
  Activations& a = *acts_;
  const int64_t N = int64_t{B_} * T_, C = config_.emb_dim,
                V = config_.vocab_size;
  runtime::OpSpans trace("head", 0, "backward");
  trace.Next("cross_entropy");
  std::fill(a.dlosses.begin(), a.dlosses.end(), 1.0f / static_cast<float>(N));
  ops::CrossEntropySoftmaxGrad(a.dlogits.data(), a.dlosses.data(),
                               a.probs.data(), a.targets.data(), N,
                               static_cast<int>(V));
  // logits = lnf @ W^T: dlnf = dlogits @ W, dW = dlogits^T @ lnf (for a
  // tied W the first write; the embedding adds its part at the end).
  trace.Next("logits");
  const int head = config_.tied_embedding ? wte_ : lm_head_;
  const int64_t w = Tensor(head).offset;
  const bool bf16 = matmul_->type() != DType::kF32;
  RETURN_IF_ERROR(matmul_->HeadBackward(
      a.dlnf.data(), grads + w, 0.0f,
      matmul_->Prepare(a.dlogits.data(), N * V, a.dlogits16),
      Operand{a.lnf.data(), a.lnf_16.data()},
      Operand{params + w, bf16 ? a.params16.data() + w : nullptr}, N, C, V,
      HeadScale()));
  trace.Next("lnf");
  Zero(a.dresidual);
  const ParamTensor& lnf_w = Tensor(lnf_w_);
  std::fill_n(grads + lnf_w.offset, lnf_w.size, 0.0f);
  if (lnf_b_ >= 0) {
    const ParamTensor& lnf_b = Tensor(lnf_b_);
    std::fill_n(grads + lnf_b.offset, lnf_b.size, 0.0f);
    ops::LayerNormBackward(a.dresidual.data(), grads + lnf_w.offset,
                           grads + lnf_b.offset, a.dlnf.data(), output(),
                           params + lnf_w.offset, a.lnf_mean.data(),
                           a.lnf_rstd.data(), N, static_cast<int>(C));
  } else {
    compute::llama::RmsNormBackwardAccumulate(
        a.dresidual.data(), grads + lnf_w.offset, a.dlnf.data(), output(),
        params + lnf_w.offset, a.lnf_rstd.data(), N, static_cast<int>(C));
  }
  return OkStatus();
}

void Decoder::EmbedBackward(float* grads) {
  Activations& a = *acts_;
  // Without the head on this stage (or with an untied head) the embedding
  // writes wte's gradient first.
  const ParamTensor& wte = Tensor(wte_);
  if (!stage_.last() || !config_.tied_embedding) {
    std::fill_n(grads + wte.offset, wte.size, 0.0f);
  }
  runtime::OpSpans trace("encoder", 0, "backward");
  trace.Next("embed");
  if (wpe_ < 0) {
    compute::llama::EmbedBackwardAccumulate(grads + wte.offset,
                                            a.dresidual.data(), a.tokens.data(),
                                            int64_t{B_} * T_, config_.emb_dim);
    return;
  }
  const ParamTensor& wpe = Tensor(wpe_);
  std::fill_n(grads + wpe.offset, wpe.size, 0.0f);  // rows at or past T: 0
  ops::EncoderBackward(grads + wte.offset, grads + wpe.offset,
                       a.dresidual.data(), a.tokens.data(), B_, T_,
                       config_.emb_dim);
}

Status Decoder::Backward(const float* params, float* grads,
                         const GradientReady& ready, const float* output_grad) {
  if (stage_.last() && !have_loss_) {
    return FailedPrecondition(
        "Decoder::Backward needs a successful Forward with targets first");
  }
  if (!stage_.last() && (!have_forward_ || output_grad == nullptr)) {
    return FailedPrecondition(
        "Decoder::Backward on pipeline stage " + std::to_string(stage_.index) +
        " needs a successful Forward and the gradient of its output");
  }
  auto done = [&](int64_t begin, int64_t end) {
    if (ready) ready(begin, end - begin);
  };
  const int64_t N = int64_t{B_} * T_;
  const int64_t end = layout_.back().offset + layout_.back().size;
  if (stage_.last()) {
    RETURN_IF_ERROR(HeadBackward(params, grads));
    done(Tensor(lnf_w_).offset, end);
  } else {
    std::copy_n(output_grad, N * config_.emb_dim, acts_->dresidual.data());
  }
  // dresidual holds d(loss)/d(output of block l) on entry to iteration l
  // and d(loss)/d(input of block l) on exit.
  for (int l = num_layers_ - 1; l >= 0; --l) {
    const float* in = l > 0 ? block_->Output(l - 1) : acts_->encoded.data();
    RETURN_IF_ERROR(block_->Backward(l, Layer(params, l),
                                     grads + LayerOffset(l), in,
                                     acts_->dresidual.data()));
    const int64_t layer_end =
        l + 1 < num_layers_ ? LayerOffset(l + 1)
                            : (stage_.last() ? Tensor(lnf_w_).offset : end);
    done(LayerOffset(l), layer_end);
  }
  const int64_t layers_begin =
      num_layers_ > 0 ? LayerOffset(0)
                      : (stage_.last() ? Tensor(lnf_w_).offset : end);
  if (stage_.first()) {
    EmbedBackward(grads);
    done(0, layers_begin);
  } else if (wte_ >= 0) {
    done(0, layers_begin);  // the tied head's part, final since the start
  }
  return OkStatus();
}

}  // namespace multislice::model
