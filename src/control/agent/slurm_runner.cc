// `multislice run` on Slurm (slurm_runner.h): a stop of the earlier run's
// steps, a setup step and the command's step, each an `srun --jobid`
// whose output goes to a file that one thread demultiplexes.
#include "control/agent/slurm_runner.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "common/temp_dir.h"
#include "control/agent/run_output.h"
#include "control/process.h"

namespace multislice::control {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;

// A step stopped with KILL must be gone within this.
constexpr milliseconds kKillTimeout{5000};
// srun must end within this once its tasks have.
constexpr milliseconds kSrunExitTimeout{5000};
// How often the job's steps are listed while a stop waits.
constexpr milliseconds kStopPoll{100};

// Run by srun on each worker's node (slurm_runner.h): finds the node's
// worker in MULTISLICE_RUN_LABELS ("NODE:SLICE:WORKER:TASK ..."), then
// sources the job's batch script with its srun replaced by this worker's
// task, whose startup script is MULTISLICE_RUN_SCRIPT.
constexpr const char* kTaskDriver = R"(_ms_batch=$MULTISLICE_RUN_BATCH
export SLURM_RESTART_COUNT=$MULTISLICE_RUN_RESTARTS
_ms_node=
for _ms_e in $MULTISLICE_RUN_LABELS; do
  IFS=: read -r _ms_host _ms_n _ms_w _ms_task <<<"$_ms_e"
  if [ "$_ms_host" = "$SLURMD_NODENAME" ]; then _ms_node=$_ms_host; break; fi
done
if [ -z "$_ms_node" ]; then
  echo "multislice run: node $SLURMD_NODENAME holds no worker" >&2; exit 1
fi
_ms_script=$(mktemp) || exit 1
# A stop's TERM ends this driver once the task has ended (no exit line).
trap 'rm -f -- "$_ms_script"' EXIT
trap 'exit 143' TERM
printf '%s\n' "$MULTISLICE_RUN_SCRIPT" > "$_ms_script" || exit 1
unset MULTISLICE_RUN_LABELS MULTISLICE_RUN_BATCH MULTISLICE_RUN_RESTARTS \
  MULTISLICE_RUN_SCRIPT
srun() {
  while [[ $1 == -* ]]; do shift; done
  # sed ignores the TERM of a stop: what the command says then still
  # arrives.
  SLURM_PROCID=$_ms_task MULTISLICE_SLURM_STARTUP=$_ms_script "$@" 2>&1 |
    (trap '' TERM; exec sed -u "s/^/[node $_ms_n worker $_ms_w] /")
  _ms_code=${PIPESTATUS[0]}
  printf '\036multislice-run-exit %s %s %s\n' "$_ms_n" "$_ms_w" "$_ms_code"
  exit "$_ms_code"
}
. "$_ms_batch"
echo "multislice run: $_ms_batch started no srun step" >&2
exit 1
)";

// The run's scripts, in place of the startup script (in the worker's
// directory, with its environment).
constexpr const char* kUnpackScript =
    "mkdir -p -- \"$MULTISLICE_RUN_NAME\" && "
    "tar -xzf - -C \"$MULTISLICE_RUN_NAME\"";
constexpr const char* kCheckFolderScript =
    "[ -d \"$MULTISLICE_RUN_NAME\" ] || "
    "{ echo \"no folder $MULTISLICE_RUN_NAME in $PWD\"; exit 1; }";
constexpr const char* kCommandScript =
    "cd -- \"$MULTISLICE_RUN_NAME\" || exit; "
    "_ms_command=$MULTISLICE_RUN_COMMAND; unset MULTISLICE_RUN_COMMAND; "
    "exec bash -c \"$_ms_command\"";

// Reads a decimal at text[*pos], advancing *pos; false without digits.
bool ReadInt(const std::string& text, size_t* pos, int* value) {
  const size_t start = *pos;
  long long v = 0;
  while (*pos < text.size() &&
         std::isdigit(static_cast<unsigned char>(text[*pos])) &&
         *pos - start < 9) {
    v = v * 10 + (text[*pos] - '0');
    ++*pos;
  }
  *value = static_cast<int>(v);
  return *pos > start;
}

