// `multislice generate RUN_DIR --prompt TEXT`: samples bytes from the newest
// complete checkpoint of a `multislice train` run, on one device.
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
  std::vector<int32_t> tokens;
  for (unsigned char c : flags.prompt) tokens.push_back(c);
  std::mt19937_64 rng(static_cast<uint64_t>(flags.seed));
  std::string generated;
  for (int i = 0; i < flags.max_new_tokens; ++i) {
    const int T =
        std::min<int>(static_cast<int>(tokens.size()), config.max_seq_len);
    const int32_t* window = tokens.data() + tokens.size() - T;
    auto forward = gpt.Forward(state->params.data(), window, nullptr, 1, T);
    if (!forward.ok()) return Fail(forward.status());
    const float* last =
        gpt.logits() +
        static_cast<size_t>(T - 1) * static_cast<size_t>(config.vocab_size);
    const int next =
        Sample(last, config.vocab_size, temperature, flags.top_k, rng);
    tokens.push_back(next);
    generated.push_back(static_cast<char>(next));
    if (!flags.json) {
      std::fputc(next, stdout);
      std::fflush(stdout);
    }
  }
  if (flags.json) {
    nlohmann::json out = {{"run_directory", flags.run_dir},
                          {"step", state->step},
                          {"prompt", flags.prompt},
                          {"generated", generated}};
    std::printf("%s\n", out.dump(-1, ' ', false,
                                 nlohmann::json::error_handler_t::replace)
                            .c_str());
  } else {
    std::printf("\n");
  }
  return 0;
}

}  // namespace

void AddGenerateCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "generate",
      "Sample text from the newest complete checkpoint of a train run, to "
      "see what the model learned. Prints the generated bytes after the "
      "prompt (the prompt itself is not repeated).\n"
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
             "Bytes to generate.");
  AddStringFlag(cmd, "temperature", &flags->temperature,
                "Softmax temperature; 0 picks the most likely byte.");
  AddIntFlag(cmd, "top_k", &flags->top_k,
             "Sample among the k most likely bytes (0: all).");
  AddIntFlag(cmd, "seed", &flags->seed, "Seed of the sampler.");
  AddBoolFlag(cmd, "json", &flags->json, "Print one JSON object.");
  table[cmd] = [flags] { return Run(*flags); };
}

}  // namespace multislice::cli
