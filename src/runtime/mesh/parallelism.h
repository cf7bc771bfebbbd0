// The parallelism configuration of MaxText: ici_* axes multiply to the
// devices per slice, dcn_* axes to the number of slices, and at most one axis
// per level may be -1, filled with target / product(others).
#pragma once

#include <array>
#include <string>

#include "common/status.h"

namespace multislice::mesh {

// Axis order of every mesh, MaxText's: data, stage, fsdp, tensor. The stage
// axis holds pipeline stages; its keys are MaxText's *_pipeline_parallelism.
enum Axis : int { kData = 0, kStage = 1, kFsdp = 2, kTensor = 3 };
inline constexpr int kNumAxes = 4;
inline constexpr std::array<const char*, kNumAxes> kAxisNames = {
    "data", "stage", "fsdp", "tensor"};
// The word of each axis in its keys: ici_<word>_parallelism.
inline constexpr std::array<const char*, kNumAxes> kAxisKeyWords = {
    "data", "pipeline", "fsdp", "tensor"};

struct ParallelismConfig {
  std::array<int, kNumAxes> ici = {1, 1, 1, 1};  // by Axis
  std::array<int, kNumAxes> dcn = {1, 1, 1, 1};
  // The devices along an axis over both levels (of a resolved config).
  int size(Axis a) const { return ici[a] * dcn[a]; }
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
