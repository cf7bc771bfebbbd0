// Packing a script directory (pack.h): git's list of files in a work tree,
// else a measuring walk with tar's exclusion rules; then tar with
// checkpoints for the progress line.
#include "control/agent/pack.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "common/temp_dir.h"
#include "control/process.h"

namespace multislice::control {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Lines tar writes at each checkpoint: this marker and the bytes written to
// its (uncompressed) stream so far.
constexpr const char* kProgressMarker = "multislice-progress ";
// A checkpoint every 100 records of 10 KiB: about every MiB.
constexpr int kCheckpointRecords = 100;
// tar's header per entry; the progress total counts them.
constexpr uint64_t kTarHeaderBytes = 512;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool HoldsNeverPackTag(const fs::path& dir) {
  std::error_code ec;
  for (const char* tag : kNeverPackTags) {
    if (fs::exists(fs::symlink_status(dir / tag, ec))) return true;
  }
  return false;
}

// Whether `path` (relative to `root`) lies in a directory of `root` that
// holds a never-pack tag; `cache` remembers each directory's answer.
bool InTaggedDirectory(const fs::path& root, const fs::path& path,
                       std::map<std::string, bool>& cache) {
  fs::path dir;
  for (auto part = path.begin(); std::next(part) != path.end(); ++part) {
    dir /= *part;
    auto [it, inserted] = cache.emplace(dir.string(), false);
    if (inserted) it->second = HoldsNeverPackTag(root / dir);
    if (it->second) return true;
  }
  return false;
}

// The files git would commit from `dir` (tracked ones, and untracked ones
// no .gitignore excludes), relative to `dir`, without those in tagged
// directories; nullopt when `dir` is not in a git work tree (or git is
// missing). `scratch` is a file for git's output.
std::optional<std::vector<std::string>> GitFiles(const std::string& dir,
                                                 const std::string& scratch) {
  ProcessSpec spec;
  spec.argv = {"git", "-C",       dir,        "ls-files",
               "-z",  "--cached", "--others", "--exclude-standard",
               "--",  "."};
  spec.log_path = scratch;
  std::error_code ignored;
  fs::remove(scratch, ignored);
  auto launcher = NewProcessLauncher();
  Result<std::unique_ptr<ProcessGroup>> git = launcher->Start(spec);
  if (!git.ok()) return std::nullopt;
  ProcessState state = (*git)->Wait(milliseconds(30000));
  (*git)->Stop(milliseconds(0)).status().ok();
  const std::string out = ReadFile(scratch);
  fs::remove(scratch, ignored);
  if (state.running || state.ShellExitCode() != 0) return std::nullopt;
  std::vector<std::string> files;
  std::map<std::string, bool> tagged;
  std::istringstream names(out);
  for (std::string name; std::getline(names, name, '\0');) {
    const fs::path relative(name);
    if (name.empty() || InTaggedDirectory(dir, relative, tagged)) continue;
    // A tracked file deleted from the work tree is not packed.
    if (!fs::exists(fs::symlink_status(fs::path(dir) / relative, ignored))) {
      continue;
    }
    files.push_back(name);
  }
  // A folder git ignores as a whole (under a repository's runs/, say) is
  // packed as it is, by the walk.
  if (files.empty()) return std::nullopt;
  return files;
}

// Adds one entry (its top-level name `first`) to `size` and `top`.
void Count(const fs::file_status& status, uint64_t bytes,
           const std::string& first, bool nested, DirectorySize& size,
           std::map<std::string, uint64_t>& top) {
  ++size.entries;
  if (fs::is_directory(status)) {
    top.emplace(first + "/", 0);
  } else if (fs::is_regular_file(status)) {
    size.bytes += bytes;
    ++size.files;
    top[nested ? first + "/" : first] += bytes;
  }
}

void SortLargest(const std::map<std::string, uint64_t>& top,
                 DirectorySize& size) {
  size.largest.assign(top.begin(), top.end());
  std::stable_sort(
      size.largest.begin(), size.largest.end(),
      [](const auto& a, const auto& b) { return a.second > b.second; });
}

// tar's last message that is not a progress line.
std::string LastError(const std::string& log) {
  std::istringstream lines(log);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.find(kProgressMarker) == std::string::npos) {
      last = line;
    }
  }
  return last;
}

// The bytes of tar's stream at its last checkpoint, from its log.
uint64_t PackedBytes(const std::string& log) {
  const size_t at = log.rfind(kProgressMarker);
  if (at == std::string::npos) return 0;
  return std::strtoull(log.c_str() + at + std::string(kProgressMarker).size(),
                       nullptr, 10);
}

