// The multislice performance model: the formulas of perf_model.h, input
// checks, and the strategy rule (10.).
#include "model/perf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace multislice::model {
namespace {

// The most slices one queued resource may hold.
constexpr int kMaxSlices = 256;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Bits of each activation value sent between pipeline stages (train: f32).
constexpr double kActivationBits = 32;

// A number as a user would type it: "0", "-1", "1.6e+10", "0.5".
std::string Number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.10g", value);
  return text;
}

// Tokens as "350,000" (whole numbers) or "%.4g" for the rest.
std::string Tokens(double value) {
  if (!(value >= 0 && value < 1e15 && value == std::floor(value))) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.4g", value);
    return text;
  }
  std::string digits = std::to_string(static_cast<long long>(value));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string GigaBytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", bytes / kGiB);
  return text;
}

bool Positive(double value) { return std::isfinite(value) && value > 0; }

Status NotPositive(const std::string& flag, double value) {
  return InvalidArgument("--" + flag + " must be a positive number, got " +
                         Number(value));
}

Status CheckOptions(const PerfModelOptions& o) {
  if (o.num_slices < 1 || o.num_slices > kMaxSlices) {
    return InvalidArgument("--num_slices must be from 1 to " +
                           std::to_string(kMaxSlices) + ", got " +
                           std::to_string(o.num_slices));
  }
  if (!Positive(o.parameters)) return NotPositive("parameters", o.parameters);
  if (!o.tokens_per_slice && !o.global_batch_tokens) {
    return InvalidArgument(
        "--tokens_per_slice or --global_batch_tokens is required (the batch "
        "in tokens, e.g. --tokens_per_slice 350k)");
  }
  if (o.tokens_per_slice && !Positive(*o.tokens_per_slice)) {
    return NotPositive("tokens_per_slice", *o.tokens_per_slice);
  }
  if (o.global_batch_tokens && !Positive(*o.global_batch_tokens)) {
    return NotPositive("global_batch_tokens", *o.global_batch_tokens);
  }
  if (o.tokens_per_slice && o.global_batch_tokens) {
    const double expected = *o.tokens_per_slice * o.num_slices;
    if (std::fabs(*o.global_batch_tokens - expected) > 1e-9 * expected) {
      return InvalidArgument(
          "--global_batch_tokens " + Number(*o.global_batch_tokens) +
          " does not equal --tokens_per_slice " + Number(*o.tokens_per_slice) +
          " times --num_slices " + std::to_string(o.num_slices) + " (" +
          Number(expected) + "); give one of them");
    }
  }
  if (o.peak_flops_per_chip && !Positive(*o.peak_flops_per_chip)) {
    return NotPositive("peak_flops_per_chip", *o.peak_flops_per_chip);
  }
  if (o.dcn_gbps_per_host && !Positive(*o.dcn_gbps_per_host)) {
    return NotPositive("dcn_gbps_per_host", *o.dcn_gbps_per_host);
  }
  if (!std::isfinite(o.forward_flops_per_token_per_parameter) ||
      o.forward_flops_per_token_per_parameter < 0) {
    return InvalidArgument(
        "--forward_flops_per_token_per_parameter must be zero or positive, "
        "got " +
        Number(o.forward_flops_per_token_per_parameter));
  }
  if (!Positive(o.backward_flops_per_token_per_parameter)) {
    return NotPositive("backward_flops_per_token_per_parameter",
                       o.backward_flops_per_token_per_parameter);
  }
  if (!(o.mfu > 0 && o.mfu <= 1)) {
    return InvalidArgument("--mfu must be in (0, 1], got " + Number(o.mfu));
  }
  if (o.gradient_bits != 32 && o.gradient_bits != 16) {
    return InvalidArgument(
        "gradient bits must be 32 (float32) or 16 (bfloat16), got " +
        std::to_string(o.gradient_bits));
  }
  if (!(std::isfinite(o.margin) && o.margin >= 1)) {
    return InvalidArgument("--margin must be at least 1, got " +
                           Number(o.margin));
  }
  if (o.pipeline_depth != 0) {
    if (o.pipeline_depth < 2 || o.pipeline_depth > o.num_slices ||
        o.num_slices % o.pipeline_depth != 0) {
      return InvalidArgument(
          "--pipeline_depth must be 0 (the fastest depth) or a divisor of "
          "--num_slices " +
          std::to_string(o.num_slices) + " from 2 to " +
          std::to_string(o.num_slices) + ", got " +
          std::to_string(o.pipeline_depth));
    }
    if (o.strategy != DcnStrategy::kPipeline) {
      return InvalidArgument("--pipeline_depth " +
                             std::to_string(o.pipeline_depth) +
                             " needs --strategy pipeline");
    }
  }
  if (o.strategy == DcnStrategy::kPipeline && o.num_slices < 2) {
    return InvalidArgument(
        "--strategy pipeline needs at least 2 slices, got --num_slices " +
        std::to_string(o.num_slices));
  }
  if (o.pipeline_microbatches < 0) {
    return InvalidArgument(
        "--pipeline_microbatches must be 0 (4 x depth) or positive, got " +
        std::to_string(o.pipeline_microbatches));
  }
  if (o.emb_dim && !(Positive(*o.emb_dim) && *o.emb_dim < 1e9 &&
                     *o.emb_dim == std::floor(*o.emb_dim))) {
    return InvalidArgument(
        "--emb_dim must be a positive whole number (the model width), got " +
        Number(*o.emb_dim));
  }
  if (o.memory_bytes_per_chip && !Positive(*o.memory_bytes_per_chip)) {
    return NotPositive("memory_per_chip", *o.memory_bytes_per_chip);
  }
  if (!Positive(o.state_bytes_per_parameter)) {
    return NotPositive("state_bytes_per_parameter",
                       o.state_bytes_per_parameter);
  }
  return OkStatus();
}

