// The `queued-resources ssh` runner (see ssh.h): one thread polls every
// running exec in turn, so output lines of different workers never mix
// within a line.
#include "control/agent/ssh.h"

#include <deque>
#include <memory>
#include <thread>

#include "control/http.h"

namespace multislice::control {
namespace {

using Clock = std::chrono::steady_clock;

struct Task {
  explicit Task(RemoteExec remote) : exec(std::move(remote)) {}
  const SshTarget& target() const { return exec.target(); }
  RemoteExec exec;
  std::string prefix;   // "[node N worker W] "
  std::string partial;  // output after the last newline
  int exit_code = -1;
};

void PrintLines(FILE* out, Task& task, const std::string& output, bool flush) {
  task.partial += output;
  size_t start = 0;
  std::string lines;
  for (size_t nl; (nl = task.partial.find('\n', start)) != std::string::npos;
       start = nl + 1) {
    lines += task.prefix;
    lines.append(task.partial, start, nl + 1 - start);
  }
  task.partial.erase(0, start);
  if (flush && !task.partial.empty()) {
    lines += task.prefix + task.partial + "\n";
    task.partial.clear();
  }
  if (!lines.empty()) {
    std::fwrite(lines.data(), 1, lines.size(), out);
    std::fflush(out);
  }
}

// The selected workers of the queued resource, in node then worker order.
Result<std::vector<SshTarget>> ListTargets(const SshOptions& options) {
  ASSIGN_OR_RETURN(ApiClient controller,
                   ApiClient::Create(options.controller_url, options.token,
                                     options.http_timeout));
  ASSIGN_OR_RETURN(
      std::vector<SshTarget> all,
      ListQueuedResourceWorkers(controller, options.queued_resource));
  // Every index named must exist.
  int max_node = -1, max_worker = -1;
  for (const SshTarget& t : all) {
    max_node = std::max(max_node, t.node_index);
    max_worker = std::max(max_worker, t.worker);
  }
  if (!options.nodes.all && options.nodes.indices.back() > max_node) {
    return InvalidArgument(
        "--node: " + std::to_string(options.nodes.indices.back()) +
        " is out of range: " + options.queued_resource + " has nodes 0 to " +
        std::to_string(max_node));
  }
  if (!options.workers.all && options.workers.indices.back() > max_worker) {
    return InvalidArgument(
        "--worker: " + std::to_string(options.workers.indices.back()) +
        " is out of range: the nodes of " + options.queued_resource +
        " have workers 0 to " + std::to_string(max_worker));
  }
  std::vector<SshTarget> chosen;
  for (SshTarget& t : all) {
    if (options.nodes.Contains(t.node_index) &&
        options.workers.Contains(t.worker)) {
      chosen.push_back(std::move(t));
    }
  }
  if (chosen.empty()) {
    return InvalidArgument("--node/--worker select no worker of " +
                           options.queued_resource);
  }
  return chosen;
}

class Runner {
 public:
  explicit Runner(const SshOptions& options) : options_(options) {}

  int Run(std::vector<SshTarget> targets) {
    ExecTimings timings;
    timings.http_timeout = options_.http_timeout;
    timings.agent_lost_after = options_.agent_lost_after;
    for (SshTarget& t : targets) {
      auto task = std::make_unique<Task>(
          RemoteExec(std::move(t), options_.token, timings));
      task->prefix = "[node " + std::to_string(task->target().node_index) +
                     " worker " + std::to_string(task->target().worker) + "] ";
      pending_.push_back(std::move(task));
    }
    const size_t total = pending_.size();
    size_t limit = options_.batch_size > 0
                       ? static_cast<size_t>(options_.batch_size)
                       : total;
    Clock::time_point last_progress = Clock::now();
    while (!pending_.empty() || !running_.empty()) {
      if (options_.cancel != nullptr && options_.cancel->load()) {
        StopAll();
        return 130;
      }
      bool progress = false;
      while (running_.size() < limit && !pending_.empty()) {
        std::unique_ptr<Task> task = std::move(pending_.front());
        pending_.pop_front();
        if (StartTask(*task)) {
          running_.push_back(std::move(task));
        } else {
          Finish(*task, 255);
        }
        progress = true;
      }
      for (size_t i = 0; i < running_.size();) {
        if (PollTask(*running_[i])) {
          running_.erase(running_.begin() + static_cast<long>(i));
          progress = true;
        } else {
          ++i;
        }
      }
      const auto now = Clock::now();
      if (progress) last_progress = now;
      if (!pending_.empty() && limit < total &&
          now - last_progress >= options_.batch_wait) {
        std::fprintf(
            options_.err,
            "multislice queued-resources ssh: no worker of the batch of %d "
            "finished within %.1f s while %zu more wait to start; starting "
            "them all now (a command that waits for every worker would "
            "otherwise never finish)\n",
            options_.batch_size,
            std::chrono::duration<double>(options_.batch_wait).count(),
            pending_.size());
        std::fflush(options_.err);
        limit = total;
        continue;
      }
      if (!pending_.empty() || !running_.empty()) {
        std::this_thread::sleep_for(options_.poll_interval);
      }
    }
    return first_failure_;
  }

 private:
  bool StartTask(Task& task) {
    ExecRequest request;
    request.command = options_.command;
    Status started = task.exec.Start(request);
    if (!started.ok()) return Report(task, started);
    return true;
  }

  // Polls one running task; true when it has finished.
  bool PollTask(Task& task) {
    RemoteExec::Progress progress = task.exec.Poll();
    PrintLines(options_.out, task, progress.output, /*flush=*/progress.done);
    if (!progress.done) return false;
    if (!progress.lost.ok()) Report(task, progress.lost);
    Finish(task, progress.exit_code);
    return true;
  }

  bool Report(Task& task, const Status& status) {
    std::fprintf(options_.err,
                 "multislice queued-resources ssh: node %d worker %d (agent "
                 "%s): %s\n",
                 task.target().node_index, task.target().worker,
                 task.target().agent_address.c_str(), status.message().c_str());
    std::fflush(options_.err);
    return false;
  }

  void Finish(Task& task, int code) {
    task.exit_code = code;
    if (code != 0) {
      std::fprintf(options_.err,
                   "multislice queued-resources ssh: node %d worker %d "
                   "exited with code %d\n",
                   task.target().node_index, task.target().worker, code);
      std::fflush(options_.err);
      if (first_failure_ == 0) first_failure_ = code;
    }
  }

  void StopAll() {
    for (auto& task : running_) {
      task->exec.Stop(std::chrono::seconds(2)).ok();
      PrintLines(options_.out, *task, "", /*flush=*/true);
    }
    running_.clear();
  }

  const SshOptions& options_;
  std::deque<std::unique_ptr<Task>> pending_;
  std::vector<std::unique_ptr<Task>> running_;
  int first_failure_ = 0;
};

}  // namespace

Result<int> RunSsh(const SshOptions& options) {
  if (options.command.empty()) return InvalidArgument("--command: empty");
  if (options.batch_size < 0) {
    return InvalidArgument("--batch-size: expected at least 0, got " +
                           std::to_string(options.batch_size));
  }
  ASSIGN_OR_RETURN(std::vector<SshTarget> targets, ListTargets(options));
  Runner runner(options);
  return runner.Run(std::move(targets));
}

}  // namespace multislice::control
