// The metrics log, progress bar and loss plot; see metrics.h for the
// metrics.jsonl format and its crash behaviour.
#include "train/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

namespace multislice::train {
namespace {

std::string ErrnoText(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// Writes all of `data` to `fd`, retrying on EINTR and short writes; the
// bytes that did land go to `*written` when it is not null.
Status WriteFully(int fd, const std::string& data, const std::string& path,
                  size_t* written = nullptr) {
  size_t done = 0;
  Status status;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      status = Internal(ErrnoText("cannot write", path));
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (written != nullptr) *written = done;
  return status;
}

// Removes the last `bytes` of `fd`'s file: the part of a record a failed
// write left. Best effort (the caller reports the write's own error; a
// partial line that stays is cut by the next Open).
void CutTail(int fd, size_t bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
  const off_t size = st.st_size - static_cast<off_t>(bytes);
  if (size >= 0) (void)::ftruncate(fd, size);
}

// Returns the size `fd`'s file must be cut to so that it ends at a '\n'
// (or is empty), reading backwards from the end in blocks.
Result<off_t> CompleteLinesSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Internal(ErrnoText("cannot stat", path));
  constexpr off_t kBlockBytes = 4096;
  char block[kBlockBytes];
  off_t end = st.st_size;
  while (end > 0) {
    off_t begin = std::max<off_t>(0, end - kBlockBytes);
    ssize_t n = ::pread(fd, block, static_cast<size_t>(end - begin), begin);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal(ErrnoText("cannot read", path));
    }
    if (n != end - begin) return Internal("short read of " + path);
    for (off_t i = n - 1; i >= 0; --i) {
      if (block[i] == '\n') return begin + i + 1;
    }
    end = begin;
  }
  return off_t{0};
}

}  // namespace

Result<MetricsWriter> MetricsWriter::Open(const std::string& run_dir) {
  std::string path = run_dir + "/" + kMetricsFileName;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Internal(ErrnoText("cannot open metrics file", path));
  MetricsWriter writer(fd, path, 0);  // closes fd on every return below
  struct stat st;
  if (::fstat(fd, &st) != 0) return Internal(ErrnoText("cannot stat", path));
  ASSIGN_OR_RETURN(off_t keep, CompleteLinesSize(fd, path));
  if (keep < st.st_size) {
    if (::ftruncate(fd, keep) != 0) {
      return Internal(ErrnoText("cannot truncate partial line of", path));
    }
    writer.repaired_bytes_ = st.st_size - keep;
  }
  return writer;
}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      repaired_bytes_(other.repaired_bytes_) {}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    repaired_bytes_ = other.repaired_bytes_;
  }
  return *this;
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status MetricsWriter::Write(const nlohmann::json& record) {
  if (fd_ < 0) return FailedPrecondition("metrics writer is closed");
  if (!record.is_object()) {
    return InvalidArgument("metrics record must be a JSON object, got " +
                           std::string(record.type_name()));
  }
  // Replace invalid UTF-8 rather than throw: a bad string in one record
  // must not end a training run.
  std::string line =
      record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line.push_back('\n');
  // One write(2) on an O_APPEND file: the line lands whole or, if killed
  // mid-call, as a partial tail that Open repairs. A short write is only
  // possible on a full disk; finishing it keeps the file line-aligned.
  size_t written = 0;
  Status status = WriteFully(fd_, line, path_, &written);
  if (!status.ok() && written > 0) CutTail(fd_, written);
  return status;
}

Status MetricsWriter::Sync() {
  if (fd_ < 0) return FailedPrecondition("metrics writer is closed");
  if (::fdatasync(fd_) != 0) return Internal(ErrnoText("cannot sync", path_));
  return OkStatus();
}

