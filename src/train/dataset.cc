// PrepareDataset and dataset.json: see dataset.h.
//
// Two passes over the corpus when a tokenizer is trained (the training
// split's lines into the SentencePiece trainer, then the tokenization), one
// otherwise; each pass streams documents, so memory holds one document, the
// writers' buffers and the trainer's sample.
#include "train/dataset.h"

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

namespace multislice::train {
namespace {

namespace fs = std::filesystem;

bool IsValidation(uint64_t seed, int64_t document_index, double fraction) {
  uint64_t h =
      SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(document_index)));
  // The top 53 bits as a double in [0, 1).
  double u = static_cast<double>(h >> 11) * 0x1.0p-53;
  return u < fraction;
}

Status NoTrainingDocuments() {
  return InvalidArgument(
      "--input: no training documents found in the inputs (expected "
      "non-empty UTF-8 text, JSON Lines or TFRecord documents)");
}

void Report(const PrepareOptions& options, const char* phase,
            const Corpus& corpus) {
  if (!options.progress) return;
  options.progress(PrepareProgress{phase, corpus.documents(),
                                   corpus.bytes_read(), corpus.total_bytes()});
}

// The directories of `path` that do not exist yet, created; on failure the
// ones created are removed again if still empty (another process may have
// filled them).
class CreatedDirectories {
 public:
  Status Create(const fs::path& path) {
    std::vector<fs::path> missing;
    std::error_code ec;
    for (fs::path p = path; !p.empty() && !fs::exists(p, ec);
         p = p.parent_path()) {
      missing.push_back(p);
      if (p == p.parent_path()) break;
    }
    fs::create_directories(path, ec);
    if (ec) {
      return Internal(path.string() +
                      ": cannot create directory: " + ec.message());
    }
    created_ = std::move(missing);  // deepest first
    return OkStatus();
  }
  void Keep() { created_.clear(); }
  ~CreatedDirectories() {
    std::error_code ec;
    for (const fs::path& p : created_) fs::remove(p, ec);  // only if empty
  }

 private:
  std::vector<fs::path> created_;
};

// The training split's non-empty lines, in corpus order: what the
// SentencePiece trainer learns from (a document's newlines become byte
// pieces, see TrainSentencePiece).
class CorpusTrainingLines : public TrainingLines {
 public:
  CorpusTrainingLines(std::unique_ptr<Corpus> corpus,
                      const PrepareOptions& options)
      : corpus_(std::move(corpus)), options_(options) {}

  Result<bool> Next(std::string* line) override {
    for (;;) {
      while (pos_ < document_.size()) {
        size_t end = document_.find('\n', pos_);
        if (end == std::string::npos) end = document_.size();
        line->assign(document_, pos_, end - pos_);
        pos_ = end + 1;
        if (!line->empty()) return true;
      }
      ASSIGN_OR_RETURN(bool more, corpus_->Next(&document_));
      pos_ = 0;
      if (!more) {
        if (train_documents_ == 0) return NoTrainingDocuments();
        // The library fits the pieces to its sample from here on.
        Report(options_, "training the tokenizer (fitting the pieces)",
               *corpus_);
        return false;
      }
      Report(options_, "training the tokenizer", *corpus_);
      if (IsValidation(options_.seed, index_++, options_.validation_fraction)) {
        document_.clear();
        continue;
      }
      ++train_documents_;
    }
  }

 private:
  std::unique_ptr<Corpus> corpus_;
  const PrepareOptions& options_;
  std::string document_;
  size_t pos_ = 0;
  int64_t index_ = 0;
  int64_t train_documents_ = 0;
};

Status ValidateOptions(const PrepareOptions& o) {
  if (!(o.validation_fraction >= 0.0 && o.validation_fraction < 1.0)) {
    return InvalidArgument(
        "--validation_fraction: " + std::to_string(o.validation_fraction) +
        " is not in [0, 1)");
  }
  if (!o.tokenizer_path.empty() && o.train_tokenizer_vocab != 0) {
    return InvalidArgument(
        "--tokenizer and --train_tokenizer: give one of them (a model to use, "
        "or a vocabulary size to train one), not both");
  }
  if (o.train_tokenizer_vocab < 0) {
    return InvalidArgument("--train_tokenizer: vocabulary size " +
                           std::to_string(o.train_tokenizer_vocab) +
                           " is not positive");
  }
  if (o.text_field.empty()) {
    return InvalidArgument("--text_field: expected a field name, got ''");
  }
  if (o.output_dir.empty()) {
    return InvalidArgument("--output: expected a directory, got ''");
  }
  return OkStatus();
}

