// Parsing, validation and JSON output of TrainConfig.
//
// kFields below is the only list of keys: loading, overrides, ToJson, the
// known-key list and the help text all walk it. YAML values and command-line
// values go through the same text parsers, so `steps: 10` in a file and
// `steps=10` on the command line accept exactly the same spellings.
#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include "common/suggest.h"
#include "runtime/wire.h"
#include "train/maxtext_keys.h"
#include "train/model_config.h"
#include "train/pipeline_schedule.h"

namespace multislice {
namespace {

using StringList = std::vector<std::string>;
using Member = std::variant<std::string TrainConfig::*, int TrainConfig::*,
                            double TrainConfig::*, bool TrainConfig::*,
                            StringList TrainConfig::*>;

struct Field {
  const char* name;
  Member member;
  const char* help;
};

// Same order and grouping as configs/base.yml.
const Field kFields[] = {
    {"run_name", &TrainConfig::run_name,
     "name of the run directory; empty = a timestamp"},
    {"base_output_directory", &TrainConfig::base_output_directory,
     "parent directory of run directories"},
    {"steps", &TrainConfig::steps, "training steps"},
    {"per_device_batch_size", &TrainConfig::per_device_batch_size,
     "sequences per device per step"},
    {"max_target_length", &TrainConfig::max_target_length,
     "tokens per sequence"},
    {"ici_diloco_parallelism", &TrainConfig::ici_diloco_parallelism,
     "DiLoCo replicas within a slice (needs enable_diloco); -1 = the rest"},
    {"ici_data_parallelism", &TrainConfig::ici_data_parallelism,
     "data-parallel devices within a slice; -1 = the rest"},
    {"ici_pipeline_parallelism", &TrainConfig::ici_pipeline_parallelism,
     "pipeline stages within a slice (the layers split evenly over them); "
     "-1 = the rest"},
    {"ici_fsdp_parallelism", &TrainConfig::ici_fsdp_parallelism,
     "FSDP devices within a slice; -1 = the rest"},
    {"ici_tensor_parallelism", &TrainConfig::ici_tensor_parallelism,
     "tensor-parallel devices within a slice (Megatron: the attention heads "
     "and the MLP split; must divide num_heads and mlp_dim); -1 = the rest"},
    {"dcn_diloco_parallelism", &TrainConfig::dcn_diloco_parallelism,
     "DiLoCo replicas across slices: they meet over DCN only every "
     "diloco_sync_period steps (needs enable_diloco); -1 = the rest"},
    {"dcn_data_parallelism", &TrainConfig::dcn_data_parallelism,
     "data-parallel slices; -1 = the rest"},
    {"dcn_pipeline_parallelism", &TrainConfig::dcn_pipeline_parallelism,
     "pipeline stages across slices (activations and their gradients go "
     "over DCN); -1 = the rest"},
    {"dcn_fsdp_parallelism", &TrainConfig::dcn_fsdp_parallelism,
     "FSDP slices; -1 = the rest"},
    {"dcn_tensor_parallelism", &TrainConfig::dcn_tensor_parallelism,
     "tensor-parallel slices (not recommended: tensor parallelism needs "
     "much more bandwidth than DCN gives)"},
    {"num_pipeline_microbatches", &TrainConfig::num_pipeline_microbatches,
     "microbatches each pipeline splits its batch into; -1 = the number of "
     "stages; must divide per_device_batch_size x tensor x stages"},
    {"pipeline_parallel_schedule", &TrainConfig::pipeline_parallel_schedule,
     "GPipe (every forward, then every backward) or 1F1B (one forward, one "
     "backward: at most p - s microbatches in flight on stage s)"},
    {"enable_diloco", &TrainConfig::enable_diloco,
     "DiLoCo: the diloco axis's replicas train on their own and average "
     "their pseudo-gradients every diloco_sync_period steps"},
    {"diloco_sync_period", &TrainConfig::diloco_sync_period,
     "inner steps between DiLoCo's outer steps"},
    {"diloco_outer_lr", &TrainConfig::diloco_outer_lr,
     "learning rate of the outer SGD (Nesterov momentum)"},
    {"diloco_outer_momentum", &TrainConfig::diloco_outer_momentum,
     "Nesterov momentum of the outer SGD, in [0, 1)"},
    {"enable_streaming_diloco", &TrainConfig::enable_streaming_diloco,
     "Streaming DiLoCo: sync one fragment of the layers at a time, "
     "overlapped with the next inner steps"},
    {"num_diloco_fragments", &TrainConfig::num_diloco_fragments,
     "fragments of whole layers Streaming DiLoCo syncs in turn; must divide "
     "diloco_sync_period"},
    {"num_communication_overlapping_steps",
     &TrainConfig::num_communication_overlapping_steps,
     "inner steps a fragment's sync overlaps before it is applied; below "
     "diloco_sync_period / num_diloco_fragments"},
    {"communication_overlapping_alpha",
     &TrainConfig::communication_overlapping_alpha,
     "weight of the local values when a fragment's outer update is mixed "
     "back: alpha * local + (1 - alpha) * global, in [0, 1]"},
    {"diloco_wire_dtype", &TrainConfig::diloco_wire_dtype,
     "DiLoCo's pseudo-gradient on the wire: f32, bf16 or int8 (a scale per "
     "256 values), summed in f32"},
    {"dcn_gradient_wire_dtype", &TrainConfig::dcn_gradient_wire_dtype,
     "the per-step gradient all-reduce across slices on the wire: f32, bf16 "
     "or int8, summed in f32"},
    {"diloco_continue_on_failure", &TrainConfig::diloco_continue_on_failure,
     "a lost slice drops its replica from the next syncs while the others "
     "go on, instead of stopping the job"},
    {"diloco_max_slice_restarts", &TrainConfig::diloco_max_slice_restarts,
     "with diloco_continue_on_failure: how many times the local launcher "
     "starts a lost slice again, to rejoin at the next sync; 0: it stays "
     "lost"},
    {"model_name", &TrainConfig::model_name,
     "a MaxText model file, models/NAME.yml (or a path to a .yml), whose "
     "keys override the config file's; default = none"},
    {"decoder_block", &TrainConfig::decoder_block,
     "the layer's style, MaxText's names: gpt3, llama2, mistral or gemma"},
    {"vocab_size", &TrainConfig::vocab_size, "vocabulary size"},
    {"emb_dim", &TrainConfig::emb_dim, "model width; a multiple of num_heads"},
    {"num_heads", &TrainConfig::num_heads, "attention (query) heads"},
    {"num_kv_heads", &TrainConfig::num_kv_heads,
     "key/value heads (grouped-query attention); -1 = num_heads"},
    {"head_dim", &TrainConfig::head_dim,
     "width of one attention head; -1 = emb_dim / num_heads"},
    {"num_decoder_layers", &TrainConfig::num_decoder_layers,
     "transformer blocks"},
    {"mlp_dim", &TrainConfig::mlp_dim, "hidden width of the MLP"},
    {"mlp_activations", &TrainConfig::mlp_activations,
     "the MLP's activations (gelu, silu, relu, linear), 1 or 2: two make a "
     "gated MLP; [] = the decoder block's own"},
    {"logits_via_embedding", &TrainConfig::logits_via_embedding,
     "the output head is the token embedding transposed (tied weights)"},
    {"normalize_embedding_logits", &TrainConfig::normalize_embedding_logits,
     "a tied head's logits divided by sqrt(emb_dim) (MaxText's default is "
     "true)"},
    {"normalization_layer_epsilon", &TrainConfig::normalization_layer_epsilon,
     "epsilon of the norm layers (LayerNorm, RMSNorm); > 0"},
    {"rope_max_timescale", &TrainConfig::rope_max_timescale,
     "the longest wavelength of rotary position embeddings"},
    {"weight_dtype", &TrainConfig::weight_dtype,
     "dtype of the master weights: float32 only"},
    {"learning_rate", &TrainConfig::learning_rate,
     "peak learning rate after warmup"},
    {"warmup_steps", &TrainConfig::warmup_steps,
     "steps of linear warmup from 0"},
    {"cosine_learning_rate_final_fraction",
     &TrainConfig::cosine_learning_rate_final_fraction,
     "final learning rate as a fraction of the peak"},
    {"adam_b1", &TrainConfig::adam_b1, "AdamW beta1"},
    {"adam_b2", &TrainConfig::adam_b2, "AdamW beta2"},
    {"adam_eps", &TrainConfig::adam_eps, "AdamW epsilon"},
    {"adam_weight_decay", &TrainConfig::adam_weight_decay,
     "AdamW decoupled weight decay"},
    {"gradient_clipping_threshold", &TrainConfig::gradient_clipping_threshold,
     "clip the global gradient norm to this; 0 = no clipping"},
    {"checkpoint_period", &TrainConfig::checkpoint_period,
     "steps between checkpoints"},
    {"max_num_checkpoints_to_keep", &TrainConfig::max_num_checkpoints_to_keep,
     "older checkpoints are deleted"},
    {"async_checkpointing", &TrainConfig::async_checkpointing,
     "write checkpoints in the background"},
    {"enable_checkpointing", &TrainConfig::enable_checkpointing,
     "write checkpoints and resume from the latest"},
    {"enable_in_memory_recovery", &TrainConfig::enable_in_memory_recovery,
     "keep a replica of the state in host memory; a restart restores a "
     "newer replica over DCN instead of the checkpoint"},
    {"in_memory_replica_period", &TrainConfig::in_memory_replica_period,
     "steps between host-memory replicas"},
    {"dataset_path", &TrainConfig::dataset_path,
     "prepared dataset; empty = the default fortunes dataset"},
    {"tokenizer_path", &TrainConfig::tokenizer_path,
     "SentencePiece model file; empty = byte-level tokens"},
    {"tokenizer_type", &TrainConfig::tokenizer_type,
     "sentencepiece (the only type here)"},
    {"add_bos", &TrainConfig::add_bos,
     "begin every document with the tokenizer's BOS token"},
    {"add_eos", &TrainConfig::add_eos,
     "end every document with the tokenizer's EOS token"},
    {"eval_interval", &TrainConfig::eval_interval, "steps between evaluations"},
    {"eval_batches", &TrainConfig::eval_batches, "batches per evaluation"},
    {"seed", &TrainConfig::seed, "seed for initialisation and data order"},
    {"dtype", &TrainConfig::dtype,
     "matmul dtype: bfloat16 (bf16) or float32 (f32)"},
    {"deterministic", &TrainConfig::deterministic,
     "use reduction orders that give bitwise-repeatable runs"},
    {"log_period", &TrainConfig::log_period, "steps between log lines"},
    {"hang_timeout_seconds", &TrainConfig::hang_timeout_seconds,
     "a collective not done after this long writes the hang digest and ends "
     "the job; 0 = 5x the median step time, at least 30 s"},
    {"straggler_report_interval", &TrainConfig::straggler_report_interval,
     "steps between straggler reports; 0 = none"},
    {"straggler_relative_threshold", &TrainConfig::straggler_relative_threshold,
     "a worker whose compute is below this share of the fastest worker's "
     "speed is a straggler"},
    {"straggler_individual_threshold",
     &TrainConfig::straggler_individual_threshold,
     "a worker whose compute is below this share of its own best speed is a "
     "straggler"},
    {"prometheus_metrics_file", &TrainConfig::prometheus_metrics_file,
     "a Prometheus text-format file worker 0 rewrites after every step; "
     "empty = none"},
    {"profiler", &TrainConfig::profiler,
     "xplane: a Chrome/Perfetto trace per worker in <run>/profile; empty = "
     "none"},
    {"skip_first_n_steps_for_profiler",
     &TrainConfig::skip_first_n_steps_for_profiler,
     "steps of this start not traced before the profiler starts"},
    {"profiler_steps", &TrainConfig::profiler_steps, "steps traced"},
};

// MaxText's names for the same keys (its model-size names, its names for
// the schedule's final fraction and the seed, and the checkpoint key of
// older MaxText the seed's recovery script uses).
const std::pair<const char*, const char*> kAliases[] = {
    {"save_period", "checkpoint_period"},
    {"learning_rate_final_fraction", "cosine_learning_rate_final_fraction"},
    {"init_weights_seed", "seed"},
    {"base_emb_dim", "emb_dim"},
    {"base_num_decoder_layers", "num_decoder_layers"},
    {"base_mlp_dim", "mlp_dim"},
    {"base_num_query_heads", "num_heads"},
    {"base_num_kv_heads", "num_kv_heads"},
};

const Field* FindField(const std::string& name) {
  std::string canonical = name;
  for (const auto& [alias, key] : kAliases) {
    if (name == alias) canonical = key;
  }
  for (const Field& field : kFields) {
    if (canonical == field.name) return &field;
  }
  return nullptr;
}

// The known key (ours, an alias or MaxText's) closest to `key`, when it is
// close enough to be a slip.
std::string Suggestion(const std::string& key) {
  std::vector<std::string> known;
  for (const Field& field : kFields) known.push_back(field.name);
  for (const auto& [alias, canonical] : kAliases) known.push_back(alias);
  for (const MaxTextKey& maxtext : MaxTextKeys()) {
    known.push_back(maxtext.name);
  }
  return ClosestName(key, known);
}

// The key's TrainConfig name (an alias's key), or the key itself.
std::string CanonicalKey(const std::string& key) {
  const Field* field = FindField(key);
  return field != nullptr ? field->name : key;
}

std::string KnownKeysList() {
  std::string list;
  for (const Field& field : kFields) {
    if (!list.empty()) list += ", ";
    list += field.name;
  }
  return list;
}

// Shortest text that reads back as the same double.
std::string FormatDouble(double value) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return ec == std::errc() ? std::string(buffer, end) : std::to_string(value);
}

// std::from_chars rejects a leading '+', which YAML allows.
std::string_view WithoutPlus(std::string_view text) {
  if (text.size() > 1 && text[0] == '+' && text[1] != '-') {
    text.remove_prefix(1);
  }
  return text;
}

// YAML 1.1 (OmegaConf, MaxText's 150_001) allows '_' between digits.
std::string WithoutDigitUnderscores(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool between_digits =
        text[i] == '_' && i > 0 && i + 1 < text.size() &&
        std::isdigit(static_cast<unsigned char>(text[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(text[i + 1]));
    if (!between_digits) out += text[i];
  }
  return out;
}

// Each parser returns what was expected, or "" when `text` parsed.
std::string ParseValue(std::string_view text, std::string& out) {
  out = std::string(text);
  return "";
}

std::string ParseValue(std::string_view text, int& out) {
  const std::string plain = WithoutDigitUnderscores(text);
  std::string_view digits = WithoutPlus(plain);
  auto [end, ec] =
      std::from_chars(digits.data(), digits.data() + digits.size(), out);
  if (ec == std::errc::result_out_of_range) {
    return "an integer between -2147483648 and 2147483647";
  }
  if (ec != std::errc() || end != digits.data() + digits.size() ||
      digits.empty()) {
    return "an integer";
  }
  return "";
}

std::string ParseValue(std::string_view text, double& out) {
  const std::string plain = WithoutDigitUnderscores(text);
  std::string_view number = WithoutPlus(plain);
  auto [end, ec] =
      std::from_chars(number.data(), number.data() + number.size(), out);
  if (ec != std::errc() || end != number.data() + number.size() ||
      number.empty() || !std::isfinite(out)) {
    return "a finite number";
  }
  return "";
}

std::string ParseValue(std::string_view text, bool& out) {
  // YAML 1.2 core schema spellings.
  if (text == "true" || text == "True" || text == "TRUE") {
    out = true;
    return "";
  }
  if (text == "false" || text == "False" || text == "FALSE") {
    out = false;
    return "";
  }
  return "true or false";
}

std::string_view Trimmed(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

// A list from the command line, in MaxText's spellings: a YAML flow list
// (`[silu,linear]`, `["silu", "linear"]`, what OmegaConf reads) or, as
// MaxText coerces its list keys' plain strings, `silu,linear`; "" or `[]`
// is the empty list.
std::string ParseValue(std::string_view text, StringList& out) {
  out.clear();
  text = Trimmed(text);
  if (text.empty()) return "";
  if (text.front() == '[') {
    YAML::Node node;
    try {
      node = YAML::Load(std::string(text));
    } catch (const YAML::Exception&) {
      return "a list such as [a,b] or a,b";
    }
    if (!node.IsSequence()) return "a list such as [a,b] or a,b";
    for (const YAML::Node& entry : node) {
      if (!entry.IsScalar() || entry.Scalar().empty()) {
        return "a list of plain values such as [a,b] or a,b";
      }
      out.push_back(entry.Scalar());
    }
    return "";
  }
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    const std::string_view entry = Trimmed(text.substr(
        begin, comma == std::string_view::npos ? std::string_view::npos
                                               : comma - begin));
    if (entry.empty()) return "a list such as [a,b] or a,b";
    out.emplace_back(entry);
    if (comma == std::string_view::npos) return "";
    begin = comma + 1;
  }
}

// A YAML list value of a list key: each entry a scalar.
Result<StringList> ListFromYaml(const YAML::Node& node, const std::string& key,
                                const std::string& where) {
  StringList list;
  for (const YAML::Node& entry : node) {
    if (!entry.IsScalar() || entry.Scalar().empty()) {
      return InvalidArgument("key '" + key + "' in " + where +
                             ": expected a list of plain values such as "
                             "[a, b]");
    }
    list.push_back(entry.Scalar());
  }
  return list;
}

// Parses `text` into the field; `config` is unchanged on error.
Status SetField(const Field& field, const std::string& text,
                const std::string& where, TrainConfig& config) {
  return std::visit(
      [&](auto member) -> Status {
        using Value = std::remove_reference_t<decltype(config.*member)>;
        Value value{};
        std::string expected = ParseValue(text, value);
        if (!expected.empty()) {
          return InvalidArgument("key '" + std::string(field.name) + "' = '" +
                                 text + "' in " + where + ": expected " +
                                 expected);
        }
        config.*member = std::move(value);
        return OkStatus();
      },
      field.member);
}

Status UnknownKey(const std::string& key, const std::string& where) {
  const std::string suggestion = Suggestion(key);
  if (!suggestion.empty()) {
    return InvalidArgument("unknown key '" + key + "' in " + where +
                           "; did you mean '" + suggestion + "'?");
  }
  return InvalidArgument("unknown key '" + key + "' in " + where +
                         "; known keys: " + KnownKeysList());
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return InvalidArgument("cannot read config file '" + path +
                           "': " + std::strerror(errno));
  }
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    // A directory opens like a file but does not read.
    return InvalidArgument("cannot read config file '" + path +
                           "': it is a directory");
  }
  std::string contents((std::istreambuf_iterator<char>(in)),
                       std::istreambuf_iterator<char>());
  if (in.bad()) {
    return InvalidArgument("cannot read config file '" + path +
                           "': read failed");
  }
  return contents;
}

