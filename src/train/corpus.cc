// The corpus's file listing and its three readers (text, JSON Lines,
// TFRecord): see corpus.h. A text file is read twice, once to check that it
// is UTF-8 (a directory's other files are skipped, not an error, so the
// check must end before its first document) and once for its documents;
// neither read holds more than a line and the current document.
#include "train/corpus.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "train/tfrecord.h"

namespace multislice::train {

const char* kDefaultCorpus = "/usr/share/games/fortunes";

namespace fs = std::filesystem;

const char* CorpusFormatName(CorpusFormat format) {
  switch (format) {
    case CorpusFormat::kJsonLines:
      return "jsonl";
    case CorpusFormat::kTfRecord:
      return "tfrecord";
    default:
      return "text";
  }
}

CorpusFormat CorpusFormatOf(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".jsonl" || ext == ".json") return CorpusFormat::kJsonLines;
  if (ext == ".tfrecord" || ext == ".tfrecords") return CorpusFormat::kTfRecord;
  return CorpusFormat::kText;
}

namespace {

// A streaming check of well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF) without NUL bytes.
class Utf8Checker {
 public:
  bool Feed(std::string_view bytes) {
    for (unsigned char c : bytes) {
      if (!ok_) return false;
      if (pending_ > 0) {
        ok_ = c >= low_ && c <= high_;
        low_ = 0x80;
        high_ = 0xbf;
        --pending_;
        continue;
      }
      if (c == 0) {
        ok_ = false;
      } else if (c < 0x80) {
        // ASCII
      } else if (c >= 0xc2 && c <= 0xdf) {
        pending_ = 1;
      } else if (c >= 0xe0 && c <= 0xef) {
        pending_ = 2;
        low_ = c == 0xe0 ? 0xa0 : 0x80;   // overlong
        high_ = c == 0xed ? 0x9f : 0xbf;  // surrogates
      } else if (c >= 0xf0 && c <= 0xf4) {
        pending_ = 3;
        low_ = c == 0xf0 ? 0x90 : 0x80;
        high_ = c == 0xf4 ? 0x8f : 0xbf;  // above U+10FFFF
      } else {
        ok_ = false;
      }
    }
    return ok_;
  }
  bool Finish() const { return ok_ && pending_ == 0; }

 private:
  bool ok_ = true;
  int pending_ = 0;
  unsigned char low_ = 0x80, high_ = 0xbf;
};

bool IsText(std::string_view text) {
  Utf8Checker checker;
  return checker.Feed(text) && checker.Finish();
}

bool IsBlank(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
  });
}

std::string ErrnoText() { return std::strerror(errno); }

// Whether the file at `path` is UTF-8 text, read in blocks.
Result<bool> FileIsText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Internal(path + ": cannot open: " + ErrnoText());
  Utf8Checker checker;
  std::vector<char> block(1 << 16);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const auto n = static_cast<size_t>(in.gcount());
    if (!checker.Feed(std::string_view(block.data(), n))) return false;
  }
  if (in.bad()) return Internal(path + ": read failed: " + ErrnoText());
  return checker.Finish();
}

// The files a directory input contributes (see corpus.h), sorted.
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

}  // namespace

// One file's documents, in order.
class FileDocuments {
 public:
  virtual ~FileDocuments() = default;
  virtual Result<bool> Next(std::string* text) = 0;
  virtual uint64_t position() const = 0;  // bytes of the file consumed
};

namespace {

// The fortune format: documents end at lines holding only "%".
class TextDocuments : public FileDocuments {
 public:
  explicit TextDocuments(const std::string& path)
      : path_(path), in_(path, std::ios::binary) {}
  bool opened() const { return static_cast<bool>(in_); }

