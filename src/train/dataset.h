// Prepared datasets: `multislice data prepare` turns a corpus
// (train/corpus.h) into token files (train/data.h) through a tokenizer
// (train/tokenizer.h); dataset.json says how, and the trainer and
// `multislice generate` read it back (ReadDatasetInfo).
//
// A dataset directory holds
//   train.bin, val.bin  the token files of the two splits
//   tokenizer.model     SentencePiece datasets: a copy of the model
//   dataset.json        what was done, format_version kDatasetFormatVersion:
//     "tokenizer": {"type": "bytes" | "sentencepiece", "model":
//       "tokenizer.model", "checksum": "fnv1a64:<16 hex digits>" (of the
//       model's bytes), "vocab_size", "bos_id", "eos_id", "pad_id",
//       "unk_id" (-1: none), "add_bos", "add_eos", "source" (the --tokenizer
//       path, or "trained")}, "vocab_size", "token_width_bytes",
//     "token_file_format_version", "seed", "validation_fraction",
//     "text_field", "split_rule", "files", "skipped_files", "documents",
//     "train" and "val" ({file, documents, tokens}), "sources" (per file:
//     path, format, documents, tokens).
//   Version 1 (byte-level datasets before SentencePiece) had "tokenizer":
//   "bytes" and stays readable.
//
// Thread-safety: PrepareDataset may run in several processes at once on the
// same output (the files are staged per process and renamed; identical
// inputs give identical files).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "train/corpus.h"
#include "train/data.h"
#include "train/tokenizer.h"

namespace multislice::train {

inline constexpr int kDatasetFormatVersion = 2;
inline constexpr char kDatasetTokenizerFile[] = "tokenizer.model";

// What PrepareDataset is doing, for a progress line.
struct PrepareProgress {
  std::string phase;  // "training the tokenizer" or "tokenizing"
  int64_t documents = 0;
  uint64_t bytes_read = 0, total_bytes = 0;  // of the inputs
};

struct PrepareOptions {
  std::vector<std::string> inputs;  // files and directories (corpus.h)
  std::string output_dir;           // created if missing
  double validation_fraction = 0.05;
  uint64_t seed = 0;
  std::string text_field = "text";  // JSON Lines and TFRecord
  // A SentencePiece .model to tokenize with; "" and train_tokenizer_vocab 0
  // mean byte-level.
  std::string tokenizer_path;
  // > 0: train a SentencePiece model of this many pieces on the training
  // split (TrainSentencePiece), keep it as tokenizer.model and tokenize
  // with it. Not together with tokenizer_path.
  int train_tokenizer_vocab = 0;
  int64_t tokenizer_sentence_sample = 1'000'000;  // input_sentence_size
  // SentencePiece datasets: each document becomes [bos] tokens [eos]
  // (MaxText's keys). Byte-level datasets have no such ids: a document
  // there is its text and "%\n", as it always was.
  bool add_bos = true;
  bool add_eos = true;
  // Called after every document (and at each phase's start); may be empty.
  std::function<void(const PrepareProgress&)> progress;
};

struct PrepareStats {
  int files = 0;          // files read
  int skipped_files = 0;  // files in input directories that were not text
  int64_t documents = 0;  // non-blank documents found
  int64_t train_documents = 0;
  int64_t val_documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t bytes_read = 0;  // of the inputs
  std::string tokenizer_type;
  std::string tokenizer_checksum;  // "" for bytes
  uint32_t vocab_size = 0;
  uint32_t token_width_bytes = 0;
};

// Writes train.bin, val.bin, dataset.json (and tokenizer.model) under
// options.output_dir. A document goes to validation when
//   SplitMix64(seed ^ SplitMix64(index)) / 2^64 < validation_fraction
// where index counts documents from 0 in input order. Nothing is written
// unless everything succeeds: every file is staged and renamed at the end
// (dataset.json last), and directories this call created are removed on
// failure. InvalidArgument (one sentence naming the flag, file, line or
// offset) for bad options, a bad tokenizer, missing inputs, malformed
// records or no training documents; Internal for I/O failures. `stats` may
// be null.
Status PrepareDataset(const PrepareOptions& options, PrepareStats* stats);

// "fnv1a64:" and the 16 hex digits of Fnv1a64 over a model file's bytes.
std::string TokenizerChecksum(std::string_view model_bytes);

// Where `multislice train` prepares the default corpus when dataset_path is
// empty: base/datasets/fortunes for byte-level tokens, and
// base/datasets/fortunes-<the checksum's first 12 hex digits> for the
// SentencePiece model of `tokenizer_checksum` (so that each model gets its
// own directory). `multislice generate` finds a run's dataset by the same
// rule.
std::string DefaultDatasetDirectory(const std::string& base_output_directory,
                                    const std::string& tokenizer_checksum);

// Whether `dir` holds a complete prepared dataset (dataset.json, written
// last, and both token files).
bool DatasetIsComplete(const std::string& dir);

struct DatasetInfo {
  std::string directory;
  int format_version = 0;
  std::string tokenizer_type = kByteTokenizerType;
  std::string tokenizer_checksum;  // "" for bytes
  uint32_t vocab_size = kByteVocabSize;
  int bos_id = -1, eos_id = -1;
  bool add_bos = false, add_eos = false;

  bool byte_level() const { return tokenizer_type == kByteTokenizerType; }
  // directory/tokenizer.model; "" for byte-level datasets.
  std::string tokenizer_model_path() const;
};

// Reads DIR/dataset.json (either version). NotFound if it is missing;
// InvalidArgument naming the file and the field otherwise.
Result<DatasetInfo> ReadDatasetInfo(const std::string& dir);

// The dataset's tokenizer: byte-level, or its tokenizer.model copy, checked
// against the recorded checksum (InvalidArgument naming the file when it
// differs or does not load).
Result<std::unique_ptr<Tokenizer>> LoadDatasetTokenizer(
    const DatasetInfo& info);

// The tokenizer of a `multislice train` run, for `multislice generate`.
struct RunTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  bool add_bos = false;  // the documents began with BOS: so does a prompt
  bool add_eos = false;  // they ended with EOS: generation stops there
  std::string source;    // "bytes", or the .model file it came from
};

// Finds the tokenizer through RUN_DIR/config.json, the way the trainer
// found its dataset (relative paths from the current directory, as train
// took them): the dataset is dataset_path, or with it empty
// DefaultDatasetDirectory(base_output_directory, tokenizer_path's
// checksum); a dataset with a dataset.json gives its tokenizer (the
// tokenizer.model copy, checksum-checked, and its add_bos/add_eos); without
// one, tokenizer_path itself (with the config's add_bos/add_eos), else
// bytes. A run directory without config.json is byte-level. Errors name
// the file at fault.
Result<RunTokenizer> FindRunTokenizer(const std::string& run_dir);

}  // namespace multislice::train
