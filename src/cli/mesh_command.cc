// `multislice mesh`: the device mesh that a parallelism configuration gives
// on an accelerator type and a number of slices, as JAX and MaxText would
// build it. It only plans (nothing runs).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "common/status.h"
#include "runtime/mesh/device_mesh.h"
#include "runtime/mesh/parallelism.h"
#include "runtime/mesh/topology.h"

namespace multislice::cli {
namespace {

// The most slices one queued resource may hold.
constexpr int kMaxSlices = 256;

struct MeshOptions {
  std::string accelerator_type;  // empty: cpu-N from the ICI values
  int num_slices = 1;
  mesh::ParallelismConfig parallelism;
  bool json = false;
};

struct MeshPlan {
  mesh::AcceleratorType type;
  int num_slices = 0;
  mesh::ParallelismConfig resolved;
  std::vector<mesh::Device> devices;
  mesh::DeviceMesh mesh;
};

Result<MeshPlan> Plan(const MeshOptions& options) {
  if (options.num_slices < 1 || options.num_slices > kMaxSlices) {
    return InvalidArgument("--num_slices must be from 1 to " +
                           std::to_string(kMaxSlices) + ", got " +
                           std::to_string(options.num_slices));
  }
  std::string type_name = options.accelerator_type;
  if (type_name.empty()) {
    // Default: one CPU device per ICI position, when the ICI values say how
    // many that is.
    RETURN_IF_ERROR(mesh::CheckParallelismValues(options.parallelism));
    long long devices = 1;
    for (int value : options.parallelism.ici) {
      if (value == -1) {
        return InvalidArgument(
            "--accelerator_type is required when an ICI parallelism value is "
            "-1 (for example --accelerator_type cpu-8)");
      }
      devices = std::min<long long>(devices * value, 1LL << 40);
    }
    type_name = "cpu-" + std::to_string(devices);
  }
  MeshPlan plan;
  ASSIGN_OR_RETURN(plan.type, mesh::ParseAcceleratorType(type_name));
  plan.num_slices = options.num_slices;
  ASSIGN_OR_RETURN(plan.resolved,
                   mesh::ResolveParallelism(options.parallelism,
                                            plan.type.devices_per_slice(),
                                            options.num_slices));
  plan.devices = mesh::MakeDevices(plan.type, options.num_slices);
  ASSIGN_OR_RETURN(plan.mesh, mesh::MeshForConfig(plan.resolved, plan.devices));
  return plan;
}

// "(1, 2, 1, 4, 1)" and "('diloco', 'data', 'stage', 'fsdp', 'tensor')":
// Python's tuple repr.
std::string Tuple(const std::vector<std::string>& items) {
  std::string text = "(";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) text += ", ";
    text += items[i];
  }
  if (items.size() == 1) text += ",";
  return text + ")";
}

std::string PrintText(const MeshPlan& plan) {
  std::string text = "Devices: [";
  for (size_t i = 0; i < plan.devices.size(); ++i) {
    if (i > 0) text += ", ";
    text += mesh::ToString(plan.devices[i], plan.type);
  }
  text += "] (num_devices: " + std::to_string(plan.devices.size()) + ")\n";
  std::vector<std::string> names;
  for (const std::string& name : plan.mesh.axis_names) {
    names.push_back("'" + name + "'");
  }
  text += "Axis names: " + Tuple(names) + "\n";
  std::vector<std::string> sizes;
  for (int size : plan.mesh.shape) sizes.push_back(std::to_string(size));
  text += "Mesh shape: " + Tuple(sizes) + "\n";
  text += "Device ids:\n" + mesh::FormatDeviceArray(plan.mesh) + "\n";
  return text;
}

// The device ids as nested lists, one level per mesh axis.
nlohmann::ordered_json NestedIds(const mesh::DeviceMesh& m, size_t axis,
                                 size_t offset, size_t stride) {
  if (axis == m.shape.size()) return m.device_ids[offset];
  const size_t inner = stride / m.shape[axis];
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (int i = 0; i < m.shape[axis]; ++i) {
    list.push_back(NestedIds(m, axis + 1, offset + i * inner, inner));
  }
  return list;
}

std::string PrintJson(const MeshPlan& plan) {
  nlohmann::ordered_json out;
  out["accelerator_type"] = plan.type.name;
  out["num_slices"] = plan.num_slices;
  out["axis_names"] = plan.mesh.axis_names;
  out["shape"] = plan.mesh.shape;
  out["ici_parallelism"] = plan.resolved.ici;
  out["dcn_parallelism"] = plan.resolved.dcn;
  out["device_ids"] = NestedIds(plan.mesh, 0, 0, plan.mesh.device_ids.size());
  nlohmann::ordered_json devices = nlohmann::ordered_json::array();
  for (const mesh::Device& d : plan.devices) {
    devices.push_back({{"id", d.id},
                       {"slice_index", d.slice_index},
                       {"host", d.host},
                       {"local_index", d.local_index}});
  }
  out["devices"] = std::move(devices);
  return out.dump() + "\n";
}

int RunMesh(const MeshOptions& options) {
  Result<MeshPlan> plan = Plan(options);
  if (!plan.ok()) {
    std::fprintf(stderr, "multislice mesh: %s\n",
                 plan.status().message().c_str());
    return ExitCodeFor(plan.status());
  }
  const std::string text = options.json ? PrintJson(*plan) : PrintText(*plan);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace

void AddMeshCommand(CLI::App& root, CommandTable& table) {
  auto options = std::make_shared<MeshOptions>();
  CLI::App* mesh_app = root.add_subcommand(
      "mesh",
      "Print the device mesh of a parallelism configuration, as JAX and "
      "MaxText build it: the ici_* values multiply to the devices per slice, "
      "the dcn_* values to the number of slices, and at most one value per "
      "level may be -1.");
  mesh_app->footer(
      "Example:\n"
      "  multislice mesh --accelerator_type cpu-4 --num_slices 2 "
      "--dcn_data_parallelism 2 --ici_fsdp_parallelism 4\n"
      "  multislice mesh --accelerator_type v4-16 --num_slices 4 "
      "--dcn_data_parallelism -1 --ici_fsdp_parallelism -1 --json");
  AddStringFlag(mesh_app, "accelerator_type", &options->accelerator_type,
                "v4-N, v5p-N, v5litepod-N, v6e-N (TPU) or "
                "cpu-N (CPU devices); default cpu-N with N the product of "
                "the ICI values (required when one of them is -1).");
  AddIntFlag(mesh_app, "num_slices", &options->num_slices,
             "Number of slices, all of the accelerator type.");
  AddParallelismFlags(mesh_app, &options->parallelism);
  AddBoolFlag(mesh_app, "json", &options->json,
              "Print one JSON object: accelerator_type, num_slices, "
              "axis_names, shape, device_ids, devices.");
  table[mesh_app] = [options] { return RunMesh(*options); };
}

}  // namespace multislice::cli
