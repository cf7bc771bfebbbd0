// The group of devices a collective over some mesh axes runs on, as seen by
// one device, split by where its members live: on this host (shared memory),
// on other hosts of this slice (the slice's network: ICI on a TPU), and in
// other slices (DCN).
//
// Ranks follow JAX: the group of a device over axes (a1, a2, ...) is every
// device whose coordinates agree on the other axes, and its rank is the
// row-major index of its coordinates over (a1, a2, ...) in the order given.
// Because the slice is the major part of every axis of a hybrid mesh, a
// coordinate c on axis a splits into a DCN digit c / ici[a] and an ICI digit
// c % ici[a]; d (the DCN rank, 0..m-1) and j (the ICI rank, 0..k-1) are the
// row-major indices of those digits, and rank_of[d * k + j] gives the group
// rank.
//
// Inside a slice of several hosts, the k members of the slice's part sit on
// h hosts with k_l = k / h each (every host the same count; a layout that
// splits them unevenly is refused). e (0..h-1) numbers those hosts in order
// of their first member by j and i (0..k_l-1) the members of one host by j,
// the same in every slice, so a member is (d, e, i). The members with this
// device's i on every host of every slice form its network group, indexed by
// q = d * h + e; they all have the same position on their hosts, so they
// share one DCN communicator (one per device column).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/mesh/device_mesh.h"

namespace multislice::runtime {

enum class Path {
  kLocal,     // one member: nothing moves
  kShared,    // every member on this host: shared memory only
  kNetwork,   // one member per host: the network only
  kTwoLevel,  // several members on each of several hosts
};
const char* PathName(Path path);

struct AxisGroup {
  std::vector<int> axes;   // mesh axis indices, in the order given
  std::string axes_label;  // e.g. "data,fsdp"
  int size = 1, rank = 0;
  int ici_size = 1, ici_rank = 0;      // k and j: members per slice
  int dcn_size = 1, dcn_rank = 0;      // m and d: slices
  int host_size = 1, host_rank = 0;    // h and e: hosts per slice
  int local_size = 1, local_rank = 0;  // k_l and i: members per host
  int net_size = 1, net_rank = 0;      // h * m and q = d * h + e
  std::vector<int> rank_of;            // [d * k + j] -> group rank
  std::vector<int> j_of;               // [e * k_l + i] -> j
  std::vector<int> members;            // device id by group rank
  std::vector<int> local_members;      // device ids on this host, by i
  std::vector<int> net_processes;  // process index of member (q, my i), by q
  std::vector<int> dcn_slices;     // slice of each slice's member, by d
  int column = 0;                  // position on the host: DCN communicator
  std::string local_key;           // same for every member on this host
  std::string net_label;           // same for every member of the network part

  Path path() const;
  int RankOf(int d, int j) const { return rank_of[d * ici_size + j]; }
  // The rank of member (q, i) with q = d * h + e.
  int NetRankOf(int q, int i) const {
    return RankOf(q / host_size, j_of[(q % host_size) * local_size + i]);
  }
};

// kInvalidArgument for an unknown or repeated axis name; kFailedPrecondition
// when the layout puts different numbers of the group's members on the hosts
// of a slice, or its network part mixes positions on the host.
Result<AxisGroup> MakeAxisGroup(const mesh::DeviceMesh& mesh,
                                const std::vector<mesh::Device>& devices,
                                const std::vector<std::string>& axis_names,
                                int device_id);

// The group without the members in `lost_slices` (DiLoCo's
// diloco_continue_on_failure drops whole slices): the remaining slices keep
// their order, ranks are renumbered in the old order, and net_label names
// the slices left out, so that the group's DCN slots differ from the whole
// group's. This device's slice must not be among them.
AxisGroup WithoutSlices(const AxisGroup& g,
                        const std::vector<int>& lost_slices);

}  // namespace multislice::runtime
