// The two Gemm routes that do not map onto one oneDNN primitive as they are
// (matmul.cc picks the route; dnnl_gemm.h runs primitives).
#pragma once

#include "common/status.h"
#include "compute/cpu/dnnl_gemm.h"

namespace multislice::compute::cpu {

// bf16 operands through f32 kernels, for CPUs where oneDNN has no bf16
// matmul (no AVX512_BF16 or AMX): B is widened to f32 once per call into a
// per-thread buffer, then A a panel of rows at a time (up to 8 MiB of f32),
// and each panel's rows of C are computed by oneDNN's f32 kernel; a bf16 C
// is computed in f32 and rounded once. The values are those of a native bf16
// matmul up to the order of f32 accumulation.
Status RunBf16ViaF32(const GemmKey& key, const GemmArgs& args);

// f32 operands with a bf16 C (oneDNN 2.6 has no f32 x f32 -> bf16 kernel):
// C in f32 in a per-thread buffer, rounded to bf16 afterwards.
Status RunF32ToBf16(const GemmKey& key, const GemmArgs& args);

}  // namespace multislice::compute::cpu