CorpusOptions CorpusOptionsOf(const PrepareOptions& o) {
  return CorpusOptions{o.inputs, o.text_field};
}

// The tokenizer the options name: loaded, trained on the corpus's training
// split, or byte-level. *source says which for dataset.json.
Result<std::unique_ptr<Tokenizer>> ResolveTokenizer(const PrepareOptions& o,
                                                    std::string* source) {
  if (!o.tokenizer_path.empty()) {
    *source = o.tokenizer_path;
    auto loaded = SentencePieceTokenizer::Load(o.tokenizer_path);
    if (!loaded.ok()) {
      return InvalidArgument("--tokenizer: " + loaded.status().message());
    }
    return std::unique_ptr<Tokenizer>(std::move(*loaded));
  }
  if (o.train_tokenizer_vocab == 0) {
    *source = "";
    return MakeByteTokenizer();
  }
  *source = "trained";
  ASSIGN_OR_RETURN(std::unique_ptr<Corpus> corpus,
                   Corpus::Open(CorpusOptionsOf(o)));
  CorpusTrainingLines lines(std::move(corpus), o);
  SentencePieceTrainingOptions training;
  training.vocab_size = o.train_tokenizer_vocab;
  training.input_sentence_size = o.tokenizer_sentence_sample;
  training.seed = static_cast<uint32_t>(o.seed);
  ASSIGN_OR_RETURN(std::string model, TrainSentencePiece(training, lines));
  ASSIGN_OR_RETURN(auto trained, SentencePieceTokenizer::FromSerialized(
                                     std::move(model), "the trained model"));
  return std::unique_ptr<Tokenizer>(std::move(trained));
}

// A document's tokens as the dataset stores them (see PrepareOptions).
Result<std::vector<int32_t>> DocumentTokens(const Tokenizer& tokenizer,
                                            const PrepareOptions& o,
                                            std::string text) {
  if (tokenizer.type() == kByteTokenizerType) {
    if (text.back() != '\n') text.push_back('\n');
    text += "%\n";
    return tokenizer.Encode(text);
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(text));
  std::vector<int32_t> tokens;
  tokens.reserve(ids.size() + 2);
  if (o.add_bos && tokenizer.bos_id() >= 0) {
    tokens.push_back(tokenizer.bos_id());
  }
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  if (o.add_eos && tokenizer.eos_id() >= 0) {
    tokens.push_back(tokenizer.eos_id());
  }
  return tokens;
}

// The second pass: every document into its split's writer; per-file counts
// into `sources`.
Status TokenizeCorpus(const PrepareOptions& o, const Tokenizer& tokenizer,
                      TokenFileWriter& train, TokenFileWriter& val,
                      PrepareStats& stats, nlohmann::json& sources) {
  ASSIGN_OR_RETURN(std::unique_ptr<Corpus> corpus,
                   Corpus::Open(CorpusOptionsOf(o)));
  Report(o, "tokenizing", *corpus);
  std::vector<int64_t> file_tokens(corpus->files().size(), 0);
  std::string text;
  for (int64_t index = 0;; ++index) {
    ASSIGN_OR_RETURN(bool more, corpus->Next(&text));
    if (!more) break;
    ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                     DocumentTokens(tokenizer, o, std::move(text)));
    const bool is_val = IsValidation(o.seed, index, o.validation_fraction);
    RETURN_IF_ERROR(
        (is_val ? val : train).Append(tokens.data(), tokens.size()));
    ++(is_val ? stats.val_documents : stats.train_documents);
    file_tokens[static_cast<size_t>(corpus->file_index())] +=
        static_cast<int64_t>(tokens.size());
    Report(o, "tokenizing", *corpus);
  }
  for (size_t i = 0; i < corpus->files().size(); ++i) {
    const CorpusFile& f = corpus->files()[i];
    if (f.skipped) continue;
    sources.push_back({{"path", f.path},
                       {"format", CorpusFormatName(f.format)},
                       {"documents", f.documents},
                       {"tokens", file_tokens[i]}});
  }
  stats.files = corpus->files_read();
  stats.skipped_files = corpus->skipped_files();
  stats.documents = corpus->documents();
  stats.bytes_read = static_cast<int64_t>(corpus->bytes_read());
  stats.train_tokens = static_cast<int64_t>(train.token_count());
  stats.val_tokens = static_cast<int64_t>(val.token_count());
  if (stats.train_documents == 0) return NoTrainingDocuments();
  return OkStatus();
}