// The prediction of 7. to 9. in perf_model.h for one strategy.
StrategyEstimate Estimate(const PerfPlan& plan, DcnStrategy strategy, int depth,
                          int microbatches) {
  const PerfModelOptions& o = plan.options;
  const double p = plan.parameters;
  const double b = plan.tokens_per_slice;
  const int m = plan.num_slices;
  StrategyEstimate e;
  e.strategy = strategy;
  e.pipeline_depth = strategy == DcnStrategy::kPipeline ? depth : 1;
  e.data_replicas = m / e.pipeline_depth;
  e.pipeline_microbatches =
      strategy == DcnStrategy::kPipeline
          ? (microbatches > 0 ? microbatches : 4 * e.pipeline_depth)
          : 1;
  e.parameters_per_slice = p / e.pipeline_depth;

  // What crosses DCN per parameter held, in each pass.
  const double all_reduce_bits =
      o.gradient_bits * AllReduceFactor(e.data_replicas, o.dcn_volume);
  double forward_bits = 0;
  double backward_bits = all_reduce_bits;
  if (strategy == DcnStrategy::kFsdp) {
    // All-gather of the weights (half an all-reduce) in the forward pass;
    // all-gather again plus reduce-scatter of the gradients in the backward.
    forward_bits = all_reduce_bits / 2;
  }
  e.dcn_bits_per_parameter = forward_bits + backward_bits;
  e.backward_dcn_bits_per_parameter = backward_bits;

  // Every token of the pipeline's batch (depth * b) passes through the
  // parameters a slice holds.
  const double tokens_per_pipeline = b * e.pipeline_depth;
  e.operational_intensity = backward_bits > 0
                                ? o.backward_flops_per_token_per_parameter *
                                      tokens_per_pipeline / backward_bits
                                : kInfinity;
  const double minimum_per_pipeline =
      MinimumBatchTokens(plan.arithmetic_intensity, backward_bits,
                         o.backward_flops_per_token_per_parameter);
  e.minimum_tokens_per_slice = minimum_per_pipeline / e.pipeline_depth;
  e.recommended_tokens_per_slice =
      RecommendedBatchTokens(minimum_per_pipeline, o.margin) / e.pipeline_depth;

  // Compute of one slice: b * p FLOPs per FLOP-per-token-per-parameter (a
  // pipeline stage sees depth * b tokens on p / depth parameters), stretched
  // by the pipeline bubble.
  const double flops_per_second =
      plan.chips_per_slice * plan.peak_flops_per_chip * o.mfu;
  const int n = e.pipeline_microbatches, d = e.pipeline_depth;
  const double bubble = (n + d - 1.0) / n;
  e.bubble_fraction = (d - 1.0) / (n + d - 1.0);
  e.forward_seconds = o.forward_flops_per_token_per_parameter * b * p /
                      flops_per_second * bubble;
  e.backward_seconds = o.backward_flops_per_token_per_parameter * b * p /
                       flops_per_second * bubble;

  // Two-level collectives: each host moves its 1/H share over DCN.
  const double dcn_rate =
      plan.hosts_per_slice * plan.dcn_bits_per_second_per_host;
  e.forward_dcn_seconds = forward_bits * e.parameters_per_slice / dcn_rate;
  e.backward_dcn_seconds = backward_bits * e.parameters_per_slice / dcn_rate;
  e.dcn_bytes_per_host = e.dcn_bits_per_parameter * e.parameters_per_slice /
                         plan.hosts_per_slice / 8;
  if (d > 1 && o.emb_dim) {
    // 9.: one direction's activations of a step, each host its 1/H of the
    // rows: forward in the forward pass, gradients in the backward pass.
    const double bits = kActivationBits * tokens_per_pipeline * *o.emb_dim;
    e.activation_seconds = bits / dcn_rate;
    e.activation_bytes_per_host =
        std::min(d - 1, 2) * bits / plan.hosts_per_slice / 8;
    e.fill_drain_seconds = (d - 1) * 2 * e.activation_seconds / n;
    e.forward_dcn_seconds += e.activation_seconds;
    e.backward_dcn_seconds += e.activation_seconds;
    e.dcn_bytes_per_host += e.activation_bytes_per_host;
  }
  e.dcn_hidden = e.forward_dcn_seconds <= e.forward_seconds &&
                 e.backward_dcn_seconds <= e.backward_seconds;
  e.step_seconds = std::max(e.forward_seconds, e.forward_dcn_seconds) +
                   std::max(e.backward_seconds, e.backward_dcn_seconds) +
                   e.fill_drain_seconds;
  e.step_seconds_without_overlap = e.forward_seconds + e.backward_seconds +
                                   e.forward_dcn_seconds +
                                   e.backward_dcn_seconds;
  e.tokens_per_second = plan.global_batch_tokens / e.step_seconds;
  e.scaling_efficiency = plan.single_slice_step_seconds / e.step_seconds;

  const double parameters_stored =
      strategy == DcnStrategy::kFsdp ? p / m : e.parameters_per_slice;
  e.state_bytes_per_chip =
      o.state_bytes_per_parameter * parameters_stored / plan.chips_per_slice;
  e.fits_in_memory = plan.memory_bytes_per_chip <= 0 ||
                     e.state_bytes_per_chip <= plan.memory_bytes_per_chip;
  return e;
}

