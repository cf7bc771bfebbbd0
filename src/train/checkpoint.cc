// The checkpoint store: file I/O with open/write/fsync/close, the commit
// protocol documented in checkpoint.h, CRC32C, and the background writer.
#include "train/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <set>
#include <system_error>
#include <utility>

#include "common/cpu_isa.h"
#include "runtime/trace.h"

namespace multislice {
namespace {

namespace fs = std::filesystem;

constexpr char kCommitMarker[] = "COMMITTED";
constexpr char kTmpSuffix[] = ".tmp";

// ---- CRC32C: the SSE4.2 instruction, or slicing-by-8 over a table --------

using Crc32cTable = std::array<std::array<uint32_t, 256>, 8>;

Crc32cTable MakeCrc32cTable() {
  constexpr uint32_t kPolynomial = 0x82F63B78;  // Castagnoli, reflected
  Crc32cTable table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 1) ? (crc >> 1) ^ kPolynomial : crc >> 1;
    }
    table[0][i] = crc;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int slice = 1; slice < 8; ++slice) {
      uint32_t prev = table[slice - 1][i];
      table[slice][i] = (prev >> 8) ^ table[0][prev & 0xFF];
    }
  }
  return table;
}

const Crc32cTable& GetCrc32cTable() {
  static const Crc32cTable table = MakeCrc32cTable();
  return table;
}

// ---- POSIX helpers: every call checked, every error names the path -------

Status ErrnoError(const std::string& what, const std::string& path, int err) {
  return Internal(path + ": " + what + " failed: " + std::strerror(err));
}

// Closes a descriptor on scope exit unless released.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  // Closes now and reports the error (close can report a failed write-back).
  Status Close(const std::string& path) {
    int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return ErrnoError("close", path, errno);
    return OkStatus();
  }

 private:
  int fd_;
};

Status WriteAll(int fd, const std::string& path, const void* data,
                size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write", path, errno);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return OkStatus();
}

Status SyncDirectory(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open directory", path, errno);
  FileDescriptor dir(fd);
  if (::fsync(dir.get()) != 0) return ErrnoError("fsync", path, errno);
  return dir.Close(path);
}

// Creates `path` and its parents; an existing directory is fine.
Status MakeDirectories(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return Internal(path + ": cannot create directory: " + ec.message());
  return OkStatus();
}

Status RemoveAll(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return Internal(path + ": cannot remove: " + ec.message());
  return OkStatus();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Writes `pieces` one after the other into a new file at `path`, fsyncs and
// closes it.
Status WriteFileDurably(
    const std::string& path,
    const std::vector<std::pair<const void*, size_t>>& pieces) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open for writing", path, errno);
  FileDescriptor file(fd);
  for (const auto& [data, size] : pieces) {
    RETURN_IF_ERROR(WriteAll(file.get(), path, data, size));
  }
  if (::fsync(file.get()) != 0) return ErrnoError("fsync", path, errno);
  return file.Close(path);
}

// temp + fsync + rename + fsync(dir), as LevelDB's SetCurrentFile.
Status WriteFileAtomically(const std::string& dir, const std::string& name,
                           const std::string& contents) {
  const std::string tmp_path = dir + "/" + name + kTmpSuffix;
  const std::string final_path = dir + "/" + name;
  RETURN_IF_ERROR(
      WriteFileDurably(tmp_path, {{contents.data(), contents.size()}}));
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    return ErrnoError("rename to " + final_path, tmp_path, errno);
  }
  return SyncDirectory(dir);
}

Status ReadAt(int fd, const std::string& path, void* data, size_t size,
              uint64_t offset) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read", path, errno);
    }
    if (n == 0) return Internal(path + ": unexpected end of file");
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return OkStatus();
}

Result<std::string> ReadSmallFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound(path + ": no such file");
    return ErrnoError("open", path, errno);
  }
  FileDescriptor file(fd);
  struct stat st;
  if (::fstat(file.get(), &st) != 0) return ErrnoError("fstat", path, errno);
  std::string contents(static_cast<size_t>(st.st_size), '\0');
  RETURN_IF_ERROR(
      ReadAt(file.get(), path, contents.data(), contents.size(), 0));
  return contents;
}

