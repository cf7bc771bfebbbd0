// Accelerator types and the devices of a job.
//
// TPU names (`v4-N`, `v5litepod-N`, `v5p-N`, `v6e-N`) are modelled for
// planning: chips, TensorCores per chip, chips per host, peak bf16 FLOP/s and
// DCN bandwidth per host. `cpu-N` is the runnable local type: N CPU devices
// (threads) on one host. A device is what JAX calls a device: a chip (v4 and
// v5p run their two TensorCores as one megacore device) or a CPU device.
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
  double peak_bf16_flops_per_chip = 0;  // FLOP/s; 0 for cpu (measured)
  double dcn_bits_per_second_per_host = 0;  // 0 for cpu (measured)
  bool runnable = false;  // true when this machine can run it (cpu-N)

  int devices_per_slice() const { return num_chips; }
  int hosts_per_slice() const {
    return (num_chips + chips_per_host - 1) / chips_per_host;
  }
  int devices_per_host() const {
    return num_chips < chips_per_host ? num_chips : chips_per_host;
  }
};

// Parses an accelerator type. Unknown names are kInvalidArgument with a
// sentence that lists the known families and their valid sizes.
Result<AcceleratorType> ParseAcceleratorType(std::string_view name);

struct Device {
  int id = 0;           // slice_index * devices_per_slice + local_index
  int slice_index = 0;  // which slice
  int host = 0;         // worker index inside the slice (TPU_WORKER_ID)
  int local_index = 0;  // index inside the slice
};

// The devices of `num_slices` slices of `type`, ordered by id.
std::vector<Device> MakeDevices(const AcceleratorType& type, int num_slices);

// Prints like JAX's repr, e.g. "CpuDevice(id=3, slice_index=1, host=0)".
std::string ToString(const Device& d, const AcceleratorType& type);

}  // namespace multislice::mesh
