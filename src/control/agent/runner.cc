// `multislice run` (see runner.h): setup on every worker concurrently, then
// one thread polls every running command in turn.
#include "control/agent/runner.h"

#include <stdlib.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "control/agent/agent.h"
#include "control/agent/pack.h"
#include "control/agent/remote_exec.h"
#include "control/process.h"

namespace multislice::control {
namespace {

// Calls to agents made at once during setup and start.
constexpr size_t kMaxParallelCalls = 32;
using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;
// Where the archive goes in the worker's directory before it is unpacked.
constexpr const char* kArchiveDir = ".multislice-run";
// Unpacks the archive; the paths arrive in the environment, never pasted
// into the command line.
constexpr const char* kUnpackCommand =
    "set -e; mkdir -p -- \"$MULTISLICE_RUN_DIR\"; "
    "tar -xzf \"$MULTISLICE_RUN_ARCHIVE\" -C \"$MULTISLICE_RUN_DIR\"; "
    "rm -f -- \"$MULTISLICE_RUN_ARCHIVE\"";
// After a stop, how long the rest of a command's output is read.
constexpr milliseconds kDrainTimeout{5000};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The last non-empty line of `text`, for one-line error messages.
std::string LastLine(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) {
    text.pop_back();
  }
  const size_t nl = text.rfind('\n');
  return nl == std::string::npos ? text : text.substr(nl + 1);
}

std::string WorkerLabel(const WorkerTarget& t) {
  return "slice " + std::to_string(t.node_index) + " worker " +
         std::to_string(t.worker);
}

// Packs the script directory (pack.h's rules) in a temporary directory;
// returns the archive's bytes.
Result<std::string> PackScripts(const RunOptions& options) {
  const char* tmp_root = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp_root && *tmp_root ? tmp_root : "/tmp") +
                        "/multislice-run-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    return Internal("cannot create a temporary directory in " + pattern);
  }
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } cleanup{pattern};
  PackOptions pack;
  pack.dir = options.script_dir;
  pack.archive = pattern + "/code.tar.gz";
  pack.flag = options.script_dir_flag;
  pack.program = "multislice run";
  pack.max_bytes = kMaxUploadBytes;
  pack.timeout = options.setup_timeout;
  pack.cancel = options.cancel;
  pack.err = options.err;
  pack.terminal = options.terminal;
  RETURN_IF_ERROR(PackDirectory(pack).status());
  std::string bytes = ReadFile(pack.archive);
  if (bytes.size() > kMaxUploadBytes) {
    return InvalidArgument(options.script_dir_flag + ": " + options.script_dir +
                           " packs into " + FormatBytes(bytes.size()) +
                           ", more than the agents accept (" +
                           FormatBytes(kMaxUploadBytes) + ")");
  }
  return bytes;
}

// One worker's command during the run.
struct WorkerRun {
  explicit WorkerRun(RemoteExec remote) : exec(std::move(remote)) {}
  ~WorkerRun() {
    if (file != nullptr) std::fclose(file);
  }
  const WorkerTarget& target() const { return exec.target(); }
  RemoteExec exec;
  FILE* file = nullptr;  // output_slice_SSSS_worker_WWWW.txt
  bool echo = false;     // slice 0 worker 0: also to the terminal
  bool done = false;
  int exit_code = -1;
};

class Runner {
 public:
  explicit Runner(const RunOptions& options) : options_(options) {
    timings_.http_timeout = options.http_timeout;
    timings_.agent_lost_after = options.agent_lost_after;
    run_dir_ = options_.output_dir == "."
                   ? options_.run_name
                   : options_.output_dir + "/" + options_.run_name;
  }

