#include "runtime/mesh/topology.h"

#include <gtest/gtest.h>

#include <string>

namespace multislice::mesh {
namespace {

constexpr char kKnownFamilies[] =
    "expected one of v4-N, v5p-N, v5litepod-N, v6e-N (TPU) or "
    "cpu-N (CPU devices)";

AcceleratorType Parse(const std::string& name) {
  Result<AcceleratorType> type = ParseAcceleratorType(name);
  EXPECT_TRUE(type.ok()) << name << ": " << type.status().message();
  return type.ok() ? *type : AcceleratorType{};
}

void ExpectInvalid(const std::string& name, const std::string& message) {
  Result<AcceleratorType> type = ParseAcceleratorType(name);
  ASSERT_FALSE(type.ok()) << name;
  EXPECT_EQ(type.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(type.status().message(), message);
}

TEST(TopologyTest, V4CountsTensorCoresTwoPerChipFourChipsPerHost) {
  AcceleratorType t = Parse("v4-16");
  EXPECT_EQ(t.name, "v4-16");
  EXPECT_EQ(t.family, "v4");
  EXPECT_EQ(t.num_chips, 8);
  EXPECT_EQ(t.cores_per_chip, 2);
  EXPECT_EQ(t.chips_per_host, 4);
  EXPECT_EQ(t.devices_per_slice(), 8);
  EXPECT_EQ(t.devices_per_host(), 4);
  EXPECT_EQ(t.hosts_per_slice(), 2);
  EXPECT_DOUBLE_EQ(t.peak_bf16_flops_per_chip, 275e12);
  EXPECT_DOUBLE_EQ(t.dcn_bits_per_second_per_host, 50e9);

  AcceleratorType small = Parse("v4-8");
  EXPECT_EQ(small.num_chips, 4);
  EXPECT_EQ(small.hosts_per_slice(), 1);

  AcceleratorType pod = Parse("v4-8192");
  EXPECT_EQ(pod.num_chips, 4096);
  EXPECT_EQ(pod.hosts_per_slice(), 1024);
}

TEST(TopologyTest, SeedArithmeticIntensityOfV4) {
  // 4 chips * 275e12 FLOP/s / 50e9 bit/s = 22,000 FLOP per bit.
  AcceleratorType t = Parse("v4-32");
  EXPECT_DOUBLE_EQ(t.devices_per_host() * t.peak_bf16_flops_per_chip /
                       t.dcn_bits_per_second_per_host,
                   22000.0);
}

TEST(TopologyTest, V5p) {
  AcceleratorType t = Parse("v5p-8");
  EXPECT_EQ(t.family, "v5p");
  EXPECT_EQ(t.num_chips, 4);
  EXPECT_EQ(t.cores_per_chip, 2);
  EXPECT_EQ(t.hosts_per_slice(), 1);
  EXPECT_DOUBLE_EQ(t.peak_bf16_flops_per_chip, 459e12);
  EXPECT_DOUBLE_EQ(t.dcn_bits_per_second_per_host, 200e9);

  AcceleratorType largest = Parse("v5p-12288");  // 16x16x24
  EXPECT_EQ(largest.num_chips, 6144);
  EXPECT_EQ(largest.hosts_per_slice(), 1536);
}

TEST(TopologyTest, V5litepodCountsChipsSingleHostUpToEight) {
  for (int n : {1, 4, 8}) {
    AcceleratorType t = Parse("v5litepod-" + std::to_string(n));
    EXPECT_EQ(t.family, "v5litepod");
    EXPECT_EQ(t.num_chips, n);
    EXPECT_EQ(t.cores_per_chip, 1);
    EXPECT_EQ(t.hosts_per_slice(), 1);
    EXPECT_EQ(t.devices_per_host(), n);
    EXPECT_DOUBLE_EQ(t.peak_bf16_flops_per_chip, 197e12);
  }
  AcceleratorType t = Parse("v5litepod-16");
  EXPECT_EQ(t.num_chips, 16);
  EXPECT_EQ(t.devices_per_host(), 4);
  EXPECT_EQ(t.hosts_per_slice(), 4);
  EXPECT_DOUBLE_EQ(t.dcn_bits_per_second_per_host, 100e9);
  EXPECT_DOUBLE_EQ(Parse("v5litepod-8").dcn_bits_per_second_per_host, 200e9);
  EXPECT_EQ(Parse("v5litepod-256").hosts_per_slice(), 64);
}

TEST(TopologyTest, V6e) {
  AcceleratorType t = Parse("v6e-256");
  EXPECT_EQ(t.family, "v6e");
  EXPECT_EQ(t.num_chips, 256);
  EXPECT_EQ(t.cores_per_chip, 1);
  EXPECT_EQ(t.hosts_per_slice(), 64);
  EXPECT_DOUBLE_EQ(t.peak_bf16_flops_per_chip, 918e12);
  EXPECT_DOUBLE_EQ(t.dcn_bits_per_second_per_host, 400e9);
  EXPECT_EQ(Parse("v6e-8").hosts_per_slice(), 1);
  EXPECT_DOUBLE_EQ(Parse("v6e-8").dcn_bits_per_second_per_host, 800e9);
}

TEST(TopologyTest, CpuIsRunnableOnOneHost) {
  AcceleratorType t = Parse("cpu-4");
  EXPECT_EQ(t.family, "cpu");
  EXPECT_EQ(t.num_chips, 4);
  EXPECT_EQ(t.chips_per_host, 4);
  EXPECT_EQ(t.devices_per_slice(), 4);
  EXPECT_EQ(t.hosts_per_slice(), 1);
  EXPECT_EQ(Parse("cpu-1").num_chips, 1);
  EXPECT_EQ(Parse("cpu-4096").hosts_per_slice(), 1);
}

TEST(TopologyTest, UnknownOrMalformedTypesListTheKnownFamilies) {
  for (const std::string name :
       {"v9-8", "", "v4", "v4-", "v4-abc", "v4-+8", "v4--8", "v4-08", "V4-8",
        "v4-8 ", "-8", "tpu-8", "cpu-4x", "v5e-16", "cpu-1.5"}) {
    ExpectInvalid(name,
                  "unknown accelerator type '" + name + "': " + kKnownFamilies);
  }
  ExpectInvalid("v9-8",
                "unknown accelerator type 'v9-8': expected one of v4-N, "
                "v5p-N, v5litepod-N, v6e-N (TPU) or cpu-N "
                "(CPU devices)");
}

TEST(TopologyTest, BadSizesNameTheValidSizes) {
  const std::string v4_rule =
      "v4-N takes N (TensorCores, 2 per chip) a multiple of 8 from 8 to 8192";
  for (const std::string name :
       {"v4-12", "v4-0", "v4-4", "v4-8200", "v4-99999999999999999999"}) {
    ExpectInvalid(name, "accelerator type '" + name +
                            "' has an invalid size: " + v4_rule);
  }
  ExpectInvalid("v5p-12296",
                "accelerator type 'v5p-12296' has an invalid size: v5p-N "
                "takes N (TensorCores, 2 per chip) a multiple of 8 from 8 to "
                "12288");
  ExpectInvalid("v5litepod-2",
                "accelerator type 'v5litepod-2' has an invalid size: "
                "v5litepod-N takes N (chips) one of 1, 4, 8, 16, 32, 64, 128, "
                "256");
  ExpectInvalid("v6e-512",
                "accelerator type 'v6e-512' has an invalid size: v6e-N takes "
                "N (chips) one of 1, 4, 8, 16, 32, 64, 128, 256");
  ExpectInvalid("cpu-0",
                "accelerator type 'cpu-0' has an invalid size: cpu-N takes N "
                "(CPU devices on this host) from 1 to 4096");
  ExpectInvalid("cpu-4097",
                "accelerator type 'cpu-4097' has an invalid size: cpu-N "
                "takes N (CPU devices on this host) from 1 to 4096");
}

TEST(TopologyTest, MakeDevicesNumbersSlicesThenLocalIndex) {
  AcceleratorType t = Parse("v4-16");
  std::vector<Device> devices = MakeDevices(t, 2);
  ASSERT_EQ(devices.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    const Device& d = devices[i];
    EXPECT_EQ(d.id, i);
    EXPECT_EQ(d.slice_index, i / 8);
    EXPECT_EQ(d.local_index, i % 8);
    EXPECT_EQ(d.host, (i % 8) / 4);
  }
  // The seed's check: 4 slices of v4-16 show 32 devices.
  EXPECT_EQ(MakeDevices(t, 4).size(), 32u);
  EXPECT_TRUE(MakeDevices(t, 0).empty());
}

TEST(TopologyTest, MakeDevicesCpuSlicesHaveOneHost) {
  std::vector<Device> devices = MakeDevices(Parse("cpu-4"), 3);
  ASSERT_EQ(devices.size(), 12u);
  for (const Device& d : devices) {
    EXPECT_EQ(d.host, 0);
    EXPECT_EQ(d.id, d.slice_index * 4 + d.local_index);
  }
  EXPECT_EQ(devices[7].slice_index, 1);
  EXPECT_EQ(devices[7].local_index, 3);
}

TEST(TopologyTest, ToStringLikeJax) {
  Device d;
  d.id = 5;
  d.slice_index = 1;
  d.host = 0;
  d.local_index = 1;
  EXPECT_EQ(ToString(d, Parse("cpu-4")), "CpuDevice(id=5, slice_index=1)");
  d.host = 1;
  EXPECT_EQ(ToString(d, Parse("v4-16")),
            "TpuDevice(id=5, slice_index=1, host=1)");
}

}  // namespace
}  // namespace multislice::mesh
