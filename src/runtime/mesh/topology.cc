// Accelerator types: the table of TPU families we model (and run on CPU
// devices, one worker per host of the type), the `cpu-N` type, and the
// devices of a multislice job.
//
// Sources of the numbers (public Cloud TPU documentation):
//   v4:        275 TFLOP/s bf16 per chip, 4 chips per host, 50 Gbit/s DCN
//              per host (the seed document, section on optimizing training).
//   v5p:       459 TFLOP/s bf16 per chip, 4 chips per host, DCN 50 Gbit/s
//              per chip, so 200 Gbit/s per 4-chip host.
//   v5litepod: 197 TFLOP/s bf16 per chip; the docs give DCN only per pod
//              (6.4 Tbit/s for 256 chips, 2 x 100 Gbit/s NICs per 8-chip
//              host): 25 Gbit/s per chip, times the chips of a worker. For
//              planning.
//   v6e:       918 TFLOP/s bf16 per chip; DCN per pod 25.6 Tbit/s for 256
//              chips (4 x 200 Gbit/s NICs per 8-chip host): 100 Gbit/s per
//              chip, times the chips of a worker. For planning.
// A "host" here is a worker VM (TPU_WORKER_ID): multi-host v5litepod and v6e
// slices run 4 chips per worker VM.
#include "runtime/mesh/topology.h"

#include <charconv>
#include <climits>
#include <string>

namespace multislice::mesh {
namespace {

constexpr char kKnownTypes[] =
    "expected one of v4-N, v5p-N, v5litepod-N, v6e-N (TPU) or "
    "cpu-N (CPU devices)";

// The most CPU devices a `cpu-N` slice may have: each device is a thread of
// one process, and more than this is a typo rather than a plan.
constexpr int kMaxCpuDevices = 4096;

constexpr int kPodSlicesV5eV6e[] = {1, 4, 8, 16, 32, 64, 128, 256};

Status UnknownType(std::string_view name) {
  return InvalidArgument("unknown accelerator type '" + std::string(name) +
                         "': " + kKnownTypes);
}

// Parses a plain decimal without sign or leading zeros: -1 if the text is
// not one, LLONG_MAX if it is too large for a long long.
long long ParseSize(std::string_view text) {
  if (text == "0") return 0;
  if (text.empty() || text[0] == '0') return -1;
  for (char c : text) {
    if (c < '0' || c > '9') return -1;
  }
  long long value = 0;
  auto [end, error] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range) return LLONG_MAX;
  if (error != std::errc() || end != text.data() + text.size()) return -1;
  return value;
}

Status BadSize(std::string_view name, const std::string& rule) {
  return InvalidArgument("accelerator type '" + std::string(name) +
                         "' has an invalid size: " + rule);
}

bool IsPodSliceSize(long long n) {
  for (int size : kPodSlicesV5eV6e) {
    if (n == size) return true;
  }
  return false;
}

}  // namespace

Result<AcceleratorType> ParseAcceleratorType(std::string_view name) {
  const size_t dash = name.rfind('-');
  if (dash == std::string_view::npos) return UnknownType(name);
  const std::string family(name.substr(0, dash));
  const long long n = ParseSize(name.substr(dash + 1));
  if (n < 0) return UnknownType(name);

  AcceleratorType type;
  type.name = std::string(name);
  type.family = family;
  if (family == "v4" || family == "v5p") {
    // N counts TensorCores; a chip is two of them, run as one megacore
    // device.
    const bool v4 = family == "v4";
    const long long max_cores = v4 ? 8192 : 12288;
    if (n < 8 || n % 8 != 0 || n > max_cores) {
      return BadSize(name, family +
                               "-N takes N (TensorCores, 2 per chip) a "
                               "multiple of 8 from 8 to " +
                               std::to_string(max_cores));
    }
    type.num_chips = static_cast<int>(n / 2);
    type.cores_per_chip = 2;
    type.chips_per_host = 4;
    type.peak_bf16_flops_per_chip = v4 ? 275e12 : 459e12;
    type.dcn_bits_per_second_per_host = v4 ? 50e9 : 4 * 50e9;
    return type;
  }
  if (family == "v5litepod" || family == "v6e") {
    // N counts chips, one TensorCore each. Slices of 1, 4 and 8 chips sit on
    // one worker; larger ones run 4 chips per worker.
    if (!IsPodSliceSize(n)) {
      return BadSize(name, family +
                               "-N takes N (chips) one of 1, 4, 8, 16, 32, "
                               "64, 128, 256");
    }
    const bool v5e = family == "v5litepod";
    type.num_chips = static_cast<int>(n);
    type.cores_per_chip = 1;
    type.chips_per_host = n <= 8 ? static_cast<int>(n) : 4;
    type.peak_bf16_flops_per_chip = v5e ? 197e12 : 918e12;
    const double dcn_bits_per_second_per_chip = v5e ? 25e9 : 100e9;
    type.dcn_bits_per_second_per_host =
        dcn_bits_per_second_per_chip * type.devices_per_host();
    return type;
  }
  if (family == "cpu") {
    if (n < 1 || n > kMaxCpuDevices) {
      return BadSize(name,
                     "cpu-N takes N (CPU devices on this host) from 1 "
                     "to " +
                         std::to_string(kMaxCpuDevices));
    }
    type.num_chips = static_cast<int>(n);
    type.cores_per_chip = 1;
    type.chips_per_host = static_cast<int>(n);
    return type;
  }
  return UnknownType(name);
}

std::vector<Device> MakeDevices(const AcceleratorType& type, int num_slices) {
  std::vector<Device> devices;
  const int per_slice = type.devices_per_slice();
  const int per_host = type.devices_per_host();
  if (num_slices <= 0 || per_slice <= 0 || per_host <= 0) return devices;
  devices.reserve(static_cast<size_t>(num_slices) * per_slice);
  for (int slice = 0; slice < num_slices; ++slice) {
    for (int local = 0; local < per_slice; ++local) {
      Device d;
      d.id = slice * per_slice + local;
      d.slice_index = slice;
      d.host = local / per_host;
      d.local_index = local;
      devices.push_back(d);
    }
  }
  return devices;
}

std::string ToString(const Device& d, const AcceleratorType& type) {
  if (type.family == "cpu") {
    return "CpuDevice(id=" + std::to_string(d.id) +
           ", slice_index=" + std::to_string(d.slice_index) + ")";
  }
  return "TpuDevice(id=" + std::to_string(d.id) +
         ", slice_index=" + std::to_string(d.slice_index) +
         ", host=" + std::to_string(d.host) + ")";
}

}  // namespace multislice::mesh
