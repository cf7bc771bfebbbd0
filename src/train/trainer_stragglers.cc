// Straggler scores (stragglers.h): every straggler_report_interval steps the
// devices' compute times meet in one all-reduce over the whole mesh, and
// the reporter scores the workers.
#include <algorithm>

#include "train/trainer_internal.h"

namespace multislice::train::internal {

Status Trainer::ScoreStragglers(Device& d, StepRecord& record) {
  std::vector<double>& mine = compute_seconds_[d.local];
  float median = 0;
  if (!mine.empty()) {
    std::nth_element(mine.begin(), mine.begin() + mine.size() / 2, mine.end());
    median = static_cast<float>(mine[mine.size() / 2]);
  }
  mine.clear();
  // Each device's slot, the others zero: the sum is everyone's times (a
  // lost slice's stay zero and are left out).
  std::vector<float> times;
  const std::vector<std::string>& all_axes = rt_.mesh().axis_names;
  const int device = rt_.local_devices()[d.local];
  RETURN_IF_ERROR(AcrossReplicas([&] {
    times.assign(num_devices_, 0.f);
    times[device] = median;
    return d.plan.collectives()
        .AllReduce(all_axes, times.data(), times.data(), times.size(),
                   runtime::DType::kF32, runtime::ReduceOp::kSum,
                   "compute-times")
        .Wait();
  }));
  if (!d.reporter_thread) return OkStatus();
  if (!stragglers_) {
    stragglers_ = std::make_unique<StragglerDetector>(
        StragglerLayout(), config_.straggler_relative_threshold,
        config_.straggler_individual_threshold);
  }
  for (const StragglerScore& s : stragglers_->Score(times)) {
    if (s.straggler) record.stragglers.push_back(s);
  }
  return OkStatus();
}

// Devices by worker, and by pipeline stage: the devices that do the same
// work.
DeviceLayout Trainer::StragglerLayout() {
  DeviceLayout layout;
  const mesh::DeviceMesh& mesh = rt_.mesh();
  const auto stage =
      std::find(mesh.axis_names.begin(), mesh.axis_names.end(), "stage");
  const int hosts = rt_.accelerator().hosts_per_slice();
  for (const mesh::Device& device : rt_.devices()) {
    layout.process_of_device.push_back(device.slice_index * hosts +
                                       device.host);
    int group = 0;
    if (auto coords = mesh.coords_of(device.id);
        coords.ok() && stage != mesh.axis_names.end()) {
      group = (*coords)[stage - mesh.axis_names.begin()];
    }
    layout.group_of_device.push_back(group);
  }
  for (int p = 0; p < rt_.process_count(); ++p) {
    layout.worker_names.push_back(runtime::WorkerName(p / hosts, p % hosts));
  }
  layout.hosts = rt_.process_hosts();
  return layout;
}

}  // namespace multislice::train::internal