// One key's value in one layer of a load (the config file, the model file,
// the command line): a file's YAML node, or a command-line text (verbatim
// for TrainConfig's own keys, read as YAML for MaxText's, as OmegaConf
// does).
struct Setting {
  std::string key;
  std::string text;  // a scalar's text ("" for null); the command line's
  YAML::Node node;   // a file's value
  bool from_file = false;
  std::string where;

  nlohmann::json Typed() const {
    return from_file ? MaxTextValue(node) : MaxTextValue(text);
  }
  // The value as its refusal shows it.
  std::string Shown() const {
    return from_file && (node.IsSequence() || node.IsMap())
               ? MaxTextValue(node).dump()
               : text;
  }
};

// A TrainConfig key's value: a list key's YAML list, or a scalar in the
// key's own spelling (OurSpelling maps MaxText's None and 12.0 to it).
Status ApplyField(const Field& field, const Setting& s, TrainConfig& config) {
  const bool is_list =
      std::holds_alternative<StringList TrainConfig::*>(field.member);
  if (s.from_file && s.node.IsSequence() && is_list) {
    ASSIGN_OR_RETURN(StringList list, ListFromYaml(s.node, s.key, s.where));
    config.*std::get<StringList TrainConfig::*>(field.member) = std::move(list);
    return OkStatus();
  }
  if (s.from_file && (s.node.IsSequence() || s.node.IsMap())) {
    return InvalidArgument("key '" + s.key + "' in " + s.where +
                           ": expected a single value, not a " +
                           (s.node.IsMap() ? "mapping" : "list"));
  }
  const std::string_view name = field.name;
  std::string text = s.text;
  if (name == "max_num_checkpoints_to_keep" || name == "num_diloco_fragments" ||
      name == "per_device_batch_size") {
    ASSIGN_OR_RETURN(text, OurSpelling(name, s.Typed(), s.text, s.where));
  }
  return SetField(field, text, s.where, config);
}

