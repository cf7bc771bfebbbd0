#include "runtime/trace.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/json_file.h"

namespace multislice::runtime {

int64_t Trace::NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Trace::Add(int device, Track track, std::string name, int64_t start_us,
                int64_t end_us) {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back({device, track, std::move(name), start_us, end_us});
}

void Trace::NameDevice(int device, std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  device_names_.push_back({device, std::move(name)});
}

size_t Trace::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_.size();
}

Status Trace::WriteJson(const std::string& path) const {
  nlohmann::json events = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(mu_);
    static const char* kTrackNames[] = {"compute", "ICI", "DCN"};
    for (const auto& [device, name] : device_names_) {
      events.push_back({{"name", "process_name"},
                        {"ph", "M"},
                        {"pid", device},
                        {"args", {{"name", name}}}});
      events.push_back({{"name", "process_sort_index"},
                        {"ph", "M"},
                        {"pid", device},
                        {"args", {{"sort_index", device}}}});
      for (int t = 0; t < 3; ++t) {
        events.push_back({{"name", "thread_name"},
                          {"ph", "M"},
                          {"pid", device},
                          {"tid", t},
                          {"args", {{"name", kTrackNames[t]}}}});
      }
    }
    for (const Span& s : spans_) {
      events.push_back({{"name", s.name},
                        {"ph", "X"},
                        {"pid", s.device},
                        {"tid", static_cast<int>(s.track)},
                        {"ts", s.start_us},
                        {"dur", std::max<int64_t>(s.end_us - s.start_us, 0)}});
    }
  }
  return WriteJsonFile(
      path, nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}},
      "trace file");
}

}  // namespace multislice::runtime
