// Gemm on oneDNN's matmul primitive.
//
// Every operand is described to oneDNN with explicit strides, so a transposed
// operand or a non-dense leading dimension costs no copy on our side (oneDNN
// may still repack blocks into its scratchpad, as any GEMM does). alpha is
// oneDNN's output scale, beta its sum post-op and the sigmoid its
// eltwise_logistic post-op, in that order, so one pass over C does all three.
//
// Each thread owns its engine, stream, primitives and scratchpad: nothing is
// shared between device threads, so there is no lock on the call path. A
// primitive's thread count is fixed when it is created (oneDNN asks OpenMP
// how many threads it may use), which is why the first Gemm on a thread makes
// that thread single-threaded before it creates anything.
#include "compute/matmul.h"

#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>

#include "compute/elementwise.h"

namespace multislice::compute {
namespace {

using dnnl::memory;

// The parts of a GemmDesc that decide the primitive, with the defaults
// resolved (dense leading dimensions filled in).
struct GemmKey {
  int64_t m, n, k, lda, ldb, ldc;
  bool transpose_a, transpose_b, sigmoid;
  DType ab_type, c_type;
  uint32_t alpha_bits, beta_bits;

  bool operator==(const GemmKey&) const = default;
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& key) const {
    uint64_t h = 0;
    auto mix = [&h](uint64_t v) {
      h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    mix(key.m);
    mix(key.n);
    mix(key.k);
    mix(key.lda);
    mix(key.ldb);
    mix(key.ldc);
    mix((key.transpose_a ? 1u : 0u) | (key.transpose_b ? 2u : 0u) |
        (key.sigmoid ? 4u : 0u) | (static_cast<unsigned>(key.ab_type) << 3) |
        (static_cast<unsigned>(key.c_type) << 5));
    mix((static_cast<uint64_t>(key.alpha_bits) << 32) | key.beta_bits);
    return h;
  }
};

// A primitive with the memory objects it runs on; each call only swaps the
// data handles.
struct CachedGemm {
  dnnl::matmul primitive;
  memory a, b, c, scratchpad;
  size_t scratchpad_bytes = 0;
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// A page-aligned buffer that only grows.
class GrowingBuffer {
 public:
  // At least `bytes` of storage, or null when out of memory.
  void* Get(size_t bytes) {
    if (bytes > size_) {
      constexpr size_t kAlign = 4096;
      size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
      data_.reset(std::aligned_alloc(kAlign, rounded));
      size_ = data_ ? rounded : 0;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<void, FreeDeleter> data_;
  size_t size_ = 0;
};

struct ThreadState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<GemmKey, CachedGemm, GemmKeyHash> cache;
  GrowingBuffer scratchpad;
  GrowingBuffer f32_result;  // for f32 x f32 -> bf16, see RunViaF32
};

ThreadState& State() {
  thread_local std::unique_ptr<ThreadState> state = [] {
    SetSingleThreaded();
    return std::make_unique<ThreadState>();
  }();
  return *state;
}

memory::data_type ToDnnl(DType t) {
  return t == DType::kF32 ? memory::data_type::f32 : memory::data_type::bf16;
}

bool ValidType(DType t) { return t == DType::kF32 || t == DType::kBF16; }

std::string Str(int64_t v) { return std::to_string(v); }

// Checks the desc and fills in the dense leading dimensions.
Status MakeKey(const GemmDesc& d, GemmKey* key) {
  if (d.m < 1)
    return InvalidArgument("GemmDesc.m: expected >= 1, got " + Str(d.m));
  if (d.n < 1)
    return InvalidArgument("GemmDesc.n: expected >= 1, got " + Str(d.n));
  if (d.k < 1)
    return InvalidArgument("GemmDesc.k: expected >= 1, got " + Str(d.k));
  if (!ValidType(d.ab_type)) {
    return InvalidArgument("GemmDesc.ab_type: expected kF32 or kBF16, got " +
                           Str(static_cast<int>(d.ab_type)));
  }
  if (!ValidType(d.c_type)) {
    return InvalidArgument("GemmDesc.c_type: expected kF32 or kBF16, got " +
                           Str(static_cast<int>(d.c_type)));
  }
  // Row length of each stored operand: the minimum leading dimension.
  const int64_t a_row = d.transpose_a ? d.m : d.k;
  const int64_t b_row = d.transpose_b ? d.k : d.n;
  const char* a_shape =
      d.transpose_a ? "A is stored [k, m]" : "A is stored [m, k]";
  const char* b_shape =
      d.transpose_b ? "B is stored [n, k]" : "B is stored [k, n]";
  if (d.lda != 0 && d.lda < a_row) {
    return InvalidArgument("GemmDesc.lda: " + Str(d.lda) + " is less than " +
                           Str(a_row) + " (" + a_shape + ")");
  }
  if (d.ldb != 0 && d.ldb < b_row) {
    return InvalidArgument("GemmDesc.ldb: " + Str(d.ldb) + " is less than " +
                           Str(b_row) + " (" + b_shape + ")");
  }
  if (d.ldc != 0 && d.ldc < d.n) {
    return InvalidArgument("GemmDesc.ldc: " + Str(d.ldc) +
                           " is less than n = " + Str(d.n) +
                           " (C is stored [m, n])");
  }
  if (!std::isfinite(d.alpha)) {
    return InvalidArgument("GemmDesc.alpha: expected a finite number, got " +
                           std::to_string(d.alpha));
  }
  if (!std::isfinite(d.beta)) {
    return InvalidArgument("GemmDesc.beta: expected a finite number, got " +
                           std::to_string(d.beta));
  }
  key->m = d.m;
  key->n = d.n;
  key->k = d.k;
  key->lda = d.lda != 0 ? d.lda : a_row;
  key->ldb = d.ldb != 0 ? d.ldb : b_row;
  key->ldc = d.ldc != 0 ? d.ldc : d.n;
  key->transpose_a = d.transpose_a;
  key->transpose_b = d.transpose_b;
  key->sigmoid = d.sigmoid;
  key->ab_type = d.ab_type;
  key->c_type = d.c_type;
  key->alpha_bits = std::bit_cast<uint32_t>(d.alpha);
  // -0 and +0 both mean "overwrite": one primitive for both.
  key->beta_bits = d.beta == 0.0f ? 0u : std::bit_cast<uint32_t>(d.beta);
  return OkStatus();
}

std::string Describe(const GemmKey& key) {
  return "matmul m=" + Str(key.m) + " n=" + Str(key.n) + " k=" + Str(key.k) +
         (key.transpose_a ? " A^T" : "") + (key.transpose_b ? " B^T" : "") +
         " " + std::string(Name(key.ab_type)) + "->" +
         std::string(Name(key.c_type));
}

dnnl::matmul::primitive_desc MakePrimitiveDesc(const GemmKey& key,
                                               const dnnl::engine& engine) {
  // Logical shapes are always A[m, k], B[k, n], C[m, n]; a transpose is only
  // a swap of the strides.
  memory::desc a_md(
      {key.m, key.k}, ToDnnl(key.ab_type),
      key.transpose_a ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
  memory::desc b_md(
      {key.k, key.n}, ToDnnl(key.ab_type),
      key.transpose_b ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
  memory::desc c_md({key.m, key.n}, ToDnnl(key.c_type),
                    memory::dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const float alpha = std::bit_cast<float>(key.alpha_bits);
  const float beta = std::bit_cast<float>(key.beta_bits);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  dnnl::post_ops ops;
  if (key.beta_bits != 0) ops.append_sum(beta);
  if (key.sigmoid) {
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_logistic, 0.0f, 0.0f);
  }
  attr.set_post_ops(ops);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md),
                                      attr, engine);
}

Result<CachedGemm*> Lookup(ThreadState& state, const GemmKey& key) {
  auto it = state.cache.find(key);
  if (it != state.cache.end()) return &it->second;
  try {
    dnnl::matmul::primitive_desc pd = MakePrimitiveDesc(key, state.engine);
    CachedGemm entry;
    entry.primitive = dnnl::matmul(pd);
    entry.a = memory(pd.src_desc(), state.engine, nullptr);
    entry.b = memory(pd.weights_desc(), state.engine, nullptr);
    entry.c = memory(pd.dst_desc(), state.engine, nullptr);
    entry.scratchpad = memory(pd.scratchpad_desc(), state.engine, nullptr);
    entry.scratchpad_bytes = pd.scratchpad_desc().get_size();
    return &state.cache.emplace(key, std::move(entry)).first->second;
  } catch (const dnnl::error& e) {
    return Internal("oneDNN cannot create a " + Describe(key) + ": " +
                    e.what());
  }
}

// oneDNN 2.6 has no f32 x f32 -> bf16 matmul: that case runs as
// f32 -> f32 into a per-thread buffer and is rounded to bf16 afterwards
// (once, as a bf16 C always is).
bool NeedsF32Result(const GemmKey& key) {
  return key.ab_type == DType::kF32 && key.c_type == DType::kBF16;
}

GemmKey F32ResultKey(GemmKey key) {
  key.c_type = DType::kF32;
  key.ldc = key.n;
  return key;
}

Status Run(ThreadState& state, const GemmKey& key, const void* a, const void* b,
           void* c) {
  ASSIGN_OR_RETURN(CachedGemm * gemm, Lookup(state, key));
  void* scratchpad = state.scratchpad.Get(gemm->scratchpad_bytes);
  if (gemm->scratchpad_bytes > 0 && scratchpad == nullptr) {
    return Internal("out of memory for a " + Str(gemm->scratchpad_bytes) +
                    "-byte matmul scratchpad");
  }
  try {
    // oneDNN takes non-const handles but only reads sources and weights.
    gemm->a.set_data_handle(const_cast<void*>(a));
    gemm->b.set_data_handle(const_cast<void*>(b));
    gemm->c.set_data_handle(c);
    gemm->scratchpad.set_data_handle(scratchpad);
    gemm->primitive.execute(state.stream,
                            {{DNNL_ARG_SRC, gemm->a},
                             {DNNL_ARG_WEIGHTS, gemm->b},
                             {DNNL_ARG_DST, gemm->c},
                             {DNNL_ARG_SCRATCHPAD, gemm->scratchpad}});
    state.stream.wait();
  } catch (const dnnl::error& e) {
    return Internal("oneDNN failed to run a " + Describe(key) + ": " +
                    e.what());
  }
  return OkStatus();
}

Status RunViaF32(ThreadState& state, const GemmKey& key, const void* a,
                 const void* b, void* c) {
  const GemmKey f32_key = F32ResultKey(key);
  const size_t bytes = static_cast<size_t>(key.m * key.n) * sizeof(float);
  auto* result = static_cast<float*>(state.f32_result.Get(bytes));
  if (result == nullptr) {
    return Internal("out of memory for a " + Str(bytes) +
                    "-byte f32 matmul result");
  }
  auto* c_rows = static_cast<uint16_t*>(c);
  if (key.beta_bits != 0) {
    for (int64_t i = 0; i < key.m; ++i) {
      Convert(DType::kBF16, c_rows + i * key.ldc, DType::kF32,
              result + i * key.n, key.n);
    }
  }
  RETURN_IF_ERROR(Run(state, f32_key, a, b, result));
  for (int64_t i = 0; i < key.m; ++i) {
    Convert(DType::kF32, result + i * key.n, DType::kBF16, c_rows + i * key.ldc,
            key.n);
  }
  return OkStatus();
}

}  // namespace

Status Gemm(const GemmDesc& desc, const void* a, const void* b, void* c) {
  GemmKey key;
  RETURN_IF_ERROR(MakeKey(desc, &key));
  if (a == nullptr) return InvalidArgument("Gemm: the A pointer is null");
  if (b == nullptr) return InvalidArgument("Gemm: the B pointer is null");
  if (c == nullptr) return InvalidArgument("Gemm: the C pointer is null");
  ThreadState& state = State();
  if (NeedsF32Result(key)) return RunViaF32(state, key, a, b, c);
  return Run(state, key, a, b, c);
}

Result<std::string> GemmImplName(const GemmDesc& desc) {
  GemmKey key;
  RETURN_IF_ERROR(MakeKey(desc, &key));
  try {
    if (NeedsF32Result(key)) {
      return std::string(MakePrimitiveDesc(F32ResultKey(key), State().engine)
                             .impl_info_str()) +
             " (f32 result, then rounded to bf16)";
    }
    return std::string(MakePrimitiveDesc(key, State().engine).impl_info_str());
  } catch (const dnnl::error& e) {
    return Internal("oneDNN cannot create a " + Describe(key) + ": " +
                    e.what());
  }
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

const char* IsaName() {
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
      runtime = "runtime " + std::to_string(v->cpu_runtime);
  }
  return Str(v->major) + "." + Str(v->minor) + "." + Str(v->patch) + " (" +
         runtime + ")";
}

}  // namespace multislice::compute