  Result<bool> Next(std::string* text) override {
    text->clear();
    std::string line;
    while (!done_) {
      if (!std::getline(in_, line)) {
        if (in_.bad()) return Internal(path_ + ": read failed: " + ErrnoText());
        done_ = true;
        break;
      }
      const bool had_newline = !in_.eof();
      position_ += line.size() + (had_newline ? 1 : 0);
      std::string_view bare(line);
      if (!bare.empty() && bare.back() == '\r') bare.remove_suffix(1);
      if (bare == "%") {
        if (!IsBlank(*text)) break;
        text->clear();
        continue;
      }
      text->append(line);
      if (had_newline) text->push_back('\n');
    }
    if (IsBlank(*text)) return false;  // only at the end of the file
    if (text->back() != '\n') text->push_back('\n');
    return true;
  }
  uint64_t position() const override { return position_; }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t position_ = 0;
  bool done_ = false;
};

class JsonLinesDocuments : public FileDocuments {
 public:
  JsonLinesDocuments(const std::string& path, const std::string& field)
      : path_(path), field_(field), in_(path, std::ios::binary) {}
  bool opened() const { return static_cast<bool>(in_); }

  Result<bool> Next(std::string* text) override {
    std::string line;
    while (std::getline(in_, line)) {
      ++line_number_;
      position_ += line.size() + (in_.eof() ? 0 : 1);
      if (IsBlank(line)) continue;
      ASSIGN_OR_RETURN(*text, TextOf(line));
      if (!IsBlank(*text)) return true;
    }
    if (in_.bad()) return Internal(path_ + ": read failed: " + ErrnoText());
    return false;
  }
  uint64_t position() const override { return position_; }

 private:
  Status Fault(const std::string& what) const {
    return InvalidArgument(path_ + ", line " + std::to_string(line_number_) +
                           ": " + what);
  }

  Result<std::string> TextOf(const std::string& line) const {
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      // what() is "[json.exception.parse_error.101] parse error at line 1,
      // column 5: ..."; the column and the reason are what help.
      std::string reason = e.what();
      const size_t at = reason.find("column");
      if (at != std::string::npos) reason = reason.substr(at);
      return Fault("bad JSON (" + reason + ")");
    }
    const std::string quoted = "\"" + field_ + "\"";
    if (!object.is_object()) {
      return Fault(std::string("expected a JSON object with a ") + quoted +
                   " string, got " + object.type_name());
    }
    auto it = object.find(field_);
    if (it == object.end()) {
      return Fault("no " + quoted +
                   " field (the text field; choose another with "
                   "--text_field)");
    }
    if (!it->is_string()) {
      return Fault("field " + quoted + " is " + it->type_name() +
                   ", not a string");
    }
    std::string text = it->get<std::string>();
    if (!IsText(text)) return Fault("field " + quoted + " holds a NUL byte");
    return text;
  }

  std::string path_, field_;
  std::ifstream in_;
  int64_t line_number_ = 0;
  uint64_t position_ = 0;
};

class TfRecordDocuments : public FileDocuments {
 public:
  TfRecordDocuments(TfRecordReader reader, const std::string& field)
      : reader_(std::move(reader)), field_(field) {}

  Result<bool> Next(std::string* text) override {
    std::string record;
    for (;;) {
      ASSIGN_OR_RETURN(bool more, reader_.Next(&record));
      if (!more) return false;
      auto value = ExampleBytesFeature(record, field_);
      if (!value.ok()) return Fault(value.status().message());
      if (!IsText(*value)) {
        return Fault("feature '" + field_ +
                     "' is not UTF-8 text (it holds NUL bytes or invalid "
                     "UTF-8)");
      }
      if (IsBlank(*value)) continue;
      *text = std::move(*value);
      return true;
    }
  }
  uint64_t position() const override { return reader_.position(); }

 private:
  Status Fault(const std::string& what) const {
    return InvalidArgument(reader_.path() + ": the record at byte offset " +
                           std::to_string(reader_.record_offset()) + " " +
                           what);
  }

  TfRecordReader reader_;
  std::string field_;
};

}  // namespace

