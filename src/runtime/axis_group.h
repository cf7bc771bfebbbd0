// The group of devices a collective over some mesh axes runs on, as seen by
// one device, split into its ICI part (the members in this device's slice)
// and its DCN part (the members in this device's column: same position in
// every slice).
//
// Ranks follow JAX: the group of a device over axes (a1, a2, ...) is every
// device whose coordinates agree on the other axes, and its rank is the
// row-major index of its coordinates over (a1, a2, ...) in the order given.
// Because the slice is the major part of every axis of a hybrid mesh, a
// coordinate c on axis a splits into a DCN digit c / ici[a] and an ICI digit
// c % ici[a]; d (the DCN rank) and j (the ICI rank) are the row-major indices
// of those digits, and rank_of[d * ici_size + j] gives the group rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/mesh/device_mesh.h"

namespace multislice::runtime {

enum class Path {
  kLocal,     // one member: nothing moves
  kIci,       // all members in one slice
  kDcn,       // one member per slice
  kTwoLevel,  // several members in each of several slices
};
const char* PathName(Path path);

struct AxisGroup {
  std::vector<int> axes;   // mesh axis indices, in the order given
  std::string axes_label;  // e.g. "data,fsdp"
  int size = 1, rank = 0;
  int ici_size = 1, ici_rank = 0;  // k and j
  int dcn_size = 1, dcn_rank = 0;  // m and d
  std::vector<int> rank_of;        // [d * ici_size + j] -> group rank
  std::vector<int> members;        // device id by group rank
  std::vector<int> ici_members;    // device ids of this slice's part, by j
  std::vector<int> dcn_slices;     // slice of each column member, by d
  int column = 0;                  // local index: which DCN communicator
  std::string ici_key;             // same for every member of the ICI part
  uint32_t dcn_id = 0;             // same for every member of the DCN part

  Path path() const;
  int RankOf(int d, int j) const { return rank_of[d * ici_size + j]; }
};

// kInvalidArgument for an unknown or repeated axis name; kFailedPrecondition
// when the ICI part spans hosts (multi-host slices are not runnable yet).
Result<AxisGroup> MakeAxisGroup(const mesh::DeviceMesh& mesh,
                                const std::vector<mesh::Device>& devices,
                                const std::vector<std::string>& axis_names,
                                int device_id);

}  // namespace multislice::runtime
