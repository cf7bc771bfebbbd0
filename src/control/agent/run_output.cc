#include "control/agent/run_output.h"

#include <fstream>
#include <sstream>

#include "control/agent/pack.h"

namespace multislice::control {

using std::chrono::milliseconds;

std::string LastLine(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) {
    text.pop_back();
  }
  const size_t nl = text.rfind('\n');
  return nl == std::string::npos ? text : text.substr(nl + 1);
}

std::string ReadFileFrom(const std::string& path, size_t offset) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string RunWorkerLabel(const RunWorker& w) {
  return "slice " + std::to_string(w.slice) + " worker " +
         std::to_string(w.worker);
}

RunOutput::RunOutput(const RunOptions& options)
    : options_(options),
      dir_(options.output_dir == "."
               ? options.run_name
               : options.output_dir + "/" + options.run_name) {}

RunOutput::~RunOutput() {
  for (FILE* f : files_) std::fclose(f);
}

Status RunOutput::MarkFolder() { return MarkOutputFolder(dir_); }

Status RunOutput::Open(const std::vector<RunWorker>& workers) {
  RETURN_IF_ERROR(MarkFolder());
  for (const RunWorker& w : workers) {
    char name[64];
    std::snprintf(name, sizeof name, "/output_slice_%04d_worker_%04d.txt",
                  w.slice, w.worker);
    FILE* f = std::fopen((dir_ + name).c_str(), "wb");
    if (f == nullptr) return Internal("cannot write " + dir_ + name);
    files_.push_back(f);
    workers_.push_back(w);
  }
  return OkStatus();
}

void RunOutput::Write(size_t i, std::string_view bytes) {
  if (bytes.empty() || i >= files_.size()) return;
  std::fwrite(bytes.data(), 1, bytes.size(), files_[i]);
  std::fflush(files_[i]);
  if (workers_[i].slice == 0 && workers_[i].worker == 0) {
    ClearProgress();
    std::fwrite(bytes.data(), 1, bytes.size(), options_.out);
    std::fflush(options_.out);
    echo_mid_line_ = bytes.back() != '\n';
  }
}

void RunOutput::ShowProgress(size_t completed, size_t waiting) {
  const auto now = std::chrono::steady_clock::now();
  const milliseconds every =
      options_.terminal ? milliseconds(200) : options_.progress_interval;
  if (last_progress_ == std::chrono::steady_clock::time_point{}) {
    last_progress_ = now;  // the first line after one interval
  }
  if (now - last_progress_ < every || (options_.terminal && echo_mid_line_) ||
      waiting >= workers_.size()) {
    return;
  }
  last_progress_ = now;
  std::fprintf(options_.err,
               "%sCompleted %zu/%zu, slice %d worker %d still working...%s",
               options_.terminal ? "\r\33[K" : "", completed, workers_.size(),
               workers_[waiting].slice, workers_[waiting].worker,
               options_.terminal ? "" : "\n");
  std::fflush(options_.err);
  progress_shown_ = options_.terminal;
}

void RunOutput::ClearProgress() {
  if (!progress_shown_) return;
  std::fputs("\r\33[K", options_.err);
  std::fflush(options_.err);
  progress_shown_ = false;
}

void RunOutput::Say(const std::string& line) {
  ClearProgress();
  std::fprintf(options_.err, "multislice run: %s\n", line.c_str());
  std::fflush(options_.err);
}

int RunOutput::Succeeded() {
  const std::string total = std::to_string(workers_.size());
  Say("completed " + total + "/" + total +
      ", every worker exited with code 0 (output in " + dir_ + "/)");
  return 0;
}

int RunOutput::Failed(size_t i, int exit_code, size_t stopped) {
  Say(RunWorkerLabel(workers_[i]) + " failed with exit code " +
      std::to_string(exit_code) + "; stopped the " + std::to_string(stopped) +
      " other workers still running (output in " + dir_ + "/)");
  return exit_code;
}

int RunOutput::Interrupted(size_t stopped) {
  Say(stopped > 0 ? "interrupted; stopped the commands of " +
                        std::to_string(stopped) + " workers"
                  : std::string("interrupted before the commands started"));
  return 130;
}

}  // namespace multislice::control
