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
    static const char* kTrackNames[] = {
        "compute", "ICI", "DCN", "checkpoint copy-out", "checkpoint write"};
    for (const auto& [device, name] : device_names_) {
      events.push_back({{"name", "process_name"},
                        {"ph", "M"},
                        {"pid", device},
                        {"args", {{"name", name}}}});
      events.push_back({{"name", "process_sort_index"},
                        {"ph", "M"},
                        {"pid", device},
                        {"args", {{"sort_index", device}}}});
      for (int t = 0; t < 5; ++t) {
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

namespace {
thread_local Trace* thread_trace = nullptr;
thread_local int thread_trace_device = 0;
}  // namespace

void SetThreadTrace(Trace* trace, int device) {
  thread_trace = trace;
  thread_trace_device = device;
}
Trace* ThreadTrace() { return thread_trace; }
int ThreadTraceDevice() { return thread_trace_device; }

OpSpans::OpSpans(const char* what, int index, const char* phase)
    : trace_(thread_trace), device_(thread_trace_device) {
  if (!trace_) return;
  scope_ = std::string(what) + " " + std::to_string(index) + " " + phase;
  scope_start_ = Trace::NowMicros();
}

OpSpans::~OpSpans() {
  if (!trace_) return;
  const int64_t now = Trace::NowMicros();
  EndOp(now);
  trace_->Add(device_, Track::kCompute, std::move(scope_), scope_start_, now);
}

void OpSpans::Next(const char* op) {
  if (!trace_) return;
  const int64_t now = Trace::NowMicros();
  EndOp(now);
  op_ = scope_ + "/" + op;
  op_start_ = now;
}

void OpSpans::EndOp(int64_t now) {
  if (op_.empty()) return;
  trace_->Add(device_, Track::kCompute, std::move(op_), op_start_, now);
  op_.clear();
}

}  // namespace multislice::runtime
