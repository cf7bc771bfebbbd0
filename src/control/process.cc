// The real ProcessLauncher: fork + setsid + execve from one spawning thread,
// and process groups reaped and stopped by polling (see process.h).
#include "control/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

extern char** environ;

namespace multislice::control {
namespace {

using Clock = std::chrono::steady_clock;

std::string Errno() { return std::strerror(errno); }

// The path execve() should run for argv[0]: as given when it holds a '/',
// else the first executable match in PATH (as given when none matches, so
// that execve fails and the child exits 127).
std::string ResolveProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return name;
}

// Moves a descriptor to 3 or above (keeping O_CLOEXEC), so that the child's
// dup2() onto 0, 1 and 2 cannot overwrite it when this process runs with a
// standard stream closed.
int AboveStdio(int fd) {
  if (fd < 0 || fd > 2) return fd;
  int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  ::close(fd);
  return moved;
}

void WriteAllFd(int fd, const char* text, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, text, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text += n;
    size -= static_cast<size_t>(n);
  }
}

// What the forked child needs, all prepared before fork().
struct ChildSetup {
  const char* program;
  char* const* argv;
  char* const* envp;
  const char* directory;  // null: stay
  int log_fd;
  int null_fd;
  int sync_fd;
  pid_t agent;
  int death_signal;        // sent to the guardian when the agent dies
  const char* lease_path;  // null: no lease
  int uid, gid;            // -1: keep ours
};

// Whether the lease at `path` is still valid: a deadline in BootTimeNs()
// units that has not passed. Async-signal-safe.
bool LeaseValid(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[32];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  if (n <= 0 || n >= static_cast<ssize_t>(sizeof(buf))) return false;
  int64_t deadline = 0;
  for (ssize_t i = 0; i < n && buf[i] != '\n'; ++i) {
    if (buf[i] < '0' || buf[i] > '9') return false;
    deadline = deadline * 10 + (buf[i] - '0');
  }
  timespec now{};
  ::clock_gettime(CLOCK_BOOTTIME, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec < deadline;
}

// Waits for `worker`; with a lease, reads it every kLeasePollMs and kills
// the whole group (this guardian included) once it lapsed.
// Async-signal-safe.
int WaitForWorker(pid_t worker, const char* lease_path) {
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(worker, &status, lease_path ? WNOHANG : 0);
    if (r == worker) return status;
    if (r < 0 && errno != EINTR) ::_exit(127);
    if (lease_path == nullptr) continue;
    if (!LeaseValid(lease_path)) ::kill(0, SIGKILL);
    timespec pause{0, kLeasePollMs * 1000000L};
    ::nanosleep(&pause, nullptr);
  }
}

// Closes every descriptor from `from` up, except `keep`.
void CloseFrom(int from, int keep) {
  for (int fd = from; fd < 65536; ++fd) {
    if (fd == keep) continue;
    if (fd > keep &&
        ::syscall(SYS_close_range, static_cast<unsigned>(fd), ~0U, 0U) == 0) {
      return;
    }
    ::close(fd);
  }
}

// The guardian's handler of the agent's death: SIGKILL to its whole group
// (itself included), so that grandchildren die with the agent too.
void KillOwnGroup(int) { ::kill(0, SIGKILL); }

