// The byte-level and SentencePiece tokenizers and SentencePiece training:
// see tokenizer.h. Only this file includes the library's headers.
#include "train/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>

namespace multislice::train {
namespace {

// The trainer's thread count: a constant, so that the model does not depend
// on the machine (see TrainSentencePiece).
constexpr int kTrainerThreads = 4;

Status RangeError(int32_t id, size_t index, int vocab_size) {
  return InvalidArgument("token id " + std::to_string(id) + " at position " +
                         std::to_string(index) +
                         " is outside the tokenizer's vocabulary [0, " +
                         std::to_string(vocab_size) + ")");
}

Status CheckIds(const std::vector<int32_t>& ids, int vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return RangeError(ids[i], i, vocab_size);
    }
  }
  return OkStatus();
}

class ByteTokenizer : public Tokenizer {
 public:
  std::string type() const override { return kByteTokenizerType; }
  Result<std::vector<int32_t>> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  Result<std::string> Decode(const std::vector<int32_t>& ids) const override {
    RETURN_IF_ERROR(CheckIds(ids, 256));
    std::string text;
    text.reserve(ids.size());
    for (int32_t id : ids) text.push_back(static_cast<char>(id));
    return text;
  }
  int vocab_size() const override { return 256; }
  int bos_id() const override { return -1; }
  int eos_id() const override { return -1; }
  int pad_id() const override { return -1; }
  int unk_id() const override { return -1; }
};

// Adapts TrainingLines to the library's pull interface; keeps the first
// error of `lines` so that the caller reports it as it is.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(TrainingLines& lines) : lines_(lines) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    Result<bool> more = lines_.Next(&line_);
    if (!more.ok()) error_ = more.status();
    done_ = !more.ok() || !*more;
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override {
    if (error_.ok()) return sentencepiece::util::Status();
    return sentencepiece::util::Status(
        sentencepiece::util::StatusCode::kInternal, error_.message());
  }
  const Status& error() const { return error_; }

 private:
  TrainingLines& lines_;
  std::string line_;
  bool done_ = false;
  Status error_;
};

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() {
  return std::make_unique<ByteTokenizer>();
}

TextStream::TextStream(const Tokenizer& tokenizer,
                       std::vector<int32_t> prompt_ids)
    : tokenizer_(tokenizer), ids_(std::move(prompt_ids)) {
  auto prompt = tokenizer_.Decode(ids_);
  if (prompt.ok()) prompt_text_ = *prompt;
}

Result<std::string> TextStream::Continuation() const {
  ASSIGN_OR_RETURN(std::string whole, tokenizer_.Decode(ids_));
  if (whole.rfind(prompt_text_, 0) == 0) {
    return whole.substr(prompt_text_.size());
  }
  return tokenizer_.Decode(generated_);
}

Result<std::string> TextStream::Push(int32_t id) {
  ids_.push_back(id);
  generated_.push_back(id);
  ASSIGN_OR_RETURN(std::string text, Continuation());
  if (tokenizer_.type() != kByteTokenizerType) {
    static constexpr std::string_view kReplacement = "\xef\xbf\xbd";
    while (text.size() >= kReplacement.size() &&
           text.compare(text.size() - kReplacement.size(), kReplacement.size(),
                        kReplacement) == 0) {
      text.resize(text.size() - kReplacement.size());
    }
  }
  if (text.rfind(printed_, 0) != 0) return std::string();
  std::string fresh = text.substr(printed_.size());
  printed_ = std::move(text);
  return fresh;
}

Result<std::string> TextStream::Finish() {
  ASSIGN_OR_RETURN(text_, Continuation());
  if (text_.rfind(printed_, 0) != 0) return std::string();
  std::string rest = text_.substr(printed_.size());
  printed_ = text_;
  return rest;
}

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Impl> impl,
                                               std::string serialized)
    : impl_(std::move(impl)), serialized_(std::move(serialized)) {}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

Result<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return InvalidArgument(path + ": cannot read the SentencePiece model (" +
                           std::strerror(errno) + ")");
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) {
    return InvalidArgument(path +
                           ": cannot read the SentencePiece model (read "
                           "failed)");
  }
  return FromSerialized(bytes.str(), path);
}

