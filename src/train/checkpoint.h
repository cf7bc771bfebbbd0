// A model-agnostic checkpoint store for `multislice train` (spec 3.6).
//
// The trainer hands each host's state as named byte blobs (weight and
// optimizer shards, the data iterator's JSON state, ...) plus an opaque JSON
// metadata object (mesh, shapes, shardings), and gets them back. This unit
// knows nothing about models; it owns only the on-disk layout, the atomic
// commit protocol, the background writer and the integrity checks.
//
// Layout under the checkpoint directory DIR:
//
//   DIR/<step>/host<H>.bin   the host's blobs, concatenated in order
//   DIR/<step>/host<H>.json  format version, step, host index and count, per
//                            blob: name, offset, size (bytes), dtype, shape,
//                            CRC32C of its bytes; the caller's metadata
//   DIR/<step>/COMMITTED     the commit marker, written last
//
// <step> is decimal without padding. A step is complete if and only if
// DIR/<step>/COMMITTED exists; readers ignore everything else.
//
// Save protocol (every host runs it; `barrier` synchronises all hosts and
// is called exactly three times per save, even after an error, so that no
// host is left waiting; only invalid options or step return before it):
//
//   1. Every host fails if DIR/<step>/COMMITTED exists (a complete step is
//      never overwritten). Host 0 removes any leftover DIR/<step>.tmp and
//      uncommitted DIR/<step> of an earlier attempt. barrier "ckpt:prepare"
//   2. Every host creates DIR/<step>.tmp (mkdir -p semantics), writes
//      host<H>.bin then host<H>.json with open/write/fsync/close, and fsyncs
//      the .tmp directory.                         barrier "ckpt:write"
//   3. Host 0 checks that host<H>.json exists for every H < host_count,
//      renames DIR/<step>.tmp to DIR/<step>, fsyncs DIR, writes COMMITTED
//      via COMMITTED.tmp + fsync + rename, and fsyncs DIR/<step>. It then
//      deletes complete steps beyond the newest `max_to_keep` and any
//      `*.tmp` or uncommitted step directory older than <step>.
//                                                  barrier "ckpt:commit"
//
// A crash at any point before the COMMITTED rename leaves either a .tmp
// directory or a step directory without COMMITTED: never restored, and
// cleaned up by a later successful save. A save that fails without a crash
// (a full disk: ENOSPC, EIO, EFBIG) is cleaned up at once: after the write
// barrier, host 0 removes DIR/<step>.tmp and DIR/<step> (COMMITTED first,
// should the marker's rename have happened), so the directory holds the
// complete steps before it and nothing that looks like this step. Only
// host 0 learns whether the commit succeeded; other hosts see a write error
// of their own only. Every file error names the path and strerror(errno).
//
// Thread-safety: a CheckpointManager may be used from one thread at a time;
// with async saving it owns one background writer thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "nlohmann/json.hpp"

namespace multislice {

// The version written to host<H>.json; readers reject any other.
inline constexpr int kCheckpointFormatVersion = 1;

// One named byte blob of a host's state. `dtype` and `shape` are the
// caller's and stored verbatim; `data` is owned (the copy out of device
// buffers is the caller's).
struct Blob {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

// What Restore returns: one host's blobs by name, plus the metadata the
// saver passed for that host.
struct RestoredState {
  int64_t step = 0;
  int host = 0;
  int host_count = 1;
  std::map<std::string, Blob> blobs;
  nlohmann::json metadata;
};

struct CheckpointOptions {
  // DIR above; created (mkdir -p) on the first save.
  std::string directory;
  // This host's index and the number of hosts that save together.
  int host = 0;
  int host_count = 1;
  // Complete steps to keep; older ones are deleted after a commit. >= 1.
  int max_to_keep = 3;
  // Save in a background thread (true) or inline (false).
  bool async = true;
  // Blocks until every host has called it with the same name ("<step>/
  // ckpt:prepare", then ckpt:write and ckpt:commit); must be set when
  // host_count > 1. Unset means a no-op (one host).
  std::function<Status(const std::string& name)> barrier;
  // Hosts gone from the job that do not save (DiLoCo's
  // diloco_continue_on_failure, whose survivors save stand-in shards for
  // them): the leader writes an empty host file for each (its own
  // metadata, with an empty "shards" list where it has one), so that the
  // step commits with host_count hosts. Unset: none.
  std::function<std::vector<int>()> absent_hosts;
  // Told of each save's writing (its files, checksums and commit) with its
  // wall-clock start and end (runtime::Trace::NowMicros), e.g. for the
  // profiler's trace. Unset: nothing.
  std::function<void(int64_t step, int64_t start_us, int64_t end_us)>
      on_written;
};

// CRC32C (Castagnoli) of `size` bytes, continuing from `crc` (0 to start).
// Uses the SSE4.2 crc32 instruction at every ISA level above the baseline
// (common/cpu_isa.h), the table below otherwise.
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);
// The same over a slicing-by-8 table, on any CPU (the fallback; for tests).
uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc = 0);

