#include "model/matmul_runner.h"

#include <algorithm>

#include "compute/elementwise.h"
#include "compute/gpt_ops.h"

namespace multislice::model {

void Reserve(std::vector<uint16_t>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
}

MatmulRunner::Operand MatmulRunner::Prepare(const float* x, int64_t n,
                                            std::vector<uint16_t>& store) {
  if (ab_type_ == DType::kF32) return {x, nullptr};
  Reserve(store, n);
  compute::ToBf16(x, store.data(), n);
  return {x, store.data()};
}

Status MatmulRunner::Run(compute::GemmDesc desc, Operand a, Operand b, float* c,
                         const float* bias, const float* d) {
  desc.c_type = DType::kF32;
  desc.ab_type = ab_type_;
  if (ab_type_ == DType::kF32) {
    return compute::Gemm(desc, a.f32, b.f32, c, bias, d);
  }
  if (a.bf16 == nullptr) a = Prepare(a.f32, desc.m * desc.k, a16_);
  if (b.bf16 == nullptr) b = Prepare(b.f32, desc.k * desc.n, b16_);
  return compute::Gemm(desc, a.bf16, b.bf16, c, bias, d);
}

Status MatmulRunner::LinearForward(float* out, Operand inp, Operand weight,
                                   const float* bias, int64_t N, int64_t IC,
                                   int64_t OC, const float* residual) {
  compute::GemmDesc desc;
  desc.m = N;
  desc.n = OC;
  desc.k = IC;
  desc.bias = bias != nullptr;
  if (residual != nullptr) desc.epilogue = compute::GemmDesc::Epilogue::kAdd;
  return Run(desc, inp, weight, out, bias, residual);
}

Status MatmulRunner::LinearBackward(float* dinp, float dinp_beta,
                                    float* dweight, float* dbias, Operand dout,
                                    Operand inp, Operand weight, int64_t N,
                                    int64_t IC, int64_t OC,
                                    const float* dinp_scale,
                                    const std::function<void()>& after_dinp) {
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
    compute::gpt::BiasBackward(dbias, dout.f32, N, static_cast<int>(OC));
  }
  return OkStatus();
}

Status MatmulRunner::HeadForward(float* logits, Operand x, Operand w, int64_t N,
                                 int64_t C, int64_t V, float alpha) {
  compute::GemmDesc head;
  head.m = N;
  head.n = V;
  head.k = C;
  head.transpose_b = true;  // w is [V,C] = [n,k]
  head.alpha = alpha;
  return Run(head, x, w, logits);
}

Status MatmulRunner::HeadBackward(float* dx, float* dw, float dw_beta,
                                  Operand dlogits, Operand x, Operand w,
                                  int64_t N, int64_t C, int64_t V,
                                  float alpha) {
  compute::GemmDesc dxd;
  dxd.m = N;
  dxd.n = C;
  dxd.k = V;
  dxd.alpha = alpha;
  RETURN_IF_ERROR(Run(dxd, dlogits, w, dx));
  compute::GemmDesc dwd;
  dwd.m = V;
  dwd.n = C;
  dwd.k = N;
  dwd.transpose_a = true;  // dlogits is [N,V] = [k,m]
  dwd.alpha = alpha;
  dwd.beta = dw_beta;
  return Run(dwd, dlogits, x, dw);
}

}  // namespace multislice::model
