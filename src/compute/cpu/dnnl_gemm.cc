// oneDNN's matmul primitive behind the CPU backend's Gemm routes.
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
#include "compute/cpu/dnnl_gemm.h"

#include <omp.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>

#include "common/cpu_isa.h"

namespace multislice::compute::cpu {
namespace {

using dnnl::memory;

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
        (key.sigmoid ? 4u : 0u) | (key.bias ? 128u : 0u) |
        (static_cast<unsigned>(key.epilogue) << 8) |
        (static_cast<unsigned>(key.ab_type) << 3) |
        (static_cast<unsigned>(key.c_type) << 5));
    mix((static_cast<uint64_t>(key.alpha_bits) << 32) | key.beta_bits);
    mix(key.ldd);
    return h;
  }
};

// A primitive with the memory objects it runs on; each call only swaps the
// data handles.
struct CachedGemm {
  dnnl::matmul primitive;
  memory a, b, c, bias, d, scratchpad;
  size_t scratchpad_bytes = 0;
  // The execute arguments, built once: they share the memory objects above,
  // so a call only swaps data handles (no map is built per call: attention
  // makes over a thousand small calls a step).
  std::unordered_map<int, memory> args;
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
  std::array<GrowingBuffer, static_cast<size_t>(BufferSlot::kCount)> buffers;
};

ThreadState& State() {
  thread_local std::unique_ptr<ThreadState> state = [] {
    ConfigureDnnl();
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

// The epilogue's place in the post-op chain (after the sum and the sigmoid).
int EpiloguePostOp(const GemmKey& key) {
  return (key.beta_bits != 0 ? 1 : 0) + (key.sigmoid ? 1 : 0);
}

// D of the epilogue: f32 [m, n] with row stride ldd.
memory::desc EpilogueDesc(const GemmKey& key) {
  return memory::desc({key.m, key.n}, memory::data_type::f32,
                      memory::dims{key.ldd, 1});
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
  if (key.epilogue != GemmDesc::Epilogue::kNone) {
    ops.append_binary(key.epilogue == GemmDesc::Epilogue::kAdd
                          ? dnnl::algorithm::binary_add
                          : dnnl::algorithm::binary_mul,
                      EpilogueDesc(key));
  }
  attr.set_post_ops(ops);
  if (key.bias) {
    // One row of n values, broadcast over the m rows.
    memory::desc bias_md({1, key.n}, memory::data_type::f32,
                         memory::dims{key.n, 1});
    return dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(a_md, b_md, bias_md, c_md), attr, engine);
  }
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
    if (key.bias) {
      entry.bias = memory(pd.bias_desc(), state.engine, nullptr);
    }
    entry.scratchpad = memory(pd.scratchpad_desc(), state.engine, nullptr);
    entry.scratchpad_bytes = pd.scratchpad_desc().get_size();
    entry.args = {{DNNL_ARG_SRC, entry.a},
                  {DNNL_ARG_WEIGHTS, entry.b},
                  {DNNL_ARG_DST, entry.c},
                  {DNNL_ARG_SCRATCHPAD, entry.scratchpad}};
    if (key.bias) entry.args.emplace(DNNL_ARG_BIAS, entry.bias);
    if (key.epilogue != GemmDesc::Epilogue::kNone) {
      entry.d = memory(EpilogueDesc(key), state.engine, nullptr);
      entry.args.emplace(
          DNNL_ARG_ATTR_MULTIPLE_POST_OP(EpiloguePostOp(key)) | DNNL_ARG_SRC_1,
          entry.d);
    }
    return &state.cache.emplace(key, std::move(entry)).first->second;
  } catch (const dnnl::error& e) {
    return Internal("oneDNN cannot create a " + Describe(key) + ": " +
                    e.what());
  }
}

