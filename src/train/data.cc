// Token files, dataset preparation and the sharded iterator: see data.h.
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
#include <fstream>
#include <sstream>
#include <system_error>

namespace multislice::train {

const char* kDefaultCorpus = "/usr/share/games/fortunes";

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

namespace {

std::string ErrnoText() { return std::strerror(errno); }

void PutU32(uint8_t* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(in[i]) << (8 * i);
  return v;
}
uint64_t GetU64(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

Status WriteAll(int fd, const uint8_t* data, size_t size,
                const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal(path + ": write failed: " + ErrnoText());
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return OkStatus();
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

// Writes header then body to `path` atomically (see the file comment).
Status WriteFileAtomically(const std::string& path, const uint8_t* header,
                           size_t header_size, const uint8_t* body,
                           size_t body_size) {
  const std::string temp_path =
      path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  int fd =
      ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Internal(temp_path + ": cannot create: " + ErrnoText());
  }
  Status s = WriteAll(fd, header, header_size, temp_path);
  if (s.ok()) s = WriteAll(fd, body, body_size, temp_path);
  if (s.ok() && ::fsync(fd) != 0) {
    s = Internal(temp_path + ": fsync failed: " + ErrnoText());
  }
  if (::close(fd) != 0 && s.ok()) {
    s = Internal(temp_path + ": close failed: " + ErrnoText());
  }
  if (s.ok() && ::rename(temp_path.c_str(), path.c_str()) != 0) {
    s = Internal(path + ": rename from " + temp_path +
                 " failed: " + ErrnoText());
  }
  if (!s.ok()) {
    ::unlink(temp_path.c_str());
    return s;
  }
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
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
  header.format_version = GetU32(raw + 8);
  header.vocab_size = GetU32(raw + 12);
  header.token_width_bytes = GetU32(raw + 16);
  header.token_count = GetU64(raw + 24);
  header.payload_checksum = GetU64(raw + 32);
  if (header.format_version != kTokenFileFormatVersion) {
    return InvalidArgument(path + ": token file format version " +
                           std::to_string(header.format_version) +
                           " is not supported (this build reads version " +
                           std::to_string(kTokenFileFormatVersion) + ")");
  }
  if (header.token_width_bytes != 1) {
    return InvalidArgument(path + ": token width " +
                           std::to_string(header.token_width_bytes) +
                           " bytes is not supported (expected 1)");
  }
  if (header.vocab_size == 0 || header.vocab_size > kByteVocabSize) {
    return InvalidArgument(path + ": vocabulary size " +
                           std::to_string(header.vocab_size) +
                           " does not fit 1-byte tokens (expected 1 to 256)");
  }
  const uint64_t payload = file_size - kTokenFileHeaderBytes;
  if (header.token_count > payload / header.token_width_bytes ||
      payload != header.token_count * header.token_width_bytes) {
    return InvalidArgument(path + ": payload is " + std::to_string(payload) +
                           " bytes but the header declares " +
                           std::to_string(header.token_count) + " tokens of " +
                           std::to_string(header.token_width_bytes) +
                           " byte(s) (file is corrupt or truncated)");
  }
  return header;
}

}  // namespace

Status WriteTokenFile(const std::string& path,
                      const std::vector<uint8_t>& tokens) {
  uint8_t raw[kTokenFileHeaderBytes] = {};
  std::memcpy(raw, kTokenFileMagic, 8);
  PutU32(raw + 8, kTokenFileFormatVersion);
  PutU32(raw + 12, kByteVocabSize);
  PutU32(raw + 16, 1);
  PutU32(raw + 20, 0);
  PutU64(raw + 24, tokens.size());
  PutU64(raw + 32, Fnv1a64(tokens.data(), tokens.size()));
  return WriteFileAtomically(path, raw, sizeof(raw), tokens.data(),
                             tokens.size());
}

Result<TokenFileHeader> ReadTokenFileHeader(const std::string& path) {
  ReadFd fd(path);
  if (fd.get() < 0) return NotFound(path + ": cannot open: " + ErrnoText());
  return ReadHeaderFromFd(fd.get(), path);
}

Result<std::vector<uint8_t>> ReadTokenFile(const std::string& path) {
  ReadFd fd(path);
  if (fd.get() < 0) return NotFound(path + ": cannot open: " + ErrnoText());
  ASSIGN_OR_RETURN(TokenFileHeader header, ReadHeaderFromFd(fd.get(), path));
  std::vector<uint8_t> tokens(header.token_count);
  if (!PreadAll(fd.get(), tokens.data(), tokens.size(),
                kTokenFileHeaderBytes)) {
    return InvalidArgument(path +
                           ": payload cannot be read (file is truncated)");
  }
  if (Fnv1a64(tokens.data(), tokens.size()) != header.payload_checksum) {
    return InvalidArgument(
        path + ": checksum mismatch (file is corrupt or truncated)");
  }
  for (uint8_t t : tokens) {
    if (t >= header.vocab_size) {
      return InvalidArgument(path + ": token " + std::to_string(t) +
                             " is outside the vocabulary of " +
                             std::to_string(header.vocab_size));
    }
  }
  return tokens;
}

Status VerifyTokenFile(const std::string& path) {
  return ReadTokenFile(path).status();
}

// ---------------------------------------------------------------------------
// PrepareDataset

namespace {

// True if `text` has no NUL bytes and is well-formed UTF-8.
bool IsText(const std::string& text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    uint8_t c = p[i];
    if (c == 0) return false;
    int extra;
    if (c < 0x80) {
      extra = 0;
    } else if ((c & 0xe0) == 0xc0 && c >= 0xc2) {
      extra = 1;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2;
    } else if ((c & 0xf8) == 0xf0 && c <= 0xf4) {
      extra = 3;
    } else {
      return false;
    }
    if (i + extra >= n) return false;  // a sequence cut off at the end
    for (int k = 1; k <= extra; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
    }
    i += 1 + extra;
  }
  return true;
}

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Internal(path + ": cannot open: " + ErrnoText());
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return Internal(path + ": read failed");
  return out.str();
}

// Splits at lines that hold only "%" and drops blank documents. Each
// document keeps its lines' newlines; a missing final newline is added.
std::vector<std::string> SplitDocuments(const std::string& text) {
  std::vector<std::string> documents;
  std::string current;
  auto flush = [&] {
    bool blank = std::all_of(current.begin(), current.end(), [](char c) {
      return c == ' ' || c == '\t' || c == '\n' || c == '\r';
    });
    if (!blank) {
      if (current.back() != '\n') current.push_back('\n');
      documents.push_back(std::move(current));
    }
    current.clear();
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    size_t line_end = end == std::string::npos ? text.size() : end;
    std::string_view line(text.data() + pos, line_end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == "%") {
      flush();
    } else {
      current.append(text, pos,
                     (end == std::string::npos ? text.size() : end + 1) - pos);
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  flush();
  return documents;
}

// The files a directory input contributes (see PrepareDataset), sorted.
Status ListDirectory(const fs::path& dir, std::vector<fs::path>* files) {
  std::error_code ec;
  std::vector<fs::path> found;
  fs::recursive_directory_iterator it(dir, ec), end;
  if (ec) {
    return Internal(dir.string() + ": cannot list: " + ec.message());
  }
  for (; it != end; it.increment(ec)) {
    if (ec) return Internal(dir.string() + ": cannot list: " + ec.message());
    const fs::directory_entry& entry = *it;
    if (entry.is_symlink(ec)) {
      if (entry.is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (entry.is_directory(ec)) {
      if (entry.path().filename() == "off") it.disable_recursion_pending();
      continue;
    }
    if (!entry.is_regular_file(ec)) continue;
    if (entry.path().extension() == ".dat") continue;
    found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  files->insert(files->end(), found.begin(), found.end());
  return OkStatus();
}

bool IsValidation(uint64_t seed, int64_t document_index, double fraction) {
  uint64_t h =
      SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(document_index)));
  // The top 53 bits as a double in [0, 1).
  double u = static_cast<double>(h >> 11) * 0x1.0p-53;
  return u < fraction;
}

}  // namespace

Status PrepareDataset(const std::vector<std::string>& inputs,
                      const std::string& output_dir, double validation_fraction,
                      uint64_t seed, PrepareStats* stats) {
  if (!(validation_fraction >= 0.0 && validation_fraction < 1.0)) {
    return InvalidArgument(
        "--validation_fraction: " + std::to_string(validation_fraction) +
        " is not in [0, 1)");
  }
  if (inputs.empty()) {
    return InvalidArgument(
        "--input: no inputs given (expected text files or "
        "directories)");
  }
  // Each entry: path, and whether it was named directly (not text = error).
  std::vector<std::pair<fs::path, bool>> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    fs::file_status status = fs::status(input, ec);
    if (ec || !fs::exists(status)) {
      return InvalidArgument("--input: '" + input + "' does not exist");
    }
    if (fs::is_directory(status)) {
      std::vector<fs::path> listed;
      RETURN_IF_ERROR(ListDirectory(input, &listed));
      for (fs::path& p : listed) files.emplace_back(std::move(p), false);
    } else {
      files.emplace_back(input, true);
    }
  }

  PrepareStats local;
  std::vector<uint8_t> train_tokens, val_tokens;
  nlohmann::json sources = nlohmann::json::array();
  int64_t document_index = 0;
  for (const auto& [path, named] : files) {
    ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path.string()));
    if (!IsText(text)) {
      if (named) {
        return InvalidArgument("--input: '" + path.string() +
                               "' is not a text file (it holds NUL bytes or "
                               "invalid UTF-8)");
      }
      ++local.skipped_files;
      continue;
    }
    ++local.files;
    std::vector<std::string> documents = SplitDocuments(text);
    int64_t file_tokens = 0;
    for (const std::string& document : documents) {
      const bool val =
          IsValidation(seed, document_index++, validation_fraction);
      std::vector<uint8_t>& out = val ? val_tokens : train_tokens;
      out.insert(out.end(), document.begin(), document.end());
      out.push_back('%');
      out.push_back('\n');
      file_tokens += static_cast<int64_t>(document.size()) + 2;
      ++(val ? local.val_documents : local.train_documents);
    }
    local.documents += static_cast<int64_t>(documents.size());
    sources.push_back({{"path", path.string()},
                       {"documents", documents.size()},
                       {"tokens", file_tokens}});
  }
  if (local.train_documents == 0) {
    return InvalidArgument(
        "--input: no training documents found in the inputs (expected "
        "non-empty UTF-8 text files)");
  }
  local.train_tokens = static_cast<int64_t>(train_tokens.size());
  local.val_tokens = static_cast<int64_t>(val_tokens.size());