Result<std::vector<nlohmann::json>> MetricsWriter::ReadAll(
    const std::string& path, int64_t* skipped_partial_lines) {
  if (skipped_partial_lines != nullptr) *skipped_partial_lines = 0;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return InvalidArgument("metrics file " + path + " is not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open metrics file " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return Internal("cannot read metrics file " + path);
  const std::string text = buffer.str();

  std::vector<nlohmann::json> records;
  size_t begin = 0;
  int64_t line_number = 0;
  while (begin < text.size()) {
    size_t newline = text.find('\n', begin);
    if (newline == std::string::npos) {
      // A tail without '\n' is a write cut short by a kill.
      if (skipped_partial_lines != nullptr) *skipped_partial_lines = 1;
      break;
    }
    ++line_number;
    std::string_view line(text.data() + begin, newline - begin);
    begin = newline + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json record =
        nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) {
      return InvalidArgument("metrics file " + path + " line " +
                             std::to_string(line_number) +
                             " is not a JSON object");
    }
    records.push_back(std::move(record));
  }
  return records;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--";
  // Cap at ~1e12 s so the conversion to an integer is defined.
  const int64_t total =
      static_cast<int64_t>(std::llround(std::min(seconds, 1e12)));
  const int64_t hours = total / 3600;
  const int64_t minutes = (total % 3600) / 60;
  const int64_t secs = total % 60;
  char text[64];
  if (hours > 0) {
    std::snprintf(text, sizeof(text), "%lldh%02lldm%02llds",
                  static_cast<long long>(hours),
                  static_cast<long long>(minutes),
                  static_cast<long long>(secs));
  } else if (minutes > 0) {
    std::snprintf(text, sizeof(text), "%lldm%02llds",
                  static_cast<long long>(minutes),
                  static_cast<long long>(secs));
  } else {
    std::snprintf(text, sizeof(text), "%llds", static_cast<long long>(secs));
  }
  return text;
}

int64_t NextResumeIndex(const std::vector<nlohmann::json>& records) {
  int64_t next = 0;
  for (const nlohmann::json& r : records) {
    if (!r.is_object() || !r.contains("step")) continue;
    next = std::max(next, r.value(kResumeField, int64_t{0}) + 1);
  }
  return next;
}

std::vector<nlohmann::json> CurrentStepRecords(
    const std::vector<nlohmann::json>& records) {
  std::map<int64_t, const nlohmann::json*> current;
  for (const nlohmann::json& r : records) {
    if (!r.is_object() || !r.contains("step")) continue;
    const nlohmann::json*& slot = current[r.value("step", int64_t{0})];
    if (slot == nullptr || r.value(kResumeField, int64_t{0}) >=
                               slot->value(kResumeField, int64_t{0})) {
      slot = &r;
    }
  }
  std::vector<nlohmann::json> out;
  out.reserve(current.size());
  for (const auto& [step, record] : current) out.push_back(*record);
  return out;
}

std::string ProgressBar(int64_t step, int64_t total, double elapsed_seconds,
                        int width) {
  width = std::max(width, 0);
  if (total < 0) total = 0;
  step = std::clamp<int64_t>(step, 0, total);
  // Integer arithmetic so the bar and percent never round up to full early;
  // long double avoids overflow of step * width for huge totals.
  const int64_t filled =
      total == 0 ? 0
                 : static_cast<int64_t>(static_cast<long double>(step) * width /
                                        total);
  const int64_t percent =
      total == 0
          ? 0
          : static_cast<int64_t>(static_cast<long double>(step) * 100 / total);
  const std::string total_text = std::to_string(total);
  std::string step_text = std::to_string(step);
  step_text.insert(0, total_text.size() - step_text.size(), ' ');
  std::string percent_text = std::to_string(percent);
  percent_text.insert(0, 3 - percent_text.size(), ' ');

  std::string out = "[";
  out.append(static_cast<size_t>(filled), '#');
  out.append(static_cast<size_t>(width - filled), '-');
  out += "] " + step_text + "/" + total_text + " " + percent_text + "%  ";
  if (total > 0 && step == total) {
    out += "done in " + FormatDuration(elapsed_seconds);
  } else if (step == 0) {
    out += "ETA --";
  } else {
    const double seconds_per_step = elapsed_seconds / static_cast<double>(step);
    out += "ETA " +
           FormatDuration(seconds_per_step * static_cast<double>(total - step));
  }
  return out;
}

