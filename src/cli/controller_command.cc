// `multislice controller`: the queued-resource controller daemon
// (control/controller.h), and with --local-hosts N the N host agents of a
// one-machine setup, each a `multislice agent` child in its own working
// directory under the data dir. Runs until SIGTERM or SIGINT; then stops the
// agents (which stop their workers), reaps them, and exits 0.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "control/controller.h"
#include "control/http.h"
#include "control/process.h"
#include "control/slurm_capacity.h"
#include "runtime/launcher.h"
#include "runtime/mesh/topology.h"

namespace multislice::cli {
namespace {

constexpr const char* kName = "multislice controller";

struct ControllerCommandFlags {
  int port = 8470;
  int agent_port = 0;
  std::string bind = "127.0.0.1";
  std::string advertise_address;
  std::string data_dir = "multislice-controller";
  std::string token_file;  // default: <data-dir>/token
  std::string heartbeat_timeout = "5";
  int local_hosts = 0;
  std::string local_accelerator_type = "cpu-2";
  std::string local_worker_user;
  int local_ssh_port = 22;
  std::string zone = "local-a";
  std::vector<std::string> quotas;  // TIER=CHIPS
  std::string capacity = "agents";  // agents | slurm
  std::string slurm_partition;
  std::string slurm_workdir;                       // default: DATA_DIR/slurm
  std::vector<std::string> slurm_tier_partitions;  // TIER=PARTITION
  std::string metrics_address;  // HOST:PORT; "": /metrics on --port only
};

// Whether any process of process group `group` is alive: zombies do not
// count (orphans may wait a while for whoever reaps them), so kill(-group,
// 0) will not do.
bool GroupHasLiveProcess(int group) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) {
      continue;
    }
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(line.substr(paren + 2));
    char state = 0;
    int ppid = 0, pgrp = 0;
    if (rest >> state >> ppid >> pgrp && pgrp == group && state != 'Z') {
      return true;
    }
  }
  return false;
}

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  return code;
}

// --metrics_address HOST:PORT into the options' metrics listener; false
// when it is not that.
bool SetMetricsAddress(const std::string& address,
                       control::ControllerOptions& options) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  const auto port = ParseInteger(address.substr(colon + 1));
  if (!port || *port < 0 || *port > 65535) return false;
  options.metrics_bind_address = address.substr(0, colon);
  options.metrics_port = static_cast<int>(*port);
  return true;
}

// "uids:BASE": local agent i runs its workers as uid BASE+1+i, group BASE,
// so that workers of different local hosts (different queued resources)
// cannot read each other's processes; otherwise the one user for all.
std::string LocalWorkerUser(const ControllerCommandFlags& flags, int index) {
  const std::string& u = flags.local_worker_user;
  if (u.rfind("uids:", 0) != 0) return u;
  const long base = std::strtol(u.c_str() + 5, nullptr, 10);
  return std::to_string(base + 1 + index) + ":" + std::to_string(base);
}

// The loopback address of local host `index`'s sshd, 127.A.B.C: every local
// host has its own, so each has a port 22 as a machine of its own would.
// A and B are drawn once per controller (two controllers on one machine
// then almost never meet); C runs 2..251, then B moves on.
std::string LocalSshAddress(int index) {
  static const auto [a, b] = [] {
    std::random_device rd;
    return std::pair<int, int>(1 + static_cast<int>(rd() % 254),
                               static_cast<int>(rd() % 250));
  }();
  return "127." + std::to_string(a) + "." + std::to_string(b + index / 250) +
         "." + std::to_string(2 + index % 250);
}

