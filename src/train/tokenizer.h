// Tokenizers: text to token ids and back, for `multislice data prepare`
// (documents to token files) and `multislice generate` (prompt in, text out).
//
// Two kinds behind one interface:
//   - byte-level: each byte of the UTF-8 text is one token (vocabulary 256,
//     no special ids); what every dataset held before SentencePiece.
//   - SentencePiece: a `.model` file (a serialized ModelProto) loaded through
//     Debian's libsentencepiece, the library MaxText's tokenizer uses.
// and the training of a SentencePiece model with the same library
// (TrainSentencePiece), deterministic for a given corpus, vocabulary size
// and seed (see there).
//
// Thread-safety: a loaded Tokenizer is immutable; Encode and Decode may be
// called concurrently. TrainSentencePiece sets the library's process-wide
// random seed: do not run two trainings at once in one process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace multislice::train {

inline constexpr char kByteTokenizerType[] = "bytes";
inline constexpr char kSentencePieceTokenizerType[] = "sentencepiece";

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // kByteTokenizerType or kSentencePieceTokenizerType.
  virtual std::string type() const = 0;
  // The ids of `text`, without bos or eos (the caller adds those).
  virtual Result<std::vector<int32_t>> Encode(std::string_view text) const = 0;
  // The text of `ids`; control ids (bos, eos, pad) decode to nothing.
  // InvalidArgument naming the first id outside [0, vocab_size()).
  virtual Result<std::string> Decode(const std::vector<int32_t>& ids) const = 0;
  // Every id is in [0, vocab_size()).
  virtual int vocab_size() const = 0;
  // The special ids, -1 where the tokenizer has none.
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  virtual int pad_id() const = 0;
  virtual int unk_id() const = 0;
};

// The byte-level tokenizer: vocabulary 256, no special ids.
std::unique_ptr<Tokenizer> MakeByteTokenizer();

// Decodes generated ids as they come, for printing text as it is sampled:
// Push returns the text that the new id completed. The continuation is
// decoded together with the prompt (SentencePiece drops a leading space at
// the start of a text) and its trailing U+FFFD characters are held back
// until the next id (a byte piece of an unfinished UTF-8 sequence decodes
// to one). Byte-level ids come out as the bytes themselves.
class TextStream {
 public:
  // `tokenizer` must outlive the stream.
  TextStream(const Tokenizer& tokenizer, std::vector<int32_t> prompt_ids);
  // The newly completed text; errors are Decode's.
  Result<std::string> Push(int32_t id);
  // What is left to print after the last Push.
  Result<std::string> Finish();
  // The generated ids so far, and their text once Finish has been called.
  const std::vector<int32_t>& generated() const { return generated_; }
  const std::string& text() const { return text_; }

 private:
  Result<std::string> Continuation() const;

  const Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;  // prompt and generated
  std::vector<int32_t> generated_;
  std::string prompt_text_;
  std::string printed_;
  std::string text_;
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Loads a SentencePiece .model file. InvalidArgument, one sentence naming
  // `path`, for a file that is missing, unreadable or not a model.
  static Result<std::unique_ptr<SentencePieceTokenizer>> Load(
      const std::string& path);
  // The same from the file's bytes; `what` names them in errors.
  static Result<std::unique_ptr<SentencePieceTokenizer>> FromSerialized(
      std::string model, const std::string& what);
  ~SentencePieceTokenizer() override;

  std::string type() const override { return kSentencePieceTokenizerType; }
  Result<std::vector<int32_t>> Encode(std::string_view text) const override;
  Result<std::string> Decode(const std::vector<int32_t>& ids) const override;
  int vocab_size() const override;
  int bos_id() const override;
  int eos_id() const override;
  int pad_id() const override;
  int unk_id() const override;

  // The model file's bytes, as loaded (what a dataset copies).
  const std::string& serialized() const { return serialized_; }

 private:
  struct Impl;
  explicit SentencePieceTokenizer(std::unique_ptr<Impl> impl,
                                  std::string serialized);
  std::unique_ptr<Impl> impl_;
  std::string serialized_;
};

// The lines TrainSentencePiece learns from, pulled one at a time so that the
// corpus is never held in memory (the library keeps its sample only).
class TrainingLines {
 public:
  virtual ~TrainingLines() = default;
  // The next line into *line (without its newline); false at the end. An
  // error ends the training with that error.
  virtual Result<bool> Next(std::string* line) = 0;
};

struct SentencePieceTrainingOptions {
  // At least kMinSentencePieceVocab: the 256 byte pieces (byte fallback, so
  // that every text round-trips), unk, bos, eos and the corpus's characters.
  int vocab_size = 8192;
  // Lines the trainer keeps: a corpus with more is sampled down to this many
  // (SentencePiece's input_sentence_size, reservoir sampling with `seed`).
  int64_t input_sentence_size = 1'000'000;
  uint32_t seed = 0;
};

inline constexpr int kMinSentencePieceVocab = 260;

// Trains a SentencePiece model (the library's SentencePieceTrainer) on
// `lines` and returns the .model file's bytes. The settings (docs/data.md):
// the unigram model (MaxText's default), character_coverage 1.0, byte_fallback,
// the identity normalizer without whitespace folding (text round-trips exactly;
// newlines become byte pieces), unk 0, bos 1, eos 2, no pad, and a fixed number
// of trainer threads: the EM sums depend on how the sentences are split over
// threads, so the thread count is a constant, not the machine's core count. The
// same lines, options and library version give the same bytes. InvalidArgument
// (one sentence, "--train_tokenizer: ...") when the library refuses the
// vocabulary for this corpus; the error of `lines` as it is.
Result<std::string> TrainSentencePiece(
    const SentencePieceTrainingOptions& options, TrainingLines& lines);

}  // namespace multislice::train