// Applies one setting: a TrainConfig key (or alias), else a MaxText key,
// else an unknown key.
Status ApplySetting(const Setting& s, TrainConfig& config,
                    MaxTextConversions& conversions) {
  if (const Field* field = FindField(s.key)) {
    RETURN_IF_ERROR(ApplyField(*field, s, config));
    // The later of warmup_steps and warmup_steps_fraction wins.
    if (std::string_view(field->name) == "warmup_steps") {
      conversions.warmup_steps_fraction.reset();
    }
    return OkStatus();
  }
  if (const MaxTextKey* key = FindMaxTextKey(s.key)) {
    return ApplyMaxTextKey(*key, s.Typed(), s.Shown(), s.where, conversions,
                           config);
  }
  return UnknownKey(s.key, s.where);
}

// The settings of the YAML mapping at `path`, in file order.
Result<std::vector<Setting>> ReadSettings(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    std::string position;
    if (!e.mark.is_null()) {
      position = " at line " + std::to_string(e.mark.line + 1) + ", column " +
                 std::to_string(e.mark.column + 1);
    }
    return InvalidArgument("YAML syntax error in " + path + position + ": " +
                           e.msg);
  }
  std::vector<Setting> settings;
  if (root.IsNull()) return settings;  // an empty file keeps the defaults
  if (!root.IsMap()) {
    return InvalidArgument("config file '" + path +
                           "' must be a YAML mapping of key: value lines");
  }
  std::set<std::string> seen;
  for (const auto& entry : root) {
    if (!entry.first.IsScalar()) {
      return InvalidArgument("config file '" + path +
                             "' has a key that is not a plain name");
    }
    const std::string key = entry.first.Scalar();
    if (!seen.insert(key).second) {
      return InvalidArgument("key '" + key + "' appears twice in " + path);
    }
    const YAML::Node& value = entry.second;
    // A null value (`key:` or `key: ~`) reads as the empty string.
    settings.push_back(
        {key, value.IsScalar() ? value.Scalar() : "", value, true, path});
  }
  return settings;
}