nlohmann::json TokenizerJson(const Tokenizer& t, const PrepareOptions& o,
                             const std::string& checksum,
                             const std::string& source) {
  const bool bytes = t.type() == kByteTokenizerType;
  nlohmann::json j = {{"type", t.type()},
                      {"vocab_size", t.vocab_size()},
                      {"bos_id", t.bos_id()},
                      {"eos_id", t.eos_id()},
                      {"pad_id", t.pad_id()},
                      {"unk_id", t.unk_id()},
                      {"add_bos", !bytes && o.add_bos && t.bos_id() >= 0},
                      {"add_eos", !bytes && o.add_eos && t.eos_id() >= 0}};
  if (!bytes) {
    j["model"] = kDatasetTokenizerFile;
    j["checksum"] = checksum;
    j["source"] = source;
  }
  return j;
}

std::string SplitRule(const Tokenizer& t) {
  const std::string split =
      "document i (from 0, in input order) is validation when "
      "splitmix64(seed ^ splitmix64(i)) >> 11 < validation_fraction * 2^53; ";
  if (t.type() == kByteTokenizerType) {
    return split +
           "each document is stored as its bytes, a newline if it does not "
           "end in one, and \"%\\n\"";
  }
  return split +
         "each document is stored as [bos] (add_bos), its SentencePiece ids "
         "and [eos] (add_eos)";
}

nlohmann::json DatasetJson(const PrepareOptions& o, const Tokenizer& t,
                           const std::string& checksum,
                           const std::string& source, const PrepareStats& s,
                           nlohmann::json sources) {
  const auto vocab = static_cast<uint32_t>(t.vocab_size());
  return {
      {"format_version", kDatasetFormatVersion},
      {"tokenizer", TokenizerJson(t, o, checksum, source)},
      {"vocab_size", vocab},
      {"token_width_bytes", TokenWidthFor(vocab)},
      {"token_file_format_version", kTokenFileFormatVersion},
      {"seed", o.seed},
      {"validation_fraction", o.validation_fraction},
      {"text_field", o.text_field},
      {"split_rule", SplitRule(t)},
      {"files", s.files},
      {"skipped_files", s.skipped_files},
      {"documents", s.documents},
      {"train",
       {{"file", "train.bin"},
        {"documents", s.train_documents},
        {"tokens", s.train_tokens}}},
      {"val",
       {{"file", "val.bin"},
        {"documents", s.val_documents},
        {"tokens", s.val_tokens}}},
      {"sources", std::move(sources)},
  };
}

Result<StagedFile> StageContents(const std::string& path,
                                 const std::string& contents) {
  ASSIGN_OR_RETURN(StagedFile file, StagedFile::Create(path));
  RETURN_IF_ERROR(file.Write(contents.data(), contents.size()));
  RETURN_IF_ERROR(file.Close());
  return file;
}

}  // namespace

std::string TokenizerChecksum(std::string_view model_bytes) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64,
                Fnv1a64(model_bytes.data(), model_bytes.size()));
  return std::string("fnv1a64:") + hex;
}

std::string DefaultDatasetDirectory(const std::string& base_output_directory,
                                    const std::string& tokenizer_checksum) {
  std::string name = "fortunes";
  if (!tokenizer_checksum.empty()) {
    const size_t colon = tokenizer_checksum.find(':');
    name += "-" + tokenizer_checksum.substr(colon + 1, 12);
  }
  return (fs::path(base_output_directory) / "datasets" / name).string();
}

bool DatasetIsComplete(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  return fs::exists(d / "dataset.json", ec) &&
         fs::exists(d / "train.bin", ec) && fs::exists(d / "val.bin", ec);
}

