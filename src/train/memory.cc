// The memory estimate of `multislice train` and the host's available memory;
// see memory.h for the terms.
#include "train/memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "compute/attention.h"
#include "model/decoder.h"
#include "train/pipeline_schedule.h"
#include "train/trainer.h"

namespace multislice::train {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kF32 = 4, kBf16 = 2;
// bench/peak.h's square matmul of the start-up measurement, and the f32
// route's A panel (compute/cpu/gemm_routes.cc).
constexpr uint64_t kPeakSide = 2048;
constexpr uint64_t kWidenedPanelBytes = 8 * kMiB;

// One device's activation bytes for its B x T tokens (model/decoder.cc and
// its blocks); with tensor parallelism t a device trains its group's B t
// rows, and the attention's heads and the MLP's width are its share. A
// pipeline stage's model has L / p layers and its microbatch's rows (the
// head's buffers counted as on the last stage: an upper bound).
compute::AttentionShape AttentionShapeOf(const model::DecoderConfig& m, int t,
                                         uint64_t B) {
  compute::AttentionShape s;
  s.B = static_cast<int>(B);
  s.T = m.max_seq_len;
  s.heads = m.num_heads / t;
  s.kv_heads = m.num_kv_heads / t;
  s.head_dim = m.head_dim;
  return s;
}

uint64_t ActivationBytesPerModel(const TrainConfig& c, bool via_f32, int t,
                                 uint64_t B, uint64_t L) {
  const model::DecoderConfig m = DecoderConfigOf(c);
  const compute::AttentionShape shape = AttentionShapeOf(m, t, B);
  const bool bf16 = MatmulDType(c) == DType::kBF16;
  const bool gpt3 = m.block == model::BlockKind::kGpt3;
  const uint64_t T = c.max_target_length;
  const uint64_t C = c.emb_dim, H = c.mlp_dim / t;
  const uint64_t W = static_cast<uint64_t>(shape.qkv_width());  // q|k|v
  const uint64_t Q = static_cast<uint64_t>(shape.out_width());  // attention
  const uint64_t G = m.gated_mlp ? 2 * H : H;  // the MLP's input product
  const uint64_t stats = gpt3 ? 4 : 2;  // LayerNorm's mean and rstd, twice
  const uint64_t V = c.vocab_size;
  const uint64_t heads = static_cast<uint64_t>(shape.heads);
  const uint64_t n = B * T;  // tokens
  const uint64_t widest = std::max({V, G, W});
  // Per layer: the two norms' outputs, the residual after attention and the
  // layer's output [n, C], qkv [n, W], the attention's output [n, Q], the
  // row statistics, the softmax, the MLP's first product [n, G] and (f32
  // matmuls) its activation [n, H]; bf16 matmuls keep bf16 copies of the
  // norms, qkv, the attention's output and the activation instead.
  const uint64_t layer = kF32 * (4 * n * C + n * (W + Q) + stats * n +
                                 n * heads * T + n * G + (bf16 ? 0 : n * H)) +
                         (bf16 ? kBf16 * (2 * n * C + n * (W + Q) + n * H) : 0);
  // One layer's gradients, reused by every layer.
  const uint64_t gradients = kF32 * (4 * n * C + n * (W + Q) + stats * n +
                                     n * G + (m.gated_mlp ? n * H : 0));
  // The residual stream, final norm and their gradients; logits,
  // probabilities and their gradient; the attention scratch.
  const uint64_t head =
      kF32 * (4 * n * C + 3 * n * V + 4 * n +
              static_cast<uint64_t>(
                  compute::AttentionScratchSize(shape, MatmulDType(c))));
  // bf16: the final norm's copy, an output gradient's copy and the matmul
  // scratch of the operands rounded on the fly.
  const uint64_t rounded = bf16 ? kBf16 * (n * C + 3 * n * widest) : 0;
  // The model's and the batch's tokens and targets (int32).
  const uint64_t tokens = 4 * n * 4;
  const uint64_t widened =
      bf16 && via_f32 ? kF32 * n * std::max(G, W) + kWidenedPanelBytes : 0;
  return L * layer + gradients + head + rounded + tokens + widened;
}

// Without a pipeline one model of the group's B t rows; with p stages and m
// microbatches the first stage's (the most in flight) models of B t p / m
// rows each, the neighbours' two [rows, T, C] buffers per model and the
// microbatch gradient (N).
uint64_t ActivationBytesPerDevice(const TrainConfig& c, bool via_f32,
                                  const WorkerShape& s, uint64_t N) {
  const int t = std::max(s.tensor, 1), p = std::max(s.stages, 1);
  const uint64_t rows = static_cast<uint64_t>(c.per_device_batch_size) * t;
  const uint64_t L = c.num_decoder_layers;
  if (p == 1) return ActivationBytesPerModel(c, via_f32, t, rows, L);
  const int m = PipelineMicrobatches(c, p);
  Result<PipelineSchedule> schedule =
      ParsePipelineSchedule(c.pipeline_parallel_schedule);
  const uint64_t models = static_cast<uint64_t>(MicrobatchesInFlight(
      schedule.ok() ? *schedule : PipelineSchedule::k1F1B, 0, p, m));
  const uint64_t micro_rows = rows * p / m;
  const uint64_t exchange =
      2 * kF32 * micro_rows * c.max_target_length * c.emb_dim;
  return models * (ActivationBytesPerModel(c, via_f32, t, micro_rows, L / p) +
                   exchange) +
         (m > 1 ? kF32 * N : 0);
}

// Shard-sized f32 buffers of DiLoCo's outer state per device: the outer
// copy, the momentum, the pseudo-gradient, the pending sum of an overlapped
// sync, the pseudo-gradient's copy kept for a resend (continue on
// failure); 0 without DiLoCo.
uint64_t OuterBuffers(const TrainConfig& c) {
  if (!c.enable_diloco) return 0;
  const bool pending =
      c.enable_streaming_diloco && c.num_communication_overlapping_steps > 0;
  return 3 + (pending ? 1 : 0) + (c.diloco_continue_on_failure ? 1 : 0);
}

// DiLoCo's replicas of a config (its -1 counted as 1: the estimate is made
// on the resolved mesh's keys).
uint64_t DilocoReplicas(const TrainConfig& c) {
  return static_cast<uint64_t>(std::max(1, c.ici_diloco_parallelism) *
                               std::max(1, c.dcn_diloco_parallelism));
}

uint64_t WeightBytesPerDevice(const TrainConfig& c, uint64_t N, int fsdp) {
  const uint64_t shard = (N + fsdp - 1) / fsdp;
  uint64_t bytes = kF32 * ((3 + OuterBuffers(c)) * shard +
                           N);  // weights, m, v, outer state; the gradient
  if (fsdp > 1) bytes += kF32 * (N + shard);  // gathered; gradient shard
  if (MatmulDType(c) == DType::kBF16) bytes += kBf16 * N;
  return bytes;
}

uint64_t StagingBytes(const TrainConfig& c, uint64_t N, const WorkerShape& s) {
  const uint64_t shard_state =
      (3 + OuterBuffers(c)) * kF32 * ((N + s.fsdp - 1) / s.fsdp);
  uint64_t bytes = 0;
  if (c.enable_checkpointing) {
    const uint64_t shards = std::min(s.local_devices, s.fsdp);
    bytes += shards * shard_state * (c.async_checkpointing ? 2 : 1);
  }
  if (c.enable_in_memory_recovery) {
    // Two copies in flight and two steps of files in /dev/shm.
    bytes += 4 * static_cast<uint64_t>(s.local_devices) * shard_state;
  }
  return bytes;
}

uint64_t StartupPeakBytes(const TrainConfig& c, const WorkerShape& s) {
  const uint64_t square = kPeakSide * kPeakSide;
  const bool bf16 = MatmulDType(c) == DType::kBF16;
  uint64_t bytes = square * (bf16 ? 2 * kBf16 + kF32 : 3 * kF32);
  if (bf16 && s.bf16_via_f32) bytes += square * kF32 + kWidenedPanelBytes;
  return bytes * static_cast<uint64_t>(s.local_devices);
}

Result<uint64_t> ParseBytes(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || *end != '\0' || value == 0) {
    return InvalidArgument(what + ": '" + text +
                           "' is not a positive number of bytes");
  }
  return static_cast<uint64_t>(value);
}

