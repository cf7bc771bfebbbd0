// The parallelism configuration of MaxText: ici_* axes multiply to the
// devices per slice, dcn_* axes to the number of slices, and at most one axis
// per level may be -1, filled with target / product(others).
#pragma once

#include <array>
#include <string>
#include <type_traits>

#include "common/status.h"

namespace multislice::mesh {

// Axis order of every mesh, MaxText's: diloco, data, stage, fsdp, tensor.
// The diloco axis holds DiLoCo's replicas (train/diloco.h): each trains on
// its own with the axes after it and they meet only every sync period. The
// stage axis holds pipeline stages; its keys are MaxText's
// *_pipeline_parallelism.
enum Axis : int { kDiloco = 0, kData = 1, kStage = 2, kFsdp = 3, kTensor = 4 };
inline constexpr int kNumAxes = 5;
inline constexpr std::array<const char*, kNumAxes> kAxisNames = {
    "diloco", "data", "stage", "fsdp", "tensor"};
// The word of each axis in its keys: ici_<word>_parallelism.
inline constexpr std::array<const char*, kNumAxes> kAxisKeyWords = {
    "diloco", "data", "pipeline", "fsdp", "tensor"};

// One level's sizes, by Axis: all ones, or exactly kNumAxes values in axis
// order. A brace list of any other length does not compile (a std::array
// would fill the missing axes with 0 without a word).
class AxisSizes {
 public:
  constexpr AxisSizes() { values_.fill(1); }
  template <typename... V>
  requires(sizeof...(V) == kNumAxes && (std::is_convertible_v<V, int> &&
                                        ...)) constexpr AxisSizes(V... values)
      : values_{static_cast<int>(values)...} {}

  constexpr int& operator[](int axis) { return values_[axis]; }
  constexpr int operator[](int axis) const { return values_[axis]; }
  static constexpr size_t size() { return kNumAxes; }
  auto begin() { return values_.begin(); }
  auto end() { return values_.end(); }
  auto begin() const { return values_.begin(); }
  auto end() const { return values_.end(); }
  bool operator==(const AxisSizes&) const = default;

 private:
  std::array<int, kNumAxes> values_;
};

struct ParallelismConfig {
  AxisSizes ici;  // by Axis
  AxisSizes dcn;
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
