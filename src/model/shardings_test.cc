// The shardings workload on every mesh of the issue, against the unsharded
// single-device computation (shardings_reference.h) with the same seed: the
// first step's loss and every updated weight shard must match. Each mesh runs
// as real worker processes of this binary (one per slice).
#include "model/shardings.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <mutex>

#include "compute/matmul.h"
#include "model/shardings_reference.h"
#include "runtime/test_support.h"

namespace multislice::model {
namespace {

// Compares a device's shard ([F/t, E/f] at row0, col0) with the reference
// [F, E]; returns the number of elements out of tolerance. The error of an
// element is measured against the tensor's scale (its largest magnitude):
// an updated weight is W - 1e-4 g with both terms of the same size, so
// elements where they nearly cancel carry the rounding error of the terms,
// not of their small difference.
int CompareShard(const std::vector<float>& shard, const std::vector<float>& ref,
                 int64_t emb, int64_t row0, int64_t col0, int64_t rows,
                 int64_t cols, double tolerance, const std::string& what) {
  double floor = 0;
  for (float v : ref) floor = std::max(floor, std::abs(static_cast<double>(v)));
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double got = shard[r * cols + c];
      const double want = ref[(row0 + r) * emb + col0 + c];
      if (std::abs(got - want) > tolerance * std::max(std::abs(want), floor)) {
        if (bad < 3) {
          std::fprintf(stderr, "%s [%ld, %ld]: got %.9g want %.9g\n",
                       what.c_str(), static_cast<long>(row0 + r),
                       static_cast<long>(col0 + c), got, want);
        }
        ++bad;
      }
    }
  }
  return bad;
}

