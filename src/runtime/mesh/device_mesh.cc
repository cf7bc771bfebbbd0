// Device meshes: JAX's create_device_mesh and create_hybrid_device_mesh for
// devices without a physical topology to optimise for, MaxText's mesh of a
// parallelism configuration, and numpy's str() of the device-id array.
//
// The hybrid mesh is built the way numpy.block builds it: one array per
// slice, laid out in a nested list of dcn_shape, then concatenated along the
// last axis first, then the one before, and so on. The tests check the
// result against a per-coordinate formula written independently.
#include "runtime/mesh/device_mesh.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <limits>
#include <map>
#include <string>

namespace multislice::mesh {
namespace {

// "(2, 3)", "(4,)", "()": how Python prints a tuple of ints.
std::string TupleString(const std::vector<int>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  if (shape.size() == 1) text += ",";
  return text + ")";
}

// Product of the sizes, saturating instead of overflowing. Negative sizes
// give a negative or zero product, which is fine for comparing with counts.
int64_t Product(const std::vector<int>& shape) {
  int64_t product = 1;
  for (int size : shape) {
    if (size > 0 && product > std::numeric_limits<int64_t>::max() / size) {
      return std::numeric_limits<int64_t>::max();
    }
    product *= size;
  }
  return product;
}

bool AllPositive(const std::vector<int>& shape) {
  return std::all_of(shape.begin(), shape.end(),
                     [](int size) { return size >= 1; });
}

// A dense row-major int array: the unit numpy.block concatenates.
struct IntArray {
  std::vector<int> shape;
  std::vector<int> values;
};

// numpy.concatenate(parts, axis); the parts agree on every other axis.
IntArray Concatenate(const std::vector<IntArray>& parts, size_t axis) {
  IntArray out;
  out.shape = parts.front().shape;
  out.shape[axis] = 0;
  for (const IntArray& part : parts) out.shape[axis] += part.shape[axis];
  int64_t outer = 1;
  for (size_t i = 0; i < axis; ++i) outer *= out.shape[i];
  int64_t inner = 1;
  for (size_t i = axis + 1; i < out.shape.size(); ++i) inner *= out.shape[i];
  out.values.reserve(static_cast<size_t>(Product(out.shape)));
  for (int64_t o = 0; o < outer; ++o) {
    for (const IntArray& part : parts) {
      const int64_t chunk = part.shape[axis] * inner;
      auto begin = part.values.begin() + o * chunk;
      out.values.insert(out.values.end(), begin, begin + chunk);
    }
  }
  return out;
}

}  // namespace

int DeviceMesh::at(const std::vector<int>& coords) const {
  assert(coords.size() == shape.size());
  int64_t index = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    assert(coords[i] >= 0 && coords[i] < shape[i]);
    index = index * shape[i] + coords[i];
  }
  return device_ids[static_cast<size_t>(index)];
}

Result<std::vector<int>> DeviceMesh::coords_of(int device_id) const {
  auto it = std::find(device_ids.begin(), device_ids.end(), device_id);
  if (it == device_ids.end()) {
    return NotFound("device " + std::to_string(device_id) +
                    " is not in the mesh");
  }
  int64_t index = it - device_ids.begin();
  std::vector<int> coords(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    coords[i] = static_cast<int>(index % shape[i]);
    index /= shape[i];
  }
  return coords;
}

Result<DeviceMesh> CreateDeviceMesh(const std::vector<int>& mesh_shape,
                                    const std::vector<Device>& devices) {
  if (Product(mesh_shape) != static_cast<int64_t>(devices.size())) {
    return InvalidArgument(
        "Number of devices " + std::to_string(devices.size()) +
        " must equal the product of mesh_shape " + TupleString(mesh_shape));
  }
  if (!AllPositive(mesh_shape)) {
    return InvalidArgument("mesh_shape " + TupleString(mesh_shape) +
                           " must have positive axis sizes");
  }
  // Flat devices (CPU, and TPUs whose physical layout we do not model):
  // the topology-aware order is simply the order of ids.
  std::vector<Device> sorted = devices;
  std::stable_sort(
      sorted.begin(), sorted.end(),
      [](const Device& a, const Device& b) { return a.id < b.id; });
  DeviceMesh mesh;
  mesh.shape = mesh_shape;
  mesh.device_ids.reserve(sorted.size());
  for (const Device& d : sorted) mesh.device_ids.push_back(d.id);
  mesh.ici_shape = mesh_shape;
  mesh.dcn_shape.assign(mesh_shape.size(), 1);
  return mesh;
}

