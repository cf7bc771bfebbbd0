// Accelerator types and the devices of a job.
//
// TPU names (`v4-N`, `v5litepod-N`, `v5p-N`, `v6e-N`) are modelled for
// planning (chips, TensorCores per chip, chips per host, peak bf16 FLOP/s
// and DCN bandwidth per host) and run on CPU devices: each host of the type
// holds its chips-per-host count of CPU devices, so a v4-16 runs as 2 worker
// processes of 4 devices (the figures then say nothing about a TPU). `cpu-N`
// is N CPU devices (threads) on one host. A device is what JAX calls a
// device: a chip (v4 and v5p run their two TensorCores as one megacore
// device) or a CPU device.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace multislice::mesh {

struct AcceleratorType {
  std::string name;    // as given, e.g. "v4-16"
  std::string family;  // "v4", "v5litepod", "v5p", "v6e", "cpu"
  int num_chips = 0;   // chips (or CPU devices) in one slice
  int cores_per_chip = 1;
  int chips_per_host = 1;
  double peak_bf16_flops_per_chip = 0;      // FLOP/s; 0 for cpu (measured)
  double dcn_bits_per_second_per_host = 0;  // 0 for cpu (measured)

  int devices_per_slice() const { return num_chips; }
  int hosts_per_slice() const {
    return (num_chips + chips_per_host - 1) / chips_per_host;
  }
  int devices_per_host() const {
    return num_chips < chips_per_host ? num_chips : chips_per_host;
  }
};

// Parses an accelerator type. An unknown or malformed name is
// kInvalidArgument with one sentence that names it and lists the known
// families, e.g. "unknown accelerator type 'v9-8': expected one of v4-N,
// v5p-N, v5litepod-N, v6e-N (TPU) or cpu-N (CPU devices)";
// a bad size for a known family names the valid sizes. Valid sizes: v4-N, N
// a multiple of 8 from 8 to 8192; v5p-N, a multiple of 8 from 8 to 12288;
// v5litepod-N and v6e-N, N one of 1, 4, 8, 16, 32, 64, 128, 256; cpu-N, N
// from 1 to 4096.
Result<AcceleratorType> ParseAcceleratorType(std::string_view name);

struct Device {
  int id = 0;           // slice_index * devices_per_slice + local_index
  int slice_index = 0;  // which slice
  int host = 0;         // worker index inside the slice (TPU_WORKER_ID)
  int local_index = 0;  // index inside the slice
};

// The devices of `num_slices` slices of `type`, ordered by id: id =
// slice_index * devices_per_slice + local_index, host = local_index /
// devices_per_host. Empty when num_slices < 1.
std::vector<Device> MakeDevices(const AcceleratorType& type, int num_slices);

// Prints like JAX's repr: "CpuDevice(id=3, slice_index=1)" for cpu-N (one
// host per slice), "TpuDevice(id=3, slice_index=1, host=0)" for TPU types.
std::string ToString(const Device& d, const AcceleratorType& type);

}  // namespace multislice::mesh
