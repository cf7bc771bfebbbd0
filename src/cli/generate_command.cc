// `multislice generate RUN_DIR --prompt TEXT`: samples tokens from the newest
// complete checkpoint of a `multislice train` run, on one device; the prompt
// is encoded and the output decoded by the run's tokenizer
// (train::FindRunTokenizer: byte-level or SentencePiece).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/flags.h"
#include "common/float_env.h"
#include "compute/matmul.h"
#include "model/decoder.h"
#include "train/checkpoint.h"
#include "train/dataset.h"
#include "train/train_state.h"

namespace multislice::cli {
namespace {

constexpr char kName[] = "multislice generate";

struct GenerateFlags {
  std::string run_dir;
  std::string prompt = "\n";
  int max_new_tokens = 200;
  std::string temperature = "0.8";
  int top_k = 40;
  int seed = 0;
  bool json = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "%s: %s\n", kName, s.message().c_str());
  return ExitCodeFor(s);
}

// Samples one token from logits[0..V) at `temperature` among the top_k most
// likely (temperature 0: the most likely).
int Sample(const float* logits, int V, double temperature, int top_k,
           std::mt19937_64& rng) {
  std::vector<int> order(V);
  for (int i = 0; i < V; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return logits[a] > logits[b]; });
  if (temperature <= 0) return order[0];
  const int k = top_k > 0 ? std::min(top_k, V) : V;
  std::vector<double> weights(k);
  for (int i = 0; i < k; ++i) {
    weights[i] = std::exp((logits[order[i]] - logits[order[0]]) / temperature);
  }
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  return order[pick(rng)];
}

// The run's tokenizer, refused when its ids do not fit the model.
Result<train::RunTokenizer> LoadRunTokenizer(const std::string& run_dir,
                                             int model_vocab_size) {
  ASSIGN_OR_RETURN(train::RunTokenizer run, train::FindRunTokenizer(run_dir));
  if (run.tokenizer->vocab_size() > model_vocab_size) {
    return InvalidArgument("the run's tokenizer (" + run.source + ") has " +
                           std::to_string(run.tokenizer->vocab_size()) +
                           " tokens but the model's vocab_size is " +
                           std::to_string(model_vocab_size));
  }
  return run;
}

// The prompt's ids: [bos] when the run's documents began with it, then the
// encoded text.
Result<std::vector<int32_t>> PromptIds(const train::RunTokenizer& run,
                                       const std::string& prompt) {
  std::vector<int32_t> ids;
  if (run.add_bos && run.tokenizer->bos_id() >= 0) {
    ids.push_back(run.tokenizer->bos_id());
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> text, run.tokenizer->Encode(prompt));
  ids.insert(ids.end(), text.begin(), text.end());
  if (ids.empty()) {
    return InvalidArgument("--prompt: '" + prompt +
                           "' encodes to no tokens with the run's tokenizer");
  }
  return ids;
}

