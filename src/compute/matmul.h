// Matrix multiplication on one device (the CPU backend: oneDNN's kernels for
// the CPU's ISA, chosen at run time within MULTISLICE_MAX_ISA).
//
// C[m, n] = alpha * (op(A)[m, k] @ op(B)[k, n] + bias) + beta * C, row-major,
// where
// op(X) is X or its transpose (a transposed operand is read in place through
// its strides: no copy). Leading dimensions are in elements and default to
// the dense row-major ones. A and B share a dtype (f32 or bf16); C is f32 or
// bf16. Accumulation is always f32; a bf16 C is rounded once at the end.
// `sigmoid` applies the logistic function to the result (after beta) in the
// same pass, as a oneDNN post-op. C must not overlap A or B.
//
// bf16 operands take one of two routes (Bf16Route), the same values up to
// the order of f32 accumulation: oneDNN's bf16 kernels where the CPU has
// bf16 instructions (AVX512_BF16, AMX), otherwise bf16 storage computed by
// the f32 kernels, each operand widened to f32 panel by panel in a
// per-thread buffer. f32 x f32 -> bf16 (which oneDNN 2.6 lacks) computes an
// f32 C in a per-thread buffer and rounds it, an extra pass.
//
// Cost on a Zen 5 core (measured with `multislice peak --variants`): the fused
// sigmoid costs about 1-6% (most when k is small), beta != 0 about 2-12%
// (old C is read from memory, most when k is small).
//
// Thread-safety: Gemm may be called from many device threads at once; each
// call runs on the calling thread only (single-threaded kernels, so device
// threads do not fight over cores: the first Gemm on a thread calls
// SetSingleThreaded for it). Primitives are created once per GemmDesc and
// cached per thread (with the thread's oneDNN engine, stream and scratchpad),
// so the first call with a new desc costs a primitive creation (about a
// millisecond) and later ones none; the cache lives until the thread exits.
// alpha and beta are part of the key: use a few fixed values, not a new one
// per call.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/dtype.h"
#include "common/status.h"

namespace multislice::compute {

struct GemmDesc {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false;  // A is stored [k, m] (lda >= m)
  bool transpose_b = false;  // B is stored [n, k] (ldb >= k)
  DType ab_type = DType::kBF16;
  DType c_type = DType::kF32;
  int64_t lda = 0, ldb = 0, ldc = 0;  // 0: dense
  float alpha = 1.0f;                 // any finite value
  float beta = 0.0f;  // 0: overwrite C (its old contents are never read);
                      // 1: accumulate into C; any other finite value scales
  bool sigmoid = false;
  bool bias = false;  // add Gemm's bias vector (n f32 values) to every row
  // Last, element by element with Gemm's f32 [m, n] operand D (row stride
  // ldd, 0: n): C = C + D or C = C * D (a residual add, a gradient times a
  // saved derivative), in the same pass over C. C must be f32.
  enum class Epilogue { kNone, kAdd, kMultiply };
  Epilogue epilogue = Epilogue::kNone;
  int64_t ldd = 0;
};

// Runs one matmul. kInvalidArgument (naming the GemmDesc field) for
// non-positive sizes, a leading dimension below the stored row length, a
// non-finite alpha or beta, or a null pointer; kInternal when oneDNN cannot
// create the primitive (the message says why); kFailedPrecondition when the
// native bf16 route is forced on a CPU without it. Blocks until C is written.
// `bias` (n f32 values, added to every row of the product) is read when
// desc.bias is set, and `d` (not overlapping C) when desc.epilogue is set;
// each must then be non-null.
Status Gemm(const GemmDesc& desc, const void* a, const void* b, void* c,
            const float* bias = nullptr, const float* d = nullptr);

// How Gemm runs bf16 operands.
enum class Bf16Route {
  kNative,  // oneDNN's bf16 kernels (AVX512_BF16 or AMX instructions)
  kViaF32,  // bf16 storage, oneDNN's f32 kernels on widened panels
};

// The route of bf16 matmuls in this process: kNative where oneDNN has bf16
// kernels for this CPU within the ISA cap, else kViaF32 (or what
// SetBf16Route forced). On AMX, small matmuls (at most 2^21 multiply-adds,
// such as attention's per-head products) take kViaF32 even so: AMX's fixed
// cost per call makes them 4-6x slower than the f32 kernels.
Bf16Route ActiveBf16Route();

// Whether the native route is possible here at all.
bool NativeBf16Available();

// Forces the route from now on (nullopt: back to the chosen one), for tests
// and benchmarks that compare the two on one machine.
void SetBf16Route(std::optional<Bf16Route> route);

// The route of a run whose matmuls take `ab_type`, for the first line of a
// command and its --json: "bfloat16 native (amx)", "bfloat16 via float32
// kernels (avx2)", "float32 (avx512)": the vector level of common/cpu_isa.h
// the kernels use (the active level, for native bf16).
std::string MatmulRouteName(DType ab_type);

// The oneDNN implementation Gemm uses for `desc`, e.g.
// "brg:avx512_core_bf16" (a "ref:" one is a slow reference loop), with the
// route's conversions named; for reports and tests. Same errors as Gemm.
Result<std::string> GemmImplName(const GemmDesc& desc);

// Makes oneDNN (and OpenMP) use only the calling thread for work started on
// it. Call once at the start of every device thread (Gemm also calls it on
// its first use in a thread). Only that thread's OpenMP thread count changes.
void SetSingleThreaded();

// What oneDNN dispatches to on this machine within the cap, e.g.
// "avx512_core_bf16" (oneDNN's own names); for reports.
const char* DnnlIsaName();

// oneDNN's version and CPU threading runtime, e.g. "2.6.3 (OpenMP)".
std::string DnnlVersion();

}  // namespace multislice::compute
