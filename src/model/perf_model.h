// The multislice performance model (spec 3.5; the seed's section "Como
// otimizar o treinamento"): will the cross-slice (DCN) traffic of a training
// step hide under its compute, what batch per slice that needs, what a step
// costs, and which strategy to use across slices.
//
// Everything here is arithmetic on the inputs: nothing runs, so TPU types
// plan as well as cpu-N (for which the caller gives the measured peak FLOP/s
// and DCN bandwidth). Thread-compatible: pure functions only.
//
// Symbols: m slices; c chips per slice, h chips per host, H = c / h hosts
// per slice; F peak FLOP/s per chip; N DCN bit/s per host; P parameters;
// B tokens per slice per step (global batch = m * B); u the assumed model
// FLOP utilisation (MFU); g bits of each gradient (32 for f32, 16 for bf16).
//
// 1. Hardware arithmetic intensity (FLOP per DCN bit), per host:
//      AI = h * F / N
//    Seed: "Cada chip da TPU v4 tem um desempenho máximo de 275 * 10¹² FLOPS
//    por segundo. Há quatro chips por host de TPU, e cada host tem uma
//    largura de banda de rede máxima de 50 Gbps. Isso significa que a
//    intensidade aritmética é 4 * 275 * 10¹² FLOPS/50 Gbps = 22.000
//    FLOPS/bit."
//
// 2. FLOPs: "o número de FLOPS necessários para uma passagem direta e uma
//    reversa é aproximadamente 6 * B * P ... O número de FLOPS por parâmetro
//    é 6 * B, e o número de FLOPS por parâmetro durante a passagem reversa é
//    4 * B." We take 2 (forward) + 4 (backward) FLOPs per token per
//    parameter, both adjustable (e.g. 2 + 6 with full rematerialisation).
//
// 3. DCN bits per parameter per step (data parallelism across slices):
//      bits = g * A(m)
//    where A is the all-reduce volume factor. Seed: "O modelo vai usar de 32
//    a 64 bits de largura de banda da DCN para cada parâmetro por etapa. Se
//    você usar duas frações, o modelo vai usar 32 bits ... Se você usar mais
//    de duas frações, o compilador vai realizar uma operação all-reduce
//    aleatória e usar até 64 bits".
//    Derivation: gradients are all-reduced in f32 (g = 32). A bandwidth-
//    optimal (ring) all-reduce among m participants is a reduce-scatter
//    followed by an all-gather, each sending (m - 1) / m of the data, so
//    every participant sends A(m) = 2 (m - 1) / m times the gradient: with
//    two slices that is exactly 1 x 32 = 32 bits per parameter, and it grows
//    towards 2 x 32 = 64 bits as m grows. The seed plans with the bound:
//    DcnVolume::kSeed takes A = 1 for m = 2 and A = 2 for m > 2 (what
//    reproduces its 176k..352k); DcnVolume::kRing takes the exact 2 (m-1)/m.
//    A reduce-scatter or all-gather alone is half of A.
//    The two-level algorithm (spec 3.4) reduce-scatters inside the slice
//    first, so each host moves only its 1/H share over DCN:
//      DCN seconds = bits * P / (H * N)
//
// 4. Operational intensity of the workload (FLOP per DCN bit):
//      OI = (backward FLOPs per parameter per slice) / bits = 4 B / bits
//    Seed: "Operational Intensity = FLOPSbackwards_pass / DCN bandwidth ...
//    se você usar duas frações: Operational intensity = 4 * B / 32. Se você
//    usar mais de duas frações: Operational intensity = 4 * B/64."
//    The backward pass of a slice takes 4 B P / (c F) seconds and the DCN
//    all-reduce bits * P / (H N), so DCN hides under the backward pass
//    exactly when OI >= AI ("verifique se a intensidade operacional excede a
//    intensidade aritmética do hardware").
//
// 5. Minimum batch per slice: OI >= AI  <=>  B >= AI * bits / 4.
//    v4: 22,000 * 32 / 4 = 176,000 (two slices); 22,000 * 64 / 4 = 352,000
//    (more). Seed: "Isso sugere um tamanho mínimo de lote entre 176 mil e
//    352 mil".
//
// 6. Recommended batch per slice, with the seed's margin: "Como a rede DCN
//    pode descartar pacotes brevemente, é melhor manter uma margem de erro
//    significativa, implantando o paralelismo de dados somente se o tamanho
//    do lote por pod for de pelo menos 350 mil (dois pods) a 700 mil (muitos
//    pods)." 350k and 700k are 2 x 176k = 352k and 2 x 352k = 704k rounded
//    to two significant digits, so:
//      recommended = max(minimum, round_2_significant(margin * minimum)),
//    margin 2 by default.
//
// 7. Step time (u scales the peak; u = 1 reproduces the seed's bound):
//      forward = 2 B P / (c F u), backward = 4 B P / (c F u)
//      step    = max(forward, DCN during forward)
//              + max(backward, DCN during backward)   (transfers overlap)
//              (+ a pipeline's fill and drain, 9.)
//      step without overlap = forward + backward + all DCN
//      one slice with the same per-slice batch: forward + backward
//      scaling efficiency = one-slice step / step
//    Seed: "o tempo necessário para executar a operação all-reduce na DCN
//    deve ser menor que o tempo necessário para executar a passagem
//    reversa."
//
// 8. Strategies across slices (spec 3.2, 3.4; the seed's "Fragmentação com
//    várias frações"):
//    - dcn_tensor_parallelism: never ("Não recomendamos ... paralelismo de
//      tensores, porque isso exige muita largura de banda entre frações").
//    - dcn_data (m replicas): the all-reduce of 3. "Recomendamos começar com
//      o paralelismo de dados puro."
//    - dcn_fsdp (weights sharded over m slices): weights all-gathered in the
//      forward pass and again in the backward pass, gradients
//      reduce-scattered: g * A/2 bits per parameter in the forward pass and
//      g * A in the backward pass, so the same batch rule as dcn_data ("é
//      possível determinar se a carga de trabalho do FSDP é limitada pelo
//      desempenho da DCN da forma descrita na seção anterior") but 1.5 x the
//      traffic and a forward pass that waits on DCN too. Worth it only to
//      free memory ("Usar o paralelismo de dados totalmente fragmentados é
//      útil para liberar o uso da memória"), so we recommend it only when a
//      full replica of the training state does not fit a slice and the batch
//      still hides its DCN traffic.
//    - pipeline (depth d, m / d data-parallel replicas of the pipeline):
//      each slice holds P / d parameters and every token of the pipeline's
//      batch d * B passes through them, so OI = 4 d B / (g A(m / d)); the
//      bubble of n microbatches stretches compute by (n + d - 1) / n.
//      "Use o paralelismo de pipeline apenas se as outras estratégias
//      exigirem um tamanho de lote global muito grande ... considere
//      pipelines de profundidade 2 e réplicas N/2 de paralelismo de dados,
//      depois pipelines de profundidade 4 e réplicas N/4 ... até que o lote
//      por pipeline fique grande o suficiente para que as operações de
//      comunicação coletiva da DCN possam ser ocultadas pela aritmética na
//      passagem reversa." Every divisor d >= 2 of m is a candidate depth.
//    The training state per chip (weights, gradients, optimizer moments:
//    16 bytes per parameter by default) is compared with the chip's memory
//    (HBM of the TPU type; unknown, so not checked, for cpu-N unless given).
//
// 9. Activations between pipeline stages (only with the model width E,
//    MaxText's emb_dim; without it they are not counted). `multislice
//    train` sends each microbatch's activation [rows, T, E] forward to the
//    next stage and its gradient back, both f32 (a = 32 bits), so each of
//    the d - 1 stage boundaries carries 2 x d B x E x a bits per step (d B
//    tokens per pipeline), half in each direction. A stage sends the
//    activations during the forward pass and the gradients during the
//    backward pass; its hosts split the rows, so each moves 1 / H of them:
//      activation seconds (per pass) = d B E a / (H N)
//    They add to that pass's DCN time (the backward pass's with the
//    gradient all-reduce of the replicas); in the steady state they overlap
//    other microbatches' compute (the max() of 7.), and what does not fit
//    under the compute is exposed. The fill and drain cannot overlap: the
//    first microbatch's activation crosses d - 1 boundaries before the last
//    stage starts, and its gradient d - 1 on the way back, so
//      step += (d - 1) x 2 x (d B / n) E a / (H N).
//    dcn_bytes_per_host counts what a host sends: an inner stage sends both
//    directions, a first or last stage one, so the busiest host of a
//    pipeline sends min(d - 1, 2) x d B E a / (8 H) bytes of activations on
//    top of its share of the all-reduce.
//
// 10. The recommendation compares the strategies by predicted step time
//    (tokens/s = m B / step, the same global batch for all): dcn_data,
//    dcn_fsdp and a pipeline of every candidate depth (bubble fraction
//    (d - 1) / (n + d - 1), GPipe and 1F1B alike). "Recomendamos começar com
//    o paralelismo de dados puro": data parallelism when its state fits and
//    B reaches the minimum of 5. (its all-reduce hides, so every pipeline is
//    slower by its bubble); with B between the minimum and the recommended
//    batch the reason adds the seed's margin. Below the minimum, the
//    pipeline of the fastest depth when it is predicted faster than data
//    parallelism (close to the seed's "depth 2, then 4, ... until DCN hides":
//    deeper pipelines pay a larger bubble), else data parallelism still.
//    When a replica's state does not fit: dcn_fsdp if B reaches its
//    recommended batch, else the fastest pipeline whose state fits.
//    The keys are those `multislice train` accepts: the dcn_* degrees and,
//    for a pipeline, num_pipeline_microbatches and pipeline_parallel_schedule
//    (1F1B: the bubble of GPipe with fewer microbatches in flight).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "runtime/mesh/topology.h"

