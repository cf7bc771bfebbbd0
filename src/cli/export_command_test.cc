// End-to-end tests of `multislice export` and `multislice import` on tiny
// runs of each architecture (gpt3; llama2 with grouped key/value heads and
// an untied head; gemma with one key/value head and a normalised tied head):
//   - the exported logits of a fixed token sequence against an independent
//     PyTorch forward pass written from Hugging Face's definitions
//     (testdata/hf_reference.py: its own safetensors loader, no
//     transformers), run with Debian's python3-torch, within 1e-4;
//   - export then import gives the checkpoint's weights back bit for bit;
//     generate samples the imported run as it samples the original;
//     train continues from the imported weights (its first loss is the
//     imported model's loss on the first batch) with another batch size;
//   - corrupt or unsupported inputs are one sentence, exit code 2, and
//     leave nothing behind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"
#include "cli/train_test_fixture.h"
#include "common/temp_dir.h"
#include "model/decoder.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/imported_checkpoint.h"
#include "train/safetensors.h"
#include "train/train_state.h"

namespace multislice {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing_util::Child;
using testing_util::LastJsonLine;
using testing_util::ReadFile;
using testing_util::Spawn;
using testing_util::WaitExit;

// The tiny model's overrides per architecture (tiny.yml: width 64, 2 layers,
// 32 positions, f32).
const std::vector<std::string> kGpt3 = {};
const std::vector<std::string> kLlama = {"decoder_block=llama2",
                                         "num_heads=4",
                                         "num_kv_heads=2",
                                         "head_dim=16",
                                         "mlp_activations=[silu,linear]",
                                         "logits_via_embedding=false"};
const std::vector<std::string> kGemma = {"decoder_block=gemma",
                                         "num_heads=4",
                                         "num_kv_heads=1",
                                         "head_dim=16",
                                         "mlp_activations=[gelu,linear]",
                                         "logits_via_embedding=true",
                                         "normalize_embedding_logits=true"};

constexpr int kSteps = 30;

struct Output {
  int code = -1;
  std::string out, err;
};

train::FullState Latest(const std::string& run_dir) {
  CheckpointOptions options;
  options.directory = run_dir + "/checkpoints";
  CheckpointManager manager(options);
  auto state = train::LoadLatestFullState(manager, nullptr);
  EXPECT_TRUE(state.ok()) << run_dir << ": " << state.status().message();
  return state.ok() ? std::move(*state) : train::FullState{};
}

std::vector<int32_t> FixedTokens(int T) {
  std::vector<int32_t> ids(T);
  for (int i = 0; i < T; ++i) ids[i] = (i * 37 + 11) % 256;
  return ids;
}

bool TorchAvailable() {
  static const bool available =
      std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return available;
}

class ExportCommandTest : public testing_util::TrainRunTest {
 protected:
  static void SetUpTestSuite() {
    TrainRunTest::SetUpTestSuite();
    runs_ = new TempDir("multislice-export-runs-");
  }
  static void TearDownTestSuite() {
    delete runs_;
    runs_ = nullptr;
    TrainRunTest::TearDownTestSuite();
  }

  Output Multislice(const std::vector<std::string>& args,
                    const std::string& name) {
    Child c = Spawn(args, {}, dir_.path(), name);
    Output o;
    o.code = WaitExit(c, 120);
    o.out = ReadFile(c.out);
    o.err = ReadFile(c.err);
    return o;
  }

  // The suite's run `name` of `model`, trained for kSteps steps on first use
  // (enough to move the attention off uniform, so that a wrong rotary or
  // head mapping shows in the logits).
  std::string TrainedRun(const std::string& name,
                         const std::vector<std::string>& model) {
    const std::string run = runs_->path() + "/" + name;
    if (fs::exists(run + "/checkpoints/" + std::to_string(kSteps) +
                   "/COMMITTED")) {
      return run;
    }
    std::vector<std::string> args = {"train",
                                     data_->path() + "/tiny.yml",
                                     "base_output_directory=" + runs_->path(),
                                     "dataset_path=" + DatasetDir(),
                                     "run_name=" + name,
                                     "steps=" + std::to_string(kSteps)};
    args.insert(args.end(), model.begin(), model.end());
    const Output o = Multislice(args, "train_" + name);
    EXPECT_EQ(o.code, 0) << o.err;
    return run;
  }