Status PrepareDataset(const PrepareOptions& o, PrepareStats* stats) {
  RETURN_IF_ERROR(ValidateOptions(o));
  // Missing inputs are reported before a tokenizer is trained on the rest.
  RETURN_IF_ERROR(Corpus::Open(CorpusOptionsOf(o)).status());
  std::string source;
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                   ResolveTokenizer(o, &source));
  const auto* sentencepiece =
      dynamic_cast<const SentencePieceTokenizer*>(tokenizer.get());
  const std::string checksum =
      sentencepiece ? TokenizerChecksum(sentencepiece->serialized()) : "";

  const fs::path dir(o.output_dir);
  CreatedDirectories created;
  RETURN_IF_ERROR(created.Create(dir));
  const auto vocab = static_cast<uint32_t>(tokenizer->vocab_size());
  ASSIGN_OR_RETURN(TokenFileWriter train,
                   TokenFileWriter::Create((dir / "train.bin"), vocab));
  ASSIGN_OR_RETURN(TokenFileWriter val,
                   TokenFileWriter::Create((dir / "val.bin"), vocab));
  PrepareStats local;
  nlohmann::json sources = nlohmann::json::array();
  RETURN_IF_ERROR(TokenizeCorpus(o, *tokenizer, train, val, local, sources));
  local.tokenizer_type = tokenizer->type();
  local.tokenizer_checksum = checksum;
  local.vocab_size = vocab;
  local.token_width_bytes = TokenWidthFor(vocab);

  // Everything staged before anything is renamed; dataset.json last, so a
  // reader that finds it finds the rest.
  std::optional<StagedFile> model;
  if (sentencepiece) {
    ASSIGN_OR_RETURN(model,
                     StageContents((dir / kDatasetTokenizerFile).string(),
                                   sentencepiece->serialized()));
  }
  RETURN_IF_ERROR(train.Finish());
  RETURN_IF_ERROR(val.Finish());
  ASSIGN_OR_RETURN(StagedFile meta,
                   StageContents((dir / "dataset.json").string(),
                                 DatasetJson(o, *tokenizer, checksum, source,
                                             local, std::move(sources))
                                         .dump(2) +
                                     "\n"));
  if (model) RETURN_IF_ERROR(model->Commit());
  RETURN_IF_ERROR(val.Commit());
  RETURN_IF_ERROR(train.Commit());
  RETURN_IF_ERROR(meta.Commit());
  created.Keep();
  if (!sentencepiece) {
    // A SentencePiece dataset's model left from an earlier run here.
    std::error_code ec;
    fs::remove(dir / kDatasetTokenizerFile, ec);
  }
  RETURN_IF_ERROR(SyncDirectory(dir.string()));
  if (stats != nullptr) *stats = local;
  return OkStatus();
}

// ---------------------------------------------------------------------------
// Reading dataset.json

std::string DatasetInfo::tokenizer_model_path() const {
  if (byte_level()) return "";
  return (fs::path(directory) / kDatasetTokenizerFile).string();
}

namespace {

// A field of `json` (a dataset.json at `path`) of the type `T` names.
template <typename T>
Status Field(const nlohmann::json& json, const char* name,
             const std::string& path, T* out) {
  auto it = json.find(name);
  bool ok = it != json.end();
  if constexpr (std::is_same_v<T, bool>) {
    ok = ok && it->is_boolean();
  } else if constexpr (std::is_same_v<T, std::string>) {
    ok = ok && it->is_string();
  } else {
    ok = ok && it->is_number_integer();
  }
  if (!ok) {
    return InvalidArgument(path + ": field '" + name +
                           "' is missing or has the wrong type");
  }
  *out = it->get<T>();
  return OkStatus();
}

Status ReadTokenizerInfo(const nlohmann::json& t, const std::string& path,
                         DatasetInfo* info) {
  if (!t.is_object()) {
    return InvalidArgument(path + ": field 'tokenizer' is not an object");
  }
  RETURN_IF_ERROR(Field(t, "type", path, &info->tokenizer_type));
  if (info->tokenizer_type != kByteTokenizerType &&
      info->tokenizer_type != kSentencePieceTokenizerType) {
    return InvalidArgument(path + ": tokenizer type '" + info->tokenizer_type +
                           "' is not 'bytes' or 'sentencepiece'");
  }
  RETURN_IF_ERROR(Field(t, "vocab_size", path, &info->vocab_size));
  RETURN_IF_ERROR(Field(t, "bos_id", path, &info->bos_id));
  RETURN_IF_ERROR(Field(t, "eos_id", path, &info->eos_id));
  RETURN_IF_ERROR(Field(t, "add_bos", path, &info->add_bos));
  RETURN_IF_ERROR(Field(t, "add_eos", path, &info->add_eos));
  if (!info->byte_level()) {
    RETURN_IF_ERROR(Field(t, "checksum", path, &info->tokenizer_checksum));
  }
  return OkStatus();
}

}  // namespace

