#include "runtime/axis_group.h"

#include <gtest/gtest.h>

namespace multislice::runtime {
namespace {

struct Fixture {
  std::vector<mesh::Device> devices;
  mesh::DeviceMesh mesh;
};

// slices x cpu-devices, with the given resolved parallelism.
Fixture Make(int slices, int devices, const mesh::ParallelismConfig& config) {
  auto type = mesh::ParseAcceleratorType("cpu-" + std::to_string(devices));
  EXPECT_TRUE(type.ok());
  Fixture f;
  f.devices = mesh::MakeDevices(*type, slices);
  auto m = mesh::MeshForConfig(config, f.devices);
  EXPECT_TRUE(m.ok()) << m.status().message();
  f.mesh = *m;
  return f;
}

// The same with ici and dcn given as data, fsdp, tensor (stage 1).
Fixture Make(int slices, int devices, std::array<int, 3> ici,
             std::array<int, 3> dcn) {
  return Make(slices, devices,
              mesh::ParallelismConfig{{1, ici[0], 1, ici[1], ici[2]},
                                      {1, dcn[0], 1, dcn[1], dcn[2]}});
}

TEST(AxisGroupTest, PathFollowsWhereTheAxesLive) {
  // 2 slices of 4 devices: data across slices, fsdp and tensor inside.
  Fixture f = Make(2, 4, {1, 2, 2}, {2, 1, 1});
  auto path = [&](std::vector<std::string> axes) {
    return MakeAxisGroup(f.mesh, f.devices, axes, 5)->path();
  };
  EXPECT_EQ(path({"data"}), Path::kNetwork);
  EXPECT_EQ(path({"fsdp"}), Path::kShared);
  EXPECT_EQ(path({"tensor"}), Path::kShared);
  EXPECT_EQ(path({"data", "fsdp"}), Path::kTwoLevel);
  EXPECT_EQ(path({"data", "fsdp", "tensor"}), Path::kTwoLevel);
}

TEST(AxisGroupTest, RanksAreRowMajorOverTheAxesInTheOrderGiven) {
  // Mesh (data=2, stage=1, fsdp=2, tensor=2); device ids follow the hybrid
  // layout: slice 0 holds 0..3, slice 1 holds 4..7, fsdp major, tensor
  // minor.
  Fixture f = Make(2, 4, {1, 2, 2}, {2, 1, 1});
  // Device 5 is at (1, 0, 0, 1).
  auto g = MakeAxisGroup(f.mesh, f.devices, {"data", "fsdp"}, 5);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->members, (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(g->rank, 2);
  EXPECT_EQ(g->dcn_size, 2);
  EXPECT_EQ(g->ici_size, 2);
  EXPECT_EQ(g->dcn_rank, 1);
  EXPECT_EQ(g->ici_rank, 0);
  EXPECT_EQ(g->local_members, (std::vector<int>{5, 7}));
  EXPECT_EQ(g->dcn_slices, (std::vector<int>{0, 1}));
  EXPECT_EQ(g->column, 1);

  auto reversed = MakeAxisGroup(f.mesh, f.devices, {"fsdp", "data"}, 5);
  ASSERT_TRUE(reversed.ok());
  EXPECT_EQ(reversed->members, (std::vector<int>{1, 5, 3, 7}));
  EXPECT_EQ(reversed->rank, 1);
  // rank_of is indexed by (d, j) whatever the order of the axes.
  EXPECT_EQ(reversed->RankOf(1, 0), 1);
  EXPECT_EQ(reversed->RankOf(0, 1), 2);
}

TEST(AxisGroupTest, MembersOfOneGroupAgreeOnTheKeys) {
  Fixture f = Make(2, 4, {1, 2, 2}, {2, 1, 1});
  auto a = MakeAxisGroup(f.mesh, f.devices, {"data", "fsdp"}, 1);
  auto b = MakeAxisGroup(f.mesh, f.devices, {"data", "fsdp"}, 3);
  auto c = MakeAxisGroup(f.mesh, f.devices, {"data", "fsdp"}, 5);
  auto other = MakeAxisGroup(f.mesh, f.devices, {"data", "fsdp"}, 0);
  EXPECT_EQ(a->local_key, b->local_key);  // same slice
  EXPECT_NE(a->local_key, c->local_key);  // other slice
  EXPECT_EQ(a->net_label, c->net_label);  // same column
  EXPECT_NE(a->net_label, b->net_label);
  EXPECT_NE(a->local_key, other->local_key);
}

// Two pipeline stages across slices and fsdp 2 inside each: the stage
// group of a device is the device at its position in the other slice.
TEST(AxisGroupTest, StageAxisAcrossSlices) {
  Fixture f =
      Make(2, 2, mesh::ParallelismConfig{{1, 1, 1, 2, 1}, {1, 1, 2, 1, 1}});
  auto stage = MakeAxisGroup(f.mesh, f.devices, {"stage"}, 3);
  ASSERT_TRUE(stage.ok()) << stage.status().message();
  EXPECT_EQ(stage->members, (std::vector<int>{1, 3}));
  EXPECT_EQ(stage->rank, 1);
  EXPECT_EQ(stage->dcn_size, 2);
  EXPECT_EQ(stage->ici_size, 1);
  EXPECT_EQ(stage->path(), Path::kNetwork);
  EXPECT_EQ(stage->dcn_slices, (std::vector<int>{0, 1}));
  auto fsdp = MakeAxisGroup(f.mesh, f.devices, {"fsdp"}, 3);
  ASSERT_TRUE(fsdp.ok());
  EXPECT_EQ(fsdp->members, (std::vector<int>{2, 3}));
  EXPECT_EQ(fsdp->path(), Path::kShared);
  auto both = MakeAxisGroup(f.mesh, f.devices, {"stage", "fsdp"}, 3);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->members, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(both->path(), Path::kTwoLevel);
}

TEST(AxisGroupTest, BadAxisNamesAreRejected) {
  Fixture f = Make(1, 2, {1, 2, 1}, {1, 1, 1});
  // MaxText's keys say pipeline; the mesh axis is stage.
  auto unknown = MakeAxisGroup(f.mesh, f.devices, {"pipeline"}, 0);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message(),
            "unknown mesh axis 'pipeline': expected one of diloco, data, "
            "stage, fsdp, tensor");
  auto twice = MakeAxisGroup(f.mesh, f.devices, {"fsdp", "fsdp"}, 0);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace multislice::runtime

namespace multislice::runtime {
namespace {

// Dropping a lost slice gives the group a mesh of the other slices would
// give, with the original device ids and processes, and its own label.
TEST(AxisGroupTest, WithoutSlicesIsTheGroupOfTheSlicesLeft) {
  const mesh::ParallelismConfig three{{1, 1, 1, 2, 1}, {3, 1, 1, 1, 1}};
  const mesh::ParallelismConfig two{{1, 1, 1, 2, 1}, {2, 1, 1, 1, 1}};
  Fixture f3 = Make(3, 2, three), f2 = Make(2, 2, two);
  const std::vector<std::string> all = {"diloco", "data", "stage", "fsdp",
                                        "tensor"};
  // Device 3 (slice 1, position 1) without slice 2: as in 2 slices.
  auto whole = MakeAxisGroup(f3.mesh, f3.devices, all, 3);
  auto fewer = MakeAxisGroup(f2.mesh, f2.devices, all, 3);
  ASSERT_TRUE(whole.ok() && fewer.ok());
  const AxisGroup g = WithoutSlices(*whole, {2});
  EXPECT_EQ(g.size, fewer->size);
  EXPECT_EQ(g.rank, fewer->rank);
  EXPECT_EQ(g.members, fewer->members);
  EXPECT_EQ(g.rank_of, fewer->rank_of);
  EXPECT_EQ(g.dcn_size, 2);
  EXPECT_EQ(g.dcn_rank, 1);
  EXPECT_EQ(g.net_size, 2);
  EXPECT_EQ(g.net_rank, 1);
  EXPECT_EQ(g.net_processes, fewer->net_processes);
  EXPECT_EQ(g.dcn_slices, (std::vector<int>{0, 1}));
  EXPECT_EQ(g.local_members, whole->local_members);
  EXPECT_NE(g.net_label, whole->net_label);
  // Without slice 0 instead: slices 1 and 2 renumbered from 0.
  const AxisGroup h = WithoutSlices(*whole, {0});
  EXPECT_EQ(h.members, (std::vector<int>{2, 3, 4, 5}));
  EXPECT_EQ(h.rank, 1);
  EXPECT_EQ(h.dcn_rank, 0);
  EXPECT_EQ(h.net_processes, (std::vector<int>{1, 2}));
  EXPECT_EQ(h.dcn_slices, (std::vector<int>{1, 2}));
  EXPECT_EQ(h.path(), Path::kTwoLevel);
  // Only this slice left: shared memory alone.
  EXPECT_EQ(WithoutSlices(*whole, {0, 2}).path(), Path::kShared);
  // A group inside the slice is untouched.
  auto inside = MakeAxisGroup(f3.mesh, f3.devices, {"fsdp"}, 3);
  ASSERT_TRUE(inside.ok());
  EXPECT_EQ(WithoutSlices(*inside, {2}).net_label, inside->net_label);
}

}  // namespace
}  // namespace multislice::runtime
