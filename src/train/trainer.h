// The training loop of `multislice train`: the decoder of model/decoder.h
// trained on every device of the job's mesh, with data, FSDP and tensor
// parallelism (see parallel_plan.h).
// The loop calls its parts, each in its own file with its own test:
// parallel_plan.h (a device's shard and a step's collectives, with
// gradient_buckets.h), optimizer.h (the clipped AdamW step on the shard),
// state_saver.h (checkpoints and in-memory replicas from the device threads,
// and the failures that stop the job), replica_restore.h (in-memory recovery
// at start-up), reporter.h (lines, metrics.jsonl, the plot).
//
// Sharding (ZeRO-3 style, on the flat parameter buffer): fsdp rank r of f
// owns comm::PartitionSegment(N, f, r) of the f32 master weights and of the
// AdamW moments; data replicas hold the same shards. With tensor
// parallelism t the flat buffer is the tensor rank's part of the model and a
// tensor group trains its per_device_batch_size x t rows of the global
// batch together (the model all-reduces activations over the group);
// without, each device trains its own per_device_batch_size rows. One step:
//   all-gather the weights over fsdp -> forward and backward with bf16 (or
//   f32) matmuls on the device's rows -> reduce-scatter the gradient over
//   fsdp, all-reduce the shard over data (chained) -> one all-reduce over
//   every axis of the loss and the squared gradient norm -> clip, AdamW on
//   the shard.
// With DiLoCo (enable_diloco, docs/diloco.md) each diloco rank is a replica
// that runs the step above on its own share of the global batch, reducing
// only inside itself, and every period the outer optimizer (diloco.h)
// averages the replicas' pseudo-gradients over the diloco axis.
// The collectives reduce in a fixed order, so a run is bitwise repeatable on
// the same mesh (the `deterministic` key is accepted and recorded).
//
// Checkpoints (train_state.h, checkpoint.h) are saved every
// checkpoint_period steps and at the end: the device threads copy their
// shards out (the only part that blocks training), then a background writer
// commits them atomically, with barriers between hosts through the job's
// rendezvous store. A run whose checkpoint directory holds a complete step
// restores the newest readable one (resharding onto this mesh) and
// continues with the batch that step would have seen next.
//
// Failures that must not go unnoticed (a checkpoint save that failed, in
// the background or not; a metrics record that could not be written) stop
// the whole job at the next step: every device adds its process's failure
// flag to the step's loss-and-norm all-reduce, so all of them stop at the
// same step, and the process that failed returns one sentence with the
// path, strerror(errno) and the last good checkpoint; the others return
// kAborted. A step whose metrics were lost is never committed as a
// checkpoint (host 0 abstains from that save), so a rerun trains and logs
// it again. A std::bad_alloc on a device thread becomes one sentence about
// memory.
//
// RunTrainer runs in every worker process of the job; process 0 (slice 0
// worker 0) prints, writes the run directory's config.json, metrics.jsonl
// (each record with this start's resume index, metrics.h) and loss.svg (the
// earlier starts' records up to the restored step included, also when there
// is nothing left to train), and warns when a resume changes the schedule
// (run_directory.h). The caller holds the run directory's lock in process 0
// (RunDirectoryLock, run_directory.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/decoder.h"
#include "runtime/runtime.h"
#include "train/config.h"
#include "train/model_config.h"

namespace multislice::train {

struct TrainerOptions {
  TrainConfig config;  // validated, run_name set
  // The directory holding train.bin and val.bin.
  std::string dataset_dir;
  // One device's measured bf16 (or f32, with dtype f32) matmul peak, FLOP/s;
  // MFU is reported against it (0: not reported).
  double peak_flops_per_device = 0;
  // The machine in words for the first line, e.g. "CPU ..., ISA avx2,
  // matmul bfloat16 via float32 kernels (avx2)" (empty: the dtype alone).
  std::string platform;
  // Lines printed after the first one ("note: ...").
  std::vector<std::string> notes;
  bool show_progress = false;  // a progress bar on stdout (a terminal)
  bool quiet = false;          // no per-step lines (tests)
  // The memory estimate and what was available at start, in words ("this
  // configuration needs about ...; the host had ... available"), for the
  // message of an allocation that fails (train/memory.h).
  std::string memory_note;
  // When this worker's runtime start-up began (Unix seconds) and how long
  // it took (seconds): Runtime::Create (mesh, DCN connect, device threads)
  // and the start-up matmul peak, goodput's TPU_INITIALIZATION (metrics.h).
  // 0: not measured; the start is then RunTrainer's call.
  double runtime_start_time = 0;
  double runtime_init_seconds = 0;
};

struct TrainSummary {
  int64_t first_step = 0;  // the first step this run trained (1-based)
  int64_t last_step = 0;
  int64_t restored_step = -1;          // the step restored, or -1
  std::string restored_from = "none";  // "none", "checkpoint" or "replica"
  double seconds_to_first_step = 0;    // from RunTrainer's start
  double final_loss = 0;
  double final_val_loss = -1;    // -1 when never evaluated
  double mean_step_seconds = 0;  // over the steps after the first
  double mean_mfu = 0;
  double tokens_per_second = 0;
  std::vector<double> losses;  // of steps first_step..last_step
};

Status RunTrainer(runtime::Runtime& rt, const TrainerOptions& options,
                  TrainSummary* summary);

// The checkpoint directory of a run: RunDirectory(config) + "/checkpoints".
std::string CheckpointDirectory(const TrainConfig& config);

}  // namespace multislice::train
