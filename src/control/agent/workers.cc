// The agent's worker and exec tables (see workers.h).
//
// Locking: mu_ guards the tables; it is never held while a group is started
// or stopped (which can take the stop grace). A worker being started or
// stopped is marked `busy`, so that a second start or stop of the same name
// is refused instead of racing.
#include "control/agent/workers.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace multislice::control {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// After SIGKILL, how long a stop waits for the group before giving up.
constexpr milliseconds kKillTimeout{10000};
// Finished execs kept for reading their output; older ones are dropped.
constexpr size_t kMaxFinishedExecs = 64;

std::string RandomHex(int bytes) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    unsigned v = static_cast<unsigned>(rng() & 0xff);
    out += kDigits[v >> 4];
    out += kDigits[v & 15];
  }
  return out;
}

// Writes `text` to `path` with `mode` via a temporary file and a rename, so a
// reader never sees half a script.
Status WriteFileAtomically(const std::string& path, const std::string& text,
                           mode_t mode) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return Internal("cannot write " + tmp);
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return Internal("cannot write " + tmp);
    }
    done += static_cast<size_t>(n);
  }
  ::fchmod(fd, mode);
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    return Internal("cannot write " + path);
  }
  return OkStatus();
}

Status AppendToFile(const std::string& path, const std::string& text) {
  int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Internal("cannot open " + path);
  bool ok = ::write(fd, text.data(), text.size()) ==
            static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok ? OkStatus() : Internal("cannot write " + path);
}

}  // namespace

bool ValidWorkerName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '-')) {
      return false;
    }
  }
  return name[0] != '.' && name[0] != '-';
}

bool ValidExecTag(const std::string& tag) {
  if (tag.empty() || tag.size() > 128) return false;
  for (char c : tag) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '/' ||
          c == ':' || c == '-')) {
      return false;
    }
  }
  return true;
}

bool ValidRelativePath(const std::string& path) {
  if (path.empty() || path.size() > 1024 || path[0] == '/' ||
      path.find('\0') != std::string::npos) {
    return false;
  }
  size_t start = 0;
  for (;;) {
    const size_t slash = path.find('/', start);
    const std::string part = path.substr(
        start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

struct WorkerTable::Worker {
  std::string name;
  int attempt = 0;
  std::vector<std::string> env;  // of the latest attempt, also given to execs
  std::string directory;
  std::string log;
  std::shared_ptr<ProcessGroup> group;  // null before the first start
  bool busy = false;                    // a start or stop is under way
};

struct WorkerTable::Exec {
  std::string id;
  std::string worker;  // empty: none
  std::string tag;     // empty: none
  std::string log;
  std::shared_ptr<ProcessGroup> group;
  Clock::time_point finished_at{};  // set once seen done
  bool done = false;
};

WorkerTable::WorkerTable(std::string workdir, ProcessLauncher* launcher,
                         milliseconds stop_grace)
    : workdir_(std::move(workdir)),
      launcher_(launcher),
      stop_grace_(stop_grace) {}

WorkerTable::~WorkerTable() { Shutdown(); }

json WorkerTable::StatusJson(const Worker& w) {
  json s = {{"name", w.name},           {"attempt", w.attempt},
            {"pid", nullptr},           {"state", "EXITED"},
            {"exitCode", nullptr},      {"signal", nullptr},
            {"directory", w.directory}, {"log", w.log}};
  if (w.group) {
    ProcessState p = w.group->Poll();
    s["pid"] = p.pid;
    // RUNNING while any process of the group lives: a script that exits
    // leaving its job in the background (`nohup train &`) still runs, and
    // must be stopped before another attempt.
    if (!p.group_gone) s["state"] = "RUNNING";
    if (!p.running) {
      s["exitCode"] = p.ShellExitCode();
      s["signal"] = p.signal;
    }
  } else if (w.busy) {
    s["state"] = "RUNNING";  // being started
  }
  return s;
}

json WorkerTable::Statuses() {
  std::lock_guard<std::mutex> lock(mu_);
  json out = json::array();
  for (auto& [name, w] : workers_) out.push_back(StatusJson(*w));
  return out;
}

size_t WorkerTable::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_.size();
}

Result<json> WorkerTable::Start(const std::string& name, int attempt,
                                const std::string& script,
                                const std::vector<std::string>& env) {
  if (!ValidWorkerName(name)) {
    return InvalidArgument(
        "worker name: expected 1 to 128 of [a-z0-9.-] starting with a letter "
        "or digit");
  }
  std::shared_ptr<Worker> worker;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return Unavailable("the agent is shutting down");
    auto& slot = workers_[name];
    if (!slot) {
      slot = std::make_shared<Worker>();
      slot->name = name;
      slot->directory = workdir_ + "/workers/" + name;
      slot->log = slot->directory + "/startup-script.log";
    }
    worker = slot;
    if (worker->busy) {
      return Aborted("worker " + name + " is being started or stopped");
    }
    if (worker->group && !worker->group->Poll().group_gone) {
      return FailedPrecondition(
          "worker " + name + " is still running (attempt " +
          std::to_string(worker->attempt) + "); stop it first");
    }
    worker->busy = true;
  }
  Status launched = Launch(*worker, attempt, script, env);
  std::lock_guard<std::mutex> lock(mu_);
  worker->busy = false;
  if (!launched.ok()) return launched;
  return StatusJson(*worker);
}

// Runs without mu_; the worker is marked busy.
Status WorkerTable::Launch(Worker& worker, int attempt,
                           const std::string& script,
                           const std::vector<std::string>& env) {
  std::error_code ec;
  std::filesystem::create_directories(worker.directory, ec);
  if (ec) {
    return Internal("cannot create " + worker.directory + ": " + ec.message());
  }
  RETURN_IF_ERROR(WriteFileAtomically(worker.directory + "/startup-script.sh",
                                      script, 0700));
  RETURN_IF_ERROR(AppendToFile(
      worker.log, "=== attempt " + std::to_string(attempt) + " ===\n"));
  ProcessSpec spec;
  spec.argv = {"/bin/bash", "startup-script.sh"};
  spec.env = env;
  spec.directory = worker.directory;
  spec.log_path = worker.log;
  spec.lease_path = lease_path_;
  spec.uid = worker_uid_;
  spec.gid = worker_gid_;
  if (worker_uid_ >= 0) {
    for (const std::string& path :
         {worker.directory, worker.directory + "/startup-script.sh"}) {
      if (::chown(path.c_str(), worker_uid_, worker_gid_) != 0) {
        return Internal("cannot give " + path +
                        " to the worker user: " + std::strerror(errno));
      }
    }
  }
  auto group = launcher_->Start(spec);
  if (!group.ok()) return group.status();
  std::shared_ptr<ProcessGroup> started(std::move(group).value());
  bool too_late = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    worker.group = started;
    worker.attempt = attempt;
    worker.env = env;
    too_late = shutting_down_;
  }
  // Shutdown() may have collected the groups to stop before this one
  // existed: stop it here.
  if (too_late) {
    started->Stop(stop_grace_, kKillTimeout).status().ok();
    return Unavailable("the agent is shutting down");
  }
  return OkStatus();
}

