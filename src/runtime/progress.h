// Where one device is in its program of collectives, for the hang digest
// (hang_digest.h): how many it has issued, a running hash of what they were,
// the last few of them, and the oldest one not finished with the phase it
// is in.
//
// DeviceCollectives records into it: Issued when a collective is launched,
// PhaseStarted when one of its phases starts on a stream, Finished when its
// last phase ends. Snapshot may be called from any thread at any time (the
// hang watch's), while the device thread and its streams record.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace multislice::runtime {

// One issued collective as the digest compares it.
struct IssuedCollective {
  uint64_t sequence = 0;  // 1-based, in the device's issue order
  std::string signature;  // e.g. "all_reduce[data,fsdp] loss-and-norm"
  uint64_t hash = 0;      // running hash of the signatures up to this one
};

// The oldest collective of a device that has not finished.
struct PendingCollective {
  uint64_t sequence = 0;
  std::string what;    // as errors name it, e.g. "all_gather[fsdp]#7 layer0"
  std::string phase;   // the running phase, e.g. "dcn all-reduce", or
                       // "queued" before its first phase started
  double seconds = 0;  // since it was issued
};

struct DeviceProgressSnapshot {
  int device = 0;
  uint64_t issued = 0;
  uint64_t hash = 0;  // after the last issued one; 0 before any
  std::vector<IssuedCollective> recent;  // oldest first
  std::optional<PendingCollective> pending;
};

// Running hash of signatures: FNV-1a 64 over each signature and a separator.
uint64_t ChainHash(uint64_t previous, const std::string& signature);

// "all_reduce[data]#12 loss" -> "all_reduce[data] loss": the part of a
// collective's name that every device of the same program issues alike.
std::string SignatureOf(const std::string& what);

class DeviceProgress {
 public:
  // Keeps the last `recent` signatures.
  explicit DeviceProgress(int device, size_t recent = 32);

  void Issued(uint64_t sequence, const std::string& what);
  void PhaseStarted(uint64_t sequence, const std::string& phase);
  void Finished(uint64_t sequence);

  // The device thread's time blocked in CollectiveHandle::Wait, in total:
  // a step's compute is its wall time less what this grew by.
  void AddWait(std::chrono::steady_clock::duration waited);
  double wait_seconds() const;

  DeviceProgressSnapshot Snapshot() const;
  // How long the oldest unfinished collective has been issued; zero when
  // none is in flight.
  std::chrono::steady_clock::duration OldestPendingAge() const;

 private:
  struct Pending {
    std::string what;
    std::string phase = "queued";
    std::chrono::steady_clock::time_point issued_at;
  };

  const int device_;
  const size_t keep_;
  mutable std::mutex mu_;
  uint64_t issued_ = 0;
  uint64_t hash_ = 0;
  std::deque<IssuedCollective> recent_;
  std::map<uint64_t, Pending> pending_;  // by sequence
  std::atomic<int64_t> wait_ns_{0};
};

}  // namespace multislice::runtime
