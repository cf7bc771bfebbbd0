// `multislice import DIR_OR_FILE --output RUN_DIR [--json]`: a Hugging Face
// model (model.safetensors and config.json of GPT2LMHeadModel,
// LlamaForCausalLM, MistralForCausalLM or GemmaForCausalLM) as a run
// directory `multislice train` continues from and `multislice generate`
// samples: RUN_DIR/checkpoints/0 (train/imported_checkpoint.h), RUN_DIR/
// model.yml (the MaxText model file of the same model) and, with a
// tokenizer.model beside the weights, a copy of it and a config.json naming
// it for generate.
//
// Nothing is written until the whole input has been checked and read; the
// run directory is put together under RUN_DIR.import.tmp.<pid> and renamed
// into place, so a refusal or a failure leaves no RUN_DIR behind.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli/byte_progress.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "model/layout.h"
#include "train/dataset.h"
#include "train/hf_model.h"
#include "train/imported_checkpoint.h"
#include "train/metrics.h"
#include "train/safetensors.h"

namespace multislice::cli {
namespace {

namespace fs = std::filesystem;
constexpr char kName[] = "multislice import";
constexpr uintmax_t kMaxConfigBytes = 16 << 20;

struct ImportFlags {
  std::string input;
  std::string output;
  bool json = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "%s: %s\n", kName, s.message().c_str());
  return ExitCodeFor(s);
}

// The files of the input: a directory's model.safetensors, config.json and
// tokenizer.model, or a .safetensors file with config.json beside it.
struct InputFiles {
  std::string model, config, tokenizer;  // tokenizer: "" when absent
};

Result<InputFiles> FindInputs(const std::string& input) {
  InputFiles f;
  std::error_code ec;
  const fs::path dir = fs::is_directory(input, ec)
                           ? fs::path(input)
                           : fs::path(input).parent_path();
  f.model = fs::is_directory(input, ec) ? (dir / "model.safetensors").string()
                                        : input;
  f.config =
      (dir.empty() ? fs::path("config.json") : dir / "config.json").string();
  if (!fs::exists(f.model, ec)) {
    const bool sharded = fs::exists(dir / "model.safetensors.index.json", ec);
    return InvalidArgument(
        "DIR_OR_FILE: '" + input + "' " +
        (sharded ? "holds a sharded model (model.safetensors.index.json); "
                   "only one model.safetensors file is read"
                 : "is not a .safetensors file or a directory holding "
                   "model.safetensors"));
  }
  if (!fs::is_regular_file(f.config, ec)) {
    return InvalidArgument("DIR_OR_FILE: " + f.config +
                           " is missing (the model's config.json must be "
                           "beside its weights)");
  }
  const fs::path tokenizer = dir / train::kDatasetTokenizerFile;
  if (fs::is_regular_file(tokenizer, ec)) f.tokenizer = tokenizer.string();
  return f;
}

Result<train::HfModel> ReadConfig(const std::string& path) {
  std::error_code ec;
  if (fs::file_size(path, ec) > kMaxConfigBytes) {
    return InvalidArgument(path + " is larger than 16 MB: not a config.json");
  }
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) return InvalidArgument(path + " is not valid JSON");
  return train::HfModelFromConfig(j, path);
}

// GPT-2's causal-mask buffers, saved by older transformers versions: not
// parameters, so not read.
bool IsMaskBuffer(const std::string& name) {
  const std::string body =
      name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
  if (body.rfind("h.", 0) != 0) return false;
  const size_t dot = body.find('.', 2);
  if (dot == std::string::npos || dot == 2 ||
      body.find_first_not_of("0123456789", 2) != dot) {
    return false;
  }
  const std::string rest = body.substr(dot);
  return rest == ".attn.bias" || rest == ".attn.masked_bias";
}

// The file's tensor for each of the class's, checked: none missing, none
// extra, every shape the config's.
Result<std::vector<const train::SafetensorsTensor*>> MatchTensors(
    const train::SafetensorsReader& file, const train::HfModel& m,
    const std::vector<train::HfTensor>& wanted) {
  const std::string cls = train::HfClassName(m.architecture);
  // GPT2Model's own files name the tensors without "transformer.".
  const bool bare = m.architecture == train::HfArchitecture::kGpt2 &&
                    !file.Find("transformer.wte.weight") &&
                    file.Find("wte.weight");
  std::vector<const train::SafetensorsTensor*> found;
  std::set<std::string> names;
  for (const train::HfTensor& t : wanted) {
    const bool prefixed = t.name.rfind("transformer.", 0) == 0;
    const std::string name = bare && prefixed ? t.name.substr(12) : t.name;
    names.insert(name);
    const train::SafetensorsTensor* f = file.Find(name);
    if (f == nullptr) {
      return InvalidArgument(file.path() + ": tensor '" + name +
                             "' is missing (" + cls +
                             " as config.json "
                             "describes it has " +
                             std::to_string(wanted.size()) + " tensors)");
    }
    if (f->shape != t.shape) {
      return InvalidArgument(file.path() + ": tensor '" + name +
                             "' has shape " + nlohmann::json(f->shape).dump() +
                             " but config.json's model needs " +
                             nlohmann::json(t.shape).dump());
    }
    found.push_back(f);
  }
  for (const train::SafetensorsTensor& t : file.tensors()) {
    if (names.count(t.name) ||
        (m.architecture == train::HfArchitecture::kGpt2 &&
         IsMaskBuffer(t.name))) {
      continue;
    }
    return InvalidArgument(
        file.path() + ": tensor '" + t.name + "' is not one of " + cls +
        " as config.json describes it" +
        (t.name == "lm_head.weight" ? " (tie_word_embeddings is true)" : ""));
  }
  return found;
}

