#include "model/shardings_reference.h"

#include "compute/elementwise.h"
#include "compute/matmul.h"
#include "compute/random.h"

namespace multislice::model {
namespace {

using compute::GemmDesc;

std::vector<std::byte> Alloc(DType dt, int64_t count) {
  return std::vector<std::byte>(static_cast<size_t>(count) * SizeOf(dt));
}

}  // namespace

Result<ReferenceResult> ShardingsReferenceStep(const ShardingsConfig& config,
                                               int64_t batch) {
  const DType dt = config.dtype;
  const int64_t e = config.embedding_dimension, f = 4 * e, bsz = batch;
  const int layers = config.num_layers;
  // Plain layouts: X [B, E]; W [F, E]; M1 [B, F]; M2 [B, E].
  std::vector<std::vector<std::byte>> w1(layers), w2(layers), m1(layers),
      acts(layers + 1);
  acts[0] = Alloc(dt, bsz * e);
  compute::FillBlock(compute::Distribution::kUniform, config.seed,
                     kShardingsInputStream, 1.0f, e, 0, 0, bsz, e, false, dt,
                     acts[0].data(), e);
  for (int l = 0; l < layers; ++l) {
    w1[l] = Alloc(dt, f * e);
    w2[l] = Alloc(dt, f * e);
    compute::FillBlock(compute::Distribution::kNormal, config.seed,
                       ShardingsWeightStream(l, 0), 1e-4f, e, 0, 0, f, e, false,
                       dt, w1[l].data(), e);
    compute::FillBlock(compute::Distribution::kNormal, config.seed,
                       ShardingsWeightStream(l, 1), 1e-4f, e, 0, 0, f, e, false,
                       dt, w2[l].data(), e);
    m1[l] = Alloc(dt, bsz * f);
    acts[l + 1] = Alloc(dt, bsz * e);
    // M1 = sigmoid(X @ W1^T): W1 stored [F, E] = [n, k].
    RETURN_IF_ERROR(compute::Gemm(GemmDesc{.m = bsz,
                                           .n = f,
                                           .k = e,
                                           .transpose_b = true,
                                           .ab_type = dt,
                                           .c_type = dt,
                                           .sigmoid = true},
                                  acts[l].data(), w1[l].data(), m1[l].data()));
    // M2 = sigmoid(M1 @ W2): W2 stored [F, E] = [k, n].
    RETURN_IF_ERROR(compute::Gemm(GemmDesc{.m = bsz,
                                           .n = e,
                                           .k = f,
                                           .ab_type = dt,
                                           .c_type = dt,
                                           .sigmoid = true},
                                  m1[l].data(), w2[l].data(),
                                  acts[l + 1].data()));
  }
  ReferenceResult result;
  result.loss =
      compute::Sum(dt, acts[layers].data(), static_cast<size_t>(bsz * e));

  std::vector<std::byte> d_out = Alloc(dt, bsz * e), dz2 = Alloc(dt, bsz * e),
                         dm1 = Alloc(dt, bsz * f);
  std::vector<std::vector<std::byte>> g1(layers), g2(layers);
  compute::Fill(dt, d_out.data(), 1.0f, static_cast<size_t>(bsz * e));
  for (int l = layers - 1; l >= 0; --l) {
    compute::SigmoidGrad(dt, d_out.data(), acts[l + 1].data(), dt, dz2.data(),
                         static_cast<size_t>(bsz * e));
    // dW2 [F, E] = M1^T @ dZ2: M1 stored [B, F] = [k, m].
    g2[l] = Alloc(dt, f * e);
    RETURN_IF_ERROR(compute::Gemm(GemmDesc{.m = f,
                                           .n = e,
                                           .k = bsz,
                                           .transpose_a = true,
                                           .ab_type = dt,
                                           .c_type = dt},
                                  m1[l].data(), dz2.data(), g2[l].data()));
    // dM1 [B, F] = dZ2 @ W2^T: W2 stored [F, E] = [n, k].
    RETURN_IF_ERROR(compute::Gemm(GemmDesc{.m = bsz,
                                           .n = f,
                                           .k = e,
                                           .transpose_b = true,
                                           .ab_type = dt,
                                           .c_type = dt},
                                  dz2.data(), w2[l].data(), dm1.data()));
    compute::SigmoidGrad(dt, dm1.data(), m1[l].data(), dt, dm1.data(),
                         static_cast<size_t>(bsz * f));
    // dW1 [F, E] = dZ1^T @ X.
    g1[l] = Alloc(dt, f * e);
    RETURN_IF_ERROR(compute::Gemm(GemmDesc{.m = f,
                                           .n = e,
                                           .k = bsz,
                                           .transpose_a = true,
                                           .ab_type = dt,
                                           .c_type = dt},
                                  dm1.data(), acts[l].data(), g1[l].data()));
    if (l == 0) break;
    // dX [B, E] = dZ1 @ W1.
    RETURN_IF_ERROR(compute::Gemm(
        GemmDesc{.m = bsz, .n = e, .k = f, .ab_type = dt, .c_type = dt},
        dm1.data(), w1[l].data(), d_out.data()));
  }
  for (int l = 0; l < layers; ++l) {
    compute::SgdUpdate(dt, w1[l].data(), g1[l].data(), config.learning_rate,
                       static_cast<size_t>(f * e));
    compute::SgdUpdate(dt, w2[l].data(), g2[l].data(), config.learning_rate,
                       static_cast<size_t>(f * e));
    result.emb2ff.emplace_back(static_cast<size_t>(f * e));
    result.ff2emb.emplace_back(static_cast<size_t>(f * e));
    compute::Convert(dt, w1[l].data(), DType::kF32, result.emb2ff[l].data(),
                     result.emb2ff[l].size());
    compute::Convert(dt, w2[l].data(), DType::kF32, result.ff2emb[l].data(),
                     result.ff2emb[l].size());
  }
  return result;
}

}  // namespace multislice::model
