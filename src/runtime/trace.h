// A timeline of what each device did, written as a Chrome trace (JSON, opens
// in Perfetto or chrome://tracing): one process row per device, with one
// track each for compute, ICI and DCN spans, and two for checkpoints (the
// copy-out, and the host's writing on its first device's row).
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

enum class Track {
  kCompute = 0,
  kIci = 1,
  kDcn = 2,
  kCheckpoint = 3,       // a save's copy-out on the device thread
  kCheckpointWrite = 4,  // its writing, in the background
};

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

// The trace the calling thread records into and its device: set by a
// device thread for the steps it traces (null: none), read by the compute
// spans below and by the collectives it launches.
void SetThreadTrace(Trace* trace, int device);
Trace* ThreadTrace();
int ThreadTraceDevice();

// Consecutive compute spans inside one enclosing span, on the calling
// thread's trace (nothing at all without one): e.g. a layer's forward,
//   OpSpans ops("layer", 3, "forward");  // span "layer 3 forward"
//   ops.Next("ln1"); ...; ops.Next("qkv"); ...   // "layer 3 forward/ln1"
// Next ends the op before; the destructor ends the last and the scope.
class OpSpans {
 public:
  OpSpans(const char* what, int index, const char* phase);
  ~OpSpans();
  void Next(const char* op);
  OpSpans(const OpSpans&) = delete;
  OpSpans& operator=(const OpSpans&) = delete;

 private:
  void EndOp(int64_t now);
  Trace* const trace_;
  const int device_;
  std::string scope_;
  int64_t scope_start_ = 0;
  std::string op_;
  int64_t op_start_ = 0;
};

}  // namespace multislice::runtime