// The whole flat buffer from the file's tensors.
Result<std::vector<float>> ReadParams(const train::SafetensorsReader& file,
                                      const train::HfModel& m, bool json) {
  const model::DecoderConfig& c = m.config;
  const std::vector<train::HfTensor> wanted =
      train::HfTensors(c, m.architecture);
  ASSIGN_OR_RETURN(auto found, MatchTensors(file, m, wanted));
  std::map<std::string, model::ParamTensor> layout;
  for (const model::ParamTensor& t : model::ParameterLayout(c)) {
    layout[t.name] = t;
  }
  uint64_t total = 0, done = 0;
  for (const train::SafetensorsTensor* f : found) total += f->end - f->begin;
  ByteProgressLine line(kName, "reading " + file.path(), total, json);
  std::vector<float> params(static_cast<size_t>(model::NumParameters(c)));
  std::vector<float> values;
  for (size_t i = 0; i < wanted.size(); ++i) {
    values.resize(static_cast<size_t>(found[i]->elements()));
    Status s = file.ReadF32(*found[i], values.data());
    if (!s.ok()) {
      line.Stop();
      return s;
    }
    train::ImportHfTensor(c, wanted[i], layout.at(wanted[i].source),
                          values.data(), params.data());
    done += found[i]->end - found[i]->begin;
    line.Update(done);
  }
  line.Stop();
  return params;
}

// --output must be new (or an empty directory): an import never mixes with
// another run's files.
Status CheckOutput(const std::string& output) {
  if (output.empty()) {
    return InvalidArgument("--output: expected the run directory to create");
  }
  std::error_code ec;
  if (!fs::exists(output, ec)) return OkStatus();
  if (fs::is_directory(output, ec) && fs::is_empty(output, ec)) {
    return OkStatus();
  }
  return InvalidArgument("--output: '" + output +
                         "' already exists and is not an empty directory; "
                         "import into a new run directory");
}

// What lands in the run directory.
struct Outputs {
  std::string model_file, tokenizer;
};

// Writes the run directory under `staging`; the paths it names are the
// final ones under `output`.
Status WriteRun(const std::string& staging, const std::string& output,
                const InputFiles& in, const train::HfModel& m,
                std::vector<float> params, Outputs* out) {
  const std::string cls = train::HfClassName(m.architecture);
  const std::string from = fs::absolute(in.model).string();
  RETURN_IF_ERROR(train::WriteImportedCheckpoint(
      staging + "/checkpoints", m.config, std::move(params), {from, cls}));
  out->model_file = output + "/model.yml";
  RETURN_IF_ERROR(train::WriteFileAtomically(
      staging + "/model.yml",
      train::MaxTextModelYaml(m.config, "The model of " + from + " (" + cls +
                                            "), written by multislice "
                                            "import:\n  multislice train "
                                            "configs/base.yml model_name=" +
                                            out->model_file + " ...")));
  if (in.tokenizer.empty()) return OkStatus();
  std::ifstream tokenizer(in.tokenizer, std::ios::binary);
  std::stringstream bytes;
  bytes << tokenizer.rdbuf();
  if (!tokenizer) {
    return InvalidArgument(in.tokenizer + " cannot be read");
  }
  out->tokenizer =
      fs::absolute(output).string() + "/" + train::kDatasetTokenizerFile;
  RETURN_IF_ERROR(train::WriteFileAtomically(
      staging + "/" + train::kDatasetTokenizerFile, bytes.str()));
  // What `multislice generate` reads to find a run's tokenizer (dataset.h:
  // FindRunTokenizer); a train run in this directory replaces it.
  const nlohmann::json config = {{"tokenizer_path", out->tokenizer},
                                 {"dataset_path", fs::absolute(output)},
                                 {"imported_from", from}};
  return train::WriteFileAtomically(staging + "/config.json",
                                    config.dump(2) + "\n");
}

