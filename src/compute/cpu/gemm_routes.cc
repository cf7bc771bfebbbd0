// The conversion routes of gemm_routes.h.
//
// Panels: A is widened PanelRows(key) rows at a time, so that the f32 panel
// (rows x k x 4 bytes) stays within kPanelBytes (8 MiB): whole for the
// matmuls of the models here, bounded for huge ones. Every oneDNN call packs
// B again (its kernels copy B into their own blocked panels), so panels of a
// few rows would pay that copy per panel: with 256 KiB panels (32 rows at
// k = 2048) the 2048^3 bf16 matmul on AVX2 ran at 71 % of the f32 one; whole,
// at 97 % (`multislice peak` under MULTISLICE_MAX_ISA=avx2, Sapphire Rapids).
// B is widened whole: every panel reads all of it.
#include "compute/cpu/gemm_routes.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>

#include "compute/elementwise.h"

namespace multislice::compute::cpu {
namespace {

constexpr int64_t kPanelBytes = int64_t{8} << 20;

std::string Str(int64_t v) { return std::to_string(v); }

Status OutOfMemory(int64_t bytes, const char* what) {
  return Internal("out of memory for a " + Str(bytes) + "-byte " + what);
}

// Rows of A per panel: a multiple of 16 (whole vector rows for the f32
// kernel), at least 16, at most m.
int64_t PanelRows(const GemmKey& key) {
  const int64_t rows = kPanelBytes / (key.k * int64_t{sizeof(float)});
  return std::min(key.m, std::max<int64_t>(16, rows / 16 * 16));
}

// Widens `rows` rows of `cols` bf16 values (stride ld) into dense f32.
void WidenRows(const uint16_t* from, int64_t ld, int64_t rows, int64_t cols,
               float* to) {
  if (ld == cols) {
    Convert(DType::kBF16, from, DType::kF32, to,
            static_cast<size_t>(rows * cols));
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    Convert(DType::kBF16, from + r * ld, DType::kF32, to + r * cols,
            static_cast<size_t>(cols));
  }
}

// C's rows [row0, row0 + rows) through an f32 buffer when C is bf16: read in
// (only when beta keeps the old C), computed by `run`, rounded back.
template <typename Run>
Status WithF32Rows(const GemmKey& key, void* c, int64_t row0, int64_t rows,
                   Run run) {
  if (key.c_type == DType::kF32) {
    return run(static_cast<float*>(c) + row0 * key.ldc, key.ldc);
  }
  const int64_t bytes = rows * key.n * int64_t{sizeof(float)};
  auto* f32 = static_cast<float*>(ThreadBuffer(BufferSlot::kC, bytes));
  if (f32 == nullptr) return OutOfMemory(bytes, "f32 matmul result");
  uint16_t* c_rows = static_cast<uint16_t*>(c) + row0 * key.ldc;
  if (key.beta_bits != 0) WidenRows(c_rows, key.ldc, rows, key.n, f32);
  RETURN_IF_ERROR(run(f32, key.n));
  for (int64_t r = 0; r < rows; ++r) {
    Convert(DType::kF32, f32 + r * key.n, DType::kBF16, c_rows + r * key.ldc,
            static_cast<size_t>(key.n));
  }
  return OkStatus();
}

}  // namespace

Status RunBf16ViaF32(const GemmKey& key, const GemmArgs& args) {
  // B, whole, keeping its stored orientation.
  const int64_t b_rows = key.transpose_b ? key.n : key.k;
  const int64_t b_cols = key.transpose_b ? key.k : key.n;
  const int64_t b_bytes = b_rows * b_cols * int64_t{sizeof(float)};
  auto* b32 = static_cast<float*>(ThreadBuffer(BufferSlot::kB, b_bytes));
  if (b32 == nullptr) return OutOfMemory(b_bytes, "f32 copy of B");
  WidenRows(static_cast<const uint16_t*>(args.b), key.ldb, b_rows, b_cols, b32);

  const int64_t panel_rows = PanelRows(key);
  const int64_t a_bytes = panel_rows * key.k * int64_t{sizeof(float)};
  auto* a32 = static_cast<float*>(ThreadBuffer(BufferSlot::kA, a_bytes));
  if (a32 == nullptr) return OutOfMemory(a_bytes, "f32 panel of A");
  const auto* a16 = static_cast<const uint16_t*>(args.a);
  for (int64_t row0 = 0; row0 < key.m; row0 += panel_rows) {
    const int64_t rows = std::min(panel_rows, key.m - row0);
    GemmKey panel = key;
    panel.m = rows;
    panel.ab_type = DType::kF32;
    panel.c_type = DType::kF32;
    panel.ldb = b_cols;
    if (key.transpose_a) {
      // A stored [k, m]: the panel is columns [row0, row0 + rows) of every
      // stored row, kept transposed ([k, rows]).
      for (int64_t p = 0; p < key.k; ++p) {
        Convert(DType::kBF16, a16 + p * key.lda + row0, DType::kF32,
                a32 + p * rows, static_cast<size_t>(rows));
      }
      panel.lda = rows;
    } else {
      WidenRows(a16 + row0 * key.lda, key.lda, rows, key.k, a32);
      panel.lda = key.k;
    }
    RETURN_IF_ERROR(
        WithF32Rows(key, args.c, row0, rows, [&](float* c32, int64_t ldc) {
          panel.ldc = ldc;
          GemmArgs panel_args{a32, b32, c32, args.bias, nullptr};
          if (args.d != nullptr) panel_args.d = args.d + row0 * key.ldd;
          return RunDnnl(panel, panel_args);
        }));
  }
  return OkStatus();
}

Status RunF32ToBf16(const GemmKey& key, const GemmArgs& args) {
  return WithF32Rows(key, args.c, 0, key.m, [&](float* c32, int64_t ldc) {
    GemmKey f32 = key;
    f32.c_type = DType::kF32;
    f32.ldc = ldc;
    GemmArgs f32_args = args;
    f32_args.c = c32;
    return RunDnnl(f32, f32_args);
  });
}

}  // namespace multislice::compute::cpu
