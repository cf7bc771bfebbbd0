// `multislice plan`: the performance model of spec 3.5 (model/perf_model.h)
// on the command line. Given an accelerator type, the slices, the parameters
// and the batch, it prints the hardware's arithmetic intensity, the
// workload's operational intensity, the minimum and recommended batch per
// slice, the predicted step time and scaling efficiency, a table comparing
// data parallelism, FSDP and pipelines of each depth by tokens/s, and the
// strategy to use across slices with the reason and the train keys. It only
// computes, so TPU types work as well as cpu-N (with a measured peak and DCN
// bandwidth).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "common/dtype.h"
#include "common/status.h"
#include "model/layout.h"
#include "model/perf_model.h"
#include "train/config.h"
#include "train/maxtext_keys.h"
#include "train/model_config.h"

namespace multislice::cli {
namespace {

constexpr char kNumberExamples[] = "e.g. 16e9, 350k, 1.5M, 16B";

// Parses a count such as "16e9", "350000", "350k", "1.5M", "16B", "2T":
// a decimal number (with optional fraction and exponent) and an optional
// decimal suffix K (1e3), M (1e6), B or G (1e9), T (1e12), in any case.
// nullopt for anything else, including signs other than '-', spaces,
// infinities and NaN.
std::optional<double> ParseCount(const std::string& text) {
  if (text.empty() || text[0] == '+') return std::nullopt;
  double value = 0;
  const char* begin = text.data();
  const char* end = begin + text.size();
  auto [rest, error] =
      std::from_chars(begin, end, value, std::chars_format::general);
  if (error != std::errc()) return std::nullopt;
  const std::string suffix(rest, end);
  double scale = 1;
  if (suffix.size() > 1) return std::nullopt;
  if (!suffix.empty()) {
    switch (suffix[0]) {
      case 'k':
      case 'K':
        scale = 1e3;
        break;
      case 'm':
      case 'M':
        scale = 1e6;
        break;
      case 'b':
      case 'B':
      case 'g':
      case 'G':
        scale = 1e9;
        break;
      case 't':
      case 'T':
        scale = 1e12;
        break;
      default:
        return std::nullopt;
    }
  }
  value *= scale;
  if (!std::isfinite(value)) return std::nullopt;
  return value;
}

// Adds a count flag (see ParseCount) writing *target when given; a bad value
// is "--name: 'abc' is not a number (e.g. 16e9, 350k, 1.5M, 16B)".
// `alias`: a second name (MaxText's), e.g. base_emb_dim for emb_dim.
CLI::Option* AddCountFlag(CLI::App* app, const std::string& underscore_name,
                          std::optional<double>* target,
                          const std::string& description,
                          const std::string& default_text = "",
                          const std::string& alias = "") {
  const std::string flag = "--" + underscore_name;
  CLI::Option* option = app->add_option_function<std::string>(
      FlagNames(underscore_name) +
          (alias.empty() ? "" : "," + FlagNames(alias)),
      [flag, target](const std::string& text) {
        const std::optional<double> value = ParseCount(text);
        if (!value) {
          throw CLI::ValidationError(
              flag, "'" + text + "' is not a number (" + kNumberExamples + ")");
        }
        *target = *value;
      },
      description);
  option->type_name("NUM")->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  if (!default_text.empty()) option->default_str(default_text);
  return option;
}

struct PlanFlags {
  std::string accelerator_type;
  int num_slices = 1;
  std::optional<double> parameters;
  std::string model_name;
  std::optional<double> tokens_per_slice;
  std::optional<double> global_batch_tokens;
  std::optional<double> peak_flops_per_chip;
  std::optional<double> dcn_gbps_per_host;
  std::optional<double> forward_flops;
  std::optional<double> backward_flops;
  std::optional<double> mfu;
  std::string gradient_dtype = "float32";
  std::string dcn_volume = "seed";
  std::optional<double> margin;
  std::string strategy = "auto";
  int pipeline_depth = 0;
  int pipeline_microbatches = 0;
  std::optional<double> emb_dim;
  long long memory_per_chip = 0;
  bool memory_given = false;
  std::optional<double> state_bytes_per_parameter;
  bool json = false;
};

// --model_name's parameters and width: the model file's decoder, counted as
// train lays it out (the head and embeddings included).
Status ApplyModelFile(const std::string& name, PlanFlags& flags) {
  Result<std::string> path = FindModelFile(name, "");
  if (!path.ok()) {
    // FindModelFile names the key as train has it; plan's is a flag.
    std::string message = path.status().message();
    const std::string key = "key 'model_name' = ";
    if (message.rfind(key, 0) == 0) message = message.substr(key.size());
    return InvalidArgument("--model_name " + message);
  }
  ASSIGN_OR_RETURN(TrainConfig config, LoadTrainConfig(*path, {}));
  Result<model::DecoderConfig> decoder = train::DecoderConfigFrom(config);
  if (!decoder.ok()) {
    return InvalidArgument("--model_name: " + *path + ": " +
                           decoder.status().message());
  }
  if (flags.parameters) {
    return InvalidArgument(
        "--parameters and --model_name: give one (the model file " + *path +
        " counts " + std::to_string(model::NumParameters(*decoder)) +
        " parameters)");
  }
  flags.parameters = static_cast<double>(model::NumParameters(*decoder));
  if (!flags.emb_dim) flags.emb_dim = decoder->emb_dim;
  return OkStatus();
}

Result<model::PerfModelOptions> ToOptions(PlanFlags flags) {
  model::PerfModelOptions o;
  o.accelerator_type = flags.accelerator_type;
  o.num_slices = flags.num_slices;
  if (!flags.model_name.empty()) {
    RETURN_IF_ERROR(ApplyModelFile(flags.model_name, flags));
  }
  if (!flags.parameters) {
    return InvalidArgument(
        "--parameters or --model_name is required (e.g. --parameters 16e9 "
        "or --model_name llama2-7b)");
  }
  o.parameters = *flags.parameters;
  o.tokens_per_slice = flags.tokens_per_slice;
  o.global_batch_tokens = flags.global_batch_tokens;
  o.peak_flops_per_chip = flags.peak_flops_per_chip;
  o.dcn_gbps_per_host = flags.dcn_gbps_per_host;
  if (flags.forward_flops) {
    o.forward_flops_per_token_per_parameter = *flags.forward_flops;
  }
  if (flags.backward_flops) {
    o.backward_flops_per_token_per_parameter = *flags.backward_flops;
  }
  if (flags.mfu) o.mfu = *flags.mfu;
  ASSIGN_OR_RETURN(DType gradient_dtype,
                   ParseDType(flags.gradient_dtype, "--gradient_dtype"));
  o.gradient_bits = gradient_dtype == DType::kF32 ? 32 : 16;
  ASSIGN_OR_RETURN(o.dcn_volume, model::ParseDcnVolume(flags.dcn_volume));
  if (flags.margin) o.margin = *flags.margin;
  if (flags.strategy != "auto") {
    Result<model::DcnStrategy> strategy =
        model::ParseDcnStrategy(flags.strategy);
    if (!strategy.ok()) {
      return InvalidArgument("--strategy: '" + flags.strategy +
                             "' is not one of auto, dcn_data, dcn_fsdp, "
                             "pipeline");
    }
    o.strategy = *strategy;
  } else if (flags.pipeline_depth > 0) {
    o.strategy = model::DcnStrategy::kPipeline;  // a depth asks for one
  }
  o.pipeline_depth = flags.pipeline_depth;
  o.pipeline_microbatches = flags.pipeline_microbatches;
  o.emb_dim = flags.emb_dim;
  if (flags.memory_given) {
    o.memory_bytes_per_chip = static_cast<double>(flags.memory_per_chip);
  }
  if (flags.state_bytes_per_parameter) {
    o.state_bytes_per_parameter = *flags.state_bytes_per_parameter;
  }
  return o;
}

// "%.4g" for numbers that are not whole; whole numbers with thousands
// separators: 22000 -> "22,000".
std::string Count(double value) {
  if (!(std::fabs(value) < 1e18 && value == std::floor(value))) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.4g", value);
    return text;
  }
  const long long whole = static_cast<long long>(std::fabs(value));
  const std::string digits = std::to_string(whole);
  std::string out = value < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// A count rounded to whole units when large: 43750 -> "43,750", 0.5 -> "0.5".
std::string Rounded(double value) {
  if (!std::isfinite(value)) return "infinite";
  return Count(std::fabs(value) >= 100 ? std::round(value) : value);
}

std::string Format(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

// Engineering notation for the formulas: 2.75e14 -> "275e12", 5e10 ->
// "50e9", 4000 -> "4e3", 12 -> "12".
std::string Engineering(double value) {
  if (value == 0 || !std::isfinite(value)) return Format("%g", value);
  int exponent = static_cast<int>(std::floor(std::log10(std::fabs(value))));
  exponent -= ((exponent % 3) + 3) % 3;
  if (exponent == 0) return Format("%.4g", value);
  return Format("%.4g", value / std::pow(10.0, exponent)) + "e" +
         std::to_string(exponent);
}

// A rate with an SI prefix: 2.75e14, "FLOP/s" -> "275 TFLOP/s".
std::string Rate(double value, const std::string& unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P", "E"};
  int index = 0;
  while (index < 6 && std::fabs(value) >= 1000) {
    value /= 1000;
    ++index;
  }
  return Format("%.4g", value) + " " + prefixes[index] + unit;
}

std::string Seconds(double seconds) {
  if (seconds == 0) return "0 s";
  if (seconds < 1e-3) return Format("%.4g us", seconds * 1e6);
  if (seconds < 1) return Format("%.4g ms", seconds * 1e3);
  return Format("%.4g s", seconds);
}

std::string Bytes(double bytes) {
  if (bytes == 0) return "0";
  if (bytes < 1e6) return Format("%.4g KB", bytes / 1e3);
  if (bytes < 1e9) return Format("%.4g MB", bytes / 1e6);
  return Format("%.4g GB", bytes / 1e9);
}

std::string GiB(double bytes) {
  return Format("%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
}

std::string Percent(double fraction) {
  return Format("%.1f%%", fraction * 100);
}

std::string Line(const std::string& label, const std::string& value) {
  std::string line = "  " + label;
  if (line.size() < 30) line.resize(30, ' ');
  return line + value + "\n";
}

// The recommended `multislice train` keys, space-separated.
std::string Config(const model::Recommendation& r) {
  std::string keys;
  for (const std::string& key : model::TrainKeys(r)) {
    keys += (keys.empty() ? "" : " ") + key;
  }
  return keys;
}

// A table row: cells padded to `widths` (the last cell as it is).
std::string Row(const std::vector<std::string>& cells,
                const std::vector<size_t>& widths) {
  std::string row = " ";
  for (size_t i = 0; i < cells.size(); ++i) {
    std::string cell = " " + cells[i];
    if (i + 1 < cells.size() && cell.size() < widths[i] + 1) {
      cell.resize(widths[i] + 1, ' ');
    }
    row += cell;
  }
  while (!row.empty() && row.back() == ' ') row.pop_back();
  return row + "\n";
}

// The strategies compared (perf_model.h 10.), one row each, the recommended
// one marked.
std::string StrategyTable(const model::PerfPlan& plan) {
  const model::Recommendation& r = plan.recommendation;
  std::vector<std::vector<std::string>> rows = {{"strategy", "step", "tokens/s",
                                                 "DCN/host/step", "bubble",
                                                 "DCN hidden", ""}};
  for (const model::StrategyEstimate& e : plan.strategies) {
    std::string name(model::ToString(e.strategy));
    if (e.strategy == model::DcnStrategy::kPipeline) {
      name += " depth " + std::to_string(e.pipeline_depth) + " x " +
              std::to_string(e.data_replicas) + " dp";
    }
    const bool chosen =
        e.strategy == r.strategy && e.pipeline_depth == r.pipeline_depth;
    rows.push_back(
        {name, Seconds(e.step_seconds),
         Rounded(std::round(e.tokens_per_second)), Bytes(e.dcn_bytes_per_host),
         e.strategy == model::DcnStrategy::kPipeline
             ? Percent(e.bubble_fraction)
             : "-",
         e.dcn_hidden ? "yes" : "no", chosen ? "<- recommended" : ""});
  }
  std::vector<size_t> widths(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  std::string text;
  for (const auto& row : rows) text += Row(row, widths);
  return text;
}

std::string StrategyName(const model::StrategyEstimate& e) {
  std::string name(model::ToString(e.strategy));
  if (e.strategy == model::DcnStrategy::kPipeline) {
    name += " (depth " + std::to_string(e.pipeline_depth) + ", " +
            std::to_string(e.data_replicas) +
            (e.data_replicas == 1 ? " data-parallel replica, "
                                  : " data-parallel replicas, ") +
            std::to_string(e.pipeline_microbatches) + " microbatches)";
  }
  return name;
}

std::string PrintText(const model::PerfPlan& plan) {
  const model::PerfModelOptions& o = plan.options;
  const model::StrategyEstimate& dp = plan.data_parallel;
  const model::StrategyEstimate& e = plan.estimate;
  // cpu-N has devices, not chips.
  const std::string chips = plan.type.family == "cpu" ? "devices" : "chips";
  std::string text =
      "Plan: " + plan.type.name + " x " + std::to_string(plan.num_slices) +
      " slices (" + std::to_string(plan.chips_per_slice) + " " + chips +
      " per slice, " + std::to_string(plan.chips_per_host) + " per host, " +
      std::to_string(plan.hosts_per_slice) +
      (plan.hosts_per_slice == 1 ? " host" : " hosts") + " per slice)\n";
  text += "Workload\n";
  text += Line("parameters", Count(plan.parameters));
  text +=
      Line("tokens per slice", Rounded(plan.tokens_per_slice) + " (global " +
                                   Rounded(plan.global_batch_tokens) + ")");
  text +=
      Line("FLOPs per token per param",
           Count(o.forward_flops_per_token_per_parameter) + " forward + " +
               Count(o.backward_flops_per_token_per_parameter) + " backward");
  text += Line("assumed MFU", Percent(o.mfu));
  text += Line("emb_dim", o.emb_dim ? Count(*o.emb_dim)
                                    : "not given: the activations between "
                                      "pipeline stages are not counted");
  text += "Hardware\n";
  text += Line("peak per chip",
               Rate(plan.peak_flops_per_chip, "FLOP/s") +
                   (plan.peak_from_type ? " (published)" : " (given)"));
  text += Line("DCN per host",
               Rate(plan.dcn_bits_per_second_per_host, "bit/s") +
                   (plan.dcn_from_type ? " (published)" : " (given)"));
  text += Line("arithmetic intensity",
               Rounded(plan.arithmetic_intensity) +
                   " FLOP/bit = " + std::to_string(plan.chips_per_host) +
                   " x " + Engineering(plan.peak_flops_per_chip) + " / " +
                   Engineering(plan.dcn_bits_per_second_per_host));
  const std::string backward = Count(o.backward_flops_per_token_per_parameter);
  const std::string bits = Count(dp.backward_dcn_bits_per_parameter);
  text += "Data parallelism across " + std::to_string(plan.num_slices) +
          " slices (the seed's rule)\n";
  text += Line("DCN bits per parameter",
               bits + " (" + std::to_string(o.gradient_bits) +
                   "-bit gradients x all-reduce factor " +
                   Format("%.4g", model::AllReduceFactor(plan.num_slices,
                                                         o.dcn_volume)) +
                   ", " + std::string(model::ToString(o.dcn_volume)) + ")");
  if (plan.num_slices > 1) {
    text += Line("operational intensity",
                 Rounded(dp.operational_intensity) + " FLOP/bit = " + backward +
                     " x " + Rounded(plan.tokens_per_slice) + " / " + bits);
    text += Line("minimum per slice",
                 Rounded(dp.minimum_tokens_per_slice) +
                     " tokens = " + Rounded(plan.arithmetic_intensity) + " x " +
                     bits + " / " + backward);
    text += Line("recommended per slice",
                 Rounded(dp.recommended_tokens_per_slice) + " tokens (margin " +
                     Count(o.margin) + "x, 2 significant digits)");
  } else {
    text += Line("operational intensity", "infinite (nothing crosses DCN)");
  }
  text += "Predicted step: " + StrategyName(e) + "\n";
  text += Line("forward", Seconds(e.forward_seconds));
  text += Line("backward", Seconds(e.backward_seconds));
  if (e.forward_dcn_seconds > 0) {
    text += Line("DCN during forward", Seconds(e.forward_dcn_seconds));
  }
  text += Line("DCN during backward", Seconds(e.backward_dcn_seconds) + " (" +
                                          Bytes(e.dcn_bytes_per_host) +
                                          " per host per step)");
  if (e.strategy == model::DcnStrategy::kPipeline) {
    if (plan.activations_counted) {
      text +=
          Line("activations",
               Seconds(e.activation_seconds) + " each way, in the DCN above (" +
                   Bytes(e.activation_bytes_per_host) + " per host per step)");
      text += Line("fill and drain", Seconds(e.fill_drain_seconds));
    } else {
      text += Line("activations", "not counted (give --emb_dim)");
    }
    text += Line("bubble", Percent(e.bubble_fraction) + " (" +
                               std::to_string(e.pipeline_depth - 1) + " / " +
                               std::to_string(e.pipeline_microbatches +
                                              e.pipeline_depth - 1) +
                               ", GPipe and 1F1B)");
  }
  text += Line("DCN hidden", e.dcn_hidden ? "yes" : "no");
  text +=
      Line("step", Seconds(e.step_seconds) + " with overlap, " +
                       Seconds(e.step_seconds_without_overlap) + " without");
  text += Line("tokens/s", Rounded(std::round(e.tokens_per_second)));
  text +=
      Line("one slice, same batch", Seconds(plan.single_slice_step_seconds));
  text += Line("scaling efficiency", Percent(e.scaling_efficiency));
  text += Line("state per chip",
               GiB(e.state_bytes_per_chip) +
                   (plan.memory_bytes_per_chip > 0
                        ? " of " + GiB(plan.memory_bytes_per_chip) +
                              (e.fits_in_memory ? " (fits)" : " (does not fit)")
                        : " (memory not checked)"));
  if (plan.num_slices > 1) {
    text += "Strategies across " + std::to_string(plan.num_slices) +
            " slices, same global batch (" +
            (plan.activations_counted
                 ? "activations between stages counted, emb_dim " +
                       Count(*o.emb_dim)
                 : std::string("activations between stages not counted: "
                               "give --emb_dim")) +
            ")\n";
    text += StrategyTable(plan);
  }
  const model::Recommendation& r = plan.recommendation;
  text += "Recommendation: " + std::string(model::ToString(r.strategy));
  if (r.strategy == model::DcnStrategy::kPipeline) {
    text += " of depth " + std::to_string(r.pipeline_depth);
  }
  text += " (" + Config(r) + ")\n";
  text += "  " + r.reason + "\n";
  if (r.strategy == model::DcnStrategy::kPipeline) {
    // train: the microbatches divide per_device_batch_size x tensor x stages.
    const int multiple =
        r.num_pipeline_microbatches /
        std::gcd(r.num_pipeline_microbatches, r.pipeline_depth);
    text += "  train needs num_pipeline_microbatches=" +
            std::to_string(r.num_pipeline_microbatches) +
            " to divide per_device_batch_size x ici_tensor_parallelism x " +
            std::to_string(r.pipeline_depth) +
            " (plan does not know per_device_batch_size): make "
            "per_device_batch_size x ici_tensor_parallelism a multiple of " +
            std::to_string(multiple) +
            ", and num_decoder_layers a multiple of " +
            std::to_string(r.pipeline_depth) + ".\n";
  }
  text += "  Never tensor parallelism across slices: DCN is too slow for it.\n";
  return text;
}

// JSON has no infinity: null.
nlohmann::ordered_json Finite(double value) {
  if (!std::isfinite(value)) return nullptr;
  return value;
}

nlohmann::ordered_json EstimateJson(const model::StrategyEstimate& e) {
  nlohmann::ordered_json out;
  out["strategy"] = model::ToString(e.strategy);
  out["pipeline_depth"] = e.pipeline_depth;
  out["data_replicas"] = e.data_replicas;
  out["pipeline_microbatches"] = e.pipeline_microbatches;
  out["parameters_per_slice"] = e.parameters_per_slice;
  out["dcn_bits_per_parameter"] = e.dcn_bits_per_parameter;
  out["backward_dcn_bits_per_parameter"] = e.backward_dcn_bits_per_parameter;
  out["operational_intensity_flops_per_bit"] = Finite(e.operational_intensity);
  out["minimum_tokens_per_slice"] = e.minimum_tokens_per_slice;
  out["recommended_tokens_per_slice"] = e.recommended_tokens_per_slice;
  out["dcn_bytes_per_host"] = e.dcn_bytes_per_host;
  out["forward_seconds"] = e.forward_seconds;
  out["backward_seconds"] = e.backward_seconds;
  out["forward_dcn_seconds"] = e.forward_dcn_seconds;
  out["backward_dcn_seconds"] = e.backward_dcn_seconds;
  out["activation_bytes_per_host"] = e.activation_bytes_per_host;
  out["activation_seconds"] = e.activation_seconds;
  out["fill_drain_seconds"] = e.fill_drain_seconds;
  out["bubble_fraction"] = e.bubble_fraction;
  out["dcn_hidden"] = e.dcn_hidden;
  out["step_seconds"] = e.step_seconds;
  out["step_seconds_without_overlap"] = e.step_seconds_without_overlap;
  out["tokens_per_second"] = e.tokens_per_second;
  out["scaling_efficiency"] = e.scaling_efficiency;
  out["state_bytes_per_chip"] = e.state_bytes_per_chip;
  out["fits_in_memory"] = e.fits_in_memory;
  return out;
}

std::string PrintJson(const model::PerfPlan& plan) {
  const model::PerfModelOptions& o = plan.options;
  nlohmann::ordered_json inputs;
  inputs["accelerator_type"] = plan.type.name;
  inputs["num_slices"] = plan.num_slices;
  inputs["chips_per_slice"] = plan.chips_per_slice;
  inputs["chips_per_host"] = plan.chips_per_host;
  inputs["hosts_per_slice"] = plan.hosts_per_slice;
  inputs["parameters"] = plan.parameters;
  inputs["tokens_per_slice"] = plan.tokens_per_slice;
  inputs["global_batch_tokens"] = plan.global_batch_tokens;
  inputs["peak_flops_per_chip"] = plan.peak_flops_per_chip;
  inputs["peak_flops_per_chip_source"] =
      plan.peak_from_type ? "published" : "given";
  inputs["dcn_bits_per_second_per_host"] = plan.dcn_bits_per_second_per_host;
  inputs["dcn_bandwidth_source"] = plan.dcn_from_type ? "published" : "given";
  inputs["forward_flops_per_token_per_parameter"] =
      o.forward_flops_per_token_per_parameter;
  inputs["backward_flops_per_token_per_parameter"] =
      o.backward_flops_per_token_per_parameter;
  inputs["mfu"] = o.mfu;
  inputs["gradient_bits"] = o.gradient_bits;
  inputs["dcn_volume"] = model::ToString(o.dcn_volume);
  inputs["margin"] = o.margin;
  inputs["strategy"] =
      o.strategy ? std::string(model::ToString(*o.strategy)) : "auto";
  inputs["pipeline_depth"] = o.pipeline_depth;
  inputs["pipeline_microbatches"] = o.pipeline_microbatches;
  inputs["emb_dim"] = o.emb_dim ? nlohmann::ordered_json(*o.emb_dim)
                                : nlohmann::ordered_json(nullptr);
  inputs["memory_bytes_per_chip"] = plan.memory_bytes_per_chip;
  inputs["state_bytes_per_parameter"] = o.state_bytes_per_parameter;

  nlohmann::ordered_json out;
  out["inputs"] = std::move(inputs);
  out["arithmetic_intensity_flops_per_bit"] = plan.arithmetic_intensity;
  out["dcn_bits_per_parameter"] =
      plan.data_parallel.backward_dcn_bits_per_parameter;
  out["operational_intensity_flops_per_bit"] =
      Finite(plan.data_parallel.operational_intensity);
  out["minimum_tokens_per_slice"] = plan.data_parallel.minimum_tokens_per_slice;
  out["recommended_tokens_per_slice"] =
      plan.data_parallel.recommended_tokens_per_slice;
  out["single_slice_step_seconds"] = plan.single_slice_step_seconds;
  out["activations_counted"] = plan.activations_counted;
  out["data_parallel"] = EstimateJson(plan.data_parallel);
  out["strategies"] = nlohmann::ordered_json::array();
  for (const model::StrategyEstimate& e : plan.strategies) {
    out["strategies"].push_back(EstimateJson(e));
  }
  out["estimate"] = EstimateJson(plan.estimate);
  const model::Recommendation& r = plan.recommendation;
  nlohmann::ordered_json rec;
  rec["strategy"] = model::ToString(r.strategy);
  rec["pipeline_depth"] = r.pipeline_depth;
  rec["dcn_data_parallelism"] = r.dcn_data_parallelism;
  rec["dcn_fsdp_parallelism"] = r.dcn_fsdp_parallelism;
  rec["dcn_pipeline_parallelism"] = r.dcn_pipeline_parallelism;
  rec["dcn_tensor_parallelism"] = 1;
  if (r.strategy == model::DcnStrategy::kPipeline) {
    rec["num_pipeline_microbatches"] = r.num_pipeline_microbatches;
    rec["pipeline_parallel_schedule"] = r.pipeline_parallel_schedule;
  }
  rec["keys"] = model::TrainKeys(r);
  rec["reason"] = r.reason;
  out["recommendation"] = std::move(rec);
  return out.dump() + "\n";
}

int RunPlan(const PlanFlags& flags) {
  Result<model::PerfModelOptions> options = ToOptions(flags);
  Result<model::PerfPlan> plan =
      options.ok() ? model::PlanPerformance(*options)
                   : Result<model::PerfPlan>(options.status());
  if (!plan.ok()) {
    std::fprintf(stderr, "multislice plan: %s\n",
                 plan.status().message().c_str());
    return ExitCodeFor(plan.status());
  }
  const std::string text = flags.json ? PrintJson(*plan) : PrintText(*plan);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace

void AddPlanCommand(CLI::App& root, CommandTable& table) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* app = root.add_subcommand(
      "plan",
      "Predict whether multislice training scales (the seed's performance "
      "model): the hardware's arithmetic intensity (chips per host x peak "
      "FLOP/s / DCN bit/s per host), the workload's operational intensity "
      "(backward FLOPs per parameter / DCN bits per parameter), the minimum "
      "and recommended batch per slice, the step time with DCN overlapped, "
      "the scaling efficiency against one slice, a table of data "
      "parallelism, FSDP and pipelines of every depth that divides the "
      "slices (step time, tokens/s, DCN bytes per host, bubble (d-1)/(n+d-1)) "
      "and the strategy to use across slices with the `multislice train` "
      "keys: data parallelism when the batch hides its DCN all-reduce (the "
      "seed: start with pure data parallelism), else the fastest pipeline "
      "when it is predicted faster. Give --emb_dim to count the activations "
      "between pipeline stages. Numbers take K, M, B (or G), T suffixes.");
  app->footer(
      "Examples:\n"
      "  multislice plan --accelerator_type v4-16 --num_slices 2 "
      "--parameters 16e9 --tokens_per_slice 350000\n"
      "  multislice plan --accelerator_type v4-16 --num_slices 8 "
      "--parameters 16B --global_batch_tokens 5.6M --json\n"
      "  multislice plan --accelerator_type v5litepod-16 --num_slices 2 "
      "--model_name llama2-7b --tokens_per_slice 1M\n"
      "  multislice plan --accelerator_type cpu-2 --num_slices 2 "
      "--parameters 100M --tokens_per_slice 4k --peak_flops_per_chip 50e9 "
      "--dcn_gbps_per_host 10\n"
      "  multislice plan --accelerator_type cpu-1 --num_slices 2 "
      "--parameters 1.2e7 --tokens_per_slice 256 --peak_flops_per_chip 1e11 "
      "--dcn_gbps_per_host 1 --emb_dim 256");
  AddStringFlag(app, "accelerator_type", &flags->accelerator_type,
                "Required: v4-N, v5p-N, v5litepod-N, v6e-N, or cpu-N (then "
                "--peak_flops_per_chip and --dcn_gbps_per_host are "
                "required).");
  AddIntFlag(app, "num_slices", &flags->num_slices,
             "Number of slices (1 to 256), all of the accelerator type.");
  AddCountFlag(app, "parameters", &flags->parameters,
               "Model parameters P (e.g. 16e9, 16B); this or --model_name "
               "is required.");
  AddStringFlag(app, "model_name", &flags->model_name,
                "A MaxText model file (configs/models/NAME.yml, e.g. "
                "llama2-7b, mistral-7b, gemma-2b, or a path): its parameters "
                "as train lays them out, and its emb_dim unless --emb_dim is "
                "given.");
  AddCountFlag(app, "tokens_per_slice", &flags->tokens_per_slice,
               "Tokens per slice per step B (global / num_slices); this or "
               "--global_batch_tokens is required.");
  AddCountFlag(app, "global_batch_tokens", &flags->global_batch_tokens,
               "Tokens per step over all slices (num_slices x B).");
  AddCountFlag(app, "peak_flops_per_chip", &flags->peak_flops_per_chip,
               "Peak FLOP/s per chip (device); default the type's published "
               "bf16 figure; required for cpu-N: `multislice peak` measures "
               "it in GFLOP/s (50 GFLOP/s: 50G).",
               "type's");
  AddCountFlag(app, "dcn_gbps_per_host", &flags->dcn_gbps_per_host,
               "DCN bandwidth per host in Gbit/s; default the type's "
               "published figure; required for cpu-N.",
               "type's");
  AddCountFlag(app, "forward_flops_per_token_per_parameter",
               &flags->forward_flops,
               "FLOPs per token per parameter in the forward pass.", "2");
  AddCountFlag(app, "backward_flops_per_token_per_parameter",
               &flags->backward_flops,
               "FLOPs per token per parameter in the backward pass (6 with "
               "full rematerialisation).",
               "4");
  AddCountFlag(app, "mfu", &flags->mfu,
               "Assumed model FLOP utilisation for step times, in (0, 1].",
               "1");
  AddStringFlag(app, "gradient_dtype", &flags->gradient_dtype,
                "What crosses DCN per value: f32 (32 bits, the seed's "
                "figure) or bf16.");
  AddStringFlag(app, "dcn_volume", &flags->dcn_volume,
                "All-reduce volume: seed (1x the gradients with two slices, "
                "2x with more, the seed's bound) or ring (2(m-1)/m).");
  AddCountFlag(app, "margin", &flags->margin,
               "Safety factor on the minimum batch (the seed: 2x, because "
               "DCN can briefly drop packets).",
               "2");
  AddStringFlag(app, "strategy", &flags->strategy,
                "Strategy to predict: auto (the recommended one), dcn_data, "
                "dcn_fsdp or pipeline.");
  AddIntFlag(app, "pipeline_depth", &flags->pipeline_depth,
             "Slices per pipeline for the predicted step; implies --strategy "
             "pipeline (0: the fastest depth, which is the seed's rule: "
             "depth 2, 4, ... until DCN hides).");
  AddIntFlag(app, "pipeline_microbatches", &flags->pipeline_microbatches,
             "Microbatches per pipeline step, the recommended "
             "num_pipeline_microbatches (0: 4 x depth). train needs it to "
             "divide per_device_batch_size x ici_tensor_parallelism x depth, "
             "which plan cannot check: it does not know "
             "per_device_batch_size.");
  AddCountFlag(app, "emb_dim", &flags->emb_dim,
               "The model width (MaxText's emb_dim, alias --base_emb_dim): "
               "counts the activations and their gradients (f32) that a "
               "pipeline sends between stages over DCN; without it they are "
               "not counted.",
               "", "base_emb_dim");
  CLI::Option* memory = AddSizeFlag(
      app, "memory_per_chip", &flags->memory_per_chip,
      "Memory per chip for the training state (e.g. 32GiB); default the "
      "type's HBM, not checked for cpu-N.");
  memory->default_str("type's");
  AddCountFlag(app, "state_bytes_per_parameter",
               &flags->state_bytes_per_parameter,
               "Training-state bytes per parameter (f32 weights, gradients "
               "and two Adam moments).",
               "16");
  AddBoolFlag(app, "json", &flags->json,
              "Print one JSON object with every input and output.");
  table[app] = [flags, memory] {
    flags->memory_given = memory->count() > 0;
    return RunPlan(*flags);
  };
}

}  // namespace multislice::cli