Result<std::unique_ptr<Corpus>> Corpus::Open(const CorpusOptions& options) {
  if (options.inputs.empty()) {
    return InvalidArgument(
        "--input: no inputs given (expected text, JSON Lines or TFRecord "
        "files or directories)");
  }
  std::unique_ptr<Corpus> corpus(new Corpus());
  corpus->options_ = options;
  for (const std::string& input : options.inputs) {
    std::error_code ec;
    fs::file_status status = fs::status(input, ec);
    if (ec || !fs::exists(status)) {
      return InvalidArgument("--input: '" + input + "' does not exist");
    }
    std::vector<std::pair<fs::path, bool>> paths;
    if (fs::is_directory(status)) {
      std::vector<fs::path> listed;
      RETURN_IF_ERROR(ListDirectory(input, &listed));
      for (fs::path& p : listed) paths.emplace_back(std::move(p), false);
    } else {
      paths.emplace_back(input, true);
    }
    for (const auto& [path, named] : paths) {
      CorpusFile file;
      file.path = path.string();
      file.format = CorpusFormatOf(file.path);
      file.named = named;
      file.bytes = static_cast<uint64_t>(fs::file_size(path, ec));
      if (ec) file.bytes = 0;
      corpus->total_bytes_ += file.bytes;
      corpus->files_.push_back(std::move(file));
    }
  }
  return corpus;
}

Corpus::~Corpus() = default;

Status Corpus::OpenNextFile() {
  CorpusFile& file = files_[static_cast<size_t>(next_file_)];
  file_index_ = next_file_++;
  switch (file.format) {
    case CorpusFormat::kTfRecord: {
      ASSIGN_OR_RETURN(TfRecordReader reader, TfRecordReader::Open(file.path));
      current_ = std::make_unique<TfRecordDocuments>(std::move(reader),
                                                     options_.text_field);
      return OkStatus();
    }
    case CorpusFormat::kJsonLines: {
      auto reader =
          std::make_unique<JsonLinesDocuments>(file.path, options_.text_field);
      if (!reader->opened()) {
        return Internal(file.path + ": cannot open: " + ErrnoText());
      }
      current_ = std::move(reader);
      return OkStatus();
    }
    case CorpusFormat::kText:
      break;
  }
  ASSIGN_OR_RETURN(bool text, FileIsText(file.path));
  if (!text) {
    if (file.named) {
      return InvalidArgument("--input: '" + file.path +
                             "' is not a text file (it holds NUL bytes or "
                             "invalid UTF-8)");
    }
    file.skipped = true;
    return OkStatus();  // current_ stays empty: Next moves on
  }
  auto reader = std::make_unique<TextDocuments>(file.path);
  if (!reader->opened()) {
    return Internal(file.path + ": cannot open: " + ErrnoText());
  }
  current_ = std::move(reader);
  return OkStatus();
}

Result<bool> Corpus::Next(std::string* text) {
  for (;;) {
    if (current_) {
      ASSIGN_OR_RETURN(bool more, current_->Next(text));
      if (more) {
        ++files_[static_cast<size_t>(file_index_)].documents;
        ++documents_;
        return true;
      }
      current_.reset();
      bytes_done_ += files_[static_cast<size_t>(file_index_)].bytes;
    }
    if (next_file_ >= static_cast<int>(files_.size())) return false;
    RETURN_IF_ERROR(OpenNextFile());
    if (!current_)
      bytes_done_ += files_[static_cast<size_t>(file_index_)].bytes;
  }
}

uint64_t Corpus::bytes_read() const {
  return bytes_done_ + (current_ ? current_->position() : 0);
}

int Corpus::files_read() const {
  int n = 0;
  for (int i = 0; i < std::min<int>(next_file_, files_.size()); ++i) {
    n += files_[static_cast<size_t>(i)].skipped ? 0 : 1;
  }
  return n;
}

int Corpus::skipped_files() const {
  int n = 0;
  for (const CorpusFile& f : files_) n += f.skipped ? 1 : 0;
  return n;
}

}  // namespace multislice::train