// "123" → 123; anything else (including "123.tmp", "+1", "") → nullopt.
std::optional<int64_t> ParseStep(const std::string& name) {
  if (name.empty() || name.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

std::string StepDir(const std::string& dir, int64_t step) {
  return dir + "/" + std::to_string(step);
}

std::string HostFile(const std::string& step_dir, int host,
                     const char* extension) {
  return step_dir + "/host" + std::to_string(host) + extension;
}

// The names of DIR's entries; an absent DIR has none.
Result<std::vector<std::string>> ListDirectory(const std::string& dir) {
  std::vector<std::string> names;
  DIR* handle = ::opendir(dir.c_str());
  if (handle == nullptr) {
    if (errno == ENOENT) return names;
    return ErrnoError("open directory", dir, errno);
  }
  while (struct dirent* entry = ::readdir(handle)) {
    std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  ::closedir(handle);
  return names;
}

}  // namespace

namespace {

uint32_t Crc32cSoftware(const uint8_t* p, size_t size, uint32_t crc) {
  const Crc32cTable& t = GetCrc32cTable();
  while (size >= 8) {
    uint32_t low = crc ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 |
                          uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    crc = t[7][low & 0xFF] ^ t[6][(low >> 8) & 0xFF] ^
          t[5][(low >> 16) & 0xFF] ^ t[4][low >> 24] ^ t[3][p[4]] ^ t[2][p[5]] ^
          t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
  return crc;
}

// The SSE4.2 crc32 instruction computes the same CRC (Castagnoli), 8 bytes
// per instruction: about 10x the table, so checksums cost little of a save.
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(const uint8_t* p,
                                                          size_t size,
                                                          uint32_t crc) {
  uint64_t c = crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
    p += 8;
    size -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (size-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}

}  // namespace

uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc) {
  return ~Crc32cSoftware(static_cast<const uint8_t*>(data), size, ~crc);
}

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  // SSE4.2 is in every level above the baseline.
  const bool hardware = ActiveIsa() >= Isa::kAvx2;
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  crc = hardware ? Crc32cHardware(p, size, crc) : Crc32cSoftware(p, size, crc);
  return ~crc;
}

CheckpointManager::CheckpointManager(CheckpointOptions options)
    : options_(std::move(options)) {
  if (options_.async) writer_ = std::thread([this] { WriterLoop(); });
}

CheckpointManager::~CheckpointManager() {
  if (!writer_.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !in_flight_; });
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

Status CheckpointManager::ValidateOptions(int64_t step) const {
  if (options_.directory.empty()) {
    return InvalidArgument("checkpoint directory is empty");
  }
  if (options_.host_count < 1 || options_.host < 0 ||
      options_.host >= options_.host_count) {
    return InvalidArgument("checkpoint host " + std::to_string(options_.host) +
                           " is not in [0, host_count=" +
                           std::to_string(options_.host_count) + ")");
  }
  if (options_.host_count > 1 && !options_.barrier) {
    return InvalidArgument("checkpoint barrier is required with host_count=" +
                           std::to_string(options_.host_count));
  }
  if (options_.max_to_keep < 1) {
    return InvalidArgument("checkpoint max_to_keep is " +
                           std::to_string(options_.max_to_keep) +
                           "; expected at least 1");
  }
  if (step < 0) {
    return InvalidArgument("checkpoint step " + std::to_string(step) +
                           " is negative");
  }
  return OkStatus();
}

Status CheckpointManager::ValidateBlobs(const std::vector<Blob>& blobs) {
  std::set<std::string> names;
  for (const Blob& blob : blobs) {
    if (blob.name.empty()) {
      return InvalidArgument("checkpoint blob with an empty name");
    }
    if (!names.insert(blob.name).second) {
      return InvalidArgument("checkpoint blob '" + blob.name +
                             "' appears twice");
    }
  }
  return OkStatus();
}

Status CheckpointManager::Save(int64_t step, std::vector<Blob> blobs,
                               nlohmann::json metadata) {
  RETURN_IF_ERROR(ValidateOptions(step));
  SaveJob job{step, std::move(blobs), std::move(metadata), OkStatus()};
  job.invalid = ValidateBlobs(job.blobs);
  // Alone, a bad save simply fails. With peers, it still runs the barriers
  // (writing nothing) so that the peers fail instead of hanging.
  if (!job.invalid.ok() && !options_.barrier) return job.invalid;
  const Status invalid = job.invalid;
  Status outcome = Enqueue(std::move(job));
  if (options_.async && !invalid.ok()) return invalid;
  return outcome;
}

Status CheckpointManager::Abstain(int64_t step, Status reason) {
  RETURN_IF_ERROR(ValidateOptions(step));
  if (!options_.barrier) return OkStatus();  // no peer waits for this save
  if (reason.ok()) reason = Aborted("this host abstains");
  Status outcome = Enqueue(SaveJob{step, {}, {}, std::move(reason)});
  // Sync: the outcome is the abstention itself. Async: the previous save's.
  return options_.async ? outcome : OkStatus();
}

// Sync: runs `job` now and returns its outcome. Async: waits for the
// previous save (at most one in flight), queues `job` and returns the
// previous save's outcome.
Status CheckpointManager::Enqueue(SaveJob job) {
  if (!options_.async) return RunSaveCatching(job);
  Status previous = Wait();
  const int64_t step = job.step;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_ = std::move(job);
    in_flight_ = true;
  }
  cv_.notify_all();
  return previous.WithContext("the previous checkpoint save failed (step " +
                              std::to_string(step) + " was queued anyway)");
}

Status CheckpointManager::Wait() {
  if (!options_.async) return OkStatus();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !in_flight_; });
  return std::exchange(last_async_status_, OkStatus());
}