  // `multislice export RUN --json`: its JSON.
  json Export(const std::string& run, const std::vector<std::string>& more) {
    std::vector<std::string> args = {"export", run, "--format", "safetensors",
                                     "--json"};
    args.insert(args.end(), more.begin(), more.end());
    const Output o = Multislice(args, "export");
    EXPECT_EQ(o.code, 0) << o.err;
    return json::parse(LastJsonLine(o.out));
  }

  // Exports the run of `model` and imports it into RunDir(name).
  std::string ExportAndImport(const std::string& name,
                              const std::vector<std::string>& model,
                              const std::string& input_file = "") {
    const json exported = Export(TrainedRun(name, model), {});
    const std::string input =
        exported["output"].get<std::string>() + input_file;
    const Output o = Multislice(
        {"import", input, "--output", RunDir(name), "--json"}, "import");
    EXPECT_EQ(o.code, 0) << o.err;
    return RunDir(name);
  }

  void ExpectLogitsMatchPyTorch(const std::string& name,
                                const std::vector<std::string>& model);

  inline static TempDir* runs_ = nullptr;
};

// The [T, V] logits of the run's newest checkpoint for FixedTokens(T).
std::vector<float> DecoderLogits(const train::FullState& state, int T) {
  model::Decoder decoder(state.model, DType::kF32);
  const std::vector<int32_t> ids = FixedTokens(T);
  auto r = decoder.Forward(state.params.data(), ids.data(), nullptr, 1, T);
  EXPECT_TRUE(r.ok()) << r.status().message();
  const size_t n = static_cast<size_t>(T) * state.model.vocab_size;
  return std::vector<float>(decoder.logits(), decoder.logits() + n);
}

// testdata/hf_reference.py's logits of the exported directory.
std::vector<double> PyTorchLogits(const std::string& export_dir, int T,
                                  const std::string& scratch) {
  std::string tokens;
  for (int32_t id : FixedTokens(T)) {
    tokens += (tokens.empty() ? "" : ",") + std::to_string(id);
  }
  const std::string out = scratch + "/logits.f64";
  const std::string command =
      "/usr/bin/python3 " + std::string(MULTISLICE_SOURCE_DIR) +
      "/src/cli/testdata/hf_reference.py '" + export_dir + "' " + tokens +
      " '" + out + "' 2>'" + scratch + "/python.err'";
  EXPECT_EQ(std::system(command.c_str()), 0)
      << ReadFile(scratch + "/python.err");
  const std::string bytes = ReadFile(out);
  std::vector<double> logits(bytes.size() / sizeof(double));
  std::memcpy(logits.data(), bytes.data(), logits.size() * sizeof(double));
  return logits;
}

void ExportCommandTest::ExpectLogitsMatchPyTorch(
    const std::string& name, const std::vector<std::string>& model) {
  if (!TorchAvailable()) {
    GTEST_SKIP() << "python3-torch is not installed (scripts/install_deps.sh "
                    "installs it): no PyTorch reference to compare with";
  }
  const std::string run = TrainedRun(name, model);
  const json exported = Export(run, {});
  const train::FullState state = Latest(run);
  const int T = state.model.max_seq_len;
  const std::vector<float> ours = DecoderLogits(state, T);
  const std::vector<double> reference =
      PyTorchLogits(exported["output"], T, dir_.path());
  ASSERT_EQ(reference.size(), ours.size());
  double worst = 0, largest = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    worst = std::max(worst, std::abs(ours[i] - reference[i]));
    largest = std::max(largest, std::abs(reference[i]));
  }
  EXPECT_LE(worst, 1e-4) << name << ": largest logit " << largest;
  EXPECT_GT(largest, 0.05) << name << ": logits too small to tell";
  std::printf("%s: %zu logits, max |ours - PyTorch| %.3g (largest %.3g)\n",
              name.c_str(), ours.size(), worst, largest);
}