Result<DeviceMesh> CreateHybridDeviceMesh(const std::vector<int>& ici_shape,
                                          const std::vector<int>& dcn_shape,
                                          const std::vector<Device>& devices) {
  if (ici_shape.size() != dcn_shape.size()) {
    return InvalidArgument("ici_mesh_shape " + TupleString(ici_shape) +
                           " and dcn_mesh_shape " + TupleString(dcn_shape) +
                           " must have the same number of axes");
  }
  // Groups sorted by slice index; input order kept inside each group.
  std::map<int, std::vector<Device>> slices;
  for (const Device& d : devices) slices[d.slice_index].push_back(d);
  if (Product(dcn_shape) != static_cast<int64_t>(slices.size())) {
    return InvalidArgument("Number of slices " + std::to_string(slices.size()) +
                           " must equal the product of dcn_mesh_shape " +
                           TupleString(dcn_shape));
  }
  if (!AllPositive(dcn_shape)) {
    return InvalidArgument("dcn_mesh_shape " + TupleString(dcn_shape) +
                           " must have positive axis sizes");
  }

  // One block per slice, in row-major order over dcn_shape.
  std::vector<IntArray> blocks;
  blocks.reserve(slices.size());
  for (const auto& [slice_index, slice_devices] : slices) {
    ASSIGN_OR_RETURN(DeviceMesh slice_mesh,
                     CreateDeviceMesh(ici_shape, slice_devices));
    blocks.push_back(
        IntArray{slice_mesh.shape, std::move(slice_mesh.device_ids)});
  }
  // numpy.block: the innermost lists (the last DCN axis) are concatenated
  // along the last axis, the next level along the axis before it, ...
  for (size_t axis = dcn_shape.size(); axis-- > 0;) {
    const size_t group = static_cast<size_t>(dcn_shape[axis]);
    std::vector<IntArray> joined;
    joined.reserve(blocks.size() / group);
    for (size_t begin = 0; begin < blocks.size(); begin += group) {
      std::vector<IntArray> parts(blocks.begin() + begin,
                                  blocks.begin() + begin + group);
      joined.push_back(Concatenate(parts, axis));
    }
    blocks = std::move(joined);
  }

  DeviceMesh mesh;
  mesh.shape = std::move(blocks.front().shape);
  mesh.device_ids = std::move(blocks.front().values);
  mesh.ici_shape = ici_shape;
  mesh.dcn_shape = dcn_shape;
  return mesh;
}

Result<DeviceMesh> MeshForConfig(const ParallelismConfig& resolved,
                                 const std::vector<Device>& devices) {
  const std::vector<int> ici(resolved.ici.begin(), resolved.ici.end());
  const std::vector<int> dcn(resolved.dcn.begin(), resolved.dcn.end());
  std::vector<int> slice_indices;
  for (const Device& d : devices) slice_indices.push_back(d.slice_index);
  std::sort(slice_indices.begin(), slice_indices.end());
  const auto num_slices =
      std::unique(slice_indices.begin(), slice_indices.end()) -
      slice_indices.begin();
  DeviceMesh mesh;
  // A DCN shape other than all ones on one slice goes through the hybrid
  // path too, so that it fails with the slice-count message.
  if (num_slices > 1 || Product(dcn) != 1) {
    ASSIGN_OR_RETURN(mesh, CreateHybridDeviceMesh(ici, dcn, devices));
  } else {
    ASSIGN_OR_RETURN(mesh, CreateDeviceMesh(ici, devices));
  }
  mesh.axis_names.assign(kAxisNames.begin(), kAxisNames.end());
  return mesh;
}

