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
//
// A lost worker restarted by its launcher (its incarnation: 1 at the first
// restart, in MULTISLICE_INCARNATION) asks to rejoin
// ("rejoin/<process>.<incarnation>") and waits. The survivors admit a
// slice once every worker of it has asked: the lowest of them records each
// one's admission ("admitted/<process>.<incarnation>": the new generation,
// the step it joins after, the members and their incarnations), and all of
// them connect that generation together. Gone records name an incarnation
// ("gone/<process>" for the first start, "gone/<process>.<n>" after), so a
// rejoined worker is not taken for gone by its old record. When the
// survivors will admit no one any more (their training is over) they close
// the admissions, and a worker still waiting is told so.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace multislice::runtime {

// Records that `process`'s start number `incarnation` has exited. Errors
// of the store are swallowed: the survivors then time out.
void RecordGone(gloo::rendezvous::Store& store, int process,
                int incarnation = 0);

// `me` (one of `members`, the processes of `generation`) waits for every
// member to be recorded alive in that generation or gone (in its incarnation,
// `incarnations` by process); returns the gone ones, in increasing order.
// kFailedPrecondition when `me` is among them (its slice is being stopped);
// kDeadlineExceeded after `timeout`, naming the members not accounted for.
Result<std::vector<int>> AgreeOnGone(gloo::rendezvous::Store& store,
                                     int generation, int me,
                                     const std::vector<int>& members,
                                     const std::vector<int>& incarnations,
                                     std::chrono::milliseconds timeout);

// What a rejoining worker is told when it is admitted.
struct Admission {
  int generation = 0;        // the membership it joins
  int64_t step = 0;          // the last step the survivors trained before it
  std::vector<int> members;  // the processes of that generation
  std::vector<int> incarnations;  // of every process of the job
};
std::string FormatAdmission(const Admission& a);
// kInvalidArgument naming what is malformed.
Result<Admission> ParseAdmission(const std::string& text, int process_count);

Status RequestRejoin(gloo::rendezvous::Store& store, int process,
                     int incarnation);
bool RejoinRequested(gloo::rendezvous::Store& store, int process,
                     int incarnation);
Status RecordAdmission(gloo::rendezvous::Store& store, int process,
                       int incarnation, const Admission& admission);
void CloseAdmissions(gloo::rendezvous::Store& store);
// Waits for the admission of `process`'s start `incarnation`: nullopt when
// the admissions were closed first; kDeadlineExceeded after `timeout`.
Result<std::optional<Admission>> WaitForAdmission(
    gloo::rendezvous::Store& store, int process, int incarnation,
    int process_count, std::chrono::milliseconds timeout);

}  // namespace multislice::runtime