TEST_F(ExportCommandTest, Gpt2LogitsMatchAnIndependentPyTorchForward) {
  ExpectLogitsMatchPyTorch("gpt3", kGpt3);
}

TEST_F(ExportCommandTest, LlamaGroupedHeadsLogitsMatchPyTorch) {
  ExpectLogitsMatchPyTorch("llama2", kLlama);
}

TEST_F(ExportCommandTest, GemmaLogitsMatchPyTorch) {
  ExpectLogitsMatchPyTorch("gemma", kGemma);
}

TEST_F(ExportCommandTest, ExportWritesTheHuggingFaceFiles) {
  const std::string run = TrainedRun("gpt3", kGpt3);
  const json exported = Export(run, {});
  EXPECT_EQ(exported["output"], run + "/export/step_30");
  EXPECT_EQ(exported["step"], kSteps);
  EXPECT_EQ(exported["architecture"], "GPT2LMHeadModel");
  ASSERT_EQ(exported["files"].size(), 2u);  // byte-level: no tokenizer
  const std::string dir = exported["output"];
  EXPECT_EQ(exported["files"][0]["path"], dir + "/model.safetensors");
  EXPECT_EQ(exported["files"][0]["bytes"],
            fs::file_size(dir + "/model.safetensors"));
  auto file = train::SafetensorsReader::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->tensors().size(), 4u + 12u * 2u);
  ASSERT_NE(file->Find("transformer.h.1.attn.c_attn.weight"), nullptr);
  EXPECT_EQ(file->Find("transformer.h.1.attn.c_attn.weight")->shape,
            (std::vector<int64_t>{64, 192}));
  std::ifstream config_file(dir + "/config.json");
  const json config = json::parse(config_file);
  EXPECT_EQ(config["architectures"], json({"GPT2LMHeadModel"}));
  EXPECT_EQ(config["n_embd"], 64);
  EXPECT_FALSE(fs::exists(dir + "/tokenizer.model"));
  // --step and --output.
  const json chosen =
      Export(run, {"--step", "30", "--output", dir_.path() + "/chosen"});
  EXPECT_EQ(chosen["output"], dir_.path() + "/chosen");
  const Output missing = Multislice({"export", run, "--step", "7"}, "step7");
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("--step: 7 is not a complete checkpoint"),
            std::string::npos)
      << missing.err;
}

TEST_F(ExportCommandTest, ImportGivesEveryArchitecturesWeightsBackBitForBit) {
  for (const auto& [name, model, file] : std::vector<
           std::tuple<std::string, std::vector<std::string>, std::string>>{
           {"gpt3", kGpt3, ""},
           {"llama2", kLlama, ""},
           {"gemma", kGemma, "/model.safetensors"}}) {
    SCOPED_TRACE(name);
    const std::string imported = ExportAndImport(name, model, file);
    const train::FullState original = Latest(runs_->path() + "/" + name);
    const train::FullState back = Latest(imported);
    EXPECT_EQ(back.step, 0);
    EXPECT_TRUE(back.model == original.model);
    ASSERT_EQ(back.params.size(), original.params.size());
    EXPECT_EQ(std::memcmp(back.params.data(), original.params.data(),
                          original.params.size() * sizeof(float)),
              0);
    auto meta = train::ImportedMetadata(imported + "/checkpoints", 0);
    ASSERT_TRUE(meta.ok()) << meta.status().message();
    EXPECT_NE((*meta)["from"].get<std::string>().find("model.safetensors"),
              std::string::npos);
    EXPECT_TRUE(fs::exists(imported + "/model.yml"));
  }
}