namespace {

// numpy's array2string for an int array with str()'s options: separator
// " ", line width 75, and above 1000 elements only the first and last 3
// items of each longer axis with "..." between them.
class NumpyIntArrayPrinter {
 public:
  NumpyIntArrayPrinter(const std::vector<int>& shape,
                       const std::vector<int>& values)
      : shape_(shape), values_(values), strides_(shape.size(), 1) {
    for (size_t i = shape.size(); i-- > 1;) {
      strides_[i - 1] = strides_[i] * shape[i];
    }
    summarize_ = values.size() > kSummaryThreshold;
    width_ = 1;
    MeasureShown(0, 0);
  }

  std::string Print() const {
    // The first line's indent is the bracket itself, hence one space.
    return Recurse(0, 0, " ", kLineWidth);
  }

 private:
  static constexpr size_t kSummaryThreshold = 1000;
  static constexpr int kEdgeItems = 3;
  static constexpr int kLineWidth = 75;

  bool Summarized(size_t axis) const {
    return summarize_ && 2 * kEdgeItems < shape_[axis];
  }

  // The indices of `axis` that are printed, in order; -1 stands for "...".
  std::vector<int> ShownIndices(size_t axis) const {
    std::vector<int> shown;
    const int n = shape_[axis];
    if (Summarized(axis)) {
      for (int i = 0; i < kEdgeItems; ++i) shown.push_back(i);
      shown.push_back(-1);
      for (int i = n - kEdgeItems; i < n; ++i) shown.push_back(i);
    } else {
      for (int i = 0; i < n; ++i) shown.push_back(i);
    }
    return shown;
  }

  // numpy sizes every field to the widest of the elements it shows.
  void MeasureShown(size_t axis, int64_t offset) {
    if (axis == shape_.size()) {
      width_ = std::max(
          width_, static_cast<int>(std::to_string(values_[offset]).size()));
      return;
    }
    for (int i : ShownIndices(axis)) {
      if (i >= 0) MeasureShown(axis + 1, offset + i * strides_[axis]);
    }
  }

  std::string Element(int64_t offset) const {
    std::string text = std::to_string(values_[offset]);
    return std::string(width_ - text.size(), ' ') + text;
  }

  // numpy's _extendLine: starts a new line when the word would pass the
  // width, unless the line holds nothing but its indent.
  static void ExtendLine(std::string& text, std::string& line,
                         const std::string& word, int line_width,
                         const std::string& indent) {
    const bool needs_wrap =
        static_cast<int>(line.size() + word.size()) > line_width &&
        line.size() > indent.size();
    if (needs_wrap) {
      line.erase(line.find_last_not_of(' ') + 1);
      text += line + "\n";
      line = indent;
    }
    line += word;
  }

  std::string Recurse(size_t axis, int64_t offset, const std::string& indent,
                      int width) const {
    const std::string next_indent = indent + " ";
    const int next_width = width - 1;  // room for this level's "]"
    const std::vector<int> shown = ShownIndices(axis);
    const size_t axes_left = shape_.size() - axis;
    std::string text;
    if (axes_left == 1) {
      const int element_width = width - 1;
      std::string line = indent;
      for (size_t k = 0; k < shown.size(); ++k) {
        const std::string word =
            shown[k] < 0 ? std::string("...") : Element(offset + shown[k]);
        ExtendLine(text, line, word, element_width, indent);
        if (k + 1 < shown.size()) line += " ";
      }
      text += line;
    } else {
      const std::string line_separator(axes_left - 1, '\n');
      for (size_t k = 0; k < shown.size(); ++k) {
        text += indent;
        text += shown[k] < 0
                    ? std::string("...")
                    : Recurse(axis + 1, offset + shown[k] * strides_[axis],
                              next_indent, next_width);
        if (k + 1 < shown.size()) text += line_separator;
      }
    }
    return "[" + text.substr(indent.size()) + "]";
  }

  const std::vector<int>& shape_;
  const std::vector<int>& values_;
  std::vector<int64_t> strides_;
  bool summarize_ = false;
  int width_ = 1;
};

}  // namespace

std::string FormatDeviceArray(const DeviceMesh& mesh) {
  if (mesh.device_ids.empty()) return "[]";
  if (mesh.shape.empty()) return std::to_string(mesh.device_ids.front());
  return NumpyIntArrayPrinter(mesh.shape, mesh.device_ids).Print();
}

}  // namespace multislice::mesh