namespace {

// Chart geometry in SVG user units (pixels).
constexpr double kSvgWidth = 720;
constexpr double kSvgHeight = 440;
constexpr double kPlotLeft = 70;
constexpr double kPlotRight = 700;
constexpr double kPlotTop = 50;
constexpr double kPlotBottom = 390;
constexpr int kTargetTicks = 6;
constexpr char kTrainColor[] = "#1f77b4";
constexpr char kValidationColor[] = "#ff7f0e";

std::string XmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters other than tab/newline are not allowed in XML.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string Num(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", value);
  return text;
}

std::string TickLabel(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

struct Range {
  double low = std::numeric_limits<double>::infinity();
  double high = -std::numeric_limits<double>::infinity();
  void Add(double v) {
    low = std::min(low, v);
    high = std::max(high, v);
  }
  bool empty() const { return low > high; }
};

// A "nice" tick spacing (1, 2 or 5 times a power of ten) giving about
// kTargetTicks ticks over [low, high].
double TickSpacing(double low, double high) {
  const double raw = (high - low) / kTargetTicks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / magnitude;
  const double nice = fraction <= 1   ? 1
                      : fraction <= 2 ? 2
                      : fraction <= 5 ? 5
                                      : 10;
  return nice * magnitude;
}

// Widens `range` to a non-empty interval with nice tick-aligned ends.
void Normalize(Range& range, double& spacing) {
  if (range.empty()) {
    range.low = 0;
    range.high = 1;
  } else if (range.high - range.low <
             1e-12 * std::max(1.0, std::abs(range.high))) {
    const double pad = std::max(std::abs(range.low) * 0.1, 0.5);
    range.low -= pad;
    range.high += pad;
  }
  spacing = TickSpacing(range.low, range.high);
  range.low = std::floor(range.low / spacing) * spacing;
  range.high = std::ceil(range.high / spacing) * spacing;
}

bool Finite(const std::pair<double, double>& p) {
  return std::isfinite(p.first) && std::isfinite(p.second);
}

// fsync of the directory holding `path`, so that a rename into it is
// durable.
Status SyncParentDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Internal(ErrnoText("cannot open directory", dir));
  Status status;
  if (::fsync(fd) != 0) status = Internal(ErrnoText("cannot fsync", dir));
  ::close(fd);
  return status;
}

}  // namespace

Status WriteFileAtomically(const std::string& path, const std::string& data,
                           FileSync sync) {
  const bool durable = sync == FileSync::kFsync;
  const std::string temp_path =
      path + ".tmp." + std::to_string(static_cast<long long>(::getpid()));
  int fd =
      ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Internal(ErrnoText("cannot create", temp_path));
  Status status = WriteFully(fd, data, temp_path);
  if (status.ok() && durable && ::fsync(fd) != 0) {
    status = Internal(ErrnoText("cannot fsync", temp_path));
  }
  if (::close(fd) != 0 && status.ok()) {
    status = Internal(ErrnoText("cannot close", temp_path));
  }
  if (status.ok() && ::rename(temp_path.c_str(), path.c_str()) != 0) {
    status = Internal(ErrnoText("cannot rename " + temp_path + " to", path));
  }
  if (!status.ok()) {
    ::unlink(temp_path.c_str());
    return status;
  }
  return durable ? SyncParentDirectory(path) : OkStatus();
}

