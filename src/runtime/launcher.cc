#include "runtime/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "common/temp_dir.h"
#include "runtime/comm/dcn/store.h"
#include "runtime/membership.h"
#include "runtime/mesh/topology.h"
#include "runtime/slurm_env.h"

extern char** environ;

namespace multislice::runtime {
namespace {

volatile std::sig_atomic_t g_forwarded_signal = 0;

void RecordSignal(int sig) { g_forwarded_signal = sig; }

void WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// One output stream of one child, relayed line by line with a prefix; without
// a prefix, relayed byte for byte as it comes (so that a progress bar redrawn
// with '\r' reaches the terminal).
struct Relay {
  int fd = -1;
  int to_fd = 1;
  std::string prefix;
  std::string partial;

  // Reads what is available; returns false at end of stream.
  bool Pump() {
    char buf[65536];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
      Flush();
      ::close(fd);
      fd = -1;
      return false;
    }
    if (prefix.empty()) {
      WriteAll(to_fd, std::string(buf, static_cast<size_t>(n)));
      return true;
    }
    partial.append(buf, static_cast<size_t>(n));
    std::string lines;
    size_t start = 0;
    for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos;
         start = nl + 1) {
      lines += prefix;
      lines.append(partial, start, nl + 1 - start);
    }
    partial.erase(0, start);
    if (!lines.empty()) WriteAll(to_fd, lines);
    return true;
  }
  void Flush() {
    if (!partial.empty()) WriteAll(to_fd, prefix + partial + "\n");
    partial.clear();
  }
};

struct Child {
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;
};

int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

// Starts one worker; returns its pid or -1. Everything the child needs is
// prepared before fork() so that the child only makes async-signal-safe
// calls until exec.
pid_t Spawn(const WorkerProcess& worker, int out_write, int err_write,
            int out_read, int err_read) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const std::string& kv : worker.env) {
    const std::string name = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env_strings, [&](const std::string& s) {
      return s.compare(0, name.size(), name) == 0;
    });
    env_strings.push_back(kv);
  }
  std::vector<char*> envp, argv;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = worker.argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid != 0) return pid;
  // Child.
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  ::dup2(out_write, 1);
  ::dup2(err_write, 2);
  ::close(out_read);
  ::close(err_read);
  ::close(out_write);
  ::close(err_write);
  ::execve(argv[0], argv.data(), envp.data());
  const char msg[] = "multislice: cannot start worker program\n";
  (void)!::write(2, msg, sizeof msg - 1);
  ::_exit(127);
}

// A SIGTERM is followed by SIGCONT, as kill(1) and systemd do, so that a
// stopped (hung) worker acts on it instead of holding the launcher for the
// whole stop grace.
void SignalAll(std::vector<Child>& children, int sig) {
  for (Child& c : children) {
    if (!c.running) continue;
    ::kill(-c.pid, sig);
    if (sig == SIGTERM) ::kill(-c.pid, SIGCONT);
  }
}

// The failure domains lost so far (LaunchOptions::domains).
class LostDomains {
 public:
  explicit LostDomains(const LaunchOptions& options) : options_(options) {}

  // Worker i failed with `code`. True when the others go on: its domain is
  // stopped and recorded (or was already, and i is one of its workers
  // being stopped). False when no other domain is left: the caller stops
  // everyone, with the domain's first failure as the cause.
  bool Lose(size_t i, int code, std::vector<Child>& children,
            const std::vector<int>& incarnations, LaunchResult& result) {
    const int domain = options_.domains[i];
    if (lost_.count(domain)) return true;
    lost_.insert(domain);
    std::set<int> all(options_.domains.begin(), options_.domains.end());
    if (lost_.size() == all.size()) {
      if (first_cause_ >= 0) {
        result.exit_code = first_code_;
        result.failed_worker = first_cause_;
      }
      return false;
    }
    if (first_cause_ < 0) {
      first_cause_ = static_cast<int>(i);
      first_code_ = code;
    }
    for (size_t j = 0; j < children.size(); ++j) {
      if (options_.domains[j] != domain) continue;
      if (j != i && children[j].running) ::kill(-children[j].pid, SIGKILL);
      if (j != i && options_.on_gone) {
        options_.on_gone(static_cast<int>(j), incarnations[j]);
      }
      result.lost_workers.push_back(static_cast<int>(j));
    }
    if (options_.on_gone)
      options_.on_gone(static_cast<int>(i), incarnations[i]);
    if (restarts_[domain] < options_.domain_restarts) {
      ++restarts_[domain];
      to_restart_.insert(domain);
    }
    return true;
  }

