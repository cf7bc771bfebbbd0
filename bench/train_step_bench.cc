// One device's training step (forward, backward, gradient clipping and
// AdamW) of the decoder, GPT-2's block or the Llama family's, timed at a few
// model sizes, against the 2048^3 matmul peak of the same run in the step's
// dtype (on the route the step's matmuls take): MFU = achieved GFLOP/s / peak
// GFLOP/s. The peers are bench/pytorch_gpt_step.py and
// bench/pytorch_llama_step.py (bench/compare_train_step.sh runs both sides).
//
// FLOPs per step, as train/model_config.h counts them: 6 * tokens * (L *
// (C (q + 2 kv) + q C + m C mlp) + C V) for the weight matmuls (forward 2x,
// backward 4x; q = heads x head_dim, kv = kv_heads x head_dim, m = 2 matrices
// or 3 for a gated MLP) plus 12 * L * T * q * tokens for attention (the full
// T x T scores, as the GEMMs compute them).
//
// Usage: train_step_bench [--steps N] [--peak_reps N] [--f32] [--attention]
//                         [--only B,T,C,NH,mlp,L] [--decoder_block NAME]
//                         [--kv_heads N] [--head_dim N] [--vocab V] [--json]
// Under MULTISLICE_MAX_ISA it runs as on a CPU with only that level.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench/peak.h"
#include "common/cpu_isa.h"
#include "common/dtype.h"
#include "common/float_env.h"
#include "compute/adamw.h"
#include "compute/attention.h"
#include "compute/matmul.h"
#include "model/decoder.h"
#include "model/schedule.h"

namespace {

using multislice::DType;
using multislice::Status;
namespace model = multislice::model;

struct Size {
  int B, T, C, NH, mlp, L;
};

// The block and the shape keys --only does not give (0: the default).
struct ModelOptions {
  model::BlockKind block = model::BlockKind::kGpt3;
  int kv_heads = 0;  // 0: one per query head
  int head_dim = 0;  // 0: C / NH
  int vocab = 256;
};
ModelOptions g_model;

double StepFlops(const model::DecoderConfig& c, int B, int T) {
  const double tokens = double{1} * B * T;
  const double C = c.emb_dim, H = c.mlp_dim, V = c.vocab_size, L = c.num_layers;
  const double q = double{1.0} * c.num_heads * c.head_dim;
  const double kv = double{1.0} * c.num_kv_heads * c.head_dim;
  const double mlp = (c.gated_mlp ? 3 : 2) * C * H;
  return 6.0 * tokens * (L * (C * (q + 2 * kv) + q * C + mlp) + C * V) +
         12.0 * L * T * q * tokens;
}

model::DecoderConfig ConfigOf(const Size& s) {
  model::DecoderConfig c =
      model::GptShape(g_model.vocab, s.T, s.C, s.NH, s.L, s.mlp);
  if (g_model.block == model::BlockKind::kGpt3) return c;
  c.block = g_model.block;
  c.num_kv_heads = g_model.kv_heads > 0 ? g_model.kv_heads : s.NH;
  if (g_model.head_dim > 0) c.head_dim = g_model.head_dim;
  c.gated_mlp = true;
  const bool gemma = c.block == model::BlockKind::kGemma;
  c.mlp_activation =
      gemma ? model::Activation::kGelu : model::Activation::kSilu;
  c.tied_embedding = gemma;
  c.normalize_embedding_logits = gemma;
  return c;
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

struct StepTime {
  double wall = 0;  // median seconds of one step
  double cpu = 0;   // median CPU seconds of the calling thread per step
};

// Medians over `steps` timed steps (after two warm-ups).
StepTime TimeStep(const Size& s, DType matmul_type, int steps) {
  const model::DecoderConfig c = ConfigOf(s);
  const int64_t n = model::NumParameters(c);
  std::vector<float> params(n), grads(n), m(n, 0.0f), v(n, 0.0f);
  model::InitParameters(c, 1, params.data());
  const std::vector<uint8_t> mask = model::WeightDecayMask(c);
  std::vector<int32_t> tokens(int64_t{s.B} * s.T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7919u + 13u) % c.vocab_size);
    targets[i] = static_cast<int32_t>((i * 104729u + 7u) % c.vocab_size);
  }
  model::Decoder gm(c, matmul_type);
  std::vector<double> times, cpu_times;
  for (int step = 1; step <= steps + 2; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = ThreadCpuSeconds();
    auto loss =
        gm.Forward(params.data(), tokens.data(), targets.data(), s.B, s.T);
    if (!loss.ok()) {
      std::fprintf(stderr, "forward: %s\n", loss.status().message().c_str());
      std::exit(1);
    }
    auto st = gm.Backward(params.data(), grads.data());  // writes every entry
    if (!st.ok()) {
      std::fprintf(stderr, "backward: %s\n", st.message().c_str());
      std::exit(1);
    }
    // As the trainer: the clipping scale applied inside AdamW's pass.
    multislice::compute::AdamWOptions opt;
    opt.grad_scale = model::ClipScale(
        multislice::compute::GlobalNorm(grads.data(), n), 1.0f);
    opt.lr = 1e-4f;
    multislice::compute::AdamWUpdate(params.data(), grads.data(), m.data(),
                                     v.data(), n, opt, step, mask.data());
    const auto t1 = std::chrono::steady_clock::now();
    const double c1 = ThreadCpuSeconds();
    if (step > 2) {
      times.push_back(std::chrono::duration<double>(t1 - t0).count());
      cpu_times.push_back(c1 - c0);
    }
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu_times.begin(), cpu_times.end());
  return {times[times.size() / 2], cpu_times[cpu_times.size() / 2]};
}

