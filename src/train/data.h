// Training data: the token file format, `multislice data prepare`, and the
// deterministic sharded iterator that feeds `multislice train`.
//
// Token file (little-endian, versioned; `kTokenFileHeaderBytes` of header,
// then the payload):
//   offset  0  char[8]  magic "MSTOKENS"
//   offset  8  u32      format version (kTokenFileFormatVersion = 1)
//   offset 12  u32      vocabulary size (256 for byte-level tokens)
//   offset 16  u32      token width in bytes (1; 2 is reserved for BPE)
//   offset 20  u32      reserved, 0
//   offset 24  u64      token count
//   offset 32  u64      FNV-1a 64 checksum of the payload bytes
//   offset 40  payload: token count * token width bytes
// Files are written atomically (temp file, fsync, rename, fsync of the
// directory), so a reader sees either the old file or the whole new one.
//
// The iterator (see DataIterator) splits the payload into one contiguous
// shard per row of the global batch; a host reads only the shards of its own
// rows, and the window of global row g at step s is a pure function of (seed,
// s, g). Any step can be produced without replaying earlier ones, the batches
// do not depend on how the rows are spread over hosts (a checkpoint restored
// on another mesh sees the same data), and the state (IteratorState) is a few
// numbers that go into every checkpoint.
//
// Thread-safety: free functions are safe to call concurrently on different
// files; a DataIterator is not thread-safe (one per host's input thread).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace multislice::train {

// The default corpus: Debian's `fortunes` package.
extern const char* kDefaultCorpus;  // "/usr/share/games/fortunes"

inline constexpr char kTokenFileMagic[] = "MSTOKENS";  // 8 bytes on disk
inline constexpr uint32_t kTokenFileFormatVersion = 1;
inline constexpr int kTokenFileHeaderBytes = 40;
inline constexpr uint32_t kByteVocabSize = 256;
// Version of dataset.json written by PrepareDataset.
inline constexpr int kDatasetFormatVersion = 1;
// Version of the serialised IteratorState.
inline constexpr int kIteratorStateFormatVersion = 2;

// FNV-1a 64 over `size` bytes, continuing from `state` (start with the
// default to hash from scratch).
inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ULL;
uint64_t Fnv1a64(const void* data, size_t size,
                 uint64_t state = kFnv1a64Offset);

// The splitmix64 finaliser: a counter-based hash used for the split rule and
// the iterator's window starts.
uint64_t SplitMix64(uint64_t x);

struct TokenFileHeader {
  uint32_t format_version = kTokenFileFormatVersion;
  uint32_t vocab_size = kByteVocabSize;
  uint32_t token_width_bytes = 1;
  uint64_t token_count = 0;
  uint64_t payload_checksum = 0;
};

// Writes byte-level tokens (width 1, vocabulary 256) to `path` atomically.
// Internal on an I/O failure, with the path and errno text.
Status WriteTokenFile(const std::string& path,
                      const std::vector<uint8_t>& tokens);

// Reads and checks the header: magic, version, token width, vocabulary and
// that the file size matches the token count. Does not read the payload, so
// the checksum is not verified (see VerifyTokenFile). NotFound if the file
// cannot be opened, InvalidArgument with one sentence naming the file and
// the fault otherwise.
Result<TokenFileHeader> ReadTokenFileHeader(const std::string& path);

// Reads the whole file, checking the header and the payload checksum.
Result<std::vector<uint8_t>> ReadTokenFile(const std::string& path);

// ReadTokenFile without keeping the tokens.
Status VerifyTokenFile(const std::string& path);

// ---------------------------------------------------------------------------
// `multislice data prepare`

struct PrepareStats {
  int files = 0;          // text files read
  int skipped_files = 0;  // files in input directories that were not text
  int64_t documents = 0;  // non-empty documents found
  int64_t train_documents = 0;
  int64_t val_documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
};