// Seconds for a reason sentence, 3 significant digits: "1440 s", "5.9 s",
// "445 ms", "1.05 ms", "12.3 us".
std::string SecondsText(double seconds) {
  char text[32];
  if (seconds >= 100) {
    std::snprintf(text, sizeof(text), "%.0f s", seconds);
  } else if (seconds >= 1) {
    std::snprintf(text, sizeof(text), "%.3g s", seconds);
  } else if (seconds >= 1e-3) {
    std::snprintf(text, sizeof(text), "%.3g ms", seconds * 1e3);
  } else {
    std::snprintf(text, sizeof(text), "%.3g us", seconds * 1e6);
  }
  return text;
}

std::string PercentText(double fraction) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f%%", 100 * fraction);
  return text;
}

// "0.445 s per step (1,149 tokens/s)".
std::string StepText(const StrategyEstimate& e) {
  return SecondsText(e.step_seconds) + " per step (" +
         Tokens(std::round(e.tokens_per_second)) + " tokens/s)";
}

// The pipeline predicted fastest (the shallowest of equals) among those
// whose state fits, or among all when none fits; nullptr with one slice.
const StrategyEstimate* FastestPipeline(const PerfPlan& plan) {
  const StrategyEstimate* best = nullptr;
  bool best_fits = false;
  for (const StrategyEstimate& e : plan.strategies) {
    if (e.strategy != DcnStrategy::kPipeline) continue;
    if (best == nullptr || (e.fits_in_memory && !best_fits) ||
        (e.fits_in_memory == best_fits &&
         e.step_seconds < best->step_seconds)) {
      best = &e;
      best_fits = e.fits_in_memory;
    }
  }
  return best;
}

