// GptBlock: the GPT-2 layer's forward and backward around the gpt_ops.h
// kernels, attention.h and the MatmulRunner's matmuls.
#include "model/gpt_block.h"

#include <algorithm>
#include <utility>

#include "compute/attention.h"
#include "compute/gpt_ops.h"
#include "model/matmul_runner.h"
#include "runtime/trace.h"

namespace multislice::model {
namespace {

namespace ops = compute::gpt;
using Operand = MatmulRunner::Operand;

// The layer's tensors, in layout order.
enum Tensor {
  kLn1W = 0,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttnProjW,
  kAttnProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
};

void Zero(std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); }

// Saved activations of one layer; the backward's scratch mirrors them. The
// *16 vectors are bf16 copies of the matmul inputs (bf16 matmuls only),
// made once in the forward and read again by the weight gradients.
struct Activations {
  std::vector<float> ln1, ln1_mean, ln1_rstd;  // [N,C], [N], [N]
  std::vector<float> qkv;                      // [N,3A]
  std::vector<float> atty;                     // [N,A]
  std::vector<float> att;                      // [B,heads,T,T] softmax
  std::vector<float> residual2;                // [N,C]
  std::vector<float> ln2, ln2_mean, ln2_rstd;  // [N,C], [N], [N]
  // [N,H]: the fc matmul's output, then GELU'(that) for the backward.
  std::vector<float> fch;
  std::vector<float> fch_gelu;   // [N,H]; f32 matmuls only (bf16 keep *_16)
  std::vector<float> residual3;  // [N,C]
  std::vector<uint16_t> ln1_16, qkv_16, atty_16, ln2_16, fch_gelu_16;

  void Size(int64_t N, int64_t C, int64_t A, int64_t H, int64_t att_size,
            bool f32_gelu) {
    ln1.assign(N * C, 0.0f);
    ln1_mean.assign(N, 0.0f);
    ln1_rstd.assign(N, 0.0f);
    qkv.assign(N * 3 * A, 0.0f);
    atty.assign(N * A, 0.0f);
    att.assign(att_size, 0.0f);
    residual2.assign(N * C, 0.0f);
    ln2.assign(N * C, 0.0f);
    ln2_mean.assign(N, 0.0f);
    ln2_rstd.assign(N, 0.0f);
    fch.assign(N * H, 0.0f);
    fch_gelu.assign(f32_gelu ? N * H : 0, 0.0f);
    residual3.assign(N * C, 0.0f);
  }
};

class GptBlock : public DecoderBlock {
 public:
  GptBlock(const DecoderConfig& config, int layers, TensorParallel tensor,
           MatmulRunner* matmul)
      : config_(config),
        tensor_(std::move(tensor)),
        matmul_(matmul),
        layers_(layers),
        heads_(config.num_heads / tensor_.size),
        attn_dim_(config.emb_dim / tensor_.size),
        mlp_dim_(config.mlp_dim / tensor_.size),
        offsets_(TensorOffsets(GptBlockTensors(config, tensor_.size))) {}

  void Resize(int B, int T) override {
    B_ = B;
    T_ = T;
    const int64_t N = int64_t{B} * T, C = config_.emb_dim;
    const bool f32 = matmul_->type() == DType::kF32;
    acts_.resize(layers_);
    for (Activations& a : acts_) {
      a.Size(N, C, attn_dim_, mlp_dim_, N * heads_ * T, f32);
    }
    d_.Size(N, C, attn_dim_, mlp_dim_, 0, false);
    att_scratch_.assign(compute::AttentionScratchSize(Shape(), matmul_->type()),
                        0.0f);
  }

  Status Forward(int l, const LayerParams& params, const float* in) override;
  const float* Output(int l) const override {
    return acts_[l].residual3.data();
  }
  Status Backward(int l, const LayerParams& params, float* grads,
                  const float* in, float* dresidual) override;

 private:
  compute::AttentionShape Shape() const {
    compute::AttentionShape s;
    s.B = B_;
    s.T = T_;
    s.heads = s.kv_heads = heads_;
    s.head_dim = config_.emb_dim / config_.num_heads;
    return s;
  }

