// `multislice job`: MaxText's multihost_job.py against the queued-resource
// controller. The job's code goes into OUTPUT_DIR/RUN_NAME/ (the bucket of
// the original: a directory every host can read); a queued resource is
// created whose startup script unpacks the code and runs the command on
// every worker, logging to
// OUTPUT_DIR/RUN_NAME/main_command_log_slice_S_worker_W and recording its exit
// code and attempt in status_slice_S_worker_W. Because the command runs from
// the startup script, a repair or reset reruns it (with MULTISLICE_ATTEMPT
// incremented) and a `multislice train` command resumes from its checkpoints.
// The job follows the queued resource until the command has finished on every
// worker of the current attempt, writes goodput.json, and deletes the queued
// resource (unless --keep).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "cli/control_client.h"
#include "cli/flags.h"
#include "common/shell_quote.h"
#include "control/agent/pack.h"
#include "runtime/hang_digest.h"
#include "runtime/launcher.h"
#include "runtime/mesh/topology.h"
#include "train/goodput.h"
#include "train/metrics.h"

namespace multislice::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr char kName[] = "multislice job";
// How long a failed worker waits for a repair to begin, unless
// --failure_grace_seconds says. Agents: a lost host is noticed within the
// heartbeat timeout (5 s) and its lease (10 s). Slurm: a dead node is
// "not responding" after its next ping (every SlurmdTimeout/3, 100 s at
// Slurm's default) has timed out (MessageTimeout, 10 s), and only then
// repaired.
constexpr int kAgentsFailureGraceSeconds = 15;
constexpr int kSlurmFailureGraceSeconds = 120;