// "a pipeline of depth 2 (1 data-parallel replica, 8 microbatches, bubble
// 11.1%)".
std::string PipelineText(const StrategyEstimate& e) {
  return "a pipeline of depth " + std::to_string(e.pipeline_depth) + " (" +
         std::to_string(e.data_replicas) +
         (e.data_replicas == 1 ? " data-parallel replica, "
                               : " data-parallel replicas, ") +
         std::to_string(e.pipeline_microbatches) + " microbatches, bubble " +
         PercentText(e.bubble_fraction) + ")";
}

// What crosses DCN in a pipeline, for the reason.
std::string PipelineDcnText(const PerfPlan& plan, const StrategyEstimate& e) {
  std::string text;
  if (e.data_replicas > 1) {
    text = "the gradient all-reduce of its " + std::to_string(e.data_replicas) +
           " replicas needs " +
           Tokens(e.recommended_tokens_per_slice * e.pipeline_depth) +
           " tokens per pipeline with the margin, it has " +
           Tokens(plan.tokens_per_slice * e.pipeline_depth);
  } else {
    text = "no gradient all-reduce crosses DCN";
  }
  if (plan.activations_counted) {
    text += "; the activations and their gradients take " +
            SecondsText(e.activation_seconds) + " each way per step (" +
            (e.dcn_hidden ? "hidden" : "not all hidden") + ") and " +
            SecondsText(e.fill_drain_seconds) + " in the fill and drain";
  } else {
    text +=
        "; the activations between stages are not counted (give "
        "--emb_dim)";
  }
  return text;
}

void SetPipeline(const StrategyEstimate& pipe, Recommendation& r) {
  r.strategy = DcnStrategy::kPipeline;
  r.pipeline_depth = pipe.pipeline_depth;
  r.dcn_pipeline_parallelism = pipe.pipeline_depth;
  r.dcn_data_parallelism = pipe.data_replicas;
  r.num_pipeline_microbatches = pipe.pipeline_microbatches;
  r.pipeline_parallel_schedule = "1F1B";
}

constexpr char kSeedsCaution[] =
    " The seed: first check whether a larger batch hurts convergence, since "
    "FSDP tends to reach a higher MFU.";