class CheckpointManager {
 public:
  // Options are validated by the first Save (and by restores, for the
  // directory); the constructor never fails.
  explicit CheckpointManager(CheckpointOptions options);
  // Waits for an in-flight save; its status is lost, so call Wait() first.
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Saves this host's blobs and metadata as step `step` (>= 0) using the
  // protocol above. Async: waits for the previous save (at most one in
  // flight), queues the new one and returns at once; if the previous save
  // failed, returns that error, but the new save is queued all the same
  // (every host must enter every save's barriers, or its peers would hang).
  // Sync: writes inline and returns the outcome. Blob names must be unique
  // and non-empty (else kInvalidArgument; with a barrier, the save still
  // runs the barriers, writing nothing, so that the peers fail too).
  Status Save(int64_t step, std::vector<Blob> blobs, nlohmann::json metadata);

  // Waits for the in-flight save, if any, and returns its status (ok if
  // none). The status is reported once.
  Status Wait();

  // Wait() without waiting: the status of the last save once it has ended
  // (reported once, as by Wait), ok while it is still being written or when
  // there is none. A training loop calls it at every step boundary, so that
  // a background save that failed stops the run at the next step.
  Status Poll();

  // Takes part in save `step` without writing anything: the barriers run as
  // in Save, so that no peer hangs, and the step is not committed (on host 0
  // directly; on another host because host 0 finds its index missing). For
  // a host whose state of that step must not become a checkpoint, e.g. one
  // whose metrics of the step were lost. `reason` is not reported again.
  Status Abstain(int64_t step, Status reason);

  // Steps with a COMMITTED marker, ascending. Empty if DIR does not exist.
  Result<std::vector<int64_t>> CompleteSteps() const;
  // The newest complete step, or NotFound.
  Result<int64_t> LatestCompleteStep() const;
  // The number of hosts that saved complete step `step`.
  Result<int> HostCount(int64_t step) const;

  // Reads host `host`'s files of complete step `step` (any host of the
  // saving job, so a job with a different host count can gather every old
  // shard). Checks every blob's size and checksum; a corrupt or truncated
  // file is one line naming the file and the blob.
  Result<RestoredState> Restore(int64_t step, int host) const;

  // Restore(latest complete step, host), falling back to older complete
  // steps when one fails; each failure adds its one-line reason to
  // `warnings` (may be null). NotFound if no step is complete.
  Result<RestoredState> RestoreLatest(int host,
                                      std::vector<std::string>* warnings) const;

  // The wall time (seconds) and bytes written by this host's last
  // successful save, from the first write to the last barrier.
  double last_save_seconds() const;
  uint64_t last_save_bytes() const;

 private:
  struct SaveJob {
    int64_t step;
    std::vector<Blob> blobs;
    nlohmann::json metadata;
    // Not ok: the blobs were rejected (or the host abstains); the save only
    // runs the barriers.
    Status invalid;
  };

  Status ValidateOptions(int64_t step) const;
  static Status ValidateBlobs(const std::vector<Blob>& blobs);
  Status RunSave(const SaveJob& job);
  Status RunSaveCatching(const SaveJob& job);
  Status WriteHostFiles(const SaveJob& job, int host,
                        const std::string& tmp_dir,
                        uint64_t* bytes_written) const;
  Status Commit(int64_t step) const;
  // Removes what a failed save of `step` left (leader only, after the write
  // barrier): DIR/<step>.tmp and DIR/<step>, its marker first.
  void DiscardFailedStep(int64_t step) const;
  Status Enqueue(SaveJob job);
  void CollectGarbage(int64_t committed_step) const;
  Status CallBarrier(int64_t step, const char* phase) const;
  void WriterLoop();

  const CheckpointOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<SaveJob> queued_;  // set by Save, taken by the writer
  bool in_flight_ = false;         // queued or being written
  bool stopping_ = false;
  Status last_async_status_;
  double last_save_seconds_ = 0;
  uint64_t last_save_bytes_ = 0;
  std::thread writer_;  // only when options_.async
};

}  // namespace multislice
