#include "train/reporter.h"

#include <algorithm>
#include <cstdio>

#include "train/goodput.h"
#include "train/prometheus_file.h"

namespace multislice::train {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

double UnixNow() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Reporter::Reporter(const TrainerOptions& options, double flops_per_step,
                   double tokens_per_step, int attempt)
    : options_(options),
      flops_per_step_(flops_per_step),
      tokens_per_step_(tokens_per_step),
      attempt_(attempt) {}

Status Reporter::Open(const std::string& run_dir) {
  ASSIGN_OR_RETURN(metrics_, MetricsWriter::Open(run_dir));
  run_dir_ = run_dir;
  auto records = MetricsWriter::ReadAll(metrics_->path());
  if (records.ok()) history_ = std::move(*records);
  resume_ = NextResumeIndex(history_);
  return OkStatus();
}

Status Reporter::Step(const StepRecord& r, int64_t first_step,
                      TrainSummary* summary) {
  const double tflops = flops_per_step_ / r.seconds / 1e12;
  const double mfu =
      options_.peak_flops_per_device > 0
          ? flops_per_step_ / r.seconds / options_.peak_flops_per_device
          : 0;
  const double now = UnixNow();
  const double goodput = RollingGoodput(r, first_step, now);
  Status written;
  if (metrics_) {
    written =
        metrics_->Write(Record(r, first_step, now, tflops, mfu, goodput))
            .WithContext("the metrics record of step " +
                         std::to_string(r.step) + " could not be written");
  }
  WritePrometheus(r, mfu, goodput);
  const auto x = static_cast<double>(r.step);
  train_points_.emplace_back(x, r.loss);
  if (r.val_loss) val_points_.emplace_back(x, *r.val_loss);

  summary->last_step = r.step;
  summary->final_loss = r.loss;
  summary->losses.push_back(r.loss);
  if (r.val_loss) summary->final_val_loss = *r.val_loss;
  if (r.step > first_step) {
    later_seconds_ += r.seconds;
    later_tokens_ += tokens_per_step_ * r.trained_share;
    later_mfu_ += mfu;
    ++later_steps_;
    summary->mean_step_seconds = later_seconds_ / later_steps_;
    summary->mean_mfu = later_mfu_ / later_steps_;
    summary->tokens_per_second = later_tokens_ / later_seconds_;
  }
  if (r.step == first_step) {
    first_step_start_ =
        Clock::now() - std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(r.seconds));
  }
  if (!options_.quiet) Print(r, first_step, tflops, mfu, goodput);
  PrintStragglers(r);
  return written;
}

// The step's metrics.jsonl record (metrics.h), `now` its time.
nlohmann::json Reporter::Record(const StepRecord& r, int64_t first_step,
                                double now, double tflops, double mfu,
                                double goodput) const {
  nlohmann::json record = {
      {"step", r.step},
      {"loss", r.loss},
      {"lr", r.lr},
      {"grad_norm", r.grad_norm},
      {"step_time_s", r.seconds},
      {"tokens_per_s", tokens_per_step_ * r.trained_share / r.seconds},
      {"tflops_per_device", tflops},
      {"attempt", attempt_},
      {kResumeField, resume_},
      {"time", now}};
  if (mfu > 0) record["mfu"] = mfu;
  if (r.val_loss) record["val_loss"] = *r.val_loss;
  record["dcn_bytes"] = r.dcn_bytes;
  if (r.pipeline_bubble) {
    record["pipeline_seconds"] = *r.pipeline_seconds;
    record["pipeline_bubble"] = *r.pipeline_bubble;
  }
  record[kDataWaitField] = r.data_wait_seconds;
  record[kCheckpointBlockField] = r.checkpoint_seconds;
  record[kGoodputField] = goodput;
  if (!r.stragglers.empty()) {
    nlohmann::json stragglers = nlohmann::json::array();
    for (const StragglerScore& s : r.stragglers) {
      stragglers.push_back(s.ToJson());
    }
    record["stragglers"] = stragglers;
  }
  if (r.step == first_step && start_times_.start_time > 0) {
    const StartTimes& t = start_times_;
    record[kStartTimeField] = t.start_time;
    record[kRuntimeInitField] = t.runtime_init_seconds;
    record[kRestoreField] = t.restore_seconds;
    record[kTrainingPrepField] =
        std::max(0.0, now - r.seconds - t.start_time - t.runtime_init_seconds -
                          t.restore_seconds);
  }
  return record;
}

// Productive seconds over the wall seconds since the run's first start:
// the earlier starts' steps kept, then this start's step times without
// their data wait; its first step counts once the second says what a
// normal step takes, for no more than that (goodput.h's PROGRAM_STARTUP).
double Reporter::RollingGoodput(const StepRecord& r, int64_t first_step,
                                double now) {
  const double compute = std::max(0.0, r.seconds - r.data_wait_seconds);
  if (r.step == first_step) {
    first_compute_ = compute;
    const double start =
        start_times_.start_time > 0 ? start_times_.start_time : now - r.seconds;
    if (run_start_ <= 0 || start < run_start_) run_start_ = start;
  } else if (r.step == first_step + 1) {
    productive_ += std::min(first_compute_, compute) + compute;
  } else {
    productive_ += compute;
  }
  const double wall = now - run_start_;
  if (!(wall > 0)) return 0;
  return std::min(1.0, (earlier_productive_ + productive_) / wall);
}