Result<std::vector<Setting>> CommandLineSettings(
    const std::vector<std::string>& overrides, const std::string& where) {
  std::vector<Setting> settings;
  for (const std::string& override_text : overrides) {
    const size_t equals = override_text.find('=');
    if (equals == std::string::npos || equals == 0) {
      return InvalidArgument("override '" + override_text + "' in " + where +
                             " is not of the form key=value");
    }
    settings.push_back({override_text.substr(0, equals),
                        override_text.substr(equals + 1), YAML::Node(), false,
                        where});
  }
  return settings;
}

Status ApplySettings(const std::vector<Setting>& settings, TrainConfig& config,
                     MaxTextConversions& conversions) {
  for (const Setting& s : settings) {
    RETURN_IF_ERROR(ApplySetting(s, config, conversions));
  }
  return OkStatus();
}

// Whether two settings of the same key set the same value.
Result<bool> SameValue(const Setting& a, const Setting& b) {
  if (FindField(a.key) == nullptr) {
    return SameMaxTextValue(a.Typed(), b.Typed());
  }
  TrainConfig config_a, config_b;
  MaxTextConversions conversions_a, conversions_b;
  RETURN_IF_ERROR(ApplySetting(a, config_a, conversions_a));
  RETURN_IF_ERROR(ApplySetting(b, config_b, conversions_b));
  return config_a == config_b;
}

// The last setting of `key` in the file and then the command line, or null.
const Setting* LastSetting(const std::string& key,
                           const std::vector<Setting>& file,
                           const std::vector<Setting>& command_line) {
  const Setting* last = nullptr;
  for (const auto* layer : {&file, &command_line}) {
    for (const Setting& s : *layer) {
      if (s.key == key) last = &s;
    }
  }
  return last;
}