  // A lost domain due for a restart whose workers are all reaped: it is no
  // longer lost (its workers are started again by the caller).
  std::optional<int> TakeRestart(const std::vector<Child>& children) {
    for (int domain : to_restart_) {
      bool reaped = true;
      for (size_t j = 0; j < children.size(); ++j) {
        if (options_.domains[j] == domain && children[j].running) {
          reaped = false;
        }
      }
      if (!reaped) continue;
      to_restart_.erase(domain);
      lost_.erase(domain);
      return domain;
    }
    return std::nullopt;
  }
  bool restart_pending() const { return !to_restart_.empty(); }

 private:
  const LaunchOptions& options_;
  std::set<int> lost_, to_restart_;
  std::map<int, int> restarts_;  // by domain
  int first_cause_ = -1;
  int first_code_ = 0;
};

}  // namespace

bool ShowProgress() {
  const char* forced = std::getenv("MULTISLICE_PROGRESS");
  if (forced != nullptr) return std::string(forced) == "1";
  return ::isatty(2) == 1;
}

std::string SelfExecutable() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : path.string();
}

LaunchResult RunWorkers(const LaunchOptions& options) {
  struct sigaction action {
  }, old_int{}, old_term{};
  action.sa_handler = RecordSignal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, &old_int);
  ::sigaction(SIGTERM, &action, &old_term);
  g_forwarded_signal = 0;

  const size_t n = options.workers.size();
  std::vector<Child> children(n);
  std::vector<int> incarnations(n, 0);
  std::vector<Relay> relays;
  LaunchResult result;
  // Starts worker i in its current incarnation; false (with the failure
  // recorded) when it cannot.
  auto start = [&](size_t i) {
    WorkerProcess worker = options.workers[i];
    if (incarnations[i] > 0) {
      worker.env.push_back("MULTISLICE_INCARNATION=" +
                           std::to_string(incarnations[i]));
    }
    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 ||
        ::pipe2(err_pipe, O_CLOEXEC) != 0) {
      std::perror("multislice: pipe");
      result.exit_code = 1;
      result.failed_worker = static_cast<int>(i);
      return false;
    }
    pid_t pid =
        Spawn(worker, out_pipe[1], err_pipe[1], out_pipe[0], err_pipe[0]);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    if (pid < 0) {
      ::close(out_pipe[0]);
      ::close(err_pipe[0]);
      std::perror("multislice: fork");
      result.exit_code = 1;
      result.failed_worker = static_cast<int>(i);
      return false;
    }
    ::setpgid(pid, pid);  // also done by the child; whichever runs first
    children[i] = {pid, true, 0};
    relays.push_back({out_pipe[0], options.out_fd,
                      worker.prefix_stdout ? worker.prefix : std::string(),
                      ""});
    relays.push_back({err_pipe[0], options.err_fd, worker.prefix, ""});
    return true;
  };
  for (size_t i = 0; i < n && start(i); ++i) {
  }

  LostDomains domains(options);
  using Clock = std::chrono::steady_clock;
  bool stopping = result.exit_code != 0;
  Clock::time_point kill_at = Clock::now() + options.stop_grace;
  Clock::time_point first_failure = Clock::now();
  if (stopping) SignalAll(children, SIGTERM);

  auto any_running = [&] {
    for (const Child& c : children)
      if (c.running) return true;
    return false;
  };
  while (any_running() || (!stopping && domains.restart_pending())) {
    while (!stopping) {
      const std::optional<int> domain = domains.TakeRestart(children);
      if (!domain.has_value()) break;
      result.restarted_domains.push_back(*domain);
      for (size_t j = 0; j < n; ++j) {
        if (options.domains[j] != *domain) continue;
        ++incarnations[j];
        if (!start(j)) stopping = true;
      }
      if (stopping) SignalAll(children, SIGTERM);
    }
    std::vector<pollfd> fds;
    std::vector<Relay*> open;
    for (Relay& r : relays) {
      if (r.fd >= 0) {
        fds.push_back({r.fd, POLLIN, 0});
        open.push_back(&r);
      }
    }
    ::poll(fds.data(), fds.size(), 50);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) open[i]->Pump();
    }
    for (size_t i = 0; i < n; ++i) {
      Child& c = children[i];
      if (!c.running) continue;
      int status = 0;
      pid_t got = ::waitpid(c.pid, &status, WNOHANG);
      if (got != c.pid) continue;
      c.running = false;
      c.exit_code = ExitCodeOf(status);
      if (c.exit_code != 0 && !stopping && !options.domains.empty()) {
        if (domains.Lose(i, c.exit_code, children, incarnations, result)) {
          continue;
        }
      }
      if (c.exit_code != 0 && result.exit_code == 0) {
        result.exit_code = c.exit_code;
        result.failed_worker = static_cast<int>(i);
        first_failure = Clock::now();
      } else if (!stopping && WIFSIGNALED(status) && result.exit_code != 0 &&
                 result.exit_code < 128) {
        // Killed before we signalled anyone: the cause, not the peer that
        // exited 1 on noticing it.
        result.exit_code = c.exit_code;
        result.failed_worker = static_cast<int>(i);
      }
    }
    const bool cause_window_over =
        result.exit_code != 0 &&
        Clock::now() - first_failure >= options.cause_window;
    if (!stopping && (cause_window_over || g_forwarded_signal != 0)) {
      if (result.exit_code == 0) result.exit_code = 128 + g_forwarded_signal;
      stopping = true;
      kill_at = Clock::now() + options.stop_grace;
      SignalAll(children, SIGTERM);
    }
    if (stopping && Clock::now() >= kill_at) SignalAll(children, SIGKILL);
  }
  // Drain what the children wrote before exiting.
  for (Relay& r : relays) {
    while (r.fd >= 0 && r.Pump()) {
    }
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  return result;
}