// "[node N worker W] rest": N, W and where rest starts.
bool ParseLabel(const std::string& line, int* node, int* worker, size_t* rest) {
  size_t pos = 0;
  auto literal = [&](const char* text) {
    const size_t n = std::char_traits<char>::length(text);
    if (line.compare(pos, n, text) != 0) return false;
    pos += n;
    return true;
  };
  if (!literal("[node ") || !ReadInt(line, &pos, node) ||
      !literal(" worker ") || !ReadInt(line, &pos, worker) || !literal("] ")) {
    return false;
  }
  *rest = pos;
  return true;
}

// One worker: who it is, its node, and its task's index in the job (the
// batch script's SLURM_PROCID: slice * hosts per slice + worker).
struct SlurmWorker {
  RunWorker id;
  std::string node;
  int task = 0;
};

// What `scontrol show job` says of the queued resource's job.
struct SlurmJob {
  std::string id;
  std::string batch_script;  // Command=
  std::string workdir;       // WorkDir=
  int restarts = 0;
};

// Slurm's commands, each to its end or `timeout`, through the process
// launcher (its output, stdout and stderr together, in a scratch file).
class SlurmCommands {
 public:
  SlurmCommands(ProcessLauncher& launcher, std::string scratch,
                milliseconds timeout)
      : launcher_(launcher), scratch_(std::move(scratch)), timeout_(timeout) {}

  Result<std::string> Run(const std::vector<std::string>& argv) {
    ProcessSpec spec;
    spec.argv = argv;
    spec.log_path = scratch_ + "/command-" + std::to_string(++count_) + ".log";
    ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> child,
                     launcher_.Start(spec));
    const ProcessState state = child->Wait(timeout_);
    child->Stop(milliseconds(0)).status().ok();  // ends or reaps what is left
    std::string output = ReadFileFrom(spec.log_path, 0);
    std::remove(spec.log_path.c_str());
    const std::string line = argv[0] + (argv.size() > 1 ? " " + argv[1] : "");
    if (state.running) {
      return DeadlineExceeded(line + " did not finish within " +
                              std::to_string(timeout_.count()) + " ms");
    }
    if (state.ShellExitCode() == 127) {
      return Unavailable(line +
                         " could not be run (is Slurm's client "
                         "installed here?)");
    }
    if (state.ShellExitCode() != 0) {
      return Unavailable(line + " failed: " + LastLine(output));
    }
    return output;
  }

 private:
  ProcessLauncher& launcher_;
  const std::string scratch_;
  const milliseconds timeout_;
  int count_ = 0;
};

// The job's state, restarts, batch script and working directory; its
// steps; stopping them.
class JobSteps {
 public:
  JobSteps(SlurmCommands& commands, std::string job)
      : commands_(commands), job_(std::move(job)) {}