Status CheckpointManager::Poll() {
  if (!options_.async) return OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_) return OkStatus();
  return std::exchange(last_async_status_, OkStatus());
}

void CheckpointManager::WriterLoop() {
  // Background saves yield the cores to training: the writer (and the
  // checksum thread it starts, which inherits this) runs at a lower
  // priority, so a save shows up as a slower save, not as slower steps.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || queued_.has_value(); });
    if (!queued_.has_value()) return;  // stopping with nothing queued
    SaveJob job = std::move(*queued_);
    queued_.reset();
    lock.unlock();
    Status status = RunSaveCatching(job);
    // Save already returned an invalid job's error; report it once.
    if (!job.invalid.ok()) status = OkStatus();
    job = SaveJob{};  // free the blobs before reporting completion
    lock.lock();
    last_async_status_ = status;
    in_flight_ = false;
    cv_.notify_all();
  }
}

Status CheckpointManager::CallBarrier(int64_t step, const char* phase) const {
  if (!options_.barrier) return OkStatus();
  return options_.barrier(std::to_string(step) + "/" + phase)
      .WithContext(std::string("barrier ") + phase);
}

// A writer thread must not die of an exception (std::terminate would take
// the training with it without a word): an allocation or a thread that
// cannot be had fails the save like a full disk.
Status CheckpointManager::RunSaveCatching(const SaveJob& job) {
  const std::string context =
      "checkpoint of step " + std::to_string(job.step) + " failed";
  try {
    const int64_t start = runtime::Trace::NowMicros();
    Status status = RunSave(job);
    if (options_.on_written) {
      options_.on_written(job.step, start, runtime::Trace::NowMicros());
    }
    return status;
  } catch (const std::bad_alloc&) {
    return Internal(context + ": out of memory in the checkpoint writer");
  } catch (const std::system_error& e) {
    return Internal(context + ": " + e.what());
  }
}