  std::error_code ec;
  fs::create_directories(output_dir, ec);
  if (ec) {
    return Internal(output_dir + ": cannot create directory: " + ec.message());
  }
  const fs::path dir(output_dir);
  RETURN_IF_ERROR(WriteTokenFile((dir / "train.bin").string(), train_tokens));
  RETURN_IF_ERROR(WriteTokenFile((dir / "val.bin").string(), val_tokens));

  nlohmann::json meta = {
      {"format_version", kDatasetFormatVersion},
      {"tokenizer", "bytes"},
      {"vocab_size", kByteVocabSize},
      {"token_file_format_version", kTokenFileFormatVersion},
      {"seed", seed},
      {"validation_fraction", validation_fraction},
      {"split_rule",
       "documents are split at lines holding only '%'; document i (from 0, "
       "in input order) is validation when splitmix64(seed ^ splitmix64(i)) "
       ">> 11 < validation_fraction * 2^53; each document is stored as its "
       "text followed by \"%\\n\""},
      {"files", local.files},
      {"skipped_files", local.skipped_files},
      {"documents", local.documents},
      {"train",
       {{"file", "train.bin"},
        {"documents", local.train_documents},
        {"tokens", local.train_tokens}}},
      {"val",
       {{"file", "val.bin"},
        {"documents", local.val_documents},
        {"tokens", local.val_tokens}}},
      {"sources", sources},
  };
  const std::string meta_text = meta.dump(2) + "\n";
  RETURN_IF_ERROR(WriteFileAtomically(
      (dir / "dataset.json").string(), nullptr, 0,
      reinterpret_cast<const uint8_t*>(meta_text.data()), meta_text.size()));
  if (stats != nullptr) *stats = local;
  return OkStatus();
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
  iterator.shard_.resize(static_cast<size_t>(end - begin));
  if (!PreadAll(fd.get(), iterator.shard_.data(), iterator.shard_.size(),
                kTokenFileHeaderBytes + begin * header.token_width_bytes)) {
    return InvalidArgument(options.token_file +
                           ": shard cannot be read (file is truncated)");
  }
  return iterator;
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
    const uint8_t* window = shard_.data() + (start - shard_begin_);
    int32_t* inputs =
        batch.inputs.data() + static_cast<size_t>(row) * options_.seq_len;
    int32_t* targets =
        batch.targets.data() + static_cast<size_t>(row) * options_.seq_len;
    for (int t = 0; t < options_.seq_len; ++t) {
      inputs[t] = window[t];
      targets[t] = window[t + 1];
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
