// Gemm of compute/matmul.h on the CPU: picks the route of a call and names
// the routes for reports.
//
//   f32 x f32 -> f32    oneDNN's f32 kernels
//   f32 x f32 -> bf16   the same into an f32 buffer, rounded (RunF32ToBf16)
//   bf16 x bf16 -> any  kNative: oneDNN's bf16 kernels (AVX512_BF16, AMX);
//                       kViaF32: RunBf16ViaF32
//
// The bf16 route is native where oneDNN has bf16 kernels for this CPU within
// the ISA cap, except for small matmuls on AMX (see SmallViaF32), else via
// f32; SetBf16Route overrides it.
#include "compute/matmul.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "common/cpu_isa.h"
#include "compute/cpu/dnnl_gemm.h"
#include "compute/cpu/gemm_routes.h"

namespace multislice::compute {
namespace {

// -1: the chosen route; otherwise a forced Bf16Route.
std::atomic<int> g_forced_route{-1};

std::string Str(int v) { return std::to_string(v); }

// Matmuls of at most this many multiply-adds are "small": per-head attention
// products (64^3 to 128 x 128 x 64, strided, one transposed) are dominated
// by a kernel's fixed costs, not by its peak.
constexpr int64_t kSmallMacs = int64_t{1} << 21;

// oneDNN's AMX kernels pay a tile configuration and a reorder of a strided
// operand per call: on the attention's products they take 4.6x the time of
// the f32 kernels on widened operands (22.1 against 4.8 us for
// 64 x 64 x 64 with B^T at a leading dimension of 1152; 86 against 15 us for
// 128 x 128 x 64). Small bf16 matmuls therefore take the f32 route where the
// native one is AMX. A fixed rule, not a measurement, so that every process
// on a machine picks the same route and bf16 runs stay bitwise repeatable.
bool SmallViaF32() {
  static const bool via = [] {
    cpu::ConfigureDnnl();
    return cpu::DnnlHasNativeBf16() &&
           dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx;
  }();
  return via;
}

// The route of one bf16 matmul.
Bf16Route RouteFor(const cpu::GemmKey& key) {
  const int forced = g_forced_route.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<Bf16Route>(forced);
  if (!cpu::DnnlHasNativeBf16()) return Bf16Route::kViaF32;
  if (key.m * key.n * key.k <= kSmallMacs && SmallViaF32()) {
    return Bf16Route::kViaF32;
  }
  return Bf16Route::kNative;
}

}  // namespace

Bf16Route ActiveBf16Route() {
  const int forced = g_forced_route.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<Bf16Route>(forced);
  return cpu::DnnlHasNativeBf16() ? Bf16Route::kNative : Bf16Route::kViaF32;
}

bool NativeBf16Available() { return cpu::DnnlHasNativeBf16(); }

void SetBf16Route(std::optional<Bf16Route> route) {
  g_forced_route.store(route ? static_cast<int>(*route) : -1,
                       std::memory_order_relaxed);
}

std::string MatmulRouteName(DType ab_type) {
  // f32 kernels use the vector level (AVX512_BF16 and AMX add nothing to
  // them); native bf16 names the bf16 instructions.
  const std::string vector_isa(IsaName(std::min(ActiveIsa(), Isa::kAvx512)));
  if (ab_type == DType::kF32) return "float32 (" + vector_isa + ")";
  const bool forced = g_forced_route.load(std::memory_order_relaxed) >= 0;
  if (ActiveBf16Route() == Bf16Route::kNative) {
    const std::string name =
        "bfloat16 native (" + std::string(IsaName(ActiveIsa())) + ")";
    if (!forced && SmallViaF32()) {
      return name + ", small matmuls via float32 kernels";
    }
    return name;
  }
  return "bfloat16 via float32 kernels (" + vector_isa + ")";
}

Status Gemm(const GemmDesc& desc, const void* a, const void* b, void* c,
            const float* bias, const float* d) {
  cpu::GemmKey key;
  RETURN_IF_ERROR(cpu::MakeKey(desc, &key));
  if (a == nullptr) return InvalidArgument("Gemm: the A pointer is null");
  if (b == nullptr) return InvalidArgument("Gemm: the B pointer is null");
  if (c == nullptr) return InvalidArgument("Gemm: the C pointer is null");
  if (desc.bias && bias == nullptr) {
    return InvalidArgument("Gemm: GemmDesc.bias is set but the bias is null");
  }
  if (desc.epilogue != GemmDesc::Epilogue::kNone && d == nullptr) {
    return InvalidArgument(
        "Gemm: GemmDesc.epilogue is set but its operand D is null");
  }
  const cpu::GemmArgs args{a, b, c, bias, d};
  if (key.ab_type == DType::kBF16) {
    if (RouteFor(key) == Bf16Route::kViaF32) {
      return cpu::RunBf16ViaF32(key, args);
    }
    if (!cpu::DnnlHasNativeBf16()) {
      return FailedPrecondition(
          "Gemm: the native bf16 route was forced, but oneDNN has no bf16 "
          "matmul on this CPU (" +
          std::string(IsaName(ActiveIsa())) + ")");
    }
    return cpu::RunDnnl(key, args);
  }
  if (key.c_type == DType::kBF16) return cpu::RunF32ToBf16(key, args);
  return cpu::RunDnnl(key, args);
}

Result<std::string> GemmImplName(const GemmDesc& desc) {
  cpu::GemmKey key;
  RETURN_IF_ERROR(cpu::MakeKey(desc, &key));
  if (key.ab_type == DType::kBF16 && ActiveBf16Route() == Bf16Route::kViaF32) {
    cpu::GemmKey f32 = key;
    f32.ab_type = f32.c_type = DType::kF32;
    ASSIGN_OR_RETURN(std::string impl, cpu::DnnlImplName(f32));
    return impl + " (bfloat16 widened to float32)";
  }
  if (key.ab_type == DType::kF32 && key.c_type == DType::kBF16) {
    cpu::GemmKey f32 = key;
    f32.c_type = DType::kF32;
    ASSIGN_OR_RETURN(std::string impl, cpu::DnnlImplName(f32));
    return impl + " (float32 result, then rounded to bfloat16)";
  }
  return cpu::DnnlImplName(key);
}

void SetSingleThreaded() {
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
  // The OpenMP thread-count ICV belongs to the calling thread's implicit
  // task, so this leaves other device threads alone.
  omp_set_num_threads(1);
#elif DNNL_CPU_RUNTIME != DNNL_RUNTIME_SEQ
#error "SetSingleThreaded needs oneDNN built with OpenMP or sequential runtime"
#endif
}

const char* DnnlIsaName() {
  cpu::ConfigureDnnl();
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::all:
      return "all";
  }
  return "unknown";
}

std::string DnnlVersion() {
  const dnnl_version_t* v = dnnl_version();
  std::string runtime;
  switch (v->cpu_runtime) {
    case DNNL_RUNTIME_OMP:
      runtime = "OpenMP";
      break;
    case DNNL_RUNTIME_TBB:
      runtime = "TBB";
      break;
    case DNNL_RUNTIME_SEQ:
      runtime = "sequential";
      break;
    case DNNL_RUNTIME_THREADPOOL:
      runtime = "threadpool";
      break;
    default:
      runtime = "runtime " + Str(v->cpu_runtime);
  }
  return Str(v->major) + "." + Str(v->minor) + "." + Str(v->patch) + " (" +
         runtime + ")";
}

}  // namespace multislice::compute