std::string RefusalMessage(const PackOptions& options,
                           const DirectorySize& size) {
  std::string largest;
  for (size_t i = 0; i < size.largest.size() && i < 3; ++i) {
    largest += (i == 0 ? "" : ", ") + size.largest[i].first + " " +
               FormatBytes(size.largest[i].second);
  }
  return options.flag + ": " + options.dir + " holds " +
         FormatBytes(size.bytes) + " in " + std::to_string(size.files) +
         (size.git ? " files git would commit" : " files to pack") + " (" +
         largest + "), more than the " + FormatBytes(options.max_bytes) +
         " the agents accept; point it at the folder the command needs "
         "(output folders of multislice run and job are never packed)";
}

// tar's argv: the whole directory by tar's own walk, or (`list` not
// empty) exactly the files named in `list`, NUL-separated.
std::vector<std::string> TarArgv(const PackOptions& options,
                                 const std::string& list) {
  std::vector<std::string> argv = {"tar", "-czf", options.archive};
  for (const char* tag : kNeverPackTags) {
    argv.push_back(std::string("--exclude-tag-all=") + tag);
  }
  argv.push_back("--checkpoint=" + std::to_string(kCheckpointRecords));
  argv.push_back(std::string("--checkpoint-action=echo=") + kProgressMarker +
                 "%{w}T");
  if (list.empty()) {
    argv.insert(argv.end(), {"-C", options.dir, "."});
  } else {
    argv.insert(argv.end(),
                {"--null", "--no-recursion", "-C", options.dir, "-T", list});
  }
  return argv;
}

class ProgressLine {
 public:
  ProgressLine(const PackOptions& options, uint64_t total)
      : options_(options), total_(total) {}
  ~ProgressLine() { Clear(); }

  void Draw(uint64_t packed, double seconds) {
    if (!options_.terminal || options_.err == nullptr) return;
    const int percent = static_cast<int>(
        std::min<uint64_t>(99, total_ == 0 ? 0 : packed * 100 / total_));
    std::fprintf(options_.err, "\r\33[K%s: packing %s: %s of %s (%d%%), %.0f s",
                 options_.program.c_str(), options_.dir.c_str(),
                 FormatBytes(packed).c_str(), FormatBytes(total_).c_str(),
                 percent, seconds);
    std::fflush(options_.err);
    shown_ = true;
  }
  void Clear() {
    if (!shown_) return;
    std::fputs("\r\33[K", options_.err);
    std::fflush(options_.err);
    shown_ = false;
  }

 private:
  const PackOptions& options_;
  uint64_t total_;
  bool shown_ = false;
};

// Runs tar to its end, drawing the progress line; its exit code.
Result<int> RunTar(const PackOptions& options, const DirectorySize& size,
                   const std::string& list, const std::string& log_path) {
  ProcessSpec spec;
  spec.argv = TarArgv(options, list);
  spec.log_path = log_path;
  auto launcher = NewProcessLauncher();
  ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> tar, launcher->Start(spec));
  const auto start = Clock::now();
  const auto deadline = start + options.timeout;
  ProgressLine progress(options, size.bytes + size.entries * kTarHeaderBytes);
  ProcessState state = tar->Wait(milliseconds(200));
  while (state.running && Clock::now() < deadline &&
         (options.cancel == nullptr || !options.cancel->load())) {
    progress.Draw(PackedBytes(ReadFile(log_path)),
                  std::chrono::duration<double>(Clock::now() - start).count());
    state = tar->Wait(milliseconds(200));
  }
  const bool running = state.running;
  tar->Stop(milliseconds(0)).status().ok();  // ends or reaps what is left
  if (!running) return state.ShellExitCode();
  if (options.cancel != nullptr && options.cancel->load()) {
    return Aborted("packing " + options.dir + " was interrupted");
  }
  return DeadlineExceeded("packing " + options.dir + " took longer than " +
                          std::to_string(options.timeout.count() / 1000) +
                          " s");
}

}  // namespace

Status MarkOutputFolder(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Internal("cannot create " + dir + ": " + ec.message());
  std::ofstream marker(dir + "/" + kOutputMarker);
  marker << "An output folder of multislice run or job: never packed into "
            "a script directory.\n";
  if (!marker.good())
    return Internal("cannot write " + dir + "/" + kOutputMarker);
  return OkStatus();
}

namespace {

// The rules' refusals of `dir` itself.
Status CheckScriptDirectory(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgument(dir + " is not a directory");
  }
  if (HoldsNeverPackTag(dir)) {
    return InvalidArgument(
        dir +
        " is an output folder of multislice run or job (or a "
        "controller's data directory), never packed");
  }
  return OkStatus();
}

