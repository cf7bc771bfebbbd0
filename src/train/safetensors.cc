// The safetensors writer (a temporary file renamed into place) and the
// checking reader; the format and the rules are in safetensors.h.
#include "train/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "common/bf16.h"

namespace multislice::train {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and copied as it is");

std::string Quoted(const std::string& name) { return "'" + name + "'"; }

std::string ShapeText(const std::vector<int64_t>& shape) {
  return nlohmann::json(shape).dump();
}

std::string ErrnoMessage(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

int DtypeBytes(const std::string& dtype) { return dtype == "F32" ? 4 : 2; }

// A file written under PATH.tmp.<pid> and renamed over PATH by Commit; the
// temporary is removed unless Commit succeeded.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path)
      : path_(std::move(path)),
        temp_(path_ + ".tmp." + std::to_string(::getpid())) {}
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  Status Open() {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return Internal(ErrnoMessage("cannot create", temp_));
    return OkStatus();
  }
  Status Write(const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Internal(ErrnoMessage("cannot write", temp_));
      p += n;
      size -= static_cast<size_t>(n);
    }
    return OkStatus();
  }
  Status Commit() {
    if (::fsync(fd_) != 0) return Internal(ErrnoMessage("cannot fsync", temp_));
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return Internal(ErrnoMessage("cannot close", temp_));
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      return Internal(ErrnoMessage("cannot rename " + temp_ + " to", path_));
    }
    committed_ = true;
    std::string dir = std::filesystem::path(path_).parent_path().string();
    if (dir.empty()) dir = ".";
    const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) return Internal(ErrnoMessage("cannot open", dir));
    const bool synced = ::fsync(dir_fd) == 0;
    ::close(dir_fd);
    return synced ? OkStatus() : Internal(ErrnoMessage("cannot fsync", dir));
  }

 private:
  const std::string path_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

Result<int64_t> CheckedElements(const std::vector<int64_t>& shape,
                                const std::string& where) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return InvalidArgument(where + ": shape " + ShapeText(shape) +
                             " has a negative dimension");
    }
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 4 / d) {
      return InvalidArgument(where + ": shape " + ShapeText(shape) +
                             " has more elements than fit in 64 bits");
    }
    n *= d;
  }
  return n;
}

// The header's JSON, padded with spaces to a multiple of 8 bytes with the
// length before it, for tensors laid out in order from offset 0.
Result<std::string> HeaderBytes(const std::vector<SafetensorsSource>& tensors,
                                const SafetensorsWriteOptions& options,
                                uint64_t* data_bytes) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!options.metadata.empty()) header["__metadata__"] = options.metadata;
  uint64_t offset = 0;
  for (const SafetensorsSource& t : tensors) {
    const std::string where = "safetensors tensor " + Quoted(t.name);
    if (t.name.empty() || t.name == "__metadata__" || header.contains(t.name)) {
      return InvalidArgument(where +
                             ": the name is empty, reserved or "
                             "given twice");
    }
    ASSIGN_OR_RETURN(const int64_t n, CheckedElements(t.shape, where));
    const uint64_t end = offset + static_cast<uint64_t>(n) * 4;
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  const uint64_t length = json.size();
  std::memcpy(bytes.data(), &length, 8);
  *data_bytes = offset;
  return bytes + json;
}

}  // namespace

int64_t SafetensorsTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Status WriteSafetensors(const std::string& path,
                        const std::vector<SafetensorsSource>& tensors,
                        const SafetensorsWriteOptions& options) {
  uint64_t data_bytes = 0;
  ASSIGN_OR_RETURN(const std::string header,
                   HeaderBytes(tensors, options, &data_bytes));
  const uint64_t total = header.size() + data_bytes;
  AtomicFile file(path);
  RETURN_IF_ERROR(file.Open());
  RETURN_IF_ERROR(file.Write(header.data(), header.size()));
  uint64_t written = header.size();
  std::vector<float> values;
  for (const SafetensorsSource& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    values.assign(static_cast<size_t>(n), 0.0f);
    if (t.fill) t.fill(values.data());
    RETURN_IF_ERROR(file.Write(values.data(), values.size() * sizeof(float)));
    written += values.size() * sizeof(float);
    if (options.progress) options.progress(written, total);
  }
  return file.Commit();
}