// The worker program, in the guardian's child. Async-signal-safe calls only.
[[noreturn]] void ExecWorker(const ChildSetup& c) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with the guardian
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::dup2(c.null_fd, 0);
  ::dup2(c.log_fd, 1);
  ::dup2(c.log_fd, 2);
  // Nothing of the agent (listening socket, connections) leaks into the
  // program; the sync pipe is closed by execve (O_CLOEXEC).
  CloseFrom(3, c.sync_fd);
  // Raw system calls: this is the only thread, and glibc's wrappers would
  // try to reach the parent's other threads.
  if (c.uid >= 0 && (::syscall(SYS_setgroups, 0, nullptr) != 0 ||
                     ::syscall(SYS_setresgid, c.gid, c.gid, c.gid) != 0 ||
                     ::syscall(SYS_setresuid, c.uid, c.uid, c.uid) != 0)) {
    const char msg[] = "multislice: cannot switch to the worker user\n";
    WriteAllFd(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  if (c.directory != nullptr && ::chdir(c.directory) != 0) {
    const char msg[] = "multislice: cannot enter the working directory\n";
    WriteAllFd(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::execve(c.program, c.argv, c.envp);
  const char msg[] = "multislice: cannot execute the program\n";
  WriteAllFd(2, msg, sizeof msg - 1);
  ::_exit(127);
}

// The group leader: a forked copy of this process that never execs. It
// starts the program, exits with the program's status (re-raising the
// signal that ended it), and on the agent's death kills its whole group:
// PR_SET_PDEATHSIG alone would only reach the agent's direct child, not the
// processes the script started. It ignores SIGTERM, SIGINT, SIGHUP and
// SIGQUIT, which a stop sends to the whole group, so that it outlives the
// program and reports its status. Async-signal-safe calls only.
[[noreturn]] void GuardianMain(const ChildSetup& c) {
  ::setsid();
  ::prctl(PR_SET_NAME, "ms-guardian");  // its command line stays the agent's
  struct sigaction on_death {};
  on_death.sa_handler = KillOwnGroup;
  sigemptyset(&on_death.sa_mask);
  ::sigaction(c.death_signal, &on_death, nullptr);
  ::prctl(PR_SET_PDEATHSIG, c.death_signal);
  if (::getppid() != c.agent) ::_exit(127);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  pid_t worker = ::fork();
  if (worker == 0) ExecWorker(c);
  if (worker < 0) ::_exit(127);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE}) {
    ::signal(sig, SIG_IGN);
  }
  ::signal(SIGCHLD, SIG_DFL);
  CloseFrom(0, -1);  // also releases the sync pipe: Start() may return
  const int status = WaitForWorker(worker, c.lease_path);
  if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  if (sig != 0) {
    struct rlimit no_core {};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::signal(sig, SIG_DFL);
    ::kill(::getpid(), sig);
  }
  ::_exit(128 + sig);
}

class RealProcessGroup final : public ProcessGroup {
 public:
  explicit RealProcessGroup(pid_t pid) { state_.pid = pid; }

  pid_t pid() const override { return state_.pid; }

  ProcessState Poll() override {
    std::lock_guard<std::mutex> lock(mu_);
    return PollLocked();
  }

  ProcessState Wait(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      ProcessState s = Poll();
      if (!s.running || Clock::now() >= deadline) return s;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
  }

  Result<ProcessState> Stop(std::chrono::milliseconds grace,
                            std::chrono::milliseconds kill_timeout) override {
    if (!Signal(SIGTERM)) return Poll();
    if (WaitGone(grace)) return Poll();
    if (!Signal(SIGKILL)) return Poll();
    if (WaitGone(kill_timeout)) return Poll();
    return DeadlineExceeded("process group " + std::to_string(state_.pid) +
                            " still has live processes " +
                            std::to_string(kill_timeout.count()) +
                            " ms after SIGKILL");
  }

 private:
  // Reaps what has exited and updates state_. Requires mu_.
  ProcessState PollLocked() {
    if (state_.group_gone) return state_;
    ReapLocked();
    // The group id stays reserved while any member exists, so signalling it
    // is safe until the group is seen empty; after that the id may be
    // reused and is never signalled again.
    if (!state_.running && !ProcessGroupAlive(state_.pid)) {
      state_.group_gone = true;
      ReapLocked();  // members that died during the check are zombies here
    }
    return state_;
  }

  void ReapLocked() {
    for (;;) {
      int status = 0;
      pid_t reaped = ::waitpid(-state_.pid, &status, WNOHANG);
      if (reaped < 0 && errno == EINTR) continue;
      if (reaped <= 0) break;
      if (reaped == state_.pid) {
        state_.running = false;
        if (WIFEXITED(status)) state_.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) state_.signal = WTERMSIG(status);
      }
    }
  }

  // Sends `sig` to the group unless it is gone; returns whether it was sent.
  bool Signal(int sig) {
    std::lock_guard<std::mutex> lock(mu_);
    if (PollLocked().group_gone) return false;
    ::kill(-state_.pid, sig);
    return true;
  }

  bool WaitGone(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      if (Poll().group_gone) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
  }

  std::mutex mu_;
  ProcessState state_;
};