// MaxText's model layer: the model file's settings (none for model_name
// default). Like pyconfig, a command-line key the model file sets to
// another value is refused unless override_model_config is true.
Result<std::vector<Setting>> ModelSettings(
    const std::string& config_path, const std::vector<Setting>& file,
    const std::vector<Setting>& command_line) {
  const Setting* name = LastSetting("model_name", file, command_line);
  if (name == nullptr || name->text == "default" || name->text.empty()) {
    return std::vector<Setting>();
  }
  bool override_model_config = false;
  if (const Setting* o =
          LastSetting("override_model_config", file, command_line)) {
    const std::string expected = ParseValue(o->text, override_model_config);
    if (!expected.empty()) {
      return InvalidArgument("key 'override_model_config' = '" + o->text +
                             "' in " + o->where + ": expected " + expected);
    }
  }
  ASSIGN_OR_RETURN(const std::string path,
                   FindModelFile(name->text, config_path));
  ASSIGN_OR_RETURN(std::vector<Setting> model, ReadSettings(path));
  if (override_model_config) return model;
  for (const Setting& set : command_line) {
    for (const Setting& model_set : model) {
      if (CanonicalKey(set.key) != CanonicalKey(model_set.key)) continue;
      ASSIGN_OR_RETURN(const bool same, SameValue(model_set, set));
      if (same) continue;
      return InvalidArgument(
          "key '" + set.key + "' = '" + set.Shown() + "' in " + set.where +
          " overrides the model file " + path + " (" + model_set.key + ": " +
          model_set.Shown() +
          "): set override_model_config=true to change a model's key, as "
          "in MaxText");
    }
  }
  return model;
}

std::string IntRangeError(const char* key, int value,
                          const std::string& expected) {
  return "key '" + std::string(key) + "' = " + std::to_string(value) +
         ": expected " + expected;
}

Status CheckAtLeast(const char* key, int value, int minimum) {
  if (value >= minimum) return OkStatus();
  return InvalidArgument(
      IntRangeError(key, value, "an integer >= " + std::to_string(minimum)));
}

// Checks lower <= value (or lower < value) and value <= upper (or < upper).
Status CheckNumber(const char* key, double value, double lower,
                   bool lower_inclusive, double upper, bool upper_inclusive) {
  bool ok = (lower_inclusive ? value >= lower : value > lower) &&
            (upper_inclusive ? value <= upper : value < upper);
  if (ok) return OkStatus();
  std::string expected = "a number " +
                         std::string(lower_inclusive ? ">=" : ">") + " " +
                         FormatDouble(lower);
  if (std::isfinite(upper)) {
    expected += " and " + std::string(upper_inclusive ? "<=" : "<") + " " +
                FormatDouble(upper);
  }
  return InvalidArgument("key '" + std::string(key) + "' = " +
                         FormatDouble(value) + ": expected " + expected);
}

struct ParallelismAxis {
  const char* key;
  int value;
};

// Each axis is -1 or >= 1, and at most one axis of the group is -1.
Status CheckParallelism(const char* group, const ParallelismAxis (&axes)[5]) {
  const char* fill_axis = nullptr;
  for (const ParallelismAxis& axis : axes) {
    if (axis.value != -1 && axis.value < 1) {
      return InvalidArgument(
          IntRangeError(axis.key, axis.value,
                        "-1 (use the remaining devices) or an integer >= 1"));
    }
    if (axis.value == -1) {
      if (fill_axis != nullptr) {
        return InvalidArgument("keys '" + std::string(fill_axis) + "' and '" +
                               axis.key + "' are both -1: expected at most " +
                               "one " + group + "_* axis to be -1");
      }
      fill_axis = axis.key;
    }
  }
  return OkStatus();
}

// The pipeline keys: the stages on one level, dividing the layers, and
// microbatches dividing the rows each pipeline sees (-1 axes resolve with
// the mesh; the launcher checks them again then).
Status CheckPipeline(const TrainConfig& c) {
  RETURN_IF_ERROR(
      train::ParsePipelineSchedule(c.pipeline_parallel_schedule).status());
  if (c.num_pipeline_microbatches != -1 && c.num_pipeline_microbatches < 1) {
    return InvalidArgument(
        IntRangeError("num_pipeline_microbatches", c.num_pipeline_microbatches,
                      "-1 (one per stage) or an integer >= 1"));
  }
  const int ici = c.ici_pipeline_parallelism, dcn = c.dcn_pipeline_parallelism;
  if (ici < 1 || dcn < 1) return OkStatus();  // -1: checked once resolved
  return CheckPipelineSplit(
      c, ici, dcn, c.ici_tensor_parallelism * c.dcn_tensor_parallelism);
}

// The DiLoCo keys, with torchft's rules for the streaming ones (the diloco
// axis's -1 resolves with the mesh; the launcher checks it again then).
Status CheckDiloco(const TrainConfig& c) {
  const int ici = c.ici_diloco_parallelism, dcn = c.dcn_diloco_parallelism;
  if (ici >= 1 && dcn >= 1) RETURN_IF_ERROR(CheckDilocoReplicas(c, ici, dcn));
  RETURN_IF_ERROR(
      runtime::ParseWireType(c.diloco_wire_dtype, "key 'diloco_wire_dtype'")
          .status());
  RETURN_IF_ERROR(runtime::ParseWireType(c.dcn_gradient_wire_dtype,
                                         "key 'dcn_gradient_wire_dtype'")
                      .status());
  RETURN_IF_ERROR(CheckAtLeast("diloco_max_slice_restarts",
                               c.diloco_max_slice_restarts, 0));
  if (!c.enable_diloco && c.diloco_continue_on_failure) {
    return InvalidArgument(
        "key 'diloco_continue_on_failure' = true: expected enable_diloco=true "
        "too (only DiLoCo's replicas can go on without a lost slice)");
  }
  if (!c.enable_diloco) {
    if (!c.enable_streaming_diloco) return OkStatus();
    return InvalidArgument(
        "key 'enable_streaming_diloco' = true: expected enable_diloco=true "
        "too (Streaming DiLoCo is DiLoCo that syncs fragments in turn)");
  }
  RETURN_IF_ERROR(CheckAtLeast("diloco_sync_period", c.diloco_sync_period, 1));
  RETURN_IF_ERROR(CheckNumber("diloco_outer_lr", c.diloco_outer_lr, 0, false,
                              HUGE_VAL, false));
  RETURN_IF_ERROR(CheckNumber("diloco_outer_momentum", c.diloco_outer_momentum,
                              0, true, 1, false));
  RETURN_IF_ERROR(
      CheckAtLeast("num_diloco_fragments", c.num_diloco_fragments, 1));
  RETURN_IF_ERROR(CheckAtLeast("num_communication_overlapping_steps",
                               c.num_communication_overlapping_steps, 0));
  RETURN_IF_ERROR(CheckNumber("communication_overlapping_alpha",
                              c.communication_overlapping_alpha, 0, true, 1,
                              true));
  const int fragments = c.enable_streaming_diloco ? c.num_diloco_fragments : 1;
  if (!c.enable_streaming_diloco &&
      (c.num_diloco_fragments != 1 || c.num_communication_overlapping_steps)) {
    return InvalidArgument(
        "keys num_diloco_fragments (" + std::to_string(c.num_diloco_fragments) +
        ") and num_communication_overlapping_steps (" +
        std::to_string(c.num_communication_overlapping_steps) +
        "): expected enable_streaming_diloco=true for fragments or overlap");
  }
  if (fragments > c.num_decoder_layers) {
    return InvalidArgument(IntRangeError(
        "num_diloco_fragments", fragments,
        "at most num_decoder_layers (" + std::to_string(c.num_decoder_layers) +
            "): each fragment holds whole layers"));
  }
  if (c.diloco_sync_period % fragments != 0) {
    return InvalidArgument(IntRangeError(
        "num_diloco_fragments", fragments,
        "a divisor of diloco_sync_period (" +
            std::to_string(c.diloco_sync_period) +
            "): the fragments sync in turn, one every period / fragments "
            "steps"));
  }
  const int gap = c.diloco_sync_period / fragments;
  if (c.num_communication_overlapping_steps >= gap) {
    return InvalidArgument(IntRangeError(
        "num_communication_overlapping_steps",
        c.num_communication_overlapping_steps,
        "fewer than diloco_sync_period / num_diloco_fragments (" +
            std::to_string(gap) +
            ") steps: a fragment's sync must land before the next starts"));
  }
  return OkStatus();
}