multislice::compute::AttentionShape Shape(const Size& s) {
  multislice::compute::AttentionShape a;
  a.B = s.B;
  a.T = s.T;
  a.heads = a.kv_heads = s.NH;
  a.head_dim = s.C / s.NH;
  return a;
}

// Median CPU seconds of one layer's attention forward and backward.
std::pair<double, double> TimeAttention(const Size& s, DType matmul_type,
                                        int reps) {
  const int64_t N = int64_t{s.B} * s.T;
  std::vector<float> qkv(N * 3 * s.C), out(N * s.C), dout(N * s.C),
      dqkv(N * 3 * s.C), att(int64_t{s.B} * s.NH * s.T * s.T),
      scratch(AttentionScratchSize(Shape(s), matmul_type));
  for (size_t i = 0; i < qkv.size(); ++i) {
    qkv[i] =
        0.01f * static_cast<float>(static_cast<int>(i * 7919u % 201u) - 100);
  }
  for (size_t i = 0; i < dout.size(); ++i) {
    dout[i] =
        1e-3f * static_cast<float>(static_cast<int>(i * 104729u % 201u) - 100);
  }
  std::vector<double> fwd, bwd;
  for (int r = 0; r < reps + 1; ++r) {
    const double c0 = ThreadCpuSeconds();
    if (!multislice::compute::AttentionForward(out.data(), att.data(),
                                               scratch.data(), qkv.data(),
                                               Shape(s), matmul_type)
             .ok()) {
      std::exit(1);
    }
    const double c1 = ThreadCpuSeconds();
    if (!multislice::compute::AttentionBackward(
             dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(),
             Shape(s), matmul_type)
             .ok()) {
      std::exit(1);
    }
    const double c2 = ThreadCpuSeconds();
    if (r > 0) {
      fwd.push_back(c1 - c0);
      bwd.push_back(c2 - c1);
    }
  }
  std::sort(fwd.begin(), fwd.end());
  std::sort(bwd.begin(), bwd.end());
  return {fwd[fwd.size() / 2], bwd[bwd.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 10, peak_reps = 10;
  bool attention = false;  // also time one layer's attention alone
  bool json = false;       // one JSON object per size instead of the table
  DType matmul_type = DType::kBF16;
  std::vector<Size> sizes = {
      {8, 128, 256, 4, 1024, 4}, {16, 128, 256, 4, 1024, 4},
      {8, 128, 384, 6, 1536, 4}, {16, 128, 384, 6, 1536, 4},
      {8, 128, 512, 8, 2048, 4}, {16, 128, 512, 8, 2048, 4},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (arg == "--peak_reps" && i + 1 < argc) {
      peak_reps = std::atoi(argv[++i]);
    } else if (arg == "--attention") {
      attention = true;
    } else if (arg == "--f32") {
      matmul_type = DType::kF32;
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--decoder_block" && i + 1 < argc) {
      auto block = model::ParseBlockKind(argv[++i]);
      if (!block.ok()) {
        std::fprintf(stderr, "--decoder_block: %s\n",
                     block.status().message().c_str());
        return 2;
      }
      g_model.block = *block;
    } else if (arg == "--kv_heads" && i + 1 < argc) {
      g_model.kv_heads = std::atoi(argv[++i]);
    } else if (arg == "--head_dim" && i + 1 < argc) {
      g_model.head_dim = std::atoi(argv[++i]);
    } else if (arg == "--vocab" && i + 1 < argc) {
      g_model.vocab = std::atoi(argv[++i]);
    } else if (arg == "--only" && i + 1 < argc) {
      Size s{};
      if (std::sscanf(argv[++i], "%d,%d,%d,%d,%d,%d", &s.B, &s.T, &s.C, &s.NH,
                      &s.mlp, &s.L) != 6) {
        std::fprintf(stderr, "--only wants B,T,C,NH,mlp,L\n");
        return 2;
      }
      sizes = {s};
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--steps N] [--peak_reps N] [--f32] [--attention] "
          "[--only B,T,C,NH,mlp,L] [--decoder_block NAME] [--kv_heads N] "
          "[--head_dim N] [--vocab V] [--json]\n",
          argv[0]);
      return 2;
    }
  }
  steps = std::max(steps, 1);
  multislice::compute::SetSingleThreaded();
  multislice::FlushSubnormalsInThisThread();  // as device threads do
  multislice::compute::GemmDesc peak_desc;
  peak_desc.m = peak_desc.n = peak_desc.k = 2048;
  peak_desc.ab_type = matmul_type;
  peak_desc.c_type = DType::kF32;
  // The peak is measured again next to every size, so that both see the same
  // load on this shared host; per CPU second as well as per wall second
  // (the CPU-time rates, step and peak alike, are the steadier comparison
  // when other processes share the cores: cpu_share below 1).
  const std::string route = multislice::compute::MatmulRouteName(matmul_type);
  if (!json) {
    std::printf(
        "%s, matmul %s; median of %d steps; peak = %s 2048^3 "
        "matmul measured just before each row\n",
        multislice::DescribeCpu().c_str(), route.c_str(), steps,
        std::string(multislice::Name(matmul_type)).c_str());
    std::printf(
        "%4s %4s %5s %3s %5s %2s %10s %8s %8s %8s %8s %6s %6s %6s %7s %7s\n",
        "B", "T", "C", "NH", "mlp", "L", "GFLOP/step", "ms/step", "cpu_ms",
        "GFLOP/s", "cpuGF/s", "peak", "cpuPk", "share", "MFU", "cpuMFU");
  }
  for (const Size& s : sizes) {
    const model::DecoderConfig c = ConfigOf(s);
    if (Status v = model::ValidateConfig(c); !v.ok()) {
      std::fprintf(stderr, "%s\n", v.message().c_str());
      return 2;
    }
    const double flops = StepFlops(c, s.B, s.T);
    auto peak = multislice::bench::MeasureMatmulPeak(peak_desc, peak_reps);
    if (!peak.ok()) {
      std::fprintf(stderr, "peak: %s\n", peak.status().message().c_str());
      return 1;
    }
    const double peak_cpu = peak->median_gflops / peak->cpu_share;
    const StepTime st = TimeStep(s, matmul_type, steps);
    const double gflops = flops / st.wall * 1e-9;
    const double cpu_gflops = flops / st.cpu * 1e-9;
    if (json) {
      const nlohmann::json row = {
          {"cpu", multislice::CpuModelName()},
          {"isa", std::string(multislice::IsaName(multislice::ActiveIsa()))},
          {"matmul", route},
          {"B", s.B},
          {"T", s.T},
          {"C", s.C},
          {"NH", s.NH},
          {"mlp", s.mlp},
          {"L", s.L},
          {"decoder_block", model::BlockName(c.block)},
          {"kv_heads", c.num_kv_heads},
          {"head_dim", c.head_dim},
          {"vocab", c.vocab_size},
          {"gflop_per_step", flops * 1e-9},
          {"step_time_s", st.wall},
          {"step_cpu_s", st.cpu},
          {"tokens_per_s", s.B * double{1} * s.T / st.wall},
          {"peak_gflops", peak->median_gflops},
          {"mfu", gflops / peak->median_gflops}};
      std::printf("%s\n", row.dump().c_str());
      std::fflush(stdout);
      continue;
    }
    std::printf(
        "%4d %4d %5d %3d %5d %2d %10.2f %8.2f %8.2f %8.1f %8.1f %6.0f %6.0f "
        "%6.2f %6.1f%% %6.1f%%\n",
        s.B, s.T, s.C, s.NH, s.mlp, s.L, flops * 1e-9, st.wall * 1e3,
        st.cpu * 1e3, gflops, cpu_gflops, peak->median_gflops, peak_cpu,
        peak->cpu_share, 100.0 * gflops / peak->median_gflops,
        100.0 * cpu_gflops / peak_cpu);
    if (attention) {
      const auto [fwd, bwd] = TimeAttention(s, matmul_type, steps);
      const double att_flops = 4.0 * s.B * double{1} * s.T * s.T * s.C;
      std::printf(
          "     attention of one layer: forward %.2f ms (%.1f GFLOP/s), "
          "backward %.2f ms (%.1f GFLOP/s); x%d layers = %.1f%% of the step\n",
          fwd * 1e3, att_flops / fwd * 1e-9, bwd * 1e3,
          2 * att_flops / bwd * 1e-9, s.L, 100.0 * s.L * (fwd + bwd) / st.cpu);
    }
    std::fflush(stdout);
  }
  return 0;
}
