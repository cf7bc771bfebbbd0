// In-memory recovery at start-up: a repaired slice takes the newest step
// from a healthy data replica's host memory instead of the checkpoint.
//
// Every device says which step its host's replica (if any) holds for its
// shard; when the newest is newer than the checkpoint restored and every
// shard has a data replica that holds it, the lowest such data rank
// broadcasts its shard of the weights and moments over the data axis (DCN
// for a repaired slice). Collective: every device of the job calls it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "train/checkpoint.h"
#include "train/parallel_plan.h"

namespace multislice::train {

struct ReplicaRestore {
  int64_t step = -1;  // the step restored, or -1 (the checkpoint's stays)
  int root = -1;      // the data rank it came from
  // A newer replica step that did not cover every shard, or -1.
  int64_t uncovered_step = -1;
  // DiLoCo: the replica whose outer state the replicas without a whole copy
  // took (-1: every replica had its own), and whether this device's did.
  int rejoin_root = -1;
  bool rejoined = false;
};

// A buffer of the shard's size restored besides the weights and moments
// (DiLoCo's outer state): its blob kind and where it goes.
struct ExtraShard {
  const char* kind;
  float* data;
};

// replica: this host's replica (null: none); global_rows: this run's global
// batch, which the replica's must equal. On a restore b's shard and moments
// hold the replica's, and so does every `extra` buffer. Under DiLoCo the
// blobs are this device's replica's (diloco rank), and a replica restores
// from its own data replicas; a DiLoCo replica without a whole copy takes
// the lowest complete replica's moments and outer state, and the outer
// parameters as its own (`extra` must then start with the kinds "outer"
// and "outer_momentum"). Only when no replica is complete does the
// checkpoint stay.
// DiLoCo: every replica but `root` (a rank of the diloco axis's group) takes
// the root's moments and outer state: targets are the parameters, the two
// moments, the outer copy and its momentum. Those that are not `complete`
// (they lost their inner state) also take the outer copy as their
// parameters; the complete ones keep everything of theirs.
Status RejoinFromReplica(ParallelPlan& plan, int root, bool complete,
                         const std::vector<float*>& targets);

Result<ReplicaRestore> RestoreFromReplicas(
    ParallelPlan& plan, const RestoredState* replica, int64_t restored_step,
    int global_rows, DeviceBuffers& b,
    const std::vector<ExtraShard>& extra = {});

}  // namespace multislice::train
