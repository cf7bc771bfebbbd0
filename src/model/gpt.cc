// GPT-2 forward and backward on one device: parameter layout, initialisation
// and the activation bookkeeping around the gpt_ops.h kernels and the oneDNN
// matmuls.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/dtype.h"
#include "compute/elementwise.h"
#include "compute/gpt_ops.h"
#include "compute/matmul.h"
#include "compute/random.h"
#include "model/tensor_shard.h"
#include "runtime/trace.h"

namespace multislice::model::gpt {

namespace ops = compute::gpt;
namespace {

// Tensors per transformer block, in layout order.
constexpr int kTensorsPerLayer = 12;
enum LayerTensor {
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
constexpr float kInitStd = 0.02f;

}  // namespace

namespace {
// Grows v to at least n elements, never shrinks it: a scratch vector reused
// at several sizes is then zero-filled only once.
void Reserve(std::vector<uint16_t>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
}
}  // namespace

// Runs the model's matmuls on f32 operands: directly in f32, or in bf16 on
// bf16 copies of both operands (accumulation and C stay f32). A caller that
// uses an operand more than once passes its bf16 copy (the weights are
// rounded once per Forward, an activation once when it is made); other
// operands are rounded here into scratch.
class GptModel::Matmul {
 public:
  // An f32 operand and, in bf16 mode, optionally its bf16 copy.
  struct Operand {
    const float* f32 = nullptr;
    const uint16_t* bf16 = nullptr;
  };

  explicit Matmul(DType ab_type) : ab_type_(ab_type) {}

  DType type() const { return ab_type_; }

  // In bf16 mode, rounds x[0, n) into `store` and returns {x, store}; in f32
  // mode returns {x, null}.
  Operand Prepare(const float* x, int64_t n, std::vector<uint16_t>& store) {
    if (ab_type_ == DType::kF32) return {x, nullptr};
    Reserve(store, n);
    ops::ToBf16(x, store.data(), n);
    return {x, store.data()};
  }

  // C[m,n] (beta 0: =, beta 1: +=) op(A)[m,k] @ op(B)[k,n], dense operands.
  Status Run(compute::GemmDesc desc, Operand a, Operand b, float* c,
             const float* bias = nullptr, const float* d = nullptr) {
    desc.c_type = DType::kF32;
    desc.ab_type = ab_type_;
    if (ab_type_ == DType::kF32) {
      return compute::Gemm(desc, a.f32, b.f32, c, bias, d);
    }
    if (a.bf16 == nullptr) a = Prepare(a.f32, desc.m * desc.k, a16_);
    if (b.bf16 == nullptr) b = Prepare(b.f32, desc.k * desc.n, b16_);
    return compute::Gemm(desc, a.bf16, b.bf16, c, bias, d);
  }

  // out[N,OC] = inp[N,IC] @ weight[IC,OC] (+ bias) (+ residual[N,OC]): the
  // bias and the residual are added in the matmul's epilogue.
  Status LinearForward(float* out, Operand inp, Operand weight,
                       const float* bias, int64_t N, int64_t IC, int64_t OC,
                       const float* residual = nullptr) {
    compute::GemmDesc desc;
    desc.m = N;
    desc.n = OC;
    desc.k = IC;
    desc.bias = bias != nullptr;
    if (residual != nullptr) desc.epilogue = compute::GemmDesc::Epilogue::kAdd;
    return Run(desc, inp, weight, out, bias, residual);
  }

