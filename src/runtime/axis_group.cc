#include "runtime/axis_group.h"

#include <algorithm>

namespace multislice::runtime {
namespace {

uint32_t Fnv1a(const std::string& text) {
  uint32_t h = 2166136261u;
  for (unsigned char c : text) h = (h ^ c) * 16777619u;
  return h;
}

std::string JoinInts(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

}  // namespace

const char* PathName(Path path) {
  switch (path) {
    case Path::kLocal:
      return "local";
    case Path::kIci:
      return "ici";
    case Path::kDcn:
      return "dcn";
    case Path::kTwoLevel:
      return "two-level";
  }
  return "?";
}

Path AxisGroup::path() const {
  if (size == 1) return Path::kLocal;
  if (dcn_size == 1) return Path::kIci;
  if (ici_size == 1) return Path::kDcn;
  return Path::kTwoLevel;
}

Result<AxisGroup> MakeAxisGroup(const mesh::DeviceMesh& mesh,
                                const std::vector<mesh::Device>& devices,
                                const std::vector<std::string>& axis_names,
                                int device_id) {
  AxisGroup g;
  for (const std::string& name : axis_names) {
    auto it = std::find(mesh.axis_names.begin(), mesh.axis_names.end(), name);
    if (it == mesh.axis_names.end()) {
      std::string known;
      for (const std::string& n : mesh.axis_names)
        known += (known.empty() ? "" : ", ") + n;
      return InvalidArgument("unknown mesh axis '" + name +
                             "': expected one of " + known);
    }
    int axis = static_cast<int>(it - mesh.axis_names.begin());
    if (std::find(g.axes.begin(), g.axes.end(), axis) != g.axes.end()) {
      return InvalidArgument("mesh axis '" + name + "' is named twice");
    }
    g.axes.push_back(axis);
    g.axes_label += (g.axes_label.empty() ? "" : ",") + name;
  }
  ASSIGN_OR_RETURN(std::vector<int> my_coords, mesh.coords_of(device_id));
  const int rank_count = static_cast<int>(mesh.shape.size());
  std::vector<int> ici(rank_count, 1), dcn(rank_count, 1);
  for (int a = 0; a < rank_count; ++a) {
    if (a < static_cast<int>(mesh.ici_shape.size())) ici[a] = mesh.ici_shape[a];
    if (a < static_cast<int>(mesh.dcn_shape.size())) dcn[a] = mesh.dcn_shape[a];
  }
  g.size = g.ici_size = g.dcn_size = 1;
  for (int a : g.axes) {
    g.size *= mesh.shape[a];
    g.ici_size *= ici[a];
    g.dcn_size *= dcn[a];
  }
  g.rank_of.assign(g.size, -1);
  g.members.assign(g.size, -1);

  // Walk the group's coordinates row-major over the axes in the given order.
  std::vector<int> coords = my_coords;
  for (int rank = 0; rank < g.size; ++rank) {
    int rest = rank;
    for (int i = static_cast<int>(g.axes.size()) - 1; i >= 0; --i) {
      const int a = g.axes[i];
      coords[a] = rest % mesh.shape[a];
      rest /= mesh.shape[a];
    }
    int d = 0, j = 0;
    for (int a : g.axes) {
      d = d * dcn[a] + coords[a] / ici[a];
      j = j * ici[a] + coords[a] % ici[a];
    }
    g.members[rank] = mesh.at(coords);
    g.rank_of[d * g.ici_size + j] = rank;
    if (g.members[rank] == device_id) {
      g.rank = rank;
      g.dcn_rank = d;
      g.ici_rank = j;
    }
  }
  auto device = [&](int id) -> const mesh::Device& { return devices.at(id); };
  const mesh::Device& me = device(device_id);
  g.column = me.local_index;
  std::vector<int> dcn_members;
  for (int j = 0; j < g.ici_size; ++j) {
    const mesh::Device& peer = device(g.members[g.RankOf(g.dcn_rank, j)]);
    if (peer.slice_index != me.slice_index || peer.host != me.host) {
      return FailedPrecondition(
          "mesh axes " + g.axes_label +
          " need devices of several hosts of one slice to exchange data; "
          "multi-host slices are not runnable yet");
    }
    g.ici_members.push_back(peer.id);
  }
  for (int d = 0; d < g.dcn_size; ++d) {
    const mesh::Device& peer = device(g.members[g.RankOf(d, g.ici_rank)]);
    if (peer.local_index != me.local_index) {
      return Internal("the DCN part of axes " + g.axes_label +
                      " mixes devices of different local indices");
    }
    g.dcn_slices.push_back(peer.slice_index);
    dcn_members.push_back(peer.id);
  }
  g.ici_key = "ici/" + g.axes_label + "/" + JoinInts(g.ici_members);
  g.dcn_id = Fnv1a("dcn/" + g.axes_label + "/" + JoinInts(dcn_members));
  return g;
}

}  // namespace multislice::runtime