pid_t SpawnAgent(const std::string& url, const std::string& token_file,
                 const ControllerCommandFlags& flags, const std::string& dir,
                 int index) {
  std::vector<std::string> args = {runtime::SelfExecutable(),
                                   "agent",
                                   "--controller",
                                   url,
                                   "--token-file",
                                   token_file,
                                   "--accelerator-type",
                                   flags.local_accelerator_type,
                                   "--zone",
                                   flags.zone,
                                   "--workdir",
                                   dir};
  if (!flags.local_worker_user.empty()) {
    args.insert(args.end(), {"--worker-user", LocalWorkerUser(flags, index)});
  }
  // sshd on port 22 needs root; otherwise the local hosts run none.
  const int ssh_port = ::geteuid() == 0 ? flags.local_ssh_port : 0;
  args.insert(args.end(), {"--ssh-port", std::to_string(ssh_port)});
  if (ssh_port > 0) {
    args.insert(args.end(), {"--ssh-address", LocalSshAddress(index)});
  }
  const std::string log = dir + "/agent.log";
  // Everything the child needs is built before fork: the controller's
  // threads run, so the child may only make async-signal-safe calls.
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  // Child: dies with the controller; output to its own log.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::chdir(dir.c_str()) != 0) ::_exit(127);
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execv(argv[0], argv.data());
  ::_exit(127);
}

