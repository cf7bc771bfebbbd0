// Gemm against a naive triple loop in double, over every combination of
// transposes, input and output types, alpha, beta and the fused sigmoid, on
// odd shapes and padded leading dimensions.
#include "compute/matmul.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/bf16.h"
#include "common/cpu_isa.h"

namespace multislice::compute {
namespace {

struct Shape {
  int64_t m, n, k;
};

// The last one has a long k (the f32 accumulation of 2000 products).
const Shape kShapes[] = {
    {1, 1, 1}, {7, 5, 3}, {33, 65, 17}, {128, 256, 64}, {100, 9, 2000}};

// A matrix stored [rows, ld] in `type`, with its values also kept as
// doubles; the padding columns hold `pad`.
struct Matrix {
  DType type;
  int64_t rows, cols, ld;
  std::vector<double> values;  // rows * cols, dense
  std::vector<unsigned char> storage;

  Matrix(DType t, int64_t r, int64_t c, int64_t ld_, std::mt19937& rng,
         float pad)
      : type(t),
        rows(r),
        cols(c),
        ld(ld_),
        values(r * c),
        storage(r * ld_ * SizeOf(t)) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < ld; ++j) {
        float v = j < cols ? dist(rng) : pad;
        if (t == DType::kBF16) v = bf16::ToFloat(bf16::FromFloat(v));
        if (j < cols) values[i * cols + j] = v;
        Set(i, j, v);
      }
    }
  }

  void Set(int64_t i, int64_t j, float v) {
    if (type == DType::kF32) {
      reinterpret_cast<float*>(storage.data())[i * ld + j] = v;
    } else {
      reinterpret_cast<uint16_t*>(storage.data())[i * ld + j] =
          bf16::FromFloat(v);
    }
  }
  float Get(int64_t i, int64_t j) const {
    if (type == DType::kF32) {
      return reinterpret_cast<const float*>(storage.data())[i * ld + j];
    }
    return bf16::ToFloat(
        reinterpret_cast<const uint16_t*>(storage.data())[i * ld + j]);
  }
  double At(int64_t i, int64_t j) const { return values[i * cols + j]; }
};

// The distance between consecutive bf16 values around |v|.
double Bf16Ulp(double v) {
  v = std::fabs(v);
  if (v < 1e-30) return std::ldexp(1.0, -133);
  return std::ldexp(1.0, std::ilogb(v) - 7);
}