  Result<SlurmJob> Describe(const std::string& queued_resource) {
    ASSIGN_OR_RETURN(std::string text,
                     commands_.Run({"scontrol", "show", "job", job_}));
    SlurmJob job;
    job.id = job_;
    std::map<std::string, std::string> fields;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      const size_t start = line.find_first_not_of(' ');
      if (start == std::string::npos) continue;
      line = line.substr(start);
      // Paths take the whole line (they may hold spaces).
      for (auto [key, field] : {std::pair{"Command=", &job.batch_script},
                                std::pair{"WorkDir=", &job.workdir}}) {
        if (line.rfind(key, 0) == 0) *field = line.substr(strlen(key));
      }
      std::istringstream words(line);
      for (std::string word; words >> word;) {
        const size_t eq = word.find('=');
        if (eq != std::string::npos && eq > 0) {
          fields.emplace(word.substr(0, eq), word.substr(eq + 1));
        }
      }
    }
    const std::string state = fields["JobState"];
    if (state != "RUNNING") {
      return FailedPrecondition(
          "queued resource " + queued_resource + ": its Slurm job " + job_ +
          " is " + (state.empty() ? "unknown" : state) +
          ", not RUNNING (is the queued resource ACTIVE?)");
    }
    if (job.batch_script.empty() || job.workdir.empty()) {
      return Internal("scontrol show job " + job_ +
                      " names no batch script (Command=) or WorkDir=");
    }
    job.restarts = std::atoi(fields["Restarts"].c_str());
    return job;
  }

  // The ids of the job's steps whose name `match` accepts.
  Result<std::vector<std::string>> Find(
      const std::function<bool(const std::string&)>& match) {
    ASSIGN_OR_RETURN(std::string text,
                     commands_.Run({"squeue", "--noheader", "--steps",
                                    "--jobs=" + job_, "--format=%i|%j"}));
    std::vector<std::string> ids;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      const size_t bar = line.find('|');
      if (bar == std::string::npos) continue;
      const std::string id = line.substr(0, bar);
      if (id.rfind(job_ + ".", 0) == 0 && match(line.substr(bar + 1))) {
        ids.push_back(id);
      }
    }
    return ids;
  }

  // Sends TERM to the matching steps, KILL to those left after `grace`,
  // and waits until none is left (DeadlineExceeded after kKillTimeout).
  // Returns how many there were.
  Result<size_t> Stop(const std::function<bool(const std::string&)>& match,
                      milliseconds grace) {
    ASSIGN_OR_RETURN(std::vector<std::string> ids, Find(match));
    if (ids.empty()) return size_t{0};
    const size_t count = ids.size();
    for (const auto& [signal, wait] :
         {std::pair{"TERM", grace}, std::pair{"KILL", kKillTimeout}}) {
      std::vector<std::string> argv = {"scancel",
                                       std::string("--signal=") + signal};
      argv.insert(argv.end(), ids.begin(), ids.end());
      // A step that ended meanwhile is an error to scancel; the listing
      // decides.
      commands_.Run(argv).status().ok();
      const auto deadline = Clock::now() + wait;
      for (;;) {
        ASSIGN_OR_RETURN(std::vector<std::string> left, Find(match));
        std::vector<std::string> still;
        for (const std::string& id : left) {
          if (std::find(ids.begin(), ids.end(), id) != ids.end()) {
            still.push_back(id);
          }
        }
        ids = std::move(still);
        if (ids.empty()) return count;
        if (Clock::now() >= deadline) break;
        std::this_thread::sleep_for(kStopPoll);
      }
    }
    return DeadlineExceeded("step " + ids[0] + " did not end after KILL");
  }

 private:
  SlurmCommands& commands_;
  const std::string job_;
};

// One srun step over every worker: started, then polled for what its
// tasks wrote (by worker) and their exit codes.
class Step {
 public:
  // `name` is the step's name; `workers` index every callback.
  Step(std::string name, const std::vector<SlurmWorker>& workers,
       std::string log_path)
      : name_(std::move(name)),
        workers_(workers),
        log_path_(std::move(log_path)) {
    for (size_t i = 0; i < workers.size(); ++i) {
      index_[{workers[i].id.slice, workers[i].id.worker}] = i;
    }
  }

  const std::string& name() const { return name_; }

  // Starts srun; `archive` (a file) becomes every task's stdin.
  Status Start(ProcessLauncher& launcher, const SlurmJob& job,
               const std::string& script, const std::string* archive,
               std::vector<std::string> env) {
    std::string nodes, labels;
    for (const SlurmWorker& w : workers_) {
      nodes += (nodes.empty() ? "" : ",") + w.node;
      labels += w.node + ":" + std::to_string(w.id.slice) + ":" +
                std::to_string(w.id.worker) + ":" + std::to_string(w.task) +
                " ";
    }
    const std::string count = std::to_string(workers_.size());
    ProcessSpec spec;
    if (archive != nullptr) {  // the launcher gives children /dev/null
      spec.argv = {"bash", "-c", "exec \"$@\" < \"$0\"", *archive};
    }
    const std::vector<std::string> srun = {
        "srun",
        "--jobid=" + job.id,
        "--overlap",
        "--quiet",
        "--job-name=" + name_,
        "--chdir=" + job.workdir,
        "--nodelist=" + nodes,
        "--nodes=" + count,
        "--ntasks=" + count,
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        archive != nullptr ? "--input=all" : "--input=none",
        "bash",
        "-c",
        kTaskDriver};
    spec.argv.insert(spec.argv.end(), srun.begin(), srun.end());
    env.push_back("MULTISLICE_RUN_LABELS=" + labels);
    env.push_back("MULTISLICE_RUN_BATCH=" + job.batch_script);
    env.push_back("MULTISLICE_RUN_RESTARTS=" + std::to_string(job.restarts));
    env.push_back("MULTISLICE_RUN_SCRIPT=" + script);
    spec.env = std::move(env);
    spec.log_path = log_path_;
    ASSIGN_OR_RETURN(srun_, launcher.Start(spec));
    return OkStatus();
  }

