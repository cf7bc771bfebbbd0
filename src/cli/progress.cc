#include "cli/progress.h"

#include "train/metrics.h"

namespace multislice::cli {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

Progress::Progress(Options options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

Progress::~Progress() { Stop(); }

void Progress::Phase(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  phase_ = what;
  phase_start_ = Clock::now();
  EmitLocked();
}

void Progress::UpdatePhase(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  phase_ = what;
  EmitLocked();
}

void Progress::StartSteps(int total, int warmup) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  phase_.clear();
  total_ = total;
  warmup_ = warmup;
  done_ = 0;
  phase_start_ = Clock::now();
  EmitLocked();
}

void Progress::StepDone(int done, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  done_ = done;
  last_step_seconds_ = seconds;
  if (done > warmup_) timed_seconds_ += seconds;
  // Without a terminal, one line a second at most, and the last step.
  if (options_.in_place || done == total_ ||
      Seconds(Clock::now() - last_line_) >= 1.0) {
    EmitLocked();
  }
}

void Progress::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    if (options_.in_place) {
      std::fputs("\r\033[K", options_.out);
      std::fflush(options_.out);
    }
  }
  wake_.notify_all();
  thread_.join();
}

std::string Progress::Text() const {
  std::lock_guard<std::mutex> lock(mu_);
  return TextLocked();
}

std::string Progress::TextLocked() const {
  const double elapsed = Seconds(Clock::now() - start_);
  std::string text;
  if (!phase_.empty() || total_ == 0) {
    text = phase_ + ", " +
           train::FormatDuration(Seconds(Clock::now() - phase_start_));
  } else {
    const bool running = done_ < total_;
    text = "step " + std::to_string(running ? done_ + 1 : done_) + "/" +
           std::to_string(total_) + (running ? " running" : " done");
    if (done_ > 0) {
      char last[48];
      std::snprintf(last, sizeof last, ", last step %.2f s",
                    last_step_seconds_);
      text += last;
    }
    const int timed = done_ - warmup_;
    if (running && timed > 0) {
      // The pace of the timed steps so far, for the steps left.
      text += ", ETA " +
              train::FormatDuration(timed_seconds_ / timed * (total_ - done_));
    }
  }
  return text + " (" + train::FormatDuration(elapsed) + " since start)";
}

void Progress::EmitLocked() {
  const std::string prefix =
      options_.prefix.empty() ? "" : options_.prefix + ": ";
  if (options_.in_place) {
    std::fprintf(options_.out, "\r\033[K%s%s", prefix.c_str(),
                 TextLocked().c_str());
  } else {
    std::fprintf(options_.out, "%s%s\n", prefix.c_str(), TextLocked().c_str());
  }
  std::fflush(options_.out);
  last_line_ = Clock::now();
}

void Progress::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  const double wait =
      options_.in_place ? options_.redraw_seconds : options_.quiet_seconds / 4;
  while (!stopped_) {
    wake_.wait_for(lock, std::chrono::duration<double>(wait));
    if (stopped_) break;
    if (options_.in_place ||
        Seconds(Clock::now() - last_line_) >= options_.quiet_seconds) {
      EmitLocked();
    }
  }
}

}  // namespace multislice::cli
