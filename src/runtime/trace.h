// A timeline of what each device did, written as a Chrome trace (JSON, opens
// in Perfetto or chrome://tracing): one process row per device, with one
// track each for compute, ICI and DCN spans.
//
// Times are wall-clock microseconds (system_clock), so the files that the
// workers of one job write line up when loaded together.
//
// Thread-safe: device threads and stream threads add spans concurrently.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace multislice::runtime {

enum class Track { kCompute = 0, kIci = 1, kDcn = 2 };

class Trace {
 public:
  static int64_t NowMicros();

  void Add(int device, Track track, std::string name, int64_t start_us,
           int64_t end_us);

  // Names a device's row, e.g. "device 3 (slice 1 worker 0)".
  void NameDevice(int device, std::string name);

  // Writes the trace to `path` (via a temporary file and a rename, so a
  // reader never sees half a file).
  Status WriteJson(const std::string& path) const;

  size_t size() const;

 private:
  struct Span {
    int device;
    Track track;
    std::string name;
    int64_t start_us, end_us;
  };
  mutable std::mutex mu_;
  std::vector<Span> spans_;
  std::vector<std::pair<int, std::string>> device_names_;
};

// Records one span from construction to destruction (when trace is set).
class ScopedSpan {
 public:
  ScopedSpan(Trace* trace, int device, Track track, std::string name)
      : trace_(trace),
        device_(device),
        track_(track),
        name_(std::move(name)),
        start_(trace ? Trace::NowMicros() : 0) {}
  ~ScopedSpan() {
    if (trace_)
      trace_->Add(device_, track_, std::move(name_), start_,
                  Trace::NowMicros());
  }
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

 private:
  Trace* trace_;
  int device_;
  Track track_;
  std::string name_;
  int64_t start_;
};

}  // namespace multislice::runtime