TEST_F(ExportCommandTest, GenerateSamplesAnImportedRunAsTheOriginal) {
  const std::string imported = ExportAndImport("llama2", kLlama);
  auto generate = [&](const std::string& run) {
    const Output o =
        Multislice({"generate", run, "--prompt", "The ", "--temperature", "0",
                    "--max_new_tokens", "24", "--json"},
                   "generate");
    EXPECT_EQ(o.code, 0) << o.err;
    return json::parse(LastJsonLine(o.out));
  };
  const json original = generate(runs_->path() + "/llama2");
  const json back = generate(imported);
  EXPECT_EQ(back["token_ids"].size(), 24u);
  EXPECT_EQ(back["token_ids"], original["token_ids"]);
  EXPECT_EQ(back["step"], 0);
}

TEST_F(ExportCommandTest, TrainingContinuesFromTheImportedWeights) {
  const std::string imported = ExportAndImport("llama2", kLlama);
  const train::FullState start = Latest(imported);
  // Another global batch than the original run's 16 rows: 3 on one device.
  const json summary =
      Train({"model_name=" + imported + "/model.yml", "run_name=llama2",
             "steps=2", "per_device_batch_size=3", "--num_slices", "1",
             "--accelerator_type", "cpu-1"},
            "continue");
  EXPECT_EQ(summary["restored_step"], 0);
  EXPECT_EQ(summary["first_step"], 1);
  const std::vector<double> losses = testing_util::Losses(summary);
  ASSERT_EQ(losses.size(), 2u);
  // The first step's loss: the imported weights on the run's first batch.
  train::DataIteratorOptions data;
  data.token_file = DatasetDir() + "/train.bin";
  data.global_rows = data.rows = 3;
  data.seq_len = start.model.max_seq_len;
  auto batches = train::DataIterator::Create(data);
  ASSERT_TRUE(batches.ok()) << batches.status().message();
  const train::Batch first = batches->At(0);
  model::Decoder decoder(start.model, DType::kF32);
  auto loss = decoder.Forward(start.params.data(), first.inputs.data(),
                              first.targets.data(), 3, data.seq_len);
  ASSERT_TRUE(loss.ok()) << loss.status().message();
  EXPECT_NEAR(losses[0], *loss, 1e-5 * *loss);
  // The run's own checkpoint follows, and it is not an imported one.
  const train::FullState trained = Latest(imported);
  EXPECT_EQ(trained.step, 2);
  EXPECT_NE(trained.params, start.params);
  auto meta = train::ImportedMetadata(imported + "/checkpoints", 2);
  ASSERT_TRUE(meta.ok());
  EXPECT_TRUE(meta->is_null());
}

// A small corpus of the fortune format for a SentencePiece tokenizer
// trained in a moment.
void WriteSmallCorpus(const std::string& path) {
  const char* const words[] = {"the",   "a",      "model", "of",     "every",
                               "slice", "trains", "on",    "tokens", "and",
                               "heads", "while",  "data",  "moves",  "fast"};
  std::ofstream out(path);
  uint32_t x = 12345;
  for (int doc = 0; doc < 1500; ++doc) {
    for (int w = 0; w < 12; ++w) {
      x = x * 1664525u + 1013904223u;
      out << (w ? " " : "") << words[(x >> 16) % 15];
    }
    out << ".\n%\n";
  }
}

