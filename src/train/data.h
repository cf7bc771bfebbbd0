// Training data: the token file format and the deterministic sharded
// iterator that feeds `multislice train`. (Preparing a dataset from a corpus
// is train/dataset.h; the tokenizers are train/tokenizer.h.)
//
// Token file (little-endian, versioned; `kTokenFileHeaderBytes` of header,
// then the payload):
//   offset  0  char[8]  magic "MSTOKENS"
//   offset  8  u32      format version (1 or 2; this build writes 2)
//   offset 12  u32      vocabulary size V: every token is in [0, V)
//   offset 16  u32      token width in bytes W: 1, 2 or 4
//   offset 20  u32      reserved, 0
//   offset 24  u64      token count
//   offset 32  u64      FNV-1a 64 checksum of the payload bytes
//   offset 40  payload: token count * W bytes, each token an unsigned
//              little-endian integer of W bytes
// Version 1 (the byte-level files written before SentencePiece) allows only
// W = 1 and V <= 256; version 2 allows W = 1 (V <= 256), 2 (V <= 65536) and
// 4 (V < 2^31, so that a token fits the model's int32 ids). The writer picks
// the narrowest width for the vocabulary (TokenWidthFor). Files are written
// atomically (temp file, fsync, rename, fsync of the directory), so a reader
// sees either the old file or the whole new one.
//
// The iterator (see DataIterator) splits the payload into one contiguous
// shard per row of the global batch; a host reads only the shards of its own
// rows, and the window of global row g at step s is a pure function of (seed,
// s, g). Any step can be produced without replaying earlier ones, the batches
// do not depend on how the rows are spread over hosts (a checkpoint restored
// on another mesh sees the same data), and the state (IteratorState) is a few
// numbers that go into every checkpoint. None of it depends on the width.
//
// Thread-safety: free functions are safe to call concurrently on different
// files; a DataIterator or TokenFileWriter is not thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace multislice::train {

inline constexpr char kTokenFileMagic[] = "MSTOKENS";        // 8 bytes on disk
inline constexpr uint32_t kTokenFileFormatVersion = 2;       // what is written
inline constexpr uint32_t kTokenFileFormatVersionBytes = 1;  // still read
inline constexpr int kTokenFileHeaderBytes = 40;
inline constexpr uint32_t kByteVocabSize = 256;
inline constexpr uint32_t kMaxTokenVocabSize = 0x7fffffffu;  // int32 ids
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

// The token width the writer uses for a vocabulary of `vocab_size`
// (1 to kMaxTokenVocabSize): 1 up to 256, 2 up to 65536, else 4.
uint32_t TokenWidthFor(uint32_t vocab_size);

struct TokenFileHeader {
  uint32_t format_version = kTokenFileFormatVersion;
  uint32_t vocab_size = kByteVocabSize;
  uint32_t token_width_bytes = 1;
  uint64_t token_count = 0;
  uint64_t payload_checksum = 0;
};

// A file written under "<path>.tmp.<pid>" and renamed over `path` by
// Commit, so `path` is the old file or the whole new one; the temporary
// file is removed if the object goes away uncommitted. Errors are Internal,
// naming the file and strerror(errno).
class StagedFile {
 public:
  static Result<StagedFile> Create(const std::string& path);
  StagedFile(StagedFile&& other) noexcept;
  StagedFile& operator=(StagedFile&& other) noexcept;
  ~StagedFile();

  Status Write(const void* data, size_t size);
  Status WriteAt(uint64_t offset, const void* data, size_t size);
  // fsync and close; Commit calls it if it was not called.
  Status Close();
  // Renames the temporary file over the path. The rename becomes durable
  // with SyncDirectory of the path's directory (once for several files).
  Status Commit();

  const std::string& path() const { return path_; }

 private:
  StagedFile() = default;
  void Discard();  // closes and removes an uncommitted temporary file
  std::string path_, temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// fsyncs a directory, making the renames in it durable.
Status SyncDirectory(const std::string& dir);

// Streams tokens into a token file: Append as often as needed, then Commit.
// Nothing is visible at `path` before Commit.
class TokenFileWriter {
 public:
  // InvalidArgument for a vocabulary outside [1, kMaxTokenVocabSize].
  static Result<TokenFileWriter> Create(const std::string& path,
                                        uint32_t vocab_size);
  // InvalidArgument naming a token outside [0, vocab_size).
  Status Append(const int32_t* tokens, size_t count);
  // Writes the header, fsyncs and renames over the path (see StagedFile).
  Status Commit();
  // Flushes, writes the header and fsyncs without the rename (Commit then
  // only renames): to prepare several files before committing any.
  Status Finish();

  uint64_t token_count() const { return count_; }

 private:
  TokenFileWriter(StagedFile file, uint32_t vocab_size);
  Status Flush();

  StagedFile file_;
  uint32_t vocab_size_ = 0;
  uint32_t width_ = 1;
  uint64_t count_ = 0;
  uint64_t checksum_ = kFnv1a64Offset;
  std::vector<uint8_t> buffer_;
  bool finished_ = false;
};

// Writes `tokens` (each in [0, vocab_size)) to `path` atomically, in the
// width TokenWidthFor(vocab_size).
Status WriteTokenFile(const std::string& path,
                      const std::vector<int32_t>& tokens, uint32_t vocab_size);
// Byte-level tokens (vocabulary 256, width 1).
Status WriteTokenFile(const std::string& path,
                      const std::vector<uint8_t>& tokens);

// Reads and checks the header: magic, version, token width, vocabulary and
// that the file size matches the token count. Does not read the payload, so
// the checksum is not verified (see VerifyTokenFile). NotFound if the file
// cannot be opened, InvalidArgument with one sentence naming the file and
// the fault otherwise.
Result<TokenFileHeader> ReadTokenFileHeader(const std::string& path);

// Reads the whole file, checking the header, the payload checksum and that
// every token is inside the vocabulary.
Result<std::vector<int32_t>> ReadTokenFile(const std::string& path);

// ReadTokenFile without keeping the tokens.
Status VerifyTokenFile(const std::string& path);

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
  // below 1, a row shard shorter than seq_len + 1 tokens), a bad token file
  // header or a token of the shard outside the header's vocabulary; NotFound
  // if the file is missing.
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
  int64_t shard_tokens() const { return shard_tokens_; }
  // The token file's vocabulary (every token is below it).
  uint32_t vocab_size() const { return vocab_size_; }

 private:
  DataIterator() = default;
  int32_t TokenAt(int64_t index) const;  // index into the whole file

  DataIteratorOptions options_;
  int64_t total_tokens_ = 0;
  int64_t shard_begin_ = 0;
  int64_t shard_tokens_ = 0;
  uint32_t width_ = 1;
  uint32_t vocab_size_ = kByteVocabSize;
  std::vector<uint8_t> shard_;  // the shard's payload bytes
  int64_t step_ = 0;
};

}  // namespace multislice::train