// Rewrites prometheus_metrics_file, if set; a failure is a warning, said
// once until a write works again.
void Reporter::WritePrometheus(const StepRecord& r, double mfu,
                               double goodput) {
  dcn_bytes_total_ += r.dcn_bytes;
  const std::string& path = options_.config.prometheus_metrics_file;
  if (path.empty()) return;
  TrainingSample sample;
  sample.step = r.step;
  sample.loss = r.loss;
  sample.learning_rate = r.lr;
  sample.grad_norm = r.grad_norm;
  sample.step_seconds = r.seconds;
  sample.tokens_per_second = tokens_per_step_ * r.trained_share / r.seconds;
  sample.mfu = mfu;
  sample.goodput = goodput;
  sample.step_dcn_bytes = r.dcn_bytes;
  sample.dcn_bytes_total = dcn_bytes_total_;
  const Status s = WritePrometheusFile(
      path, FormatTrainingMetrics(options_.config.run_name, sample));
  if (!s.ok() && !prometheus_failing_) {
    std::fprintf(stderr,
                 "multislice train: warning: %s; training goes on (said "
                 "again only after a write has worked)\n",
                 s.message().c_str());
  }
  prometheus_failing_ = !s.ok();
}

Status Reporter::SyncMetrics() {
  if (!metrics_) return OkStatus();
  return metrics_->Sync().WithContext("the metrics could not be saved");
}

// One line on stderr for each straggler, quiet or not: a log line.
void Reporter::PrintStragglers(const StepRecord& r) const {
  for (const StragglerScore& s : r.stragglers) {
    std::fprintf(stderr,
                 "multislice train: straggler after step %lld: %s on %s "
                 "computes %.3f s a step, %.2f of the fastest worker's speed "
                 "and %.2f of its own best\n",
                 static_cast<long long>(r.step), s.worker.c_str(),
                 s.host.c_str(), s.seconds, s.relative, s.individual);
  }
}

void Reporter::Print(const StepRecord& r, int64_t first_step, double tflops,
                     double mfu, double goodput) {
  const TrainConfig& c = options_.config;
  const bool log =
      r.step % c.log_period == 0 || r.step == c.steps || r.val_loss;
  std::string line;
  if (log) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "step %lld/%d  loss %.4f  lr %.2e  norm %.3f  %.3f s  "
                  "%.0f tokens/s  %.3f TFLOP/s",
                  static_cast<long long>(r.step), c.steps, r.loss, r.lr,
                  r.grad_norm, r.seconds,
                  tokens_per_step_ * r.trained_share / r.seconds, tflops);
    line = buf;
    if (mfu > 0) {
      // Above 100 %: the start-up peak was measured low; say so.
      std::snprintf(buf, sizeof buf, "  MFU %.1f%%%s", 100 * mfu,
                    mfu > 1 ? " (above the measured peak)" : "");
      line += buf;
    }
    if (r.val_loss) {
      std::snprintf(buf, sizeof buf, "  val_loss %.4f", *r.val_loss);
      line += buf;
    }
    std::snprintf(buf, sizeof buf, "  goodput %.1f%%", 100 * goodput);
    line += buf;
    for (const StragglerScore& s : r.stragglers) {
      line += "  STRAGGLER " + s.worker;
    }
    if (!options_.show_progress && r.step < c.steps) {
      // Without a terminal's progress bar, each line says how long the
      // rest will take at the pace so far (evaluations and checkpoints
      // included).
      const double per_step = SecondsSince(first_step_start_) /
                              static_cast<double>(r.step - first_step + 1);
      line += "  ETA " +
              FormatDuration(per_step * static_cast<double>(c.steps - r.step));
    }
  }
  if (options_.show_progress) {
    if (!log && SecondsSince(last_bar_) < 0.2 && r.step != c.steps) return;
    last_bar_ = Clock::now();
    std::printf("\r\033[K%s%s%s", line.c_str(), log ? "\n" : "",
                ProgressBar(r.step, c.steps, SecondsSince(start_), 30).c_str());
    if (r.step == c.steps) std::printf("\n");
  } else if (log) {
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void Reporter::Plot() {
  // No points (a finished run whose metrics.jsonl is gone): keep the plot.
  if (run_dir_.empty() || (train_points_.empty() && val_points_.empty())) {
    return;
  }
  Status s =
      WriteLossPlotSvg(run_dir_ + "/loss.svg", train_points_, val_points_,
                       "multislice train: " + options_.config.run_name);
  // The plot is redrawn from the points at the next evaluation: a failure
  // costs no data, so it is a warning and training goes on.
  if (!s.ok()) {
    std::fprintf(stderr, "multislice train: warning: %s\n",
                 s.message().c_str());
  }
}

void Reporter::LoadHistory(int64_t up_to_step) {
  earlier_productive_ = ProductiveSecondsUpTo(history_, up_to_step);
  if (auto span = RecordSpan(history_)) run_start_ = span->first;
  for (const nlohmann::json& r : CurrentStepRecords(history_)) {
    const int64_t step = r.value("step", int64_t{-1});
    if (step < 1 || step > up_to_step) continue;
    const auto x = static_cast<double>(step);
    if (r.contains("loss") && r["loss"].is_number()) {
      train_points_.emplace_back(x, r["loss"].get<double>());
    }
    if (r.contains("val_loss") && r["val_loss"].is_number()) {
      val_points_.emplace_back(x, r["val_loss"].get<double>());
    }
  }
  history_.clear();
}

}  // namespace multislice::train