  using Output = std::function<void(size_t, std::string_view)>;
  using Exit = std::function<void(size_t, int)>;

  // Hands over what arrived since the last call; false once srun has
  // ended and everything it wrote was read.
  bool Poll(const Output& output, const Exit& exited) {
    const ProcessState state = srun_->Poll();
    const std::string fresh = ReadFileFrom(log_path_, offset_);
    offset_ += fresh.size();
    pending_ += fresh;
    size_t start = 0;
    for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos;
         start = nl + 1) {
      Line(pending_.substr(start, nl + 1 - start), output, exited);
    }
    pending_.erase(0, start);
    if (state.running) return true;
    if (!pending_.empty()) Line(pending_, output, exited);
    pending_.clear();
    exit_code_ = state.ShellExitCode();
    return false;
  }

  // Stops the step (TERM, KILL after `grace`) and waits for srun to end,
  // reading the rest of its output.
  Status Stop(JobSteps& steps, milliseconds grace, const Output& output,
              const Exit& exited) {
    auto stopped = steps.Stop(
        [this](const std::string& step) { return step == name_; }, grace);
    // Not listed (yet): srun itself is stopped, which ends its step.
    if (stopped.ok() && *stopped == 0) srun_->Stop(grace).status().ok();
    const auto deadline = Clock::now() + kSrunExitTimeout;
    while (Poll(output, exited)) {
      if (Clock::now() >= deadline) {
        srun_->Stop(milliseconds(0)).status().ok();
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    return stopped.status();
  }

  int exit_code() const { return exit_code_; }
  // srun's own last message (not a task's output), for errors.
  const std::string& last_message() const { return last_message_; }

 private:
  void Line(const std::string& line, const Output& output, const Exit& exited) {
    const std::string marker = std::string("\x1e") + kSlurmRunExitMarker;
    const size_t at = line.find(marker);
    int node = 0, worker = 0;
    size_t rest = 0;
    const std::string text = line.substr(0, at);
    if (ParseLabel(text, &node, &worker, &rest)) {
      auto it = index_.find({node, worker});
      if (it != index_.end()) output(it->second, text.substr(rest));
    } else if (!text.empty() && text != "\n") {
      last_message_ = LastLine(text);
    }
    if (at == std::string::npos) return;
    // "N W CODE"
    std::istringstream fields(line.substr(at + marker.size()));
    int code = 0;
    if (fields >> node >> worker >> code) {
      auto it = index_.find({node, worker});
      if (it != index_.end()) exited(it->second, code);
    }
  }

  const std::string name_;
  const std::vector<SlurmWorker>& workers_;
  const std::string log_path_;
  std::map<std::pair<int, int>, size_t> index_;
  std::unique_ptr<ProcessGroup> srun_;
  size_t offset_ = 0;
  std::string pending_;  // read, not yet a whole line
  int exit_code_ = -1;
  std::string last_message_;
};

class SlurmRunner {
 public:
  SlurmRunner(const RunOptions& options, std::string queued_resource,
              std::string job, std::vector<SlurmWorker> workers)
      : options_(options),
        queued_resource_(std::move(queued_resource)),
        workers_(std::move(workers)),
        launcher_(NewProcessLauncher()),
        commands_(*launcher_, scratch_.path(), options.http_timeout),
        steps_(commands_, std::move(job)),
        output_(options) {}

  Result<int> Run() {
    if (!scratch_.ok()) return Internal("cannot create a temporary directory");
    ASSIGN_OR_RETURN(SlurmJob job, steps_.Describe(queued_resource_));
    std::unique_ptr<PackedScripts> packed;
    if (!options_.use_existing_folder) {
      auto p = PackRunScripts(options_, output_);
      if (Cancelled()) return output_.Interrupted(0);
      if (!p.ok()) return p.status();
      packed = std::move(p).value();
    }
    if (Cancelled()) return output_.Interrupted(0);
    auto stopped = steps_.Stop(
        [](const std::string& step) {
          return step.rfind(kRunTagPrefix, 0) == 0;
        },
        options_.stop_grace);
    if (!stopped.ok()) {
      return Status(stopped.status().code(),
                    "stopping an earlier run: " + stopped.status().message());
    }
    Status prepared = Prepare(job, packed ? &packed->archive : nullptr);
    if (Cancelled()) return output_.Interrupted(0);
    RETURN_IF_ERROR(prepared);
    std::vector<RunWorker> ids;
    for (const SlurmWorker& w : workers_) ids.push_back(w.id);
    RETURN_IF_ERROR(output_.Open(ids));
    return Follow(job);
  }

 private:
  bool Cancelled() const {
    return options_.cancel != nullptr && options_.cancel->load();
  }

  std::string WorkerName(size_t i) const {
    return RunWorkerLabel(workers_[i].id) + " (node " + workers_[i].node + ")";
  }

  std::vector<std::string> RunEnv() const {
    return {"MULTISLICE_RUN_NAME=" + options_.run_name};
  }

  // The setup step: unpacks `archive` into RUN_NAME/ on every worker, or
  // (null) checks that RUN_NAME/ is there. The first failure names its
  // worker.
  Status Prepare(const SlurmJob& job, const std::string* archive) {
    Step step(kRunTagPrefix + options_.run_name + "/setup", workers_,
              scratch_.path() + "/setup.log");
    RETURN_IF_ERROR(step.Start(*launcher_, job,
                               archive ? kUnpackScript : kCheckFolderScript,
                               archive, RunEnv()));
    std::vector<std::string> said(workers_.size());
    std::vector<std::optional<int>> codes(workers_.size());
    auto output = [&](size_t i, std::string_view bytes) { said[i] += bytes; };
    auto exited = [&](size_t i, int code) { codes[i] = code; };
    const auto deadline = Clock::now() + options_.setup_timeout;
    while (step.Poll(output, exited)) {
      if (Cancelled() || Clock::now() >= deadline) {
        step.Stop(steps_, milliseconds(0), output, exited).ok();
        return DeadlineExceeded(
            Cancelled()
                ? "interrupted"
                : "setting up the workers did not finish within " +
                      std::to_string(options_.setup_timeout.count() / 1000) +
                      " s");
      }
      std::this_thread::sleep_for(options_.poll_interval);
    }
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (codes[i] == 0) continue;
      if (!codes[i]) {
        return Unavailable(WorkerName(i) + ": its setup task gave no exit " +
                           "code (srun exited with code " +
                           std::to_string(step.exit_code()) +
                           "): " + step.last_message());
      }
      if (archive != nullptr) {
        return Internal(WorkerName(i) +
                        ": unpacking the scripts failed (exit code " +
                        std::to_string(*codes[i]) + "): " + LastLine(said[i]));
      }
      return NotFound(WorkerName(i) + ": " + LastLine(said[i]) +
                      " (--use_existing_folder needs an earlier run named " +
                      options_.run_name + " on every worker)");
    }
    return OkStatus();
  }

  // The command's step until every worker succeeded, one failed, or
  // cancel.
  Result<int> Follow(const SlurmJob& job) {
    Step step(kRunTagPrefix + options_.run_name, workers_,
              scratch_.path() + "/run.log");
    std::vector<std::string> env = RunEnv();
    env.push_back("MULTISLICE_RUN_COMMAND=" + options_.command);
    RETURN_IF_ERROR(step.Start(*launcher_, job, kCommandScript, nullptr, env));
    const size_t total = workers_.size();
    std::vector<std::optional<int>> codes(total);
    size_t completed = 0;
    std::optional<size_t> failed;
    auto output = [&](size_t i, std::string_view bytes) {
      output_.Write(i, bytes);
    };
    auto exited = [&](size_t i, int code) {
      if (codes[i]) return;
      codes[i] = code;
      ++completed;
      if (code != 0 && !failed) failed = i;
    };
    bool running = true;
    while (running && !failed) {
      if (Cancelled()) {
        const size_t left = total - completed;
        StopStep(step, output, exited);
        return output_.Interrupted(left);
      }
      running = step.Poll(output, exited);
      if (running && !failed) {
        output_.ShowProgress(completed, FirstRunning(codes));
        std::this_thread::sleep_for(options_.poll_interval);
      }
    }
    if (failed) {
      const size_t stopped = total - completed;
      StopStep(step, output, exited);
      return output_.Failed(*failed, *codes[*failed], stopped);
    }
    if (completed == total) return output_.Succeeded();
    // srun ended without some worker's exit code: its task or node was
    // lost.
    const size_t lost = FirstRunning(codes);
    const int code = step.exit_code() > 0 ? step.exit_code() : 255;
    output_.Say(WorkerName(lost) + ": its task gave no exit code (srun " +
                "exited with code " + std::to_string(step.exit_code()) +
                "): " + step.last_message());
    return output_.Failed(lost, code, 0);
  }

  void StopStep(Step& step, const Step::Output& output,
                const Step::Exit& exited) {
    Status s = step.Stop(steps_, options_.stop_grace, output, exited);
    if (!s.ok())
      output_.Say("stopping step " + step.name() + ": " + s.message());
  }

  static size_t FirstRunning(const std::vector<std::optional<int>>& codes) {
    size_t i = 0;
    while (i < codes.size() && codes[i]) ++i;
    return i;
  }

  const RunOptions& options_;
  const std::string queued_resource_;
  const std::vector<SlurmWorker> workers_;
  TempDir scratch_{"multislice-run-slurm-"};
  std::unique_ptr<ProcessLauncher> launcher_;
  SlurmCommands commands_;
  JobSteps steps_;
  RunOutput output_;
};

}  // namespace

