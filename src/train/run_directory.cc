// The run directory's lock, default name, schedule note and resume hint;
// see run_directory.h.
#include "train/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <thread>

#include "model/schedule.h"
#include "train/checkpoint.h"

namespace multislice::train {
namespace {

std::string LockPath(const std::string& run_dir) {
  return run_dir + "/" + kRunLockFileName;
}

std::string UtcTime(std::time_t t, const char* format) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// The holder's line, or an empty object when it is not (yet) readable: the
// holder writes it just after taking the lock, so a few short retries.
nlohmann::json ReadHolder(int fd) {
  for (int tries = 0; tries < 5; ++tries) {
    char buf[4096];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) {
      nlohmann::json holder =
          nlohmann::json::parse(std::string(buf, static_cast<size_t>(n)),
                                nullptr, /*allow_exceptions=*/false);
      if (holder.is_object()) return holder;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return nlohmann::json::object();
}

Status InUse(const std::string& run_dir, const nlohmann::json& holder) {
  std::string who =
      "pid " + (holder.contains("pid") ? std::to_string(holder.value("pid", 0))
                                       : std::string("unknown"));
  if (holder.contains("host")) who += " on host " + holder.value("host", "");
  if (holder.contains("run_id")) {
    who += ", run id " + holder.value("run_id", "") + " attempt " +
           std::to_string(holder.value("attempt", 0));
  }
  if (holder.contains("started")) {
    who += ", started " +
           UtcTime(static_cast<std::time_t>(holder.value("started", 0.0)),
                   "%Y-%m-%d %H:%M:%S UTC");
  }
  return FailedPrecondition("the run directory " + run_dir +
                            " is in use by another training (" + who +
                            "); wait for it to finish or stop it, or choose "
                            "another run_name");
}

// An earlier attempt of this job still holds the lock: a repair is stopping
// its process.
bool EarlierAttempt(const nlohmann::json& holder, const RunLockOwner& owner) {
  return !owner.run_id.empty() && holder.value("run_id", "") == owner.run_id &&
         holder.value("attempt", 0) < owner.attempt;
}

Status WriteHolder(int fd, const std::string& path, const RunLockOwner& owner) {
  const nlohmann::json holder = {
      {"pid", static_cast<int64_t>(::getpid())},
      {"host", HostName()},
      {"run_id", owner.run_id},
      {"attempt", owner.attempt},
      {"started", static_cast<double>(std::time(nullptr))}};
  const std::string line = holder.dump() + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) !=
                                     static_cast<ssize_t>(line.size())) {
    return Internal("cannot write " + path + ": " + std::strerror(errno));
  }
  return OkStatus();
}

std::string Lr(double lr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", lr);
  return buf;
}

bool ShellSafe(const std::string& arg) {
  if (arg.empty()) return false;
  for (char c : arg) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) ||
          std::strchr("_./=:,+@%-", c) != nullptr)) {
      return false;
    }
  }
  return true;
}

}  // namespace

Result<RunDirectoryLock> RunDirectoryLock::Acquire(
    const std::string& run_dir, const RunLockOwner& owner,
    std::chrono::milliseconds wait_for_earlier_attempt) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) {
    return Internal(run_dir +
                    ": cannot create the run directory: " + ec.message());
  }
  const std::string path = LockPath(run_dir);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Internal("cannot open " + path + ": " + std::strerror(errno));
  }
  RunDirectoryLock lock(fd);  // closes fd on every return below
  const auto deadline =
      std::chrono::steady_clock::now() + wait_for_earlier_attempt;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      return Internal("cannot lock " + path + ": " + std::strerror(errno));
    }
    const nlohmann::json holder = ReadHolder(fd);
    if (!EarlierAttempt(holder, owner) ||
        std::chrono::steady_clock::now() >= deadline) {
      return InUse(run_dir, holder);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  RETURN_IF_ERROR(WriteHolder(fd, path, owner));
  return lock;
}

