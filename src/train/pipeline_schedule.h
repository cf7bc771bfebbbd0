// The order in which a pipeline stage runs its microbatches (GPipe and
// 1F1B) and exchanges their activations and gradients with its neighbours.
//
// GPipe (Huang et al. 2019): every forward, then every backward. 1F1B
// (PipeDream-Flush, Narayanan et al. 2021; Megatron's default): stage s of p
// runs min(p - s - 1, m) forwards, then alternates one forward and one
// backward, then the remaining backwards; at most p - s microbatches are in
// flight on stage s instead of m. Both have the bubble (p - 1) / (m + p - 1)
// of the step when a microbatch's forward and backward take the same time
// on every stage.
//
// A stage's program interleaves its compute with point-to-point messages:
// the activation of microbatch i goes from stage s to s + 1 after F(i), the
// gradient of that activation back after B(i) on s + 1. The messages of a
// pair of neighbours meet in issue order (runtime/collectives.h, Send/Recv),
// so both sides must issue them in the same order: the programs follow
// Megatron's pairing (a stage that alternates posts the receive of its next
// forward's input before the send of its last backward's gradient), and
// pipeline_schedule_test checks, for many (p, m), that every pair's
// sequences agree and that the programs cannot deadlock on FIFO streams.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace multislice::train {

enum class PipelineSchedule { kGPipe, k1F1B };

// "GPipe" or "1F1B" (any case, torchtitan's names); kInvalidArgument naming
// the key otherwise.
Result<PipelineSchedule> ParsePipelineSchedule(const std::string& text);
std::string PipelineScheduleName(PipelineSchedule schedule);

struct PipelineOp {
  enum Kind {
    kRecvActivation,  // post the receive of F(microbatch)'s input
    kForward,         // wait for that input, run F(microbatch)
    kSendActivation,  // post the send of F(microbatch)'s output
    kRecvGradient,    // post the receive of B(microbatch)'s output gradient
    kBackward,        // wait for it, run B(microbatch)
    kSendGradient,    // post the send of B(microbatch)'s input gradient
  };
  Kind kind;
  int microbatch;
};

// The program of `stage` of `stages` for `microbatches` microbatches.
std::vector<PipelineOp> StageProgram(PipelineSchedule schedule, int stage,
                                     int stages, int microbatches);

// The most microbatches whose activations stage `stage` keeps at once.
int MicrobatchesInFlight(PipelineSchedule schedule, int stage, int stages,
                         int microbatches);

// (p - 1) / (m + p - 1).
double BubbleFraction(int stages, int microbatches);

}  // namespace multislice::train