namespace {

std::string RunIdOf(const LocalJobOptions& options) {
  return options.run_id.empty() ? "local-" + std::to_string(::getpid())
                                : options.run_id;
}

std::string StoreAddressOf(const LocalJobOptions& options,
                           const std::string& store_dir) {
  return options.store_address.empty() ? "file://" + store_dir
                                       : options.store_address;
}

// With continue_without_lost_slices: every slice is a failure domain, and
// its workers are recorded gone in the job's store (membership.h) when it
// is lost.
void LetSlicesBeLost(const LocalJobOptions& options,
                     const std::string& store_dir, LaunchOptions& launch) {
  const int hosts = HostsPerSlice(options.accelerator_type);
  for (size_t w = 0; w < launch.workers.size(); ++w) {
    launch.domains.push_back(static_cast<int>(w) / hosts);
  }
  auto address = dcn::ParseStoreAddress(StoreAddressOf(options, store_dir));
  Result<std::shared_ptr<gloo::rendezvous::Store>> store =
      address.ok() ? dcn::OpenStore(*address,
                                    RunIdOf(options) + "/" +
                                        std::to_string(options.attempt) + "/",
                                    std::chrono::seconds(10))
                   : address.status();
  if (!store.ok()) {
    // The workers then fail on the store themselves; a lost slice would
    // not be recorded, so its survivors would time out.
    std::fprintf(stderr,
                 "multislice: warning: lost slices cannot be recorded: %s\n",
                 store.status().message().c_str());
    return;
  }
  launch.on_gone = [store = *store](int worker, int incarnation) {
    RecordGone(*store, worker, incarnation);
  };
  launch.domain_restarts = options.slice_restarts;
}

}  // namespace