namespace {

// Thrown by the parse callback to stop at once on what the format never
// holds (a name twice, nesting deeper than a tensor's arrays).
struct HeaderRefused {
  std::string why;
};

nlohmann::json ParseHeader(const std::string& text) {
  std::set<std::string> names, fields;  // top-level names, one entry's keys
  std::string name;                     // the entry being parsed
  auto check = [&](int depth, nlohmann::json::parse_event_t event,
                   nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if ((event == E::object_start || event == E::array_start) && depth > 2) {
      throw HeaderRefused{"nests deeper than a tensor's entry"};
    }
    if (event == E::key && depth == 1) {
      name = parsed.get<std::string>();
      fields.clear();
      if (!names.insert(name).second) {
        throw HeaderRefused{"names tensor " + Quoted(name) + " twice"};
      }
    }
    if (event == E::key && depth == 2 &&
        !fields.insert(parsed.get<std::string>()).second) {
      throw HeaderRefused{"gives " + Quoted(parsed.get<std::string>()) +
                          " twice in the entry of " + Quoted(name)};
    }
    return true;
  };
  return nlohmann::json::parse(text, check);
}

// A non-negative JSON integer, else nullopt.
bool AsCount(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

Result<SafetensorsTensor> ParseTensor(const std::string& name,
                                      const nlohmann::json& entry,
                                      const std::string& file) {
  const std::string where = file + ": tensor " + Quoted(name);
  SafetensorsTensor t;
  t.name = name;
  if (!entry.is_object() || !entry.contains("dtype") ||
      !entry.contains("shape") || !entry.contains("data_offsets")) {
    return InvalidArgument(where +
                           " is not an object with dtype, shape and "
                           "data_offsets");
  }
  const nlohmann::json& dtype = entry["dtype"];
  t.dtype = dtype.is_string() ? dtype.get<std::string>() : dtype.dump();
  if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16") {
    return InvalidArgument(where + " has dtype " + t.dtype +
                           "; only F32, BF16 and F16 are read");
  }
  const nlohmann::json& shape = entry["shape"];
  uint64_t d = 0;
  if (!shape.is_array()) {
    return InvalidArgument(where + ": shape " + shape.dump() +
                           " is not an array of sizes");
  }
  for (const nlohmann::json& v : shape) {
    if (!AsCount(v, &d) || d > (uint64_t{1} << 62)) {
      return InvalidArgument(where + ": shape " + shape.dump() +
                             " is not an array of sizes");
    }
    t.shape.push_back(static_cast<int64_t>(d));
  }
  const nlohmann::json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 ||
      !AsCount(offsets[0], &t.begin) || !AsCount(offsets[1], &t.end)) {
    return InvalidArgument(where + ": data_offsets " + offsets.dump() +
                           " is not a pair of byte offsets");
  }
  if (t.end < t.begin) {
    return InvalidArgument(where + ": data_offsets " + offsets.dump() +
                           " end before they begin");
  }
  ASSIGN_OR_RETURN(const int64_t n, CheckedElements(t.shape, where));
  const uint64_t bytes = static_cast<uint64_t>(n) * DtypeBytes(t.dtype);
  if (bytes != t.end - t.begin) {
    return InvalidArgument(where + ": shape " + ShapeText(t.shape) + " of " +
                           t.dtype + " is " + std::to_string(bytes) +
                           " bytes but data_offsets " + offsets.dump() +
                           " hold " + std::to_string(t.end - t.begin));
  }
  return t;
}

Result<std::map<std::string, std::string>> ParseMetadata(
    const nlohmann::json& entry, const std::string& file) {
  std::map<std::string, std::string> metadata;
  bool strings = entry.is_object();
  for (auto it = entry.begin(); strings && it != entry.end(); ++it) {
    strings = it.value().is_string();
    if (strings) metadata[it.key()] = it.value().get<std::string>();
  }
  if (!strings) {
    return InvalidArgument(file + ": __metadata__ is not an object of strings");
  }
  return metadata;
}

// The sorted ranges must tile [0, data_bytes) exactly.
Status CheckTiling(const std::vector<SafetensorsTensor>& tensors,
                   uint64_t data_bytes, const std::string& file) {
  uint64_t covered = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor& t : tensors) {
    const std::string range =
        "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ")";
    if (t.end > data_bytes) {
      return InvalidArgument(file + ": tensor " + Quoted(t.name) + " at " +
                             range + " runs past the end of the data (" +
                             std::to_string(data_bytes) +
                             " bytes after the header: is the file "
                             "truncated?)");
    }
    if (t.begin < covered) {
      return InvalidArgument(file + ": tensor " + Quoted(t.name) + " at " +
                             range + " overlaps tensor " +
                             Quoted(previous->name) + ", which ends at " +
                             std::to_string(covered));
    }
    if (t.begin > covered) {
      return InvalidArgument(file + ": bytes [" + std::to_string(covered) +
                             ", " + std::to_string(t.begin) +
                             ") of the data section, before tensor " +
                             Quoted(t.name) + ", belong to no tensor");
    }
    covered = t.end;
    previous = &t;
  }
  if (covered != data_bytes) {
    return InvalidArgument(
        file + ": the data section has " + std::to_string(data_bytes) +
        " bytes but its tensors end at byte " + std::to_string(covered));
  }
  return OkStatus();
}

