// `multislice export RUN_DIR --format safetensors [--output DIR] [--step N]
// [--json]`: a train run's newest (or chosen) complete checkpoint as a
// Hugging Face model directory: model.safetensors with the transformers
// class's tensor names and layouts, its config.json, and the run's
// SentencePiece tokenizer.model when it had one (train/hf_model.h has the
// mapping, docs/export.md the tables). Every file is written through a
// temporary file and a rename.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/byte_progress.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "model/layout.h"
#include "train/checkpoint.h"
#include "train/dataset.h"
#include "train/hf_model.h"
#include "train/metrics.h"
#include "train/safetensors.h"
#include "train/train_state.h"

namespace multislice::cli {
namespace {

namespace fs = std::filesystem;
constexpr char kName[] = "multislice export";

struct ExportFlags {
  std::string run_dir;
  std::string format = "safetensors";
  std::string output;  // "": RUN_DIR/export/step_<N>
  std::string step;    // "": the newest complete step
  bool json = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "%s: %s\n", kName, s.message().c_str());
  return ExitCodeFor(s);
}

// The checkpoint to export: --step's, or the newest that loads.
Result<train::FullState> LoadCheckpoint(const ExportFlags& flags) {
  if (!fs::is_directory(flags.run_dir)) {
    return InvalidArgument("RUN_DIR: '" + flags.run_dir +
                           "' is not a directory (expected "
                           "base_output_directory/run_name of a train run)");
  }
  CheckpointOptions options;
  options.directory = flags.run_dir + "/checkpoints";
  CheckpointManager checkpoints(options);
  if (flags.step.empty()) {
    std::vector<std::string> warnings;
    auto state = train::LoadLatestFullState(checkpoints, &warnings);
    for (const std::string& w : warnings) {
      std::fprintf(stderr, "%s: warning: %s\n", kName, w.c_str());
    }
    if (!state.ok() && state.status().code() == StatusCode::kNotFound) {
      return InvalidArgument("RUN_DIR: '" + flags.run_dir +
                             "' has no complete checkpoint in checkpoints/");
    }
    return state;
  }
  const std::optional<long long> step = ParseInteger(flags.step);
  if (!step || *step < 0) {
    return InvalidArgument("--step: '" + flags.step +
                           "' is not a step number (an integer >= 0)");
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, checkpoints.CompleteSteps());
  if (std::find(steps.begin(), steps.end(), *step) == steps.end()) {
    std::string list;
    for (int64_t s : steps)
      list += (list.empty() ? "" : ", ") + std::to_string(s);
    return InvalidArgument(
        "--step: " + flags.step + " is not a complete checkpoint of " +
        flags.run_dir + " (complete: " + (list.empty() ? "none" : list) + ")");
  }
  return train::LoadFullState(checkpoints, *step);
}

// What was written, for the closing line and --json.
struct Written {
  std::string path;
  uint64_t bytes = 0;
};

Status WriteModel(const std::string& path, const train::FullState& state,
                  train::HfArchitecture architecture, bool json) {
  const model::DecoderConfig& c = state.model;
  std::map<std::string, model::ParamTensor> layout;
  for (const model::ParamTensor& t : model::ParameterLayout(c)) {
    layout[t.name] = t;
  }
  std::vector<train::SafetensorsSource> sources;
  for (const train::HfTensor& t : train::HfTensors(c, architecture)) {
    const model::ParamTensor& source = layout.at(t.source);
    sources.push_back({t.name, t.shape, [&c, t, &source, &state](float* out) {
                         train::ExportHfTensor(c, t, source,
                                               state.params.data(), out);
                       }});
  }
  train::SafetensorsWriteOptions options;
  options.metadata = {{"format", "pt"},
                      {"producer", "multislice export"},
                      {"step", std::to_string(state.step)}};
  ByteProgressLine line(kName, "writing " + path,
                        static_cast<uint64_t>(state.params.size()) * 4, json);
  options.progress = [&line](uint64_t written, uint64_t) {
    line.Update(written);
  };
  Status s = train::WriteSafetensors(path, sources, options);
  line.Stop();
  return s;
}

// The run's SentencePiece model, copied; nothing for a byte-level run.
Result<std::optional<Written>> CopyTokenizer(const std::string& run_dir,
                                             const std::string& out_dir,
                                             train::HfTokenIds* ids) {
  ASSIGN_OR_RETURN(train::RunTokenizer run, train::FindRunTokenizer(run_dir));
  if (run.source == train::kByteTokenizerType) return std::optional<Written>();
  ids->bos = run.tokenizer->bos_id();
  ids->eos = run.tokenizer->eos_id();
  std::ifstream in(run.source, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (!in) {
    return InvalidArgument("the run's tokenizer " + run.source +
                           " cannot be read");
  }
  const std::string path = out_dir + "/" + train::kDatasetTokenizerFile;
  RETURN_IF_ERROR(train::WriteFileAtomically(path, bytes.str()));
  return std::optional<Written>(Written{path, bytes.str().size()});
}

void PrintResult(const ExportFlags& flags, const train::FullState& state,
                 train::HfArchitecture architecture, const std::string& out,
                 const std::vector<Written>& files) {
  if (flags.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const Written& w : files) {
      list.push_back({{"path", w.path}, {"bytes", w.bytes}});
    }
    const nlohmann::json j = {
        {"run_directory", flags.run_dir},
        {"step", state.step},
        {"format", flags.format},
        {"architecture", train::HfClassName(architecture)},
        {"model_type", train::HfModelType(architecture)},
        {"parameters", state.params.size()},
        {"output", out},
        {"files", list}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("%s: %s step %lld, %s (%zu parameters) -> %s\n", kName,
              flags.run_dir.c_str(), static_cast<long long>(state.step),
              train::HfClassName(architecture), state.params.size(),
              out.c_str());
  for (const Written& w : files) {
    std::printf("  %s  %llu bytes\n", w.path.c_str(),
                static_cast<unsigned long long>(w.bytes));
  }
}

int Run(const ExportFlags& flags) {
  if (flags.format != "safetensors") {
    return Fail(InvalidArgument("--format: '" + flags.format +
                                "' is not a format export writes (expected "
                                "safetensors)"));
  }
  auto state = LoadCheckpoint(flags);
  if (!state.ok()) return Fail(state.status());
  auto architecture = train::HfArchitectureOf(state->model);
  if (!architecture.ok()) return Fail(architecture.status());
  const std::string out =
      flags.output.empty()
          ? flags.run_dir + "/export/step_" + std::to_string(state->step)
          : flags.output;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out)) {
    return Fail(InvalidArgument("--output: cannot create the directory '" +
                                out + "'" +
                                (ec ? ": " + ec.message() : std::string())));
  }
  train::HfTokenIds ids;
  auto tokenizer = CopyTokenizer(flags.run_dir, out, &ids);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  const std::string model_path = out + "/model.safetensors";
  Status s = WriteModel(model_path, *state, *architecture, flags.json);
  if (!s.ok()) return Fail(s);
  std::vector<Written> files = {{model_path, fs::file_size(model_path, ec)}};
  if (*tokenizer) files.push_back(**tokenizer);
  const std::string config_path = out + "/config.json";
  const std::string config =
      train::HfConfigJson(state->model, *architecture, ids).dump(2) + "\n";
  s = train::WriteFileAtomically(config_path, config);
  if (!s.ok()) return Fail(s);
  files.push_back({config_path, config.size()});
  PrintResult(flags, *state, *architecture, out, files);
  return 0;
}

}  // namespace

void AddExportCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "export",
      "Write a train run's newest complete checkpoint (or --step's) as a "
      "Hugging Face model directory: model.safetensors (float32) with the "
      "transformers class's tensor names and layouts, config.json as "
      "transformers writes it, and the run's tokenizer.model when it used a "
      "SentencePiece tokenizer. gpt3 exports as GPT2LMHeadModel, llama2 as "
      "LlamaForCausalLM, mistral as MistralForCausalLM, gemma as "
      "GemmaForCausalLM (its norm weights stored as w - 1 and its embedding "
      "divided by sqrt(emb_dim), as Hugging Face applies them). Refused: a "
      "tied head with normalize_embedding_logits outside gemma, a tied "
      "gemma head without it. docs/export.md has the names and "
      "conversions.\n"
      "Examples:\n"
      "  multislice export runs/quickstart --format safetensors\n"
      "  multislice export runs/llama --step 500 --output /tmp/llama-hf "
      "--json\n"
      "  python3 -c 'import transformers as t; "
      "t.AutoModelForCausalLM.from_pretrained(\"/tmp/llama-hf\")'");
  auto flags = std::make_shared<ExportFlags>();
  cmd->add_option("run_dir", flags->run_dir,
                  "The run directory: base_output_directory/run_name.")
      ->required();
  AddStringFlag(cmd, "format", &flags->format,
                "What to write: safetensors (the only format).");
  AddStringFlag(cmd, "output", &flags->output,
                "The directory to write (created); default "
                "RUN_DIR/export/step_<N>.");
  AddStringFlag(cmd, "step", &flags->step,
                "The checkpoint step to export; default the newest complete "
                "one.");
  AddBoolFlag(cmd, "json", &flags->json,
              "Print one JSON object: the step, the architecture and each "
              "file written with its size.");
  table[cmd] = [flags] { return Run(*flags); };
}

}  // namespace multislice::cli
