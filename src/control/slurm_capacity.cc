#include "control/slurm_capacity.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/shell_quote.h"

namespace multislice::control {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class ChildRunner : public CommandRunner {
 public:
  explicit ChildRunner(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  Result<std::string> Run(const std::vector<std::string>& argv) override {
    if (argv.empty()) return InvalidArgument("an empty command");
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return Internal("pipe failed");
    if (::pipe2(err, O_CLOEXEC) != 0) {
      ::close(out[0]);
      ::close(out[1]);
      return Internal("pipe failed");
    }
    // Built before fork: other threads run, the child only execs.
    std::vector<std::string> args = argv;
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
      ::setpgid(0, 0);
      ::execvp(cargs[0], cargs.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    if (pid < 0) {
      ::close(out[0]);
      ::close(err[0]);
      return Internal("fork failed");
    }
    std::string stdout_text, stderr_text;
    const int64_t deadline = NowMs() + timeout_.count();
    bool timed_out = false;
    pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    int open_fds = 2;
    while (open_fds > 0) {
      const int64_t left = deadline - NowMs();
      if (left <= 0) {
        timed_out = true;
        break;
      }
      if (::poll(fds, 2, static_cast<int>(left)) < 0 && errno != EINTR) break;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
        char buf[4096];
        const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
        if (n > 0) {
          (i == 0 ? stdout_text : stderr_text).append(buf, n);
        } else {
          ::close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
        }
      }
    }
    for (pollfd& f : fds) {
      if (f.fd >= 0) ::close(f.fd);
    }
    if (timed_out) ::kill(-pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const std::string line = argv[0] + (argv.size() > 1 ? " " + argv[1] : "");
    if (timed_out) {
      return DeadlineExceeded(line + " did not finish within " +
                              std::to_string(timeout_.count()) + " ms");
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
        return Unavailable(line + " could not be run (is Slurm installed?)");
      }
      while (!stderr_text.empty() && stderr_text.back() == '\n') {
        stderr_text.pop_back();
      }
      return Unavailable(line + " failed: " + stderr_text);
    }
    return stdout_text;
  }

 private:
  std::chrono::milliseconds timeout_;
};

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) {
    s.pop_back();
  }
  size_t start = 0;
  while (start < s.size() && std::isspace(static_cast<unsigned char>(s[start])))
    ++start;
  return s.substr(start);
}

// A safe file name part.
std::string FilePart(const std::string& s) {
  std::string out;
  for (char c : s) {
    out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  }
  return out;
}

}  // namespace

std::unique_ptr<CommandRunner> NewCommandRunner(
    std::chrono::milliseconds timeout) {
  return std::make_unique<ChildRunner>(timeout);
}

ClusterJobStatus::Phase SlurmPhase(const std::string& s) {
  using P = ClusterJobStatus::Phase;
  if (s == "PENDING" || s == "REQUEUED" || s == "REQUEUE_HOLD" ||
      s == "REQUEUE_FED" || s == "RESV_DEL_HOLD" || s == "SUSPENDED") {
    return P::kPending;
  }
  // COMPLETING: the job's processes are being cleaned up, after which it
  // either ends or, requeued, runs again: neither yet.
  if (s == "CONFIGURING" || s == "RESIZING" || s == "COMPLETING") {
    return P::kConfiguring;
  }
  if (s == "RUNNING" || s == "STAGE_OUT" || s == "SIGNALING") {
    return P::kRunning;
  }
  if (s.empty()) return P::kGone;
  return P::kEnded;  // COMPLETED CANCELLED FAILED TIMEOUT
                     // DEADLINE NODE_FAIL PREEMPTED BOOT_FAIL OUT_OF_MEMORY
}

std::map<std::string, std::string> ParseOneliner(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::istringstream in(line);
  std::string token;
  while (in >> token) {
    const size_t eq = token.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    // The first occurrence wins (Command= and others may repeat words).
    fields.emplace(token.substr(0, eq), token.substr(eq + 1));
  }
  return fields;
}