// The size of `files` (relative to `dir`).
DirectorySize MeasureFiles(const std::string& dir,
                           const std::vector<std::string>& files) {
  DirectorySize size;
  std::map<std::string, uint64_t> top;
  for (const std::string& name : files) {
    std::error_code ec;
    const fs::path path = fs::path(dir) / name;
    const fs::file_status status = fs::symlink_status(path, ec);
    if (ec) continue;
    const uint64_t bytes =
        fs::is_regular_file(status) ? fs::file_size(path, ec) : 0;
    const fs::path relative(name);
    Count(status, ec ? 0 : bytes, relative.begin()->string(),
          std::next(relative.begin()) != relative.end(), size, top);
  }
  SortLargest(top, size);
  return size;
}

// The size of what tar's own walk of `dir` would pack.
Result<DirectorySize> MeasureWalk(const std::string& dir) {
  std::error_code ec;
  DirectorySize size;
  std::map<std::string, uint64_t> top;
  fs::recursive_directory_iterator it(
      dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::file_status status = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_directory(status) && HoldsNeverPackTag(it->path())) {
      it.disable_recursion_pending();
      continue;
    }
    const uint64_t bytes = fs::is_regular_file(status) ? it->file_size(ec) : 0;
    if (ec) break;
    Count(status, bytes, it->path().lexically_relative(dir).begin()->string(),
          it.depth() > 0, size, top);
  }
  if (ec) return Internal("cannot read " + dir + ": " + ec.message());
  SortLargest(top, size);
  return size;
}

// What to pack of `dir`: git's files when it is in a work tree, else
// everything (by the walk); `list` gets git's files for tar.
Result<DirectorySize> Select(const std::string& dir, const std::string& list) {
  RETURN_IF_ERROR(CheckScriptDirectory(dir));
  std::optional<std::vector<std::string>> files = GitFiles(dir, list);
  if (!files) return MeasureWalk(dir);
  DirectorySize size = MeasureFiles(dir, *files);
  size.git = true;
  if (!list.empty()) {
    std::ofstream out(list, std::ios::binary | std::ios::trunc);
    for (const std::string& name : *files) out << name << '\0';
    if (!out.good()) return Internal("cannot write " + list);
  }
  return size;
}

}  // namespace

Result<DirectorySize> MeasureDirectory(const std::string& dir) {
  // A private directory for git's output: a fixed name in /tmp could be a
  // link someone else planted.
  TempDir scratch("multislice-pack-");
  if (!scratch.ok()) return Internal("cannot create a temporary directory");
  return Select(dir, scratch.path() + "/files");
}

Result<PackSummary> PackDirectory(const PackOptions& options) {
  const auto start = Clock::now();
  const std::string log_path = options.archive + ".log";
  const std::string list = fs::absolute(options.archive).string() + ".files";
  struct RemoveScratch {
    std::vector<std::string> paths;
    ~RemoveScratch() {
      std::error_code ignored;
      for (const std::string& p : paths) fs::remove(p, ignored);
    }
  } remove_scratch{{log_path, list}};
  Result<DirectorySize> measured = Select(options.dir, list);
  if (!measured.ok()) {
    return Status(measured.status().code(),
                  options.flag + ": " + measured.status().message());
  }
  PackSummary summary;
  summary.size = *measured;
  if (summary.size.bytes > options.max_bytes) {
    return InvalidArgument(RefusalMessage(options, summary.size));
  }
  ASSIGN_OR_RETURN(int code, RunTar(options, summary.size,
                                    summary.size.git ? list : "", log_path));
  if (code != 0) {
    return Internal("packing " + options.dir + " failed (tar exit code " +
                    std::to_string(code) +
                    "): " + LastError(ReadFile(log_path)));
  }
  std::error_code ec;
  summary.archive_bytes = fs::file_size(options.archive, ec);
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (options.err != nullptr) {
    std::fprintf(options.err, "%s: packed %s: %llu %s%s, %s into %s (%.1f s)\n",
                 options.program.c_str(), options.dir.c_str(),
                 static_cast<unsigned long long>(summary.size.files),
                 summary.size.files == 1 ? "file" : "files",
                 summary.size.git ? " (those git would commit)" : "",
                 FormatBytes(summary.size.bytes).c_str(),
                 FormatBytes(summary.archive_bytes).c_str(), summary.seconds);
    std::fflush(options.err);
  }
  return summary;
}

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%llu B",
                  static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof text, value < 10 ? "%.1f %s" : "%.0f %s", value,
                  units[unit]);
  }
  return text;
}

}  // namespace multislice::control