  Result<int> Run() {
    ASSIGN_OR_RETURN(std::string qr, ResolveQueuedResource());
    ASSIGN_OR_RETURN(ApiClient controller,
                     ApiClient::Create(options_.controller_url, options_.token,
                                       options_.http_timeout));
    ASSIGN_OR_RETURN(std::vector<WorkerTarget> targets,
                     ListQueuedResourceWorkers(controller, qr));
    std::string archive;
    if (!options_.use_existing_folder) {
      Result<std::string> packed = Pack();
      if (Cancelled()) return Interrupted(0);
      if (!packed.ok()) return packed.status();
      archive = std::move(packed).value();
    }
    if (Cancelled()) return Interrupted(0);
    Status prepared = PrepareWorkers(
        targets, options_.use_existing_folder ? nullptr : &archive);
    if (Cancelled()) return Interrupted(0);
    RETURN_IF_ERROR(prepared);
    RETURN_IF_ERROR(OpenOutputFiles(targets));
    RETURN_IF_ERROR(StartAll());
    return Follow();
  }

 private:
  bool Cancelled() const {
    return options_.cancel != nullptr && options_.cancel->load();
  }

  Result<std::string> ResolveQueuedResource() {
    ASSIGN_OR_RETURN(ApiClient controller,
                     ApiClient::Create(options_.controller_url, options_.token,
                                       options_.http_timeout));
    if (options_.queued_resource.empty()) {
      Result<std::string> found = FindQueuedResourceByPrefix(
          controller, options_.project, options_.tpu_prefix, options_.zone);
      const std::string flag = "--tpu_prefix";
      if (!found.ok() && found.status().message().rfind(flag, 0) == 0) {
        return Status(found.status().code(),
                      options_.tpu_prefix_flag +
                          found.status().message().substr(flag.size()));
      }
      return found;
    }
    if (options_.zone != "-") {  // the id must be in that zone
      ASSIGN_OR_RETURN(
          HttpResponse response,
          controller.Call("GET", "/v2alpha1/projects/" + options_.project +
                                     "/locations/" + options_.zone +
                                     "/queuedResources/" +
                                     options_.queued_resource));
      if (response.status == 404) {
        return NotFound("--zone: project " + options_.project + " has no " +
                        "queued resource " + options_.queued_resource +
                        " in zone " + options_.zone);
      }
      if (response.status / 100 != 2) return ErrorFromResponse(response);
    }
    return options_.queued_resource;
  }

  // The archive of the script directory. The run's output folder is made
  // (with its marker) first, so that it is never packed.
  Result<std::string> Pack() {
    RETURN_IF_ERROR(MarkOutputFolder(run_dir_));
    return PackScripts(options_);
  }