// The oneDNN level a MULTISLICE_MAX_ISA cap stands for. oneDNN has no
// kernels below SSE4.1, its lowest limit, which every x86-64 CPU since 2008
// has; our own kernels do go down to SSE2.
dnnl::cpu_isa DnnlLimit(Isa isa) {
  switch (isa) {
    case Isa::kBaseline:
      return dnnl::cpu_isa::sse41;
    case Isa::kAvx2:
      return dnnl::cpu_isa::avx2;
    case Isa::kAvx512:
      return dnnl::cpu_isa::avx512_core;
    case Isa::kAvx512Bf16:
      return dnnl::cpu_isa::avx512_core_bf16;
    case Isa::kAmx:
      return dnnl::cpu_isa::avx512_core_amx;
  }
  return dnnl::cpu_isa::all;
}

}  // namespace

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
  key->bias = d.bias;
  key->epilogue = d.epilogue;
  key->ldd = 0;
  if (d.epilogue != GemmDesc::Epilogue::kNone) {
    if (d.c_type != DType::kF32) {
      return InvalidArgument(
          "GemmDesc.epilogue: needs an f32 C (c_type is bfloat16)");
    }
    if (d.ldd != 0 && d.ldd < d.n) {
      return InvalidArgument("GemmDesc.ldd: " + Str(d.ldd) +
                             " is less than n = " + Str(d.n) +
                             " (D is stored [m, n])");
    }
    key->ldd = d.ldd != 0 ? d.ldd : d.n;
  }
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

Status RunDnnl(const GemmKey& key, const GemmArgs& args) {
  ThreadState& state = State();
  ASSIGN_OR_RETURN(CachedGemm * gemm, Lookup(state, key));
  void* scratchpad =
      ThreadBuffer(BufferSlot::kScratchpad, gemm->scratchpad_bytes);
  if (gemm->scratchpad_bytes > 0 && scratchpad == nullptr) {
    return Internal("out of memory for a " + Str(gemm->scratchpad_bytes) +
                    "-byte matmul scratchpad");
  }
  try {
    // oneDNN takes non-const handles but only reads sources and weights.
    gemm->a.set_data_handle(const_cast<void*>(args.a));
    gemm->b.set_data_handle(const_cast<void*>(args.b));
    gemm->c.set_data_handle(args.c);
    gemm->scratchpad.set_data_handle(scratchpad);
    if (key.bias) gemm->bias.set_data_handle(const_cast<float*>(args.bias));
    if (key.epilogue != GemmDesc::Epilogue::kNone) {
      gemm->d.set_data_handle(const_cast<float*>(args.d));
    }
    gemm->primitive.execute(state.stream, gemm->args);
    state.stream.wait();
  } catch (const dnnl::error& e) {
    return Internal("oneDNN failed to run a " + Describe(key) + ": " +
                    e.what());
  }
  return OkStatus();
}

Result<std::string> DnnlImplName(const GemmKey& key) {
  try {
    return std::string(MakePrimitiveDesc(key, State().engine).impl_info_str());
  } catch (const dnnl::error& e) {
    return Internal("oneDNN cannot create a " + Describe(key) + ": " +
                    e.what());
  }
}

bool DnnlHasNativeBf16() {
  static const bool native = [] {
    ConfigureDnnl();
    // (The enum is a bit mask, not an order: avx2_vnni is above amx.)
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    if (isa != dnnl::cpu_isa::avx512_core_bf16 &&
        isa != dnnl::cpu_isa::avx512_core_amx) {
      return false;
    }
    GemmKey key{};
    key.m = key.n = key.k = key.lda = key.ldb = key.ldc = 64;
    key.ab_type = DType::kBF16;
    key.c_type = DType::kF32;
    key.alpha_bits = std::bit_cast<uint32_t>(1.0f);
    Result<std::string> impl = DnnlImplName(key);
    return impl.ok() && impl->rfind("ref", 0) != 0;
  }();
  return native;
}

void* ThreadBuffer(BufferSlot slot, size_t bytes) {
  return State().buffers[static_cast<size_t>(slot)].Get(bytes);
}

void ConfigureDnnl() {
  static std::once_flag once;
  std::call_once(once, [] {
    Result<std::optional<Isa>> cap = IsaCapFromEnvironment();
    if (!cap.ok() || !cap->has_value()) return;
    // Fails only after oneDNN has dispatched; this runs before that.
    dnnl::set_max_cpu_isa(DnnlLimit(**cap));
  });
}

}  // namespace multislice::compute::cpu
