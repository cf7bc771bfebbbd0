// Token files (both versions, every width), staged files and the sharded
// iterator: see data.h.
//
// Write protocol (as LevelDB's SetCurrentFile): the bytes go to
// "<path>.tmp.<pid>", which is fsynced, renamed over <path>, and the
// directory is fsynced so that the rename itself survives a crash.
#include "train/data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "train/little_endian.h"

namespace multislice::train {

namespace fs = std::filesystem;

uint64_t Fnv1a64(const void* data, size_t size, uint64_t state) {
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    state ^= bytes[i];
    state *= kPrime;
  }
  return state;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint32_t TokenWidthFor(uint32_t vocab_size) {
  if (vocab_size <= 256) return 1;
  if (vocab_size <= 65536) return 2;
  return 4;
}

namespace {

std::string ErrnoText() { return std::strerror(errno); }

// Token `i` of a payload of `width`-byte little-endian tokens.
uint32_t GetToken(const uint8_t* payload, uint32_t width, size_t i) {
  const uint8_t* p = payload + i * width;
  switch (width) {
    case 1:
      return p[0];
    case 2:
      return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8;
    default:
      return GetLittleEndian32(p);
  }
}

// Reads exactly `size` bytes at `offset`; false on a short read or error.
bool PreadAll(int fd, uint8_t* data, size_t size, off_t offset) {
  while (size > 0) {
    ssize_t n = ::pread(fd, data, size, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
    offset += n;
  }
  return true;
}

// Owns a file descriptor opened for reading.
class ReadFd {
 public:
  explicit ReadFd(const std::string& path)
      : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~ReadFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ReadFd(const ReadFd&) = delete;
  ReadFd& operator=(const ReadFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// The width and vocabulary rules of each version (see data.h).
Status CheckWidthAndVocab(const TokenFileHeader& h, const std::string& path) {
  const bool v1 = h.format_version == kTokenFileFormatVersionBytes;
  const uint32_t w = h.token_width_bytes;
  if (v1 ? w != 1 : (w != 1 && w != 2 && w != 4)) {
    return InvalidArgument(path + ": token width " + std::to_string(w) +
                           " bytes is not supported by format version " +
                           std::to_string(h.format_version) + " (expected " +
                           (v1 ? "1" : "1, 2 or 4") + ")");
  }
  const uint64_t limit = w == 1   ? 256
                         : w == 2 ? 65536
                                  : uint64_t{kMaxTokenVocabSize};
  if (h.vocab_size == 0 || h.vocab_size > limit) {
    return InvalidArgument(path + ": vocabulary size " +
                           std::to_string(h.vocab_size) + " does not fit " +
                           std::to_string(w) + "-byte tokens (expected 1 to " +
                           std::to_string(limit) + ")");
  }
  return OkStatus();
}

Result<TokenFileHeader> ReadHeaderFromFd(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return Internal(path + ": stat failed: " + ErrnoText());
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  uint8_t raw[kTokenFileHeaderBytes];
  if (file_size < kTokenFileHeaderBytes || !PreadAll(fd, raw, sizeof(raw), 0)) {
    return InvalidArgument(path + ": file is " + std::to_string(file_size) +
                           " bytes, shorter than the " +
                           std::to_string(kTokenFileHeaderBytes) +
                           "-byte token file header (truncated?)");
  }
  if (std::memcmp(raw, kTokenFileMagic, 8) != 0) {
    return InvalidArgument(path +
                           ": not a token file (magic is not \"MSTOKENS\")");
  }
  TokenFileHeader header;
  header.format_version = GetLittleEndian32(raw + 8);
  header.vocab_size = GetLittleEndian32(raw + 12);
  header.token_width_bytes = GetLittleEndian32(raw + 16);
  header.token_count = GetLittleEndian64(raw + 24);
  header.payload_checksum = GetLittleEndian64(raw + 32);
  if (header.format_version != kTokenFileFormatVersion &&
      header.format_version != kTokenFileFormatVersionBytes) {
    return InvalidArgument(path + ": token file format version " +
                           std::to_string(header.format_version) +
                           " is not supported (this build reads versions " +
                           std::to_string(kTokenFileFormatVersionBytes) +
                           " and " + std::to_string(kTokenFileFormatVersion) +
                           ")");
  }
  RETURN_IF_ERROR(CheckWidthAndVocab(header, path));
  const uint64_t payload = file_size - kTokenFileHeaderBytes;
  if (header.token_count > payload / header.token_width_bytes ||
      payload != header.token_count * header.token_width_bytes) {
    return InvalidArgument(path + ": payload is " + std::to_string(payload) +
                           " bytes but the header declares " +
                           std::to_string(header.token_count) + " tokens of " +
                           std::to_string(header.token_width_bytes) +
                           " bytes (file is corrupt or truncated)");
  }
  return header;
}

// The first token of `count` at `payload` outside [0, vocab), as one
// sentence; `first_index` is the first one's index in the file.
Status CheckTokensInVocab(const uint8_t* payload, uint32_t width, size_t count,
                          uint32_t vocab, int64_t first_index,
                          const std::string& path) {
  for (size_t i = 0; i < count; ++i) {
    const uint32_t t = GetToken(payload, width, i);
    if (t >= vocab) {
      return InvalidArgument(
          path + ": token " + std::to_string(t) + " at index " +
          std::to_string(first_index + static_cast<int64_t>(i)) +
          " is outside the vocabulary of " + std::to_string(vocab));
    }
  }
  return OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// StagedFile

Result<StagedFile> StagedFile::Create(const std::string& path) {
  StagedFile file;
  file.path_ = path;
  file.temp_path_ =
      path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  file.fd_ = ::open(file.temp_path_.c_str(),
                    O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (file.fd_ < 0) {
    return Internal(file.temp_path_ + ": cannot create: " + ErrnoText());
  }
  return file;
}

StagedFile::StagedFile(StagedFile&& other) noexcept {
  *this = std::move(other);
}

StagedFile& StagedFile::operator=(StagedFile&& other) noexcept {
  if (this != &other) {
    Discard();
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    fd_ = other.fd_;
    committed_ = other.committed_;
    other.fd_ = -1;
    other.temp_path_.clear();
  }
  return *this;
}

StagedFile::~StagedFile() { Discard(); }

void StagedFile::Discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
  temp_path_.clear();
}

Status StagedFile::Write(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal(temp_path_ + ": write failed: " + ErrnoText());
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return OkStatus();
}

Status StagedFile::WriteAt(uint64_t offset, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal(temp_path_ + ": write failed: " + ErrnoText());
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
  return OkStatus();
}

Status StagedFile::Close() {
  if (fd_ < 0) return OkStatus();
  Status s;
  if (::fsync(fd_) != 0) {
    s = Internal(temp_path_ + ": fsync failed: " + ErrnoText());
  }
  if (::close(fd_) != 0 && s.ok()) {
    s = Internal(temp_path_ + ": close failed: " + ErrnoText());
  }
  fd_ = -1;
  return s;
}

Status StagedFile::Commit() {
  RETURN_IF_ERROR(Close());
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return Internal(path_ + ": rename from " + temp_path_ +
                    " failed: " + ErrnoText());
  }
  committed_ = true;
  return OkStatus();
}

Status SyncDirectory(const std::string& dir_path) {
  const std::string dir = dir_path.empty() ? "." : dir_path;
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Internal(dir + ": cannot open: " + ErrnoText());
  // The error text before close(), which may change errno.
  const std::string fsync_error = ::fsync(dir_fd) != 0 ? ErrnoText() : "";
  ::close(dir_fd);
  if (!fsync_error.empty()) {
    return Internal(dir + ": fsync failed: " + fsync_error);
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------
// TokenFileWriter

namespace {
constexpr size_t kWriterBufferBytes = 1 << 20;
}  // namespace

TokenFileWriter::TokenFileWriter(StagedFile file, uint32_t vocab_size)
    : file_(std::move(file)),
      vocab_size_(vocab_size),
      width_(TokenWidthFor(vocab_size)) {}

Result<TokenFileWriter> TokenFileWriter::Create(const std::string& path,
                                                uint32_t vocab_size) {
  if (vocab_size < 1 || vocab_size > kMaxTokenVocabSize) {
    return InvalidArgument(path + ": vocabulary size " +
                           std::to_string(vocab_size) +
                           " is not in [1, 2^31 - 1]");
  }
  ASSIGN_OR_RETURN(StagedFile file, StagedFile::Create(path));
  TokenFileWriter writer(std::move(file), vocab_size);
  // The header is written last (Finish), once the count and checksum are
  // known; its bytes are reserved here.
  const uint8_t zeros[kTokenFileHeaderBytes] = {};
  RETURN_IF_ERROR(writer.file_.Write(zeros, sizeof(zeros)));
  return writer;
}

Status TokenFileWriter::Append(const int32_t* tokens, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || static_cast<uint32_t>(t) >= vocab_size_) {
      return InvalidArgument(file_.path() + ": token " + std::to_string(t) +
                             " is outside the vocabulary of " +
                             std::to_string(vocab_size_));
    }
    const auto v = static_cast<uint32_t>(t);
    for (uint32_t b = 0; b < width_; ++b) {
      buffer_.push_back(static_cast<uint8_t>(v >> (8 * b)));
    }
  }
  count_ += count;
  return buffer_.size() >= kWriterBufferBytes ? Flush() : OkStatus();
}

Status TokenFileWriter::Flush() {
  checksum_ = Fnv1a64(buffer_.data(), buffer_.size(), checksum_);
  RETURN_IF_ERROR(file_.Write(buffer_.data(), buffer_.size()));
  buffer_.clear();
  return OkStatus();
}

Status TokenFileWriter::Finish() {
  if (finished_) return OkStatus();
  RETURN_IF_ERROR(Flush());
  uint8_t raw[kTokenFileHeaderBytes] = {};
  std::memcpy(raw, kTokenFileMagic, 8);
  PutLittleEndian32(raw + 8, kTokenFileFormatVersion);
  PutLittleEndian32(raw + 12, vocab_size_);
  PutLittleEndian32(raw + 16, width_);
  PutLittleEndian32(raw + 20, 0);
  PutLittleEndian64(raw + 24, count_);
  PutLittleEndian64(raw + 32, checksum_);
  RETURN_IF_ERROR(file_.WriteAt(0, raw, sizeof(raw)));
  RETURN_IF_ERROR(file_.Close());
  finished_ = true;
  return OkStatus();
}

Status TokenFileWriter::Commit() {
  RETURN_IF_ERROR(Finish());
  return file_.Commit();
}

Status WriteTokenFile(const std::string& path,
                      const std::vector<int32_t>& tokens, uint32_t vocab_size) {
  ASSIGN_OR_RETURN(TokenFileWriter writer,
                   TokenFileWriter::Create(path, vocab_size));
  RETURN_IF_ERROR(writer.Append(tokens.data(), tokens.size()));
  RETURN_IF_ERROR(writer.Commit());
  return SyncDirectory(fs::path(path).parent_path().string());
}

Status WriteTokenFile(const std::string& path,
                      const std::vector<uint8_t>& tokens) {
  return WriteTokenFile(
      path, std::vector<int32_t>(tokens.begin(), tokens.end()), kByteVocabSize);
}

Result<TokenFileHeader> ReadTokenFileHeader(const std::string& path) {
  ReadFd fd(path);
  if (fd.get() < 0) return NotFound(path + ": cannot open: " + ErrnoText());
  return ReadHeaderFromFd(fd.get(), path);
}

Result<std::vector<int32_t>> ReadTokenFile(const std::string& path) {
  ReadFd fd(path);
  if (fd.get() < 0) return NotFound(path + ": cannot open: " + ErrnoText());
  ASSIGN_OR_RETURN(TokenFileHeader header, ReadHeaderFromFd(fd.get(), path));
  std::vector<uint8_t> payload(header.token_count * header.token_width_bytes);
  if (!PreadAll(fd.get(), payload.data(), payload.size(),
                kTokenFileHeaderBytes)) {
    return InvalidArgument(path +
                           ": payload cannot be read (file is truncated)");
  }
  if (Fnv1a64(payload.data(), payload.size()) != header.payload_checksum) {
    return InvalidArgument(
        path + ": checksum mismatch (file is corrupt or truncated)");
  }
  RETURN_IF_ERROR(CheckTokensInVocab(payload.data(), header.token_width_bytes,
                                     header.token_count, header.vocab_size, 0,
                                     path));
  std::vector<int32_t> tokens(header.token_count);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(
        GetToken(payload.data(), header.token_width_bytes, i));
  }
  return tokens;
}

Status VerifyTokenFile(const std::string& path) {
  return ReadTokenFile(path).status();
}

// ---------------------------------------------------------------------------
// IteratorState

nlohmann::json IteratorStateToJson(const IteratorState& state) {
  return {{"format_version", state.format_version},
          {"step", state.step},
          {"global_rows", state.global_rows},
          {"row_begin", state.row_begin},
          {"rows", state.rows},
          {"seed", state.seed}};
}

Result<IteratorState> IteratorStateFromJson(const nlohmann::json& json) {
  if (!json.is_object()) {
    return InvalidArgument("iterator state: expected a JSON object, got " +
                           json.dump());
  }
  IteratorState state;
  auto get_int = [&](const char* field, auto* out) -> Status {
    auto it = json.find(field);
    if (it == json.end() || !it->is_number_integer()) {
      return InvalidArgument(std::string("iterator state: field '") + field +
                             "' is missing or not an integer");
    }
    *out = it->get<std::remove_pointer_t<decltype(out)>>();
    return OkStatus();
  };
  RETURN_IF_ERROR(get_int("format_version", &state.format_version));
  RETURN_IF_ERROR(get_int("step", &state.step));
  RETURN_IF_ERROR(get_int("global_rows", &state.global_rows));
  RETURN_IF_ERROR(get_int("row_begin", &state.row_begin));
  RETURN_IF_ERROR(get_int("rows", &state.rows));
  RETURN_IF_ERROR(get_int("seed", &state.seed));
  return state;
}

// ---------------------------------------------------------------------------
// DataIterator

Result<DataIterator> DataIterator::Create(const DataIteratorOptions& options) {
  if (options.global_rows < 1 || options.rows < 1 || options.row_begin < 0 ||
      options.row_begin + options.rows > options.global_rows) {
    return InvalidArgument(
        "data iterator: rows [" + std::to_string(options.row_begin) + ", " +
        std::to_string(options.row_begin + options.rows) +
        ") are not a non-empty part of the " +
        std::to_string(options.global_rows) + " rows of the global batch");
  }
  if (options.seq_len < 1) {
    return InvalidArgument("data iterator: seq_len " +
                           std::to_string(options.seq_len) +
                           " is not at least 1");
  }
  ReadFd fd(options.token_file);
  if (fd.get() < 0) {
    return NotFound(options.token_file + ": cannot open: " + ErrnoText());
  }
  ASSIGN_OR_RETURN(TokenFileHeader header,
                   ReadHeaderFromFd(fd.get(), options.token_file));
  const auto total = static_cast<int64_t>(header.token_count);
  const int64_t G = options.global_rows;
  // The smallest row shard is floor(N/G) tokens.
  if (total / G < static_cast<int64_t>(options.seq_len) + 1) {
    return InvalidArgument(options.token_file + ": " + std::to_string(total) +
                           " tokens split over " + std::to_string(G) +
                           " rows of the global batch give row shards of " +
                           std::to_string(total / G) +
                           " tokens, fewer than seq_len + 1 = " +
                           std::to_string(options.seq_len + 1));
  }
  // Multiply before dividing so the shards tile the file exactly; fine for
  // any token count below 2^63 / global_rows.
  const int64_t begin = total * options.row_begin / G;
  const int64_t end = total * (options.row_begin + options.rows) / G;
  DataIterator iterator;
  iterator.options_ = options;
  iterator.total_tokens_ = total;
  iterator.shard_begin_ = begin;
  iterator.shard_tokens_ = end - begin;
  iterator.width_ = header.token_width_bytes;
  iterator.vocab_size_ = header.vocab_size;
  iterator.shard_.resize(static_cast<size_t>(end - begin) * iterator.width_);
  if (!PreadAll(fd.get(), iterator.shard_.data(), iterator.shard_.size(),
                kTokenFileHeaderBytes + begin * header.token_width_bytes)) {
    return InvalidArgument(options.token_file +
                           ": shard cannot be read (file is truncated)");
  }
  // The model's embedding holds vocab_size rows: a token beyond it would
  // read past them, so the shard is checked once here.
  RETURN_IF_ERROR(CheckTokensInVocab(
      iterator.shard_.data(), iterator.width_, static_cast<size_t>(end - begin),
      header.vocab_size, begin, options.token_file));
  return iterator;
}

int32_t DataIterator::TokenAt(int64_t index) const {
  return static_cast<int32_t>(GetToken(
      shard_.data(), width_, static_cast<size_t>(index - shard_begin_)));
}

Batch DataIterator::At(int64_t step) const {
  Batch batch;
  batch.step = step;
  batch.rows = options_.rows;
  batch.seq_len = options_.seq_len;
  const size_t cells = static_cast<size_t>(options_.rows) *
                       static_cast<size_t>(options_.seq_len);
  batch.inputs.resize(cells);
  batch.targets.resize(cells);
  batch.starts.resize(static_cast<size_t>(options_.rows));
  // Counter-based: each of (seed, step, row) goes through a round of
  // splitmix64, so neighbouring counters give unrelated starts.
  const uint64_t step_key =
      SplitMix64(SplitMix64(options_.seed) ^ static_cast<uint64_t>(step));
  const int64_t G = options_.global_rows;
  for (int row = 0; row < options_.rows; ++row) {
    const int64_t g = options_.row_begin + row;
    const int64_t row_begin = total_tokens_ * g / G;
    const int64_t row_end = total_tokens_ * (g + 1) / G;
    const auto valid_starts =
        static_cast<uint64_t>(row_end - row_begin - options_.seq_len);
    const uint64_t h = SplitMix64(step_key ^ static_cast<uint64_t>(g));
    // Maps h onto [0, valid_starts) by a 128-bit multiply (bias below
    // valid_starts / 2^64).
    const auto offset = static_cast<int64_t>(
        (static_cast<unsigned __int128>(h) * valid_starts) >> 64);
    const int64_t start = row_begin + offset;
    batch.starts[static_cast<size_t>(row)] = start;
    int32_t* inputs =
        batch.inputs.data() + static_cast<size_t>(row) * options_.seq_len;
    int32_t* targets =
        batch.targets.data() + static_cast<size_t>(row) * options_.seq_len;
    for (int t = 0; t < options_.seq_len; ++t) {
      inputs[t] = TokenAt(start + t);
      targets[t] = TokenAt(start + t + 1);
    }
  }
  return batch;
}

Result<Batch> DataIterator::Next() { return At(step_++); }

IteratorState DataIterator::state() const {
  IteratorState state;
  state.step = step_;
  state.global_rows = options_.global_rows;
  state.row_begin = options_.row_begin;
  state.rows = options_.rows;
  state.seed = options_.seed;
  return state;
}

Status DataIterator::Restore(const IteratorState& state) {
  if (state.format_version != kIteratorStateFormatVersion) {
    return InvalidArgument("iterator state: format_version " +
                           std::to_string(state.format_version) +
                           " is not supported (this build reads " +
                           std::to_string(kIteratorStateFormatVersion) + ")");
  }
  if (state.global_rows != options_.global_rows) {
    return InvalidArgument("iterator state: global_rows " +
                           std::to_string(state.global_rows) +
                           " does not match this run's global batch of " +
                           std::to_string(options_.global_rows) + " rows");
  }
  if (state.seed != options_.seed) {
    return InvalidArgument(
        "iterator state: seed " + std::to_string(state.seed) +
        " does not match this run's seed " + std::to_string(options_.seed));
  }
  if (state.step < 0) {
    return InvalidArgument("iterator state: step " +
                           std::to_string(state.step) + " is negative");
  }
  step_ = state.step;
  return OkStatus();
}

}  // namespace multislice::train
