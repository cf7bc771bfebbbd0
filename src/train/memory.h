// How much host memory `multislice train` needs, and how much the host has:
// the check `train` makes before it allocates anything, so that a
// configuration too big for the machine ends in one sentence (exit code 2)
// instead of the kernel's OOM killer or a std::bad_alloc mid-run.
//
// The estimate adds up what the trainer allocates (trainer.cc, model/gpt.cc,
// train_state.cc, checkpoint.cc), in bytes per worker process:
//
//   weights and optimizer, per device: the f32 shard of the weights and
//     AdamW's m and v (N/fsdp each, N parameters: with tensor parallelism
//     the tensor rank's part of the model), the gradient (N) and, with
//     fsdp > 1, the gathered weights (N) and the gradient's shard (N/fsdp);
//     with bf16 matmuls the weights' bf16 copy (N x 2 bytes). Per process
//     the weight-decay mask (N bytes) and, when a checkpoint is restored,
//     its unsharded state (3 x the whole model's parameters, f32), kept for
//     the whole run. With DiLoCo the outer state per device (the outer
//     copy, the momentum and the pseudo-gradient's buffer, N/fsdp each, and
//     the pending sum with overlapped syncs, and a copy of the
//     pseudo-gradient with diloco_continue_on_failure), and a restored
//     checkpoint holds every replica's state and the outer state.
//   activations, per device: what the Decoder keeps for the backward of its
//     B x T tokens (B x t rows and C/t, heads/t, mlp/t of the attention
//     and the MLP with tensor parallelism t; per layer 8 [BT, C] tensors,
//     the [B, heads, T, T]
//     softmax, the MLP's [BT, mlp] and their bf16 copies), one layer's
//     gradients, the [BT, vocab] logits, probabilities and their gradient,
//     the attention scratch; on the bf16-through-f32 route the widened
//     matmul operand and an 8 MiB panel. With p pipeline stages and m
//     microbatches: L/p layers and B t p / m rows per model, times the
//     models the first stage keeps (m with GPipe, p with 1F1B), their
//     activation and gradient buffers, and a microbatch's gradient (N, of
//     the first stage's parameters).
//   checkpoint staging: the copy of this host's shards (3 x N/fsdp per
//     fsdp rank, plus the outer state's under DiLoCo) handed to the writer,
//     twice with async saves (a new copy is made while the previous one may
//     still be written); with in-memory recovery also the replica's copies and
//     its two steps of files in /dev/shm, which is memory too.
//   runtime: kRuntimeBytes for the binary, its libraries and threads, this
//     host's share of the token files, and the start-up matmul peak
//     measurement (three 2048 x 2048 operands per device), which is freed
//     before training: the estimate counts the larger of it and training.
//
// Tests check the estimate against the peak RSS of real runs
// (train_command_test: within [0.5x, 2x]).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "train/config.h"

namespace multislice::train {

// Sets the memory available to `train`, in bytes, instead of the files
// below: for tests, and for a host whose real limit they do not show.
inline constexpr char kMemoryLimitVariable[] = "MULTISLICE_MEMORY_LIMIT_BYTES";

// The binary, its shared libraries, thread stacks and allocator slack of
// one worker process, measured on a tiny run (about 16 MiB), rounded up.
inline constexpr uint64_t kRuntimeBytes = uint64_t{24} << 20;

// What decides one worker process's memory besides the config.
struct WorkerShape {
  int local_devices = 1;       // devices this process drives
  int devices = 1;             // devices of the job
  int fsdp = 1;                // size of the fsdp axis (ici x dcn)
  int tensor = 1;              // size of the tensor axis (ici x dcn)
  int stages = 1;              // size of the stage axis (ici x dcn)
  bool restoring = false;      // a checkpoint will be restored
  uint64_t dataset_bytes = 0;  // train.bin + val.bin
  bool bf16_via_f32 = false;   // bf16 matmuls on the f32-kernel route
};

// Bytes of one worker process, by what they hold (see the file comment).
struct MemoryEstimate {
  uint64_t weights_and_optimizer = 0;
  uint64_t activations = 0;  // all local devices
  uint64_t checkpoint_staging = 0;
  uint64_t runtime = 0;       // without the start-up measurement
  uint64_t startup_peak = 0;  // the matmul peak measurement, all devices
  int local_devices = 1;
  int per_device_batch_size = 1;

  uint64_t training() const {
    return weights_and_optimizer + activations + checkpoint_staging;
  }
  uint64_t total() const {
    return runtime + (startup_peak > training() ? startup_peak : training());
  }
};

// The estimate for a validated config on `shape`.
MemoryEstimate EstimateWorkerMemory(const TrainConfig& config,
                                    const WorkerShape& shape);

struct AvailableMemory {
  uint64_t bytes = 0;
  std::string source;  // where the figure comes from, for the message
};

// Where AvailableHostMemory looks; the defaults are the real files.
struct MemorySources {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";  // "0::/<path>" (v2)
  std::string cgroup_root = "/sys/fs/cgroup";
  // The value of kMemoryLimitVariable, when set.
  std::optional<std::string> limit_override;
};

// The real files and kMemoryLimitVariable from the environment.
MemorySources SystemMemorySources();

// kMemoryLimitVariable when set (kInvalidArgument naming it if it is not a
// positive integer); else the lower of MemAvailable and, under a cgroup v2
// memory limit, memory.max - memory.current of this process's cgroup.
Result<AvailableMemory> AvailableHostMemory(const MemorySources& sources);

// kInvalidArgument with one sentence giving the estimate, its terms and what
// is available when `processes` workers of `estimate` (the local slices of
// one machine; 1 for a worker per host) do not fit; ok otherwise.
Status CheckHostMemory(const MemoryEstimate& estimate, int processes,
                       const AvailableMemory& available);

// "38.2 GiB" from 1 GiB up, else "512 MiB" (rounded).
std::string FormatBytes(uint64_t bytes);

// "about 1.2 GiB per host (weights and optimizer ..., activations ... for 4
// devices x batch 64, ...)": the estimate in words, for the messages above
// and the out-of-memory message of a run.
std::string DescribeEstimate(const MemoryEstimate& estimate, int processes);

}  // namespace multislice::train
