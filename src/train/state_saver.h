// Saving a process's training state from its device threads, and the
// failures that stop the job at the next step.
//
// At a save step every device thread of the process hands over its shard
// (a checkpoint takes data rank 0's shards, an in-memory replica every
// shard), then device 0 copies them out into the checkpoint or the replica
// (CheckpointManager: the only part that blocks training; an async manager
// writes in the background) while the others wait at the process's barrier.
//
// A failure that must not go unnoticed (a save that failed, at once or later
// in the background; a metrics record that could not be written) is this
// process's fault: device 0 adds it to the step's failure flag, so every
// device of the job stops at the same step; the process that failed returns
// the failure with the last good checkpoint, the others kAborted. A process
// with a fault abstains from the next checkpoint, so that step is not
// committed.
#pragma once

#include <atomic>
#include <barrier>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/decoder.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/train_state.h"

namespace multislice::train {

struct StateSaverOptions {
  CheckpointManager* checkpoints = nullptr;
  CheckpointManager* replicas = nullptr;  // null: no in-memory recovery
  int local_count = 1;                    // device threads of the process
  // What the metadata of a save records.
  model::DecoderConfig model;
  std::vector<std::string> axis_names;
  std::vector<int> mesh_shape;
  int num_slices = 1;
  int tensor_parallelism = 1;    // the mesh's tensor axis
  int pipeline_parallelism = 1;  // and its stage axis
  // DiLoCo's replicas (0 without DiLoCo) and whether the outer state has a
  // pending fragment sum (overlapped syncs).
  int diloco_replicas = 0;
  bool diloco_pending = false;
  std::vector<int> diloco_schedule;  // train_state.h's StateMetadata
  // The process's rows of the global batch: its first device's first row
  // and the rows of all its devices.
  int row_begin = 0, rows = 1;
  // Run by device 0 before a checkpoint commits while there is no fault
  // (e.g. the metrics made durable); its failure is a fault.
  std::function<Status()> before_checkpoint;
};

class StateSaver {
 public:
  explicit StateSaver(StateSaverOptions options);

  // Called by every device thread of the process at the same step; shard is
  // this device's, and iterator device 0's state after that step. A data
  // rank 0 device may add `stand_ins`: shards it writes for DiLoCo replicas
  // that are gone (diloco_continue_on_failure).
  void SaveCheckpoint(int local, int64_t step, bool data_rank0,
                      const StateShard& shard, const IteratorState& iterator,
                      const std::vector<StateShard>& stand_ins = {});
  void SaveReplica(int local, int64_t step, const StateShard& shard,
                   const IteratorState& iterator);

  // Device 0's share of the step's failure flag (1: stop): a background save
  // that has failed since the last step, or any other fault; 0 elsewhere.
  float FaultFlag(int local);

  // The status every device thread returns when the job stops at `step`
  // (a save still in flight may finish first).
  Status Stop(int local, int64_t step);

  // Every device thread: until the checkpoint in the background (if any)
  // is done; its failure becomes the fault of the next step. For a change
  // of the job's members, which the next save's barriers count.
  void WaitForSaves(int local);

  // After the last step: waits for the saves (device 0) and returns the
  // failure found, if any.
  Status Finish(int local, int64_t last_step);

  void SetFault(const Status& s);
  Status Fault();

 private:
  void CopyOut(int local, int64_t step, std::vector<StateShard> shards,
               const IteratorState& iterator, bool checkpoint);
  Status StopStatus(int64_t step);

  StateSaverOptions options_;
  std::barrier<> barrier_;
  std::vector<std::vector<StateShard>> shards_;  // by local index
  std::mutex mu_;
  Status fault_;  // the first, without the last good checkpoint
};

}  // namespace multislice::train