Result<json> WorkerTable::Stop(const std::string& name, milliseconds grace) {
  std::shared_ptr<Worker> worker;
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workers_.find(name);
    if (it == workers_.end()) return NotFound("no worker named " + name);
    worker = it->second;
    if (worker->busy) {
      return Aborted("worker " + name + " is being started or stopped");
    }
    worker->busy = true;
    group = worker->group;
  }
  Status stopped = OkStatus();
  if (group) stopped = group->Stop(grace, kKillTimeout).status();
  std::lock_guard<std::mutex> lock(mu_);
  worker->busy = false;
  if (!stopped.ok()) return stopped;
  return StatusJson(*worker);
}

Result<std::string> WorkerTable::StartExec(
    const std::string& command, const std::string& worker,
    const std::vector<std::string>& env) {
  ExecSpec spec;
  spec.command = command;
  spec.worker = worker;
  spec.env = env;
  return StartExec(spec);
}

Result<std::string> WorkerTable::StartExec(const ExecSpec& request) {
  if (!request.directory.empty() && !ValidRelativePath(request.directory)) {
    return InvalidArgument("directory: '" + request.directory.substr(0, 64) +
                           "' is not a relative path without '.' or '..'");
  }
  if (!request.tag.empty() && !ValidExecTag(request.tag)) {
    return InvalidArgument("tag: expected 1 to 128 of [A-Za-z0-9._/:-]");
  }
  std::string directory = workdir_;
  std::vector<std::string> env;
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return Unavailable("the agent is shutting down");
    if (!request.worker.empty()) {
      auto it = workers_.find(request.worker);
      if (it == workers_.end()) {
        return NotFound("no worker named " + request.worker);
      }
      directory = it->second->directory;
      env = it->second->env;  // the worker's environment, as ssh sees it
    }
    id = "exec-" + std::to_string(++exec_counter_) + "-" + RandomHex(4);
  }
  if (!request.directory.empty()) {
    const std::string base = directory;
    directory += "/" + request.directory;
    std::error_code ec;
    if (!std::filesystem::is_directory(directory, ec)) {
      return NotFound("no directory " + request.directory + " in " + base);
    }
  }
  env.insert(env.end(), request.env.begin(), request.env.end());
  auto exec = std::make_shared<Exec>();
  exec->id = id;
  exec->worker = request.worker;
  exec->tag = request.tag;
  exec->log = workdir_ + "/exec/" + id + ".log";
  std::error_code ec;
  std::filesystem::create_directories(workdir_ + "/exec", ec);
  ProcessSpec spec;
  spec.argv = {"/bin/bash", "-c", request.command};
  spec.env = env;
  spec.directory = directory;
  spec.log_path = exec->log;
  auto group = launcher_->Start(spec);
  if (!group.ok()) return group.status();
  exec->group = std::shared_ptr<ProcessGroup>(std::move(group).value());
  bool too_late = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    too_late = shutting_down_;
    if (!too_late) {
      execs_[id] = exec;
      DropOldExecsLocked();
    }
  }
  if (too_late) {  // Shutdown() has already collected the groups
    exec->group->Stop(milliseconds(0), kKillTimeout).status().ok();
    return Unavailable("the agent is shutting down");
  }
  return id;
}

