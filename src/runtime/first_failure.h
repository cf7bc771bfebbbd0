// Which worker a failure started at. When a worker dies or stops answering,
// its peers fail first; their own peers then lose *them* and, on their own,
// would name a survivor that merely exited. So a worker that fails because
// of a peer records "I lost P" in the job's store, and before reporting it
// follows those records from P (P lost Q, Q lost R, ...) to the first worker
// that recorded nothing within a short wait: the one the failure started at.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace multislice::runtime {

// The process a worker's record says it lost, waiting at most `wait` for the
// record to appear; nullopt when none appeared.
using LostRecord =
    std::function<std::optional<int>(int process, std::chrono::milliseconds)>;

// Follows the records from `lost` (the peer `me` lost) and returns the
// process the failure started at: the first on the chain without a record.
// `lost` itself when it has none; nullopt when the chain comes back to a
// process already on it (no culprit among the records). Each wait is bounded
// by `wait`, the whole walk by `wait` times the number of processes.
std::optional<int> FirstFailure(int me, int lost, int process_count,
                                const LostRecord& record_of,
                                std::chrono::milliseconds wait);

// The records in a rendezvous store: key "lost/<process>".
void RecordLost(gloo::rendezvous::Store& store, int me, int lost);
LostRecord StoreLostRecords(gloo::rendezvous::Store& store);

}  // namespace multislice::runtime