Result<DatasetInfo> ReadDatasetInfo(const std::string& dir) {
  const std::string path = (fs::path(dir) / "dataset.json").string();
  std::ifstream in(path);
  if (!in) return NotFound(path + " does not exist");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(path + ": not valid JSON (" + e.what() + ")");
  }
  DatasetInfo info;
  info.directory = dir;
  if (!json.is_object()) {
    return InvalidArgument(path + ": expected a JSON object");
  }
  RETURN_IF_ERROR(Field(json, "format_version", path, &info.format_version));
  if (info.format_version == 1) {
    // Byte-level only: "tokenizer": "bytes".
    RETURN_IF_ERROR(Field(json, "vocab_size", path, &info.vocab_size));
    return info;
  }
  if (info.format_version != kDatasetFormatVersion) {
    return InvalidArgument(path + ": format_version " +
                           std::to_string(info.format_version) +
                           " is not supported (this build reads 1 and " +
                           std::to_string(kDatasetFormatVersion) + ")");
  }
  auto t = json.find("tokenizer");
  if (t == json.end()) {
    return InvalidArgument(path + ": field 'tokenizer' is missing");
  }
  RETURN_IF_ERROR(ReadTokenizerInfo(*t, path, &info));
  return info;
}

Result<std::unique_ptr<Tokenizer>> LoadDatasetTokenizer(
    const DatasetInfo& info) {
  if (info.byte_level()) return MakeByteTokenizer();
  const std::string path = info.tokenizer_model_path();
  ASSIGN_OR_RETURN(auto tokenizer, SentencePieceTokenizer::Load(path));
  const std::string checksum = TokenizerChecksum(tokenizer->serialized());
  if (checksum != info.tokenizer_checksum) {
    return InvalidArgument(path + ": checksum " + checksum +
                           " differs from the " + info.tokenizer_checksum +
                           " that dataset.json records (the model was "
                           "replaced or is corrupt)");
  }
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

namespace {

// A string key of config.json, "" when absent.
std::string ConfigString(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  return it != config.end() && it->is_string() ? it->get<std::string>() : "";
}

bool ConfigBool(const nlohmann::json& config, const char* key, bool def) {
  auto it = config.find(key);
  return it != config.end() && it->is_boolean() ? it->get<bool>() : def;
}

}  // namespace

Result<RunTokenizer> FindRunTokenizer(const std::string& run_dir) {
  RunTokenizer run;
  run.tokenizer = MakeByteTokenizer();
  run.source = kByteTokenizerType;
  const std::string path = (fs::path(run_dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) return run;
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(path + ": not valid JSON (" + e.what() + ")");
  }
  const std::string tokenizer_path = ConfigString(config, "tokenizer_path");
  std::unique_ptr<SentencePieceTokenizer> named;
  std::string dir = ConfigString(config, "dataset_path");
  if (!tokenizer_path.empty()) {
    auto loaded = SentencePieceTokenizer::Load(tokenizer_path);
    if (!loaded.ok()) {
      return InvalidArgument(path +
                             ": tokenizer_path: " + loaded.status().message());
    }
    named = std::move(*loaded);
  }
  if (dir.empty()) {
    dir = DefaultDatasetDirectory(
        ConfigString(config, "base_output_directory"),
        named ? TokenizerChecksum(named->serialized()) : "");
  }
  auto info = ReadDatasetInfo(dir);
  if (info.ok()) {
    ASSIGN_OR_RETURN(run.tokenizer, LoadDatasetTokenizer(*info));
    run.add_bos = info->add_bos;
    run.add_eos = info->add_eos;
    if (!info->byte_level()) run.source = info->tokenizer_model_path();
    return run;
  }
  if (info.status().code() != StatusCode::kNotFound) return info.status();
  if (named) {
    run.tokenizer = std::move(named);
    run.add_bos = ConfigBool(config, "add_bos", true);
    run.add_eos = ConfigBool(config, "add_eos", true);
    run.source = tokenizer_path;
  }
  return run;
}

}  // namespace multislice::train