  // Stops an earlier run's commands, then copies and unpacks the archive
  // (when given) on every worker at once. The first failure is returned,
  // naming its worker.
  Status PrepareWorkers(const std::vector<WorkerTarget>& targets,
                        const std::string* archive) {
    std::vector<Status> results(targets.size());
    ForEachConcurrently(targets.size(), kMaxParallelCalls, [&](size_t i) {
      results[i] = PrepareWorker(targets[i], archive);
    });
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!results[i].ok()) {
        return Status(results[i].code(), WorkerLabel(targets[i]) + " (agent " +
                                             targets[i].agent_address +
                                             "): " + results[i].message());
      }
    }
    return OkStatus();
  }

  Status PrepareWorker(const WorkerTarget& target, const std::string* archive) {
    ASSIGN_OR_RETURN(AgentClient agent,
                     AgentClient::Create(target.agent_address,
                                         AgentTokenFor(target, options_.token),
                                         options_.http_timeout));
    auto stopped = agent.StopTaggedExecs(target.worker_name, kRunTagPrefix,
                                         options_.stop_grace);
    if (!stopped.ok()) {
      return Status(stopped.status().code(),
                    "stopping an earlier run: " + stopped.status().message());
    }
    if (archive == nullptr) return OkStatus();
    const std::string remote_archive =
        std::string(kArchiveDir) + "/" + options_.run_name + ".tar.gz";
    RETURN_IF_ERROR(
        agent.PutFile(target.worker_name, remote_archive, *archive));
    RemoteExec unpack(target, options_.token, timings_);
    ExecRequest request;
    request.command = kUnpackCommand;
    request.env = {{"MULTISLICE_RUN_DIR", options_.run_name},
                   {"MULTISLICE_RUN_ARCHIVE", remote_archive}};
    RETURN_IF_ERROR(unpack.Start(request));
    const auto deadline = Clock::now() + options_.setup_timeout;
    std::string output;
    for (;;) {
      RemoteExec::Progress progress = unpack.Poll();
      output += progress.output;
      if (!progress.lost.ok()) return progress.lost;
      if (progress.done) {
        if (progress.exit_code == 0) return OkStatus();
        return Internal("unpacking the scripts failed (exit code " +
                        std::to_string(progress.exit_code) +
                        "): " + LastLine(output));
      }
      if (Clock::now() >= deadline || Cancelled()) {
        unpack.Stop(milliseconds(0)).ok();
        return DeadlineExceeded("unpacking the scripts did not finish");
      }
      std::this_thread::sleep_for(options_.poll_interval);
    }
  }

  Status OpenOutputFiles(std::vector<WorkerTarget>& targets) {
    RETURN_IF_ERROR(MarkOutputFolder(run_dir_));
    for (WorkerTarget& t : targets) {
      auto run =
          std::make_unique<WorkerRun>(RemoteExec(t, options_.token, timings_));
      char name[64];
      std::snprintf(name, sizeof name, "/output_slice_%04d_worker_%04d.txt",
                    t.node_index, t.worker);
      run->file = std::fopen((run_dir_ + name).c_str(), "wb");
      if (run->file == nullptr) {
        return Internal("cannot write " + run_dir_ + name);
      }
      run->echo = t.node_index == 0 && t.worker == 0;
      runs_.push_back(std::move(run));
    }
    return OkStatus();
  }

  // Starts the command everywhere at once; on any failure stops the ones
  // that started and returns the first failure.
  Status StartAll() {
    ExecRequest request;
    request.command = options_.command;
    request.directory = options_.run_name;
    request.tag = kRunTagPrefix + options_.run_name;
    request.env = {{"MULTISLICE_RUN_NAME", options_.run_name}};
    std::vector<Status> results(runs_.size());
    ForEachConcurrently(runs_.size(), kMaxParallelCalls, [&](size_t i) {
      results[i] = runs_[i]->exec.Start(request);
    });
    for (size_t i = 0; i < runs_.size(); ++i) {
      if (results[i].ok()) continue;
      StopRunning();
      std::string message = results[i].message();
      if (results[i].code() == StatusCode::kNotFound &&
          options_.use_existing_folder) {
        message += " (--use_existing_folder needs an earlier run named " +
                   options_.run_name + " on every worker)";
      }
      return Status(results[i].code(),
                    WorkerLabel(runs_[i]->target()) +
                        ": cannot start the command: " + message);
    }
    return OkStatus();
  }

  // Polls every command until all succeed, one fails, or cancel.
  Result<int> Follow() {
    const size_t total = runs_.size();
    size_t completed = 0;
    WorkerRun* failed = nullptr;
    last_progress_ = Clock::now();
    while (completed < total && failed == nullptr) {
      if (Cancelled()) return Interrupted(total - completed);
      for (auto& run : runs_) {
        if (run->done) continue;
        RemoteExec::Progress progress = run->exec.Poll();
        Write(*run, progress.output);
        if (!progress.done) continue;
        run->done = true;
        run->exit_code = progress.exit_code;
        ++completed;
        if (!progress.lost.ok()) {
          ClearProgress();
          std::fprintf(options_.err, "multislice run: %s: agent %s lost: %s\n",
                       WorkerLabel(run->target()).c_str(),
                       run->target().agent_address.c_str(),
                       progress.lost.message().c_str());
        }
        if (run->exit_code != 0 && failed == nullptr) failed = run.get();
      }
      if (completed < total && failed == nullptr) {
        ShowProgress(completed, total);
        std::this_thread::sleep_for(options_.poll_interval);
      }
    }
    if (failed == nullptr) {
      ClearProgress();
      std::fprintf(options_.err,
                   "multislice run: completed %zu/%zu, every worker exited "
                   "with code 0 (output in %s/)\n",
                   total, total, run_dir_.c_str());
      std::fflush(options_.err);
      return 0;
    }
    const size_t stopped = StopRunning();
    ClearProgress();
    std::fprintf(options_.err,
                 "multislice run: slice %d worker %d failed with exit code "
                 "%d; stopped the %zu other workers still running (output in "
                 "%s/)\n",
                 failed->target().node_index, failed->target().worker,
                 failed->exit_code, stopped, run_dir_.c_str());
    std::fflush(options_.err);
    return failed->exit_code;
  }

  int Interrupted(size_t running) {
    if (running > 0) StopRunning();
    ClearProgress();
    if (running > 0) {
      std::fprintf(options_.err,
                   "multislice run: interrupted; stopped the commands of %zu "
                   "workers\n",
                   running);
    } else {
      std::fprintf(options_.err,
                   "multislice run: interrupted before the commands "
                   "started\n");
    }
    std::fflush(options_.err);
    return 130;
  }

  // Stops every started command that has not ended, all at once, then reads
  // the rest of their output. Returns how many were stopped.
  size_t StopRunning() {
    std::vector<WorkerRun*> running;
    for (auto& run : runs_) {
      if (run->exec.started() && !run->done) running.push_back(run.get());
    }
    ForEachConcurrently(running.size(), kMaxParallelCalls, [&](size_t i) {
      Status s = running[i]->exec.Stop(options_.stop_grace);
      if (!s.ok()) {
        std::fprintf(options_.err, "multislice run: %s: stopping: %s\n",
                     WorkerLabel(running[i]->target()).c_str(),
                     s.message().c_str());
      }
    });
    const auto deadline = Clock::now() + kDrainTimeout;
    for (WorkerRun* run : running) {
      while (!run->done && Clock::now() < deadline) {
        RemoteExec::Progress progress = run->exec.Poll();
        Write(*run, progress.output);
        if (progress.done) {
          run->done = true;
          run->exit_code = progress.exit_code;
        } else if (progress.output.empty()) {
          std::this_thread::sleep_for(options_.poll_interval);
        }
      }
    }
    return running.size();
  }

  void Write(WorkerRun& run, const std::string& output) {
    if (output.empty()) return;
    std::fwrite(output.data(), 1, output.size(), run.file);
    std::fflush(run.file);
    if (run.echo) {
      ClearProgress();
      std::fwrite(output.data(), 1, output.size(), options_.out);
      std::fflush(options_.out);
      echo_mid_line_ = output.back() != '\n';
    }
  }

  // "Completed c/t, slice S worker W still working..." naming the first
  // worker still running: redrawn in place on a terminal (at most 5 times a
  // second), else one line every progress_interval.
  void ShowProgress(size_t completed, size_t total) {
    const auto now = Clock::now();
    const milliseconds every =
        options_.terminal ? milliseconds(200) : options_.progress_interval;
    // On a terminal, never draw over a line of the echo that is not done.
    if (now - last_progress_ < every || (options_.terminal && echo_mid_line_)) {
      return;
    }
    last_progress_ = now;
    const WorkerTarget* waiting = nullptr;
    for (auto& run : runs_) {
      if (!run->done) {
        waiting = &run->target();
        break;
      }
    }
    if (waiting == nullptr) return;
    std::fprintf(options_.err,
                 "%sCompleted %zu/%zu, slice %d worker %d still working...%s",
                 options_.terminal ? "\r\33[K" : "", completed, total,
                 waiting->node_index, waiting->worker,
                 options_.terminal ? "" : "\n");
    std::fflush(options_.err);
    progress_shown_ = options_.terminal;
  }

  void ClearProgress() {
    if (!progress_shown_) return;
    std::fputs("\r\33[K", options_.err);
    std::fflush(options_.err);
    progress_shown_ = false;
  }

  const RunOptions& options_;
  ExecTimings timings_;
  std::vector<std::unique_ptr<WorkerRun>> runs_;
  std::string run_dir_;  // where the output files go
  Clock::time_point last_progress_;
  bool progress_shown_ = false;
  bool echo_mid_line_ = false;  // the echo's last byte was not a newline
};

}  // namespace

