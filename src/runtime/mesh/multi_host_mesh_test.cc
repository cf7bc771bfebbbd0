// Meshes, device ids, hosts and processes of slices that span several hosts,
// checked against a construction written out here from JAX's and Cloud TPU's
// rules, without calling the code under test:
//
// - Chips: v4-N and v5p-N have N / 2 chips (N counts TensorCores), 4 chips
//   per host; v5litepod-N and v6e-N have N chips, all on one host up to 8,
//   else 4 per host.
// - Device ids: slice s, position p inside the slice -> s * chips + p.
// - TPU_WORKER_ID (the host inside the slice) = p / chips_per_host; the
//   process of a device is TPU_WORKER_ID + MEGASCALE_SLICE_ID *
//   hosts_per_slice, as JAX numbers processes of a multislice job.
// - create_device_mesh for devices without a modelled topology reshapes the
//   devices of one slice in id order; create_hybrid_device_mesh builds one
//   such mesh per slice (slices in slice_index order), arranges them in a
//   nested list of dcn_shape and joins them with numpy.block. Here that is
//   done the way one would draw it: each slice's ICI block is copied, element
//   by element, into its tile of the global array, the tiles visited in
//   row-major order over dcn_shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/mesh/device_mesh.h"
#include "runtime/mesh/parallelism.h"
#include "runtime/mesh/topology.h"

