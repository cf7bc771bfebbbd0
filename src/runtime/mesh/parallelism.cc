// MaxText's fill_unspecified_mesh_axes and the checks around it, with its
// messages, so that a configuration MaxText rejects is rejected here with the
// same sentence.
#include "runtime/mesh/parallelism.h"

#include <cstdint>
#include <limits>
#include <string>

namespace multislice::mesh {
namespace {

// Product of the values other than -1, saturating instead of overflowing:
// four ints can exceed int64, and such a product never matches a device
// count anyway.
int64_t ProductOfSpecified(const AxisSizes& values) {
  int64_t product = 1;
  for (int v : values) {
    if (v == -1) continue;
    if (v > 0 && product > std::numeric_limits<int64_t>::max() / v) {
      return std::numeric_limits<int64_t>::max();
    }
    product *= v;
  }
  return product;
}

// Fills the -1 of one level and checks its product against `target`, in
// MaxText's order. `type` is "ICI" or "DCN"; `target_word` is "devices per
// slice" or "slices". `only_one_slice` turns on the single-slice DCN check.
Status FillLevel(AxisSizes& values, int64_t target, const std::string& type,
                 const std::string& target_word, bool only_one_slice) {
  int unspecified = 0;
  int unspecified_index = -1;
  for (int i = 0; i < kNumAxes; ++i) {
    if (values[i] == -1) {
      ++unspecified;
      unspecified_index = i;
    }
  }
  if (unspecified > 1) {
    return InvalidArgument("Found unspecified values (-1) for more than one " +
                           type +
                           " parallelism axis. At most one axis can be "
                           "unspecified.");
  }
  const int64_t specified = ProductOfSpecified(values);
  // Checked before the fill and the product so that asking for DCN axes on
  // one slice gets this sentence rather than a count mismatch.
  if (only_one_slice && specified > 1) {
    return InvalidArgument(
        "DCN parallelism requested but only one slice available.");
  }
  if (unspecified == 1) {
    if (target % specified != 0 || target / specified < 1) {
      return InvalidArgument(
          "Unspecified value unable to be determined with "
          "the given " +
          type + " parallelism values");
    }
    values[unspecified_index] = static_cast<int>(target / specified);
  }
  const int64_t product = ProductOfSpecified(values);
  if (product != target) {
    return InvalidArgument("Number of " + target_word + " " +
                           std::to_string(target) +
                           " does not match the product of the " + type +
                           " parallelism " + std::to_string(product));
  }
  return OkStatus();
}

}  // namespace

Status CheckParallelismValues(const ParallelismConfig& config) {
  for (int level = 0; level < 2; ++level) {
    const AxisSizes& values = level == 0 ? config.ici : config.dcn;
    for (int i = 0; i < kNumAxes; ++i) {
      if (values[i] == 0 || values[i] < -1) {
        return InvalidArgument(std::string(level == 0 ? "ici_" : "dcn_") +
                               kAxisKeyWords[i] +
                               "_parallelism must be a positive integer or "
                               "-1, got " +
                               std::to_string(values[i]));
      }
    }
  }
  return OkStatus();
}

Result<ParallelismConfig> ResolveParallelism(const ParallelismConfig& config,
                                             int devices_per_slice,
                                             int num_slices) {
  if (devices_per_slice < 1) {
    return InvalidArgument(
        "the number of devices per slice must be a positive integer, got " +
        std::to_string(devices_per_slice));
  }
  if (num_slices < 1) {
    return InvalidArgument("num_slices must be a positive integer, got " +
                           std::to_string(num_slices));
  }
  RETURN_IF_ERROR(CheckParallelismValues(config));
  ParallelismConfig resolved = config;
  RETURN_IF_ERROR(FillLevel(resolved.ici, devices_per_slice, "ICI",
                            "devices per slice", /*only_one_slice=*/false));
  RETURN_IF_ERROR(FillLevel(resolved.dcn, num_slices, "DCN", "slices",
                            /*only_one_slice=*/num_slices == 1));
  return resolved;
}

}  // namespace multislice::mesh
