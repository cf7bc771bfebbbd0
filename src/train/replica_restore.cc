#include "train/replica_restore.h"

#include <cstring>
#include <string>

#include "train/train_state.h"

namespace multislice::train {
namespace {

using runtime::ReduceOp;

// This shard's three blobs in the replica, when it holds all of them at the
// shard's size for this global batch (else nulls).
bool FindShard(const RestoredState* replica, const ParallelPlan& plan,
               int global_rows, const Blob* parts[3]) {
  if (!replica || !replica->metadata.contains("iterator") ||
      replica->metadata["iterator"].value("global_rows", 0) != global_rows) {
    return false;
  }
  const char* kinds[3] = {"params", "adam_m", "adam_v"};
  for (int i = 0; i < 3; ++i) {
    auto it = replica->blobs.find(ShardBlobName(
        kinds[i], plan.shard_begin(), plan.tensor_rank(), plan.tensor_size(),
        plan.stage_rank(), plan.stage_size()));
    if (it == replica->blobs.end() ||
        it->second.data.size() !=
            static_cast<size_t>(plan.shard_count()) * sizeof(float)) {
      return false;
    }
    parts[i] = &it->second;
  }
  return true;
}

}  // namespace

Result<ReplicaRestore> RestoreFromReplicas(ParallelPlan& plan,
                                           const RestoredState* replica,
                                           int64_t restored_step,
                                           int global_rows, DeviceBuffers& b) {
  ReplicaRestore result;
  const Blob* parts[3] = {nullptr, nullptr, nullptr};
  const float have = FindShard(replica, plan, global_rows, parts)
                         ? static_cast<float>(replica->step)
                         : -1.0f;
  float newest = have;
  RETURN_IF_ERROR(
      plan.ReduceOverAll(&newest, 1, "replica-step", ReduceOp::kMax));
  if (newest <= static_cast<float>(restored_step)) return result;

  // Every shard covered: some data replica of each shard has it.
  const bool mine = have == newest;
  float covered = mine ? 1.0f : 0.0f;
  RETURN_IF_ERROR(
      plan.ReduceOverData(&covered, 1, "replica-covered", ReduceOp::kMax));
  RETURN_IF_ERROR(
      plan.ReduceOverAll(&covered, 1, "replica-covered", ReduceOp::kMin));
  if (covered != 1.0f) {
    result.uncovered_step = static_cast<int64_t>(newest);
    return result;
  }
  float root = mine ? static_cast<float>(plan.data_rank()) : 1e9f;
  RETURN_IF_ERROR(
      plan.ReduceOverData(&root, 1, "replica-root", ReduceOp::kMin));
  std::vector<float>* targets[3] = {&b.shard, &b.adam_m, &b.adam_v};
  for (int i = 0; i < 3; ++i) {
    if (mine) {
      std::memcpy(targets[i]->data(), parts[i]->data.data(),
                  parts[i]->data.size());
    }
    RETURN_IF_ERROR(plan.BroadcastOverData(
        static_cast<int>(root), targets[i]->data(), "replica-state"));
  }
  result.step = static_cast<int64_t>(newest);
  result.root = static_cast<int>(root);
  return result;
}

}  // namespace multislice::train
