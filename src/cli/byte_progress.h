// The progress line of `multislice export` and `multislice import`: bytes
// of a model file written or read, redrawn in place on a terminal at most
// four times a second, and only for files big enough to take a while
// (kMinBytes); off a terminal or with --json nothing is printed, so that a
// failure stays one line on stderr.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "cli/progress.h"
#include "runtime/launcher.h"

namespace multislice::cli {

class ByteProgressLine {
 public:
  static constexpr uint64_t kMinBytes = uint64_t{16} << 20;

  // `what`: "writing model.safetensors"; shown when total_bytes is at least
  // kMinBytes and stderr is a terminal (runtime::ShowProgress) unless json.
  ByteProgressLine(const char* prefix, std::string what, uint64_t total_bytes,
                   bool json)
      : what_(std::move(what)), total_(total_bytes) {
    if (json || total_bytes < kMinBytes || !runtime::ShowProgress()) return;
    line_.emplace(
        Progress::Options{.out = stderr, .in_place = true, .prefix = prefix});
  }

  void Update(uint64_t done) {
    if (!line_) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ &&
        std::chrono::duration<double>(now - last_).count() < 0.25) {
      return;
    }
    last_ = now;
    char text[200];
    std::snprintf(text, sizeof text, "%s: %.1f of %.1f MB (%.0f%%)",
                  what_.c_str(), static_cast<double>(done) / 1e6,
                  static_cast<double>(total_) / 1e6,
                  total_ == 0 ? 100.0 : 100.0 * done / total_);
    line_->Phase(text);
  }
  void Stop() {
    if (line_) line_->Stop();
  }

 private:
  const std::string what_;
  const uint64_t total_;
  std::optional<Progress> line_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace multislice::cli