std::string SlurmBatchScript(const ClusterJobSpec& spec,
                             const std::string& workdir,
                             const std::string& startup_path) {
  const int hosts = spec.hosts_per_slice;
  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# multislice queued resource " << spec.name << " (run " << spec.run_id
    << "): " << spec.slices << " slice(s) x " << hosts
    << " host(s), one task per node; written by the controller.\n"
    << "export MULTISLICE_RUN_ID=" << ShellQuote(spec.run_id) << "\n"
    << "export MULTISLICE_ACCELERATOR_TYPE="
    << ShellQuote(spec.accelerator_type) << "\n"
    << "export MEGASCALE_NUM_SLICES=" << spec.slices << "\n"
    << "export MULTISLICE_ATTEMPT=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))\n"
    << "export MULTISLICE_SLURM_HOSTS_PER_SLICE=" << hosts
    << "\n"
    // Each worker's directory, as an agent's workers/NAME: the startup
    // script runs there, the same folder for the same worker on every
    // attempt (tasks share the work directory, so a script that unpacks
    // into its working directory would overwrite another worker's files).
    << "export MULTISLICE_SLURM_WORKERS="
    << ShellQuote(workdir + "/workers/" + FilePart(spec.name)) << "\n"
    << "export MULTISLICE_SLURM_STARTUP=" << ShellQuote(startup_path) << "\n"
    << "export MEGASCALE_COORDINATOR_ADDRESS="
    << ShellQuote("file://" + workdir + "/.multislice-store/" + spec.run_id)
    << "-$MULTISLICE_ATTEMPT\n"
    // The worker of each task: its slice and worker from SLURM_PROCID, the
    // slice's hosts from the job's nodes (task i on node i).
    << "srun --kill-on-bad-exit=0 --ntasks-per-node=1 "
       "--nodes=\"$SLURM_JOB_NUM_NODES\" "
       "--ntasks=\"$SLURM_JOB_NUM_NODES\" bash -c '\n"
    << "  hps=$MULTISLICE_SLURM_HOSTS_PER_SLICE\n"
    << "  slice=$((SLURM_PROCID / hps)); worker=$((SLURM_PROCID % hps))\n"
    << "  nodes=($(scontrol show hostnames \"$SLURM_JOB_NODELIST\"))\n"
    << "  addr() { local a; a=$(getent hosts \"$1\" | awk \"{print \\$1; "
       "exit}\"); echo \"${a:-$1}\"; }\n"
    << "  hosts=\"\"\n"
    << "  for ((i = slice * hps; i < (slice + 1) * hps; i++)); do\n"
    << "    hosts+=${hosts:+,}$(addr \"${nodes[i]}\")\n"
    << "  done\n"
    << "  first=$(addr \"${nodes[0]}\")\n"
    << "  port=$((20000 + (SLURM_JOB_ID * 7 + MULTISLICE_ATTEMPT * 2) % "
       "20000))\n"
    << "  export MEGASCALE_SLICE_ID=$slice MEGASCALE_PORT=8080 "
       "TPU_WORKER_ID=$worker TPU_WORKER_HOSTNAMES=$hosts\n"
    << "  export MASTER_ADDR=$first MASTER_PORT=$port "
       "WORLD_SIZE=$SLURM_NTASKS RANK=$SLURM_PROCID LOCAL_RANK=0 "
       "LOCAL_WORLD_SIZE=1\n"
    << "  export JAX_COORDINATOR_ADDRESS=$first:$((port + 1)) "
       "JAX_NUM_PROCESSES=$SLURM_NTASKS JAX_PROCESS_ID=$SLURM_PROCID\n"
    << "  dir=$MULTISLICE_SLURM_WORKERS.$slice.$worker\n"
    << "  mkdir -p \"$dir\" && cd \"$dir\" || exit 1\n"
    << "  exec bash \"$MULTISLICE_SLURM_STARTUP\"\n"
    << "'\n"
    // A startup script that ended before a poll saw its step still started
    // every worker: the job's comment says so.
    << "scontrol update JobId=\"$SLURM_JOB_ID\" "
       "Comment=\"multislice-workers-ran-$MULTISLICE_ATTEMPT\"\n"
    // The nodes stay the queued resource's until it is deleted.
    << "exec sleep infinity\n";
  return s.str();
}

SlurmCapacity::SlurmCapacity(SlurmOptions options,
                             std::unique_ptr<CommandRunner> runner)
    : options_(std::move(options)), runner_(std::move(runner)) {}

