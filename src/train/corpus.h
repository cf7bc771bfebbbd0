// A corpus: the documents of a list of inputs (files and directories), read
// one at a time so that no more than one document is in memory, for
// `multislice data prepare` (train/dataset.h).
//
// The format of a file comes from its name:
//   *.jsonl, *.json        JSON Lines: one JSON object per line whose string
//                          field `text_field` is the document; blank lines
//                          are skipped.
//   *.tfrecord, *.tfrecords TFRecord of tf.train.Example records whose bytes
//                          feature `text_field` (one value, UTF-8) is the
//                          document (train/tfrecord.h).
//   anything else          text (UTF-8, no NUL bytes), split into documents
//                          at lines holding only "%" (the fortune format; a
//                          file without such lines is one document). Each
//                          document keeps its lines' newlines and ends in
//                          one.
// A directory contributes its regular files, recursively, sorted by path,
// skipping `*.dat` index files, symbolic links (Debian's `*.u8` links
// duplicate their targets), the `off/` subdirectory (offensive fortunes) and
// text files that are not UTF-8 (counted as skipped). Documents that are
// blank (only spaces, tabs and newlines) are dropped in every format.
//
// Thread-safety: a Corpus is not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace multislice::train {

// The default corpus: Debian's `fortunes` package.
extern const char* kDefaultCorpus;  // "/usr/share/games/fortunes"

enum class CorpusFormat { kText, kJsonLines, kTfRecord };
// "text", "jsonl" or "tfrecord".
const char* CorpusFormatName(CorpusFormat format);
CorpusFormat CorpusFormatOf(const std::string& path);

struct CorpusOptions {
  std::vector<std::string> inputs;  // files and directories
  std::string text_field = "text";  // JSON Lines and TFRecord
};

struct CorpusFile {
  std::string path;
  CorpusFormat format = CorpusFormat::kText;
  bool named = false;     // given as an input (not found in a directory)
  uint64_t bytes = 0;     // its size when the corpus was opened
  bool skipped = false;   // a directory's text file that is not UTF-8
  int64_t documents = 0;  // non-blank documents read from it so far
};

class FileDocuments;  // one file's reader (corpus.cc)

class Corpus {
 public:
  // Lists the files. InvalidArgument for an input that does not exist or an
  // empty list; Internal for a directory that cannot be listed.
  static Result<std::unique_ptr<Corpus>> Open(const CorpusOptions& options);
  ~Corpus();

  // The next non-blank document into *text; false after the last.
  // InvalidArgument, one sentence naming the file and the line (JSON Lines)
  // or byte offset (TFRecord) and what is wrong, for a malformed record or
  // a named file that is not text; Internal for a read error.
  Result<bool> Next(std::string* text);

  // The file of the document Next returned last (an index into files()).
  int file_index() const { return file_index_; }
  const std::vector<CorpusFile>& files() const { return files_; }
  // Bytes of the inputs consumed so far, of total_bytes() (progress).
  uint64_t bytes_read() const;
  uint64_t total_bytes() const { return total_bytes_; }
  int64_t documents() const { return documents_; }
  int files_read() const;     // opened and not skipped, so far
  int skipped_files() const;  // so far

 private:
  Corpus() = default;
  Status OpenNextFile();

  CorpusOptions options_;
  std::vector<CorpusFile> files_;
  uint64_t total_bytes_ = 0;
  uint64_t bytes_done_ = 0;  // of the files before the current one
  int next_file_ = 0;
  int file_index_ = -1;
  int64_t documents_ = 0;
  std::unique_ptr<FileDocuments> current_;
};

}  // namespace multislice::train