Result<int> RunOverSlurm(const RunOptions& options,
                         const json& queued_resource) {
  RETURN_IF_ERROR(ValidateRunOptions(options));
  const std::string name = queued_resource.value("name", "");
  const std::string id = name.substr(name.rfind('/') + 1);
  const json job = queued_resource.value("clusterJob", json());
  if (!job.is_string() || job.get<std::string>().empty()) {
    return Internal("queued resource " + id + " has no Slurm job (clusterJob)");
  }
  // Task i of the batch script is slice i / hosts per slice's worker
  // i % hosts per slice, on node i of the job (reconciler_cluster.cc).
  std::vector<SlurmWorker> workers;
  const json nodes = queued_resource.value("nodes", json::array());
  for (size_t i = 0; nodes.is_array() && i < nodes.size(); ++i) {
    const json hosts = nodes[i].is_object()
                           ? nodes[i].value("hosts", json::array())
                           : json::array();
    bool complete = hosts.is_array() && !hosts.empty();
    for (size_t w = 0; complete && w < hosts.size(); ++w) {
      complete = hosts[w].is_string() && !hosts[w].get<std::string>().empty();
      if (!complete) break;
      workers.push_back({{static_cast<int>(i), static_cast<int>(w)},
                         hosts[w].get<std::string>(),
                         static_cast<int>(i * hosts.size() + w)});
    }
    if (!complete) {
      workers.clear();
      break;
    }
  }
  if (workers.empty()) {
    return FailedPrecondition("queued resource " + id +
                              " has no workers (is it ACTIVE?)");
  }
  SlurmRunner runner(options, id, job.get<std::string>(), std::move(workers));
  return runner.Run();
}

}  // namespace multislice::control
