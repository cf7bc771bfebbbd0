// Which processes are still in a job after some were lost, agreed through
// the rendezvous store (DiLoCo's diloco_continue_on_failure).
//
// The launcher that reaps a lost worker records it ("gone/<process>");
// every survivor that noticed a loss records itself as alive in the
// generation it is leaving ("members/<generation>/alive/<process>") and
// waits until every current member is accounted for, one way or the other.
// A process recorded gone is gone even when it also recorded itself alive
// (it died after noticing the loss). The launcher records a lost slice's
// other workers before the one that failed, and no survivor can finish
// waiting before the failed one is accounted for, so every survivor ends
// with the same answer however late it arrives. A member neither alive nor gone
// within the timeout (a hung process, or a launcher that records nothing) ends
// the wait in kDeadlineExceeded, naming it: then the job stops as without
// the key.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <vector>

#include "common/status.h"

namespace multislice::runtime {

// Records that `process` has exited and will not come back in this attempt.
// Errors of the store are swallowed: the survivors then time out.
void RecordGone(gloo::rendezvous::Store& store, int process);

// `me` (one of `members`, the processes of `generation`) waits for every
// member to be recorded alive in that generation or gone; returns the gone
// ones, in increasing order. kFailedPrecondition when `me` is among them
// (its slice is being stopped); kDeadlineExceeded after `timeout`, naming
// the members not accounted for.
Result<std::vector<int>> AgreeOnGone(gloo::rendezvous::Store& store,
                                     int generation, int me,
                                     const std::vector<int>& members,
                                     std::chrono::milliseconds timeout);

}  // namespace multislice::runtime
