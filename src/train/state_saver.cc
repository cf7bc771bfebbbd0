#include "train/state_saver.h"

#include <utility>

namespace multislice::train {
namespace {

// "; the last good checkpoint is step 10" (after any save in flight).
std::string LastGoodCheckpoint(const CheckpointManager& checkpoints) {
  Result<int64_t> step = checkpoints.LatestCompleteStep();
  if (!step.ok()) return "; there is no complete checkpoint yet";
  return "; the last good checkpoint is step " + std::to_string(*step);
}

}  // namespace

StateSaver::StateSaver(StateSaverOptions options)
    : options_(std::move(options)),
      barrier_(options_.local_count),
      shards_(static_cast<size_t>(options_.local_count)) {}

void StateSaver::SetFault(const Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fault_.ok()) fault_ = s;
}

Status StateSaver::Fault() {
  std::lock_guard<std::mutex> lock(mu_);
  return fault_;
}

void StateSaver::SaveCheckpoint(int local, int64_t step, bool data_rank0,
                                const StateShard& shard,
                                const IteratorState& iterator,
                                const std::vector<StateShard>& stand_ins) {
  std::vector<StateShard> shards;
  if (data_rank0) {
    shards.push_back(shard);
    shards.insert(shards.end(), stand_ins.begin(), stand_ins.end());
  }
  CopyOut(local, step, std::move(shards), iterator, true);
}

void StateSaver::SaveReplica(int local, int64_t step, const StateShard& shard,
                             const IteratorState& iterator) {
  CopyOut(local, step, {shard}, iterator, false);
}

void StateSaver::CopyOut(int local, int64_t step,
                         std::vector<StateShard> shards,
                         const IteratorState& iterator, bool checkpoint) {
  shards_[local] = std::move(shards);
  barrier_.arrive_and_wait();
  if (local == 0) {
    std::vector<StateShard> mine;
    for (auto& s : shards_) {
      mine.insert(mine.end(), s.begin(), s.end());
      s.clear();
    }
    IteratorState process = iterator;
    process.row_begin = options_.row_begin;
    process.rows = options_.rows;
    const nlohmann::json metadata = StateMetadata(
        step, options_.model, options_.axis_names, options_.mesh_shape,
        options_.num_slices, mine, process, options_.tensor_parallelism,
        options_.pipeline_parallelism, options_.diloco_replicas,
        options_.diloco_pending, options_.diloco_schedule);
    if (checkpoint) {
      if (options_.before_checkpoint && Fault().ok()) {
        if (Status s = options_.before_checkpoint(); !s.ok()) SetFault(s);
      }
      const Status fault = Fault();
      Status s = fault.ok() ? options_.checkpoints->Save(step, ShardBlobs(mine),
                                                         metadata)
                            : options_.checkpoints->Abstain(step, fault);
      if (!s.ok()) SetFault(s);
    } else {
      Status s = options_.replicas->Save(step, ShardBlobs(mine), metadata);
      if (!s.ok()) SetFault(s.WithContext("in-memory replica"));
    }
  }
  barrier_.arrive_and_wait();  // the copy is done: go on training
}

float StateSaver::FaultFlag(int local) {
  if (local != 0) return 0.0f;
  if (Status s = options_.checkpoints->Poll(); !s.ok()) SetFault(s);
  if (options_.replicas) {
    if (Status s = options_.replicas->Poll(); !s.ok()) {
      SetFault(s.WithContext("in-memory replica"));
    }
  }
  return Fault().ok() ? 0.0f : 1.0f;
}

Status StateSaver::StopStatus(int64_t step) {
  const Status fault = Fault();
  if (!fault.ok()) {
    return Internal(fault.message() +
                    LastGoodCheckpoint(*options_.checkpoints));
  }
  return Aborted("stopped at step " + std::to_string(step) +
                 ": another worker of the job failed (its message says why)");
}

Status StateSaver::Stop(int local, int64_t step) {
  if (local == 0) {
    if (Status s = options_.checkpoints->Wait(); !s.ok()) SetFault(s);
  }
  barrier_.arrive_and_wait();
  return StopStatus(step);
}

void StateSaver::WaitForSaves(int local) {
  if (local == 0) {
    if (Status s = options_.checkpoints->Wait(); !s.ok()) SetFault(s);
  }
  barrier_.arrive_and_wait();
}

Status StateSaver::Finish(int local, int64_t last_step) {
  if (local != 0) return OkStatus();
  // The last step's failures have no next step to stop at.
  if (Status s = options_.checkpoints->Wait(); !s.ok()) SetFault(s);
  if (options_.before_checkpoint && Fault().ok()) {
    if (Status s = options_.before_checkpoint(); !s.ok()) SetFault(s);
  }
  if (!Fault().ok()) return StopStatus(last_step);
  return OkStatus();
}

}  // namespace multislice::train