// argv: self --worker f32|bf16 E batch_size layers ici(4) dcn(4), the
// values in axis order (runtime::testing::ParallelismArgs).
int WorkerMain(int argc, char** argv) {
  if (argc != 6 + 2 * mesh::kNumAxes) return 2;
  ShardingsConfig config;
  config.dtype = std::string(argv[2]) == "f32" ? DType::kF32 : DType::kBF16;
  config.embedding_dimension = std::atoi(argv[3]);
  config.batch_size = std::atoi(argv[4]);
  config.num_layers = std::atoi(argv[5]);
  config.seed = 7;
  auto env = runtime::ReadWorkerEnv(runtime::ProcessEnvironment());
  if (!env.ok() || !env->has_value()) return 2;
  runtime::RuntimeOptions options;
  options.env = **env;
  options.parallelism = runtime::testing::ParallelismFromArgs(argv + 6);
  auto rt = runtime::Runtime::Create(options);
  if (!rt.ok()) {
    std::fprintf(stderr, "runtime: %s\n", rt.status().message().c_str());
    return 1;
  }
  const int num_devices = static_cast<int>((*rt)->devices().size());
  auto shapes =
      ComputeShardingsShapes(config, (*rt)->parallelism(), num_devices);
  if (!shapes.ok()) {
    std::fprintf(stderr, "shapes: %s\n", shapes.status().message().c_str());
    return 1;
  }
  auto reference = ShardingsReferenceStep(config, shapes->batch);
  if (!reference.ok()) {
    std::fprintf(stderr, "reference: %s\n",
                 reference.status().message().c_str());
    return 1;
  }
  const bool f32 = config.dtype == DType::kF32;
  const double weight_tolerance = f32 ? 1e-5 : 1.0 / 64;
  const double loss_tolerance = f32 ? 1e-5 : 1e-3;
  std::mutex mu;
  int bad = 0;
  Status s = (*rt)->RunOnDevices([&](int local) -> Status {
    compute::SetSingleThreaded();
    ShardingsDevice device(**rt, local, config, *shapes);
    RETURN_IF_ERROR(device.Init());
    StepStats stats;
    RETURN_IF_ERROR(device.Step(&stats));
    int local_bad = 0;
    const double loss_error =
        std::abs(stats.loss - reference->loss) / std::abs(reference->loss);
    if (loss_error > loss_tolerance) {
      std::fprintf(stderr, "device %d: loss %.9g, reference %.9g\n",
                   (*rt)->local_devices()[local], stats.loss, reference->loss);
      ++local_bad;
    }
    for (int l = 0; l < config.num_layers; ++l) {
      for (int which = 0; which < 2; ++which) {
        const auto& ref =
            which == 0 ? reference->emb2ff[l] : reference->ff2emb[l];
        local_bad += CompareShard(
            device.WeightShard(l, which), ref, shapes->emb, device.row_offset(),
            device.col_offset(), shapes->ff_t, shapes->emb_f, weight_tolerance,
            "device " + std::to_string((*rt)->local_devices()[local]) +
                " layer " + std::to_string(l) + " w" + std::to_string(which));
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    bad += local_bad;
    if (local == 0) {
      std::printf("loss %.9g reference %.9g\n", stats.loss, reference->loss);
    }
    return OkStatus();
  });
  std::printf("%d values out of tolerance\n", bad);
  return s.ok() && bad == 0 ? 0 : 1;
}

struct MeshCase {
  const char* name;
  int slices, devices;
  runtime::testing::AxisValues ici, dcn;  // diloco, data, stage, fsdp, tensor
  // Empty: cpu-<devices>; else a TPU type run on CPU devices, one worker
  // process per host (v4-16: 2 hosts of 4 devices).
  const char* type = "";
};

class ShardingsMatchesReference
    : public ::testing::TestWithParam<std::tuple<MeshCase, const char*>> {};

TEST_P(ShardingsMatchesReference, LossAndEveryUpdatedWeight) {
  const auto& [c, dtype] = GetParam();
  std::vector<std::string> args = {"--worker", dtype, "64", "16", "2"};
  for (const std::string& v : runtime::testing::ParallelismArgs(c.ici, c.dcn)) {
    args.push_back(v);
  }
  const std::string type =
      *c.type ? c.type : "cpu-" + std::to_string(c.devices);
  runtime::LaunchResult result =
      runtime::testing::RunSelfAsWorkersOf(type, c.slices, args);
  EXPECT_EQ(result.exit_code, 0) << "failed worker " << result.failed_worker;
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, ShardingsMatchesReference,
    ::testing::Combine(
        // clang-format off
        ::testing::Values(
            MeshCase{"1x1", 1, 1, {1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}},
            MeshCase{"1x2_fsdp", 1, 2, {1, 1, 1, 2, 1}, {1, 1, 1, 1, 1}},
            MeshCase{"1x2_tensor", 1, 2, {1, 1, 1, 1, 2}, {1, 1, 1, 1, 1}},
            MeshCase{"1x2_data", 1, 2, {1, 2, 1, 1, 1}, {1, 1, 1, 1, 1}},
            MeshCase{"1x4_fsdp2_tensor2", 1, 4, {1, 1, 1, 2, 2}, {1, 1, 1, 1, 1}},
            MeshCase{"2x1_dcn_data", 2, 1, {1, 1, 1, 1, 1}, {1, 2, 1, 1, 1}},
            MeshCase{"2x1_dcn_fsdp", 2, 1, {1, 1, 1, 1, 1}, {1, 1, 1, 2, 1}},
            MeshCase{"2x2_dcn_data_ici_fsdp", 2, 2, {1, 1, 1, 2, 1}, {1, 2, 1, 1, 1}},
            MeshCase{"v4_16x1_fsdp_over_2_hosts", 1, 8,
                     {1, 1, 1, 8, 1}, {1, 1, 1, 1, 1}, "v4-16"},
            MeshCase{"v4_16x1_fsdp4_tensor2", 1, 8,
                     {1, 1, 1, 4, 2}, {1, 1, 1, 1, 1}, "v4-16"},
            MeshCase{"v4_16x2_dcn_data_ici_fsdp", 2, 8,
                     {1, 1, 1, 8, 1}, {1, 2, 1, 1, 1}, "v4-16"},
            MeshCase{"v4_16x2_dcn_fsdp_ici_data_fsdp_tensor", 2, 8,
                     {1, 2, 1, 2, 2}, {1, 1, 1, 2, 1}, "v4-16"}),
        // clang-format on
        ::testing::Values("f32", "bf16")),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) + "_" +
             std::get<1>(info.param);
    });