int RunController(const ControllerCommandFlags& flags) {
  if (flags.port < 0 || flags.port > 65535) {
    return Fail(2, "--port: " + std::to_string(flags.port) +
                       " is not a port from 0 to 65535");
  }
  if (flags.agent_port < 0 || flags.agent_port > 65535 ||
      (flags.agent_port != 0 && flags.agent_port == flags.port)) {
    return Fail(2, "--agent-port: " + std::to_string(flags.agent_port) +
                       " is not a port from 0 to 65535 other than --port");
  }
  char* end = nullptr;
  const double timeout_s = std::strtod(flags.heartbeat_timeout.c_str(), &end);
  if (flags.heartbeat_timeout.empty() || *end != '\0' || !(timeout_s > 0) ||
      timeout_s > 3600) {
    return Fail(2, "--heartbeat-timeout: '" + flags.heartbeat_timeout +
                       "' is not a number of seconds in (0, 3600]");
  }
  if (flags.local_ssh_port < 0 || flags.local_ssh_port > 65535) {
    return Fail(2, "--local-ssh-port: " + std::to_string(flags.local_ssh_port) +
                       " is not a port from 0 (no sshd) to 65535");
  }
  if (flags.local_hosts < 0 || flags.local_hosts > 256) {
    return Fail(2, "--local-hosts: " + std::to_string(flags.local_hosts) +
                       " is not from 0 to 256");
  }
  if (flags.local_hosts > 0) {
    Result<mesh::AcceleratorType> type =
        mesh::ParseAcceleratorType(flags.local_accelerator_type);
    if (!type.ok()) {
      return Fail(2, "--local-accelerator-type: " + type.status().message());
    }
  }
  control::ControllerOptions options;
  for (const std::string& q : flags.quotas) {
    const size_t eq = q.find('=');
    Result<control::Tier> tier =
        control::ParseTierName(q.substr(0, eq == std::string::npos ? 0 : eq));
    auto chips =
        eq == std::string::npos ? std::nullopt : ParseInteger(q.substr(eq + 1));
    if (!tier.ok() || !chips || *chips < 0) {
      return Fail(2, "--quota: '" + q +
                         "' is not TIER=CHIPS with TIER one of reserved, "
                         "on-demand, spot, best-effort");
    }
    options.quota_chips[static_cast<int>(*tier)] = *chips;
  }
  if (!flags.metrics_address.empty() &&
      !SetMetricsAddress(flags.metrics_address, options)) {
    return Fail(2, "--metrics_address: '" + flags.metrics_address +
                       "' is not HOST:PORT with PORT from 0 to 65535");
  }
  std::error_code ec;
  std::filesystem::create_directories(flags.data_dir, ec);
  if (ec) {
    return Fail(
        1, "--data-dir: cannot create " + flags.data_dir + ": " + ec.message());
  }
  const std::string data_dir =
      std::filesystem::absolute(flags.data_dir).string();
  const std::string token_file =
      std::filesystem::absolute(flags.token_file.empty() ? data_dir + "/token"
                                                         : flags.token_file)
          .string();
  Result<std::string> token = control::LoadOrCreateToken(token_file);
  if (!token.ok()) {
    // A token file that is there but weak is the user's to fix.
    const bool bad = token.status().code() == StatusCode::kInvalidArgument ||
                     token.status().code() == StatusCode::kFailedPrecondition;
    return Fail(bad ? 2 : 1, token.status().message());
  }
  // What agents register with: it can do nothing else (docs/control.md).
  const std::string agent_token_file = data_dir + "/agent-token";
  Result<std::string> agent_token =
      control::LoadOrCreateToken(agent_token_file);
  if (!agent_token.ok()) return Fail(1, agent_token.status().message());

  // Signals are taken by sigwait below; block them before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  options.data_dir = data_dir;
  options.token = *token;
  options.agent_token = *agent_token;
  if (!flags.local_worker_user.empty()) {
    const bool per_host = flags.local_worker_user.rfind("uids:", 0) == 0;
    const std::optional<int64_t> base =
        per_host ? ParseInteger(flags.local_worker_user.substr(5))
                 : std::nullopt;
    if (per_host && (!base || *base < 1 || *base > (1LL << 30))) {
      return Fail(2, "--local-worker-user: '" + flags.local_worker_user +
                         "' is not uids:BASE with BASE from 1 to 2^30");
    }
    Result<control::UserIds> user =
        control::ResolveUser("--local-worker-user", LocalWorkerUser(flags, 0));
    if (!user.ok()) return Fail(2, user.status().message());
    // Each run's file store: the workers' user, or (one user per host) the
    // group they share, read and written by the group.
    options.file_store_uid = per_host ? 0 : user->uid;
    options.file_store_gid = user->gid;
    options.file_store_group_access = per_host;
  }
  if (flags.capacity == "slurm") {
    if (flags.local_hosts > 0) {
      return Fail(2,
                  "--local-hosts runs host agents, which --capacity slurm "
                  "does not use: pass one or the other");
    }
    control::SlurmOptions slurm;
    slurm.partition = flags.slurm_partition;
    for (const std::string& tp : flags.slurm_tier_partitions) {
      const size_t eq = tp.find('=');
      Result<control::Tier> tier = control::ParseTierName(
          tp.substr(0, eq == std::string::npos ? 0 : eq));
      if (!tier.ok() || eq + 1 >= tp.size()) {
        return Fail(2, "--slurm-tier-partition: '" + tp +
                           "' is not TIER=PARTITION with TIER one of "
                           "reserved, on-demand, spot, best-effort");
      }
      slurm.tier_partitions[control::TierName(*tier)] = tp.substr(eq + 1);
    }
    slurm.workdir = std::filesystem::absolute(flags.slurm_workdir.empty()
                                                  ? data_dir + "/slurm"
                                                  : flags.slurm_workdir)
                        .string();
    options.cluster = std::make_shared<control::SlurmCapacity>(
        slurm, control::NewCommandRunner(std::chrono::seconds(30)));
  } else if (flags.capacity != "agents") {
    return Fail(2, "--capacity: '" + flags.capacity +
                       "' is not a capacity; expected agents or slurm");
  }
  options.bind_address = flags.bind;
  options.advertise_address =
      flags.advertise_address.empty() ? flags.bind : flags.advertise_address;
  options.port = flags.port;
  options.agent_port = flags.agent_port;
  options.heartbeat_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  options.heartbeat_interval = std::chrono::milliseconds(
      std::max<int64_t>(50, static_cast<int64_t>(timeout_s * 1000) / 10));
  Result<std::unique_ptr<control::Controller>> controller =
      control::Controller::Start(options);
  if (!controller.ok()) return Fail(1, controller.status().message());
  const std::string url =
      "http://" +
      (flags.bind == "0.0.0.0" ? std::string("127.0.0.1") : flags.bind) + ":" +
      std::to_string((*controller)->port());
  std::printf("controller listening on %s (token file %s, data %s)\n",
              url.c_str(), token_file.c_str(), data_dir.c_str());
  std::printf("export MULTISLICE_CONTROLLER=%s MULTISLICE_TOKEN_FILE=%s\n",
              url.c_str(), token_file.c_str());
  std::fflush(stdout);
  // On stderr: tools read the URL from the last http:// word of stdout.
  std::fprintf(stderr, "%s: console at %s/console (the token in %s)\n", kName,
               url.c_str(), token_file.c_str());
  std::fprintf(stderr,
               "%s: agents register with --token-file %s (it can only "
               "register a host)\n",
               kName, agent_token_file.c_str());
  if ((*controller)->metrics_port() > 0) {
    std::fprintf(stderr, "%s: metrics at http://%s:%d/metrics (no token)\n",
                 kName, options.metrics_bind_address.c_str(),
                 (*controller)->metrics_port());
  }

  std::vector<pid_t> agents;
  std::map<pid_t, std::string> agent_dirs;
  for (int i = 0; i < flags.local_hosts; ++i) {
    const std::string dir = data_dir + "/hosts/local-" + std::to_string(i);
    std::filesystem::create_directories(dir, ec);
    pid_t pid = SpawnAgent(url, agent_token_file, flags, dir, i);
    if (pid < 0) {
      std::fprintf(stderr, "%s: cannot start agent %d\n", kName, i);
      continue;
    }
    agents.push_back(pid);
    agent_dirs[pid] = dir;
  }
  if (!agents.empty()) {
    std::fprintf(stderr,
                 "%s: started %zu local agents (%s), logs in "
                 "%s/hosts/*/agent.log\n",
                 kName, agents.size(), flags.local_accelerator_type.c_str(),
                 data_dir.c_str());
  }

  // Wait for SIGTERM/SIGINT; reap agents that exit meanwhile (their hosts
  // are then lost, and the controller repairs around them).
  while (true) {
    int sig = 0;
    if (::sigwait(&stop_signals, &sig) != 0) break;
    if (sig == SIGCHLD) {
      int status = 0;
      pid_t pid;
      while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
        auto it = std::find(agents.begin(), agents.end(), pid);
        if (it != agents.end()) {
          std::fprintf(stderr, "%s: local agent (pid %d) exited\n", kName,
                       static_cast<int>(pid));
          agents.erase(it);
          // Its host is lost now, not one heartbeat timeout later (the
          // agent registered its workdir, which is this directory). Its
          // workers die with it (their guardians kill their groups); wait
          // for that first, so that the repair never overlaps them.
          const auto gone_by =
              std::chrono::steady_clock::now() + std::chrono::seconds(5);
          for (int group :
               (*controller)->LastReportedWorkerGroups(agent_dirs[pid])) {
            while (GroupHasLiveProcess(group) &&
                   std::chrono::steady_clock::now() < gone_by) {
              std::this_thread::sleep_for(std::chrono::milliseconds(2));
            }
          }
          (*controller)
              ->ReportHostLost(agent_dirs[pid], "local agent process exited")
              .ok();
        }
      }
      continue;
    }
    std::fprintf(stderr, "%s: stopping (signal %d)\n", kName, sig);
    break;
  }
  for (pid_t pid : agents) ::kill(pid, SIGTERM);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!agents.empty() && std::chrono::steady_clock::now() < deadline) {
    for (auto it = agents.begin(); it != agents.end();) {
      if (::waitpid(*it, nullptr, WNOHANG) == *it) {
        it = agents.erase(it);
      } else {
        ++it;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : agents) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  (*controller)->Stop();
  return 0;
}

}  // namespace

void AddControllerCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "controller",
      "Runs the queued-resource controller: the Cloud TPU v2alpha1 API (and "
      "/v2/) for queued resources, the agents' channel, the gang scheduler "
      "and auto-repair, with its state in DATA_DIR/state.db (SQLite). The "
      "bearer token is read from --token-file, created (mode 0600) on first "
      "start. With --local-hosts N it also runs N host agents on this "
      "machine. See docs/control.md.\n"
      "Example:\n"
      "  multislice controller --port 8470 --data-dir runs/controller "
      "--local-hosts 4 --local-accelerator-type cpu-2");
  auto flags = std::make_shared<ControllerCommandFlags>();
  AddIntFlag(cmd, "port", &flags->port, "API port; 0 picks a free one.")
      ->capture_default_str();
  AddIntFlag(cmd, "agent_port", &flags->agent_port,
             "The agents' channel (registration, heartbeats), with threads "
             "of its own so API clients cannot hold up a heartbeat; 0 picks "
             "a free one (agents learn it when they register).")
      ->capture_default_str();
  AddStringFlag(cmd, "bind", &flags->bind, "Address to listen on.")
      ->capture_default_str();
  AddStringFlag(cmd, "advertise_address", &flags->advertise_address,
                "Address agents on other machines reach this one at (for "
                "the redis-server coordinator; default: --bind).");
  AddStringFlag(cmd, "data_dir", &flags->data_dir,
                "Directory for state.db, the token and local hosts.")
      ->capture_default_str();
  AddStringFlag(cmd, "token_file", &flags->token_file,
                "Bearer token file (default DATA_DIR/token).");
  AddStringFlag(cmd, "heartbeat_timeout", &flags->heartbeat_timeout,
                "Seconds without a heartbeat before a host is lost.")
      ->capture_default_str();
  AddIntFlag(cmd, "local_hosts", &flags->local_hosts,
             "Host agents to run on this machine.")
      ->capture_default_str();
  AddIntFlag(cmd, "local_ssh_port", &flags->local_ssh_port,
             "Port of each local host's sshd, on a loopback address of its "
             "own (127.A.B.C, the node's networkEndpoints), for gcloud's "
             "tpu-vm ssh and scp; 0: none. Needs root (otherwise none "
             "runs).")
      ->capture_default_str();
  AddStringFlag(cmd, "local_worker_user", &flags->local_worker_user,
                "The local agents run their workers as this user (a name, or "
                "UID:GID), who can read none of the controller's or the "
                "agents' secrets; 'uids:BASE' gives local agent i the uid "
                "BASE+1+i (group BASE), so that the jobs of different local "
                "hosts cannot read each other either (docs/control.md, "
                "Threat model).");
  AddStringFlag(cmd, "local_accelerator_type", &flags->local_accelerator_type,
                "Accelerator type of the local hosts.")
      ->capture_default_str();
  AddStringFlag(cmd, "zone", &flags->zone, "Zone of the local hosts.")
      ->capture_default_str();
  cmd->add_option(FlagNames("quota"), flags->quotas,
                  "Per-tier chip quota TIER=CHIPS (reserved, on-demand, "
                  "spot, best-effort); repeat for more. Default: unlimited.");
  AddStringFlag(cmd, "capacity", &flags->capacity,
                "Where workers run: 'agents' (the host agents) or 'slurm' "
                "(each queued resource one Slurm job of all its slices' "
                "nodes, run through srun; docs/control.md, 'Slurm as the "
                "capacity').")
      ->capture_default_str();
  AddStringFlag(cmd, "slurm_partition", &flags->slurm_partition,
                "--capacity slurm: the partition jobs are submitted to "
                "(default: the cluster's default).");
  cmd->add_option(FlagNames("slurm_tier_partition"),
                  flags->slurm_tier_partitions,
                  "--capacity slurm: TIER=PARTITION sends the jobs of a tier "
                  "(reserved, on-demand, spot, best-effort) to that "
                  "partition, e.g. spot to one a reserved partition preempts "
                  "(a preempted job's QR is SUSPENDED); repeat for more.");
  AddStringFlag(cmd, "slurm_workdir", &flags->slurm_workdir,
                "--capacity slurm: the directory, seen at the same path by "
                "every node, of the batch scripts, their output and the "
                "workers' file:// store (default DATA_DIR/slurm).");
  AddStringFlag(cmd, "metrics_address", &flags->metrics_address,
                "HOST:PORT of a listener serving only GET /metrics (the "
                "Prometheus text format) without the token, as exporters "
                "do, e.g. 127.0.0.1:9464 (PORT 0 picks a free one). Without "
                "it, /metrics is on --port only, behind the token "
                "(docs/control.md, Metrics).");
  table[cmd] = [flags] { return RunController(*flags); };
}

}  // namespace multislice::cli