struct JobFlags {
  ControllerFlags connection;
  std::string accelerator_type;
  int num_slices = 1;
  std::string command;
  std::string script_dir = ".";
  std::string run_name;
  std::string output_dir;
  std::string bucket_dir;  // multihost_job.py's --BUCKET_DIR
  std::string runtime_version = "multislice";
  std::string cqr_extra_args;  // multihost_job.py's tier flags
  std::string project = "local";
  std::string zone = "local-a";
  bool reserved = false, spot = false, best_effort = false;
  bool keep = false;
  int timeout_seconds = 3600;
  int failure_grace_seconds = -1;  // -1: by the capacity (above)
  bool json = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "%s: %s\n", kName, s.message().c_str());
  return ExitCodeFor(s);
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A queued-resource id from a run name: lower case, [a-z0-9-], starting
// with a letter, at most 63 characters.
// The queued resource of a run: "job-" and the run name in [a-z0-9-], short
// enough that its node ids ("{id}-{n}" for `slices` slices) stay within the
// API's 63 characters.
std::string QueuedResourceId(const std::string& run_name, int slices) {
  std::string id = "job-";
  for (char c : run_name) {
    const char lower =
        static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    id += (std::isalnum(static_cast<unsigned char>(lower)) ? lower : '-');
  }
  const size_t suffix = slices > 1 ? 1 + std::to_string(slices - 1).size() : 0;
  if (id.size() > 63 - suffix) id.resize(63 - suffix);
  while (!id.empty() && id.back() == '-') id.pop_back();
  return id;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The startup script every worker runs (the values are the job's own flags,
// quoted as single shell words).
// When a worker of the job wrote the hang digest (docs/observability.md):
// its cause and culprits go into the report, and the returned sentence
// points at it ("" when there is none).
std::string NoteHangDigest(const std::string& job_dir, json& report) {
  const std::string path = job_dir + "/hang_digest.json";
  std::ifstream in(path);
  if (!in) return "";
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  Result<runtime::HangDigest> digest = runtime::ParseHangDigest(text);
  if (!digest.ok()) return "";
  json culprits = json::array();
  std::string names;
  for (const runtime::HangCulprit& c : digest->culprits) {
    culprits.push_back(c.name);
    names += (names.empty() ? "" : ", ") + c.name;
  }
  report["hang_digest"] = {
      {"file", path}, {"cause", digest->cause}, {"culprits", culprits}};
  return "a collective hung (" + digest->cause +
         "); suspected culprit(s): " + (names.empty() ? "none found" : names) +
         "; hang digest: " + path;
}

std::string StartupScript(const std::string& job_dir,
                          const std::string& output_dir,
                          const std::string& run_name,
                          const std::string& command) {
  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# multislice job " << run_name << ": fetch the code, run the command\n"
    << "JOB_DIR=" << ShellQuote(job_dir) << "\n"
    << "export MULTISLICE_OUTPUT_DIR=" << ShellQuote(output_dir) << "\n"
    << "export MULTISLICE_RUN_NAME=" << ShellQuote(run_name) << "\n"
    << "export MULTISLICE_JOB_DIR=\"$JOB_DIR\"\n"
    << "S=${MEGASCALE_SLICE_ID:-0} W=${TPU_WORKER_ID:-0} "
       "A=${MULTISLICE_ATTEMPT:-0}\n"
    << "LOG=\"$JOB_DIR/main_command_log_slice_${S}_worker_${W}\"\n"
    << "echo \"=== attempt $A, $(date -u +%FT%TZ) ===\" >> \"$LOG\"\n"
    << "if rm -rf code && mkdir -p code && tar -xzf \"$JOB_DIR/code.tar.gz\" "
       "-C code >> \"$LOG\" 2>&1; then\n"
    << "  cd code\n"
    << "  bash -c " << ShellQuote(command) << " >> \"$LOG\" 2>&1\n"
    << "  rc=$?\n"
    << "else\n"
    << "  rc=$?; echo \"multislice job: unpacking the code failed\" >> "
       "\"$LOG\"\n"
    << "fi\n"
    << "echo \"$rc $A\" > \"$JOB_DIR/status_slice_${S}_worker_${W}.tmp\" && "
       "mv \"$JOB_DIR/status_slice_${S}_worker_${W}.tmp\" "
       "\"$JOB_DIR/status_slice_${S}_worker_${W}\"\n"
    << "exit $rc\n";
  return s.str();
}

Result<json> Checked(Result<control::HttpResponse> r) {
  if (!r.ok()) return r.status();
  if (r->status < 200 || r->status >= 300)
    return control::ErrorFromResponse(*r);
  return r->body;
}

// "2026-11-30T08:27:52.123Z" (the API's timestamps) as Unix seconds.
std::optional<double> ParseTimestamp(const std::string& text) {
  std::tm tm{};
  int millis = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &tm.tm_year,
                  &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec,
                  &millis, &tail) != 8 ||
      tail != 'Z') {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<double>(timegm(&tm)) + millis / 1000.0;
}

struct WorkerStatus {
  int exit_code = -1;
  int attempt = -1;
};

// status_slice_S_worker_W: "<exit code> <attempt>", or absent.
std::optional<WorkerStatus> ReadStatus(const std::string& path) {
  std::ifstream in(path);
  WorkerStatus s;
  if (!(in >> s.exit_code >> s.attempt)) return std::nullopt;
  return s;
}

// --CQR_EXTRA_ARGS: multihost_job.py passes them to `gcloud ... create`;
// the tier flags are what the controller has of them.
Status ApplyExtraArgs(const std::string& flag, JobFlags& f) {
  std::istringstream words(f.cqr_extra_args);
  for (std::string word; words >> word;) {
    if (word == "--reserved") {
      f.reserved = true;
    } else if (word == "--spot") {
      f.spot = true;
    } else if (word == "--best-effort" || word == "--best_effort") {
      f.best_effort = true;
    } else {
      return InvalidArgument(flag + ": '" + word +
                             "' is not supported; expected --reserved, "
                             "--spot or --best-effort");
    }
  }
  return OkStatus();
}

// The required flags and where the job goes, each named as typed.
Status ValidateWhat(const CLI::App* cmd, const JobFlags& f) {
  if (f.command.empty()) {
    return InvalidArgument(Spelled(cmd, "command", "COMMAND") +
                           ": expected the command to run on every worker");
  }
  const std::string output = Spelled(cmd, "output_dir", "BUCKET_NAME");
  if (f.output_dir.empty()) {
    return InvalidArgument(output +
                           ": expected a directory every host can read (it "
                           "plays the role of the original's bucket)");
  }
  if (f.output_dir.find("://") != std::string::npos) {
    return InvalidArgument(output + ": '" + f.output_dir +
                           "' is a URL; expected a directory every host can "
                           "read");
  }
  if (!std::filesystem::is_directory(f.script_dir)) {
    return InvalidArgument(Spelled(cmd, "script_dir", "SCRIPT_DIR") + ": '" +
                           f.script_dir + "' is not a directory");
  }
  const std::string run_flag = Spelled(cmd, "run_name", "RUN_NAME");
  if (f.run_name.find('/') != std::string::npos || f.run_name == "." ||
      f.run_name == "..") {
    return InvalidArgument(run_flag + ": '" + f.run_name +
                           "' must be a plain name, without '/'");
  }
  if (f.bucket_dir.find("..") != std::string::npos ||
      (!f.bucket_dir.empty() && f.bucket_dir[0] == '/')) {
    return InvalidArgument(Spelled(cmd, "bucket_dir", "BUCKET_DIR") + ": '" +
                           f.bucket_dir + "' must be a relative path inside " +
                           output + ", without '..'");
  }
  return OkStatus();
}

// The shape of the queued resource and the job's bounds.
Status Validate(const CLI::App* cmd, JobFlags& f) {
  RETURN_IF_ERROR(ValidateWhat(cmd, f));
  const std::string type_flag = Spelled(cmd, "accelerator_type", "TPU_TYPE");
  if (f.accelerator_type.empty()) {
    return InvalidArgument(type_flag +
                           ": expected the type of each slice, "
                           "e.g. cpu-1");
  }
  auto type = mesh::ParseAcceleratorType(f.accelerator_type);
  if (!type.ok()) {
    return InvalidArgument(type_flag + ": " + type.status().message());
  }
  if (f.num_slices < 1 || f.num_slices > 256) {
    return InvalidArgument(Spelled(cmd, "num_slices", "NUM_SLICES") +
                           ": expected 1 to 256, got " +
                           std::to_string(f.num_slices));
  }
  if (f.timeout_seconds < 1) {
    return InvalidArgument("--timeout_seconds: expected at least 1, got " +
                           std::to_string(f.timeout_seconds));
  }
  const CLI::Option* grace =
      cmd->get_option_no_throw("--failure_grace_seconds");
  if (grace != nullptr && grace->count() > 0 && f.failure_grace_seconds < 0) {
    return InvalidArgument(
        "--failure_grace_seconds: expected at least 0, got " +
        std::to_string(f.failure_grace_seconds));
  }
  RETURN_IF_ERROR(
      ApplyExtraArgs(Spelled(cmd, "cqr_extra_args", "CQR_EXTRA_ARGS"), f));
  if (f.reserved + f.spot + f.best_effort > 1) {
    return InvalidArgument(
        "--reserved: give at most one of --reserved, --spot, --best_effort");
  }
  return OkStatus();
}

// Packs the script directory into JOB_DIR/code.tar.gz (pack.h's rules; the
// job's directory is marked first, so it is never packed).
Status PackCode(const CLI::App* cmd, const JobFlags& f,
                const std::string& job_dir) {
  RETURN_IF_ERROR(control::MarkOutputFolder(job_dir));
  control::PackOptions pack;
  pack.dir = f.script_dir;
  pack.archive = job_dir + "/code.tar.gz.tmp";
  pack.flag = Spelled(cmd, "script_dir", "SCRIPT_DIR");
  pack.program = kName;
  pack.terminal = ::isatty(STDERR_FILENO) == 1 && !f.json;
  RETURN_IF_ERROR(control::PackDirectory(pack).status());
  std::error_code ec;
  std::filesystem::rename(pack.archive, job_dir + "/code.tar.gz", ec);
  if (ec)
    return Internal("cannot rename " + pack.archive + ": " + ec.message());
  return OkStatus();
}

// The failing worker's log: its path and the last `lines` lines of its
// latest attempt, for the report on stderr.
std::string FailureReport(const std::string& log_path, int lines) {
  std::string log = ReadFile(log_path);
  const size_t attempt = log.rfind("=== attempt ");
  if (attempt != std::string::npos) log = log.substr(attempt);
  while (!log.empty() && log.back() == '\n') log.pop_back();
  size_t from = log.size();
  for (int n = 0; n < lines && from != std::string::npos && from > 0; ++n) {
    from = log.rfind('\n', from - 1);
  }
  const std::string tail =
      from == std::string::npos ? log : log.substr(from + 1);
  return "the last lines of " + log_path + ":\n" + tail + "\n";
}

// The newest line `log_path` ends with (its last 4 KiB read, a progress
// bar's redraws and control bytes dropped, at most `width` characters):
// what a worker that has not finished is doing, for the follow line.
std::string LastLogLine(const std::string& log_path, size_t width) {
  std::ifstream in(log_path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 4096);
  std::string tail(static_cast<size_t>(size - from), '\0');
  in.seekg(from);
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) {
    tail.pop_back();
  }
  const size_t start = tail.find_last_of("\n\r");
  std::string line;
  for (char c : tail.substr(start == std::string::npos ? 0 : start + 1)) {
    if (static_cast<unsigned char>(c) >= 0x20) line += c;
  }
  if (line.size() > width) line = line.substr(0, width - 3) + "...";
  return line;
}