Recommendation Recommend(const PerfPlan& plan) {
  const PerfModelOptions& o = plan.options;
  const int m = plan.num_slices;
  const double b = plan.tokens_per_slice;
  Recommendation r;
  if (m == 1) {
    r.reason =
        "One slice: nothing crosses DCN, so every dcn_* parallelism value "
        "stays 1.";
    return r;
  }
  const StrategyEstimate& dp = plan.data_parallel;
  const StrategyEstimate& fsdp = plan.strategies[1];
  const StrategyEstimate& pipe = *FastestPipeline(plan);
  const std::string given = "The batch of " + Tokens(b) + " tokens per slice";
  const std::string minimum =
      "the minimum " + Tokens(dp.minimum_tokens_per_slice) +
      " at which the backward pass hides data parallelism's DCN all-reduce";
  const std::string margin = "the recommended " +
                             Tokens(dp.recommended_tokens_per_slice) +
                             " (the seed's margin of " + Number(o.margin) +
                             ", because DCN can briefly drop packets)";
  const std::string versus = "the fastest pipeline, depth " +
                             std::to_string(pipe.pipeline_depth) + ", " +
                             StepText(pipe) + " with a bubble of " +
                             PercentText(pipe.bubble_fraction);
  if (dp.fits_in_memory && b >= dp.minimum_tokens_per_slice) {
    r.strategy = DcnStrategy::kData;
    r.dcn_data_parallelism = m;
    if (b >= dp.recommended_tokens_per_slice) {
      r.reason = given + " reaches " + margin + ": start with pure data " +
                 "parallelism across slices, as the seed recommends. It is " +
                 "predicted at " + StepText(dp) + "; " + versus + ".";
    } else {
      r.reason = given + " reaches " + minimum + " but not " + margin +
                 ": data parallelism is still predicted fastest at " +
                 StepText(dp) + "; " + versus +
                 ". Grow the batch to the recommended size if convergence "
                 "allows.";
    }
    return r;
  }
  const std::string memory_note =
      "a full replica of the training state needs " +
      GigaBytes(dp.state_bytes_per_chip) + " per chip, more than the " +
      GigaBytes(plan.memory_bytes_per_chip) + " per chip";
  if (!dp.fits_in_memory) {
    if (b >= fsdp.recommended_tokens_per_slice) {
      r.strategy = DcnStrategy::kFsdp;
      r.dcn_fsdp_parallelism = m;
      r.reason = given + " reaches " + margin + ", but " + memory_note +
                 ": FSDP across slices divides it by " + std::to_string(m) +
                 " (" + GigaBytes(fsdp.state_bytes_per_chip) +
                 " per chip) for 1.5x the DCN traffic of data parallelism, " +
                 StepText(fsdp) + ".";
      if (!fsdp.fits_in_memory) {
        r.reason += " That still does not fit: use larger slices.";
      }
      return r;
    }
    SetPipeline(pipe, r);
    r.reason =
        given + " is below the " + Tokens(fsdp.recommended_tokens_per_slice) +
        " that FSDP across slices needs to hide its DCN traffic, "
        "and " +
        memory_note + ": " + PipelineText(pipe) + " holds 1/" +
        std::to_string(pipe.pipeline_depth) + " of the model per slice (" +
        GigaBytes(pipe.state_bytes_per_chip) + " per chip), " + StepText(pipe) +
        "; " + PipelineDcnText(plan, pipe) + ".";
    if (!pipe.fits_in_memory) {
      r.reason += " The state still does not fit: use larger slices.";
    }
    r.reason += kSeedsCaution;
    return r;
  }
  // Below the minimum: data parallelism's all-reduce is exposed.
  const std::string below =
      given + " is below " + minimum + " (" +
      Tokens(dp.recommended_tokens_per_slice) +
      " with the seed's margin): data parallelism is predicted at " +
      StepText(dp) + ", its all-reduce " +
      SecondsText(dp.backward_dcn_seconds) + " against a backward pass of " +
      SecondsText(dp.backward_seconds) + ". ";
  if (pipe.step_seconds < dp.step_seconds) {
    SetPipeline(pipe, r);
    char speedup[32];
    std::snprintf(speedup, sizeof(speedup), "%.3gx",
                  dp.tokens_per_second > 0
                      ? pipe.tokens_per_second / dp.tokens_per_second
                      : 0.0);
    r.reason =
        below + "The fastest of the pipelines, " + PipelineText(pipe) +
        ", is predicted at " + StepText(pipe) + ", " + speedup +
        " the tokens/s of data parallelism: " + PipelineDcnText(plan, pipe) +
        "." + kSeedsCaution;
    return r;
  }
  r.strategy = DcnStrategy::kData;
  r.dcn_data_parallelism = m;
  r.reason = below + "No pipeline is predicted faster: " + versus + "; " +
             PipelineDcnText(plan, pipe) +
             ". Keep data parallelism, and grow the batch towards the "
             "recommended size if convergence allows.";
  return r;
}

}  // namespace