// The model keys of MaxText's that this trainer reads: each value's own
// range (the shapes' relations are the model's to check).
Status CheckModelKeys(const TrainConfig& c) {
  static const char* const kBlocks[] = {"gpt3", "llama2", "mistral", "gemma"};
  if (std::find_if(std::begin(kBlocks), std::end(kBlocks), [&](const char* b) {
        return c.decoder_block == b;
      }) == std::end(kBlocks)) {
    return InvalidArgument("key 'decoder_block' = '" + c.decoder_block +
                           "': expected gpt3, llama2, mistral or gemma (the "
                           "decoder blocks this trainer implements)");
  }
  if (c.model_name.empty()) {
    return InvalidArgument(
        "key 'model_name' = '': expected default (no model file) or the "
        "name of a model file");
  }
  for (const auto& [key, value, minus_one] :
       {std::tuple{"num_kv_heads", c.num_kv_heads, "as many as num_heads"},
        std::tuple{"head_dim", c.head_dim, "emb_dim / num_heads"}}) {
    if (value != -1 && value < 1) {
      return InvalidArgument(IntRangeError(
          key, value,
          std::string("-1 (") + minus_one + ") or an integer >= 1"));
    }
  }
  if (c.mlp_activations.size() > 2) {
    return InvalidArgument(
        "key 'mlp_activations' = " + nlohmann::json(c.mlp_activations).dump() +
        ": expected 1 or 2 activations (2 make a gated MLP), or [] for the "
        "decoder block's own");
  }
  for (const std::string& activation : c.mlp_activations) {
    if (activation != "gelu" && activation != "silu" && activation != "relu" &&
        activation != "linear") {
      return InvalidArgument("key 'mlp_activations' has '" + activation +
                             "': expected each of gelu, silu, relu or linear");
    }
  }
  RETURN_IF_ERROR(CheckNumber("normalization_layer_epsilon",
                              c.normalization_layer_epsilon, 0, false, HUGE_VAL,
                              false));
  RETURN_IF_ERROR(CheckNumber("rope_max_timescale", c.rope_max_timescale, 0,
                              false, HUGE_VAL, false));
  if (c.weight_dtype != "float32") {
    return InvalidArgument("key 'weight_dtype' = '" + c.weight_dtype +
                           "': expected float32 (the master weights are f32; "
                           "dtype sets the matmuls' type)");
  }
  if (c.tokenizer_type != "sentencepiece") {
    return InvalidArgument(
        "key 'tokenizer_type' = '" + c.tokenizer_type +
        "': expected sentencepiece (the only tokenizer type here" +
        (c.tokenizer_type == "tiktoken" || c.tokenizer_type == "huggingface"
             ? "; " + c.tokenizer_type + " tokenizers are not implemented"
             : std::string()) +
        ")");
  }
  return OkStatus();
}

}  // namespace

Status CheckDilocoReplicas(const TrainConfig& c, int ici_replicas,
                           int dcn_replicas) {
  if (ici_replicas * dcn_replicas == 1 || c.enable_diloco) return OkStatus();
  return InvalidArgument(
      "keys ici_diloco_parallelism (" + std::to_string(ici_replicas) +
      ") x dcn_diloco_parallelism (" + std::to_string(dcn_replicas) +
      ") = " + std::to_string(ici_replicas * dcn_replicas) +
      " replicas: expected enable_diloco=true (the diloco axis holds "
      "DiLoCo's replicas; use the data axes for data parallelism)");
}

Status CheckLosableSlices(const TrainConfig& c, int ici_replicas,
                          int dcn_replicas, int num_slices) {
  if (!c.diloco_continue_on_failure ||
      (ici_replicas == 1 && dcn_replicas == num_slices && num_slices >= 2)) {
    return OkStatus();
  }
  return InvalidArgument(
      "key 'diloco_continue_on_failure' = true with ici_diloco_parallelism " +
      std::to_string(ici_replicas) + " and dcn_diloco_parallelism " +
      std::to_string(dcn_replicas) + " over " + std::to_string(num_slices) +
      " slices: expected one DiLoCo replica per slice (ici 1, dcn the "
      "number of slices, at least 2), so that a lost slice takes exactly one "
      "replica with it");
}

