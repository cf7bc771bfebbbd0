// `multislice goodput RUN_DIR [--window SECONDS] [--json]`: the goodput
// and badput buckets (train/goodput.h) of a `multislice train` run or of a
// `multislice job`'s directory, over the whole run or only its last
// SECONDS, while it runs or after.
//
// A run's span is its records' (train::RecordSpan: from the first start's
// runtime start-up to the end of the last step). A job's directory also
// holds goodput.json, written when the job ended: its start_time and
// end_time are the span instead, and its timeline (the queued resource's
// states) splits each recovery into detection, repair and restart; a plain
// run has no states, so its recoveries are "unsplit".
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "cli/commands.h"
#include "cli/flags.h"
#include "train/goodput.h"
#include "train/metrics.h"

namespace multislice::cli {
namespace {

using nlohmann::json;
constexpr char kName[] = "multislice goodput";

struct GoodputFlags {
  std::string run_dir;
  std::string window;  // seconds, empty: the whole run
  bool json = false;
};

// What goodput reads of a run directory.
struct RunInput {
  double start = 0, end = 0;
  std::vector<json> records;
  std::vector<train::StateObservation> states;
  bool job = false;  // goodput.json gave the span and the states
};

int Fail(const Status& s) {
  std::fprintf(stderr, "%s: %s\n", kName, s.message().c_str());
  return ExitCodeFor(s);
}

Result<std::optional<double>> ParseWindow(const std::string& text) {
  if (text.empty()) return std::optional<double>();
  char* end = nullptr;
  const double seconds = std::strtod(text.c_str(), &end);
  if (*end != '\0' || !std::isfinite(seconds) || seconds <= 0) {
    return InvalidArgument("--window: '" + text +
                           "' is not a number of seconds above 0");
  }
  return std::optional<double>(seconds);
}

// A job's goodput.json, if RUN_DIR has one with its span: the span and the
// queued resource's timeline.
void ReadJobReport(const std::string& run_dir, RunInput& in) {
  std::ifstream file(run_dir + "/goodput.json");
  if (!file) return;
  const json report = json::parse(file, nullptr, false);
  if (!report.is_object() || !report.contains("start_time") ||
      !report.contains("end_time")) {
    return;
  }
  in.start = report.value("start_time", in.start);
  in.end = report.value("end_time", in.end);
  in.job = true;
  for (const json& o : report.value("timeline", json::array())) {
    in.states.push_back(
        {o.value("time", 0.0), o.value("state", ""), o.value("attempt", 0)});
  }
}

Result<RunInput> ReadRun(const std::string& run_dir) {
  if (!std::filesystem::is_directory(run_dir)) {
    return InvalidArgument("RUN_DIR: '" + run_dir + "' is not a directory");
  }
  const std::string path = run_dir + "/" + train::kMetricsFileName;
  if (!std::filesystem::exists(path)) {
    return InvalidArgument(
        "RUN_DIR: '" + run_dir +
        "' has no metrics.jsonl; expected the directory of a train run "
        "(base_output_directory/run_name) or of a job");
  }
  RunInput in;
  ASSIGN_OR_RETURN(in.records, train::MetricsWriter::ReadAll(path));
  const auto span = train::RecordSpan(in.records);
  if (!span || !(span->second > span->first)) {
    return InvalidArgument("RUN_DIR: '" + run_dir +
                           "' has no step in metrics.jsonl yet");
  }
  std::tie(in.start, in.end) = *span;
  ReadJobReport(run_dir, in);
  return in;
}

void PrintBucket(const char* name, double seconds, double wall) {
  std::printf("  %-40s %10.2f s %6.1f %%\n", name, seconds,
              100 * seconds / wall);
}

void PrintText(const std::string& run_dir, const RunInput& in,
               const train::Goodput& g, std::optional<double> window) {
  const double run_seconds = in.end - in.start;
  if (window && g.wall_seconds < run_seconds) {
    std::printf("%s: %s, the last %.1f s of %.1f s: goodput %.1f %%\n", kName,
                run_dir.c_str(), g.wall_seconds, run_seconds, 100 * g.goodput);
  } else {
    std::printf("%s: %s, %.1f s: goodput %.1f %%\n", kName, run_dir.c_str(),
                g.wall_seconds, 100 * g.goodput);
  }
  PrintBucket("productive", g.productive_seconds, g.wall_seconds);
  for (int b = 0; b < train::kBadputCount; ++b) {
    const auto bucket = static_cast<train::Badput>(b);
    PrintBucket(train::BadputName(bucket), g.seconds(bucket), g.wall_seconds);
    if (bucket != train::Badput::kInfrastructureRecovery) continue;
    const train::RecoverySplit& r = g.recovery;
    if (r.unsplit_seconds > 0) {
      std::printf("    %.2f s unsplit (%s)\n", r.unsplit_seconds,
                  in.job ? "the job's polling missed the transition"
                         : "no queued-resource states: a plain train run");
    }
    if (r.detection_seconds + r.repair_seconds + r.restart_seconds > 0) {
      std::printf("    detection %.2f s, repair %.2f s, restart %.2f s\n",
                  r.detection_seconds, r.repair_seconds, r.restart_seconds);
    }
  }
  std::printf("  %lld step(s), %lld trained again, %d disruption(s)\n",
              static_cast<long long>(g.steps),
              static_cast<long long>(g.recomputed_steps), g.failures);
}

int Run(const GoodputFlags& flags) {
  Result<std::optional<double>> window = ParseWindow(flags.window);
  if (!window.ok()) return Fail(window.status());
  Result<RunInput> in = ReadRun(flags.run_dir);
  if (!in.ok()) return Fail(in.status());
  const double window_start = *window ? in->end - **window : in->start;
  Result<train::Goodput> g = train::ComputeGoodput(
      in->start, in->end, in->records, in->states, window_start);
  if (!g.ok()) return Fail(g.status());
  if (!flags.json) {
    PrintText(flags.run_dir, *in, *g, *window);
    return 0;
  }
  json out = g->ToJson();
  out["run_directory"] = flags.run_dir;
  out["run_seconds"] = in->end - in->start;
  out["window_seconds"] = *window ? json(**window) : json(nullptr);
  out["job"] = in->job;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

void AddGoodputCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "goodput",
      "Goodput of a train run or a job, in ml-goodput-measurement's "
      "buckets: the productive time and TPU_INITIALIZATION, TRAINING_PREP, "
      "PROGRAM_STARTUP, DATA_LOADING_SYNC, UNPRODUCTIVE_CHECKPOINT_SAVE_TIME, "
      "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME, WASTED_PROGRESS_FROM_DISRUPTION, "
      "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION and OTHER, which sum to the "
      "wall time, from the run's metrics.jsonl (docs/observability.md). "
      "Over the whole run (from its first start to its last step; a job's "
      "directory: the job's span) or, with --window, its last SECONDS. A "
      "job's directory splits each recovery into detection, repair and "
      "restart with the queued resource's states; a plain train run has "
      "none, so its recovery is the gap from the failed start's last step "
      "to the next start, unsplit.\n"
      "Examples:\n"
      "  multislice goodput runs/demo\n"
      "  multislice goodput runs/demo --window 600\n"
      "  multislice goodput /shared/jobs/demo --json");
  auto flags = std::make_shared<GoodputFlags>();
  cmd->add_option("run_dir", flags->run_dir,
                  "The run directory (base_output_directory/run_name) or a "
                  "job's directory (OUTPUT_DIR/RUN_NAME).")
      ->required();
  AddStringFlag(cmd, "window", &flags->window,
                "Only the last SECONDS of the run (every interval clipped to "
                "them).");
  AddBoolFlag(cmd, "json", &flags->json, "Print one JSON object.");
  table[cmd] = [flags] { return Run(*flags); };
}

}  // namespace multislice::cli