std::string_view ToString(DcnStrategy strategy) {
  switch (strategy) {
    case DcnStrategy::kData:
      return "dcn_data";
    case DcnStrategy::kFsdp:
      return "dcn_fsdp";
    case DcnStrategy::kPipeline:
      return "pipeline";
  }
  return "?";
}

Result<DcnStrategy> ParseDcnStrategy(std::string_view name) {
  for (DcnStrategy s :
       {DcnStrategy::kData, DcnStrategy::kFsdp, DcnStrategy::kPipeline}) {
    if (name == ToString(s)) return s;
  }
  return InvalidArgument("--strategy: '" + std::string(name) +
                         "' is not one of dcn_data, dcn_fsdp, pipeline");
}

std::string_view ToString(DcnVolume volume) {
  return volume == DcnVolume::kSeed ? "seed" : "ring";
}

Result<DcnVolume> ParseDcnVolume(std::string_view name) {
  if (name == "seed") return DcnVolume::kSeed;
  if (name == "ring") return DcnVolume::kRing;
  return InvalidArgument("--dcn_volume: '" + std::string(name) +
                         "' is not one of seed, ring");
}

double AllReduceFactor(int participants, DcnVolume volume) {
  if (participants <= 1) return 0;
  if (volume == DcnVolume::kSeed) return participants == 2 ? 1.0 : 2.0;
  return 2.0 * (participants - 1) / participants;
}

double ArithmeticIntensity(int chips_per_host, double peak_flops_per_chip,
                           double dcn_bits_per_second_per_host) {
  return chips_per_host * peak_flops_per_chip / dcn_bits_per_second_per_host;
}

double MinimumBatchTokens(double arithmetic_intensity,
                          double dcn_bits_per_parameter,
                          double backward_flops_per_token_per_parameter) {
  return arithmetic_intensity * dcn_bits_per_parameter /
         backward_flops_per_token_per_parameter;
}

double RecommendedBatchTokens(double minimum_tokens, double margin) {
  return std::max(minimum_tokens,
                  RoundToSignificantDigits(margin * minimum_tokens, 2));
}

double RoundToSignificantDigits(double value, int digits) {
  if (value == 0 || !std::isfinite(value)) return value;
  const int exponent =
      static_cast<int>(std::floor(std::log10(std::fabs(value))));
  const double unit = std::pow(10.0, exponent - digits + 1);
  return std::round(value / unit) * unit;
}

double MemoryBytesPerChip(std::string_view family) {
  if (family == "v4") return 32 * kGiB;
  if (family == "v5p") return 95 * kGiB;
  if (family == "v5litepod") return 16 * kGiB;
  if (family == "v6e") return 32 * kGiB;
  return 0;
}

std::vector<std::string> TrainKeys(const Recommendation& r) {
  std::vector<std::string> keys = {
      "dcn_data_parallelism=" + std::to_string(r.dcn_data_parallelism),
      "dcn_fsdp_parallelism=" + std::to_string(r.dcn_fsdp_parallelism),
      "dcn_pipeline_parallelism=" + std::to_string(r.dcn_pipeline_parallelism),
      "dcn_tensor_parallelism=1"};
  if (r.strategy == DcnStrategy::kPipeline) {
    keys.push_back("num_pipeline_microbatches=" +
                   std::to_string(r.num_pipeline_microbatches));
    keys.push_back("pipeline_parallel_schedule=" +
                   r.pipeline_parallel_schedule);
  }
  return keys;
}