// Stages the run directory beside --output and renames it into place.
Status Publish(const ImportFlags& flags, const InputFiles& in,
               const train::HfModel& m, std::vector<float> params,
               Outputs* out) {
  const fs::path output = fs::path(flags.output).lexically_normal();
  const std::string staging =
      (output.has_filename() ? output.string()
                             : output.parent_path().string()) +
      ".import.tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(staging, ec);
  Status s = WriteRun(staging, flags.output, in, m, std::move(params), out);
  if (s.ok()) {
    if (fs::exists(flags.output, ec)) fs::remove(flags.output, ec);  // empty
    fs::rename(staging, flags.output, ec);
    if (ec) {
      s = Internal("cannot rename " + staging + " to " + flags.output + ": " +
                   ec.message());
    }
  }
  if (!s.ok()) fs::remove_all(staging, ec);
  return s;
}

void PrintResult(const ImportFlags& flags, const train::HfModel& m,
                 int64_t parameters, const Outputs& out) {
  const fs::path run = fs::path(flags.output).lexically_normal();
  const std::string base =
      run.has_parent_path() ? run.parent_path().string() : ".";
  const std::string name = run.filename().string();
  std::string train =
      "multislice train configs/base.yml model_name=" + out.model_file +
      " base_output_directory=" + base + " run_name=" + name;
  if (!out.tokenizer.empty()) train += " tokenizer_path=" + out.tokenizer;
  if (flags.json) {
    const nlohmann::json j = {
        {"from", flags.input},
        {"architecture", train::HfClassName(m.architecture)},
        {"model_type", train::HfModelType(m.architecture)},
        {"decoder_block", model::BlockName(m.config.block)},
        {"parameters", parameters},
        {"output", flags.output},
        {"checkpoint", flags.output + "/checkpoints/0"},
        {"model_file", out.model_file},
        {"tokenizer", out.tokenizer.empty() ? nlohmann::json(nullptr)
                                            : nlohmann::json(out.tokenizer)},
        {"train_command", train}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf(
      "%s: %s (%s, %lld parameters) -> %s: checkpoints/0, model.yml%s\n"
      "train it further with\n  %s\n",
      kName, flags.input.c_str(), train::HfClassName(m.architecture),
      static_cast<long long>(parameters), flags.output.c_str(),
      out.tokenizer.empty() ? "" : ", tokenizer.model", train.c_str());
}

int Run(const ImportFlags& flags) {
  if (Status s = CheckOutput(flags.output); !s.ok()) return Fail(s);
  auto in = FindInputs(flags.input);
  if (!in.ok()) return Fail(in.status());
  auto m = ReadConfig(in->config);
  if (!m.ok()) return Fail(m.status());
  auto file = train::SafetensorsReader::Open(in->model);
  if (!file.ok()) return Fail(file.status());
  auto params = ReadParams(*file, *m, flags.json);
  if (!params.ok()) return Fail(params.status());
  const int64_t parameters = static_cast<int64_t>(params->size());
  Outputs out;
  if (Status s = Publish(flags, *in, *m, std::move(*params), &out); !s.ok()) {
    return Fail(s);
  }
  PrintResult(flags, *m, parameters, out);
  return 0;
}

}  // namespace

void AddImportCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "import",
      "Make a run directory from a Hugging Face model: DIR_OR_FILE is a "
      "directory with model.safetensors and config.json (GPT2LMHeadModel, "
      "LlamaForCausalLM, MistralForCausalLM or GemmaForCausalLM; F32, BF16 "
      "or F16 tensors), or the .safetensors file with config.json beside "
      "it. Writes RUN_DIR/checkpoints/0 (the weights, AdamW moments zero), "
      "RUN_DIR/model.yml (the same model as MaxText model-file keys) and, "
      "when tokenizer.model is beside the weights, its copy. `multislice "
      "train ... model_name=RUN_DIR/model.yml` with base_output_directory "
      "and run_name naming RUN_DIR starts from these weights at step 0 (its "
      "own batch size and fresh moments); `multislice generate RUN_DIR` "
      "samples them. Refused in one sentence, with nothing written: a "
      "corrupt file, another architecture or an option not implemented "
      "(biases in Llama's attention, rope_scaling, a sliding window, ...), a "
      "missing or extra tensor, a shape config.json does not give, an "
      "--output that exists and is not empty. docs/export.md has the "
      "details.\n"
      "Examples:\n"
      "  multislice import /tmp/llama-hf --output runs/llama-ft\n"
      "  multislice import gpt2/model.safetensors --output runs/gpt2 --json\n"
      "  multislice train configs/base.yml "
      "model_name=runs/llama-ft/model.yml run_name=llama-ft steps=100");
  auto flags = std::make_shared<ImportFlags>();
  cmd->add_option("input", flags->input,
                  "A Hugging Face model directory, or its .safetensors file.")
      ->required();
  AddStringFlag(cmd, "output", &flags->output,
                "The run directory to create (new or empty).");
  AddBoolFlag(cmd, "json", &flags->json,
              "Print one JSON object: the architecture, the files written and "
              "the train command that continues from them.");
  table[cmd] = [flags] { return Run(*flags); };
}

}  // namespace multislice::cli
