// Device meshes with JAX's semantics (jax/_src/mesh_utils.py).
//
// CreateDeviceMesh reshapes devices (for flat CPU devices: sorted by id) to a
// shape. CreateHybridDeviceMesh groups devices by slice, builds one ICI mesh
// per slice and tiles them row-major over the DCN shape (numpy `block`), so
// that axis i has size dcn[i] * ici[i] and global index
// dcn_index * ici[i] + ici_index: the slice is the major part of every axis.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/mesh/parallelism.h"
#include "runtime/mesh/topology.h"

namespace multislice::mesh {

struct DeviceMesh {
  std::vector<std::string> axis_names;
  std::vector<int> shape;
  std::vector<int> device_ids;  // row-major over shape
  // For hybrid meshes: the ICI and DCN shapes it was built from (all ones
  // for DCN when built by CreateDeviceMesh).
  std::vector<int> ici_shape;
  std::vector<int> dcn_shape;

  int num_devices() const { return static_cast<int>(device_ids.size()); }
  // Device id at a coordinate; coords.size() == shape.size().
  int at(const std::vector<int>& coords) const;
  // Coordinates of a device id (kNotFound if absent).
  Result<std::vector<int>> coords_of(int device_id) const;
};

// Error "Number of devices {n} must equal the product of mesh_shape {shape}"
// when sizes differ ({shape} printed as a Python tuple, e.g. "(2, 3)").
// Devices are sorted by id, then laid out row-major. axis_names stays empty.
Result<DeviceMesh> CreateDeviceMesh(const std::vector<int>& mesh_shape,
                                    const std::vector<Device>& devices);

// Error "Number of slices {k} must equal the product of dcn_mesh_shape {dcn}"
// when the slice count differs, and CreateDeviceMesh's error per slice.
Result<DeviceMesh> CreateHybridDeviceMesh(const std::vector<int>& ici_shape,
                                          const std::vector<int>& dcn_shape,
                                          const std::vector<Device>& devices);

// The mesh of a resolved configuration over `devices`, with the axis names
// kAxisNames (diloco, data, stage, fsdp, tensor), every axis even of size 1:
// hybrid when there is more than one slice.
Result<DeviceMesh> MeshForConfig(const ParallelismConfig& resolved,
                                 const std::vector<Device>& devices);

// numpy's str() of the device-id array, e.g. "[[0 1]\n [2 3]]": numbers
// right-aligned to the widest, rows wrapped at 75 columns, a blank line
// between the blocks of 3-D arrays, and above 1000 devices only the first and
// last 3 entries of each longer axis around "...".
std::string FormatDeviceArray(const DeviceMesh& mesh);

}  // namespace multislice::mesh