Status CheckpointManager::RunSave(const SaveJob& job) {
  const auto start = std::chrono::steady_clock::now();
  const std::string& dir = options_.directory;
  const std::string step_dir = StepDir(dir, job.step);
  const std::string tmp_dir = step_dir + kTmpSuffix;
  const bool leader = options_.host == 0;

  // Phase 1: a complete step is never overwritten (every host sees the same
  // marker: nobody creates or removes it in this phase); the leader clears
  // leftovers of an earlier, uncommitted attempt at this step.
  Status status = job.invalid;
  if (status.ok()) status = MakeDirectories(dir);
  const bool was_complete = Exists(step_dir + "/" + kCommitMarker);
  if (status.ok() && was_complete) {
    status = FailedPrecondition(step_dir + " is already a complete checkpoint");
  }
  if (status.ok() && leader) {
    status = RemoveAll(tmp_dir);
    if (status.ok()) status = RemoveAll(step_dir);
  }
  Status barrier_status = CallBarrier(job.step, "ckpt:prepare");
  if (status.ok()) status = barrier_status;

  // Phase 2: every host writes its own files into <step>.tmp.
  uint64_t bytes_written = 0;
  if (status.ok()) status = MakeDirectories(tmp_dir);
  if (status.ok()) {
    status = WriteHostFiles(job, options_.host, tmp_dir, &bytes_written);
  }
  if (status.ok() && leader && options_.absent_hosts) {
    // The leader's metadata with no shards of its own (train_state.h's
    // layout): the absent host's state is in the stand-ins.
    SaveJob empty;
    empty.step = job.step;
    empty.metadata = job.metadata;
    if (empty.metadata.is_object() && empty.metadata.contains("shards")) {
      empty.metadata["shards"] = nlohmann::json::array();
    }
    uint64_t bytes = 0;
    for (int host : options_.absent_hosts()) {
      if (status.ok()) status = WriteHostFiles(empty, host, tmp_dir, &bytes);
    }
  }
  barrier_status = CallBarrier(job.step, "ckpt:write");
  if (status.ok()) status = barrier_status;

  // Phase 3: the leader commits, or removes what the failed save left (the
  // peers are past writing; a complete step from before is never touched).
  if (status.ok() && leader) {
    status = Commit(job.step);
    if (status.ok()) CollectGarbage(job.step);
  }
  if (!status.ok() && leader && !was_complete) DiscardFailedStep(job.step);
  barrier_status = CallBarrier(job.step, "ckpt:commit");
  if (status.ok()) status = barrier_status;

  if (!status.ok()) {
    return status.WithContext("checkpoint of step " + std::to_string(job.step) +
                              " failed");
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::lock_guard<std::mutex> lock(mu_);
  last_save_seconds_ = seconds;
  last_save_bytes_ = bytes_written;
  return OkStatus();
}

Status CheckpointManager::WriteHostFiles(const SaveJob& job, int host,
                                         const std::string& tmp_dir,
                                         uint64_t* bytes_written) const {
  std::vector<std::pair<const void*, size_t>> pieces;
  for (const Blob& blob : job.blobs) {
    pieces.emplace_back(blob.data.data(), blob.data.size());
  }
  // The checksums go only into the .json, written after the .bin: compute
  // them on another thread while this one writes and fsyncs the .bin (mostly
  // waiting for the disk), so they cost no time of their own.
  std::future<std::vector<uint32_t>> checksums =
      std::async(std::launch::async, [&job] {
        std::vector<uint32_t> crcs;
        for (const Blob& blob : job.blobs) {
          crcs.push_back(Crc32c(blob.data.data(), blob.data.size()));
        }
        return crcs;
      });
  // The .bin first: a host's .json existing means its .bin is durable.
  Status written = WriteFileDurably(HostFile(tmp_dir, host, ".bin"), pieces);
  const std::vector<uint32_t> crcs = checksums.get();
  RETURN_IF_ERROR(written);

  nlohmann::json blobs_json = nlohmann::json::array();
  uint64_t offset = 0;
  for (size_t i = 0; i < job.blobs.size(); ++i) {
    const Blob& blob = job.blobs[i];
    blobs_json.push_back({{"name", blob.name},
                          {"dtype", blob.dtype},
                          {"shape", blob.shape},
                          {"offset", offset},
                          {"size", blob.data.size()},
                          {"crc32c", crcs[i]}});
    offset += blob.data.size();
  }
  nlohmann::json index = {{"format", "multislice-checkpoint"},
                          {"format_version", kCheckpointFormatVersion},
                          {"step", job.step},
                          {"host", host},
                          {"host_count", options_.host_count},
                          {"bin_size", offset},
                          {"blobs", std::move(blobs_json)},
                          {"metadata", job.metadata}};
  const std::string index_text = index.dump(1) + "\n";
  RETURN_IF_ERROR(WriteFileAtomically(
      tmp_dir, "host" + std::to_string(host) + ".json", index_text));
  *bytes_written = offset + index_text.size();
  return OkStatus();
}

Status CheckpointManager::Commit(int64_t step) const {
  const std::string& dir = options_.directory;
  const std::string step_dir = StepDir(dir, step);
  const std::string tmp_dir = step_dir + kTmpSuffix;
  for (int host = 0; host < options_.host_count; ++host) {
    const std::string index_path = HostFile(tmp_dir, host, ".json");
    if (!Exists(index_path)) {
      return Internal(index_path +
                      " is missing after the write barrier: host " +
                      std::to_string(host) + " did not finish its write");
    }
  }
  if (::rename(tmp_dir.c_str(), step_dir.c_str()) != 0) {
    return ErrnoError("rename to " + step_dir, tmp_dir, errno);
  }
  RETURN_IF_ERROR(SyncDirectory(dir));
  nlohmann::json marker = {{"step", step},
                           {"host_count", options_.host_count},
                           {"format_version", kCheckpointFormatVersion}};
  // WriteFileAtomically fsyncs the step directory after the rename.
  return WriteFileAtomically(step_dir, kCommitMarker, marker.dump() + "\n");
}

void CheckpointManager::DiscardFailedStep(int64_t step) const {
  // Best effort on a failing disk: whatever stays has no marker, so it is
  // never restored, and the next successful save removes it.
  const std::string step_dir = StepDir(options_.directory, step);
  if (::unlink((step_dir + "/" + kCommitMarker).c_str()) == 0) {
    (void)SyncDirectory(step_dir);
  }
  (void)RemoveAll(step_dir + kTmpSuffix);
  (void)RemoveAll(step_dir);
  (void)SyncDirectory(options_.directory);
}

void CheckpointManager::CollectGarbage(int64_t committed_step) const {
  // Failures here cost disk space, not correctness: a later save retries.
  const std::string& dir = options_.directory;
  Result<std::vector<int64_t>> complete = CompleteSteps();
  if (!complete.ok()) return;
  std::set<int64_t> keep;
  const std::vector<int64_t>& steps = *complete;
  const size_t keep_count = static_cast<size_t>(options_.max_to_keep);
  for (size_t i = steps.size() > keep_count ? steps.size() - keep_count : 0;
       i < steps.size(); ++i) {
    keep.insert(steps[i]);
  }
  Result<std::vector<std::string>> names = ListDirectory(dir);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    std::string base = name;
    const bool is_tmp = base.ends_with(kTmpSuffix);
    if (is_tmp) base.resize(base.size() - std::strlen(kTmpSuffix));
    std::optional<int64_t> step = ParseStep(base);
    if (!step.has_value()) continue;
    bool remove = false;
    if (is_tmp || !Exists(StepDir(dir, *step) + "/" + kCommitMarker)) {
      remove = *step < committed_step;  // stale attempt or uncommitted step
    } else {
      remove = keep.count(*step) == 0;
    }
    if (remove) (void)RemoveAll(dir + "/" + name);
  }
  (void)SyncDirectory(dir);
}