Status RunDirectoryLock::CheckFree(const std::string& run_dir) {
  const std::string path = LockPath(run_dir);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OkStatus();  // never locked (or unreadable: Acquire says)
  RunDirectoryLock probe(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return OkStatus();
  if (errno != EWOULDBLOCK) return OkStatus();
  return InUse(run_dir, ReadHolder(fd));
}

RunDirectoryLock::RunDirectoryLock(RunDirectoryLock&& other) noexcept
    : fd_(other.fd_) {
  other.fd_ = -1;
}

RunDirectoryLock& RunDirectoryLock::operator=(
    RunDirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

RunDirectoryLock::~RunDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor unlocks
}

Result<DefaultRunName> ChooseRunName(const runtime::EnvLookup& lookup,
                                     bool allow_timestamp) {
  for (const char* variable : {"MULTISLICE_RUN_NAME", "JOBSET_NAME"}) {
    const std::optional<std::string> value = lookup(variable);
    if (value && !value->empty()) return DefaultRunName{*value, variable};
  }
  if (!allow_timestamp) {
    return InvalidArgument(
        "key 'run_name' = '': expected a name in a job of several worker "
        "processes (or MULTISLICE_RUN_NAME or JOBSET_NAME set), since each "
        "worker would pick its own timestamp and its own run directory");
  }
  return DefaultRunName{UtcTime(std::time(nullptr), "run-%Y%m%d-%H%M%S"),
                        "timestamp"};
}

std::string ScheduleChangeNote(const nlohmann::json& previous,
                               const TrainConfig& c, int64_t restored_step) {
  if (!previous.is_object() || restored_step >= c.steps) return "";
  TrainConfig old = c;
  old.steps = previous.value("steps", c.steps);
  old.warmup_steps = previous.value("warmup_steps", c.warmup_steps);
  old.learning_rate = previous.value("learning_rate", c.learning_rate);
  old.cosine_learning_rate_final_fraction =
      previous.value("cosine_learning_rate_final_fraction",
                     c.cosine_learning_rate_final_fraction);
  std::string changed;
  auto compare = [&](const char* key, auto before, auto now) {
    if (before == now) return;
    std::ostringstream text;
    text << (changed.empty() ? "" : ", ") << key << " changed from " << before
         << " to " << now;
    changed += text.str();
  };
  compare("steps", old.steps, c.steps);
  compare("warmup_steps", old.warmup_steps, c.warmup_steps);
  compare("learning_rate", old.learning_rate, c.learning_rate);
  compare("cosine_learning_rate_final_fraction",
          old.cosine_learning_rate_final_fraction,
          c.cosine_learning_rate_final_fraction);
  if (changed.empty()) return "";
  auto lr = [&](const TrainConfig& k, int64_t step) {
    return model::LearningRate(step, k.steps, k.warmup_steps, k.learning_rate,
                               k.cosine_learning_rate_final_fraction);
  };
  const int64_t next = restored_step + 1;
  return changed +
         " since this run's last start: the learning-rate "
         "schedule is recomputed for the new values, so step " +
         std::to_string(next) + " trains with lr " + Lr(lr(c, next)) +
         " instead of " + Lr(lr(old, next)) +
         " and the cosine decay ends at "
         "step " +
         std::to_string(c.steps) +
         " (give the old values to keep "
         "the old schedule)";
}

std::string ShellCommand(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& arg : argv) {
    if (!line.empty()) line += ' ';
    if (ShellSafe(arg)) {
      line += arg;
      continue;
    }
    line += '\'';
    for (char c : arg)
      line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += '\'';
  }
  return line;
}

std::string ResumeHint(const TrainConfig& config, const std::string& what,
                       const std::vector<std::string>& argv) {
  const std::string command = ShellCommand(argv);
  if (!config.enable_checkpointing) {
    return what +
           "; enable_checkpointing is false, so nothing was saved: running "
           "the command again trains from step 1: " +
           command;
  }
  CheckpointOptions options;
  options.directory = RunDirectory(config) + "/checkpoints";
  Result<int64_t> step = CheckpointManager(options).LatestCompleteStep();
  if (!step.ok()) {
    return what + "; no checkpoint was committed yet (the first is at step " +
           std::to_string(std::min(config.checkpoint_period, config.steps)) +
           "): running the command again trains from step 1: " + command;
  }
  return what + "; the newest committed checkpoint is step " +
         std::to_string(*step) + " (" + options.directory + "/" +
         std::to_string(*step) + "); resume with: " + command;
}

}  // namespace multislice::train
