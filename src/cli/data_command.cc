// `multislice data prepare`: a corpus (text, JSON Lines, TFRecord) into
// token files through the byte-level tokenizer, a SentencePiece model, or
// one trained on the corpus (train/dataset.h for the rules, train/data.h for
// the token file format, docs/data.md for the user's view).
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/progress.h"
#include "runtime/launcher.h"
#include "train/dataset.h"

namespace multislice::cli {
namespace {

constexpr char kName[] = "multislice data prepare";

struct DataPrepareFlags {
  std::vector<std::string> inputs;
  std::string output;
  std::string validation_fraction = "0.05";
  int seed = 0;
  std::string tokenizer;
  int train_tokenizer = 0;
  int input_sentence_size = 1'000'000;
  bool add_bos = true;
  bool add_eos = true;
  std::string text_field = "text";
  bool json = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "%s: %s\n", kName, s.message().c_str());
  return ExitCodeFor(s);
}

Result<train::PrepareOptions> OptionsOf(const DataPrepareFlags& flags) {
  const std::string& text = flags.validation_fraction;
  char* end = nullptr;
  errno = 0;
  const double fraction = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 ||
      !std::isfinite(fraction) || fraction < 0.0 || fraction >= 1.0) {
    return InvalidArgument("--validation_fraction: '" + text +
                           "' is not a number in [0, 1)");
  }
  if (flags.seed < 0) {
    return InvalidArgument("--seed: expected at least 0, got " +
                           std::to_string(flags.seed));
  }
  if (flags.input_sentence_size < 1) {
    return InvalidArgument("--input_sentence_size: expected at least 1, got " +
                           std::to_string(flags.input_sentence_size));
  }
  train::PrepareOptions o;
  o.inputs = flags.inputs;
  if (o.inputs.empty()) o.inputs.push_back(train::kDefaultCorpus);
  o.output_dir = flags.output;
  o.validation_fraction = fraction;
  o.seed = static_cast<uint64_t>(flags.seed);
  o.text_field = flags.text_field;
  o.tokenizer_path = flags.tokenizer;
  o.train_tokenizer_vocab = flags.train_tokenizer;
  o.tokenizer_sentence_sample = flags.input_sentence_size;
  o.add_bos = flags.add_bos;
  o.add_eos = flags.add_eos;
  return o;
}

std::string Megabytes(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / 1e6);
  return text;
}

// Feeds PrepareDataset's progress to a Progress line on the terminal,
// redrawn about four times a second. (Off a terminal nothing is printed
// before the result, so that a failure is its one line on stderr.)
class PrepareProgressLine {
 public:
  PrepareProgressLine()
      : progress_(Progress::Options{
            .out = stderr, .in_place = true, .prefix = "data prepare"}) {}

  void Update(const train::PrepareProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.phase == phase_ &&
        std::chrono::duration<double>(now - last_).count() < 0.25) {
      return;
    }
    const bool same_phase = p.phase == phase_;
    phase_ = p.phase;
    last_ = now;
    const double percent =
        p.total_bytes == 0 ? 100.0 : 100.0 * p.bytes_read / p.total_bytes;
    char line[160];
    std::snprintf(line, sizeof line, "%s: %lld documents, %s of %s MB (%.0f%%)",
                  p.phase.c_str(), static_cast<long long>(p.documents),
                  Megabytes(p.bytes_read).c_str(),
                  Megabytes(p.total_bytes).c_str(), percent);
    if (same_phase) {
      progress_.UpdatePhase(line);
    } else {
      progress_.Phase(line);
    }
  }
  void Stop() { progress_.Stop(); }

 private:
  Progress progress_;
  std::string phase_;
  std::chrono::steady_clock::time_point last_{};
};

void PrintResult(const DataPrepareFlags& flags,
                 const train::PrepareStats& stats) {
  const std::string model =
      stats.tokenizer_checksum.empty()
          ? std::string()
          : flags.output + "/" + train::kDatasetTokenizerFile;
  if (flags.json) {
    nlohmann::json out = {
        {"output", flags.output},
        {"files", stats.files},
        {"skipped_files", stats.skipped_files},
        {"documents", stats.documents},
        {"bytes_read", stats.bytes_read},
        {"train_documents", stats.train_documents},
        {"val_documents", stats.val_documents},
        {"train_tokens", stats.train_tokens},
        {"val_tokens", stats.val_tokens},
        {"tokenizer", stats.tokenizer_type},
        {"tokenizer_model", model},
        {"tokenizer_checksum", stats.tokenizer_checksum},
        {"vocab_size", stats.vocab_size},
        {"token_width_bytes", stats.token_width_bytes},
    };
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  std::printf("read %d files (%d skipped): %lld documents, %s MB\n",
              stats.files, stats.skipped_files,
              static_cast<long long>(stats.documents),
              Megabytes(static_cast<uint64_t>(stats.bytes_read)).c_str());
  if (model.empty()) {
    std::printf("tokenizer: bytes (vocabulary 256)\n");
  } else {
    std::printf("tokenizer: sentencepiece, vocabulary %u, %s -> %s\n",
                stats.vocab_size, stats.tokenizer_checksum.c_str(),
                model.c_str());
  }
  std::printf(
      "train: %lld documents, %lld tokens (%u bytes each) -> %s/train.bin\n"
      "val:   %lld documents, %lld tokens -> %s/val.bin\n"
      "metadata -> %s/dataset.json\n",
      static_cast<long long>(stats.train_documents),
      static_cast<long long>(stats.train_tokens), stats.token_width_bytes,
      flags.output.c_str(), static_cast<long long>(stats.val_documents),
      static_cast<long long>(stats.val_tokens), flags.output.c_str(),
      flags.output.c_str());
}

int RunDataPrepare(const DataPrepareFlags& flags) {
  auto options = OptionsOf(flags);
  if (!options.ok()) return Fail(options.status());
  std::optional<PrepareProgressLine> line;
  if (!flags.json && runtime::ShowProgress()) {
    line.emplace();
    options->progress = [&line](const train::PrepareProgress& p) {
      line->Update(p);
    };
  }
  train::PrepareStats stats;
  Status s = train::PrepareDataset(*options, &stats);
  if (line) line->Stop();
  if (!s.ok()) return Fail(s);
  PrintResult(flags, stats);
  return 0;
}

}  // namespace