Status CheckPipelineSplit(const TrainConfig& c, int ici_stages, int dcn_stages,
                          int tensor) {
  const std::string keys =
      "keys ici_pipeline_parallelism (" + std::to_string(ici_stages) +
      ") x dcn_pipeline_parallelism (" + std::to_string(dcn_stages) + ")";
  if (ici_stages > 1 && dcn_stages > 1) {
    return InvalidArgument(keys +
                           ": expected at most one of them above 1: a "
                           "pipeline's stages run either inside a slice or "
                           "across slices");
  }
  const int stages = ici_stages * dcn_stages;
  if (c.num_decoder_layers % stages != 0) {
    return InvalidArgument(
        keys + " = " + std::to_string(stages) +
        " stages: expected a divisor of " + "num_decoder_layers (" +
        std::to_string(c.num_decoder_layers) +
        "): each stage holds an equal number of whole layers");
  }
  const int m = PipelineMicrobatches(c, stages);
  if (tensor < 1) return OkStatus();  // -1: checked once resolved
  const int rows = c.per_device_batch_size * tensor * stages;
  if (rows % m != 0) {
    return InvalidArgument(
        "key 'num_pipeline_microbatches' = " + std::to_string(m) +
        (c.num_pipeline_microbatches == -1 ? " (one per stage)" : "") +
        ": expected a divisor of the " + std::to_string(rows) +
        " rows each pipeline trains on per step (per_device_batch_size " +
        std::to_string(c.per_device_batch_size) + " x tensor " +
        std::to_string(tensor) + " x stages " + std::to_string(stages) + ")");
  }
  return OkStatus();
}

int PipelineMicrobatches(const TrainConfig& c, int stages) {
  return c.num_pipeline_microbatches == -1 ? stages
                                           : c.num_pipeline_microbatches;
}

Status ApplyTrainConfigOverrides(const std::vector<std::string>& overrides,
                                 const std::string& where,
                                 TrainConfig& config) {
  ASSIGN_OR_RETURN(std::vector<Setting> settings,
                   CommandLineSettings(overrides, where));
  MaxTextConversions conversions;
  RETURN_IF_ERROR(ApplySettings(settings, config, conversions));
  return ResolveMaxTextKeys(conversions, config);
}

