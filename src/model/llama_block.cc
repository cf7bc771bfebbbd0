// LlamaBlock: the Llama layer's forward and backward around llama_ops.h,
// attention.h and the MatmulRunner's matmuls.
#include "model/llama_block.h"

#include <algorithm>
#include <utility>

#include "compute/attention.h"
#include "compute/llama_ops.h"
#include "model/matmul_runner.h"
#include "runtime/trace.h"

namespace multislice::model {
namespace {

namespace ops = compute::llama;
using Operand = MatmulRunner::Operand;

// The layer's tensors, in layout order.
enum Tensor { kAttnNorm = 0, kQkv, kAttnProj, kMlpNorm, kGateUp, kDown };

// Saved activations of one layer (the backward's scratch mirrors them); the
// *16 vectors are bf16 copies of matmul inputs (bf16 matmuls only).
struct Activations {
  std::vector<float> attn_norm, attn_rstd;  // [N,C], [N]
  std::vector<float> qkv;                   // [N,W], q and k rotated
  std::vector<float> att;                   // [B,heads,T,T] softmax
  std::vector<float> atty;                  // [N,heads hd]
  std::vector<float> residual2;             // [N,C]
  std::vector<float> mlp_norm, mlp_rstd;    // [N,C], [N]
  std::vector<float> gate_up;               // [N,2H]
  std::vector<float> h;                     // [N,H]; f32 matmuls only
  std::vector<float> out;                   // [N,C]
  std::vector<uint16_t> attn_norm_16, qkv_16, atty_16, mlp_norm_16, h_16;

  void Size(int64_t N, int64_t C, int64_t W, int64_t O, int64_t H,
            int64_t att_size, bool f32_h) {
    attn_norm.assign(N * C, 0.0f);
    attn_rstd.assign(N, 0.0f);
    qkv.assign(N * W, 0.0f);
    att.assign(att_size, 0.0f);
    atty.assign(N * O, 0.0f);
    residual2.assign(N * C, 0.0f);
    mlp_norm.assign(N * C, 0.0f);
    mlp_rstd.assign(N, 0.0f);
    gate_up.assign(N * 2 * H, 0.0f);
    h.assign(f32_h ? N * H : 0, 0.0f);
    out.assign(N * C, 0.0f);
  }
};

class LlamaBlock : public DecoderBlock {
 public:
  LlamaBlock(const DecoderConfig& config, int layers, TensorParallel tensor,
             MatmulRunner* matmul)
      : config_(config),
        tensor_(std::move(tensor)),
        matmul_(matmul),
        layers_(layers),
        heads_(config.num_heads / tensor_.size),
        kv_heads_(config.num_kv_heads / tensor_.size),
        mlp_dim_(config.mlp_dim / tensor_.size),
        act_(config.mlp_activation == Activation::kSilu
                 ? ops::GateActivation::kSilu
                 : ops::GateActivation::kGelu),
        offsets_(TensorOffsets(LlamaBlockTensors(config, tensor_.size))) {}

  void Resize(int B, int T) override {
    B_ = B;
    T_ = T;
    const compute::AttentionShape s = Shape();
    const int64_t N = int64_t{B} * T, C = config_.emb_dim;
    const bool f32 = matmul_->type() == DType::kF32;
    acts_.resize(layers_);
    for (Activations& a : acts_) {
      a.Size(N, C, s.qkv_width(), s.out_width(), mlp_dim_, N * heads_ * T, f32);
    }
    d_.Size(N, C, s.qkv_width(), s.out_width(), mlp_dim_, 0, true);
    att_scratch_.assign(compute::AttentionScratchSize(s, matmul_->type()),
                        0.0f);
    const int64_t half = config_.head_dim / 2;
    cos_.assign(T * half, 0.0f);
    sin_.assign(T * half, 0.0f);
    ops::RopeTable(cos_.data(), sin_.data(), T, config_.head_dim,
                   config_.rope_max_timescale);
  }

  Status Forward(int l, const LayerParams& params, const float* in) override;
  const float* Output(int l) const override { return acts_[l].out.data(); }
  Status Backward(int l, const LayerParams& params, float* grads,
                  const float* in, float* dresidual) override;

 private:
  compute::AttentionShape Shape() const {
    compute::AttentionShape s;
    s.B = B_;
    s.T = T_;
    s.heads = heads_;
    s.kv_heads = kv_heads_;
    s.head_dim = config_.head_dim;
    return s;
  }
  // Rotates the q and k heads of a [N,W] buffer (qkv or its gradient).
  void Rotate(float* qkv, bool inverse) const {
    ops::Rope(qkv, Shape().qkv_width(), B_, T_, heads_ + kv_heads_,
              config_.head_dim, cos_.data(), sin_.data(), inverse);
  }
  float Epsilon() const { return static_cast<float>(config_.norm_epsilon); }