std::optional<std::string> ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

// MemAvailable of /proc/meminfo, in bytes.
std::optional<uint64_t> MemAvailable(const std::string& meminfo) {
  std::ifstream in(meminfo);
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

// The least memory.max - memory.current of this process's cgroup and its
// ancestors up to the root, or nullopt without a limit.
std::optional<uint64_t> CgroupHeadroom(const MemorySources& s) {
  std::optional<std::string> line = ReadFirstLine(s.self_cgroup);
  std::string path = line && line->rfind("0::", 0) == 0 ? line->substr(3) : "";
  std::optional<uint64_t> least;
  while (true) {
    const std::string dir = s.cgroup_root + (path == "/" ? "" : path);
    std::optional<std::string> max = ReadFirstLine(dir + "/memory.max");
    if (max && *max != "max") {
      const uint64_t limit = std::strtoull(max->c_str(), nullptr, 10);
      std::optional<std::string> now = ReadFirstLine(dir + "/memory.current");
      const uint64_t used = now ? std::strtoull(now->c_str(), nullptr, 10) : 0;
      const uint64_t left = used < limit ? limit - used : 0;
      least = least ? std::min(*least, left) : left;
    }
    if (path.empty() || path == "/") return least;
    const size_t slash = path.rfind('/');
    path =
        slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
}

}  // namespace

MemoryEstimate EstimateWorkerMemory(const TrainConfig& c,
                                    const WorkerShape& s) {
  // The tensor rank's parameters (the whole model's without tensor
  // parallelism) of the largest pipeline stage (the first).
  const uint64_t N = static_cast<uint64_t>(model::NumParameters(
      DecoderConfigOf(c), std::max(s.tensor, 1), {0, std::max(s.stages, 1)}));
  const uint64_t local = static_cast<uint64_t>(s.local_devices);
  MemoryEstimate e;
  e.local_devices = s.local_devices;
  e.per_device_batch_size = c.per_device_batch_size;
  const uint64_t whole =
      static_cast<uint64_t>(model::NumParameters(DecoderConfigOf(c)));
  e.weights_and_optimizer =
      local * WeightBytesPerDevice(c, N, s.fsdp) + N +
      (s.restoring
           ? (3 * DilocoReplicas(c) + (c.enable_diloco ? 3 : 0)) * kF32 * whole
           : 0);
  e.activations = local * ActivationBytesPerDevice(c, s.bf16_via_f32, s, N);
  e.checkpoint_staging = StagingBytes(c, N, s);
  e.runtime = kRuntimeBytes + s.dataset_bytes * local /
                                  static_cast<uint64_t>(std::max(s.devices, 1));
  e.startup_peak = StartupPeakBytes(c, s);
  return e;
}

MemorySources SystemMemorySources() {
  MemorySources sources;
  if (const char* v = std::getenv(kMemoryLimitVariable)) {
    sources.limit_override = v;
  }
  return sources;
}

Result<AvailableMemory> AvailableHostMemory(const MemorySources& s) {
  if (s.limit_override) {
    ASSIGN_OR_RETURN(uint64_t bytes,
                     ParseBytes(*s.limit_override, kMemoryLimitVariable));
    return AvailableMemory{bytes, kMemoryLimitVariable};
  }
  std::optional<uint64_t> available = MemAvailable(s.meminfo);
  if (!available) {
    return Internal(s.meminfo + " has no MemAvailable line; set " +
                    std::string(kMemoryLimitVariable) +
                    " to the bytes train may use");
  }
  AvailableMemory result{*available, "MemAvailable"};
  std::optional<uint64_t> headroom = CgroupHeadroom(s);
  if (headroom && *headroom < result.bytes) {
    result = {*headroom, "the cgroup's memory.max"};
  }
  return result;
}

std::string FormatBytes(uint64_t bytes) {
  char text[32];
  const double gib = static_cast<double>(bytes) / (1024.0 * kMiB);
  if (gib >= 1) {
    std::snprintf(text, sizeof text, "%.1f GiB", gib);
  } else {
    std::snprintf(text, sizeof text, "%.0f MiB",
                  static_cast<double>(bytes) / kMiB);
  }
  return text;
}

std::string DescribeEstimate(const MemoryEstimate& e, int processes) {
  const uint64_t startup_extra =
      e.startup_peak > e.training() ? e.startup_peak - e.training() : 0;
  std::string terms =
      "weights and optimizer " + FormatBytes(e.weights_and_optimizer) +
      ", activations " + FormatBytes(e.activations) + " for " +
      std::to_string(e.local_devices) + " device" +
      (e.local_devices == 1 ? "" : "s") + " x batch " +
      std::to_string(e.per_device_batch_size) + ", checkpoint staging " +
      FormatBytes(e.checkpoint_staging) + ", runtime " +
      FormatBytes(e.runtime + startup_extra);
  if (processes <= 1) {
    return "about " + FormatBytes(e.total()) + " per host (" + terms + ")";
  }
  return "about " + FormatBytes(e.total() * processes) + " for its " +
         std::to_string(processes) + " local slices (" +
         FormatBytes(e.total()) + " each: " + terms + ")";
}

Status CheckHostMemory(const MemoryEstimate& e, int processes,
                       const AvailableMemory& available) {
  const uint64_t needed = e.total() * static_cast<uint64_t>(processes);
  if (needed <= available.bytes) return OkStatus();
  const bool activations_dominate = 2 * e.activations >= e.training();
  return InvalidArgument(
      "this configuration needs " + DescribeEstimate(e, processes) + "; " +
      (processes <= 1 ? "the host has " : "this machine has ") +
      FormatBytes(available.bytes) + " available (" + available.source + "); " +
      (activations_dominate
           ? "lower per_device_batch_size or max_target_length"
           : "use a smaller model (emb_dim, mlp_dim, num_decoder_layers) "
             "or fewer devices per host"));
}

}  // namespace multislice::train