bool ValidRunName(const std::string& name) {
  if (name.empty() || name.size() > 100) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
      return false;
    }
  }
  return name[0] != '.' && name[0] != '-' && name[0] != '_';
}

std::string DefaultRunName(std::chrono::system_clock::time_point now) {
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm utc{};
  ::gmtime_r(&t, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d-%H-%M-%S", &utc);
  return text;
}

Result<std::string> FindQueuedResourceByPrefix(const ApiClient& controller,
                                               const std::string& project,
                                               const std::string& prefix,
                                               const std::string& zone) {
  std::vector<std::string> matches;
  std::string page_token;
  for (int page = 0; page < 10000; ++page) {
    std::string path = "/v2alpha1/projects/" + project + "/locations/" + zone +
                       "/queuedResources?pageSize=1000";
    if (!page_token.empty()) path += "&pageToken=" + page_token;
    ASSIGN_OR_RETURN(HttpResponse response, controller.Call("GET", path));
    if (response.status / 100 != 2) return ErrorFromResponse(response);
    const json& body = response.body;
    if (!body.is_object()) return Internal("the controller's list is not JSON");
    for (const json& qr : body.value("queuedResources", json::array())) {
      const std::string name = qr.value("name", "");
      const std::string id = name.substr(name.rfind('/') + 1);
      const json spec = qr.contains("tpu") && qr["tpu"].is_object()
                            ? qr["tpu"].value("nodeSpec", json::array())
                            : json::array();
      if (!spec.is_array() || spec.empty() || !spec[0].is_object()) continue;
      const json& node = spec[0];
      bool match = node.value("nodeId", "") == prefix;
      if (node.contains("multiNodeParams") &&
          node["multiNodeParams"].is_object()) {
        std::string node_prefix =
            node["multiNodeParams"].value("nodeIdPrefix", "");
        if (node_prefix.empty()) node_prefix = id;
        match = match || node_prefix == prefix;
      }
      if (match) matches.push_back(id);
    }
    page_token = body.value("nextPageToken", "");
    if (page_token.empty()) break;
  }
  if (matches.empty()) {
    return NotFound("--tpu_prefix: no queued resource of project " + project +
                    (zone == "-" ? "" : " in zone " + zone) +
                    " has nodes named " + prefix + "-0, " + prefix +
                    "-1, ... or " + prefix);
  }
  if (matches.size() > 1) {
    std::string names;
    for (const std::string& m : matches) {
      names += (names.empty() ? "" : ", ") + m;
    }
    return InvalidArgument("--tpu_prefix: " + prefix +
                           " names the nodes of several queued resources (" +
                           names + "); choose one with --qr");
  }
  return matches[0];
}

Result<int> RunOnWorkers(const RunOptions& options) {
  if (options.command.empty()) return InvalidArgument("--command: empty");
  if (options.queued_resource.empty() == options.tpu_prefix.empty()) {
    return InvalidArgument("give exactly one of --qr and --tpu_prefix");
  }
  if (!ValidRunName(options.run_name)) {
    return InvalidArgument("--run_name: '" + options.run_name +
                           "' is not 1 to 100 of [A-Za-z0-9._-] starting "
                           "with a letter or digit");
  }
  Runner runner(options);
  return runner.Run();
}

}  // namespace multislice::control