int Run(const CLI::App* cmd, JobFlags f) {
  if (Status valid = Validate(cmd, f); !valid.ok()) return Fail(valid);
  auto type = mesh::ParseAcceleratorType(f.accelerator_type);
  std::string run_name = f.run_name;
  if (run_name.empty()) {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[64];
    std::strftime(buf, sizeof buf, "job-%Y%m%d-%H%M%S", &tm);
    run_name = buf;
  }
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(client.status());

  std::error_code ec;
  const std::string bucket =
      f.bucket_dir.empty() ? f.output_dir : f.output_dir + "/" + f.bucket_dir;
  std::filesystem::create_directories(bucket, ec);
  std::string output_dir =
      std::filesystem::absolute(bucket, ec).lexically_normal().string();
  while (output_dir.size() > 1 && output_dir.back() == '/') {
    output_dir.pop_back();
  }
  const std::string job_dir = output_dir + "/" + run_name;
  std::filesystem::create_directories(job_dir, ec);
  if (ec) {
    return Fail(InvalidArgument("--output_dir: cannot create '" + job_dir +
                                "': " + ec.message()));
  }
  const double start = Now();
  // Stale statuses of an earlier job of the same name would end this one.
  for (const auto& entry : std::filesystem::directory_iterator(job_dir, ec)) {
    if (entry.path().filename().string().rfind("status_slice_", 0) == 0) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  if (Status packed = PackCode(cmd, f, job_dir); !packed.ok()) {
    return Fail(packed);
  }

  const std::string id = QueuedResourceId(run_name, f.num_slices);
  const std::string parent =
      "/v2alpha1/projects/" + f.project + "/locations/" + f.zone;
  json node = {{"accelerator_type", f.accelerator_type},
               {"runtime_version", f.runtime_version},
               {"metadata",
                {{"startup-script",
                  StartupScript(job_dir, output_dir, run_name, f.command)}}}};
  json spec = {{"parent", "projects/" + f.project + "/locations/" + f.zone},
               {"node", node}};
  if (f.num_slices > 1) {
    spec["multi_node_params"] = {{"node_count", f.num_slices}};
  } else {
    spec["node_id"] = id;
  }
  json body = {{"tpu", {{"node_spec", json::array({spec})}}}};
  if (f.reserved) body["guaranteed"] = {{"reserved", true}};
  if (f.spot) body["spot"] = json::object();
  if (f.best_effort) body["best_effort"] = json::object();
  Result<json> op = Checked(client->Call(
      "POST", parent + "/queuedResources?queued_resource_id=" + id, &body));
  if (!op.ok()) return Fail(op.status());
  if (!f.json) {
    std::printf("%s: queued resource %s: %d x %s, code and logs in %s\n", kName,
                id.c_str(), f.num_slices, f.accelerator_type.c_str(),
                job_dir.c_str());
    std::fflush(stdout);
  }

  // Follow the queued resource and the workers' statuses.
  const int workers_per_slice = type->hosts_per_slice();
  const int total = f.num_slices * workers_per_slice;
  std::vector<train::StateObservation> states;
  const auto deadline = Clock::now() + std::chrono::seconds(f.timeout_seconds);
  bool failing = false;  // since failed_since
  Clock::time_point failed_since;
  int exit_code = 0;
  std::string outcome;
  std::string failed_log;  // the failing worker's, once one has failed
  std::string report_log;  // the log to show: the job failed there
  std::string last_line;
  const bool tty = runtime::ShowProgress() && !f.json;
  auto next_report = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    if (Clock::now() > deadline) {
      exit_code = 1;
      outcome = "timed out after " + std::to_string(f.timeout_seconds) + " s";
      break;
    }
    Result<json> qr =
        Checked(client->Call("GET", parent + "/queuedResources/" + id));
    if (!qr.ok()) {
      exit_code = 1;
      outcome = "lost the queued resource: " + qr.status().message();
      break;
    }
    const std::string state = (*qr)["state"].value("state", "");
    const int attempt = qr->value("attempt", 0);
    // A queued resource on Slurm carries its job (clusterJob).
    const int grace_seconds =
        f.failure_grace_seconds >= 0 ? f.failure_grace_seconds
        : qr->contains("clusterJob") ? kSlurmFailureGraceSeconds
                                     : kAgentsFailureGraceSeconds;
    if (states.empty() || states.back().state != state ||
        states.back().attempt != attempt) {
      states.push_back({Now(), state, attempt});
      if (!f.json && !tty) {
        std::printf("%s: %s, attempt %d\n", kName, state.c_str(), attempt);
        std::fflush(stdout);
      }
    }
    if (state == "FAILED" || state == "SUSPENDED" || state == "SUSPENDING") {
      exit_code = 1;
      outcome = "the queued resource is " + state;
      break;
    }
    int finished = 0;
    std::string failure;
    std::string waiting, waiting_log;
    for (int s = 0; s < f.num_slices; ++s) {
      for (int w = 0; w < workers_per_slice; ++w) {
        const std::string name =
            "slice " + std::to_string(s) + " worker " + std::to_string(w);
        std::optional<WorkerStatus> status =
            ReadStatus(job_dir + "/status_slice_" + std::to_string(s) +
                       "_worker_" + std::to_string(w));
        if (!status || status->attempt != attempt) {
          if (waiting.empty()) {
            waiting = name;
            waiting_log =
                "slice_" + std::to_string(s) + "_worker_" + std::to_string(w);
          }
          continue;
        }
        ++finished;
        if (status->exit_code != 0 && failure.empty()) {
          failed_log = job_dir + "/main_command_log_slice_" +
                       std::to_string(s) + "_worker_" + std::to_string(w);
          failure = name + " exited with code " +
                    std::to_string(status->exit_code) + " (attempt " +
                    std::to_string(attempt) + ")";
          exit_code = status->exit_code;
        }
      }
    }
    if (state == "ACTIVE" && finished == total && failure.empty()) {
      exit_code = 0;
      outcome = "the command finished on all " + std::to_string(total) +
                " workers (attempt " + std::to_string(attempt) + ")";
      break;
    }
    // A failing worker may be the first sign of a host failure that a
    // repair will follow: wait a grace period before calling it final.
    if (!failure.empty() && state == "ACTIVE") {
      if (!failing) {
        failing = true;
        failed_since = Clock::now();
      }
      if (Clock::now() - failed_since > std::chrono::seconds(grace_seconds)) {
        outcome = failure;
        report_log = failed_log;
        break;
      }
    } else {
      failing = false;
    }
    // On a terminal one line, redrawn, ends with what the first unfinished
    // worker's log last said (a training's step line, its ETA); otherwise
    // that line every 30 s, so a long command is never silent. The log is
    // read only when the line is shown.
    const bool report = !tty && !f.json && Clock::now() >= next_report;
    if (tty || report) {
      std::string line = state + ", attempt " + std::to_string(attempt) +
                         ": completed " + std::to_string(finished) + "/" +
                         std::to_string(total);
      if (!waiting.empty()) {
        const std::string said =
            LastLogLine(job_dir + "/main_command_log_" + waiting_log, 100);
        line +=
            "; " + waiting + (said.empty() ? " still working" : ": " + said);
      }
      if (report) {
        std::printf("%s: %s\n", kName, line.c_str());
        next_report = Clock::now() + std::chrono::seconds(30);
      } else if (line != last_line) {
        std::printf("\r\033[K%s", line.c_str());
        last_line = line;
      }
      std::fflush(stdout);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (tty) std::printf("\n");
  if (!report_log.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %s; %s", kName, outcome.c_str(),
                 FailureReport(report_log, 20).c_str());
  }
  const double end = Now();

  // The controller's own record of the transitions is exact where the
  // polling above may miss a repair shorter than its period.
  if (Result<json> qr =
          Checked(client->Call("GET", parent + "/queuedResources/" + id));
      qr.ok()) {
    for (const json& change : qr->value("stateHistory", json::array())) {
      const std::optional<double> time =
          ParseTimestamp(change.value("time", ""));
      if (time) states.push_back({*time, change.value("state", ""), 0});
    }
    std::stable_sort(
        states.begin(), states.end(),
        [](const train::StateObservation& a, const train::StateObservation& b) {
          return a.time < b.time;
        });
  }

  // Goodput, from the trainer's metrics if the command wrote them into the
  // job directory (base_output_directory=$MULTISLICE_OUTPUT_DIR
  // run_name=$MULTISLICE_RUN_NAME).
  std::vector<json> records;
  if (auto all = train::MetricsWriter::ReadAll(job_dir + "/metrics.jsonl");
      all.ok()) {
    records = *all;
  }
  json report;
  if (auto goodput = train::ComputeGoodput(start, end, records, states);
      goodput.ok()) {
    report = goodput->ToJson();
  }
  report["run_name"] = run_name;
  report["queued_resource"] = id;
  report["exit_code"] = exit_code;
  report["outcome"] = outcome;
  json timeline = json::array();
  for (const train::StateObservation& o : states) {
    timeline.push_back(
        {{"time", o.time}, {"state", o.state}, {"attempt", o.attempt}});
  }
  report["timeline"] = timeline;
  const std::string hang_note = NoteHangDigest(job_dir, report);
  {
    std::ofstream out(job_dir + "/goodput.json.tmp");
    out << report.dump(2) << "\n";
  }
  std::filesystem::rename(job_dir + "/goodput.json.tmp",
                          job_dir + "/goodput.json", ec);

  if (!f.keep) {
    Result<json> del = Checked(client->Call(
        "DELETE", parent + "/queuedResources/" + id + "?force=true"));
    if (del.ok()) {
      for (int i = 0; i < 600; ++i) {
        Result<control::HttpResponse> r =
            client->Call("GET", parent + "/queuedResources/" + id);
        if (r.ok() && r->status == 404) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    } else {
      std::fprintf(stderr, "%s: could not delete %s: %s\n", kName, id.c_str(),
                   del.status().message().c_str());
    }
  }
  if (!hang_note.empty())
    std::fprintf(stderr, "%s: %s\n", kName, hang_note.c_str());
  if (f.json) {
    std::printf("%s\n", report.dump().c_str());
  } else {
    std::printf(
        "%s: %s; wall %.1f s, goodput %.1f%% (%d failure(s), "
        "%.1f s detection, %.1f s repair, %.1f s restart, %lld "
        "recomputed step(s)); %s/goodput.json%s\n",
        kName, outcome.c_str(), report.value("wall_seconds", 0.0),
        report.value("goodput_percent", 0.0), report.value("failures", 0),
        report.value("detection_seconds", 0.0),
        report.value("repair_seconds", 0.0),
        report.value("restart_seconds", 0.0),
        static_cast<long long>(report.value("recomputed_steps", 0)),
        job_dir.c_str(), f.keep ? "" : "; queued resource deleted");
  }
  return exit_code;
}

}  // namespace

void AddJobCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "job",
      "Run a command on every worker of a new queued resource, as MaxText's "
      "multihost_job.py: the code of --script_dir is stored in "
      "OUTPUT_DIR/RUN_NAME/, the startup script fetches it and runs the "
      "command (logs: main_command_log_slice_S_worker_W), a repair or reset "
      "reruns it, and the job ends when the command has finished on every "
      "worker. Writes goodput.json (the job's goodput in "
      "ml-goodput-measurement's buckets; `multislice goodput` reads it) and "
      "deletes the queued resource (unless --keep). The command sees "
      "MULTISLICE_OUTPUT_DIR, MULTISLICE_RUN_NAME and MULTISLICE_JOB_DIR; a "
      "trainer given base_output_directory="
      "$MULTISLICE_OUTPUT_DIR run_name=$MULTISLICE_RUN_NAME resumes from its "
      "checkpoints after a repair, and its metrics feed goodput.json. When "
      "a worker fails, the last 20 lines of its log are printed. "
      "multihost_job.py's upper-case flags (--TPU_TYPE, --NUM_SLICES, "
      "--VERSION, --COMMAND, --SCRIPT_DIR, --RUN_NAME, --BUCKET_NAME, "
      "--BUCKET_DIR, --PROJECT, --ZONE, --CQR_EXTRA_ARGS) work too.\n"
      "Example:\n"
      "  multislice job --accelerator_type cpu-1 --num_slices 2 "
      "--output_dir /shared/jobs --run_name demo \\\n"
      "    --command 'multislice train configs/gpt2-fortunes.yml "
      "base_output_directory=$MULTISLICE_OUTPUT_DIR "
      "run_name=$MULTISLICE_RUN_NAME'");
  auto f = std::make_shared<JobFlags>();
  AddControllerFlags(cmd, &f->connection);
  AddStringFlag(cmd, "accelerator_type", &f->accelerator_type,
                "Required: type of each slice, e.g. cpu-2 (also --TPU_TYPE).");
  AddStringAlias(cmd, "TPU_TYPE", &f->accelerator_type);
  AddIntFlag(cmd, "num_slices", &f->num_slices,
             "Number of slices (also --NUM_SLICES).");
  AddIntAlias(cmd, "NUM_SLICES", &f->num_slices);
  AddStringFlag(cmd, "runtime_version", &f->runtime_version,
                "Runtime version of the nodes (also --VERSION).");
  AddStringAlias(cmd, "VERSION", &f->runtime_version);
  AddStringFlag(cmd, "command", &f->command,
                "Required: shell command run on every worker, in the unpacked "
                "code (also --COMMAND).");
  AddStringAlias(cmd, "COMMAND", &f->command);
  AddStringFlag(cmd, "script_dir", &f->script_dir,
                "Directory packed and shipped to every worker, without the "
                "output folders of runs and jobs in it; at most 256 MiB (also "
                "--SCRIPT_DIR).");
  AddStringAlias(cmd, "SCRIPT_DIR", &f->script_dir);
  AddStringFlag(cmd, "run_name", &f->run_name,
                "Name of the job (default job-<UTC time>; also --RUN_NAME).");
  AddStringAlias(cmd, "RUN_NAME", &f->run_name);
  AddStringFlag(cmd, "output_dir", &f->output_dir,
                "Required: directory every host can read: code, logs, "
                "goodput.json (also --BUCKET_NAME).");
  AddStringAlias(cmd, "BUCKET_NAME", &f->output_dir);
  AddStringFlag(cmd, "bucket_dir", &f->bucket_dir,
                "A folder inside --output_dir for the job's directory (also "
                "--BUCKET_DIR).");
  AddStringAlias(cmd, "BUCKET_DIR", &f->bucket_dir);
  AddStringFlag(cmd, "project", &f->project,
                "Project of the queued resource (also --PROJECT).");
  AddStringAlias(cmd, "PROJECT", &f->project);
  AddStringFlag(cmd, "zone", &f->zone,
                "Zone of the queued resource (also --ZONE).");
  AddStringAlias(cmd, "ZONE", &f->zone);
  AddStringFlag(cmd, "cqr_extra_args", &f->cqr_extra_args,
                "multihost_job.py's extra create flags: --reserved, --spot or "
                "--best-effort (also --CQR_EXTRA_ARGS).");
  AddStringAlias(cmd, "CQR_EXTRA_ARGS", &f->cqr_extra_args);
  AddBoolFlag(cmd, "reserved", &f->reserved, "Reserved tier.");
  AddBoolFlag(cmd, "spot", &f->spot, "Spot tier.");
  AddBoolFlag(cmd, "best_effort", &f->best_effort, "Best-effort tier.");
  AddBoolFlag(cmd, "keep", &f->keep, "Keep the queued resource at the end.");
  AddIntFlag(cmd, "timeout_seconds", &f->timeout_seconds,
             "Give up (exit 1) after this long.");
  AddIntFlag(cmd, "failure_grace_seconds", &f->failure_grace_seconds,
             "How long a failed worker may wait for a repair to begin before "
             "the job fails (default 15 s; 120 s for a queued resource on "
             "Slurm, whose detection of a dead node takes up to "
             "SlurmdTimeout/3 + MessageTimeout).")
      ->default_str("");  // not -1: the default depends on the capacity
  AddBoolFlag(cmd, "json", &f->json, "Print goodput.json's object at the end.");
  table[cmd] = [cmd, f] { return Run(cmd, *f); };
}

}  // namespace multislice::cli