// Turns text into byte-level token files under `output_dir` (created if
// missing): train.bin, val.bin and dataset.json.
//
// Each input is a text file or a directory; a directory contributes its
// regular text files (recursively, sorted by path), skipping `*.dat` index
// files, symbolic links (Debian's `*.u8` links duplicate their targets), the
// `off/` subdirectory (offensive fortunes) and files that contain NUL bytes
// or invalid UTF-8. Every file is split into documents at lines holding
// only `%` (the fortune format; a file without such lines is one document);
// blank documents are dropped. A document goes to validation when
//   SplitMix64(seed ^ SplitMix64(index)) / 2^64 < validation_fraction
// where index counts documents from 0 in input order; each document is
// written as its text (ending in a newline) followed by "%\n".
//
// InvalidArgument for a missing input, a named file that is not text,
// validation_fraction outside [0, 1), or no training documents; Internal for
// I/O failures. `stats` may be null.
Status PrepareDataset(const std::vector<std::string>& inputs,
                      const std::string& output_dir, double validation_fraction,
                      uint64_t seed, PrepareStats* stats);

// ---------------------------------------------------------------------------
// The iterator

struct IteratorState {
  int format_version = kIteratorStateFormatVersion;
  int64_t step = 0;  // the step the next call to Next() produces
  int global_rows = 1;
  int row_begin = 0;  // this host's first global row
  int rows = 1;       // this host's rows
  uint64_t seed = 0;
};

nlohmann::json IteratorStateToJson(const IteratorState& state);
// InvalidArgument naming the missing or mistyped field.
Result<IteratorState> IteratorStateFromJson(const nlohmann::json& json);

struct DataIteratorOptions {
  std::string token_file;
  int global_rows = 1;  // rows of the global batch (every host's together)
  int row_begin = 0;    // this host's rows: [row_begin, row_begin + rows)
  int rows = 1;
  int seq_len = 64;  // tokens per row; each window is seq_len + 1 tokens
  uint64_t seed = 0;
};

// One host's batch: `rows` rows of `seq_len` tokens, row-major.
// targets[r][t] == inputs[r][t + 1] within the window, i.e. the window is
// file tokens [start, start + seq_len] and inputs/targets are its first and
// last seq_len tokens.
struct Batch {
  int64_t step = 0;
  int rows = 0;
  int seq_len = 0;
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
  std::vector<int64_t> starts;  // per row: the window's first token, as an
                                // index into the whole token file
};

// Global row g of G owns tokens [g*N/G, (g+1)*N/G) of an N-token file; a
// host reads only the range of its rows (one pread). Row g of step s starts
// at
//   g*N/G + (SplitMix64 mix of seed, s, g) mapped uniformly onto
//   [0, row_shard_tokens - seq_len - 1]
// so every window lies inside its row's shard, and every step's batch draws
// from every part of the corpus.
class DataIterator {
 public:
  // InvalidArgument for bad options (rows outside [0, global_rows), seq_len
  // below 1, a row shard shorter than seq_len + 1 tokens) or a bad token file
  // header; NotFound if the file is missing.
  static Result<DataIterator> Create(const DataIteratorOptions& options);

  // The batch of state().step; then advances the step.
  Result<Batch> Next();
  // The batch of `step` (>= 0) without changing the state.
  Batch At(int64_t step) const;

  IteratorState state() const;
  // Continues from `state`: InvalidArgument if its format version, global
  // row count or seed differ from this iterator's, or its step is negative.
  // Its row range may differ (a run restored on another mesh).
  Status Restore(const IteratorState& state);

  // The token range this host read: [shard_begin, shard_begin +
  // shard_tokens).
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_tokens() const { return static_cast<int64_t>(shard_.size()); }

 private:
  DataIterator() = default;

  DataIteratorOptions options_;
  int64_t total_tokens_ = 0;
  int64_t shard_begin_ = 0;
  std::vector<uint8_t> shard_;
  int64_t step_ = 0;
};

}  // namespace multislice::train