TEST(ShardingsShapesTest, ParameterBytesPerDeviceDivideByFsdpTimesTensor) {
  ShardingsConfig config;
  config.embedding_dimension = 256;
  config.num_layers = 3;
  struct Mesh {
    int data, fsdp, tensor;
  };
  for (const Mesh& m : {Mesh{1, 1, 1}, Mesh{1, 4, 1}, Mesh{1, 1, 4},
                        Mesh{2, 2, 2}, Mesh{4, 1, 2}}) {
    mesh::ParallelismConfig p;
    p.ici[mesh::kData] = m.data;
    p.ici[mesh::kFsdp] = m.fsdp;
    p.ici[mesh::kTensor] = m.tensor;
    const int devices = m.data * m.fsdp * m.tensor;
    auto s = ComputeShardingsShapes(config, p, devices);
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->data, m.data);
    EXPECT_EQ(s->fsdp, m.fsdp);
    EXPECT_EQ(s->tensor, m.tensor);
    const int64_t full = 2 * (4 * 256) * 256 * 3 * 2;  // bf16
    EXPECT_EQ(s->parameter_bytes_per_device * m.fsdp * m.tensor, full);
    EXPECT_EQ(s->rows * m.data * m.fsdp, s->batch);
  }
  // Each axis is the product of its two levels.
  mesh::ParallelismConfig p{{1, 1, 1, 2, 1}, {1, 2, 1, 2, 2}};
  auto s = ComputeShardingsShapes(config, p, 16);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->data, 2);
  EXPECT_EQ(s->fsdp, 4);
  EXPECT_EQ(s->tensor, 2);
}

TEST(ShardingsShapesTest, SizesThatDoNotDivideAreRejected) {
  ShardingsConfig config;
  config.embedding_dimension = 100;
  mesh::ParallelismConfig p;
  p.ici[mesh::kFsdp] = 8;
  auto s = ComputeShardingsShapes(config, p, 8);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--embedding_dimension 100"),
            std::string::npos)
      << s.status().message();
  p.ici = {1, 1, 1, 1, 3};
  auto t = ComputeShardingsShapes(config, p, 3);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tensor parallelism 3"),
            std::string::npos);
  config.batch_size = 0;
  p.ici = {1, 1, 1, 1, 1};
  EXPECT_FALSE(ComputeShardingsShapes(config, p, 1).ok());
}

// The original has no pipeline: a stage axis above 1 on either level is
// refused, naming its key.
TEST(ShardingsShapesTest, PipelineStagesAreRefused) {
  ShardingsConfig config;
  mesh::ParallelismConfig ici_stages{{1, 1, 2, 1, 1}, {1, 1, 1, 1, 1}};
  auto s = ComputeShardingsShapes(config, ici_stages, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "ici_pipeline_parallelism=2: multislice shardings has no pipeline "
            "stages; expected 1");
  mesh::ParallelismConfig dcn_stages{{1, 1, 1, 2, 1}, {1, 1, 3, 1, 1}};
  EXPECT_EQ(ComputeShardingsShapes(config, dcn_stages, 6).status().message(),
            "dcn_pipeline_parallelism=3: multislice shardings has no pipeline "
            "stages; expected 1");
}

}  // namespace
}  // namespace multislice::model

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--worker") {
    return multislice::model::WorkerMain(argc, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