TEST_F(ExportCommandTest, TheRunsTokenizerTravelsWithTheModel) {
  WriteSmallCorpus(dir_.path() + "/small.txt");
  const std::string ds = dir_.path() + "/ds_sp";
  ASSERT_EQ(
      Multislice({"data", "prepare", "--input", dir_.path() + "/small.txt",
                  "--output", ds, "--train_tokenizer", "300"},
                 "prepare")
          .code,
      0);
  const Output trained = Multislice(
      {"train", data_->path() + "/tiny.yml",
       "base_output_directory=" + dir_.path(), "dataset_path=" + ds,
       "run_name=sp", "steps=3", "vocab_size=300", "decoder_block=llama2",
       "mlp_activations=[silu,linear]", "logits_via_embedding=false"},
      "train_sp");
  ASSERT_EQ(trained.code, 0) << trained.err;
  const json exported = Export(RunDir("sp"), {});
  const std::string out = exported["output"];
  ASSERT_EQ(exported["files"].size(), 3u);
  EXPECT_EQ(ReadFile(out + "/tokenizer.model"),
            ReadFile(ds + "/tokenizer.model"));
  std::ifstream dataset_file(ds + "/dataset.json");
  const json dataset = json::parse(dataset_file);
  std::ifstream config_file(out + "/config.json");
  const json config = json::parse(config_file);
  EXPECT_EQ(config["bos_token_id"], dataset["tokenizer"]["bos_id"]);
  EXPECT_EQ(config["eos_token_id"], dataset["tokenizer"]["eos_id"]);
  const Output imported = Multislice(
      {"import", out, "--output", RunDir("sp_imported"), "--json"}, "import");
  ASSERT_EQ(imported.code, 0) << imported.err;
  const json result = json::parse(LastJsonLine(imported.out));
  const std::string tokenizer = result["tokenizer"];
  EXPECT_EQ(ReadFile(tokenizer), ReadFile(ds + "/tokenizer.model"));
  EXPECT_NE(result["train_command"].get<std::string>().find("tokenizer_path=" +
                                                            tokenizer),
            std::string::npos);
  // generate finds the copy, and samples what the original samples.
  auto generate = [&](const std::string& run) {
    const Output o =
        Multislice({"generate", run, "--prompt", "the model", "--temperature",
                    "0", "--max_new_tokens", "8", "--json"},
                   "generate");
    EXPECT_EQ(o.code, 0) << o.err;
    return json::parse(LastJsonLine(o.out));
  };
  const json original = generate(RunDir("sp"));
  const json back = generate(RunDir("sp_imported"));
  EXPECT_EQ(back["tokenizer"], tokenizer);
  EXPECT_EQ(back["prompt_token_ids"], original["prompt_token_ids"]);
  EXPECT_EQ(back["token_ids"], original["token_ids"]);
}

// Copies the exported directory `from` to dir/name, then applies `change`.
std::string Variant(const std::string& from, const std::string& dir,
                    const std::string& name,
                    const std::function<void(const std::string&)>& change) {
  const std::string to = dir + "/" + name;
  fs::create_directories(to);
  for (const auto& entry : fs::directory_iterator(from)) {
    fs::copy_file(entry.path(), to + "/" + entry.path().filename().string());
  }
  change(to);
  return to;
}

void EditConfig(const std::string& dir,
                const std::function<void(json&)>& edit) {
  std::ifstream in(dir + "/config.json");
  json config = json::parse(in);
  in.close();
  edit(config);
  std::ofstream(dir + "/config.json") << config.dump(2);
}

// model.safetensors rewritten with the tensors `rename` gives a name (""
// drops one), then `extra`.
void RewriteTensors(
    const std::string& dir,
    const std::function<std::string(const std::string&)>& rename,
    const std::vector<train::SafetensorsSource>& extra = {}) {
  const std::string path = dir + "/model.safetensors";
  auto file = train::SafetensorsReader::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  std::vector<train::SafetensorsSource> sources;
  for (const train::SafetensorsTensor& t : file->tensors()) {
    if (rename(t.name).empty()) continue;
    sources.push_back({rename(t.name), t.shape, [&file, t](float* out) {
                         ASSERT_TRUE(file->ReadF32(t, out).ok());
                       }});
  }
  sources.insert(sources.end(), extra.begin(), extra.end());
  const std::string rewritten = dir + "/rewritten";
  ASSERT_TRUE(train::WriteSafetensors(rewritten, sources).ok());
  fs::rename(rewritten, path);
}

// GPT2Model's own files (the hub's gpt2) name the tensors without
// "transformer." and may hold the causal-mask buffers: read, buffers skipped.
TEST_F(ExportCommandTest, ImportReadsGpt2ModelFilesAndSkipsMaskBuffers) {
  const std::string run = TrainedRun("gpt3", kGpt3);
  const std::string dir = Variant(
      Export(run, {})["output"], dir_.path(), "bare", [](const std::string& d) {
        RewriteTensors(d,
                       [](const std::string& n) {
                         return n.rfind("transformer.", 0) == 0 ? n.substr(12)
                                                                : n;
                       },
                       {{"h.0.attn.bias", {1, 1, 32, 32}, nullptr},
                        {"h.1.attn.masked_bias", {}, nullptr}});
      });
  auto file = train::SafetensorsReader::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  ASSERT_NE(file->Find("wte.weight"), nullptr);
  const Output o =
      Multislice({"import", dir, "--output", RunDir("bare_run")}, "import");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(Latest(RunDir("bare_run")).params, Latest(run).params);
}

