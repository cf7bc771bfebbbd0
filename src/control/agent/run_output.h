// The local side of `multislice run`, the same whichever way the workers
// are reached (their agents: runner.cc; the steps of a Slurm job:
// cli/run_over_slurm.cc):
//  - each worker's output file, <output_dir>/<run_name>/
//    output_slice_SSSS_worker_WWWW.txt (slice = node index), created empty
//    when the commands start, in a folder holding pack.h's marker so that
//    it is never packed;
//  - slice 0 worker 0's output echoed to `out`;
//  - `Completed c/t, slice S worker W still working...` on `err` while the
//    commands run (redrawn in place on a terminal, else every
//    progress_interval), and the closing line: every worker succeeded, one
//    failed (and how many others were stopped), or Ctrl-C;
//  - two helpers both paths use (LastLine, ReadFileFrom).
//
// Thread-safety: one thread uses a RunOutput.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "control/agent/runner.h"

namespace multislice::control {

struct RunWorker {
  int slice = 0;   // the node index
  int worker = 0;  // TPU_WORKER_ID
};

// "slice S worker W".
std::string RunWorkerLabel(const RunWorker& w);

// The last non-empty line of `text`, for one-line error messages.
std::string LastLine(std::string text);

// The bytes of the file `path` from `offset` on ("" when it cannot be
// read).
std::string ReadFileFrom(const std::string& path, size_t offset = 0);

class RunOutput {
 public:
  // Keeps a reference to `options` (out, err, terminal, output_dir,
  // run_name, progress_interval).
  explicit RunOutput(const RunOptions& options);
  ~RunOutput();
  RunOutput(const RunOutput&) = delete;
  RunOutput& operator=(const RunOutput&) = delete;

  // <output_dir>/<run_name> (just <run_name> when output_dir is ".").
  const std::string& dir() const { return dir_; }
  // Creates dir() with pack.h's marker in it.
  Status MarkFolder();
  // Creates (truncates) the output file of each of `workers`; worker i of
  // this list is the one Write(i, ...) writes for.
  Status Open(const std::vector<RunWorker>& workers);
  const std::vector<RunWorker>& workers() const { return workers_; }

  // Appends `bytes` to worker i's file (flushed), and to `out` for slice 0
  // worker 0.
  void Write(size_t i, std::string_view bytes);
  // The progress line, naming worker `waiting` (an index), at most every
  // progress_interval (5 times a second on a terminal, and never over a
  // line of the echo that has not ended).
  void ShowProgress(size_t completed, size_t waiting);
  void ClearProgress();
  // "multislice run: LINE" on `err`, the progress line cleared first.
  void Say(const std::string& line);

  // The closing lines; each returns the run's exit code.
  // "completed t/t, every worker exited with code 0": 0.
  int Succeeded();
  // Worker i failed with `exit_code`; `stopped` others were stopped.
  int Failed(size_t i, int exit_code, size_t stopped);
  // Ctrl-C; `stopped` workers' commands were stopped (0: none had started):
  // 130.
  int Interrupted(size_t stopped);

 private:
  const RunOptions& options_;
  std::string dir_;
  std::vector<RunWorker> workers_;
  std::vector<FILE*> files_;
  std::chrono::steady_clock::time_point last_progress_{};
  bool progress_shown_ = false;
  bool echo_mid_line_ = false;  // the echo's last byte was not a newline
};

}  // namespace multislice::control
