// `multislice run` (see runner.h): on agents, setup on every worker
// concurrently, then one thread polls every running command in turn.
#include "control/agent/runner.h"

#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "control/agent/agent.h"
#include "control/agent/pack.h"
#include "control/agent/remote_exec.h"
#include "control/agent/run_output.h"
#include "control/agent/slurm_runner.h"

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

RunWorker IdOf(const WorkerTarget& t) { return {t.node_index, t.worker}; }

// One worker's command during the run; its output goes to the RunOutput's
// file of the same index.
struct WorkerRun {
  explicit WorkerRun(RemoteExec remote) : exec(std::move(remote)) {}
  const WorkerTarget& target() const { return exec.target(); }
  RemoteExec exec;
  bool done = false;
  int exit_code = -1;
};

class Runner {
 public:
  Runner(const RunOptions& options, std::string queued_resource)
      : options_(options),
        queued_resource_(std::move(queued_resource)),
        output_(options) {
    timings_.http_timeout = options.http_timeout;
    timings_.agent_lost_after = options.agent_lost_after;
  }

  Result<int> Run() {
    ASSIGN_OR_RETURN(ApiClient controller,
                     ApiClient::Create(options_.controller_url, options_.token,
                                       options_.http_timeout));
    ASSIGN_OR_RETURN(std::vector<WorkerTarget> targets,
                     ListQueuedResourceWorkers(controller, queued_resource_));
    std::string archive;
    if (!options_.use_existing_folder) {
      auto packed = PackRunScripts(options_, output_);
      if (Cancelled()) return output_.Interrupted(0);
      if (!packed.ok()) return packed.status();
      archive = ReadFileFrom((*packed)->archive);
    }
    if (Cancelled()) return output_.Interrupted(0);
    Status prepared = PrepareWorkers(
        targets, options_.use_existing_folder ? nullptr : &archive);
    if (Cancelled()) return output_.Interrupted(0);
    RETURN_IF_ERROR(prepared);
    RETURN_IF_ERROR(OpenOutputFiles(targets));
    RETURN_IF_ERROR(StartAll());
    return Follow();
  }

 private:
  bool Cancelled() const {
    return options_.cancel != nullptr && options_.cancel->load();
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
        return Status(results[i].code(), RunWorkerLabel(IdOf(targets[i])) +
                                             " (agent " +
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

  Status OpenOutputFiles(const std::vector<WorkerTarget>& targets) {
    std::vector<RunWorker> workers;
    for (const WorkerTarget& t : targets) {
      workers.push_back(IdOf(t));
      runs_.push_back(
          std::make_unique<WorkerRun>(RemoteExec(t, options_.token, timings_)));
    }
    return output_.Open(workers);
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
                    RunWorkerLabel(IdOf(runs_[i]->target())) +
                        ": cannot start the command: " + message);
    }
    return OkStatus();
  }

  // Polls every command until all succeed, one fails, or cancel.
  Result<int> Follow() {
    const size_t total = runs_.size();
    size_t completed = 0;
    std::optional<size_t> failed;
    while (completed < total && !failed) {
      if (Cancelled()) return output_.Interrupted(StopRunning());
      for (size_t i = 0; i < total; ++i) {
        WorkerRun& run = *runs_[i];
        if (run.done) continue;
        RemoteExec::Progress progress = run.exec.Poll();
        output_.Write(i, progress.output);
        if (!progress.done) continue;
        run.done = true;
        run.exit_code = progress.exit_code;
        ++completed;
        if (!progress.lost.ok()) {
          output_.Say(RunWorkerLabel(IdOf(run.target())) + ": agent " +
                      run.target().agent_address +
                      " lost: " + progress.lost.message());
        }
        if (run.exit_code != 0 && !failed) failed = i;
      }
      if (completed < total && !failed) {
        output_.ShowProgress(completed, FirstRunning());
        std::this_thread::sleep_for(options_.poll_interval);
      }
    }
    if (!failed) return output_.Succeeded();
    const size_t stopped = StopRunning();
    return output_.Failed(*failed, runs_[*failed]->exit_code, stopped);
  }

  size_t FirstRunning() const {
    size_t i = 0;
    while (i < runs_.size() && runs_[i]->done) ++i;
    return i;
  }

  // Stops every started command that has not ended, all at once, then reads
  // the rest of their output. Returns how many were stopped.
  size_t StopRunning() {
    std::vector<size_t> running;
    for (size_t i = 0; i < runs_.size(); ++i) {
      if (runs_[i]->exec.started() && !runs_[i]->done) running.push_back(i);
    }
    ForEachConcurrently(running.size(), kMaxParallelCalls, [&](size_t k) {
      WorkerRun& run = *runs_[running[k]];
      Status s = run.exec.Stop(options_.stop_grace);
      if (!s.ok()) {
        std::fprintf(options_.err, "multislice run: %s: stopping: %s\n",
                     RunWorkerLabel(IdOf(run.target())).c_str(),
                     s.message().c_str());
      }
    });
    const auto deadline = Clock::now() + kDrainTimeout;
    for (size_t i : running) {
      WorkerRun& run = *runs_[i];
      while (!run.done && Clock::now() < deadline) {
        RemoteExec::Progress progress = run.exec.Poll();
        output_.Write(i, progress.output);
        if (progress.done) {
          run.done = true;
          run.exit_code = progress.exit_code;
        } else if (progress.output.empty()) {
          std::this_thread::sleep_for(options_.poll_interval);
        }
      }
    }
    return running.size();
  }

  const RunOptions& options_;
  const std::string queued_resource_;
  ExecTimings timings_;
  RunOutput output_;
  std::vector<std::unique_ptr<WorkerRun>> runs_;
};

}  // namespace

Result<int> RunOnWorkers(const RunOptions& options) {
  RETURN_IF_ERROR(ValidateRunOptions(options));
  ASSIGN_OR_RETURN(RunTarget target, FindRunTarget(options));
  if (target.answer.is_object() && target.answer.contains("clusterJob")) {
    return RunOverSlurm(options, target.answer);
  }
  Runner runner(options, target.id);
  return runner.Run();
}

}  // namespace multislice::control
