#include "runtime/axis_group.h"

#include <algorithm>

namespace multislice::runtime {
namespace {

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
    case Path::kShared:
      return "shared";
    case Path::kNetwork:
      return "network";
    case Path::kTwoLevel:
      return "two-level";
  }
  return "?";
}

Path AxisGroup::path() const {
  if (size == 1) return Path::kLocal;
  if (net_size == 1) return Path::kShared;
  if (local_size == 1) return Path::kNetwork;
  return Path::kTwoLevel;
}

namespace {

Status ParseAxes(const mesh::DeviceMesh& mesh,
                 const std::vector<std::string>& axis_names, AxisGroup& g) {
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
  return OkStatus();
}

// Fills size, rank, the (d, j) split, rank_of and members: the group's
// coordinates walked row-major over the axes in the given order.
Status RankTheMembers(const mesh::DeviceMesh& mesh, int device_id,
                      AxisGroup& g) {
  ASSIGN_OR_RETURN(std::vector<int> coords, mesh.coords_of(device_id));
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
  return OkStatus();
}

// Where devices sit: hosts per slice, devices per host.
struct Placement {
  const std::vector<mesh::Device>& devices;
  int hosts_per_slice = 1;
  int devices_per_host = 1;

  explicit Placement(const std::vector<mesh::Device>& all) : devices(all) {
    int per_host = 0, hosts = 1;
    for (const mesh::Device& d : all) {
      if (d.slice_index != 0) continue;
      hosts = std::max(hosts, d.host + 1);
      if (d.host == 0) ++per_host;
    }
    hosts_per_slice = hosts;
    devices_per_host = std::max(per_host, 1);
  }
  const mesh::Device& at(int id) const { return devices.at(id); }
  int process(int id) const {
    return at(id).slice_index * hosts_per_slice + at(id).host;
  }
  int position(int id) const {
    return at(id).local_index - at(id).host * devices_per_host;
  }
};

// Splits the slice's part (j = 0..k-1, the same in every slice) by host:
// host_size, local_size, j_of, host_rank and local_rank.
Status SplitByHost(const Placement& where, AxisGroup& g) {
  std::vector<int> hosts;                 // by e: host index
  std::vector<std::vector<int>> by_host;  // by e: j values
  for (int j = 0; j < g.ici_size; ++j) {
    const int host = where.at(g.members[g.RankOf(g.dcn_rank, j)]).host;
    auto it = std::find(hosts.begin(), hosts.end(), host);
    if (it == hosts.end()) {
      hosts.push_back(host);
      by_host.emplace_back();
      it = hosts.end() - 1;
    }
    by_host[it - hosts.begin()].push_back(j);
  }
  g.host_size = static_cast<int>(hosts.size());
  g.local_size = static_cast<int>(by_host[0].size());
  for (size_t e = 0; e < by_host.size(); ++e) {
    if (static_cast<int>(by_host[e].size()) != g.local_size) {
      return FailedPrecondition(
          "mesh axes " + g.axes_label + " put " + std::to_string(g.local_size) +
          " of a group's devices on host " + std::to_string(hosts[0]) +
          " of a slice but " + std::to_string(by_host[e].size()) + " on host " +
          std::to_string(hosts[e]) +
          ": choose ICI sizes that split the slice's hosts evenly (each "
          "axis within a host, or whole hosts)");
    }
    for (size_t i = 0; i < by_host[e].size(); ++i) {
      g.j_of.push_back(by_host[e][i]);
      if (by_host[e][i] == g.ici_rank) {
        g.host_rank = static_cast<int>(e);
        g.local_rank = static_cast<int>(i);
      }
    }
  }
  g.net_size = g.host_size * g.dcn_size;
  g.net_rank = g.dcn_rank * g.host_size + g.host_rank;
  return OkStatus();
}

}  // namespace