// Reads exactly `size` bytes at `offset`; false if the file ends first.
Status ReadAt(int fd, void* out, size_t size, uint64_t offset,
              const std::string& path, const std::string& what) {
  char* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Internal(ErrnoMessage("cannot read", path));
    if (n == 0) {
      return InvalidArgument(path + ": the file ends inside " + what);
    }
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return OkStatus();
}

// The header's length and text, checked against the file's size.
Result<std::string> ReadHeaderText(int fd, const std::string& path,
                                   uint64_t file_bytes) {
  if (file_bytes < 8) {
    return InvalidArgument(path + ": " + std::to_string(file_bytes) +
                           " bytes, too short for a safetensors file's "
                           "8-byte header length");
  }
  uint64_t length = 0;
  RETURN_IF_ERROR(ReadAt(fd, &length, 8, 0, path, "the header length"));
  if (length > kSafetensorsMaxHeaderBytes) {
    return InvalidArgument(path + ": the header length " +
                           std::to_string(length) + " exceeds the limit of " +
                           std::to_string(kSafetensorsMaxHeaderBytes) +
                           " bytes");
  }
  if (length > file_bytes - 8) {
    return InvalidArgument(path + ": the header length " +
                           std::to_string(length) +
                           " runs past the end of the file (" +
                           std::to_string(file_bytes) + " bytes)");
  }
  std::string text(length, '\0');
  RETURN_IF_ERROR(ReadAt(fd, text.data(), length, 8, path, "the header"));
  return text;
}

}  // namespace

Result<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  SafetensorsReader r;
  r.path_ = path;
  r.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r.fd_ < 0) return InvalidArgument(ErrnoMessage("cannot open", path));
  struct stat st {};
  if (::fstat(r.fd_, &st) != 0)
    return Internal(ErrnoMessage("cannot stat", path));
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument(path + " is not a regular file");
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  ASSIGN_OR_RETURN(const std::string text,
                   ReadHeaderText(r.fd_, path, file_bytes));
  nlohmann::json header;
  try {
    header = ParseHeader(text);
  } catch (const HeaderRefused& e) {
    return InvalidArgument(path + ": the header " + e.why);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(path + ": the header is not valid JSON (" +
                           e.what() + ")");
  }
  if (!header.is_object()) {
    return InvalidArgument(path + ": the header is not a JSON object");
  }
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      ASSIGN_OR_RETURN(r.metadata_, ParseMetadata(it.value(), path));
      continue;
    }
    ASSIGN_OR_RETURN(SafetensorsTensor t, ParseTensor(it.key(), *it, path));
    r.tensors_.push_back(std::move(t));
  }
  std::sort(r.tensors_.begin(), r.tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
            });
  r.data_start_ = 8 + text.size();
  RETURN_IF_ERROR(CheckTiling(r.tensors_, file_bytes - r.data_start_, path));
  return r;
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_start_(other.data_start_),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsReader& SafetensorsReader::operator=(
    SafetensorsReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_start_ = other.data_start_;
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsTensor* SafetensorsReader::Find(
    const std::string& name) const {
  for (const SafetensorsTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status SafetensorsReader::ReadF32(const SafetensorsTensor& t,
                                  float* out) const {
  const std::string what = "tensor " + Quoted(t.name);
  const uint64_t bytes = t.end - t.begin;
  if (t.dtype == "F32") {
    return ReadAt(fd_, out, bytes, data_start_ + t.begin, path_, what);
  }
  std::vector<uint16_t> narrow(bytes / 2);
  RETURN_IF_ERROR(
      ReadAt(fd_, narrow.data(), bytes, data_start_ + t.begin, path_, what));
  const bool brain = t.dtype == "BF16";
  for (size_t i = 0; i < narrow.size(); ++i) {
    out[i] = brain ? bf16::ToFloat(narrow[i]) : HalfToFloat(narrow[i]);
  }
  return OkStatus();
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // infinity or NaN
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) |
                                (mantissa << 13));
  }
  // Zero or a subnormal: mantissa * 2^-24, exact in f32.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

}  // namespace multislice::train