// Forgets the oldest finished execs (and their logs) beyond
// kMaxFinishedExecs. Requires mu_.
void WorkerTable::DropOldExecsLocked() {
  std::vector<std::shared_ptr<Exec>> finished;
  for (auto& [id, e] : execs_) {
    if (e->done) finished.push_back(e);
  }
  if (finished.size() <= kMaxFinishedExecs) return;
  std::sort(finished.begin(), finished.end(), [](const auto& a, const auto& b) {
    return a->finished_at < b->finished_at;
  });
  for (size_t i = 0; i + kMaxFinishedExecs < finished.size(); ++i) {
    std::error_code ec;
    std::filesystem::remove(finished[i]->log, ec);
    execs_.erase(finished[i]->id);
  }
}

Result<ExecChunk> WorkerTable::ReadExec(const std::string& id,
                                        long long offset) {
  if (offset < 0) return InvalidArgument("offset: negative");
  std::shared_ptr<Exec> exec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = execs_.find(id);
    if (it == execs_.end()) return NotFound("no exec named " + id);
    exec = it->second;
  }
  // The state is taken before reading, so that "done" is only reported
  // with output read after the command's end.
  ProcessState state = exec->group->Poll();
  ExecChunk chunk;
  {
    std::ifstream in(exec->log, std::ios::binary);
    in.seekg(offset);
    if (in) {
      chunk.output.resize(kMaxExecChunkBytes);
      in.read(chunk.output.data(),
              static_cast<std::streamsize>(chunk.output.size()));
      chunk.output.resize(static_cast<size_t>(in.gcount()));
    }
  }
  chunk.next_offset = offset + static_cast<long long>(chunk.output.size());
  chunk.done = !state.running && chunk.output.size() < kMaxExecChunkBytes;
  if (chunk.done) {
    chunk.exit_code = state.ShellExitCode();
    std::lock_guard<std::mutex> lock(mu_);
    if (!exec->done) {
      exec->done = true;
      exec->finished_at = Clock::now();
    }
  }
  return chunk;
}

Result<int> WorkerTable::StopExec(const std::string& id, milliseconds grace) {
  std::shared_ptr<Exec> exec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = execs_.find(id);
    if (it == execs_.end()) return NotFound("no exec named " + id);
    exec = it->second;
  }
  ASSIGN_OR_RETURN(ProcessState state, exec->group->Stop(grace, kKillTimeout));
  return state.ShellExitCode();
}

Result<std::vector<StoppedExec>> WorkerTable::StopTaggedExecs(
    const std::string& worker, const std::string& tag_prefix,
    milliseconds grace) {
  if (tag_prefix.empty()) return InvalidArgument("tagPrefix: empty");
  std::vector<std::shared_ptr<Exec>> matching;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (workers_.count(worker) == 0) {
      return NotFound("no worker named " + worker);
    }
    for (auto& [id, e] : execs_) {
      if (e->worker == worker && e->tag.rfind(tag_prefix, 0) == 0 &&
          !e->group->Poll().group_gone) {
        matching.push_back(e);
      }
    }
  }
  std::vector<Result<ProcessState>> states(matching.size(),
                                           Internal("not stopped"));
  std::vector<std::thread> stoppers;
  for (size_t i = 0; i < matching.size(); ++i) {
    stoppers.emplace_back(
        [&, i] { states[i] = matching[i]->group->Stop(grace, kKillTimeout); });
  }
  for (auto& t : stoppers) t.join();
  std::vector<StoppedExec> stopped;
  for (size_t i = 0; i < matching.size(); ++i) {
    if (!states[i].ok()) return states[i].status();
    stopped.push_back(
        {matching[i]->id, matching[i]->tag, states[i]->ShellExitCode()});
  }
  return stopped;
}

Result<std::string> WorkerTable::WorkerDirectory(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(name);
  if (it == workers_.end()) return NotFound("no worker named " + name);
  return it->second->directory;
}

void WorkerTable::Shutdown() {
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    for (auto& [name, w] : workers_) {
      if (w->group) groups.push_back(w->group);
    }
    for (auto& [id, e] : execs_) groups.push_back(e->group);
  }
  // Every group at once, each with the grace; a second call finds them gone
  // and returns at once.
  std::vector<std::thread> stoppers;
  for (auto& g : groups) {
    stoppers.emplace_back([this, g] {
      auto s = g->Stop(stop_grace_, kKillTimeout);
      if (!s.ok()) {
        std::fprintf(stderr, "multislice agent: %s\n",
                     s.status().message().c_str());
      }
    });
  }
  for (auto& t : stoppers) t.join();
}

}  // namespace multislice::control