namespace multislice::mesh {
namespace {

// One job: an accelerator type, a slice count, the parallelism asked for
// (may hold one -1 per level) and, written out by hand from the rules above,
// what it must come to.
struct MultiHostCase {
  std::string type;
  int num_slices;
  ParallelismConfig requested;
  int chips;            // per slice
  int hosts_per_slice;  // worker VMs per slice
  AxisSizes ici;        // resolved: diloco, data, stage, fsdp, tensor
  AxisSizes dcn;
};

std::string Joined(const AxisSizes& values) {
  std::string text;
  for (int v : values) text += (text.empty() ? "" : ", ") + std::to_string(v);
  return text;
}

// gtest prints a case like this when a test fails.
void PrintTo(const MultiHostCase& c, std::ostream* os) {
  *os << c.num_slices << " x " << c.type << ", ici (" << Joined(c.ici)
      << "), dcn (" << Joined(c.dcn) << ")";
}

int ProductOf(const AxisSizes& values) {
  int p = 1;
  for (int v : values) p *= v;
  return p;
}

// The row-major digits of `index` over `shape`, and back.
AxisSizes Digits(int index, const AxisSizes& shape) {
  AxisSizes digits;
  for (int a = kNumAxes - 1; a >= 0; --a) {
    digits[a] = index % shape[a];
    index /= shape[a];
  }
  return digits;
}

int RowMajor(const AxisSizes& digits, const AxisSizes& shape) {
  int index = 0;
  for (int a = 0; a < kNumAxes; ++a) index = index * shape[a] + digits[a];
  return index;
}

// The chip count and chips per host of a TPU type, from the rules in the
// header comment (not from ParseAcceleratorType).
struct ReferenceType {
  int chips = 0;
  int chips_per_host = 0;
};

ReferenceType ReferenceTypeOf(const std::string& name) {
  const size_t dash = name.rfind('-');
  const std::string family = name.substr(0, dash);
  const int n = std::stoi(name.substr(dash + 1));
  ReferenceType t;
  if (family == "v4" || family == "v5p") {
    t.chips = n / 2;
    t.chips_per_host = 4;
  } else if (family == "v5litepod" || family == "v6e") {
    t.chips = n;
    t.chips_per_host = n <= 8 ? n : 4;
  }
  return t;
}

// What the reference knows about one device.
struct ReferenceDevice {
  int id = 0;
  int slice = 0;     // MEGASCALE_SLICE_ID
  int position = 0;  // index inside the slice
  int worker = 0;    // TPU_WORKER_ID
  int process = 0;   // JAX's process index
};

struct Reference {
  AxisSizes shape;                         // dcn[i] * ici[i]
  std::vector<int> mesh_ids;               // row-major over shape
  std::map<int, ReferenceDevice> devices;  // by id
  // Process index -> the ids of the chips of its host, in id order.
  std::map<int, std::vector<int>> process_devices;
};

Reference BuildReference(const MultiHostCase& c) {
  const ReferenceType type = ReferenceTypeOf(c.type);
  const int hosts =
      (type.chips + type.chips_per_host - 1) / type.chips_per_host;
  Reference ref;

  // The processes of the job, as the controller starts them: one per
  // (slice, worker), each holding its host's chips.
  std::vector<std::vector<int>> slice_ids(c.num_slices);
  for (int slice = 0; slice < c.num_slices; ++slice) {
    for (int worker = 0; worker < hosts; ++worker) {
      const int process = worker + slice * hosts;
      for (int k = 0; k < type.chips_per_host; ++k) {
        const int position = worker * type.chips_per_host + k;
        if (position >= type.chips) break;
        ReferenceDevice d;
        d.id = slice * type.chips + position;
        d.slice = slice;
        d.position = position;
        d.worker = worker;
        d.process = process;
        ref.devices[d.id] = d;
        ref.process_devices[process].push_back(d.id);
        slice_ids[slice].push_back(d.id);  // positions arrive in order
      }
    }
  }

  // The global array, tile by tile: slice k's tile is at the row-major
  // digits of k over dcn, and the slice's own mesh (its devices in id order,
  // reshaped to ici) fills it.
  const AxisSizes& ici = c.ici;
  const AxisSizes& dcn = c.dcn;
  for (int a = 0; a < kNumAxes; ++a) ref.shape[a] = dcn[a] * ici[a];
  ref.mesh_ids.assign(ProductOf(ref.shape), -1);
  for (int slice = 0; slice < c.num_slices; ++slice) {
    const AxisSizes tile = Digits(slice, dcn);
    std::vector<int> ids = slice_ids[slice];
    std::sort(ids.begin(), ids.end());
    for (int p = 0; p < ProductOf(ici); ++p) {
      const AxisSizes inside = Digits(p, ici);
      AxisSizes global;
      for (int a = 0; a < kNumAxes; ++a) {
        global[a] = tile[a] * ici[a] + inside[a];
      }
      ref.mesh_ids[RowMajor(global, ref.shape)] = ids[p];
    }
  }
  return ref;
}

// The cases. Hosts per slice and chips are written out by hand.
// One case per two lines: the resolved values under the requested ones.
// clang-format off
const MultiHostCase kCases[] = {
    // v4-16: 8 chips, 2 hosts. One slice: the plain (non-hybrid) path.
    {"v4-16", 1, {{1, 1, 1, -1, 1}, {1, 1, 1, 1, 1}},
     8, 2, {1, 1, 1, 8, 1}, {1, 1, 1, 1, 1}},
    {"v4-16", 2, {{1, 1, 1, 4, 2}, {1, 2, 1, 1, 1}},
     8, 2, {1, 1, 1, 4, 2}, {1, 2, 1, 1, 1}},
    // v4-32: 16 chips, 4 hosts.
    {"v4-32", 2, {{1, 2, 1, 4, 2}, {1, 1, 1, 2, 1}},
     16, 4, {1, 2, 1, 4, 2}, {1, 1, 1, 2, 1}},
    {"v4-32", 3, {{1, 1, 1, 16, 1}, {1, -1, 1, 1, 1}},
     16, 4, {1, 1, 1, 16, 1}, {1, 3, 1, 1, 1}},
    // v4-64: 32 chips, 8 hosts; DCN on two axes.
    {"v4-64", 4, {{1, 1, 1, 32, 1}, {1, 2, 1, 1, 2}},
     32, 8, {1, 1, 1, 32, 1}, {1, 2, 1, 1, 2}},
    // The seed's run: 2 x v5litepod-16, dcn_data=2, ici_fsdp=16.
    {"v5litepod-16", 2, {{1, 1, 1, 16, 1}, {1, 2, 1, 1, 1}},
     16, 4, {1, 1, 1, 16, 1}, {1, 2, 1, 1, 1}},
    {"v5litepod-16", 3, {{1, 1, 1, 4, 4}, {1, 3, 1, 1, 1}},
     16, 4, {1, 1, 1, 4, 4}, {1, 3, 1, 1, 1}},
    // v5litepod-32: 32 chips, 8 hosts.
    {"v5litepod-32", 1, {{1, 2, 1, 16, 1}, {1, 1, 1, 1, 1}},
     32, 8, {1, 2, 1, 16, 1}, {1, 1, 1, 1, 1}},
    {"v5litepod-32", 2, {{1, 1, 1, 8, 4}, {1, 2, 1, 1, 1}},
     32, 8, {1, 1, 1, 8, 4}, {1, 2, 1, 1, 1}},
    // v5litepod-8: 8 chips on one host (the largest one-host size).
    {"v5litepod-8", 2, {{1, 2, 1, 4, 1}, {1, 1, 1, 2, 1}},
     8, 1, {1, 2, 1, 4, 1}, {1, 1, 1, 2, 1}},
    // v5p-32: 16 chips, 4 hosts; four slices as 2 x 2 over DCN.
    {"v5p-32", 4, {{1, 1, 1, -1, 2}, {1, 2, 1, 2, 1}},
     16, 4, {1, 1, 1, 8, 2}, {1, 2, 1, 2, 1}},
    // v5p-64: 32 chips, 8 hosts.
    {"v5p-64", 3, {{1, -1, 1, 4, 2}, {1, 1, 1, 3, 1}},
     32, 8, {1, 4, 1, 4, 2}, {1, 1, 1, 3, 1}},
    // v6e-16: 16 chips, 4 hosts; all of DCN on tensor.
    {"v6e-16", 4, {{1, 2, 1, 2, 4}, {1, 1, 1, 1, -1}},
     16, 4, {1, 2, 1, 2, 4}, {1, 1, 1, 1, 4}},
    // v6e-32: 32 chips, 8 hosts.
    {"v6e-32", 2, {{1, 1, 1, 8, 4}, {1, 1, 1, 2, 1}},
     32, 8, {1, 1, 1, 8, 4}, {1, 1, 1, 2, 1}},
    // v6e-64: 64 chips, 16 hosts.
    {"v6e-64", 2, {{1, 4, 1, 16, 1}, {1, 1, 1, 1, 2}},
     64, 16, {1, 4, 1, 16, 1}, {1, 1, 1, 1, 2}},
    // v6e-128: 128 chips, 32 hosts.
    {"v6e-128", 2, {{1, 1, 1, 32, 4}, {1, 2, 1, 1, 1}},
     128, 32, {1, 1, 1, 32, 4}, {1, 2, 1, 1, 1}},
    // Pipeline stages: across slices, across the hosts of a slice, and on
    // both levels with the -1 on the stage axis.
    {"v4-16", 2, {{1, 1, 1, 8, 1}, {1, 1, 2, 1, 1}},
     8, 2, {1, 1, 1, 8, 1}, {1, 1, 2, 1, 1}},
    {"v6e-16", 1, {{1, 1, 4, -1, 1}, {1, 1, 1, 1, 1}},
     16, 4, {1, 1, 4, 4, 1}, {1, 1, 1, 1, 1}},
    {"v5litepod-16", 4, {{1, 1, -1, 4, 2}, {1, 2, 2, 1, 1}},
     16, 4, {1, 1, 2, 4, 2}, {1, 2, 2, 1, 1}},
};
// clang-format on

std::string CaseName(const ::testing::TestParamInfo<MultiHostCase>& info) {
  const MultiHostCase& c = info.param;
  std::string name = c.type + "_x" + std::to_string(c.num_slices) + "_ici";
  for (int v : c.ici) name += "_" + std::to_string(v);
  name += "_dcn";
  for (int v : c.dcn) name += "_" + std::to_string(v);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

class MultiHostMeshTest : public ::testing::TestWithParam<MultiHostCase> {
 protected:
  void SetUp() override {
    const MultiHostCase& c = GetParam();
    // The reference's own rules agree with the hand-written table.
    const ReferenceType rt = ReferenceTypeOf(c.type);
    ASSERT_EQ(rt.chips, c.chips);
    ASSERT_EQ((rt.chips + rt.chips_per_host - 1) / rt.chips_per_host,
              c.hosts_per_slice);
    ASSERT_EQ(ProductOf(c.ici), c.chips);
    ASSERT_EQ(ProductOf(c.dcn), c.num_slices);

    Result<AcceleratorType> type = ParseAcceleratorType(c.type);
    ASSERT_TRUE(type.ok()) << type.status().message();
    type_ = *type;
    devices_ = MakeDevices(type_, c.num_slices);
    Result<ParallelismConfig> resolved = ResolveParallelism(
        c.requested, type_.devices_per_slice(), c.num_slices);
    ASSERT_TRUE(resolved.ok()) << resolved.status().message();
    resolved_ = *resolved;
    Result<DeviceMesh> mesh = MeshForConfig(resolved_, devices_);
    ASSERT_TRUE(mesh.ok()) << mesh.status().message();
    mesh_ = *mesh;
    ref_ = BuildReference(c);
  }

  // The code's process index of a device: its host plus its slice times
  // the hosts of a slice (what Runtime::process_index computes from
  // TPU_WORKER_ID and MEGASCALE_SLICE_ID).
  int CodeProcess(const Device& d) const {
    return d.host + d.slice_index * type_.hosts_per_slice();
  }

  const Device* CodeDevice(int id) const {
    for (const Device& d : devices_) {
      if (d.id == id) return &d;
    }
    return nullptr;
  }

  AcceleratorType type_;
  std::vector<Device> devices_;
  ParallelismConfig resolved_;
  DeviceMesh mesh_;
  Reference ref_;
};

TEST_P(MultiHostMeshTest, TypeAndResolvedParallelism) {
  const MultiHostCase& c = GetParam();
  const ReferenceType rt = ReferenceTypeOf(c.type);
  EXPECT_EQ(type_.devices_per_slice(), rt.chips);
  EXPECT_EQ(type_.devices_per_host(), rt.chips_per_host);
  EXPECT_EQ(type_.hosts_per_slice(), c.hosts_per_slice);
  EXPECT_EQ(resolved_.ici, c.ici);
  EXPECT_EQ(resolved_.dcn, c.dcn);
}

TEST_P(MultiHostMeshTest, MeshMatchesTiledSliceMeshes) {
  const MultiHostCase& c = GetParam();
  EXPECT_EQ(
      mesh_.axis_names,
      (std::vector<std::string>{"diloco", "data", "stage", "fsdp", "tensor"}));
  EXPECT_EQ(mesh_.shape,
            std::vector<int>(ref_.shape.begin(), ref_.shape.end()));
  EXPECT_EQ(mesh_.ici_shape, std::vector<int>(c.ici.begin(), c.ici.end()));
  EXPECT_EQ(mesh_.dcn_shape, std::vector<int>(c.dcn.begin(), c.dcn.end()));
  ASSERT_EQ(mesh_.device_ids.size(), ref_.mesh_ids.size());
  // Coordinate by coordinate, so that a failure names where.
  for (int cell = 0; cell < static_cast<int>(ref_.mesh_ids.size()); ++cell) {
    const AxisSizes digits = Digits(cell, ref_.shape);
    const std::vector<int> coords(digits.begin(), digits.end());
    const int want = ref_.mesh_ids[cell];
    ASSERT_EQ(mesh_.at(coords), want)
        << "at (diloco, data, stage, fsdp, tensor) = (" << Joined(digits)
        << ")";
    Result<std::vector<int>> got = mesh_.coords_of(want);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(*got, coords);
  }
  // Every device of the job appears exactly once.
  std::vector<int> sorted = mesh_.device_ids;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    ASSERT_EQ(sorted[i], static_cast<int>(i));
  }
}

TEST_P(MultiHostMeshTest, InputOrderDoesNotMatter) {
  std::vector<Device> shuffled = devices_;
  std::mt19937 rng(14);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  Result<DeviceMesh> mesh = MeshForConfig(resolved_, shuffled);
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  EXPECT_EQ(mesh->device_ids, ref_.mesh_ids);
}

TEST_P(MultiHostMeshTest, EveryMeshCellHasTheReferenceSliceHostAndProcess) {
  const MultiHostCase& c = GetParam();
  ASSERT_EQ(devices_.size(),
            static_cast<size_t>(c.num_slices) * static_cast<size_t>(c.chips));
  for (size_t i = 0; i < devices_.size(); ++i) {
    EXPECT_EQ(devices_[i].id, static_cast<int>(i)) << "MakeDevices order";
  }
  for (size_t cell = 0; cell < mesh_.device_ids.size(); ++cell) {
    const int id = mesh_.device_ids[cell];
    SCOPED_TRACE("mesh cell " + std::to_string(cell) + ", device " +
                 std::to_string(id));
    auto it = ref_.devices.find(id);
    ASSERT_NE(it, ref_.devices.end());
    const ReferenceDevice& want = it->second;
    const Device* got = CodeDevice(id);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->slice_index, want.slice);
    EXPECT_EQ(got->local_index, want.position);
    EXPECT_EQ(got->host, want.worker);
    EXPECT_EQ(CodeProcess(*got), want.process);
    EXPECT_EQ(ToString(*got, type_),
              "TpuDevice(id=" + std::to_string(want.id) +
                  ", slice_index=" + std::to_string(want.slice) +
                  ", host=" + std::to_string(want.worker) + ")");
  }
}

TEST_P(MultiHostMeshTest, EachProcessHoldsExactlyItsHostsChips) {
  const MultiHostCase& c = GetParam();
  // The code's view: group the mesh's devices by their process.
  std::map<int, std::vector<int>> by_process;
  for (int id : mesh_.device_ids) {
    const Device* d = CodeDevice(id);
    ASSERT_NE(d, nullptr) << id;
    by_process[CodeProcess(*d)].push_back(id);
  }
  ASSERT_EQ(static_cast<int>(by_process.size()),
            c.num_slices * c.hosts_per_slice);
  ASSERT_EQ(by_process.size(), ref_.process_devices.size());
  for (auto& [process, ids] : by_process) {
    std::sort(ids.begin(), ids.end());
    auto want = ref_.process_devices.find(process);
    ASSERT_NE(want, ref_.process_devices.end()) << "process " << process;
    EXPECT_EQ(ids, want->second) << "process " << process;
  }
}

// For every process (slice, host): the devices MakeDevices gives that host,
// and that the mesh places, are devices_per_host many with contiguous ids
// starting at slice * chips + host * chips_per_host.
TEST_P(MultiHostMeshTest, PerProcessDevicesAreContiguous) {
  const MultiHostCase& c = GetParam();
  const ReferenceType rt = ReferenceTypeOf(c.type);
  const std::set<int> in_mesh(mesh_.device_ids.begin(), mesh_.device_ids.end());
  for (int slice = 0; slice < c.num_slices; ++slice) {
    for (int host = 0; host < c.hosts_per_slice; ++host) {
      SCOPED_TRACE("slice " + std::to_string(slice) + ", host " +
                   std::to_string(host));
      std::vector<int> ids;
      for (const Device& d : devices_) {
        if (d.slice_index == slice && d.host == host && in_mesh.count(d.id)) {
          ids.push_back(d.id);
        }
      }
      std::sort(ids.begin(), ids.end());
      ASSERT_EQ(static_cast<int>(ids.size()), type_.devices_per_host());
      ASSERT_EQ(static_cast<int>(ids.size()), rt.chips_per_host);
      const int first = slice * c.chips + host * rt.chips_per_host;
      for (int k = 0; k < rt.chips_per_host; ++k) {
        EXPECT_EQ(ids[k], first + k);
      }
    }
  }
}

// Two cases written out in full, as numpy prints them, besides the loops.
TEST(MultiHostMeshWrittenOutTest, SeedTwoV5litepod16DcnData2IciFsdp16) {
  Result<AcceleratorType> type = ParseAcceleratorType("v5litepod-16");
  ASSERT_TRUE(type.ok());
  const std::vector<Device> devices = MakeDevices(*type, 2);
  Result<DeviceMesh> mesh = MeshForConfig(
      ParallelismConfig{{1, 1, 1, 16, 1}, {1, 2, 1, 1, 1}}, devices);
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  EXPECT_EQ(mesh->shape, (std::vector<int>{1, 2, 1, 16, 1}));
  std::vector<int> want;
  for (int id = 0; id < 32; ++id) want.push_back(id);
  EXPECT_EQ(mesh->device_ids, want);
  // Hosts: 4 per slice, chips 4k..4k+3 on worker k; processes 0-3 are
  // slice 0's workers, 4-7 slice 1's.
  const int want_host[32] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                             0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  for (const Device& d : devices) {
    EXPECT_EQ(d.host, want_host[d.id]) << d.id;
    EXPECT_EQ(d.slice_index, d.id / 16) << d.id;
    EXPECT_EQ(d.host + d.slice_index * type->hosts_per_slice(), d.id / 4)
        << d.id;
  }
}

TEST(MultiHostMeshWrittenOutTest, TwoV4x16DcnFsdp2IciFsdp4Tensor2) {
  Result<AcceleratorType> type = ParseAcceleratorType("v4-16");
  ASSERT_TRUE(type.ok());
  const std::vector<Device> devices = MakeDevices(*type, 2);
  Result<DeviceMesh> mesh = MeshForConfig(
      ParallelismConfig{{1, 1, 1, 4, 2}, {1, 1, 1, 2, 1}}, devices);
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  EXPECT_EQ(FormatDeviceArray(*mesh),
            "[[[[[ 0  1]\n"
            "    [ 2  3]\n"
            "    [ 4  5]\n"
            "    [ 6  7]\n"
            "    [ 8  9]\n"
            "    [10 11]\n"
            "    [12 13]\n"
            "    [14 15]]]]]");
  // Devices 0-3: slice 0 host 0 (process 0), 4-7: slice 0 host 1 (process
  // 1), 8-11: slice 1 host 0 (process 2), 12-15: slice 1 host 1 (process 3).
  for (const Device& d : devices) {
    EXPECT_EQ(d.host + d.slice_index * type->hosts_per_slice(), d.id / 4)
        << d.id;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MultiHostMeshTest, ::testing::ValuesIn(kCases),
                         CaseName);

}  // namespace
}  // namespace multislice::mesh