Result<std::vector<int64_t>> CheckpointManager::CompleteSteps() const {
  ASSIGN_OR_RETURN(std::vector<std::string> names,
                   ListDirectory(options_.directory));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    std::optional<int64_t> step = ParseStep(name);
    if (step.has_value() &&
        Exists(StepDir(options_.directory, *step) + "/" + kCommitMarker)) {
      steps.push_back(*step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Result<int64_t> CheckpointManager::LatestCompleteStep() const {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, CompleteSteps());
  if (steps.empty()) {
    return NotFound(options_.directory + ": no complete checkpoint");
  }
  return steps.back();
}

Result<int> CheckpointManager::HostCount(int64_t step) const {
  const std::string step_dir = StepDir(options_.directory, step);
  if (!Exists(step_dir + "/" + kCommitMarker)) {
    return NotFound(step_dir + ": not a complete checkpoint");
  }
  const std::string index_path = HostFile(step_dir, 0, ".json");
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(index_path));
  nlohmann::json index = nlohmann::json::parse(text, nullptr, false);
  if (index.is_discarded() || !index.is_object() ||
      !index.contains("host_count") || !index["host_count"].is_number()) {
    return Internal(index_path + ": not a valid checkpoint index");
  }
  return index["host_count"].get<int>();
}

Result<RestoredState> CheckpointManager::Restore(int64_t step, int host) const {
  const std::string step_dir = StepDir(options_.directory, step);
  if (!Exists(step_dir + "/" + kCommitMarker)) {
    return NotFound(step_dir + ": not a complete checkpoint (no " +
                    kCommitMarker + ")");
  }
  const std::string index_path = HostFile(step_dir, host, ".json");
  const std::string bin_path = HostFile(step_dir, host, ".bin");
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(index_path));

  RestoredState state;
  struct Entry {
    Blob blob;
    uint64_t offset;
    uint64_t size;
    uint32_t crc32c;
  };
  std::vector<Entry> entries;
  try {
    nlohmann::json index = nlohmann::json::parse(text);
    if (index.at("format_version").get<int>() != kCheckpointFormatVersion) {
      return FailedPrecondition(index_path + ": format_version " +
                                index.at("format_version").dump() +
                                " is not supported (expected " +
                                std::to_string(kCheckpointFormatVersion) + ")");
    }
    state.step = index.at("step").get<int64_t>();
    state.host = index.at("host").get<int>();
    state.host_count = index.at("host_count").get<int>();
    if (state.step != step || state.host != host) {
      return Internal(index_path + ": records step " +
                      std::to_string(state.step) + " host " +
                      std::to_string(state.host) + ", expected step " +
                      std::to_string(step) + " host " + std::to_string(host));
    }
    state.metadata = index.at("metadata");
    for (const nlohmann::json& entry : index.at("blobs")) {
      Blob blob;
      blob.name = entry.at("name").get<std::string>();
      blob.dtype = entry.at("dtype").get<std::string>();
      blob.shape = entry.at("shape").get<std::vector<int64_t>>();
      entries.push_back({std::move(blob), entry.at("offset").get<uint64_t>(),
                         entry.at("size").get<uint64_t>(),
                         entry.at("crc32c").get<uint32_t>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return Internal(index_path + ": not a valid checkpoint index (" + e.what() +
                    ")");
  }

  int fd = ::open(bin_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", bin_path, errno);
  FileDescriptor file(fd);
  struct stat st;
  if (::fstat(file.get(), &st) != 0) {
    return ErrnoError("fstat", bin_path, errno);
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  for (auto& [blob, offset, size, crc32c] : entries) {
    if (offset > file_size || size > file_size - offset) {
      return Internal(bin_path + ": blob '" + blob.name + "' is truncated (" +
                      std::to_string(offset + size) +
                      " bytes expected, file has " + std::to_string(file_size) +
                      ")");
    }
    blob.data.resize(size);
    RETURN_IF_ERROR(ReadAt(file.get(), bin_path, blob.data.data(), size, offset)
                        .WithContext("blob '" + blob.name + "'"));
    if (Crc32c(blob.data.data(), size) != crc32c) {
      return Internal(bin_path + ": blob '" + blob.name +
                      "' checksum mismatch");
    }
    std::string name = blob.name;
    state.blobs.emplace(std::move(name), std::move(blob));
  }
  return state;
}

Result<RestoredState> CheckpointManager::RestoreLatest(
    int host, std::vector<std::string>* warnings) const {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, CompleteSteps());
  if (steps.empty()) {
    return NotFound(options_.directory + ": no complete checkpoint");
  }
  Status first_error;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    Result<RestoredState> state = Restore(*it, host);
    if (state.ok()) return state;
    if (warnings != nullptr) warnings->push_back(state.status().message());
    if (first_error.ok()) first_error = state.status();
  }
  return first_error.WithContext("no complete checkpoint in " +
                                 options_.directory + " could be restored");
}

double CheckpointManager::last_save_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_save_seconds_;
}

uint64_t CheckpointManager::last_save_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_save_bytes_;
}

}  // namespace multislice