TEST_F(ExportCommandTest, CorruptOrUnsupportedInputsAreOneSentence) {
  const json exported = Export(TrainedRun("gpt3", kGpt3), {});
  const std::string good = exported["output"];
  const std::string inputs = dir_.path() + "/inputs";
  int cases = 0;
  auto refused = [&](const std::string& input,
                     const std::vector<std::string>& phrases,
                     const std::string& output) {
    SCOPED_TRACE(input);
    const Output o =
        Multislice({"import", input, "--output", output}, "refused");
    EXPECT_EQ(o.code, 2) << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
    for (const std::string& p : phrases) {
      EXPECT_NE(o.err.find(p), std::string::npos)
          << "'" << p << "' not in " << o.err;
    }
    ++cases;
  };
  auto variant = [&](const std::string& name,
                     const std::function<void(const std::string&)>& change,
                     const std::vector<std::string>& phrases) {
    const std::string output = dir_.path() + "/out_" + name;
    refused(Variant(good, inputs, name, change), phrases, output);
    EXPECT_FALSE(fs::exists(output)) << output;
  };
  variant("truncated",
          [](const std::string& d) {
            const std::string f = d + "/model.safetensors";
            fs::resize_file(f, fs::file_size(f) - 100);
          },
          {"model.safetensors", "truncated"});
  variant("bad_header",
          [](const std::string& d) {
            std::fstream f(d + "/model.safetensors",
                           std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(8);
            f.put('x');  // the JSON's opening brace
          },
          {"model.safetensors", "not valid JSON"});
  variant("wrong_shape",
          [](const std::string& d) {
            EditConfig(d, [](json& c) { c["n_inner"] = 100; });
          },
          {"tensor 'transformer.h.0.mlp.c_fc.weight' has shape [64,128]",
           "needs [64,100]"});
  variant("missing_tensor",
          [](const std::string& d) {
            RewriteTensors(d, [](const std::string& n) {
              return n == "transformer.ln_f.bias" ? "" : n;
            });
          },
          {"tensor 'transformer.ln_f.bias' is missing"});
  variant("extra_tensor",
          [](const std::string& d) {
            RewriteTensors(d, [](const std::string& n) { return n; },
                           {{"extra.weight", {2}, nullptr}});
          },
          {"tensor 'extra.weight' is not one of GPT2LMHeadModel"});
  variant("architecture",
          [](const std::string& d) {
            EditConfig(d, [](json& c) { c["model_type"] = "qwen2"; });
          },
          {"config.json", "model_type \"qwen2\" is not implemented"});
  variant("option",
          [](const std::string& d) {
            EditConfig(d, [](json& c) {
              c["scale_attn_by_inverse_layer_idx"] = true;
            });
          },
          {"scale_attn_by_inverse_layer_idx = true is not implemented"});
  variant("no_config",
          [](const std::string& d) { fs::remove(d + "/config.json"); },
          {"config.json is missing"});
  // An --output that holds something is never written into.
  const std::string taken = dir_.path() + "/taken";
  fs::create_directories(taken);
  std::ofstream(taken + "/keep") << "x";
  refused(good, {"--output", "already exists"}, taken);
  EXPECT_EQ(ReadFile(taken + "/keep"), "x");
  // No staging directory is left anywhere.
  for (const auto& entry : fs::directory_iterator(dir_.path())) {
    EXPECT_EQ(entry.path().string().find(".import.tmp."), std::string::npos)
        << entry.path();
  }
  EXPECT_EQ(cases, 9);
}

}  // namespace
}  // namespace multislice