  const DecoderConfig config_;
  const TensorParallel tensor_;
  MatmulRunner* const matmul_;
  const int layers_;
  // This rank's heads, attention width (C/t) and MLP width (mlp/t).
  const int heads_, attn_dim_, mlp_dim_;
  const std::vector<int64_t> offsets_;  // of each tensor in the layer
  int B_ = 0, T_ = 0;
  std::vector<Activations> acts_;
  Activations d_;  // gradients of one layer's activations, reused
  std::vector<float> att_scratch_;
  std::vector<uint16_t> dout16_;  // bf16 copy of a linear's output gradient
};

Status GptBlock::Forward(int l, const LayerParams& params, const float* in) {
  const int64_t N = int64_t{B_} * T_, C = config_.emb_dim, A = attn_dim_,
                H = mlp_dim_;
  const bool rank0 = tensor_.rank == 0;
  const DType mm_type = matmul_->type();
  Activations& la = acts_[l];
  auto p = [&](int index) { return params.f32 + offsets_[index]; };
  auto pw = [&](int index) -> Operand {
    return {p(index), params.bf16 ? params.bf16 + offsets_[index] : nullptr};
  };
  runtime::OpSpans trace("layer", l, "forward");
  trace.Next("ln1");
  ops::LayerNormForward(la.ln1.data(), la.ln1_mean.data(), la.ln1_rstd.data(),
                        in, p(kLn1W), p(kLn1B), N, static_cast<int>(C),
                        static_cast<float>(config_.norm_epsilon));
  trace.Next("qkv");
  RETURN_IF_ERROR(matmul_->LinearForward(
      la.qkv.data(), matmul_->Prepare(la.ln1.data(), N * C, la.ln1_16),
      pw(kQkvW), p(kQkvB), N, C, 3 * A));
  // qkv in bf16 once, for the attention's forward and backward.
  const uint16_t* qkv16 =
      matmul_->Prepare(la.qkv.data(), N * 3 * A, la.qkv_16).bf16;
  trace.Next("attention");
  RETURN_IF_ERROR(compute::AttentionForward(la.atty.data(), la.att.data(),
                                            att_scratch_.data(), la.qkv.data(),
                                            Shape(), mm_type, qkv16));
  // residual2 = in + attn_proj(...), the add in the matmul. Under tensor
  // parallelism each rank's product is a partial sum: rank 0 adds the bias
  // and the residual, the all-reduce the rest.
  trace.Next("attn_proj");
  RETURN_IF_ERROR(matmul_->LinearForward(
      la.residual2.data(), matmul_->Prepare(la.atty.data(), N * A, la.atty_16),
      pw(kAttnProjW), rank0 ? p(kAttnProjB) : nullptr, N, A, C,
      rank0 ? in : nullptr));
  RETURN_IF_ERROR(tensor_.AllReduce(la.residual2.data(), N * C));
  trace.Next("ln2");
  ops::LayerNormForward(la.ln2.data(), la.ln2_mean.data(), la.ln2_rstd.data(),
                        la.residual2.data(), p(kLn2W), p(kLn2B), N,
                        static_cast<int>(C),
                        static_cast<float>(config_.norm_epsilon));
  trace.Next("fc");
  RETURN_IF_ERROR(matmul_->LinearForward(
      la.fch.data(), matmul_->Prepare(la.ln2.data(), N * C, la.ln2_16),
      pw(kFcW), p(kFcB), N, C, H));
  // GELU, and its derivative kept in fch's place for the backward (one
  // sigmoid for both).
  trace.Next("gelu");
  Operand gelu{la.fch_gelu.data(), nullptr};
  if (mm_type == DType::kF32) {
    ops::GeluForwardSaveGrad(la.fch.data(), la.fch_gelu.data(), nullptr, N * H);
  } else {
    // Only the bf16 copy is read again (fc_proj and its weight gradient).
    Reserve(la.fch_gelu_16, N * H);
    ops::GeluForwardSaveGrad(la.fch.data(), nullptr, la.fch_gelu_16.data(),
                             N * H);
    gelu.bf16 = la.fch_gelu_16.data();
  }
  // residual3 = residual2 + fc_proj(gelu), the add in the matmul.
  trace.Next("fc_proj");
  RETURN_IF_ERROR(matmul_->LinearForward(
      la.residual3.data(), gelu, pw(kFcProjW), rank0 ? p(kFcProjB) : nullptr, N,
      H, C, rank0 ? la.residual2.data() : nullptr));
  return tensor_.AllReduce(la.residual3.data(), N * C);
}

Status GptBlock::Backward(int l, const LayerParams& params, float* grads,
                          const float* in, float* dresidual) {
  const int64_t N = int64_t{B_} * T_, C = config_.emb_dim, A = attn_dim_,
                H = mlp_dim_;
  const DType mm_type = matmul_->type();
  const Activations& la = acts_[l];
  Activations& d = d_;
  auto p = [&](int index) { return params.f32 + offsets_[index]; };
  auto pw = [&](int index) -> Operand {
    return {p(index), params.bf16 ? params.bf16 + offsets_[index] : nullptr};
  };
  auto g = [&](int index) { return grads + offsets_[index]; };
  const int Ci = static_cast<int>(C);
  runtime::OpSpans trace("layer", l, "backward");
  trace.Next("fc_proj");
  // residual3 = residual2 + fc_proj(...): both get dresidual.
  // d.fch = (dresidual @ fc_proj.w^T) * GELU'(fch): the GELU's backward is
  // the matmul's epilogue, with the derivative the forward kept in fch.
  RETURN_IF_ERROR(matmul_->LinearBackward(
      d.fch.data(), 0.0f, g(kFcProjW), g(kFcProjB),
      matmul_->Prepare(dresidual, N * C, dout16_),
      Operand{la.fch_gelu.data(), la.fch_gelu_16.data()}, pw(kFcProjW), N, H, C,
      la.fch.data()));
  const Operand dfch = matmul_->Prepare(d.fch.data(), N * H, dout16_);
  // Column-parallel fc: each rank's input gradient is a partial sum,
  // all-reduced while the weight gradient computes.
  trace.Next("fc");
  TensorParallel::Wait ln2_summed;
  RETURN_IF_ERROR(matmul_->LinearBackward(
      d.ln2.data(), 0.0f, g(kFcW), g(kFcB), dfch,
      Operand{la.ln2.data(), la.ln2_16.data()}, pw(kFcW), N, C, H, nullptr,
      [&] { ln2_summed = tensor_.StartAllReduce(d.ln2.data(), N * C); }));
  RETURN_IF_ERROR(ln2_summed());
  trace.Next("ln2");
  // d.residual2 = dresidual (skip path) + LayerNorm's input gradient.
  std::copy_n(dresidual, N * C, d.residual2.begin());
  std::fill(g(kLn2W), g(kLn2W) + C, 0.0f);
  std::fill(g(kLn2B), g(kLn2B) + C, 0.0f);
  ops::LayerNormBackward(d.residual2.data(), g(kLn2W), g(kLn2B), d.ln2.data(),
                         la.residual2.data(), p(kLn2W), la.ln2_mean.data(),
                         la.ln2_rstd.data(), N, Ci);
  trace.Next("attn_proj");
  // residual2 = in + attn_proj(...).
  RETURN_IF_ERROR(matmul_->LinearBackward(
      d.atty.data(), 0.0f, g(kAttnProjW), g(kAttnProjB),
      matmul_->Prepare(d.residual2.data(), N * C, dout16_),
      Operand{la.atty.data(), la.atty_16.data()}, pw(kAttnProjW), N, A, C));
  trace.Next("attention");
  Zero(d.qkv);
  RETURN_IF_ERROR(compute::AttentionBackward(
      d.qkv.data(), att_scratch_.data(), d.atty.data(), la.qkv.data(),
      la.att.data(), Shape(), mm_type,
      mm_type == DType::kF32 ? nullptr : la.qkv_16.data()));
  trace.Next("qkv");
  TensorParallel::Wait ln1_summed;
  RETURN_IF_ERROR(matmul_->LinearBackward(
      d.ln1.data(), 0.0f, g(kQkvW), g(kQkvB),
      matmul_->Prepare(d.qkv.data(), N * 3 * A, dout16_),
      Operand{la.ln1.data(), la.ln1_16.data()}, pw(kQkvW), N, C, 3 * A, nullptr,
      [&] { ln1_summed = tensor_.StartAllReduce(d.ln1.data(), N * C); }));
  RETURN_IF_ERROR(ln1_summed());
  trace.Next("ln1");
  std::copy(d.residual2.begin(), d.residual2.end(), dresidual);
  std::fill(g(kLn1W), g(kLn1W) + C, 0.0f);
  std::fill(g(kLn1B), g(kLn1B) + C, 0.0f);
  ops::LayerNormBackward(dresidual, g(kLn1W), g(kLn1B), d.ln1.data(), in,
                         p(kLn1W), la.ln1_mean.data(), la.ln1_rstd.data(), N,
                         Ci);
  return OkStatus();
}

}  // namespace