Result<PerfPlan> PlanPerformance(const PerfModelOptions& options) {
  if (options.accelerator_type.empty()) {
    return InvalidArgument(
        "--accelerator_type is required (e.g. v4-16, or cpu-4 with "
        "--peak_flops_per_chip and --dcn_gbps_per_host)");
  }
  PerfPlan plan;
  ASSIGN_OR_RETURN(plan.type,
                   mesh::ParseAcceleratorType(options.accelerator_type));
  RETURN_IF_ERROR(CheckOptions(options));
  plan.options = options;
  plan.num_slices = options.num_slices;
  plan.chips_per_slice = plan.type.devices_per_slice();
  plan.chips_per_host = plan.type.devices_per_host();
  plan.hosts_per_slice = plan.type.hosts_per_slice();
  plan.parameters = options.parameters;
  plan.tokens_per_slice =
      options.tokens_per_slice
          ? *options.tokens_per_slice
          : *options.global_batch_tokens / options.num_slices;
  plan.global_batch_tokens = plan.tokens_per_slice * options.num_slices;

  if (options.peak_flops_per_chip) {
    plan.peak_flops_per_chip = *options.peak_flops_per_chip;
  } else if (plan.type.peak_bf16_flops_per_chip > 0) {
    plan.peak_flops_per_chip = plan.type.peak_bf16_flops_per_chip;
    plan.peak_from_type = true;
  } else {
    return InvalidArgument(
        "--peak_flops_per_chip is required for " + plan.type.name +
        " (a CPU has no published peak; measure it with `multislice peak`)");
  }
  if (options.dcn_gbps_per_host) {
    plan.dcn_bits_per_second_per_host = *options.dcn_gbps_per_host * 1e9;
  } else if (plan.type.dcn_bits_per_second_per_host > 0) {
    plan.dcn_bits_per_second_per_host = plan.type.dcn_bits_per_second_per_host;
    plan.dcn_from_type = true;
  } else {
    return InvalidArgument("--dcn_gbps_per_host is required for " +
                           plan.type.name +
                           " (measure it with `multislice bench collectives` "
                           "--paths dcn)");
  }
  plan.memory_bytes_per_chip = options.memory_bytes_per_chip
                                   ? *options.memory_bytes_per_chip
                                   : MemoryBytesPerChip(plan.type.family);

  plan.arithmetic_intensity =
      ArithmeticIntensity(plan.chips_per_host, plan.peak_flops_per_chip,
                          plan.dcn_bits_per_second_per_host);
  plan.single_slice_step_seconds =
      (options.forward_flops_per_token_per_parameter +
       options.backward_flops_per_token_per_parameter) *
      plan.tokens_per_slice * plan.parameters /
      (plan.chips_per_slice * plan.peak_flops_per_chip * options.mfu);
  plan.activations_counted = options.emb_dim.has_value();
  plan.data_parallel = Estimate(plan, DcnStrategy::kData, 1, 0);
  plan.strategies.push_back(plan.data_parallel);
  if (plan.num_slices > 1) {
    plan.strategies.push_back(Estimate(plan, DcnStrategy::kFsdp, 1, 0));
    for (int depth = 2; depth <= plan.num_slices; ++depth) {
      if (plan.num_slices % depth != 0) continue;
      plan.strategies.push_back(Estimate(plan, DcnStrategy::kPipeline, depth,
                                         options.pipeline_microbatches));
    }
  }
  plan.recommendation = Recommend(plan);

  const DcnStrategy strategy =
      options.strategy ? *options.strategy : plan.recommendation.strategy;
  int depth = 1;
  if (strategy == DcnStrategy::kPipeline) {
    depth = options.pipeline_depth > 0 ? options.pipeline_depth
                                       : FastestPipeline(plan)->pipeline_depth;
  }
  plan.estimate =
      Estimate(plan, strategy, depth, options.pipeline_microbatches);
  return plan;
}

}  // namespace multislice::model