Result<TrainConfig> LoadTrainConfig(const std::string& yaml_path,
                                    const std::vector<std::string>& overrides) {
  // MaxText's precedence: the config file, then the model file, then the
  // command line.
  ASSIGN_OR_RETURN(std::vector<Setting> file, ReadSettings(yaml_path));
  ASSIGN_OR_RETURN(std::vector<Setting> command_line,
                   CommandLineSettings(overrides, "the command line"));
  ASSIGN_OR_RETURN(std::vector<Setting> model,
                   ModelSettings(yaml_path, file, command_line));
  TrainConfig config;
  MaxTextConversions conversions;
  for (const auto* layer : {&file, &model, &command_line}) {
    RETURN_IF_ERROR(ApplySettings(*layer, config, conversions));
  }
  RETURN_IF_ERROR(ResolveMaxTextKeys(conversions, config));
  // One spelling from here on (config.json, reports); a bad value is left
  // for ValidateTrainConfig to name.
  if (auto dtype = ParseDType(config.dtype, "dtype"); dtype.ok()) {
    config.dtype = std::string(Name(*dtype));
  }
  // MaxText lower-cases decoder_block before it reads it.
  std::transform(config.decoder_block.begin(), config.decoder_block.end(),
                 config.decoder_block.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  return config;
}

DType MatmulDType(const TrainConfig& config) {
  auto dtype = ParseDType(config.dtype, "dtype");
  return dtype.ok() ? *dtype : DType::kBF16;
}

Status ValidateTrainConfig(const TrainConfig& c) {
  if (c.run_name.find('/') != std::string::npos || c.run_name == "." ||
      c.run_name == "..") {
    return InvalidArgument("key 'run_name' = '" + c.run_name +
                           "': expected a single directory name without '/'");
  }
  if (c.base_output_directory.empty()) {
    return InvalidArgument(
        "key 'base_output_directory' = '': expected a directory path");
  }
  // MaxText's gs://bucket/... (the seed's recovery script): it would become
  // a local directory named "gs:".
  const size_t scheme = c.base_output_directory.find("://");
  if (scheme != std::string::npos && scheme > 0 &&
      c.base_output_directory.find('/') == scheme + 1) {
    return InvalidArgument(
        "key 'base_output_directory' = '" + c.base_output_directory +
        "': expected a directory path, not a " +
        c.base_output_directory.substr(0, scheme) +
        ":// URL (multislice writes to file systems: mount the bucket, e.g. "
        "with gcsfuse, and give its directory)");
  }
  RETURN_IF_ERROR(CheckAtLeast("steps", c.steps, 1));
  RETURN_IF_ERROR(
      CheckAtLeast("per_device_batch_size", c.per_device_batch_size, 1));
  RETURN_IF_ERROR(CheckAtLeast("max_target_length", c.max_target_length, 1));
  RETURN_IF_ERROR(CheckParallelism(
      "ici", {{"ici_diloco_parallelism", c.ici_diloco_parallelism},
              {"ici_data_parallelism", c.ici_data_parallelism},
              {"ici_pipeline_parallelism", c.ici_pipeline_parallelism},
              {"ici_fsdp_parallelism", c.ici_fsdp_parallelism},
              {"ici_tensor_parallelism", c.ici_tensor_parallelism}}));
  RETURN_IF_ERROR(CheckParallelism(
      "dcn", {{"dcn_diloco_parallelism", c.dcn_diloco_parallelism},
              {"dcn_data_parallelism", c.dcn_data_parallelism},
              {"dcn_pipeline_parallelism", c.dcn_pipeline_parallelism},
              {"dcn_fsdp_parallelism", c.dcn_fsdp_parallelism},
              {"dcn_tensor_parallelism", c.dcn_tensor_parallelism}}));
  RETURN_IF_ERROR(CheckAtLeast("vocab_size", c.vocab_size, 1));
  RETURN_IF_ERROR(CheckAtLeast("emb_dim", c.emb_dim, 1));
  RETURN_IF_ERROR(CheckAtLeast("num_heads", c.num_heads, 1));
  RETURN_IF_ERROR(CheckAtLeast("num_decoder_layers", c.num_decoder_layers, 1));
  RETURN_IF_ERROR(CheckAtLeast("mlp_dim", c.mlp_dim, 1));
  RETURN_IF_ERROR(CheckModelKeys(c));
  // The block's own rules (train/model_config.h): head_dim, key/value heads
  // and activations.
  RETURN_IF_ERROR(train::DecoderConfigFrom(c).status());
  // Each tensor rank holds whole heads and an equal part of the MLP (-1
  // resolves with the mesh; the launcher checks it then).
  const int tensor = c.ici_tensor_parallelism * c.dcn_tensor_parallelism;
  const int kv_heads = c.num_kv_heads == -1 ? c.num_heads : c.num_kv_heads;
  if (tensor > 0 && (c.num_heads % tensor != 0 || kv_heads % tensor != 0 ||
                     c.mlp_dim % tensor != 0)) {
    return InvalidArgument(
        "keys ici_tensor_parallelism (" +
        std::to_string(c.ici_tensor_parallelism) +
        ") x dcn_tensor_parallelism (" +
        std::to_string(c.dcn_tensor_parallelism) + ") = " +
        std::to_string(tensor) + ": expected a divisor of num_heads (" +
        std::to_string(c.num_heads) + ")" +
        (kv_heads != c.num_heads
             ? ", of num_kv_heads (" + std::to_string(kv_heads) + ")"
             : std::string()) +
        " and of mlp_dim (" + std::to_string(c.mlp_dim) +
        "): each tensor rank holds whole heads and an equal part of the MLP");
  }
  RETURN_IF_ERROR(CheckPipeline(c));
  RETURN_IF_ERROR(CheckDiloco(c));
  const double kInfinity = HUGE_VAL;
  RETURN_IF_ERROR(CheckNumber("learning_rate", c.learning_rate, 0, false,
                              kInfinity, false));
  RETURN_IF_ERROR(CheckAtLeast("warmup_steps", c.warmup_steps, 0));
  RETURN_IF_ERROR(CheckNumber("cosine_learning_rate_final_fraction",
                              c.cosine_learning_rate_final_fraction, 0, true, 1,
                              true));
  RETURN_IF_ERROR(CheckNumber("adam_b1", c.adam_b1, 0, true, 1, false));
  RETURN_IF_ERROR(CheckNumber("adam_b2", c.adam_b2, 0, true, 1, false));
  RETURN_IF_ERROR(
      CheckNumber("adam_eps", c.adam_eps, 0, false, kInfinity, false));
  RETURN_IF_ERROR(CheckNumber("adam_weight_decay", c.adam_weight_decay, 0, true,
                              kInfinity, false));
  RETURN_IF_ERROR(CheckNumber("gradient_clipping_threshold",
                              c.gradient_clipping_threshold, 0, true, kInfinity,
                              false));
  RETURN_IF_ERROR(CheckAtLeast("checkpoint_period", c.checkpoint_period, 1));
  RETURN_IF_ERROR(CheckAtLeast("max_num_checkpoints_to_keep",
                               c.max_num_checkpoints_to_keep, 1));
  RETURN_IF_ERROR(
      CheckAtLeast("in_memory_replica_period", c.in_memory_replica_period, 1));
  // eval_interval <= 0 (MaxText's -1): no evaluation.
  RETURN_IF_ERROR(CheckAtLeast("eval_batches", c.eval_batches, 1));
  RETURN_IF_ERROR(CheckAtLeast("seed", c.seed, 0));
  if (!ParseDType(c.dtype, "dtype").ok()) {
    return InvalidArgument("key 'dtype' = '" + c.dtype +
                           "': expected bfloat16 (bf16) or float32 (f32)");
  }
  RETURN_IF_ERROR(CheckAtLeast("log_period", c.log_period, 1));
  RETURN_IF_ERROR(CheckNumber("hang_timeout_seconds", c.hang_timeout_seconds, 0,
                              true, kInfinity, false));
  RETURN_IF_ERROR(CheckAtLeast("straggler_report_interval",
                               c.straggler_report_interval, 0));
  RETURN_IF_ERROR(CheckNumber("straggler_relative_threshold",
                              c.straggler_relative_threshold, 0, false, 1,
                              true));
  if (c.profiler != "" && c.profiler != "xplane") {
    return InvalidArgument(
        "key 'profiler' = '" + c.profiler + "': expected \"\" or xplane" +
        (c.profiler == "nsys" ? " (nsys profiles NVIDIA GPUs, not these "
                                "CPU devices)"
                              : ""));
  }
  RETURN_IF_ERROR(CheckAtLeast("skip_first_n_steps_for_profiler",
                               c.skip_first_n_steps_for_profiler, 0));
  RETURN_IF_ERROR(CheckAtLeast("profiler_steps", c.profiler_steps, 1));
  RETURN_IF_ERROR(CheckNumber("straggler_individual_threshold",
                              c.straggler_individual_threshold, 0, false, 1,
                              true));
  return OkStatus();
}

nlohmann::json ToJson(const TrainConfig& config) {
  nlohmann::json json = nlohmann::json::object();
  for (const Field& field : kFields) {
    std::visit([&](auto member) { json[field.name] = config.*member; },
               field.member);
  }
  return json;
}

std::string RunDirectory(const TrainConfig& config) {
  return config.base_output_directory + "/" + config.run_name;
}

std::vector<std::string> TrainConfigKeys() {
  std::vector<std::string> keys;
  for (const Field& field : kFields) keys.push_back(field.name);
  return keys;
}

std::string DescribeTrainConfigKeys() {
  const TrainConfig defaults;
  std::string text;
  for (const Field& field : kFields) {
    std::visit(
        [&](auto member) {
          using Value = std::remove_cvref_t<decltype(defaults.*member)>;
          const Value& value = defaults.*member;
          std::string type, shown;
          if constexpr (std::is_same_v<Value, std::string>) {
            type = "string";
            shown = "\"" + value + "\"";
          } else if constexpr (std::is_same_v<Value, bool>) {
            type = "bool";
            shown = value ? "true" : "false";
          } else if constexpr (std::is_same_v<Value, int>) {
            type = "int";
            shown = std::to_string(value);
          } else if constexpr (std::is_same_v<Value, StringList>) {
            type = "list";
            shown = nlohmann::json(value).dump();
          } else {
            type = "float";
            shown = FormatDouble(value);
          }
          text += "  " + std::string(field.name) + " (" + type + ", default " +
                  shown + "): " + field.help + "\n";
        },
        field.member);
  }
  return text;
}

}  // namespace multislice