Result<std::unique_ptr<SentencePieceTokenizer>>
SentencePieceTokenizer::FromSerialized(std::string model,
                                       const std::string& what) {
  if (model.empty()) {
    return InvalidArgument(what + " is empty, not a SentencePiece model");
  }
  auto impl = std::make_unique<Impl>();
  // The library's own message is a source location and the failed
  // expression: the sentence names the file and the fault instead.
  if (!impl->processor.LoadFromSerializedProto(model).ok() ||
      impl->processor.GetPieceSize() <= 0) {
    return InvalidArgument(what +
                           " is not a SentencePiece model (it does not parse "
                           "as a ModelProto with pieces)");
  }
  return std::unique_ptr<SentencePieceTokenizer>(
      new SentencePieceTokenizer(std::move(impl), std::move(model)));
}

Result<std::vector<int32_t>> SentencePieceTokenizer::Encode(
    std::string_view text) const {
  std::vector<int> ids;
  const sentencepiece::util::Status s = impl_->processor.Encode(text, &ids);
  if (!s.ok()) {
    return Internal("SentencePiece cannot encode the text: " +
                    std::string(s.message()));
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
}

Result<std::string> SentencePieceTokenizer::Decode(
    const std::vector<int32_t>& ids) const {
  RETURN_IF_ERROR(CheckIds(ids, vocab_size()));
  std::string text;
  const sentencepiece::util::Status s =
      impl_->processor.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!s.ok()) {
    return Internal("SentencePiece cannot decode the ids: " +
                    std::string(s.message()));
  }
  return text;
}

int SentencePieceTokenizer::vocab_size() const {
  return impl_->processor.GetPieceSize();
}
int SentencePieceTokenizer::bos_id() const { return impl_->processor.bos_id(); }
int SentencePieceTokenizer::eos_id() const { return impl_->processor.eos_id(); }
int SentencePieceTokenizer::pad_id() const { return impl_->processor.pad_id(); }
int SentencePieceTokenizer::unk_id() const { return impl_->processor.unk_id(); }

Result<std::string> TrainSentencePiece(
    const SentencePieceTrainingOptions& options, TrainingLines& lines) {
  if (options.vocab_size < kMinSentencePieceVocab) {
    return InvalidArgument(
        "--train_tokenizer: vocabulary size " +
        std::to_string(options.vocab_size) + " is below " +
        std::to_string(kMinSentencePieceVocab) +
        " (the 256 byte pieces, unk, bos, eos and the corpus's characters)");
  }
  if (options.input_sentence_size < 1) {
    return InvalidArgument("tokenizer training: input_sentence_size " +
                           std::to_string(options.input_sentence_size) +
                           " is not at least 1");
  }
  const std::unordered_map<std::string, std::string> settings = {
      {"vocab_size", std::to_string(options.vocab_size)},
      {"model_type", "unigram"},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"input_sentence_size", std::to_string(options.input_sentence_size)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(kTrainerThreads)},
      {"minloglevel", "2"},  // the library's progress logs, not errors
  };
  // The reservoir sample of a corpus above input_sentence_size lines draws
  // from this seed (the library's default is std::random_device; 2^32 - 1
  // is reserved for that).
  sentencepiece::SetRandomGeneratorSeed(
      options.seed == 0xffffffffu ? 0u : options.seed);
  LineIterator iterator(lines);
  std::string model;
  const sentencepiece::util::Status s =
      sentencepiece::SentencePieceTrainer::Train(settings, &iterator, &model);
  if (!iterator.error().ok()) return iterator.error();
  if (!s.ok()) {
    // The library's messages start with its source location and the failed
    // check ("./src/trainer_interface.cc(660) [...] Vocabulary size too
    // high (600). Please set it to a value <= 340."): the reason follows.
    std::string reason = s.message();
    if (const size_t end = reason.find("] ");
        reason.rfind("./", 0) == 0 && end != std::string::npos) {
      reason = reason.substr(end + 2);
    }
    return InvalidArgument("--train_tokenizer: SentencePiece cannot train a " +
                           std::to_string(options.vocab_size) +
                           "-piece model on this corpus: " + reason);
  }
  return model;
}

}  // namespace multislice::train
