#include "train/stragglers.h"

#include <algorithm>
#include <map>

namespace multislice::train {

nlohmann::json StragglerScore::ToJson() const {
  return {{"worker", worker},           {"host", host},
          {"process", process},         {"compute_seconds", seconds},
          {"relative_score", relative}, {"individual_score", individual}};
}

StragglerDetector::StragglerDetector(DeviceLayout layout,
                                     double relative_threshold,
                                     double individual_threshold)
    : layout_(std::move(layout)),
      relative_threshold_(relative_threshold),
      individual_threshold_(individual_threshold),
      best_(layout_.worker_names.size(), 0) {}

std::vector<StragglerScore> StragglerDetector::Score(
    const std::vector<float>& seconds) {
  // Each worker's mean time in each group of devices.
  std::map<std::pair<int, int>, std::pair<double, int>> sums;  // (p, group)
  for (size_t d = 0; d < seconds.size(); ++d) {
    if (seconds[d] <= 0) continue;
    auto& [sum, n] =
        sums[{layout_.process_of_device[d], layout_.group_of_device[d]}];
    sum += seconds[d];
    ++n;
  }
  std::map<int, double> fastest;  // by group
  for (const auto& [key, sum] : sums) {
    const double mean = sum.first / sum.second;
    auto [it, added] = fastest.emplace(key.second, mean);
    if (!added) it->second = std::min(it->second, mean);
  }
  std::map<int, StragglerScore> workers;
  for (const auto& [key, sum] : sums) {
    const auto [p, group] = key;
    const double mean = sum.first / sum.second;
    StragglerScore& s = workers[p];
    s.process = p;
    s.seconds = std::max(s.seconds, mean);
    s.relative = std::min(s.relative, fastest[group] / mean);
  }
  std::vector<StragglerScore> scores;
  for (auto& [p, s] : workers) {
    best_[p] = best_[p] > 0 ? std::min(best_[p], s.seconds) : s.seconds;
    s.individual = best_[p] / s.seconds;
    s.worker = layout_.worker_names[p];
    s.host = layout_.hosts[p];
    s.straggler = s.relative < relative_threshold_ ||
                  s.individual < individual_threshold_;
    scores.push_back(s);
  }
  return scores;
}

}  // namespace multislice::train
