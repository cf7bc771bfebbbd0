// Tests of the performance model: the seed's worked numbers for TPU v4
// exactly, sanity for other types, the shape of the predictions, the
// strategy rule and the input checks.
#include "model/perf_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace multislice::model {
namespace {

PerfModelOptions V4(int num_slices, double tokens_per_slice,
                    double parameters = 16e9) {
  PerfModelOptions o;
  o.accelerator_type = "v4-16";
  o.num_slices = num_slices;
  o.parameters = parameters;
  o.tokens_per_slice = tokens_per_slice;
  return o;
}

PerfPlan MustPlan(const PerfModelOptions& options) {
  Result<PerfPlan> plan = PlanPerformance(options);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? *plan : PerfPlan();
}

TEST(PerfModelSeedTest, V4ArithmeticIntensityIs22000FlopsPerBit) {
  // "4 * 275 * 10¹² FLOPS/50 Gbps = 22.000 FLOPS/bit"
  EXPECT_EQ(ArithmeticIntensity(4, 275e12, 50e9), 22000.0);
  for (const char* type : {"v4-8", "v4-16", "v4-4096"}) {
    PerfModelOptions o = V4(2, 350000);
    o.accelerator_type = type;
    EXPECT_EQ(MustPlan(o).arithmetic_intensity, 22000.0) << type;
  }
}

TEST(PerfModelSeedTest, DcnBitsPerParameterAre32WithTwoSlicesUpTo64) {
  EXPECT_EQ(32 * AllReduceFactor(2, DcnVolume::kSeed), 32.0);
  for (int m : {3, 4, 8, 256}) {
    EXPECT_EQ(32 * AllReduceFactor(m, DcnVolume::kSeed), 64.0) << m;
  }
  EXPECT_EQ(AllReduceFactor(1, DcnVolume::kSeed), 0.0);
  // The ring's exact volume: 2 (m - 1) / m, 1 at two slices, towards 2.
  EXPECT_EQ(AllReduceFactor(2, DcnVolume::kRing), 1.0);
  EXPECT_DOUBLE_EQ(AllReduceFactor(4, DcnVolume::kRing), 1.5);
  EXPECT_DOUBLE_EQ(AllReduceFactor(256, DcnVolume::kRing), 2.0 * 255 / 256);
  double previous = 0;
  for (int m = 2; m <= 64; ++m) {
    const double factor = AllReduceFactor(m, DcnVolume::kRing);
    EXPECT_GT(factor, previous);
    EXPECT_LT(factor, 2.0);
    previous = factor;
  }
  EXPECT_EQ(MustPlan(V4(2, 350000)).data_parallel.dcn_bits_per_parameter, 32);
  EXPECT_EQ(MustPlan(V4(4, 700000)).data_parallel.dcn_bits_per_parameter, 64);
}

TEST(PerfModelSeedTest, OperationalIntensityIs4BOver32Or64) {
  const PerfPlan two = MustPlan(V4(2, 350000));
  EXPECT_EQ(two.data_parallel.operational_intensity, 4.0 * 350000 / 32);
  const PerfPlan many = MustPlan(V4(16, 700000));
  EXPECT_EQ(many.data_parallel.operational_intensity, 4.0 * 700000 / 64);
}

TEST(PerfModelSeedTest, MinimumBatchIs176kWithTwoSlicesAnd352kWithMore) {
  // "um tamanho mínimo de lote entre 176 mil e 352 mil"
  EXPECT_EQ(MinimumBatchTokens(22000, 32, 4), 176000.0);
  EXPECT_EQ(MinimumBatchTokens(22000, 64, 4), 352000.0);
  EXPECT_EQ(MustPlan(V4(2, 1000)).data_parallel.minimum_tokens_per_slice,
            176000.0);
  for (int m : {3, 4, 8, 64}) {
    EXPECT_EQ(MustPlan(V4(m, 1000)).data_parallel.minimum_tokens_per_slice,
              352000.0)
        << m;
  }
}

TEST(PerfModelSeedTest, RecommendedBatchIs350kForTwoPodsAnd700kForMany) {
  // "pelo menos 350 mil (dois pods) a 700 mil (muitos pods)"
  EXPECT_EQ(RecommendedBatchTokens(176000, 2), 350000.0);
  EXPECT_EQ(RecommendedBatchTokens(352000, 2), 700000.0);
  EXPECT_EQ(MustPlan(V4(2, 1000)).data_parallel.recommended_tokens_per_slice,
            350000.0);
  EXPECT_EQ(MustPlan(V4(8, 1000)).data_parallel.recommended_tokens_per_slice,
            700000.0);
  // Never below the minimum, whatever the margin.
  EXPECT_EQ(RecommendedBatchTokens(354000, 1), 354000.0);
  EXPECT_EQ(RecommendedBatchTokens(176000, 1), 180000.0);
}

TEST(PerfModelSeedTest, OperationalIntensityMeetsArithmeticAtTheMinimum) {
  for (int m : {2, 8}) {
    const PerfPlan at_min = MustPlan(V4(m, m == 2 ? 176000 : 352000));
    EXPECT_EQ(at_min.data_parallel.operational_intensity,
              at_min.arithmetic_intensity);
    EXPECT_TRUE(at_min.data_parallel.dcn_hidden);
    EXPECT_DOUBLE_EQ(at_min.data_parallel.backward_dcn_seconds,
                     at_min.data_parallel.backward_seconds);
    const PerfPlan below = MustPlan(V4(m, m == 2 ? 175000 : 351000));
    EXPECT_FALSE(below.data_parallel.dcn_hidden);
    EXPECT_LT(below.data_parallel.scaling_efficiency, 1.0);
  }
}

TEST(RoundToSignificantDigitsTest, TwoDigits) {
  EXPECT_EQ(RoundToSignificantDigits(352000, 2), 350000.0);
  EXPECT_EQ(RoundToSignificantDigits(704000, 2), 700000.0);
  EXPECT_EQ(RoundToSignificantDigits(63040, 2), 63000.0);
  EXPECT_EQ(RoundToSignificantDigits(155, 2), 160.0);
  EXPECT_EQ(RoundToSignificantDigits(0.0123, 2), 0.012);
  EXPECT_EQ(RoundToSignificantDigits(0, 2), 0.0);
}

TEST(PerfModelStepTest, V4TwoSlicesStepTimes) {
  // 16e9 parameters, 350,000 tokens per slice on v4-16 (8 chips, 2 hosts).
  const PerfPlan plan = MustPlan(V4(2, 350000));
  const StrategyEstimate& e = plan.estimate;
  EXPECT_EQ(e.strategy, DcnStrategy::kData);
  EXPECT_EQ(plan.chips_per_slice, 8);
  EXPECT_EQ(plan.hosts_per_slice, 2);
  EXPECT_DOUBLE_EQ(e.forward_seconds, 2 * 350000 * 16e9 / (8 * 275e12));
  EXPECT_DOUBLE_EQ(e.backward_seconds, 4 * 350000 * 16e9 / (8 * 275e12));
  // Each host all-reduces its half of the parameters: 32 bits x 16e9 / 2.
  EXPECT_DOUBLE_EQ(e.dcn_bytes_per_host, 32 * 16e9 / 2 / 8);
  EXPECT_DOUBLE_EQ(e.backward_dcn_seconds, 32 * 16e9 / 2 / 50e9);
  EXPECT_EQ(e.forward_dcn_seconds, 0);
  EXPECT_TRUE(e.dcn_hidden);
  EXPECT_DOUBLE_EQ(e.step_seconds, e.forward_seconds + e.backward_seconds);
  EXPECT_DOUBLE_EQ(e.step_seconds_without_overlap,
                   e.step_seconds + e.backward_dcn_seconds);
  EXPECT_DOUBLE_EQ(plan.single_slice_step_seconds, e.step_seconds);
  EXPECT_DOUBLE_EQ(e.scaling_efficiency, 1.0);
  EXPECT_EQ(plan.global_batch_tokens, 700000);
}

TEST(PerfModelStepTest, MfuStretchesComputeOnly) {
  PerfModelOptions o = V4(2, 100000);
  const PerfPlan full = MustPlan(o);
  o.mfu = 0.5;
  const PerfPlan half = MustPlan(o);
  EXPECT_DOUBLE_EQ(half.data_parallel.backward_seconds,
                   2 * full.data_parallel.backward_seconds);
  EXPECT_DOUBLE_EQ(half.data_parallel.backward_dcn_seconds,
                   full.data_parallel.backward_dcn_seconds);
  // The seed's minimum is defined at peak: MFU does not move it.
  EXPECT_EQ(half.data_parallel.minimum_tokens_per_slice, 176000.0);
  EXPECT_GE(half.data_parallel.scaling_efficiency,
            full.data_parallel.scaling_efficiency);
}

TEST(PerfModelStepTest, OtherTypesSanity) {
  struct Case {
    const char* type;
    int chips_per_host;
    double arithmetic_intensity;
  };
  // v5e: 197e12 FLOP/s, 25 Gbit/s per chip; v6e: 918e12, 100 Gbit/s per
  // chip; v5p: 459e12, 200 Gbit/s per 4-chip host.
  const Case cases[] = {
      {"v5litepod-16", 4, 4 * 197e12 / 100e9},
      {"v5litepod-8", 8, 8 * 197e12 / 200e9},
      {"v6e-16", 4, 4 * 918e12 / 400e9},
      {"v6e-256", 4, 4 * 918e12 / 400e9},
      {"v5p-16", 4, 4 * 459e12 / 200e9},
  };
  for (const Case& c : cases) {
    PerfModelOptions o = V4(2, 100000, 8e9);
    o.accelerator_type = c.type;
    const PerfPlan plan = MustPlan(o);
    EXPECT_EQ(plan.chips_per_host, c.chips_per_host) << c.type;
    EXPECT_DOUBLE_EQ(plan.arithmetic_intensity, c.arithmetic_intensity)
        << c.type;
    EXPECT_DOUBLE_EQ(plan.data_parallel.minimum_tokens_per_slice,
                     c.arithmetic_intensity * 32 / 4)
        << c.type;
    // Newer chips have more DCN per FLOP than v4: a smaller minimum.
    EXPECT_LT(plan.data_parallel.minimum_tokens_per_slice, 176000) << c.type;
    EXPECT_GT(plan.estimate.step_seconds, 0) << c.type;
  }
  PerfModelOptions v5e = V4(2, 100000, 8e9);
  v5e.accelerator_type = "v5litepod-16";
  const PerfPlan plan = MustPlan(v5e);
  EXPECT_DOUBLE_EQ(plan.arithmetic_intensity, 7880);
  EXPECT_DOUBLE_EQ(plan.data_parallel.minimum_tokens_per_slice, 63040);
  EXPECT_DOUBLE_EQ(plan.data_parallel.recommended_tokens_per_slice, 130000);
}

TEST(PerfModelStepTest, ScalingEfficiencyIsMonotonicInBandwidth) {
  for (int m : {2, 4, 32}) {
    double previous = 0;
    bool reached_one = false;
    for (double gbps = 1; gbps <= 1000; gbps *= 1.5) {
      PerfModelOptions o = V4(m, 200000);
      o.dcn_gbps_per_host = gbps;
      o.strategy = DcnStrategy::kData;
      const PerfPlan plan = MustPlan(o);
      const double efficiency = plan.estimate.scaling_efficiency;
      EXPECT_GE(efficiency, previous) << m << " slices, " << gbps;
      EXPECT_LE(efficiency, 1.0);
      EXPECT_GT(efficiency, 0.0);
      EXPECT_EQ(plan.estimate.dcn_hidden, efficiency == 1.0);
      reached_one = reached_one || efficiency == 1.0;
      previous = efficiency;
    }
    EXPECT_TRUE(reached_one) << m;
  }
}

TEST(PerfModelStepTest, EfficiencyGrowsWithBatchAndFallsWithSlices) {
  double previous = 0;
  for (double tokens = 10000; tokens <= 1e6; tokens *= 2) {
    PerfModelOptions o = V4(8, tokens);
    o.strategy = DcnStrategy::kData;
    const double efficiency = MustPlan(o).estimate.scaling_efficiency;
    EXPECT_GE(efficiency, previous) << tokens;
    previous = efficiency;
  }
  PerfModelOptions two = V4(2, 100000);
  PerfModelOptions many = V4(8, 100000);
  two.strategy = many.strategy = DcnStrategy::kData;
  EXPECT_GT(MustPlan(two).estimate.scaling_efficiency,
            MustPlan(many).estimate.scaling_efficiency);
}

TEST(PerfModelStepTest, FsdpMovesHalfMoreThanDataParallelism) {
  PerfModelOptions o = V4(4, 800000);
  o.strategy = DcnStrategy::kFsdp;
  const PerfPlan plan = MustPlan(o);
  const StrategyEstimate& f = plan.estimate;
  EXPECT_EQ(f.strategy, DcnStrategy::kFsdp);
  EXPECT_DOUBLE_EQ(f.dcn_bits_per_parameter,
                   1.5 * plan.data_parallel.dcn_bits_per_parameter);
  EXPECT_DOUBLE_EQ(f.backward_dcn_bits_per_parameter, 64);
  EXPECT_GT(f.forward_dcn_seconds, 0);
  // Same batch rule as data parallelism (the seed).
  EXPECT_EQ(f.minimum_tokens_per_slice,
            plan.data_parallel.minimum_tokens_per_slice);
  EXPECT_DOUBLE_EQ(f.state_bytes_per_chip,
                   plan.data_parallel.state_bytes_per_chip / 4);
}

TEST(PerfModelStepTest, PipelineSeesTheBatchPerPipeline) {
  PerfModelOptions o = V4(8, 100000);
  o.strategy = DcnStrategy::kPipeline;
  o.pipeline_depth = 4;
  o.pipeline_microbatches = 12;
  const PerfPlan plan = MustPlan(o);
  const StrategyEstimate& p = plan.estimate;
  EXPECT_EQ(p.pipeline_depth, 4);
  EXPECT_EQ(p.data_replicas, 2);
  EXPECT_EQ(p.parameters_per_slice, 4e9);
  // Two replicas: 32 bits per parameter; 400,000 tokens per pipeline.
  EXPECT_EQ(p.backward_dcn_bits_per_parameter, 32);
  EXPECT_EQ(p.operational_intensity, 4.0 * 400000 / 32);
  EXPECT_EQ(p.minimum_tokens_per_slice, 176000.0 / 4);
  EXPECT_EQ(p.recommended_tokens_per_slice, 350000.0 / 4);
  // Bubble (n + d - 1) / n.
  EXPECT_DOUBLE_EQ(p.backward_seconds,
                   plan.data_parallel.backward_seconds * (12 + 4 - 1) / 12.0);
  EXPECT_DOUBLE_EQ(p.scaling_efficiency, 12 / 15.0);
  // One pipeline over all slices: nothing to all-reduce.
  o.pipeline_depth = 8;
  const PerfPlan one = MustPlan(o);
  EXPECT_EQ(one.estimate.data_replicas, 1);
  EXPECT_EQ(one.estimate.dcn_bits_per_parameter, 0);
  EXPECT_TRUE(std::isinf(one.estimate.operational_intensity));
  EXPECT_EQ(one.estimate.pipeline_microbatches, 12);
}

TEST(PerfModelRecommendTest, DataParallelismWhenTheBatchHasTheMargin) {
  const PerfPlan two = MustPlan(V4(2, 350000));
  EXPECT_EQ(two.recommendation.strategy, DcnStrategy::kData);
  EXPECT_EQ(two.recommendation.dcn_data_parallelism, 2);
  EXPECT_EQ(two.recommendation.dcn_fsdp_parallelism, 1);
  EXPECT_NE(two.recommendation.reason.find("350,000"), std::string::npos)
      << two.recommendation.reason;
  const PerfPlan many = MustPlan(V4(16, 700000));
  EXPECT_EQ(many.recommendation.strategy, DcnStrategy::kData);
  EXPECT_EQ(many.recommendation.dcn_data_parallelism, 16);
  EXPECT_EQ(many.estimate.strategy, DcnStrategy::kData);
}

TEST(PerfModelRecommendTest, OneSliceNeedsNothingAcrossDcn) {
  const PerfPlan one = MustPlan(V4(1, 1000));
  EXPECT_EQ(one.recommendation.strategy, DcnStrategy::kData);
  EXPECT_EQ(one.recommendation.dcn_data_parallelism, 1);
  EXPECT_EQ(one.data_parallel.dcn_bits_per_parameter, 0);
  EXPECT_EQ(one.data_parallel.minimum_tokens_per_slice, 0);
  EXPECT_DOUBLE_EQ(one.estimate.scaling_efficiency, 1.0);
}

TEST(PerfModelRecommendTest, PipelineWhenTheBatchIsTooSmall) {
  // 8 slices: data parallelism needs 352k per slice (700k with the margin).
  // At 200k its all-reduce (64 bits x 16e9 / 2 hosts / 50e9 = 10.24 s) is
  // exposed under a 5.82 s backward pass; depth 2 (4 replicas: 5.12 s under
  // 6.55 s) is the fastest pipeline, bubble 1/9 against 3/19 and 7/39.
  const PerfPlan depth2 = MustPlan(V4(8, 200000));
  EXPECT_EQ(depth2.recommendation.strategy, DcnStrategy::kPipeline);
  EXPECT_EQ(depth2.recommendation.pipeline_depth, 2);
  EXPECT_EQ(depth2.recommendation.dcn_pipeline_parallelism, 2);
  EXPECT_EQ(depth2.recommendation.dcn_data_parallelism, 4);
  EXPECT_EQ(depth2.recommendation.num_pipeline_microbatches, 8);
  EXPECT_EQ(depth2.recommendation.pipeline_parallel_schedule, "1F1B");
  EXPECT_EQ(depth2.estimate.strategy, DcnStrategy::kPipeline);
  EXPECT_TRUE(depth2.estimate.dcn_hidden);
  // 100k per slice: depth 2 no longer hides (4 x 200k / 64 < 22,000);
  // depth 4 (2 replicas, 400k per pipeline) does.
  const PerfPlan depth4 = MustPlan(V4(8, 100000));
  EXPECT_EQ(depth4.recommendation.pipeline_depth, 4);
  EXPECT_EQ(depth4.recommendation.dcn_data_parallelism, 2);
  EXPECT_EQ(depth4.recommendation.num_pipeline_microbatches, 16);
  // 10k per slice: one pipeline over all 8 slices.
  const PerfPlan depth8 = MustPlan(V4(8, 10000));
  EXPECT_EQ(depth8.recommendation.pipeline_depth, 8);
  EXPECT_EQ(depth8.recommendation.dcn_data_parallelism, 1);
  // Three slices: the only depth is 3.
  const PerfPlan three = MustPlan(V4(3, 100000));
  EXPECT_EQ(three.recommendation.pipeline_depth, 3);
  EXPECT_EQ(three.recommendation.dcn_data_parallelism, 1);
  // Just below the minimum (350k < 352k) data parallelism loses 0.4 % to
  // DCN, a pipeline at least its bubble: data parallelism, said so.
  const PerfPlan just_below = MustPlan(V4(8, 350000));
  EXPECT_EQ(just_below.recommendation.strategy, DcnStrategy::kData);
  EXPECT_FALSE(just_below.data_parallel.dcn_hidden);
  EXPECT_NE(
      just_below.recommendation.reason.find("No pipeline is predicted faster"),
      std::string::npos)
      << just_below.recommendation.reason;
  // Between the minimum and the margin DCN hides, so data parallelism is
  // predicted fastest; the reason names the seed's margin.
  const PerfPlan no_margin = MustPlan(V4(2, 200000));
  EXPECT_EQ(no_margin.recommendation.strategy, DcnStrategy::kData);
  EXPECT_TRUE(no_margin.data_parallel.dcn_hidden);
  EXPECT_NE(no_margin.recommendation.reason.find("margin"), std::string::npos);
  EXPECT_NE(no_margin.recommendation.reason.find("350,000"), std::string::npos)
      << no_margin.recommendation.reason;
}

TEST(PerfModelRecommendTest, FsdpOnlyWhenAReplicaDoesNotFitAndDcnKeepsUp) {
  // 64e9 parameters x 16 bytes over 8 chips: 119 GiB per chip > 32 GiB; over
  // 4 slices 29.8 GiB fits; 800k tokens per slice hide DCN.
  const PerfPlan fsdp = MustPlan(V4(4, 800000, 64e9));
  EXPECT_FALSE(fsdp.data_parallel.fits_in_memory);
  EXPECT_EQ(fsdp.recommendation.strategy, DcnStrategy::kFsdp);
  EXPECT_EQ(fsdp.recommendation.dcn_fsdp_parallelism, 4);
  EXPECT_EQ(fsdp.recommendation.dcn_data_parallelism, 1);
  EXPECT_TRUE(fsdp.estimate.fits_in_memory);
  // The same model when DCN cannot keep up: pipeline instead.
  const PerfPlan slow = MustPlan(V4(4, 100000, 64e9));
  EXPECT_EQ(slow.recommendation.strategy, DcnStrategy::kPipeline);
  EXPECT_TRUE(slow.estimate.fits_in_memory);
  // A model that fits a slice stays data-parallel even when FSDP would hide.
  const PerfPlan small = MustPlan(V4(4, 800000, 1e9));
  EXPECT_EQ(small.recommendation.strategy, DcnStrategy::kData);
  // Memory unknown for cpu-N: never FSDP for memory.
  PerfModelOptions cpu = V4(2, 1000, 1e12);
  cpu.accelerator_type = "cpu-2";
  cpu.peak_flops_per_chip = 50e9;
  cpu.dcn_gbps_per_host = 10;
  const PerfPlan cpu_plan = MustPlan(cpu);
  EXPECT_EQ(cpu_plan.memory_bytes_per_chip, 0);
  EXPECT_TRUE(cpu_plan.data_parallel.fits_in_memory);
  EXPECT_EQ(cpu_plan.recommendation.strategy, DcnStrategy::kData);
  // ... unless the memory is given.
  cpu.memory_bytes_per_chip = 4e12;
  EXPECT_EQ(MustPlan(cpu).recommendation.strategy, DcnStrategy::kFsdp);
}

TEST(PerfModelRecommendTest, ChosenStrategyIsPredictedEvenIfNotRecommended) {
  PerfModelOptions o = V4(8, 100000);
  o.strategy = DcnStrategy::kData;
  const PerfPlan plan = MustPlan(o);
  EXPECT_EQ(plan.recommendation.strategy, DcnStrategy::kPipeline);
  EXPECT_EQ(plan.estimate.strategy, DcnStrategy::kData);
  // 100,000 is far below the minimum 352,000 for 8 slices: the all-reduce
  // (64 bits x 16e9 / 2 hosts / 50e9) is the backward pass's time.
  EXPECT_FALSE(plan.estimate.dcn_hidden);
  EXPECT_DOUBLE_EQ(plan.estimate.step_seconds,
                   2 * 100000 * 16e9 / (8 * 275e12) + 64 * 16e9 / 2 / 50e9);
  EXPECT_LT(plan.estimate.scaling_efficiency, 1.0);
  // A forced depth is predicted; the recommendation keeps the fastest.
  PerfModelOptions forced = V4(8, 100000);
  forced.strategy = DcnStrategy::kPipeline;
  forced.pipeline_depth = 2;
  const PerfPlan forced_plan = MustPlan(forced);
  EXPECT_EQ(forced_plan.estimate.pipeline_depth, 2);
  EXPECT_FALSE(forced_plan.estimate.dcn_hidden);
  EXPECT_EQ(forced_plan.recommendation.pipeline_depth, 4);
  // Without a depth, the fastest is predicted.
  forced.pipeline_depth = 0;
  EXPECT_EQ(MustPlan(forced).estimate.pipeline_depth, 4);
}

// The figures of this machine's DCN case (two cpu-1 slices, 1e11 FLOP/s per
// device, 1 Gbit/s per host) with the quickstart model (1.2e7 parameters,
// emb_dim 256). The expected times are the formulas of perf_model.h written
// out: AI = 1 x 1e11 / 1e9 = 100 FLOP/bit, so the DP minimum is 100 x 32 / 4
// = 800 tokens per slice.
PerfModelOptions ThisMachine(double tokens_per_slice) {
  PerfModelOptions o;
  o.accelerator_type = "cpu-1";
  o.num_slices = 2;
  o.parameters = 1.2e7;
  o.tokens_per_slice = tokens_per_slice;
  o.peak_flops_per_chip = 1e11;
  o.dcn_gbps_per_host = 1;
  o.emb_dim = 256;
  return o;
}

// Data parallelism over 2 slices: forward + max(backward, all-reduce of
// 32 bits x P over 1 host's 1 Gbit/s).
double DataParallelStep(double tokens) {
  const double forward = 2 * tokens * 1.2e7 / 1e11;
  const double backward = 4 * tokens * 1.2e7 / 1e11;
  return forward + std::max(backward, 32 * 1.2e7 / 1e9);
}

// One pipeline of depth 2 over both slices, 8 microbatches: compute x 9/8;
// 2B tokens x 256 x 32 bits each way, under each pass; fill and drain 1 x
// (activation + gradient) of one microbatch.
double PipelineStep(double tokens) {
  const double forward = 2 * tokens * 1.2e7 / 1e11 * 9 / 8;
  const double backward = 4 * tokens * 1.2e7 / 1e11 * 9 / 8;
  const double each_way = 2 * tokens * 256 * 32 / 1e9;
  return std::max(forward, each_way) + std::max(backward, each_way) +
         2 * each_way / 8;
}

TEST(PerfModelPipelineTest, BelowTheMinimumDepthTwoBeatsDataParallelism) {
  const double tokens = 256;  // a third of the 800-token minimum
  const PerfPlan plan = MustPlan(ThisMachine(tokens));
  EXPECT_EQ(plan.data_parallel.minimum_tokens_per_slice, 800);
  EXPECT_FALSE(plan.data_parallel.dcn_hidden);
  EXPECT_DOUBLE_EQ(plan.data_parallel.step_seconds, DataParallelStep(tokens));
  ASSERT_EQ(plan.recommendation.strategy, DcnStrategy::kPipeline)
      << plan.recommendation.reason;
  EXPECT_EQ(plan.recommendation.pipeline_depth, 2);
  EXPECT_EQ(plan.recommendation.dcn_data_parallelism, 1);
  const StrategyEstimate& pipe = plan.estimate;
  EXPECT_EQ(pipe.pipeline_depth, 2);
  EXPECT_EQ(pipe.pipeline_microbatches, 8);
  EXPECT_DOUBLE_EQ(pipe.step_seconds, PipelineStep(tokens));
  EXPECT_LT(pipe.step_seconds, 0.5 * plan.data_parallel.step_seconds);
  EXPECT_DOUBLE_EQ(pipe.tokens_per_second, 2 * tokens / PipelineStep(tokens));
  EXPECT_GT(pipe.tokens_per_second, plan.data_parallel.tokens_per_second);
  // No replicas to all-reduce: what a host sends is the activations of its
  // one direction, 512 tokens x 256 x 4 bytes.
  EXPECT_DOUBLE_EQ(pipe.dcn_bytes_per_host, 512 * 256 * 4);
  EXPECT_DOUBLE_EQ(pipe.activation_bytes_per_host, 512 * 256 * 4);
  EXPECT_DOUBLE_EQ(pipe.fill_drain_seconds, 2 * 512 * 256 * 32 / 1e9 / 8);
  EXPECT_DOUBLE_EQ(pipe.bubble_fraction, 1.0 / 9);
  EXPECT_NE(plan.recommendation.reason.find("2.14x"), std::string::npos)
      << plan.recommendation.reason;
}

TEST(PerfModelPipelineTest, AboveTheMinimumDataParallelismWins) {
  const double tokens = 8192;  // ten times the minimum
  const PerfPlan plan = MustPlan(ThisMachine(tokens));
  EXPECT_TRUE(plan.data_parallel.dcn_hidden);
  EXPECT_EQ(plan.recommendation.strategy, DcnStrategy::kData)
      << plan.recommendation.reason;
  EXPECT_EQ(plan.recommendation.dcn_data_parallelism, 2);
  EXPECT_DOUBLE_EQ(plan.estimate.step_seconds, DataParallelStep(tokens));
  ASSERT_EQ(plan.strategies.size(), 3u);
  const StrategyEstimate& pipe = plan.strategies[2];
  EXPECT_EQ(pipe.strategy, DcnStrategy::kPipeline);
  EXPECT_DOUBLE_EQ(pipe.step_seconds, PipelineStep(tokens));
  EXPECT_GT(pipe.step_seconds, plan.estimate.step_seconds);
  EXPECT_LT(pipe.tokens_per_second, plan.estimate.tokens_per_second);
}

TEST(PerfModelPipelineTest, ActivationsThatDoNotFitUnderComputeAreExposed) {
  PerfModelOptions o = ThisMachine(256);
  o.emb_dim = 100000;  // 512 x 1e5 x 32 bits = 1.64 s each way
  const PerfPlan plan = MustPlan(o);
  const double each_way = 512 * 1e5 * 32 / 1e9;
  const StrategyEstimate& pipe = plan.strategies[2];
  EXPECT_FALSE(pipe.dcn_hidden);
  EXPECT_DOUBLE_EQ(pipe.step_seconds, 2 * each_way + 2 * each_way / 8);
  // Slower than data parallelism's exposed all-reduce: data parallelism.
  EXPECT_EQ(plan.recommendation.strategy, DcnStrategy::kData);
  EXPECT_NE(plan.recommendation.reason.find("No pipeline is predicted faster"),
            std::string::npos)
      << plan.recommendation.reason;
}

TEST(PerfModelPipelineTest, InnerStagesSendBothWaysPerHost) {
  // v4-16: 2 hosts per slice. Depth 4 over 4 slices, 16 microbatches, 4,000
  // tokens per pipeline of width 1024: 32 x 4000 x 1024 bits each way.
  PerfModelOptions o = V4(4, 1000);
  o.strategy = DcnStrategy::kPipeline;
  o.pipeline_depth = 4;
  o.emb_dim = 1024;
  const PerfPlan plan = MustPlan(o);
  const StrategyEstimate& e = plan.estimate;
  const double bits = 32.0 * 4000 * 1024;
  EXPECT_DOUBLE_EQ(e.activation_seconds, bits / (2 * 50e9));
  EXPECT_DOUBLE_EQ(e.activation_bytes_per_host, 2 * bits / 2 / 8);
  EXPECT_DOUBLE_EQ(e.dcn_bytes_per_host, 2 * bits / 2 / 8);  // no replicas
  EXPECT_DOUBLE_EQ(e.fill_drain_seconds, 3 * 2 * bits / (2 * 50e9) / 16);
  EXPECT_DOUBLE_EQ(e.bubble_fraction, 3.0 / 19);
  const double forward = 2 * 1000 * 16e9 / (8 * 275e12) * 19 / 16;
  const double backward = 2 * forward;
  EXPECT_DOUBLE_EQ(e.step_seconds, std::max(forward, bits / 1e11) +
                                       std::max(backward, bits / 1e11) +
                                       e.fill_drain_seconds);
}

TEST(PerfModelPipelineTest, WithoutEmbDimActivationsAreNotCounted) {
  PerfModelOptions o = ThisMachine(256);
  o.emb_dim.reset();
  const PerfPlan plan = MustPlan(o);
  EXPECT_FALSE(plan.activations_counted);
  const StrategyEstimate& pipe = plan.strategies[2];
  EXPECT_EQ(pipe.activation_seconds, 0);
  EXPECT_EQ(pipe.activation_bytes_per_host, 0);
  EXPECT_EQ(pipe.fill_drain_seconds, 0);
  EXPECT_EQ(pipe.dcn_bytes_per_host, 0);
  EXPECT_DOUBLE_EQ(pipe.step_seconds, 6 * 256 * 1.2e7 / 1e11 * 9 / 8);
  EXPECT_NE(plan.recommendation.reason.find("not counted"), std::string::npos)
      << plan.recommendation.reason;
}

TEST(PerfModelPipelineTest, EveryDivisorDepthIsCompared) {
  struct Case {
    int slices;
    std::vector<int> depths;
  };
  for (const Case& c :
       {Case{8, {2, 4, 8}}, Case{6, {2, 3, 6}}, Case{2, {2}}, Case{7, {7}}}) {
    PerfModelOptions o = V4(c.slices, 100000);
    o.pipeline_microbatches = 12;
    const PerfPlan plan = MustPlan(o);
    ASSERT_EQ(plan.strategies.size(), 2 + c.depths.size()) << c.slices;
    EXPECT_EQ(plan.strategies[0].strategy, DcnStrategy::kData);
    EXPECT_EQ(plan.strategies[1].strategy, DcnStrategy::kFsdp);
    for (size_t i = 0; i < c.depths.size(); ++i) {
      const StrategyEstimate& e = plan.strategies[2 + i];
      const int d = c.depths[i];
      EXPECT_EQ(e.pipeline_depth, d);
      EXPECT_EQ(e.data_replicas, c.slices / d);
      EXPECT_DOUBLE_EQ(e.bubble_fraction, (d - 1.0) / (12 + d - 1.0));
      EXPECT_DOUBLE_EQ(e.tokens_per_second, c.slices * 100000 / e.step_seconds);
    }
  }
  const PerfPlan one = MustPlan(V4(1, 1000));
  ASSERT_EQ(one.strategies.size(), 1u);
  EXPECT_EQ(one.strategies[0].strategy, DcnStrategy::kData);
}

TEST(PerfModelPipelineTest, TrainKeysNameThePipelineSchedule) {
  Recommendation r;
  r.dcn_data_parallelism = 2;
  EXPECT_EQ(TrainKeys(r),
            (std::vector<std::string>{
                "dcn_data_parallelism=2", "dcn_fsdp_parallelism=1",
                "dcn_pipeline_parallelism=1", "dcn_tensor_parallelism=1"}));
  const Recommendation pipe = MustPlan(V4(8, 100000)).recommendation;
  EXPECT_EQ(
      TrainKeys(pipe),
      (std::vector<std::string>{
          "dcn_data_parallelism=2", "dcn_fsdp_parallelism=1",
          "dcn_pipeline_parallelism=4", "dcn_tensor_parallelism=1",
          "num_pipeline_microbatches=16", "pipeline_parallel_schedule=1F1B"}));
}

TEST(PerfModelInputTest, GlobalBatchDividesOverSlices) {
  PerfModelOptions o = V4(4, 0);
  o.tokens_per_slice.reset();
  o.global_batch_tokens = 2.8e6;
  const PerfPlan plan = MustPlan(o);
  EXPECT_EQ(plan.tokens_per_slice, 700000);
  o.tokens_per_slice = 700000;
  EXPECT_TRUE(PlanPerformance(o).ok());
}

TEST(PerfModelInputTest, CpuUsesTheGivenPeakAndBandwidth) {
  PerfModelOptions o = V4(2, 4000, 100e6);
  o.accelerator_type = "cpu-2";
  o.peak_flops_per_chip = 50e9;
  o.dcn_gbps_per_host = 10;
  const PerfPlan plan = MustPlan(o);
  EXPECT_EQ(plan.chips_per_host, 2);
  EXPECT_EQ(plan.hosts_per_slice, 1);
  EXPECT_EQ(plan.arithmetic_intensity, 2 * 50e9 / 10e9);
  EXPECT_EQ(plan.data_parallel.minimum_tokens_per_slice, 80);
  EXPECT_EQ(plan.data_parallel.recommended_tokens_per_slice, 160);
  EXPECT_FALSE(plan.peak_from_type);
  EXPECT_FALSE(plan.dcn_from_type);
  // A given figure also overrides a TPU's published one.
  PerfModelOptions v4 = V4(2, 350000);
  v4.dcn_gbps_per_host = 100;
  EXPECT_EQ(MustPlan(v4).arithmetic_intensity, 11000);
}

TEST(PerfModelInputTest, BadInputIsOneSentence) {
  struct Case {
    void (*edit)(PerfModelOptions&);
    std::string message;
  };
  const Case cases[] = {
      {[](PerfModelOptions& o) { o.accelerator_type = ""; },
       "--accelerator_type is required (e.g. v4-16, or cpu-4 with "
       "--peak_flops_per_chip and --dcn_gbps_per_host)"},
      {[](PerfModelOptions& o) { o.accelerator_type = "v9-8"; },
       "unknown accelerator type 'v9-8': expected one of v4-N, v5p-N, "
       "v5litepod-N, v6e-N (TPU) or cpu-N (CPU devices)"},
      {[](PerfModelOptions& o) { o.num_slices = 0; },
       "--num_slices must be from 1 to 256, got 0"},
      {[](PerfModelOptions& o) { o.num_slices = 257; },
       "--num_slices must be from 1 to 256, got 257"},
      {[](PerfModelOptions& o) { o.parameters = 0; },
       "--parameters must be a positive number, got 0"},
      {[](PerfModelOptions& o) { o.tokens_per_slice = -5; },
       "--tokens_per_slice must be a positive number, got -5"},
      {[](PerfModelOptions& o) { o.tokens_per_slice.reset(); },
       "--tokens_per_slice or --global_batch_tokens is required (the batch "
       "in tokens, e.g. --tokens_per_slice 350k)"},
      {[](PerfModelOptions& o) { o.global_batch_tokens = 1e6; },
       "--global_batch_tokens 1000000 does not equal --tokens_per_slice "
       "350000 times --num_slices 2 (700000); give one of them"},
      {[](PerfModelOptions& o) { o.peak_flops_per_chip = 0; },
       "--peak_flops_per_chip must be a positive number, got 0"},
      {[](PerfModelOptions& o) { o.dcn_gbps_per_host = -1; },
       "--dcn_gbps_per_host must be a positive number, got -1"},
      {[](PerfModelOptions& o) { o.mfu = 1.5; },
       "--mfu must be in (0, 1], got 1.5"},
      {[](PerfModelOptions& o) {
         o.backward_flops_per_token_per_parameter = 0;
       },
       "--backward_flops_per_token_per_parameter must be a positive number, "
       "got 0"},
      {[](PerfModelOptions& o) { o.margin = 0.5; },
       "--margin must be at least 1, got 0.5"},
      {[](PerfModelOptions& o) {
         o.strategy = DcnStrategy::kPipeline;
         o.pipeline_depth = 3;
       },
       "--pipeline_depth must be 0 (the fastest depth) or a divisor of "
       "--num_slices 2 from 2 to 2, got 3"},
      {[](PerfModelOptions& o) { o.pipeline_depth = 2; },
       "--pipeline_depth 2 needs --strategy pipeline"},
      {[](PerfModelOptions& o) {
         o.num_slices = 1;
         o.strategy = DcnStrategy::kPipeline;
       },
       "--strategy pipeline needs at least 2 slices, got --num_slices 1"},
      {[](PerfModelOptions& o) { o.emb_dim = 2.5; },
       "--emb_dim must be a positive whole number (the model width), got 2.5"},
      {[](PerfModelOptions& o) { o.emb_dim = 0; },
       "--emb_dim must be a positive whole number (the model width), got 0"},
      {[](PerfModelOptions& o) { o.memory_bytes_per_chip = 0; },
       "--memory_per_chip must be a positive number, got 0"},
      {[](PerfModelOptions& o) {
         o.accelerator_type = "cpu-2";
         o.dcn_gbps_per_host = 10;
       },
       "--peak_flops_per_chip is required for cpu-2 (a CPU has no published "
       "peak; measure it with `multislice peak`)"},
      {[](PerfModelOptions& o) {
         o.accelerator_type = "cpu-2";
         o.peak_flops_per_chip = 50e9;
       },
       "--dcn_gbps_per_host is required for cpu-2 (measure it with "
       "`multislice bench collectives` --paths dcn)"},
  };
  for (const Case& c : cases) {
    PerfModelOptions o = V4(2, 350000);
    c.edit(o);
    Result<PerfPlan> plan = PlanPerformance(o);
    ASSERT_FALSE(plan.ok()) << c.message;
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(plan.status().message(), c.message);
  }
}

TEST(PerfModelInputTest, NamesRoundTrip) {
  for (DcnStrategy s :
       {DcnStrategy::kData, DcnStrategy::kFsdp, DcnStrategy::kPipeline}) {
    Result<DcnStrategy> parsed = ParseDcnStrategy(ToString(s));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_EQ(ParseDcnStrategy("tensor").status().message(),
            "--strategy: 'tensor' is not one of dcn_data, dcn_fsdp, pipeline");
  EXPECT_EQ(*ParseDcnVolume("ring"), DcnVolume::kRing);
  EXPECT_EQ(ParseDcnVolume("x").status().message(),
            "--dcn_volume: 'x' is not one of seed, ring");
}

}  // namespace
}  // namespace multislice::model