  // dinp[N,IC] (dinp_beta 0: =, 1: +=) dout[N,OC] @ weight^T, times
  // dinp_scale[N,IC] element by element when non-null (an activation's
  // derivative, in the matmul's epilogue); dweight[IC,OC] = inp^T @ dout;
  // dbias[OC] = column sums of dout (when non-null). after_dinp, if set,
  // runs once dinp is written, before the weight gradient.
  Status LinearBackward(float* dinp, float dinp_beta, float* dweight,
                        float* dbias, Operand dout, Operand inp, Operand weight,
                        int64_t N, int64_t IC, int64_t OC,
                        const float* dinp_scale = nullptr,
                        const std::function<void()>& after_dinp = {}) {
    compute::GemmDesc dx;
    dx.m = N;
    dx.n = IC;
    dx.k = OC;
    dx.transpose_b = true;  // weight is [IC,OC] = [n,k]
    dx.beta = dinp_beta;
    if (dinp_scale != nullptr) {
      dx.epilogue = compute::GemmDesc::Epilogue::kMultiply;
    }
    RETURN_IF_ERROR(Run(dx, dout, weight, dinp, nullptr, dinp_scale));
    if (after_dinp) after_dinp();
    compute::GemmDesc dw;
    dw.m = IC;
    dw.n = OC;
    dw.k = N;
    dw.transpose_a = true;  // inp is [N,IC] = [k,m]
    RETURN_IF_ERROR(Run(dw, inp, dout, dweight));
    if (dbias != nullptr) {
      std::fill(dbias, dbias + OC, 0.0f);
      ops::BiasBackward(dbias, dout.f32, N, static_cast<int>(OC));
    }
    return OkStatus();
  }

 private:
  DType ab_type_;
  std::vector<uint16_t> a16_, b16_;  // bf16 copies of A and B
};

namespace {

void Zero(std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); }

}  // namespace

Status ValidateConfig(const GptConfig& c) {
  auto positive = [](const char* field, int value) -> Status {
    if (value > 0) return OkStatus();
    return InvalidArgument("GptConfig." + std::string(field) + " is " +
                           std::to_string(value) + "; expected > 0");
  };
  RETURN_IF_ERROR(positive("vocab_size", c.vocab_size));
  RETURN_IF_ERROR(positive("max_seq_len", c.max_seq_len));
  RETURN_IF_ERROR(positive("emb_dim", c.emb_dim));
  RETURN_IF_ERROR(positive("num_heads", c.num_heads));
  RETURN_IF_ERROR(positive("num_layers", c.num_layers));
  RETURN_IF_ERROR(positive("mlp_dim", c.mlp_dim));
  if (c.emb_dim % c.num_heads != 0) {
    return InvalidArgument("GptConfig.emb_dim " + std::to_string(c.emb_dim) +
                           " is not divisible by num_heads " +
                           std::to_string(c.num_heads));
  }
  return OkStatus();
}

std::vector<ParamTensor> ParameterLayout(const GptConfig& c, int t,
                                         const PipelineStage& stage) {
  const int64_t V = c.vocab_size, T = c.max_seq_len, C = c.emb_dim,
                H = c.mlp_dim / t, A = c.emb_dim / t;
  const int per_stage = c.num_layers / stage.count;
  const int first_layer = stage.index * per_stage;
  std::vector<ParamTensor> layout;
  int64_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    int64_t size = 1;
    for (int64_t d : shape) size *= d;
    layout.push_back({std::move(name), std::move(shape), offset, size});
    offset += size;
  };
  if (stage.first() || stage.last()) add("wte", {V, C});
  if (stage.first()) add("wpe", {T, C});
  for (int l = first_layer; l < first_layer + per_stage; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    add(p + "ln1.w", {C});
    add(p + "ln1.b", {C});
    add(p + "qkv.w", {C, 3 * A});
    add(p + "qkv.b", {3 * A});
    add(p + "attn_proj.w", {A, C});
    add(p + "attn_proj.b", {C});
    add(p + "ln2.w", {C});
    add(p + "ln2.b", {C});
    add(p + "fc.w", {C, H});
    add(p + "fc.b", {H});
    add(p + "fc_proj.w", {H, C});
    add(p + "fc_proj.b", {C});
  }
  if (stage.last()) {
    add("lnf.w", {C});
    add("lnf.b", {C});
  }
  return layout;
}

std::vector<ParamTensor> ParameterLayout(const GptConfig& config, int t) {
  return ParameterLayout(config, t, PipelineStage{});
}