Result<AxisGroup> MakeAxisGroup(const mesh::DeviceMesh& mesh,
                                const std::vector<mesh::Device>& devices,
                                const std::vector<std::string>& axis_names,
                                int device_id) {
  AxisGroup g;
  RETURN_IF_ERROR(ParseAxes(mesh, axis_names, g));
  RETURN_IF_ERROR(RankTheMembers(mesh, device_id, g));
  const Placement where(devices);
  RETURN_IF_ERROR(SplitByHost(where, g));
  g.column = where.position(device_id);
  for (int i = 0; i < g.local_size; ++i) {
    g.local_members.push_back(g.members[g.NetRankOf(g.net_rank, i)]);
  }
  std::vector<int> net_members;
  for (int q = 0; q < g.net_size; ++q) {
    const int peer = g.members[g.NetRankOf(q, g.local_rank)];
    if (where.position(peer) != g.column) {
      return FailedPrecondition(
          "mesh axes " + g.axes_label + " join device " +
          std::to_string(device_id) + " (position " + std::to_string(g.column) +
          " on its host) with device " + std::to_string(peer) + " (position " +
          std::to_string(where.position(peer)) +
          " on its host) across hosts; choose ICI sizes that split the "
          "slice's hosts evenly");
    }
    net_members.push_back(peer);
    g.net_processes.push_back(where.process(peer));
  }
  for (int d = 0; d < g.dcn_size; ++d) {
    g.dcn_slices.push_back(
        where.at(g.members[g.RankOf(d, g.ici_rank)]).slice_index);
  }
  g.local_key = "ici/" + g.axes_label + "/" + JoinInts(g.local_members);
  g.net_label = g.axes_label + "/" + JoinInts(net_members);
  return g;
}

AxisGroup WithoutSlices(const AxisGroup& g,
                        const std::vector<int>& lost_slices) {
  auto lost = [&](int d) {
    return std::find(lost_slices.begin(), lost_slices.end(), g.dcn_slices[d]) !=
           lost_slices.end();
  };
  std::vector<int> keep;  // old d, by new d
  for (int d = 0; d < g.dcn_size; ++d) {
    if (!lost(d)) keep.push_back(d);
  }
  if (static_cast<int>(keep.size()) == g.dcn_size) return g;
  const int k = g.ici_size;
  std::vector<int> d_of(g.size);  // by old rank
  for (int d = 0; d < g.dcn_size; ++d) {
    for (int j = 0; j < k; ++j) d_of[g.RankOf(d, j)] = d;
  }
  std::vector<int> renumbered(g.size, -1);
  AxisGroup out = g;
  out.members.clear();
  for (int r = 0; r < g.size; ++r) {
    if (lost(d_of[r])) continue;
    renumbered[r] = static_cast<int>(out.members.size());
    out.members.push_back(g.members[r]);
  }
  out.size = static_cast<int>(out.members.size());
  out.rank = renumbered[g.rank];
  out.dcn_size = static_cast<int>(keep.size());
  out.rank_of.clear();
  out.net_processes.clear();
  out.dcn_slices.clear();
  std::string left_out;
  for (int d = 0; d < g.dcn_size; ++d) {
    if (lost(d)) left_out += "-" + std::to_string(g.dcn_slices[d]);
  }
  for (size_t x = 0; x < keep.size(); ++x) {
    const int d = keep[x];
    if (d == g.dcn_rank) out.dcn_rank = static_cast<int>(x);
    for (int j = 0; j < k; ++j)
      out.rank_of.push_back(renumbered[g.RankOf(d, j)]);
    for (int e = 0; e < g.host_size; ++e) {
      out.net_processes.push_back(g.net_processes[d * g.host_size + e]);
    }
    out.dcn_slices.push_back(g.dcn_slices[d]);
  }
  out.net_size = out.host_size * out.dcn_size;
  out.net_rank = out.dcn_rank * out.host_size + out.host_rank;
  out.net_label += "/without" + left_out;
  return out;
}

}  // namespace multislice::runtime