// Runs every fork() on one long-lived thread: PR_SET_PDEATHSIG fires when
// the *thread* that forked the child exits, so children must not be started
// from short-lived threads (HTTP handler threads, test threads).
class RealProcessLauncher final : public ProcessLauncher {
 public:
  RealProcessLauncher() {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    thread_ = std::thread([this] { Loop(); });
  }
  ~RealProcessLauncher() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  Result<std::unique_ptr<ProcessGroup>> Start(
      const ProcessSpec& spec) override {
    if (spec.argv.empty()) return InvalidArgument("empty command line");
    std::packaged_task<Result<std::unique_ptr<ProcessGroup>>()> task(
        [&spec] { return Spawn(spec); });
    auto future = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
    return future.get();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return done_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // done_ and nothing left
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  // Everything the child needs is prepared before fork(), so that the child
  // makes only async-signal-safe calls until execve().
  static Result<std::unique_ptr<ProcessGroup>> Spawn(const ProcessSpec& spec) {
    if (!spec.directory.empty()) {
      struct stat st {};
      if (::stat(spec.directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        return FailedPrecondition("cannot use directory " + spec.directory +
                                  ": not a directory");
      }
    }
    const std::string log_path =
        spec.log_path.empty() ? "/dev/null" : spec.log_path;
    int log_fd = AboveStdio(::open(
        log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (log_fd < 0) {
      return Internal("cannot open log file " + log_path + ": " + Errno());
    }
    int null_fd = AboveStdio(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (null_fd < 0) {
      ::close(log_fd);
      return Internal("cannot open /dev/null: " + Errno());
    }

    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    for (const std::string& kv : spec.env) {
      const std::string name = kv.substr(0, kv.find('=') + 1);
      std::erase_if(env_strings, [&](const std::string& s) {
        return s.compare(0, name.size(), name) == 0;
      });
      env_strings.push_back(kv);
    }
    std::vector<char*> envp, argv;
    for (std::string& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = spec.argv;
    const std::string program = ResolveProgram(args[0]);
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    const char* directory =
        spec.directory.empty() ? nullptr : spec.directory.c_str();
    const pid_t parent = ::getpid();
    const int death_signal = SIGRTMIN + 3;
    // Closed by execve (or _exit) in the child: reading EOF from it means the
    // child has its own session, so signalling -pid reaches it.
    int sync_pipe[2];
    if (::pipe2(sync_pipe, O_CLOEXEC) != 0 ||
        (sync_pipe[1] = AboveStdio(sync_pipe[1])) < 0) {
      std::string error = Errno();
      ::close(log_fd);
      ::close(null_fd);
      return Internal("pipe failed: " + error);
    }
    const int sync_fd = sync_pipe[1];

    pid_t pid = ::fork();
    if (pid < 0) {
      std::string error = Errno();
      ::close(log_fd);
      ::close(null_fd);
      ::close(sync_pipe[0]);
      ::close(sync_pipe[1]);
      return Internal("fork failed: " + error);
    }
    if (pid == 0) {
      ChildSetup setup{
          program.c_str(),
          argv.data(),
          envp.data(),
          directory,
          log_fd,
          null_fd,
          sync_fd,
          parent,
          death_signal,
          spec.lease_path.empty() ? nullptr : spec.lease_path.c_str(),
          spec.uid,
          spec.gid};
      GuardianMain(setup);
    }
    ::close(log_fd);
    ::close(null_fd);
    ::close(sync_pipe[1]);
    char byte;
    while (::read(sync_pipe[0], &byte, 1) < 0 && errno == EINTR) {
    }
    ::close(sync_pipe[0]);
    return std::unique_ptr<ProcessGroup>(new RealProcessGroup(pid));
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<Result<std::unique_ptr<ProcessGroup>>()>>
      tasks_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

Result<UserIds> ResolveUser(const std::string& field, const std::string& user) {
  const size_t colon = user.find(':');
  if (colon != std::string::npos) {
    char* end = nullptr;
    const long uid = std::strtol(user.c_str(), &end, 10);
    const bool uid_ok = end == user.c_str() + colon && colon > 0;
    const long gid = std::strtol(user.c_str() + colon + 1, &end, 10);
    if (uid_ok && *end == '\0' && colon + 1 < user.size() && uid > 0 &&
        gid > 0 && uid < (1L << 31) && gid < (1L << 31)) {
      return UserIds{static_cast<int>(uid), static_cast<int>(gid)};
    }
    return InvalidArgument(field + ": '" + user +
                           "' is not UID:GID with two positive numbers");
  }
  const passwd* entry = ::getpwnam(user.c_str());
  if (entry == nullptr || entry->pw_uid == 0) {
    return InvalidArgument(field + ": '" + user +
                           "' is not a user of this host other than root "
                           "(or UID:GID)");
  }
  return UserIds{static_cast<int>(entry->pw_uid),
                 static_cast<int>(entry->pw_gid)};
}

int64_t BootTimeNs() {
  timespec now{};
  ::clock_gettime(CLOCK_BOOTTIME, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

Status WriteLease(const std::string& path, int64_t deadline_ns) {
  const std::string temp = path + ".tmp";
  const std::string text = std::to_string(deadline_ns) + "\n";
  const int fd =
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return Internal("cannot write the lease " + temp + ": " + Errno());
  const bool ok = ::write(fd, text.data(), text.size()) ==
                  static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok || ::rename(temp.c_str(), path.c_str()) != 0) {
    return Internal("cannot write the lease " + path + ": " + Errno());
  }
  return OkStatus();
}

bool ProcessGroupAlive(pid_t pgid) {
  if (pgid <= 0) return false;
  if (::kill(-pgid, 0) != 0 && errno == ESRCH) return false;
  // Something answers: it may be only zombies (reparented to a parent that
  // has not reaped them yet), which count as gone.
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return true;
  bool alive = false;
  while (dirent* entry = ::readdir(proc)) {
    const char* name = entry->d_name;
    if (name[0] < '0' || name[0] > '9') continue;
    std::ifstream stat_file(std::string("/proc/") + name + "/stat");
    std::string line;
    if (!std::getline(stat_file, line)) continue;
    // pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
    size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %ld %ld", &state, &ppid,
                    &pgrp) != 3) {
      continue;
    }
    if (pgrp == pgid && state != 'Z' && state != 'X') {
      alive = true;
      break;
    }
  }
  ::closedir(proc);
  return alive;
}

std::unique_ptr<ProcessLauncher> NewProcessLauncher() {
  return std::make_unique<RealProcessLauncher>();
}

}  // namespace multislice::control