double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// Runs one Gemm and compares every element with the double reference.
void CheckGemm(const GemmDesc& desc, bool padded, uint32_t seed) {
  SCOPED_TRACE("m=" + std::to_string(desc.m) + " n=" + std::to_string(desc.n) +
               " k=" + std::to_string(desc.k) +
               (padded ? " padded" : " dense"));
  std::mt19937 rng(seed);
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  // Padding of A and B is NaN: reading it into a result would show.
  const int64_t a_rows = desc.transpose_a ? desc.k : desc.m;
  const int64_t a_cols = desc.transpose_a ? desc.m : desc.k;
  const int64_t b_rows = desc.transpose_b ? desc.n : desc.k;
  const int64_t b_cols = desc.transpose_b ? desc.k : desc.n;
  const int64_t lda = padded ? a_cols + 3 : a_cols;
  const int64_t ldb = padded ? b_cols + 5 : b_cols;
  const int64_t ldc = padded ? desc.n + 2 : desc.n;
  Matrix a(desc.ab_type, a_rows, a_cols, lda, rng, kNan);
  Matrix b(desc.ab_type, b_rows, b_cols, ldb, rng, kNan);
  const float kSentinel = 12288.0f;  // C's padding must stay as it was
  Matrix c(desc.c_type, desc.m, desc.n, ldc, rng, kSentinel);
  if (desc.beta == 0.0f) {
    // With beta 0 the old C must not be read at all.
    for (int64_t i = 0; i < desc.m; ++i) {
      for (int64_t j = 0; j < desc.n; ++j) c.Set(i, j, kNan);
    }
  }
  std::vector<float> bias(desc.n);
  std::uniform_real_distribution<float> bias_dist(-2.0f, 2.0f);
  for (float& v : bias) v = bias_dist(rng);
  // The epilogue's D, with a padded row stride when C is padded.
  const int64_t ldd = padded ? desc.n + 7 : desc.n;
  std::vector<float> d(desc.m * ldd);
  for (float& v : d) v = bias_dist(rng);
  GemmDesc run = desc;
  run.lda = padded ? lda : 0;
  run.ldb = padded ? ldb : 0;
  run.ldc = padded ? ldc : 0;
  run.ldd = padded ? ldd : 0;
  const bool has_d = desc.epilogue != GemmDesc::Epilogue::kNone;
  Status status =
      Gemm(run, a.storage.data(), b.storage.data(), c.storage.data(),
           desc.bias ? bias.data() : nullptr, has_d ? d.data() : nullptr);
  ASSERT_TRUE(status.ok()) << status.message();
  int bad = 0;
  for (int64_t i = 0; i < desc.m; ++i) {
    for (int64_t j = 0; j < desc.n; ++j) {
      double sum = 0, abs_sum = 0;
      for (int64_t p = 0; p < desc.k; ++p) {
        double av = desc.transpose_a ? a.At(p, i) : a.At(i, p);
        double bv = desc.transpose_b ? b.At(j, p) : b.At(p, j);
        sum += av * bv;
        abs_sum += std::fabs(av * bv);
      }
      const double b_j = desc.bias ? bias[j] : 0.0;
      double old_c = desc.beta == 0.0f ? 0.0 : c.At(i, j);
      double z = desc.alpha * (sum + b_j) + desc.beta * old_c;
      double bound =
          1e-5 * (std::fabs(desc.alpha) * (abs_sum + std::fabs(b_j)) +
                  std::fabs(desc.beta * old_c)) +
          1e-30;
      double expected = z;
      if (desc.sigmoid) {
        expected = Sigmoid(z);
        // sigmoid' <= 1/4; oneDNN's logistic adds a few f32 ulps.
        bound = 0.25 * bound + 1e-6;
      }
      const double d_ij = d[i * ldd + j];
      if (desc.epilogue == GemmDesc::Epilogue::kAdd) {
        expected += d_ij;
        bound += 1e-6 * std::fabs(d_ij);
      } else if (desc.epilogue == GemmDesc::Epilogue::kMultiply) {
        expected *= d_ij;
        bound *= std::fabs(d_ij);
      }
      if (desc.c_type == DType::kBF16) {
        double rounded = bf16::ToFloat(bf16::FromFloat(expected));
        bound += Bf16Ulp(rounded);
        expected = rounded;
      }
      double got = c.Get(i, j);
      if (!(std::fabs(got - expected) <= bound) && ++bad <= 5) {
        ADD_FAILURE() << "C[" << i << "," << j << "] = " << got << ", expected "
                      << expected << " +- " << bound;
      }
    }
    for (int64_t j = desc.n; j < ldc; ++j) {
      if (c.Get(i, j) != kSentinel && ++bad <= 5) {
        ADD_FAILURE() << "padding C[" << i << "," << j << "] was written";
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// Forces a bf16 route for its lifetime.
class ScopedRoute {
 public:
  explicit ScopedRoute(Bf16Route route) { SetBf16Route(route); }
  ~ScopedRoute() { SetBf16Route(std::nullopt); }
};

// The bf16 routes this machine can run: via f32 everywhere, native where
// oneDNN has bf16 kernels (within MULTISLICE_MAX_ISA).
std::vector<Bf16Route> RunnableRoutes() {
  std::vector<Bf16Route> routes = {Bf16Route::kViaF32};
  if (NativeBf16Available()) routes.push_back(Bf16Route::kNative);
  return routes;
}

using Combo =
    std::tuple<Bf16Route, bool, bool, DType, DType, float, bool, float>;

class GemmComboTest : public testing::TestWithParam<Combo> {};

TEST_P(GemmComboTest, MatchesDoubleReference) {
  auto [route, ta, tb, ab, c, beta, sigmoid, alpha] = GetParam();
  ScopedRoute forced(route);
  uint32_t seed = 1;
  for (const Shape& shape : kShapes) {
    for (bool padded : {false, true}) {
      GemmDesc desc;
      desc.m = shape.m;
      desc.n = shape.n;
      desc.k = shape.k;
      desc.transpose_a = ta;
      desc.transpose_b = tb;
      desc.ab_type = ab;
      desc.c_type = c;
      desc.alpha = alpha;
      desc.beta = beta;
      desc.sigmoid = sigmoid;
      CheckGemm(desc, padded, seed++);
    }
  }
}

std::string ComboName(const testing::TestParamInfo<Combo>& info) {
  auto [route, ta, tb, ab, c, beta, sigmoid, alpha] = info.param;
  std::string name = std::string(ab == DType::kF32             ? ""
                                 : route == Bf16Route::kNative ? "native_"
                                                               : "viaf32_") +
                     (ta ? "At" : "A") + (tb ? "Bt" : "B") + "_" +
                     (ab == DType::kF32 ? "f32" : "bf16") + "to" +
                     (c == DType::kF32 ? "f32" : "bf16") + "_beta" +
                     (beta == 0.0f ? "0" : "1") + (sigmoid ? "_sigmoid" : "") +
                     (alpha == 1.0f ? "" : "_alpha");
  return name;
}

// f32 operands have one route; bf16 ones run on every route this machine
// can run.
INSTANTIATE_TEST_SUITE_P(
    F32, GemmComboTest,
    testing::Combine(testing::Values(Bf16Route::kViaF32), testing::Bool(),
                     testing::Bool(), testing::Values(DType::kF32),
                     testing::Values(DType::kF32, DType::kBF16),
                     testing::Values(0.0f, 1.0f), testing::Bool(),
                     testing::Values(1.0f, -0.75f)),
    ComboName);
INSTANTIATE_TEST_SUITE_P(
    Bf16, GemmComboTest,
    testing::Combine(testing::ValuesIn(RunnableRoutes()), testing::Bool(),
                     testing::Bool(), testing::Values(DType::kBF16),
                     testing::Values(DType::kF32, DType::kBF16),
                     testing::Values(0.0f, 1.0f), testing::Bool(),
                     testing::Values(1.0f, -0.75f)),
    ComboName);

TEST(GemmTest, OtherBetaScalesOldC) {
  for (Bf16Route route : RunnableRoutes()) {
    ScopedRoute forced(route);
    GemmDesc desc;
    desc.m = 17;
    desc.n = 9;
    desc.k = 31;
    desc.ab_type = DType::kBF16;
    desc.c_type = DType::kBF16;
    desc.beta = 0.5f;
    desc.alpha = 2.0f;
    CheckGemm(desc, true, 9);
  }
  for (DType c : {DType::kF32, DType::kBF16}) {
    GemmDesc desc;
    desc.m = 17;
    desc.n = 9;
    desc.k = 31;
    desc.c_type = c;
    desc.beta = 0.5f;
    desc.alpha = 2.0f;
    CheckGemm(desc, false, 7);
    CheckGemm(desc, true, 8);
  }
}

TEST(GemmTest, RepeatedCallsReuseThePrimitiveAndAgree) {
  GemmDesc desc;
  desc.m = 64;
  desc.n = 48;
  desc.k = 40;
  desc.ab_type = DType::kF32;
  std::vector<float> a(desc.m * desc.k, 0.5f), b(desc.k * desc.n, 0.25f);
  std::vector<float> c1(desc.m * desc.n), c2(desc.m * desc.n);
  ASSERT_TRUE(Gemm(desc, a.data(), b.data(), c1.data()).ok());
  ASSERT_TRUE(Gemm(desc, a.data(), b.data(), c2.data()).ok());
  EXPECT_EQ(c1, c2);
  EXPECT_FLOAT_EQ(c1[0], 40 * 0.125f);
}

TEST(GemmTest, ConcurrentThreadsGetCorrectResults) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([t] {
      for (int rep = 0; rep < 3; ++rep) {
        GemmDesc desc;
        desc.m = 96 + 8 * t;
        desc.n = 80;
        desc.k = 72 - 8 * t;
        desc.transpose_b = (t == 1);
        desc.c_type = t == 0 ? DType::kF32 : DType::kBF16;
        desc.sigmoid = (rep == 2);
        CheckGemm(desc, rep == 1, 100 + t * 10 + rep);
      }
    });
  }
  for (std::thread& th : threads) th.join();
}

TEST(GemmTest, FirstGemmMakesItsThreadSingleThreaded) {
  int before = 0, after = 0, other = 0;
  std::thread worker([&] {
    before = omp_get_max_threads();
    GemmDesc desc;
    desc.m = desc.n = desc.k = 8;
    desc.ab_type = DType::kF32;
    std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64);
    ASSERT_TRUE(Gemm(desc, a.data(), b.data(), c.data()).ok());
    after = omp_get_max_threads();
  });
  worker.join();
  // A new thread starts from the process-wide default again.
  std::thread([&] { other = omp_get_max_threads(); }).join();
  EXPECT_EQ(after, 1);
  EXPECT_EQ(other, before);
}

TEST(GemmTest, SetSingleThreadedOnlyAffectsTheCallingThread) {
  int before = 0, inner = 0, other = 0;
  std::thread worker([&] {
    before = omp_get_max_threads();
    SetSingleThreaded();
    inner = omp_get_max_threads();
    std::thread([&] { other = omp_get_max_threads(); }).join();
  });
  worker.join();
  EXPECT_EQ(inner, 1);
  EXPECT_EQ(other, before);
}

// The error for `desc` must be kInvalidArgument and mention `field`.
void ExpectInvalid(const GemmDesc& desc, const std::string& field,
                   bool null_a = false) {
  std::vector<float> buf(1024);
  Status s = Gemm(desc, null_a ? nullptr : buf.data(), buf.data(), buf.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
}

TEST(GemmTest, RejectsBadDescriptions) {
  GemmDesc good;
  good.m = 4;
  good.n = 6;
  good.k = 5;
  GemmDesc d = good;
  d.m = 0;
  ExpectInvalid(d, "GemmDesc.m");
  d = good;
  d.n = -1;
  ExpectInvalid(d, "GemmDesc.n");
  d = good;
  d.k = 0;
  ExpectInvalid(d, "GemmDesc.k");
  d = good;
  d.lda = 4;  // A is [4, 5]
  ExpectInvalid(d, "GemmDesc.lda");
  d = good;
  d.transpose_a = true;
  d.lda = 3;  // A is [5, 4]
  ExpectInvalid(d, "GemmDesc.lda");
  d = good;
  d.ldb = 5;  // B is [5, 6]
  ExpectInvalid(d, "GemmDesc.ldb");
  d = good;
  d.transpose_b = true;
  d.ldb = 4;  // B is [6, 5]
  ExpectInvalid(d, "GemmDesc.ldb");
  d = good;
  d.ldc = 5;
  ExpectInvalid(d, "GemmDesc.ldc");
  d = good;
  d.alpha = std::numeric_limits<float>::infinity();
  ExpectInvalid(d, "GemmDesc.alpha");
  d = good;
  d.beta = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid(d, "GemmDesc.beta");
  d = good;
  d.ab_type = static_cast<DType>(7);
  ExpectInvalid(d, "GemmDesc.ab_type");
  ExpectInvalid(good, "A pointer", /*null_a=*/true);
  // A valid desc with a larger leading dimension is accepted.
  d = good;
  d.lda = 9;
  d.ldb = 8;
  d.ldc = 7;
  std::vector<float> buf(1024);
  EXPECT_TRUE(Gemm(d, buf.data(), buf.data(), buf.data()).ok());
}

// The bias vector is added to every row, before alpha, on every route and
// type, with beta and the sigmoid.
TEST(GemmTest, BiasIsAddedToEveryRowBeforeAlpha) {
  uint32_t seed = 40;
  for (Bf16Route route : RunnableRoutes()) {
    ScopedRoute forced(route);
    for (DType ab : {DType::kF32, DType::kBF16}) {
      for (DType c : {DType::kF32, DType::kBF16}) {
        for (bool tb : {false, true}) {
          GemmDesc desc;
          desc.m = 33;
          desc.n = 65;
          desc.k = 17;
          desc.transpose_b = tb;
          desc.ab_type = ab;
          desc.c_type = c;
          desc.bias = true;
          desc.alpha = -0.75f;
          desc.beta = tb ? 1.0f : 0.0f;
          desc.sigmoid = tb;
          CheckGemm(desc, tb, seed++);
        }
      }
    }
  }
  GemmDesc desc;
  desc.m = desc.n = desc.k = 4;
  desc.bias = true;
  std::vector<float> buf(64);
  Status s = Gemm(desc, buf.data(), buf.data(), buf.data(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bias"), std::string::npos) << s.message();
}

// The epilogue adds or multiplies D after everything else, on every route,
// with the bias, beta and the sigmoid, and a padded D.
TEST(GemmTest, EpilogueAddsOrMultipliesDLast) {
  uint32_t seed = 60;
  for (Bf16Route route : RunnableRoutes()) {
    ScopedRoute forced(route);
    for (DType ab : {DType::kF32, DType::kBF16}) {
      for (auto epilogue :
           {GemmDesc::Epilogue::kAdd, GemmDesc::Epilogue::kMultiply}) {
        for (bool variant : {false, true}) {
          GemmDesc desc;
          desc.m = 33;
          desc.n = 65;
          desc.k = 17;
          desc.transpose_a = variant;
          desc.ab_type = ab;
          desc.epilogue = epilogue;
          desc.bias = variant;
          desc.beta = variant ? 1.0f : 0.0f;
          desc.sigmoid = variant;
          CheckGemm(desc, variant, seed++);
        }
      }
    }
  }
  GemmDesc desc;
  desc.m = desc.n = desc.k = 4;
  desc.epilogue = GemmDesc::Epilogue::kAdd;
  std::vector<float> buf(64);
  Status s = Gemm(desc, buf.data(), buf.data(), buf.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("D is null"), std::string::npos) << s.message();
  desc.c_type = DType::kBF16;
  s = Gemm(desc, buf.data(), buf.data(), buf.data(), nullptr, buf.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("GemmDesc.epilogue"), std::string::npos)
      << s.message();
}

// A larger A than one 8 MiB f32 panel (1100 rows of k = 2048: two panels,
// the second short) on the bf16-through-f32 route, every transpose, bf16 C
// accumulated.
TEST(GemmTest, ViaF32SpansSeveralPanels) {
  ScopedRoute forced(Bf16Route::kViaF32);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      GemmDesc desc;
      desc.m = 1100;
      desc.n = 3;
      desc.k = 2048;
      desc.transpose_a = ta;
      desc.transpose_b = tb;
      desc.c_type = DType::kBF16;
      desc.beta = 1.0f;
      CheckGemm(desc, ta, 21);
    }
  }
}

// The route is chosen from what oneDNN can do, named in reports, and a
// forced native route fails with a sentence where there is none.
TEST(GemmTest, RouteIsChosenFromTheCpuAndNamed) {
  // Without bf16 kernels the route is through f32; with them it is whichever
  // measured faster (native unless f32 is clearly faster).
  if (!NativeBf16Available()) {
    EXPECT_EQ(ActiveBf16Route(), Bf16Route::kViaF32);
  }
  const std::string isa(IsaName(ActiveIsa()));
  const std::string vector_isa(IsaName(std::min(ActiveIsa(), Isa::kAvx512)));
  EXPECT_EQ(MatmulRouteName(DType::kF32), "float32 (" + vector_isa + ")");
  {
    ScopedRoute forced(Bf16Route::kViaF32);
    EXPECT_EQ(MatmulRouteName(DType::kBF16),
              "bfloat16 via float32 kernels (" + vector_isa + ")");
    GemmDesc desc;
    desc.m = desc.n = desc.k = 64;
    Result<std::string> impl = GemmImplName(desc);
    ASSERT_TRUE(impl.ok()) << impl.status().message();
    EXPECT_NE(impl->find("bfloat16 widened to float32"), std::string::npos)
        << *impl;
  }
  ScopedRoute forced(Bf16Route::kNative);
  if (NativeBf16Available()) {
    EXPECT_EQ(MatmulRouteName(DType::kBF16), "bfloat16 native (" + isa + ")");
  } else {
    GemmDesc desc;
    desc.m = desc.n = desc.k = 8;
    std::vector<uint16_t> a(64), b(64);
    std::vector<float> c(64);
    Status status = Gemm(desc, a.data(), b.data(), c.data());
    EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(status.message().find("no bf16 matmul"), std::string::npos)
        << status.message();
  }
}

TEST(GemmTest, ReportsIsaAndImplementation) {
  EXPECT_STRNE(DnnlIsaName(), "unknown");
  EXPECT_FALSE(DnnlVersion().empty());
  GemmDesc desc;
  desc.m = desc.n = desc.k = 256;
  Result<std::string> impl = GemmImplName(desc);
  ASSERT_TRUE(impl.ok()) << impl.status().message();
  EXPECT_FALSE(impl->empty());
  std::printf("oneDNN %s, ISA %s, bf16 matmul: %s\n", DnnlVersion().c_str(),
              DnnlIsaName(), impl->c_str());
}

}  // namespace
}  // namespace multislice::compute
