// The hang digest: which workers a stuck job waits for, after Megascale's
// (MaxText's megascale_hang_playbook.md). When a collective has not finished
// within the hang threshold, every worker that can reports where each of its
// devices is (hang_watch.h); AnalyzeHang turns those reports into the cause
// and the suspected culprits:
//
//   - a worker that did not report within the grace period is a culprit
//     (stopped, hung in the kernel, or unreachable): its watch thread, which
//     answers even while its devices are blocked, is its heartbeat;
//   - "program mismatch": devices of the same program (the same pipeline
//     stage) that issued different collectives at the same position of their
//     sequences, found by comparing the running hashes of the signatures
//     they issued; the culprits are the devices against the majority at the
//     first differing position;
//   - otherwise, among the devices of one program, those that have not
//     reached the collective the others wait in (they wait in an earlier
//     one, or have not issued it: still computing).
//
// The workers that did report are listed with each device's phase: the
// oldest collective it has not finished, its phase and for how long, or
// "computing" with the last collective it issued.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/progress.h"

namespace multislice::runtime {

struct DeviceHangState {
  DeviceProgressSnapshot progress;
  int program = 0;  // devices that issue the same collectives share it
};

struct WorkerHangReport {
  int process = 0;
  std::string name;  // e.g. "slice 1 worker 0"
  std::string host;
  std::vector<DeviceHangState> devices;
};

struct HangCulprit {
  int process = 0;
  std::string name;
  std::string reason;  // one sentence
};

// The first position at which devices of one program issued different
// collectives.
struct ProgramMismatch {
  uint64_t sequence = 0;
  std::string expected;       // what the majority issued there
  std::string issued;         // what the culprits issued there
  bool at_or_before = false;  // the first difference is at or before it
                              // (older than the signatures kept)
};

struct HangDigest {
  std::string cause;  // "hang" or "program mismatch"
  double threshold_seconds = 0;
  std::vector<HangCulprit> culprits;
  std::optional<ProgramMismatch> mismatch;
  // The collective most of the waiting devices are in, e.g.
  // "all_reduce[data]#12 grads" (empty when none waits).
  std::string waited_in;
  std::vector<WorkerHangReport> workers;  // those that reported
  std::vector<int> silent;                // those that did not
  std::string file;  // where the writer put its JSON ("" when nowhere)
};

// `expected`: the processes of the job (the live ones); `names`: every
// process's name by index.
HangDigest AnalyzeHang(const std::vector<WorkerHangReport>& reports,
                       const std::vector<int>& expected,
                       const std::vector<std::string>& names,
                       double threshold_seconds, double grace_seconds);

nlohmann::json ToJson(const WorkerHangReport& report);
// kInvalidArgument naming the field for a report that is not one.
Result<WorkerHangReport> ParseWorkerHangReport(const std::string& text);

nlohmann::json ToJson(const HangDigest& digest);
// kInvalidArgument naming the field for a digest that is not one.
Result<HangDigest> ParseHangDigest(const std::string& text);
// The lines the survivors print: the cause, the culprits, each worker's
// devices.
std::string FormatHangDigest(const HangDigest& digest);

}  // namespace multislice::runtime