Result<std::string> SlurmCapacity::Submit(const ClusterJobSpec& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(options_.workdir, ec);
  if (ec) {
    return Internal("cannot create the Slurm work directory " +
                    options_.workdir + ": " + ec.message());
  }
  const std::string base = options_.workdir + "/" + FilePart(spec.name) + "-" +
                           FilePart(spec.run_id);
  const std::string startup = base + ".startup.sh";
  const std::string batch = base + ".sbatch";
  for (const auto& [path, text] :
       {std::pair{startup, spec.startup_script},
        std::pair{batch, SlurmBatchScript(spec, options_.workdir, startup)}}) {
    std::ofstream f(path, std::ios::trunc);
    f << text;
    if (!f.good()) return Internal("cannot write " + path);
  }
  std::vector<std::string> argv = {
      "sbatch",
      "--parsable",
      "--job-name=" + spec.name,
      "--nodes=" + std::to_string(spec.slices * spec.hosts_per_slice),
      "--ntasks-per-node=1",
      "--requeue",
      "--chdir=" + options_.workdir,
      "--output=" + base + "-%j.out"};
  auto tier = options_.tier_partitions.find(spec.tier);
  const std::string partition = tier != options_.tier_partitions.end()
                                    ? tier->second
                                    : options_.partition;
  if (!partition.empty()) argv.push_back("--partition=" + partition);
  argv.push_back(batch);
  ASSIGN_OR_RETURN(std::string out, runner_->Run(argv));
  // --parsable: "JOBID" or "JOBID;CLUSTER".
  std::string job = Trim(out.substr(0, out.find(';')));
  if (job.empty() || job.find_first_not_of("0123456789") != std::string::npos) {
    return Internal("sbatch answered '" + Trim(out) + "', not a job id");
  }
  return job;
}

Result<ClusterJobStatus> SlurmCapacity::Query(const std::string& job) {
  ClusterJobStatus st;
  Result<std::string> out =
      runner_->Run({"scontrol", "show", "job", "--oneliner", job});
  if (!out.ok()) {
    // A job purged from slurmctld's memory (MinJobAge) is unknown.
    if (out.status().message().find("Invalid job id") != std::string::npos) {
      return st;  // kGone
    }
    return out.status();
  }
  std::map<std::string, std::string> f = ParseOneliner(*out);
  st.state = f["JobState"];
  st.reason = f["Reason"];
  st.phase = SlurmPhase(st.state);
  st.restarts = std::atoi(f["Restarts"].c_str());
  const std::string nodelist = f["NodeList"];
  if (!nodelist.empty() && nodelist != "(null)") {
    ASSIGN_OR_RETURN(std::string names,
                     runner_->Run({"scontrol", "show", "hostnames", nodelist}));
    std::istringstream in(names);
    std::string n;
    while (in >> n) st.nodes.push_back(n);
  }
  // The batch script's mark once the workers' step of this run ended.
  st.workers_started = f["Comment"] == "multislice-workers-ran-" +
                                           std::to_string(st.restarts + 1);
  if (st.phase == ClusterJobStatus::Phase::kRunning && !st.workers_started) {
    // The workers' step: "JOB.0" (the batch step is not listed by squeue).
    ASSIGN_OR_RETURN(std::string steps,
                     runner_->Run({"squeue", "--noheader", "--steps",
                                   "--jobs=" + job, "--format=%i|%T"}));
    std::istringstream in(steps);
    std::string line;
    while (std::getline(in, line)) {
      const std::string id = Trim(line.substr(0, line.find('|')));
      const std::string prefix = job + ".";
      if (id.rfind(prefix, 0) == 0 &&
          id.find_first_not_of("0123456789", prefix.size()) ==
              std::string::npos &&
          id.size() > prefix.size()) {
        st.workers_started = true;
      }
    }
  }
  return st;
}

Status SlurmCapacity::Cancel(const std::string& job) {
  return runner_->Run({"scancel", job}).status();
}

Status SlurmCapacity::Requeue(const std::string& job,
                              const std::vector<std::string>& exclude) {
  // Held while its exclusion is set, so it cannot start on a failed node.
  RETURN_IF_ERROR(runner_->Run({"scontrol", "requeuehold", job}).status());
  if (!exclude.empty()) {
    std::string list;
    for (const std::string& n : exclude) list += (list.empty() ? "" : ",") + n;
    RETURN_IF_ERROR(
        runner_
            ->Run({"scontrol", "update", "JobId=" + job, "ExcNodeList=" + list})
            .status());
  }
  return runner_->Run({"scontrol", "release", job}).status();
}

Result<std::set<std::string>> SlurmCapacity::FailedNodes() {
  ASSIGN_OR_RETURN(std::string out, runner_->Run({"sinfo", "--noheader",
                                                  "--Node", "--format=%N|%T"}));
  std::set<std::string> failed;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t bar = line.find('|');
    if (bar == std::string::npos) continue;
    const std::string node = Trim(line.substr(0, bar));
    const std::string state = Trim(line.substr(bar + 1));
    // "*": not responding; DOWN, DRAIN(ED|ING), FAIL(ING).
    if (state.find('*') != std::string::npos || state.rfind("down", 0) == 0 ||
        state.rfind("drain", 0) == 0 || state.rfind("fail", 0) == 0 ||
        state.rfind("DOWN", 0) == 0 || state.rfind("DRAIN", 0) == 0 ||
        state.rfind("FAIL", 0) == 0) {
      failed.insert(node);
    }
  }
  return failed;
}

}  // namespace multislice::control
