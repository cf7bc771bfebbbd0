#include "runtime/mesh/parallelism.h"

#include <gtest/gtest.h>

#include <string>

namespace multislice::mesh {
namespace {

// The tests below were written for the axes data, fsdp and tensor: each
// takes three values per level, and the diloco axis before them and the
// stage axis between data and fsdp are 1.
using Dft = std::array<int, 3>;

AxisSizes WithStage1(const Dft& v) { return {1, v[0], 1, v[1], v[2]}; }

ParallelismConfig Config(const Dft& ici, const Dft& dcn) {
  ParallelismConfig config;
  config.ici = WithStage1(ici);
  config.dcn = WithStage1(dcn);
  return config;
}

void ExpectResolved(const ParallelismConfig& config, int devices_per_slice,
                    int num_slices, AxisSizes want_ici, AxisSizes want_dcn) {
  Result<ParallelismConfig> r =
      ResolveParallelism(config, devices_per_slice, num_slices);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->ici, want_ici);
  EXPECT_EQ(r->dcn, want_dcn);
}

void ExpectResolved(Dft ici, Dft dcn, int devices_per_slice, int num_slices,
                    Dft want_ici, Dft want_dcn) {
  ExpectResolved(Config(ici, dcn), devices_per_slice, num_slices,
                 WithStage1(want_ici), WithStage1(want_dcn));
}

void ExpectError(const ParallelismConfig& config, int devices_per_slice,
                 int num_slices, const std::string& message) {
  Result<ParallelismConfig> r =
      ResolveParallelism(config, devices_per_slice, num_slices);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), message);
}

void ExpectError(Dft ici, Dft dcn, int devices_per_slice, int num_slices,
                 const std::string& message) {
  ExpectError(Config(ici, dcn), devices_per_slice, num_slices, message);
}

TEST(ParallelismTest, AxisNames) {
  // MaxText's mesh_axes order, with the stage axis's keys named pipeline.
  EXPECT_EQ(kNumAxes, 5);
  EXPECT_STREQ(kAxisNames[kDiloco], "diloco");
  EXPECT_STREQ(kAxisNames[kData], "data");
  EXPECT_STREQ(kAxisNames[kStage], "stage");
  EXPECT_STREQ(kAxisNames[kFsdp], "fsdp");
  EXPECT_STREQ(kAxisNames[kTensor], "tensor");
  EXPECT_EQ(kDiloco, 0);
  EXPECT_EQ(kData, 1);
  EXPECT_EQ(kStage, 2);
  EXPECT_EQ(kFsdp, 3);
  EXPECT_EQ(kTensor, 4);
  EXPECT_STREQ(kAxisKeyWords[kDiloco], "diloco");
  EXPECT_STREQ(kAxisKeyWords[kData], "data");
  EXPECT_STREQ(kAxisKeyWords[kStage], "pipeline");
  EXPECT_STREQ(kAxisKeyWords[kFsdp], "fsdp");
  EXPECT_STREQ(kAxisKeyWords[kTensor], "tensor");
  // Defaults: one device along every axis.
  const ParallelismConfig defaults;
  EXPECT_EQ(defaults.ici, (AxisSizes{1, 1, 1, 1, 1}));
  EXPECT_EQ(defaults.dcn, (AxisSizes{1, 1, 1, 1, 1}));
}

// The stage axis resolves like any other: a -1 beside it is filled with
// what it and the rest leave, and size() multiplies both levels.
TEST(ParallelismTest, StageAxis) {
  ExpectResolved(ParallelismConfig{{1, 1, 2, -1, 1}, {1, 1, 1, 1, 1}}, 8, 1,
                 {1, 1, 2, 4, 1}, {1, 1, 1, 1, 1});
  ExpectResolved(ParallelismConfig{{1, 1, -1, 2, 1}, {1, 1, 1, 1, 1}}, 8, 1,
                 {1, 1, 4, 2, 1}, {1, 1, 1, 1, 1});
  ExpectResolved(ParallelismConfig{{1, 1, 1, 4, 1}, {1, 1, -1, 1, 1}}, 4, 3,
                 {1, 1, 1, 4, 1}, {1, 1, 3, 1, 1});
  Result<ParallelismConfig> r = ResolveParallelism(
      ParallelismConfig{{1, 2, 2, -1, 1}, {1, 1, 2, 1, 1}}, 8, 2);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->size(kData), 2);
  EXPECT_EQ(r->size(kStage), 4);
  EXPECT_EQ(r->size(kFsdp), 2);
  EXPECT_EQ(r->size(kTensor), 1);
  // Its values count in the products, the -1 count and the one-slice check.
  ExpectError(ParallelismConfig{{1, 1, 2, 4, 1}, {1, 1, 1, 1, 1}}, 4, 1,
              "Number of devices per slice 4 does not match the product of "
              "the ICI parallelism 8");
  ExpectError(ParallelismConfig{{1, 1, -1, -1, 1}, {1, 1, 1, 1, 1}}, 4, 1,
              "Found unspecified values (-1) for more than one ICI "
              "parallelism axis. At most one axis can be unspecified.");
  ExpectError(ParallelismConfig{{1, 1, 1, 4, 1}, {1, 1, 2, 1, 1}}, 4, 1,
              "DCN parallelism requested but only one slice available.");
  // A bad value names MaxText's key of the axis.
  ExpectError(ParallelismConfig{{1, 1, 0, 4, 1}, {1, 1, 1, 1, 1}}, 4, 1,
              "ici_pipeline_parallelism must be a positive integer or -1, "
              "got 0");
  ExpectError(ParallelismConfig{{1, 1, 1, 4, 1}, {1, 1, -3, 1, 1}}, 4, 2,
              "dcn_pipeline_parallelism must be a positive integer or -1, "
              "got -3");
}