int64_t NumParameters(const GptConfig& config, int tensor_parallelism,
                      const PipelineStage& stage) {
  const std::vector<ParamTensor> layout =
      ParameterLayout(config, tensor_parallelism, stage);
  return layout.back().offset + layout.back().size;
}

int64_t NumParameters(const GptConfig& config, int tensor_parallelism) {
  return NumParameters(config, tensor_parallelism, PipelineStage{});
}

Status ValidatePipeline(const GptConfig& config, int stages) {
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

namespace {
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void InitParameters(const GptConfig& config, uint64_t seed, float* params) {
  const std::vector<ParamTensor> layout = ParameterLayout(config);
  const float residual_scale =
      1.0f / std::sqrt(2.0f * static_cast<float>(config.num_layers));
  for (size_t i = 0; i < layout.size(); ++i) {
    const ParamTensor& t = layout[i];
    float* out = params + t.offset;
    if (t.shape.size() == 2) {
      const bool residual =
          EndsWith(t.name, "attn_proj.w") || EndsWith(t.name, "fc_proj.w");
      const float scale = kInitStd * (residual ? residual_scale : 1.0f);
      compute::FillBlock(compute::Distribution::kNormal, seed, i, scale,
                         t.shape[1], 0, 0, t.shape[0], t.shape[1],
                         /*transposed=*/false, DType::kF32, out, t.shape[1]);
    } else {
      const bool ln_weight = EndsWith(t.name, "ln1.w") ||
                             EndsWith(t.name, "ln2.w") || t.name == "lnf.w";
      std::fill(out, out + t.size, ln_weight ? 1.0f : 0.0f);
    }
  }
}

std::vector<uint8_t> WeightDecayMask(const GptConfig& config,
                                     int tensor_parallelism,
                                     const PipelineStage& stage) {
  const std::vector<ParamTensor> layout =
      ParameterLayout(config, tensor_parallelism, stage);
  std::vector<uint8_t> mask(
      static_cast<size_t>(layout.back().offset + layout.back().size), 0);
  for (const ParamTensor& t : layout) {
    if (t.shape.size() == 2) {
      std::fill(mask.begin() + t.offset, mask.begin() + t.offset + t.size, 1);
    }
  }
  return mask;
}

// Saved activations of one block; gradient scratch mirrors them. The *16
// vectors are bf16 copies of the matmul inputs (bf16 matmuls only), made once
// in the forward and read again by the weight gradients.
struct LayerActivations {
  std::vector<float> ln1, ln1_mean, ln1_rstd;  // [N,C], [N], [N]
  std::vector<float> qkv;                      // [N,3C]
  std::vector<float> atty;                     // [N,C]
  std::vector<float> att;                      // [B,NH,T,T] softmax
  std::vector<float> residual2;                // [N,C]
  std::vector<float> ln2, ln2_mean, ln2_rstd;  // [N,C], [N], [N]
  // [N,mlp]: the fc matmul's output, then GELU'(that) for the backward.
  std::vector<float> fch;
  std::vector<float> fch_gelu;   // [N,mlp]; f32 matmuls only (bf16 keep *_16)
  std::vector<float> residual3;  // [N,C]
  std::vector<uint16_t> ln1_16, qkv_16, atty_16, ln2_16, fch_gelu_16;
};

struct GptModel::Activations {
  std::vector<int32_t> tokens, targets;
  std::vector<uint16_t> params16;  // bf16 copy of the parameters
  std::vector<float> encoded;      // [N,C]
  std::vector<LayerActivations> layers;
  std::vector<float> lnf, lnf_mean, lnf_rstd;  // [N,C], [N], [N]
  std::vector<uint16_t> lnf_16;
  std::vector<float> logits, probs;  // [N,V]
  std::vector<float> losses;         // [N]
  std::vector<float> att_scratch;    // AttentionScratchSize
  // Backward scratch: gradients of one block's activations, reused per block.
  LayerActivations dlayer;
  std::vector<float> dresidual;  // [N,C], gradient of the residual stream
  std::vector<float> dlnf;       // [N,C]
  std::vector<float> dlogits;    // [N,V]
  std::vector<float> dlosses;    // [N]
  std::vector<uint16_t> dout16;  // bf16 copy of a linear's output gradient
};

namespace {
// A: the attention's width (C, or C/t on a tensor-parallel rank); H the
// MLP's.
void SizeLayer(LayerActivations& a, int64_t N, int64_t C, int64_t A, int64_t H,
               int64_t att, bool f32_gelu) {
  a.ln1.assign(N * C, 0.0f);
  a.ln1_mean.assign(N, 0.0f);
  a.ln1_rstd.assign(N, 0.0f);
  a.qkv.assign(N * 3 * A, 0.0f);
  a.atty.assign(N * A, 0.0f);
  a.att.assign(att, 0.0f);
  a.residual2.assign(N * C, 0.0f);
  a.ln2.assign(N * C, 0.0f);
  a.ln2_mean.assign(N, 0.0f);
  a.ln2_rstd.assign(N, 0.0f);
  a.fch.assign(N * H, 0.0f);
  a.fch_gelu.assign(f32_gelu ? N * H : 0, 0.0f);
  a.residual3.assign(N * C, 0.0f);
}
}  // namespace

GptModel::GptModel(const GptConfig& config, DType matmul_type,
                   TensorParallel tensor, PipelineStage stage)
    : config_(config),
      tensor_(std::move(tensor)),
      stage_(stage),
      num_layers_(config.num_layers / std::max(1, stage.count)),
      layer_base_((stage.first() ? 2 : 0) + (stage.last() ? 1 : 0) -
                  (stage.first() && stage.last() ? 1 : 0)),
      wte_(stage.first() || stage.last() ? 0 : -1),
      wpe_(stage.first() ? 1 : -1),
      lnf_(stage.last() ? layer_base_ + num_layers_ * kTensorsPerLayer : -1),
      attn_dim_(config.emb_dim / tensor_.size),
      heads_(config.num_heads / tensor_.size),
      mlp_dim_(config.mlp_dim / tensor_.size),
      layout_(ParameterLayout(config, tensor_.size, stage)),
      acts_(std::make_unique<Activations>()),
      matmul_(std::make_unique<Matmul>(matmul_type)) {}

GptModel::~GptModel() = default;

Status GptModel::TensorAllReduce(float* buf, int64_t count) {
  if (tensor_.size == 1) return OkStatus();
  return tensor_.all_reduce(buf, count);
}

TensorParallel::Wait GptModel::StartTensorAllReduce(float* buf, int64_t count) {
  if (tensor_.size > 1 && tensor_.start_all_reduce) {
    return tensor_.start_all_reduce(buf, count);
  }
  Status done = TensorAllReduce(buf, count);
  return [done] { return done; };
}

int64_t GptModel::LayerOffset(int layer, int index) const {
  return layout_[layer_base_ + layer * kTensorsPerLayer + index].offset;
}

int64_t GptModel::LayerEnd(int layer) const {
  const ParamTensor& last =
      layout_[layer_base_ + (layer + 1) * kTensorsPerLayer - 1];
  return last.offset + last.size;
}

void GptModel::ZeroTensor(float* grads, size_t index) const {
  const ParamTensor& t = layout_[index];
  std::fill(grads + t.offset, grads + t.offset + t.size, 0.0f);
}

const float* GptModel::logits() const { return acts_->logits.data(); }

const float* GptModel::output() const {
  return num_layers_ > 0 ? acts_->layers.back().residual3.data()
                         : acts_->encoded.data();
}

const float* GptModel::input_grad() const { return acts_->dresidual.data(); }

Status GptModel::CheckForwardInputs(const int32_t* tokens,
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
        std::to_string(config_.max_seq_len) + " (GptConfig.max_seq_len)");
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

Result<float> GptModel::Forward(const float* params, const int32_t* tokens,
                                const int32_t* targets, int B, int T,
                                const float* input) {
  have_loss_ = have_forward_ = false;
  RETURN_IF_ERROR(CheckForwardInputs(tokens, targets, input, B, T));
  // NH, A and H are this rank's heads, attention width and MLP width (the
  // whole model's without tensor parallelism); L this stage's layers.
  const int V = config_.vocab_size, C = config_.emb_dim, NH = heads_,
            A = attn_dim_, H = mlp_dim_, L = num_layers_;
  const bool rank0 = tensor_.rank == 0;
  const int64_t N = int64_t{B} * T;
  Activations& a = *acts_;
  const DType mm_type = matmul_->type();
  if (B != B_ || T != T_ || a.layers.size() != static_cast<size_t>(L)) {
    const int64_t att = N * NH * T;
    a.encoded.assign(N * C, 0.0f);
    a.layers.resize(L);
    const bool f32 = mm_type == DType::kF32;
    for (LayerActivations& la : a.layers) SizeLayer(la, N, C, A, H, att, f32);
    SizeLayer(a.dlayer, N, C, A, H, 0, false);
    // The head's buffers on the last stage only.
    const int64_t head = stage_.last() ? N : 0;
    a.lnf.assign(head * C, 0.0f);
    a.lnf_mean.assign(head, 0.0f);
    a.lnf_rstd.assign(head, 0.0f);
    a.logits.assign(head * V, 0.0f);
    a.probs.assign(head * V, 0.0f);
    a.losses.assign(head, 0.0f);
    a.att_scratch.assign(ops::AttentionScratchSize(B, T, A, mm_type), 0.0f);
    a.dresidual.assign(N * C, 0.0f);
    a.dlnf.assign(head * C, 0.0f);
    a.dlogits.assign(head * V, 0.0f);
    a.dlosses.assign(head, 0.0f);
    B_ = B;
    T_ = T;
  }
  if (stage_.first()) a.tokens.assign(tokens, tokens + N);

  // The weights in bf16, once per step (Backward reuses them).
  const int64_t num_params = layout_.back().offset + layout_.back().size;
  matmul_->Prepare(params, num_params, a.params16);
  auto w = [&](int64_t offset) -> Matmul::Operand {
    return {params + offset,
            mm_type == DType::kF32 ? nullptr : a.params16.data() + offset};
  };

  if (stage_.first()) {
    runtime::OpSpans trace("encoder", 0, "forward");
    trace.Next("embed");
    ops::EncoderForward(a.encoded.data(), tokens, params + layout_[wte_].offset,
                        params + layout_[wpe_].offset, B, T, C);
  } else {
    std::copy_n(input, N * C, a.encoded.data());
  }
  const float* residual = a.encoded.data();
  for (int l = 0; l < L; ++l) {
    LayerActivations& la = a.layers[l];
    auto p = [&](int index) { return params + LayerOffset(l, index); };
    auto pw = [&](int index) { return w(LayerOffset(l, index)); };
    runtime::OpSpans trace("layer", l, "forward");
    trace.Next("ln1");
    ops::LayerNormForward(la.ln1.data(), la.ln1_mean.data(), la.ln1_rstd.data(),
                          residual, p(kLn1W), p(kLn1B), N, C);
    trace.Next("qkv");
    RETURN_IF_ERROR(matmul_->LinearForward(
        la.qkv.data(), matmul_->Prepare(la.ln1.data(), N * C, la.ln1_16),
        pw(kQkvW), p(kQkvB), N, C, 3 * A));
    // qkv in bf16 once, for the attention's forward and backward.
    const uint16_t* qkv16 =
        matmul_->Prepare(la.qkv.data(), N * 3 * A, la.qkv_16).bf16;
    trace.Next("attention");
    RETURN_IF_ERROR(ops::AttentionForward(la.atty.data(), la.att.data(),
                                          a.att_scratch.data(), la.qkv.data(),
                                          B, T, A, NH, mm_type, qkv16));
    // residual2 = residual + attn_proj(...), the add in the matmul. Under
    // tensor parallelism each rank's product is a partial sum: rank 0 adds
    // the bias and the residual, the all-reduce the rest.
    trace.Next("attn_proj");
    RETURN_IF_ERROR(matmul_->LinearForward(
        la.residual2.data(),
        matmul_->Prepare(la.atty.data(), N * A, la.atty_16), pw(kAttnProjW),
        rank0 ? p(kAttnProjB) : nullptr, N, A, C, rank0 ? residual : nullptr));
    RETURN_IF_ERROR(TensorAllReduce(la.residual2.data(), N * C));
    trace.Next("ln2");
    ops::LayerNormForward(la.ln2.data(), la.ln2_mean.data(), la.ln2_rstd.data(),
                          la.residual2.data(), p(kLn2W), p(kLn2B), N, C);
    trace.Next("fc");
    RETURN_IF_ERROR(matmul_->LinearForward(
        la.fch.data(), matmul_->Prepare(la.ln2.data(), N * C, la.ln2_16),
        pw(kFcW), p(kFcB), N, C, H));
    // GELU, and its derivative kept in fch's place for the backward (one
    // sigmoid for both).
    trace.Next("gelu");
    Matmul::Operand gelu{la.fch_gelu.data(), nullptr};
    if (mm_type == DType::kF32) {
      ops::GeluForwardSaveGrad(la.fch.data(), la.fch_gelu.data(), nullptr,
                               N * H);
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
        la.residual3.data(), gelu, pw(kFcProjW), rank0 ? p(kFcProjB) : nullptr,
        N, H, C, rank0 ? la.residual2.data() : nullptr));
    RETURN_IF_ERROR(TensorAllReduce(la.residual3.data(), N * C));
    residual = la.residual3.data();
  }
  have_forward_ = true;
  if (!stage_.last()) return 0.0f;
  runtime::OpSpans trace("head", 0, "forward");
  trace.Next("lnf");
  const size_t lnf_index = static_cast<size_t>(lnf_);
  ops::LayerNormForward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(),
                        residual, params + layout_[lnf_index].offset,
                        params + layout_[lnf_index + 1].offset, N, C);
  // Tied head: logits[N,V] = lnf[N,C] @ wte^T, wte stored [V,C] = [n,k].
  compute::GemmDesc head;
  head.m = N;
  head.n = V;
  head.k = C;
  head.transpose_b = true;
  trace.Next("logits");
  RETURN_IF_ERROR(matmul_->Run(head,
                               matmul_->Prepare(a.lnf.data(), N * C, a.lnf_16),
                               w(layout_[wte_].offset), a.logits.data()));
  if (targets == nullptr) return 0.0f;

  trace.Next("cross_entropy");
  a.targets.assign(targets, targets + N);
  ops::CrossEntropyForward(a.losses.data(), a.probs.data(), a.logits.data(),
                           targets, N, V);
  double sum = 0.0;
  for (int64_t i = 0; i < N; ++i) sum += a.losses[i];
  have_loss_ = true;
  return static_cast<float>(sum / static_cast<double>(N));
}

