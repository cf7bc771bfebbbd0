// The CPU backend's matmul internals: a GemmDesc checked and resolved into a
// GemmKey, oneDNN's matmul primitive run on one key (cached per thread), the
// per-thread buffers the routes convert operands into, and oneDNN's ISA
// limit. Used by matmul.cc (the routes) and bf16_via_f32.cc; not part of the
// compute/ interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "common/status.h"
#include "compute/matmul.h"

namespace multislice::compute::cpu {

// A GemmDesc with the dense leading dimensions filled in: what decides a
// primitive.
struct GemmKey {
  int64_t m, n, k, lda, ldb, ldc;
  bool transpose_a, transpose_b, sigmoid, bias;
  GemmDesc::Epilogue epilogue;
  int64_t ldd;  // D's row stride (resolved), when there is an epilogue
  DType ab_type, c_type;
  uint32_t alpha_bits, beta_bits;  // beta_bits == 0: overwrite C

  bool operator==(const GemmKey&) const = default;
};

// Checks the desc (kInvalidArgument naming the field) and resolves it.
Status MakeKey(const GemmDesc& desc, GemmKey* key);

// "matmul m=.. n=.. k=.. A^T bfloat16->float32", for messages.
std::string Describe(const GemmKey& key);

// The operands of one call: bias when key.bias, d when key.epilogue.
struct GemmArgs {
  const void* a;
  const void* b;
  void* c;
  const float* bias = nullptr;
  const float* d = nullptr;
};

// Runs `key` through oneDNN's matmul primitive on the calling thread: the
// operands in the key's types as they are. kInternal when oneDNN cannot
// create or run it. The first call on a thread makes it single-threaded.
Status RunDnnl(const GemmKey& key, const GemmArgs& args);

// oneDNN's implementation of `key`, e.g. "brg:avx512_core_amx_bf16".
Result<std::string> DnnlImplName(const GemmKey& key);

// Whether oneDNN has bf16 matmul kernels on this CPU within the ISA cap
// (AVX512_BF16 or AMX instructions, not a reference loop or emulation).
bool DnnlHasNativeBf16();

// Per-thread scratch that only grows (page-aligned), one per purpose; null
// when out of memory. Valid until the next Get of the same slot on the same
// thread.
enum class BufferSlot { kScratchpad, kF32Result, kA, kB, kC, kCount };
void* ThreadBuffer(BufferSlot slot, size_t bytes);

// Applies MULTISLICE_MAX_ISA to oneDNN (dnnl::set_max_cpu_isa) before its
// first use in the process; every oneDNN entry point of the backend calls
// it. Idempotent and thread-safe.
void ConfigureDnnl();

}  // namespace multislice::compute::cpu
