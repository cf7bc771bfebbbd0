// The parallelism configuration of MaxText: ici_* axes multiply to the
// devices per slice, dcn_* axes to the number of slices, and at most one axis
// per level may be -1, filled with target / product(others).
#pragma once

#include <array>
#include <string>

#include "common/status.h"

namespace multislice::mesh {

// Axis order of every mesh: data, fsdp, tensor.
inline constexpr std::array<const char*, 3> kAxisNames = {"data", "fsdp",
                                                          "tensor"};

struct ParallelismConfig {
  std::array<int, 3> ici = {1, 1, 1};  // data, fsdp, tensor
  std::array<int, 3> dcn = {1, 1, 1};
};

// kInvalidArgument naming the first value that is 0 or below -1, e.g.
// "ici_fsdp_parallelism must be a positive integer or -1, got 0".
Status CheckParallelismValues(const ParallelismConfig& config);

// Fills the -1 of each level and checks the products against
// devices_per_slice and num_slices, with MaxText's messages:
//   "Found unspecified values (-1) for more than one ICI parallelism axis. At
//    most one axis can be unspecified."
//   "Unspecified value unable to be determined with the given ICI parallelism
//    values"
//   "Number of devices per slice 4 does not match the product of the ICI
//    parallelism 3"
//   "Number of slices 2 does not match the product of the DCN parallelism 1"
//   "DCN parallelism requested but only one slice available."
// (and the same with DCN). Order: the values (CheckParallelismValues), then
// ICI, then DCN; per level: more than one -1, then (one slice only) any DCN
// value above 1, then the fill, then the product.
Result<ParallelismConfig> ResolveParallelism(const ParallelismConfig& config,
                                             int devices_per_slice,
                                             int num_slices);

}  // namespace multislice::mesh
