#include "runtime/mesh/device_mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace multislice::mesh {
namespace {

// Devices of `num_slices` slices of `per_slice` devices each, numbered
// id = slice * per_slice + local, written out here rather than taken from
// MakeDevices so that these tests stand alone.
std::vector<Device> Devices(int num_slices, int per_slice) {
  std::vector<Device> devices;
  for (int slice = 0; slice < num_slices; ++slice) {
    for (int local = 0; local < per_slice; ++local) {
      Device d;
      d.id = slice * per_slice + local;
      d.slice_index = slice;
      d.local_index = local;
      devices.push_back(d);
    }
  }
  return devices;
}

std::vector<Device> Shuffled(std::vector<Device> devices, unsigned seed) {
  std::mt19937 rng(seed);
  std::shuffle(devices.begin(), devices.end(), rng);
  return devices;
}

int ProductOf(const std::vector<int>& shape) {
  int p = 1;
  for (int s : shape) p *= s;
  return p;
}

// Row-major index of `coords` within `shape`.
int RowMajor(const std::vector<int>& coords, const std::vector<int>& shape) {
  int index = 0;
  for (size_t i = 0; i < shape.size(); ++i)
    index = index * shape[i] + coords[i];
  return index;
}

// The reference: numpy.block's definition, one coordinate at a time. Along
// every axis the slice is the major part: slice = row-major index of
// coord / ici over dcn, local = row-major index of coord % ici over ici.
std::vector<int> ReferenceHybridIds(const std::vector<int>& ici,
                                    const std::vector<int>& dcn) {
  const size_t rank = ici.size();
  std::vector<int> shape(rank);
  for (size_t i = 0; i < rank; ++i) shape[i] = ici[i] * dcn[i];
  const int per_slice = ProductOf(ici);
  std::vector<int> ids;
  std::vector<int> coord(rank, 0);
  for (int flat = 0; flat < ProductOf(shape); ++flat) {
    int rest = flat;
    for (size_t i = rank; i-- > 0;) {
      coord[i] = rest % shape[i];
      rest /= shape[i];
    }
    std::vector<int> slice_coord(rank), local_coord(rank);
    for (size_t i = 0; i < rank; ++i) {
      slice_coord[i] = coord[i] / ici[i];
      local_coord[i] = coord[i] % ici[i];
    }
    ids.push_back(RowMajor(slice_coord, dcn) * per_slice +
                  RowMajor(local_coord, ici));
  }
  return ids;
}

TEST(CreateDeviceMeshTest, SortsByIdThenReshapesRowMajor) {
  Result<DeviceMesh> mesh =
      CreateDeviceMesh({2, 3}, Shuffled(Devices(1, 6), 1));
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  EXPECT_EQ(mesh->shape, (std::vector<int>{2, 3}));
  EXPECT_EQ(mesh->device_ids, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(mesh->num_devices(), 6);
  EXPECT_EQ(mesh->ici_shape, (std::vector<int>{2, 3}));
  EXPECT_EQ(mesh->dcn_shape, (std::vector<int>{1, 1}));
  EXPECT_EQ(mesh->at({1, 0}), 3);
  EXPECT_EQ(mesh->at({0, 2}), 2);
  Result<std::vector<int>> coords = mesh->coords_of(5);
  ASSERT_TRUE(coords.ok());
  EXPECT_EQ(*coords, (std::vector<int>{1, 2}));
  Result<std::vector<int>> missing = mesh->coords_of(6);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(CreateDeviceMeshTest, CountMismatchUsesJaxWording) {
  Result<DeviceMesh> mesh = CreateDeviceMesh({2, 2}, Devices(1, 6));
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh.status().message(),
            "Number of devices 6 must equal the product of mesh_shape (2, 2)");
  EXPECT_EQ(CreateDeviceMesh({4}, Devices(1, 3)).status().message(),
            "Number of devices 3 must equal the product of mesh_shape (4,)");
  EXPECT_EQ(CreateDeviceMesh({-1, -6}, Devices(1, 6)).status().message(),
            "mesh_shape (-1, -6) must have positive axis sizes");
}

TEST(CreateHybridDeviceMeshTest, SmallCasesWrittenOut) {
  // Two slices of a 2x2 ICI mesh stacked along axis 0 ...
  Result<DeviceMesh> rows =
      CreateHybridDeviceMesh({2, 2}, {2, 1}, Devices(2, 4));
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  EXPECT_EQ(rows->shape, (std::vector<int>{4, 2}));
  EXPECT_EQ(rows->device_ids, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // ... or side by side along axis 1.
  Result<DeviceMesh> cols =
      CreateHybridDeviceMesh({2, 2}, {1, 2}, Devices(2, 4));
  ASSERT_TRUE(cols.ok()) << cols.status().message();
  EXPECT_EQ(cols->shape, (std::vector<int>{2, 4}));
  EXPECT_EQ(cols->device_ids, (std::vector<int>{0, 1, 4, 5, 2, 3, 6, 7}));
  EXPECT_EQ(cols->ici_shape, (std::vector<int>{2, 2}));
  EXPECT_EQ(cols->dcn_shape, (std::vector<int>{1, 2}));
}

struct HybridCase {
  std::vector<int> ici;
  std::vector<int> dcn;
};

class HybridMeshTest : public ::testing::TestWithParam<HybridCase> {};

TEST_P(HybridMeshTest, MatchesNumpyBlockDefinition) {
  const HybridCase& c = GetParam();
  const int per_slice = ProductOf(c.ici);
  const int num_slices = ProductOf(c.dcn);
  // Devices arrive in any order; the mesh does not depend on it.
  Result<DeviceMesh> mesh = CreateHybridDeviceMesh(
      c.ici, c.dcn, Shuffled(Devices(num_slices, per_slice), 42));
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  std::vector<int> shape;
  for (size_t i = 0; i < c.ici.size(); ++i) {
    shape.push_back(c.ici[i] * c.dcn[i]);
  }
  EXPECT_EQ(mesh->shape, shape);
  EXPECT_EQ(mesh->ici_shape, c.ici);
  EXPECT_EQ(mesh->dcn_shape, c.dcn);
  const std::vector<int> want = ReferenceHybridIds(c.ici, c.dcn);
  EXPECT_EQ(mesh->device_ids, want);
  // at() and coords_of() agree with the layout.
  for (int id = 0; id < per_slice * num_slices; ++id) {
    Result<std::vector<int>> coords = mesh->coords_of(id);
    ASSERT_TRUE(coords.ok());
    EXPECT_EQ(mesh->at(*coords), id);
    EXPECT_EQ(want[RowMajor(*coords, shape)], id);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, HybridMeshTest,
    ::testing::Values(
        HybridCase{{1, 4, 1}, {2, 1, 1}}, HybridCase{{2, 2}, {2, 1}},
        HybridCase{{2, 2}, {1, 2}}, HybridCase{{2, 2}, {2, 2}},
        HybridCase{{1, 1, 1}, {4, 1, 1}}, HybridCase{{1, 1, 1}, {1, 2, 2}},
        HybridCase{{2, 3, 1}, {1, 1, 2}}, HybridCase{{4}, {3}},
        HybridCase{{2, 1, 2}, {2, 2, 1}}, HybridCase{{1, 8, 1}, {2, 1, 1}},
        HybridCase{{2, 2, 2}, {2, 1, 2}}, HybridCase{{3, 1, 2}, {1, 4, 1}},
        HybridCase{{1, 2, 4}, {4, 1, 1}}, HybridCase{{4, 4, 1}, {2, 2, 1}},
        HybridCase{{1, 16, 1}, {2, 1, 1}}, HybridCase{{2, 1, 3}, {1, 2, 2}}));

TEST(CreateHybridDeviceMeshTest, GroupsBySliceIndexSortedAndKeepsOrderInside) {
  // Slices 7 and 3, given interleaved: slice 3 comes first in the mesh.
  std::vector<Device> devices;
  for (int i = 0; i < 4; ++i) {
    Device a;
    a.id = 10 + i;
    a.slice_index = 7;
    devices.push_back(a);
    Device b;
    b.id = 20 + i;
    b.slice_index = 3;
    devices.push_back(b);
  }
  Result<DeviceMesh> mesh =
      CreateHybridDeviceMesh({1, 4}, {2, 1}, Shuffled(devices, 5));
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  EXPECT_EQ(mesh->device_ids,
            (std::vector<int>{20, 21, 22, 23, 10, 11, 12, 13}));
}

TEST(CreateHybridDeviceMeshTest, Errors) {
  Result<DeviceMesh> slices =
      CreateHybridDeviceMesh({1, 4, 1}, {1, 1, 1}, Devices(2, 4));
  ASSERT_FALSE(slices.ok());
  EXPECT_EQ(slices.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(slices.status().message(),
            "Number of slices 2 must equal the product of dcn_mesh_shape "
            "(1, 1, 1)");
  // The per-slice mesh's own check.
  EXPECT_EQ(
      CreateHybridDeviceMesh({2, 2}, {2, 1}, Devices(2, 3)).status().message(),
      "Number of devices 3 must equal the product of mesh_shape (2, 2)");
  EXPECT_EQ(
      CreateHybridDeviceMesh({4}, {2, 1}, Devices(2, 4)).status().message(),
      "ici_mesh_shape (4,) and dcn_mesh_shape (2, 1) must have the same "
      "number of axes");
}

// MeshForConfig's meshes have MaxText's five axes, diloco, data, stage,
// fsdp and tensor, in that order, whichever of them have size 1.
const std::vector<std::string> kMaxTextAxes = {"diloco", "data", "stage",
                                               "fsdp", "tensor"};

TEST(MeshForConfigTest, OneSliceIsAPlainMeshWithAxisNames) {
  ParallelismConfig config;
  config.ici = {1, 1, 1, 4, 1};
  Result<DeviceMesh> mesh = MeshForConfig(config, Devices(1, 4));
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  EXPECT_EQ(mesh->axis_names, kMaxTextAxes);
  EXPECT_EQ(mesh->shape, (std::vector<int>{1, 1, 1, 4, 1}));
  EXPECT_EQ(mesh->dcn_shape, (std::vector<int>{1, 1, 1, 1, 1}));
  EXPECT_EQ(mesh->device_ids, (std::vector<int>{0, 1, 2, 3}));
}

TEST(MeshForConfigTest, SeveralSlicesAreHybrid) {
  ParallelismConfig config;
  config.ici = {1, 1, 1, 4, 1};
  config.dcn = {1, 2, 1, 1, 1};
  Result<DeviceMesh> mesh = MeshForConfig(config, Devices(2, 4));
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  EXPECT_EQ(mesh->axis_names, kMaxTextAxes);
  EXPECT_EQ(mesh->shape, (std::vector<int>{1, 2, 1, 4, 1}));
  EXPECT_EQ(mesh->ici_shape, (std::vector<int>{1, 1, 1, 4, 1}));
  EXPECT_EQ(mesh->dcn_shape, (std::vector<int>{1, 2, 1, 1, 1}));
  EXPECT_EQ(mesh->device_ids, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(FormatDeviceArray(*mesh),
            "[[[[[0]\n    [1]\n    [2]\n    [3]]]\n\n\n"
            "  [[[4]\n    [5]\n    [6]\n    [7]]]]]");
}

// Two pipeline stages across DCN, fsdp 2 inside each slice: slice 0 is
// stage 0 and slice 1 stage 1, whatever order the devices come in.
TEST(MeshForConfigTest, StageAxisAcrossSlices) {
  ParallelismConfig config;
  config.ici = {1, 1, 1, 2, 1};
  config.dcn = {1, 1, 2, 1, 1};
  const std::vector<Device> devices = Devices(2, 2);
  Result<DeviceMesh> mesh = MeshForConfig(config, Shuffled(devices, 3));
  ASSERT_TRUE(mesh.ok()) << mesh.status().message();
  EXPECT_EQ(mesh->axis_names, kMaxTextAxes);
  EXPECT_EQ(mesh->shape, (std::vector<int>{1, 1, 2, 2, 1}));
  EXPECT_EQ(mesh->ici_shape, (std::vector<int>{1, 1, 1, 2, 1}));
  EXPECT_EQ(mesh->dcn_shape, (std::vector<int>{1, 1, 2, 1, 1}));
  for (const Device& d : devices) {
    Result<std::vector<int>> coords = mesh->coords_of(d.id);
    ASSERT_TRUE(coords.ok()) << d.id;
    EXPECT_EQ(*coords,
              (std::vector<int>{0, 0, d.slice_index, d.local_index, 0}))
        << d.id;
  }
  EXPECT_EQ(mesh->at({0, 0, 0, 1, 0}), 1);
  EXPECT_EQ(mesh->at({0, 0, 1, 0, 0}), 2);
  EXPECT_EQ(FormatDeviceArray(*mesh),
            "[[[[[0]\n    [1]]\n\n   [[2]\n    [3]]]]]");
}

TEST(MeshForConfigTest, DcnAxesWithoutSlicesFail) {
  ParallelismConfig config;
  config.ici = {1, 1, 1, 4, 1};
  config.dcn = {1, 2, 1, 1, 1};
  EXPECT_EQ(MeshForConfig(config, Devices(1, 4)).status().message(),
            "Number of slices 1 must equal the product of dcn_mesh_shape "
            "(1, 2, 1, 1, 1)");
  config.dcn = {1, 1, 2, 1, 1};
  EXPECT_EQ(MeshForConfig(config, Devices(1, 4)).status().message(),
            "Number of slices 1 must equal the product of dcn_mesh_shape "
            "(1, 1, 2, 1, 1)");
}

// Expected strings are numpy 1.24's str() of the same arrays.
struct FormatCase {
  std::vector<int> shape;
  std::vector<int> values;  // empty: 0, 1, 2, ...
  const char* text;
};

const FormatCase kFormatCases[] = {
    {{2, 2}, {}, "[[0 1]\n [2 3]]"},
    {{2, 4, 1},
     {},
     "[[[0]\n  [1]\n  [2]\n  [3]]\n\n [[4]\n  [5]\n  [6]\n  [7]]]"},
    {{2, 3, 4},
     {},
     "[[[ 0  1  2  3]\n  [ 4  5  6  7]\n  [ 8  9 10 11]]\n\n [[12 13 14 15]\n  "
     "[16 17 18 19]\n  [20 21 22 23]]]"},
    {{1, 1, 64},
     {},
     "[[[ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 "
     "22\n   23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 "
     "45\n   46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63]]]"},
    {{2, 2, 2, 2},
     {},
     "[[[[ 0  1]\n   [ 2  3]]\n\n  [[ 4  5]\n   [ 6  7]]]\n\n\n [[[ 8  9]\n   "
     "[10 11]]\n\n  [[12 13]\n   [14 15]]]]"},
    {{40},
     {},
     "[ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 22 "
     "23\n 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39]"},
    {{3, 30},
     {},
     "[[ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 22 "
     "23\n  24 25 26 27 28 29]\n [30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 "
     "45 46 47 48 49 50 51 52 53\n  54 55 56 57 58 59]\n [60 61 62 63 64 65 66 "
     "67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83\n  84 85 86 87 88 "
     "89]]"},
    {{1, 120},
     {},
     "[[  0   1   2   3   4   5   6   7   8   9  10  11  12  13  14  15  16  "
     "17\n   18  19  20  21  22  23  24  25  26  27  28  29  30  31  32  33  "
     "34  35\n   36  37  38  39  40  41  42  43  44  45  46  47  48  49  50  "
     "51  52  53\n   54  55  56  57  58  59  60  61  62  63  64  65  66  67  "
     "68  69  70  71\n   72  73  74  75  76  77  78  79  80  81  82  83  84  "
     "85  86  87  88  89\n   90  91  92  93  94  95  96  97  98  99 100 101 "
     "102 103 104 105 106 107\n  108 109 110 111 112 113 114 115 116 117 118 "
     "119]]"},
    {{8, 8, 16},
     {},
     "[[[   0    1    2 ...   13   14   15]\n  [  16   17   18 ...   29   30   "
     "31]\n  [  32   33   34 ...   45   46   47]\n  ...\n  [  80   81   82 ... "
     "  93   94   95]\n  [  96   97   98 ...  109  110  111]\n  [ 112  113  "
     "114 ...  125  126  127]]\n\n [[ 128  129  130 ...  141  142  143]\n  [ "
     "144  145  146 ...  157  158  159]\n  [ 160  161  162 ...  173  174  "
     "175]\n  ...\n  [ 208  209  210 ...  221  222  223]\n  [ 224  225  226 "
     "...  237  238  239]\n  [ 240  241  242 ...  253  254  255]]\n\n [[ 256  "
     "257  258 ...  269  270  271]\n  [ 272  273  274 ...  285  286  287]\n  [ "
     "288  289  290 ...  301  302  303]\n  ...\n  [ 336  337  338 ...  349  "
     "350  351]\n  [ 352  353  354 ...  365  366  367]\n  [ 368  369  370 ...  "
     "381  382  383]]\n\n ...\n\n [[ 640  641  642 ...  653  654  655]\n  [ "
     "656  657  658 ...  669  670  671]\n  [ 672  673  674 ...  685  686  "
     "687]\n  ...\n  [ 720  721  722 ...  733  734  735]\n  [ 736  737  738 "
     "...  749  750  751]\n  [ 752  753  754 ...  765  766  767]]\n\n [[ 768  "
     "769  770 ...  781  782  783]\n  [ 784  785  786 ...  797  798  799]\n  [ "
     "800  801  802 ...  813  814  815]\n  ...\n  [ 848  849  850 ...  861  "
     "862  863]\n  [ 864  865  866 ...  877  878  879]\n  [ 880  881  882 ...  "
     "893  894  895]]\n\n [[ 896  897  898 ...  909  910  911]\n  [ 912  913  "
     "914 ...  925  926  927]\n  [ 928  929  930 ...  941  942  943]\n  ...\n  "
     "[ 976  977  978 ...  989  990  991]\n  [ 992  993  994 ... 1005 1006 "
     "1007]\n  [1008 1009 1010 ... 1021 1022 1023]]]"},
    {{2048}, {}, "[   0    1    2 ... 2045 2046 2047]"},
    {{4, 300},
     {},
     "[[   0    1    2 ...  297  298  299]\n [ 300  301  302 ...  597  598  "
     "599]\n [ 600  601  602 ...  897  898  899]\n [ 900  901  902 ... 1197 "
     "1198 1199]]"},
    {{1}, {}, "[0]"},
    {{1, 1, 1}, {}, "[[[0]]]"},
    {{2, 3, 5},
     {12, 14, 4, 28, 22, 24, 17, 3,  27, 19, 18, 13, 0,  25, 23,
      10, 8,  7, 1,  15, 6,  16, 20, 5,  29, 26, 2,  21, 9,  11},
     "[[[12 14  4 28 22]\n  [24 17  3 27 19]\n  [18 13  0 25 23]]\n\n [[10  8  "
     "7  1 15]\n  [ 6 16 20  5 29]\n  [26  2 21  9 11]]]"},
};

TEST(FormatDeviceArrayTest, MatchesNumpyStr) {
  for (const FormatCase& c : kFormatCases) {
    DeviceMesh mesh;
    mesh.shape = c.shape;
    mesh.device_ids = c.values;
    if (mesh.device_ids.empty()) {
      for (int i = 0; i < ProductOf(c.shape); ++i) mesh.device_ids.push_back(i);
    }
    EXPECT_EQ(FormatDeviceArray(mesh), c.text)
        << "shape size " << c.shape.size() << " first " << c.shape[0];
  }
}

TEST(FormatDeviceArrayTest, SummarySizesFieldsToTheShownEntries) {
  DeviceMesh mesh;
  mesh.shape = {1200};
  for (int i = 0; i < 1200; ++i) mesh.device_ids.push_back(i);
  mesh.device_ids[600] = 123456;  // hidden behind "..."
  EXPECT_EQ(FormatDeviceArray(mesh), "[   0    1    2 ... 1197 1198 1199]");
  mesh.device_ids[600] = 600;
  mesh.device_ids[1] = 123456;  // shown
  EXPECT_EQ(FormatDeviceArray(mesh),
            "[     0 123456      2 ...   1197   1198   1199]");
}

TEST(FormatDeviceArrayTest, ScalarAndEmpty) {
  DeviceMesh scalar;
  scalar.device_ids = {7};
  EXPECT_EQ(FormatDeviceArray(scalar), "7");
  DeviceMesh empty;
  empty.shape = {0};
  EXPECT_EQ(FormatDeviceArray(empty), "[]");
}

}  // namespace
}  // namespace multislice::mesh