std::vector<WorkerProcess> LocalWorkers(const LocalJobOptions& options,
                                        const std::string& store_dir) {
  std::vector<WorkerProcess> workers;
  const int hosts = HostsPerSlice(options.accelerator_type);
  for (int index = 0; index < options.num_slices * hosts; ++index) {
    const int s = index / hosts;
    WorkerEnv w;
    w.coordinator_address = StoreAddressOf(options, store_dir);
    w.num_slices = options.num_slices;
    w.slice_id = s;
    w.worker_id = index % hosts;
    w.worker_hostnames.assign(hosts, "127.0.0.1");
    w.accelerator_type = options.accelerator_type;
    w.run_id = RunIdOf(options);
    w.attempt = options.attempt;
    WorkerProcess p;
    p.argv = options.argv;
    p.argv[0] = SelfExecutable();
    p.env = w.ToEnvironment();
    p.env.push_back(std::string("MULTISLICE_PROGRESS=") +
                    (ShowProgress() ? "1" : "0"));
    p.prefix = "[" + w.name() + "] ";
    p.prefix_stdout = !(options.raw_stdout_of_first_worker && index == 0);
    workers.push_back(std::move(p));
  }
  return workers;
}

int HostsPerSlice(const std::string& accelerator_type) {
  auto type = mesh::ParseAcceleratorType(accelerator_type);
  return type.ok() ? type->hosts_per_slice() : 1;
}

Result<std::optional<WorkerEnv>> ReadJobEnvironment(
    const LocalJobOptions& options, const EnvLookup& lookup) {
  if (InSlurmStep(lookup) && !lookup("MEGASCALE_SLICE_ID")) {
    return ReadSlurmWorkerEnv(lookup, options.num_slices,
                              options.accelerator_type);
  }
  return ReadWorkerEnv(lookup);
}

int RunLocalJob(const LocalJobOptions& options,
                const std::function<int(const WorkerEnv&)>& worker_main) {
  auto env = ReadJobEnvironment(options, ProcessEnvironment());
  if (!env.ok()) {
    std::fprintf(stderr, "multislice: %s\n", env.status().message().c_str());
    return 2;
  }
  if (env->has_value()) return worker_main(**env);

  TempDir store_dir("multislice-store-");
  if (!store_dir.ok()) {
    std::perror("multislice: cannot create the rendezvous directory");
    return 1;
  }
  LaunchOptions launch;
  launch.workers = LocalWorkers(options, store_dir.path());
  if (options.continue_without_lost_slices) {
    LetSlicesBeLost(options, store_dir.path(), launch);
  }
  LaunchResult result = RunWorkers(launch);
  const int hosts = HostsPerSlice(options.accelerator_type);
  if (result.exit_code == 0 && !result.lost_workers.empty()) {
    std::set<int> slices;
    for (int w : result.lost_workers) slices.insert(w / hosts);
    for (int slice : slices) {
      const auto restarts = std::count(result.restarted_domains.begin(),
                                       result.restarted_domains.end(), slice);
      if (restarts == 0) {
        std::fprintf(stderr,
                     "multislice: slice %d was lost; the other slices went on "
                     "without it\n",
                     slice);
      } else {
        std::fprintf(stderr,
                     "multislice: slice %d was lost and started again (%ld "
                     "time%s); the other slices went on meanwhile\n",
                     slice, static_cast<long>(restarts),
                     restarts == 1 ? "" : "s");
      }
    }
  }
  if (result.exit_code != 0 && result.failed_worker >= 0) {
    std::fprintf(
        stderr,
        "multislice: %s exited with code %d; stopped the "
        "other workers\n",
        WorkerName(result.failed_worker / hosts, result.failed_worker % hosts)
            .c_str(),
        result.exit_code);
  }
  return result.exit_code;
}

}  // namespace multislice::runtime