Status GptModel::Backward(const float* params, float* grads,
                          const GradientReady& ready,
                          const float* output_grad) {
  if (stage_.last() && !have_loss_) {
    return FailedPrecondition(
        "GptModel::Backward needs a successful Forward with targets first");
  }
  if (!stage_.last() && (!have_forward_ || output_grad == nullptr)) {
    return FailedPrecondition(
        "GptModel::Backward on pipeline stage " + std::to_string(stage_.index) +
        " needs a successful Forward and the gradient of its output");
  }
  Activations& a = *acts_;
  const int B = B_, T = T_, V = config_.vocab_size, C = config_.emb_dim,
            NH = heads_, A = attn_dim_, H = mlp_dim_, L = num_layers_;
  const int64_t N = int64_t{B} * T;
  const DType mm_type = matmul_->type();
  // Forward's bf16 weights: params are unchanged since (see gpt.h).
  auto w = [&](int64_t offset) -> Matmul::Operand {
    return {params + offset,
            mm_type == DType::kF32 ? nullptr : a.params16.data() + offset};
  };
  using Operand = Matmul::Operand;

  auto done = [&](int64_t begin, int64_t end) {
    if (ready) ready(begin, end - begin);
  };
  float* dwte = wte_ >= 0 ? grads + layout_[wte_].offset : nullptr;
  if (stage_.last()) {
    runtime::OpSpans trace("head", 0, "backward");
    trace.Next("cross_entropy");
    std::fill(a.dlosses.begin(), a.dlosses.end(), 1.0f / static_cast<float>(N));
    Zero(a.dlogits);
    ops::CrossEntropySoftmaxBackward(a.dlogits.data(), a.dlosses.data(),
                                     a.probs.data(), a.targets.data(), N, V);
    // logits = lnf @ wte^T: dlnf = dlogits @ wte, dwte = dlogits^T @ lnf (the
    // first write of dwte; the encoder adds its part at the end).
    trace.Next("logits");
    const Operand dlogits = matmul_->Prepare(a.dlogits.data(), N * V, a.dout16);
    compute::GemmDesc dx;
    dx.m = N;
    dx.n = C;
    dx.k = V;
    RETURN_IF_ERROR(
        matmul_->Run(dx, dlogits, w(layout_[wte_].offset), a.dlnf.data()));
    compute::GemmDesc dw;
    dw.m = V;
    dw.n = C;
    dw.k = N;
    dw.transpose_a = true;  // dlogits is [N,V] = [k,m]
    RETURN_IF_ERROR(matmul_->Run(dw, dlogits,
                                 Operand{a.lnf.data(), a.lnf_16.data()}, dwte));

    trace.Next("lnf");
    const size_t lnf_index = static_cast<size_t>(lnf_);
    const float* last_residual =
        L > 0 ? a.layers[L - 1].residual3.data() : a.encoded.data();
    Zero(a.dresidual);
    ZeroTensor(grads, lnf_index);
    ZeroTensor(grads, lnf_index + 1);
    ops::LayerNormBackward(a.dresidual.data(),
                           grads + layout_[lnf_index].offset,
                           grads + layout_[lnf_index + 1].offset, a.dlnf.data(),
                           last_residual, params + layout_[lnf_index].offset,
                           a.lnf_mean.data(), a.lnf_rstd.data(), N, C);
    done(layout_[lnf_index].offset,
         layout_.back().offset + layout_.back().size);
  } else {
    std::copy_n(output_grad, N * C, a.dresidual.data());
  }

  // a.dresidual holds d(loss)/d(output of block l) on entry to iteration l
  // and d(loss)/d(input of block l) on exit. Input gradients that a matmul
  // writes whole use beta 0 and need no zeroing.
  LayerActivations& d = a.dlayer;
  for (int l = L - 1; l >= 0; --l) {
    const LayerActivations& la = a.layers[l];
    const float* block_input =
        l > 0 ? a.layers[l - 1].residual3.data() : a.encoded.data();
    auto p = [&](int index) { return params + LayerOffset(l, index); };
    auto pw = [&](int index) { return w(LayerOffset(l, index)); };
    auto g = [&](int index) { return grads + LayerOffset(l, index); };
    runtime::OpSpans trace("layer", l, "backward");
    trace.Next("fc_proj");
    // residual3 = residual2 + fc_proj(...): both get dresidual.
    // d.fch = (dresidual @ fc_proj.w^T) * GELU'(fch): the GELU's backward is
    // the matmul's epilogue, with the derivative the forward kept in fch.
    RETURN_IF_ERROR(matmul_->LinearBackward(
        d.fch.data(), 0.0f, g(kFcProjW), g(kFcProjB),
        matmul_->Prepare(a.dresidual.data(), N * C, a.dout16),
        Operand{la.fch_gelu.data(), la.fch_gelu_16.data()}, pw(kFcProjW), N, H,
        C, la.fch.data()));
    const Operand dfch = matmul_->Prepare(d.fch.data(), N * H, a.dout16);
    // Column-parallel fc: each rank's input gradient is a partial sum,
    // all-reduced while the weight gradient computes.
    trace.Next("fc");
    TensorParallel::Wait ln2_summed;
    RETURN_IF_ERROR(matmul_->LinearBackward(
        d.ln2.data(), 0.0f, g(kFcW), g(kFcB), dfch,
        Operand{la.ln2.data(), la.ln2_16.data()}, pw(kFcW), N, C, H, nullptr,
        [&] { ln2_summed = StartTensorAllReduce(d.ln2.data(), N * C); }));
    RETURN_IF_ERROR(ln2_summed());
    trace.Next("ln2");
    // d.residual2 = dresidual (skip path) + LayerNorm's input gradient.
    std::copy(a.dresidual.begin(), a.dresidual.end(), d.residual2.begin());
    std::fill(g(kLn2W), g(kLn2W) + C, 0.0f);
    std::fill(g(kLn2B), g(kLn2B) + C, 0.0f);
    ops::LayerNormBackward(d.residual2.data(), g(kLn2W), g(kLn2B), d.ln2.data(),
                           la.residual2.data(), p(kLn2W), la.ln2_mean.data(),
                           la.ln2_rstd.data(), N, C);
    trace.Next("attn_proj");
    // residual2 = block_input + attn_proj(...).
    RETURN_IF_ERROR(matmul_->LinearBackward(
        d.atty.data(), 0.0f, g(kAttnProjW), g(kAttnProjB),
        matmul_->Prepare(d.residual2.data(), N * C, a.dout16),
        Operand{la.atty.data(), la.atty_16.data()}, pw(kAttnProjW), N, A, C));
    trace.Next("attention");
    Zero(d.qkv);
    RETURN_IF_ERROR(ops::AttentionBackward(
        d.qkv.data(), a.att_scratch.data(), d.atty.data(), la.qkv.data(),
        la.att.data(), B, T, A, NH, mm_type,
        mm_type == DType::kF32 ? nullptr : la.qkv_16.data()));
    trace.Next("qkv");
    TensorParallel::Wait ln1_summed;
    RETURN_IF_ERROR(matmul_->LinearBackward(
        d.ln1.data(), 0.0f, g(kQkvW), g(kQkvB),
        matmul_->Prepare(d.qkv.data(), N * 3 * A, a.dout16),
        Operand{la.ln1.data(), la.ln1_16.data()}, pw(kQkvW), N, C, 3 * A,
        nullptr,
        [&] { ln1_summed = StartTensorAllReduce(d.ln1.data(), N * C); }));
    RETURN_IF_ERROR(ln1_summed());
    trace.Next("ln1");
    std::copy(d.residual2.begin(), d.residual2.end(), a.dresidual.begin());
    std::fill(g(kLn1W), g(kLn1W) + C, 0.0f);
    std::fill(g(kLn1B), g(kLn1B) + C, 0.0f);
    ops::LayerNormBackward(a.dresidual.data(), g(kLn1W), g(kLn1B), d.ln1.data(),
                           block_input, p(kLn1W), la.ln1_mean.data(),
                           la.ln1_rstd.data(), N, C);
    done(LayerOffset(l, 0), LayerEnd(l));
  }
  if (stage_.first()) {
    // Without the head on this stage the encoder writes wte's gradient
    // first.
    if (!stage_.last()) ZeroTensor(grads, static_cast<size_t>(wte_));
    ZeroTensor(grads, static_cast<size_t>(wpe_));  // rows at or past T: 0
    runtime::OpSpans trace("encoder", 0, "backward");
    trace.Next("embed");
    ops::EncoderBackward(dwte, grads + layout_[wpe_].offset, a.dresidual.data(),
                         a.tokens.data(), B, T, C);
    done(0, layout_[wpe_].offset + layout_[wpe_].size);
  } else if (stage_.last()) {
    done(0, layout_[wte_].size);  // the head's part, final since the start
  }
  return OkStatus();
}

}  // namespace multislice::model::gpt