std::vector<TensorSpec> GptBlockTensors(const DecoderConfig& c, int t) {
  const int64_t C = c.emb_dim, A = c.emb_dim / t, H = c.mlp_dim / t;
  using S = TensorSplit;
  using I = TensorInit;
  return {
      {"ln1.w", {C}, S::kWhole, {}, I::kOne},
      {"ln1.b", {C}, S::kWhole, {}, I::kZero},
      {"qkv.w", {C, 3 * A}, S::kColumns, {C, C, C}, I::kNormal},
      {"qkv.b", {3 * A}, S::kColumns, {C, C, C}, I::kZero},
      {"attn_proj.w", {A, C}, S::kRows, {}, I::kResidual},
      {"attn_proj.b", {C}, S::kWhole, {}, I::kZero},
      {"ln2.w", {C}, S::kWhole, {}, I::kOne},
      {"ln2.b", {C}, S::kWhole, {}, I::kZero},
      {"fc.w", {C, H}, S::kColumns, {c.mlp_dim}, I::kNormal},
      {"fc.b", {H}, S::kColumns, {c.mlp_dim}, I::kZero},
      {"fc_proj.w", {H, C}, S::kRows, {}, I::kResidual},
      {"fc_proj.b", {C}, S::kWhole, {}, I::kZero},
  };
}

std::unique_ptr<DecoderBlock> MakeGptBlock(const DecoderConfig& config,
                                           int layers, TensorParallel tensor,
                                           MatmulRunner* matmul) {
  return std::make_unique<GptBlock>(config, layers, std::move(tensor), matmul);
}

}  // namespace multislice::model