namespace multislice::model {

// How the slices share the work (what crosses DCN).
enum class DcnStrategy {
  kData,      // dcn_data_parallelism = slices: gradients all-reduced
  kFsdp,      // dcn_fsdp_parallelism = slices: weights sharded across slices
  kPipeline,  // dcn_pipeline_parallelism = depth, dcn_data = slices / depth
};

// "dcn_data", "dcn_fsdp", "pipeline".
std::string_view ToString(DcnStrategy strategy);
// Parses the names above; anything else is kInvalidArgument
// "--strategy: 'x' is not one of dcn_data, dcn_fsdp, pipeline".
Result<DcnStrategy> ParseDcnStrategy(std::string_view name);

// Which all-reduce volume factor A(m) to plan with (see 3. above).
enum class DcnVolume {
  kSeed,  // the seed's bound: 1 with two slices, 2 with more
  kRing,  // a bandwidth-optimal ring: 2 (m - 1) / m
};

// "seed", "ring".
std::string_view ToString(DcnVolume volume);
// Parses "seed" or "ring"; anything else is kInvalidArgument
// "--dcn_volume: 'x' is not one of seed, ring".
Result<DcnVolume> ParseDcnVolume(std::string_view name);

// A(m): the data each of `participants` sends in an all-reduce, as a
// multiple of the reduced array. 0 when participants <= 1.
double AllReduceFactor(int participants, DcnVolume volume);

// h * F / N in FLOP per bit.
double ArithmeticIntensity(int chips_per_host, double peak_flops_per_chip,
                           double dcn_bits_per_second_per_host);

// The smallest batch (tokens per pipeline; per slice without a pipeline) for
// which the backward pass hides `dcn_bits_per_parameter`:
// arithmetic_intensity * dcn_bits_per_parameter /
// backward_flops_per_token_per_parameter.
double MinimumBatchTokens(double arithmetic_intensity,
                          double dcn_bits_per_parameter,
                          double backward_flops_per_token_per_parameter);

// The seed's margin rule: max(minimum, RoundToSignificantDigits(margin *
// minimum, 2)). 176,000 -> 350,000; 352,000 -> 700,000 (margin 2).
double RecommendedBatchTokens(double minimum_tokens, double margin);

// `value` rounded to `digits` significant decimal digits (half away from
// zero): 352000 -> 350000, 704000 -> 700000, 63040 -> 63000.
double RoundToSignificantDigits(double value, int digits);

// The inputs. Units: FLOPs, bits, bytes, seconds; Gbit/s only where named.
// Error messages name each field as the `multislice plan` flag of the same
// name (e.g. "--num_slices").
struct PerfModelOptions {
  std::string accelerator_type;  // required: "v4-16", "cpu-4", ...
  int num_slices = 1;            // 1 to 256
  double parameters = 0;         // P, > 0
  // The batch: give either or both (then global = per slice * num_slices).
  // Tokens for language models; for other models, examples with FLOPs per
  // example per parameter below.
  std::optional<double> tokens_per_slice;
  std::optional<double> global_batch_tokens;
  // Defaults: the type's published figures; required for cpu-N (measure
  // them with `multislice peak` and `multislice bench collectives`).
  std::optional<double> peak_flops_per_chip;
  std::optional<double> dcn_gbps_per_host;            // Gbit/s
  double forward_flops_per_token_per_parameter = 2;   // >= 0
  double backward_flops_per_token_per_parameter = 4;  // > 0
  double mfu = 1.0;        // assumed FLOP utilisation, in (0, 1]
  int gradient_bits = 32;  // what crosses DCN per value: 32 (f32) or 16 (bf16)
  DcnVolume dcn_volume = DcnVolume::kSeed;
  double margin = 2.0;  // >= 1
  // The strategy to predict; nullopt: the recommended one.
  std::optional<DcnStrategy> strategy;
  int pipeline_depth = 0;         // 0: the fastest depth; else divides slices
  int pipeline_microbatches = 0;  // 0: 4 x depth
  // The model width E (MaxText's emb_dim), a whole number > 0: the
  // activations between pipeline stages (9.); nullopt: not counted.
  std::optional<double> emb_dim;
  // Memory per chip for the training state; default the TPU type's HBM
  // (not checked for cpu-N). Must be positive when given.
  std::optional<double> memory_bytes_per_chip;
  double state_bytes_per_parameter = 16;  // f32 weights, grads, 2 moments
};

// The prediction for one strategy.
struct StrategyEstimate {
  DcnStrategy strategy = DcnStrategy::kData;
  int pipeline_depth = 1;  // slices per pipeline; 1 unless kPipeline
  int data_replicas = 1;   // slices (or pipelines) that share gradients
  int pipeline_microbatches = 1;
  double parameters_per_slice = 0;  // P, or P / depth for a pipeline
  // DCN bits per parameter held, per step (all collectives, and the part
  // that the backward pass must hide).
  double dcn_bits_per_parameter = 0;
  double backward_dcn_bits_per_parameter = 0;
  // FLOP per DCN bit; +infinity when nothing crosses DCN.
  double operational_intensity = 0;
  double minimum_tokens_per_slice = 0;      // 5., per slice
  double recommended_tokens_per_slice = 0;  // 6., per slice
  double dcn_bytes_per_host = 0;  // sent per step, activations included
  double forward_seconds = 0;     // compute, with the pipeline bubble
  double backward_seconds = 0;    // compute, with the pipeline bubble
  // DCN time in each pass: the collectives and, for a pipeline with
  // emb_dim, the activations (forward) and their gradients (backward).
  double forward_dcn_seconds = 0;
  double backward_dcn_seconds = 0;
  // A pipeline with emb_dim (9.): the activation bytes a host of the
  // busiest stage sends per step, the seconds of one direction's transfers
  // per step (in each pass's DCN time above), and the fill and drain.
  double activation_bytes_per_host = 0;
  double activation_seconds = 0;
  double fill_drain_seconds = 0;
  double bubble_fraction = 0;  // (d - 1) / (n + d - 1); 0 without a pipeline
  bool dcn_hidden = true;      // each pass's DCN time fits under its compute
  double step_seconds = 0;     // with overlap, fill and drain included
  double step_seconds_without_overlap = 0;
  double tokens_per_second = 0;   // global batch / step_seconds
  double scaling_efficiency = 0;  // one-slice step / step
  double state_bytes_per_chip = 0;
  bool fits_in_memory = true;  // true when the memory is unknown
};

struct Recommendation {
  DcnStrategy strategy = DcnStrategy::kData;
  int pipeline_depth = 1;
  // MaxText's keys; dcn_tensor_parallelism is always 1.
  int dcn_data_parallelism = 1;
  int dcn_fsdp_parallelism = 1;
  int dcn_pipeline_parallelism = 1;
  // With a pipeline: its microbatches per step and "1F1B"; else 0 and "".
  int num_pipeline_microbatches = 0;
  std::string pipeline_parallel_schedule;
  std::string reason;  // a few sentences for the user, with the figures
};

// The recommendation as `multislice train` keys: "dcn_data_parallelism=2",
// "dcn_fsdp_parallelism=1", "dcn_pipeline_parallelism=1",
// "dcn_tensor_parallelism=1", and for a pipeline also
// "num_pipeline_microbatches=8" and "pipeline_parallel_schedule=1F1B".
std::vector<std::string> TrainKeys(const Recommendation& recommendation);

struct PerfPlan {
  PerfModelOptions options;  // as given
  mesh::AcceleratorType type;
  int num_slices = 1;
  int chips_per_slice = 0;
  int chips_per_host = 0;
  int hosts_per_slice = 0;
  double parameters = 0;
  double tokens_per_slice = 0;
  double global_batch_tokens = 0;
  double peak_flops_per_chip = 0;           // resolved
  bool peak_from_type = false;              // the type's figure, not given
  double dcn_bits_per_second_per_host = 0;  // resolved
  bool dcn_from_type = false;
  double memory_bytes_per_chip = 0;  // 0: unknown
  double arithmetic_intensity = 0;   // FLOP/bit
  double single_slice_step_seconds = 0;
  // Data parallelism across all slices: the seed's numbers (bits per
  // parameter, operational intensity, minimum and recommended batch).
  StrategyEstimate data_parallel;
  // Every strategy compared (10.): dcn_data, then (with 2 or more slices)
  // dcn_fsdp and a pipeline of each depth that divides the slices, deepest
  // last.
  std::vector<StrategyEstimate> strategies;
  bool activations_counted = false;  // emb_dim given
  // The strategy asked for (or, without one, the recommended one).
  StrategyEstimate estimate;
  Recommendation recommendation;
};

// Validates `options` and computes the plan. Bad input is kInvalidArgument
// with one sentence naming the flag, the value and what was expected, e.g.
// "--parameters must be a positive number, got 0" or
// "--peak_flops_per_chip is required for cpu-2 ...".
Result<PerfPlan> PlanPerformance(const PerfModelOptions& options);

// HBM bytes per chip of a TPU family ("v4": 32 GiB, "v5p": 95 GiB,
// "v5litepod": 16 GiB, "v6e": 32 GiB); 0 for cpu and unknown families.
double MemoryBytesPerChip(std::string_view family);

}  // namespace multislice::model