void Print(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

int Run(const GenerateFlags& flags) {
  char* end = nullptr;
  const double temperature = std::strtod(flags.temperature.c_str(), &end);
  if (flags.temperature.empty() || *end != '\0' ||
      !std::isfinite(temperature) || temperature < 0) {
    return Fail(InvalidArgument("--temperature: '" + flags.temperature +
                                "' is not a number of at least 0"));
  }
  if (flags.max_new_tokens < 0) {
    return Fail(InvalidArgument("--max_new_tokens: expected at least 0, got " +
                                std::to_string(flags.max_new_tokens)));
  }
  if (flags.prompt.empty()) {
    return Fail(InvalidArgument("--prompt: expected at least one byte"));
  }
  if (!std::filesystem::is_directory(flags.run_dir)) {
    return Fail(InvalidArgument("RUN_DIR: '" + flags.run_dir +
                                "' is not a directory (expected "
                                "base_output_directory/run_name of a train "
                                "run)"));
  }
  CheckpointOptions options;
  options.directory = flags.run_dir + "/checkpoints";
  CheckpointManager checkpoints(options);
  std::vector<std::string> warnings;
  auto state = train::LoadLatestFullState(checkpoints, &warnings);
  for (const std::string& w : warnings) {
    std::fprintf(stderr, "%s: warning: %s\n", kName, w.c_str());
  }
  if (!state.ok()) {
    if (state.status().code() == StatusCode::kNotFound) {
      return Fail(InvalidArgument("RUN_DIR: '" + flags.run_dir +
                                  "' has no complete checkpoint in "
                                  "checkpoints/ yet"));
    }
    return Fail(state.status());
  }
  const model::DecoderConfig& config = state->model;
  compute::SetSingleThreaded();
  FlushSubnormalsInThisThread();  // as training's device threads do
  model::Decoder gpt(config, DType::kF32);
  auto run = LoadRunTokenizer(flags.run_dir, config.vocab_size);
  if (!run.ok()) return Fail(run.status());
  auto prompt_ids = PromptIds(*run, flags.prompt);
  if (!prompt_ids.ok()) return Fail(prompt_ids.status());
  std::vector<int32_t> tokens = *prompt_ids;
  train::TextStream stream(*run->tokenizer, tokens);
  // Only the tokenizer's ids are sampled (the model may have more rows).
  const int sampled_vocab = run->tokenizer->vocab_size();
  const int eos = run->add_eos ? run->tokenizer->eos_id() : -1;
  std::mt19937_64 rng(static_cast<uint64_t>(flags.seed));
  for (int i = 0; i < flags.max_new_tokens; ++i) {
    const int T =
        std::min<int>(static_cast<int>(tokens.size()), config.max_seq_len);
    const int32_t* window = tokens.data() + tokens.size() - T;
    auto forward = gpt.Forward(state->params.data(), window, nullptr, 1, T);
    if (!forward.ok()) return Fail(forward.status());
    const float* last =
        gpt.logits() +
        static_cast<size_t>(T - 1) * static_cast<size_t>(config.vocab_size);
    const int next = Sample(last, sampled_vocab, temperature, flags.top_k, rng);
    if (next == eos) break;  // the end of a document
    tokens.push_back(next);
    auto text = stream.Push(next);
    if (!text.ok()) return Fail(text.status());
    if (!flags.json) Print(*text);
  }
  auto rest = stream.Finish();
  if (!rest.ok()) return Fail(rest.status());
  if (flags.json) {
    nlohmann::json out = {
        {"run_directory", flags.run_dir},  {"step", state->step},
        {"prompt", flags.prompt},          {"generated", stream.text()},
        {"tokenizer", run->source},        {"prompt_token_ids", *prompt_ids},
        {"token_ids", stream.generated()},
    };
    std::printf("%s\n", out.dump(-1, ' ', false,
                                 nlohmann::json::error_handler_t::replace)
                            .c_str());
  } else {
    Print(*rest + "\n");
  }
  return 0;
}

}  // namespace

void AddGenerateCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "generate",
      "Sample text from the newest complete checkpoint of a train run, to "
      "see what the model learned. Prints the generated text after the "
      "prompt as it is sampled (the prompt itself is not repeated).\n"
      "The prompt is encoded and the output decoded with the run's "
      "tokenizer, found through RUN_DIR/config.json as train found its "
      "dataset: dataset_path, or with it empty the default dataset under "
      "base_output_directory/datasets/ (fortunes-<checksum> for a "
      "tokenizer_path); that dataset's dataset.json names its tokenizer, and "
      "its tokenizer.model copy is used (checked against the recorded "
      "checksum). Without a dataset.json, tokenizer_path itself, else bytes. "
      "With a SentencePiece tokenizer the prompt begins with BOS when the "
      "documents did (add_bos), and generation stops at EOS when they ended "
      "with it (add_eos). Relative paths are taken from the current "
      "directory, as train took them.\n"
      "Examples:\n"
      "  multislice generate runs/quickstart --prompt 'The meaning of life '\n"
      "  multislice generate runs/quickstart --prompt Q: --temperature 0 "
      "--max_new_tokens 80 --json");
  auto flags = std::make_shared<GenerateFlags>();
  cmd->add_option("run_dir", flags->run_dir,
                  "The run directory: base_output_directory/run_name.")
      ->required();
  AddStringFlag(cmd, "prompt", &flags->prompt, "Text to continue.");
  AddIntFlag(cmd, "max_new_tokens", &flags->max_new_tokens,
             "Tokens to generate (bytes for a byte-level run).");
  AddStringFlag(cmd, "temperature", &flags->temperature,
                "Softmax temperature; 0 picks the most likely token.");
  AddIntFlag(cmd, "top_k", &flags->top_k,
             "Sample among the k most likely tokens (0: all).");
  AddIntFlag(cmd, "seed", &flags->seed, "Seed of the sampler.");
  AddBoolFlag(cmd, "json", &flags->json,
              "Print one JSON object: the generated text, the tokenizer and "
              "the prompt's and the output's token ids.");
  table[cmd] = [flags] { return Run(*flags); };
}

}  // namespace multislice::cli