Status WriteLossPlotSvg(
    const std::string& path,
    const std::vector<std::pair<double, double>>& train,
    const std::vector<std::pair<double, double>>& validation,
    const std::string& title) {
  Range x_range, y_range;
  for (const auto* series : {&train, &validation}) {
    for (const auto& p : *series) {
      if (!Finite(p)) continue;
      x_range.Add(p.first);
      y_range.Add(p.second);
    }
  }
  double x_spacing = 1, y_spacing = 1;
  Normalize(x_range, x_spacing);
  Normalize(y_range, y_spacing);

  auto to_x = [&](double x) {
    return kPlotLeft + (x - x_range.low) / (x_range.high - x_range.low) *
                           (kPlotRight - kPlotLeft);
  };
  auto to_y = [&](double y) {
    return kPlotBottom - (y - y_range.low) / (y_range.high - y_range.low) *
                             (kPlotBottom - kPlotTop);
  };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kSvgWidth
      << "\" height=\"" << kSvgHeight << "\" viewBox=\"0 0 " << kSvgWidth << " "
      << kSvgHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << Num(kSvgWidth / 2)
      << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">"
      << XmlEscape(title) << "</text>\n";

  // Grid lines and tick labels. Ticks are counted, not accumulated, so
  // floating-point drift cannot add or drop one.
  const int x_ticks =
      static_cast<int>(std::llround((x_range.high - x_range.low) / x_spacing));
  for (int i = 0; i <= x_ticks; ++i) {
    double value = x_range.low + i * x_spacing;
    if (std::abs(value) < 1e-9 * x_spacing) value = 0;  // not "-1e-17"
    const double x = to_x(value);
    svg << "<line x1=\"" << Num(x) << "\" y1=\"" << Num(kPlotTop) << "\" x2=\""
        << Num(x) << "\" y2=\"" << Num(kPlotBottom)
        << "\" stroke=\"#e0e0e0\"/>\n";
    svg << "<text x=\"" << Num(x) << "\" y=\"" << Num(kPlotBottom + 16)
        << "\" text-anchor=\"middle\">" << TickLabel(value) << "</text>\n";
  }
  const int y_ticks =
      static_cast<int>(std::llround((y_range.high - y_range.low) / y_spacing));
  for (int i = 0; i <= y_ticks; ++i) {
    double value = y_range.low + i * y_spacing;
    if (std::abs(value) < 1e-9 * y_spacing) value = 0;  // not "-1e-17"
    const double y = to_y(value);
    svg << "<line x1=\"" << Num(kPlotLeft) << "\" y1=\"" << Num(y) << "\" x2=\""
        << Num(kPlotRight) << "\" y2=\"" << Num(y)
        << "\" stroke=\"#e0e0e0\"/>\n";
    svg << "<text x=\"" << Num(kPlotLeft - 6) << "\" y=\"" << Num(y + 4)
        << "\" text-anchor=\"end\">" << TickLabel(value) << "</text>\n";
  }
  // Axes and their labels.
  svg << "<line x1=\"" << Num(kPlotLeft) << "\" y1=\"" << Num(kPlotBottom)
      << "\" x2=\"" << Num(kPlotRight) << "\" y2=\"" << Num(kPlotBottom)
      << "\" stroke=\"black\"/>\n";
  svg << "<line x1=\"" << Num(kPlotLeft) << "\" y1=\"" << Num(kPlotTop)
      << "\" x2=\"" << Num(kPlotLeft) << "\" y2=\"" << Num(kPlotBottom)
      << "\" stroke=\"black\"/>\n";
  svg << "<text x=\"" << Num((kPlotLeft + kPlotRight) / 2) << "\" y=\""
      << Num(kPlotBottom + 36) << "\" text-anchor=\"middle\">step</text>\n";
  svg << "<text x=\"16\" y=\"" << Num((kPlotTop + kPlotBottom) / 2)
      << "\" text-anchor=\"middle\" transform=\"rotate(-90 16 "
      << Num((kPlotTop + kPlotBottom) / 2) << ")\">loss</text>\n";

  // The series. A lone point gets a dot, since a one-point polyline is
  // invisible.
  struct Series {
    const std::vector<std::pair<double, double>>* points;
    const char* name;
    const char* color;
  };
  const Series all_series[] = {{&train, "train", kTrainColor},
                               {&validation, "validation", kValidationColor}};
  int legend_row = 0;
  for (const Series& series : all_series) {
    std::string points;
    int count = 0;
    for (const auto& p : *series.points) {
      if (!Finite(p)) continue;
      if (count++ > 0) points += ' ';
      points += Num(to_x(p.first)) + "," + Num(to_y(p.second));
    }
    if (count == 0) continue;
    svg << "<polyline fill=\"none\" stroke=\"" << series.color
        << "\" stroke-width=\"2\" points=\"" << points << "\"/>\n";
    if (count == 1) {
      const size_t comma = points.find(',');
      svg << "<circle cx=\"" << points.substr(0, comma) << "\" cy=\""
          << points.substr(comma + 1) << "\" r=\"3\" fill=\"" << series.color
          << "\"/>\n";
    }
    const double legend_y = kPlotTop + 14 + 18 * legend_row++;
    svg << "<line x1=\"" << Num(kPlotRight - 110) << "\" y1=\""
        << Num(legend_y - 4) << "\" x2=\"" << Num(kPlotRight - 86) << "\" y2=\""
        << Num(legend_y - 4) << "\" stroke=\"" << series.color
        << "\" stroke-width=\"2\"/>\n";
    svg << "<text x=\"" << Num(kPlotRight - 80) << "\" y=\"" << Num(legend_y)
        << "\">" << series.name << "</text>\n";
  }
  svg << "</svg>\n";
  return WriteFileAtomically(path, svg.str())
      .WithContext("cannot write loss plot");
}

}  // namespace multislice::train