void AddDataCommand(CLI::App& root, CommandTable& table) {
  CLI::App* data = root.add_subcommand("data", "Training data tools.");
  data->require_subcommand(1);
  CLI::App* prepare = data->add_subcommand(
      "prepare",
      "Turns a corpus into token files: DIR/train.bin, DIR/val.bin and "
      "DIR/dataset.json (and DIR/tokenizer.model with a SentencePiece "
      "tokenizer). Inputs are files or directories: *.jsonl and *.json are "
      "JSON Lines (one object per line, its --text_field string is the "
      "document), *.tfrecord and *.tfrecords are TFRecord files of "
      "tf.train.Example records (the --text_field bytes feature), anything "
      "else is UTF-8 text split into documents at lines holding only '%' "
      "(the fortune format). Tokens are bytes (vocabulary 256) unless "
      "--tokenizer names a SentencePiece model or --train_tokenizer trains "
      "one on the training split. A deterministic fraction of documents, "
      "chosen by a hash of the seed and the document index, is held out for "
      "validation. A malformed record is one sentence naming the file and "
      "the line or byte offset (exit 2), and nothing is written unless "
      "everything succeeds. See docs/data.md.\n"
      "Examples:\n"
      "  multislice data prepare --output runs/datasets/fortunes\n"
      "  multislice data prepare --train_tokenizer 8192 --output "
      "runs/datasets/fortunes-sp8k\n"
      "  multislice data prepare --input corpus.jsonl --text_field body "
      "--tokenizer tokenizer.model --output runs/datasets/mine\n"
      "  multislice data prepare --input shards/ --add_eos=false --tokenizer "
      "t.model --output ds --json");
  auto flags = std::make_shared<DataPrepareFlags>();
  prepare->add_option(FlagNames("input"), flags->inputs,
                      std::string("File or directory; repeat for more "
                                  "(default ") +
                          train::kDefaultCorpus + ").");
  AddStringFlag(prepare, "output", &flags->output,
                "Directory for the token files and dataset.json.")
      ->required();
  AddStringFlag(prepare, "validation_fraction", &flags->validation_fraction,
                "Fraction of documents held out, in [0, 1).");
  AddIntFlag(prepare, "seed", &flags->seed,
             "Seed of the validation split and of the tokenizer training's "
             "sample.")
      ->capture_default_str();
  AddStringFlag(prepare, "tokenizer", &flags->tokenizer,
                "A SentencePiece .model file to tokenize with (copied into "
                "the output as tokenizer.model).");
  AddIntFlag(prepare, "train_tokenizer", &flags->train_tokenizer,
             "Train a SentencePiece model of this many pieces on the "
             "training split, write it as tokenizer.model and tokenize with "
             "it (0: no).")
      ->type_name("VOCAB");
  AddIntFlag(prepare, "input_sentence_size", &flags->input_sentence_size,
             "Lines the tokenizer training keeps; a larger corpus is sampled "
             "down to this many (SentencePiece's input_sentence_size).")
      ->capture_default_str();
  const std::string group = prepare->option_defaults()->get_group();
  AddBoolAlias(prepare, "add_bos", &flags->add_bos)
      ->group(group)
      ->description(
          "SentencePiece: begin each document with the BOS token "
          "(true or false; default true, as MaxText's add_bos).");
  AddBoolAlias(prepare, "add_eos", &flags->add_eos)
      ->group(group)
      ->description(
          "SentencePiece: end each document with the EOS token "
          "(true or false; default true, as MaxText's add_eos).");
  AddStringFlag(prepare, "text_field", &flags->text_field,
                "The text of a JSON Lines object or a TFRecord Example (as "
                "MaxText's train_data_columns).");
  AddBoolFlag(prepare, "json", &flags->json,
              "No progress line; print the counts as one JSON object.");
  table[prepare] = [flags] { return RunDataPrepare(*flags); };
}

}  // namespace multislice::cli
