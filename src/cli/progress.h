// Progress of a long command, so that no run waits in silence: on a
// terminal, one line redrawn in place about every second ("\r\033[K"); when
// the output is not a terminal, a line per step (at most one a second, the
// last step always) and a line whenever nothing has been said for
// `quiet_seconds` (4: never 5 s of silence). Every line names the phase or the
// step i/N, the time elapsed and, once a timed step has ended, the ETA of the
// rest.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

namespace multislice::cli {

class Progress {
 public:
  struct Options {
    FILE* out = stderr;
    bool in_place = false;  // a terminal: redraw one line
    std::string prefix;     // e.g. "shardings"
    double redraw_seconds = 1;
    // Not a terminal: a line when this long has passed without one (checked
    // every quiet_seconds / 4, so no silence lasts over 1.25 x this).
    double quiet_seconds = 4;
  };

  explicit Progress(Options options);
  ~Progress();  // Stop()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // A phase without steps begins, e.g. "measuring the matmul peak".
  void Phase(const std::string& what);
  // The current phase's line changes (a count in it, say) while the phase
  // goes on: its elapsed time keeps counting from its Phase.
  void UpdatePhase(const std::string& what);
  // The stepping phase begins: `total` steps, the first `warmup` of which
  // are untimed and left out of the ETA.
  void StartSteps(int total, int warmup);
  // Step `done` (1-based) ended after `seconds`.
  void StepDone(int done, double seconds);
  // Ends the reporting; an in-place line is cleared, so that what the
  // command prints next starts a clean line. Idempotent.
  void Stop();

  // The current line, without prefix or newline (for tests).
  std::string Text() const;

 private:
  using Clock = std::chrono::steady_clock;
  std::string TextLocked() const;
  void EmitLocked();
  void Loop();

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopped_ = false;
  std::string phase_;
  int total_ = 0, warmup_ = 0, done_ = 0;
  double timed_seconds_ = 0, last_step_seconds_ = 0;
  Clock::time_point start_ = Clock::now(), phase_start_ = start_;
  Clock::time_point last_line_ = start_;
  std::thread thread_;
};

}  // namespace multislice::cli
