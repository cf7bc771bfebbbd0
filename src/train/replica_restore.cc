#include "train/replica_restore.h"

#include <cstring>
#include <string>

#include "train/train_state.h"

namespace multislice::train {
namespace {

using runtime::ReduceOp;

// This shard's blobs of `kinds` in the replica, when it holds all of them
// at the shard's size for this global batch (else false).
bool FindShard(const RestoredState* replica, const ParallelPlan& plan,
               int global_rows, const std::vector<const char*>& kinds,
               std::vector<const Blob*>& parts) {
  if (!replica || !replica->metadata.contains("iterator") ||
      replica->metadata["iterator"].value("global_rows", 0) != global_rows) {
    return false;
  }
  parts.clear();
  for (const char* kind : kinds) {
    auto it = replica->blobs.find(
        ShardBlobName(kind, plan.shard_begin(), plan.tensor_rank(),
                      plan.tensor_size(), plan.stage_rank(), plan.stage_size(),
                      plan.diloco_rank(), plan.diloco_size()));
    if (it == replica->blobs.end() ||
        it->second.data.size() !=
            static_cast<size_t>(plan.shard_count()) * sizeof(float)) {
      return false;
    }
    parts.push_back(&it->second);
  }
  return true;
}

}  // namespace

// A replica that rejoins lost the inner steps since the global parameters
// were set. What reaches a complete replica goes to a scratch buffer.
Status RejoinFromReplica(ParallelPlan& plan, int root, bool complete,
                         const std::vector<float*>& targets) {
  const bool keep = complete && plan.diloco_rank() != root;
  std::vector<float> scratch(keep ? plan.shard_count() : 0);
  // Every target but the parameters (index 0): moments, outer state.
  for (size_t i = 1; i < targets.size(); ++i) {
    RETURN_IF_ERROR(plan.BroadcastOverDiloco(
        root, keep ? scratch.data() : targets[i], "replica-rejoin"));
  }
  if (!complete && targets.size() > 3) {  // targets[3]: the outer copy
    std::memcpy(targets[0], targets[3],
                static_cast<size_t>(plan.shard_count()) * sizeof(float));
  }
  return OkStatus();
}

Result<ReplicaRestore> RestoreFromReplicas(
    ParallelPlan& plan, const RestoredState* replica, int64_t restored_step,
    int global_rows, DeviceBuffers& b, const std::vector<ExtraShard>& extra) {
  ReplicaRestore result;
  std::vector<const char*> kinds = {"params", "adam_m", "adam_v"};
  std::vector<float*> targets = {b.shard.data(), b.adam_m.data(),
                                 b.adam_v.data()};
  for (const ExtraShard& e : extra) {
    kinds.push_back(e.kind);
    targets.push_back(e.data);
  }
  std::vector<const Blob*> parts;
  const float have = FindShard(replica, plan, global_rows, kinds, parts)
                         ? static_cast<float>(replica->step)
                         : -1.0f;
  float newest = have;
  RETURN_IF_ERROR(
      plan.ReduceOverAll(&newest, 1, "replica-step", ReduceOp::kMax));
  if (newest <= static_cast<float>(restored_step)) return result;

  // Every shard of this device's DiLoCo replica (the whole mesh without
  // DiLoCo) covered: some data replica of each shard has it.
  const bool mine = have == newest;
  float covered = mine ? 1.0f : 0.0f;
  RETURN_IF_ERROR(
      plan.ReduceOverData(&covered, 1, "replica-covered", ReduceOp::kMax));
  RETURN_IF_ERROR(
      plan.ReduceOverReplica(&covered, 1, "replica-covered", ReduceOp::kMin));
  const bool complete = covered == 1.0f;
  // The lowest complete replica (all of them without DiLoCo).
  float first_complete =
      complete ? static_cast<float>(plan.diloco_rank()) : 1e9f;
  RETURN_IF_ERROR(plan.ReduceOverDiloco(&first_complete, 1, "replica-complete",
                                        ReduceOp::kMin));
  if (first_complete >= 1e9f) {
    result.uncovered_step = static_cast<int64_t>(newest);
    return result;
  }
  float root = mine ? static_cast<float>(plan.data_rank()) : 1e9f;
  RETURN_IF_ERROR(
      plan.ReduceOverData(&root, 1, "replica-root", ReduceOp::kMin));
  if (complete) {
    for (size_t i = 0; i < targets.size(); ++i) {
      if (mine) {
        std::memcpy(targets[i], parts[i]->data.data(), parts[i]->data.size());
      }
      RETURN_IF_ERROR(plan.BroadcastOverData(static_cast<int>(root), targets[i],
                                             "replica-state"));
    }
    result.root = static_cast<int>(root);
  }
  result.step = static_cast<int64_t>(newest);
  if (plan.diloco_size() == 1) return result;
  float all_complete = complete ? 1.0f : 0.0f;
  RETURN_IF_ERROR(plan.ReduceOverDiloco(&all_complete, 1, "replica-complete",
                                        ReduceOp::kMin));
  if (all_complete == 1.0f) return result;
  RETURN_IF_ERROR(RejoinFromReplica(plan, static_cast<int>(first_complete),
                                    complete, targets));
  result.rejoin_root = static_cast<int>(first_complete);
  result.rejoined = !complete;
  return result;
}

}  // namespace multislice::train