TEST(ParallelismTest, ExplicitValuesThatMultiplyToTheTargetsPass) {
  ExpectResolved({1, 1, 1}, {1, 1, 1}, 1, 1, {1, 1, 1}, {1, 1, 1});
  ExpectResolved({1, 4, 1}, {1, 1, 1}, 4, 1, {1, 4, 1}, {1, 1, 1});
  ExpectResolved({2, 2, 2}, {2, 1, 2}, 8, 4, {2, 2, 2}, {2, 1, 2});
  // The seed's v5e example: two v5litepod-16 slices.
  ExpectResolved({1, 16, 1}, {2, 1, 1}, 16, 2, {1, 16, 1}, {2, 1, 1});
}

TEST(ParallelismTest, OneMinusOnePerLevelIsFilled) {
  ExpectResolved({1, -1, 1}, {1, 1, 1}, 8, 1, {1, 8, 1}, {1, 1, 1});
  ExpectResolved({2, -1, 1}, {1, 1, 1}, 8, 1, {2, 4, 1}, {1, 1, 1});
  ExpectResolved({1, 1, -1}, {-1, 1, 1}, 4, 4, {1, 1, 4}, {4, 1, 1});
  ExpectResolved({-1, 2, 2}, {1, -1, 2}, 8, 6, {2, 2, 2}, {1, 3, 2});
  // The fill may be 1.
  ExpectResolved({4, -1, 1}, {-1, 1, 1}, 4, 1, {4, 1, 1}, {1, 1, 1});
}

TEST(ParallelismTest, MoreThanOneMinusOne) {
  ExpectError({-1, -1, 1}, {1, 1, 1}, 4, 1,
              "Found unspecified values (-1) for more than one ICI "
              "parallelism axis. At most one axis can be unspecified.");
  ExpectError({-1, -1, -1}, {1, 1, 1}, 4, 1,
              "Found unspecified values (-1) for more than one ICI "
              "parallelism axis. At most one axis can be unspecified.");
  ExpectError({1, 4, 1}, {-1, 1, -1}, 4, 2,
              "Found unspecified values (-1) for more than one DCN "
              "parallelism axis. At most one axis can be unspecified.");
}

TEST(ParallelismTest, UnspecifiedValueMustBeAPositiveInteger) {
  ExpectError({3, -1, 1}, {1, 1, 1}, 8, 1,
              "Unspecified value unable to be determined with the given ICI "
              "parallelism values");
  // 8 / 16 is below 1.
  ExpectError({16, -1, 1}, {1, 1, 1}, 8, 1,
              "Unspecified value unable to be determined with the given ICI "
              "parallelism values");
  ExpectError({1, 4, 1}, {-1, 3, 1}, 4, 4,
              "Unspecified value unable to be determined with the given DCN "
              "parallelism values");
}

TEST(ParallelismTest, ProductMustMatchTheTarget) {
  ExpectError({1, 3, 1}, {1, 1, 1}, 4, 1,
              "Number of devices per slice 4 does not match the product of "
              "the ICI parallelism 3");
  ExpectError({1, 4, 1}, {1, 1, 1}, 4, 2,
              "Number of slices 2 does not match the product of the DCN "
              "parallelism 1");
  ExpectError({1, 4, 1}, {2, 1, 1}, 4, 4,
              "Number of slices 4 does not match the product of the DCN "
              "parallelism 2");
  // Products beyond int are printed exactly.
  ExpectError({65536, 65536, 65536}, {1, 1, 1}, 8, 1,
              "Number of devices per slice 8 does not match the product of "
              "the ICI parallelism 281474976710656");
}

TEST(ParallelismTest, DcnOnOneSlice) {
  ExpectError({1, 4, 1}, {2, 1, 1}, 4, 1,
              "DCN parallelism requested but only one slice available.");
  ExpectError({1, 4, 1}, {1, 1, 2}, 4, 1,
              "DCN parallelism requested but only one slice available.");
  // Also when a -1 could not be filled anyway.
  ExpectError({1, 4, 1}, {2, -1, 1}, 4, 1,
              "DCN parallelism requested but only one slice available.");
}

TEST(ParallelismTest, ZeroOrBelowMinusOneNamesTheAxis) {
  ExpectError({1, 0, 1}, {1, 1, 1}, 4, 1,
              "ici_fsdp_parallelism must be a positive integer or -1, got 0");
  ExpectError({-2, 1, 1}, {1, 1, 1}, 4, 1,
              "ici_data_parallelism must be a positive integer or -1, got -2");
  ExpectError({1, 4, 1}, {1, 1, -5}, 4, 1,
              "dcn_tensor_parallelism must be a positive integer or -1, got "
              "-5");
  // Values are checked before the -1 count.
  ExpectError({-1, -1, 0}, {1, 1, 1}, 4, 1,
              "ici_tensor_parallelism must be a positive integer or -1, got "
              "0");
  EXPECT_TRUE(CheckParallelismValues(Config({-1, 2, 1}, {1, -1, 1})).ok());
}

TEST(ParallelismTest, IciIsCheckedBeforeDcn) {
  ExpectError({1, 3, 1}, {1, 1, 1}, 4, 2,
              "Number of devices per slice 4 does not match the product of "
              "the ICI parallelism 3");
}

TEST(ParallelismTest, TargetsMustBePositive) {
  ExpectError({1, 1, 1}, {1, 1, 1}, 0, 1,
              "the number of devices per slice must be a positive integer, "
              "got 0");
  ExpectError({1, 1, 1}, {1, 1, 1}, 1, 0,
              "num_slices must be a positive integer, got 0");
}

}  // namespace
}  // namespace multislice::mesh
