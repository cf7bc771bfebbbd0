// `multislice data prepare`: text files to byte-level token files (see
// train/data.h for the format and the split rule).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "train/data.h"

namespace multislice::cli {
namespace {

struct DataPrepareFlags {
  std::vector<std::string> inputs;
  std::string output;
  std::string validation_fraction = "0.05";
  int seed = 0;
  bool json = false;
};

int RunDataPrepare(const DataPrepareFlags& flags) {
  const char* kName = "multislice data prepare";
  const std::string& text = flags.validation_fraction;
  char* end = nullptr;
  errno = 0;
  const double fraction = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 ||
      !std::isfinite(fraction) || fraction < 0.0 || fraction >= 1.0) {
    std::fprintf(stderr,
                 "%s: --validation_fraction: '%s' is not a number in [0, "
                 "1)\n",
                 kName, text.c_str());
    return 2;
  }
  if (flags.seed < 0) {
    std::fprintf(stderr, "%s: --seed: expected at least 0, got %d\n", kName,
                 flags.seed);
    return 2;
  }
  std::vector<std::string> inputs = flags.inputs;
  if (inputs.empty()) inputs.push_back(train::kDefaultCorpus);

  train::PrepareStats stats;
  Status s = train::PrepareDataset(inputs, flags.output, fraction,
                                   static_cast<uint64_t>(flags.seed), &stats);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", kName, s.message().c_str());
    return ExitCodeFor(s);
  }
  if (flags.json) {
    nlohmann::json out = {
        {"output", flags.output},
        {"files", stats.files},
        {"skipped_files", stats.skipped_files},
        {"documents", stats.documents},
        {"train_documents", stats.train_documents},
        {"val_documents", stats.val_documents},
        {"train_tokens", stats.train_tokens},
        {"val_tokens", stats.val_tokens},
    };
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf(
      "read %d text files (%d skipped): %lld documents\n"
      "train: %lld documents, %lld tokens -> %s/train.bin\n"
      "val:   %lld documents, %lld tokens -> %s/val.bin\n"
      "metadata -> %s/dataset.json\n",
      stats.files, stats.skipped_files, static_cast<long long>(stats.documents),
      static_cast<long long>(stats.train_documents),
      static_cast<long long>(stats.train_tokens), flags.output.c_str(),
      static_cast<long long>(stats.val_documents),
      static_cast<long long>(stats.val_tokens), flags.output.c_str(),
      flags.output.c_str());
  return 0;
}

}  // namespace

void AddDataCommand(CLI::App& root, CommandTable& table) {
  CLI::App* data = root.add_subcommand("data", "Training data tools.");
  data->require_subcommand(1);
  CLI::App* prepare = data->add_subcommand(
      "prepare",
      "Turns text files into byte-level token files (vocabulary 256): "
      "DIR/train.bin, DIR/val.bin and DIR/dataset.json. Files are split "
      "into documents at lines holding only '%' (the fortune format); a "
      "deterministic fraction of documents, chosen by a hash of the seed "
      "and the document index, is held out for validation.\n"
      "Example:\n"
      "  multislice data prepare --input /usr/share/games/fortunes "
      "--output runs/data");
  auto flags = std::make_shared<DataPrepareFlags>();
  prepare->add_option(FlagNames("input"), flags->inputs,
                      std::string("Text file or directory; repeat for more "
                                  "(default ") +
                          train::kDefaultCorpus + ").");
  AddStringFlag(prepare, "output", &flags->output,
                "Directory for train.bin, val.bin and dataset.json.")
      ->required();
  AddStringFlag(prepare, "validation_fraction", &flags->validation_fraction,
                "Fraction of documents held out, in [0, 1).");
  AddIntFlag(prepare, "seed", &flags->seed, "Seed of the validation split.")
      ->capture_default_str();
  AddBoolFlag(prepare, "json", &flags->json,
              "Print the counts as one JSON object.");
  table[prepare] = [flags] { return RunDataPrepare(*flags); };
}

}  // namespace multislice::cli