  const DecoderConfig config_;
  const TensorParallel tensor_;
  MatmulRunner* const matmul_;
  const int layers_;
  // This rank's query heads, key/value heads and MLP width.
  const int heads_, kv_heads_, mlp_dim_;
  const ops::GateActivation act_;
  const std::vector<int64_t> offsets_;  // of each tensor in the layer
  int B_ = 0, T_ = 0;
  std::vector<Activations> acts_;
  Activations d_;  // gradients of one layer's activations, reused
  std::vector<float> att_scratch_;
  std::vector<float> cos_, sin_;  // RopeTable for T
  std::vector<uint16_t> dout16_;  // bf16 copy of a linear's output gradient
};

Status LlamaBlock::Forward(int l, const LayerParams& params, const float* in) {
  const compute::AttentionShape s = Shape();
  const int64_t N = int64_t{B_} * T_, C = config_.emb_dim, W = s.qkv_width(),
                O = s.out_width(), H = mlp_dim_;
  const bool rank0 = tensor_.rank == 0;
  Activations& la = acts_[l];
  auto p = [&](int index) { return params.f32 + offsets_[index]; };
  auto pw = [&](int index) -> Operand {
    return {p(index), params.bf16 ? params.bf16 + offsets_[index] : nullptr};
  };
  runtime::OpSpans trace("layer", l, "forward");
  trace.Next("attn_norm");
  ops::RmsNormForward(la.attn_norm.data(), la.attn_rstd.data(), in,
                      p(kAttnNorm), N, static_cast<int>(C), Epsilon());
  trace.Next("qkv");
  RETURN_IF_ERROR(matmul_->LinearForward(
      la.qkv.data(),
      matmul_->Prepare(la.attn_norm.data(), N * C, la.attn_norm_16), pw(kQkv),
      nullptr, N, C, W));
  trace.Next("rope");
  Rotate(la.qkv.data(), /*inverse=*/false);
  // qkv in bf16 once, for the attention's forward and backward.
  const uint16_t* qkv16 =
      matmul_->Prepare(la.qkv.data(), N * W, la.qkv_16).bf16;
  trace.Next("attention");
  RETURN_IF_ERROR(compute::AttentionForward(la.atty.data(), la.att.data(),
                                            att_scratch_.data(), la.qkv.data(),
                                            s, matmul_->type(), qkv16));
  // residual2 = in + attn_proj(atty); a rank's product is a partial sum.
  trace.Next("attn_proj");
  RETURN_IF_ERROR(matmul_->LinearForward(
      la.residual2.data(), matmul_->Prepare(la.atty.data(), N * O, la.atty_16),
      pw(kAttnProj), nullptr, N, O, C, rank0 ? in : nullptr));
  RETURN_IF_ERROR(tensor_.AllReduce(la.residual2.data(), N * C));
  trace.Next("mlp_norm");
  ops::RmsNormForward(la.mlp_norm.data(), la.mlp_rstd.data(),
                      la.residual2.data(), p(kMlpNorm), N, static_cast<int>(C),
                      Epsilon());
  trace.Next("gate_up");
  RETURN_IF_ERROR(matmul_->LinearForward(
      la.gate_up.data(),
      matmul_->Prepare(la.mlp_norm.data(), N * C, la.mlp_norm_16), pw(kGateUp),
      nullptr, N, C, 2 * H));
  trace.Next("gated");
  Operand h{la.h.data(), nullptr};
  if (matmul_->type() == DType::kF32) {
    ops::GatedForward(act_, la.gate_up.data(), la.h.data(), nullptr, N,
                      static_cast<int>(H));
  } else {
    // Only the bf16 copy is read again (down and its weight gradient).
    Reserve(la.h_16, N * H);
    ops::GatedForward(act_, la.gate_up.data(), nullptr, la.h_16.data(), N,
                      static_cast<int>(H));
    h.bf16 = la.h_16.data();
  }
  trace.Next("down");
  RETURN_IF_ERROR(
      matmul_->LinearForward(la.out.data(), h, pw(kDown), nullptr, N, H, C,
                             rank0 ? la.residual2.data() : nullptr));
  return tensor_.AllReduce(la.out.data(), N * C);
}

Status LlamaBlock::Backward(int l, const LayerParams& params, float* grads,
                            const float* in, float* dresidual) {
  const compute::AttentionShape s = Shape();
  const int64_t N = int64_t{B_} * T_, C = config_.emb_dim, W = s.qkv_width(),
                O = s.out_width(), H = mlp_dim_;
  const int Ci = static_cast<int>(C);
  const DType mm_type = matmul_->type();
  const Activations& la = acts_[l];
  Activations& d = d_;
  auto p = [&](int index) { return params.f32 + offsets_[index]; };
  auto pw = [&](int index) -> Operand {
    return {p(index), params.bf16 ? params.bf16 + offsets_[index] : nullptr};
  };
  auto g = [&](int index) { return grads + offsets_[index]; };
  runtime::OpSpans trace("layer", l, "backward");
  // out = residual2 + down(h): both get dresidual.
  trace.Next("down");
  RETURN_IF_ERROR(matmul_->LinearBackward(
      d.h.data(), 0.0f, g(kDown), nullptr,
      matmul_->Prepare(dresidual, N * C, dout16_),
      Operand{la.h.data(), la.h_16.data()}, pw(kDown), N, H, C));
  trace.Next("gated");
  ops::GatedBackward(act_, d.gate_up.data(), d.h.data(), la.gate_up.data(), N,
                     static_cast<int>(H));
  // Column-parallel gate_up: each rank's input gradient is a partial sum,
  // all-reduced while the weight gradient computes.
  trace.Next("gate_up");
  TensorParallel::Wait mlp_norm_summed;
  RETURN_IF_ERROR(matmul_->LinearBackward(
      d.mlp_norm.data(), 0.0f, g(kGateUp), nullptr,
      matmul_->Prepare(d.gate_up.data(), N * 2 * H, dout16_),
      Operand{la.mlp_norm.data(), la.mlp_norm_16.data()}, pw(kGateUp), N, C,
      2 * H, nullptr, [&] {
        mlp_norm_summed = tensor_.StartAllReduce(d.mlp_norm.data(), N * C);
      }));
  RETURN_IF_ERROR(mlp_norm_summed());
  trace.Next("mlp_norm");
  // d.residual2 = dresidual (skip path) + the norm's input gradient.
  std::copy_n(dresidual, N * C, d.residual2.begin());
  std::fill(g(kMlpNorm), g(kMlpNorm) + C, 0.0f);
  ops::RmsNormBackwardAccumulate(d.residual2.data(), g(kMlpNorm),
                                 d.mlp_norm.data(), la.residual2.data(),
                                 p(kMlpNorm), la.mlp_rstd.data(), N, Ci);
  trace.Next("attn_proj");
  RETURN_IF_ERROR(matmul_->LinearBackward(
      d.atty.data(), 0.0f, g(kAttnProj), nullptr,
      matmul_->Prepare(d.residual2.data(), N * C, dout16_),
      Operand{la.atty.data(), la.atty_16.data()}, pw(kAttnProj), N, O, C));
  trace.Next("attention");
  std::fill(d.qkv.begin(), d.qkv.end(), 0.0f);
  RETURN_IF_ERROR(compute::AttentionBackward(
      d.qkv.data(), att_scratch_.data(), d.atty.data(), la.qkv.data(),
      la.att.data(), s, mm_type,
      mm_type == DType::kF32 ? nullptr : la.qkv_16.data()));
  trace.Next("rope");
  Rotate(d.qkv.data(), /*inverse=*/true);
  trace.Next("qkv");
  TensorParallel::Wait attn_norm_summed;
  RETURN_IF_ERROR(matmul_->LinearBackward(
      d.attn_norm.data(), 0.0f, g(kQkv), nullptr,
      matmul_->Prepare(d.qkv.data(), N * W, dout16_),
      Operand{la.attn_norm.data(), la.attn_norm_16.data()}, pw(kQkv), N, C, W,
      nullptr, [&] {
        attn_norm_summed = tensor_.StartAllReduce(d.attn_norm.data(), N * C);
      }));
  RETURN_IF_ERROR(attn_norm_summed());
  trace.Next("attn_norm");
  std::copy(d.residual2.begin(), d.residual2.end(), dresidual);
  std::fill(g(kAttnNorm), g(kAttnNorm) + C, 0.0f);
  ops::RmsNormBackwardAccumulate(dresidual, g(kAttnNorm), d.attn_norm.data(),
                                 in, p(kAttnNorm), la.attn_rstd.data(), N, Ci);
  return OkStatus();
}

}  // namespace

std::vector<TensorSpec> LlamaBlockTensors(const DecoderConfig& c, int t) {
  const int64_t C = c.emb_dim, hd = c.head_dim, H = c.mlp_dim;
  const int64_t q = c.num_heads * hd, kv = c.num_kv_heads * hd;
  using S = TensorSplit;
  using I = TensorInit;
  return {
      {"attn_norm.w", {C}, S::kWhole, {}, I::kOne},
      {"qkv.w", {C, (q + 2 * kv) / t}, S::kColumns, {q, kv, kv}, I::kNormal},
      {"attn_proj.w", {q / t, C}, S::kRows, {}, I::kResidual},
      {"mlp_norm.w", {C}, S::kWhole, {}, I::kOne},
      {"gate_up.w", {C, 2 * H / t}, S::kColumns, {H, H}, I::kNormal},
      {"down.w", {H / t, C}, S::kRows, {}, I::kResidual},
  };
}

std::unique_ptr<DecoderBlock> MakeLlamaBlock(const DecoderConfig& config,
                                             int layers, TensorParallel tensor,
                                             MatmulRunner* matmul) {
  return std::make_unique<LlamaBlock>(config, layers, std::move(tensor),
                                      matmul);
}

}  // namespace multislice::model
