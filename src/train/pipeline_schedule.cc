#include "train/pipeline_schedule.h"

#include <algorithm>
#include <cctype>

namespace multislice::train {
namespace {

struct Action {
  bool forward;
  int microbatch;
};

// The compute order of a stage.
std::vector<Action> Actions(PipelineSchedule schedule, int stage, int stages,
                            int m) {
  std::vector<Action> actions;
  if (schedule == PipelineSchedule::kGPipe) {
    for (int i = 0; i < m; ++i) actions.push_back({true, i});
    for (int i = 0; i < m; ++i) actions.push_back({false, i});
    return actions;
  }
  const int warmup = std::min(stages - stage - 1, m);
  int f = 0, b = 0;
  for (; f < warmup; ++f) actions.push_back({true, f});
  for (; f < m; ++f, ++b) {
    actions.push_back({true, f});
    actions.push_back({false, b});
  }
  for (; b < m; ++b) actions.push_back({false, b});
  return actions;
}

}  // namespace

Result<PipelineSchedule> ParsePipelineSchedule(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (lower == "gpipe") return PipelineSchedule::kGPipe;
  if (lower == "1f1b") return PipelineSchedule::k1F1B;
  return InvalidArgument("key 'pipeline_parallel_schedule' = '" + text +
                         "': expected GPipe or 1F1B");
}

std::string PipelineScheduleName(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::kGPipe ? "GPipe" : "1F1B";
}

std::vector<PipelineOp> StageProgram(PipelineSchedule schedule, int stage,
                                     int stages, int microbatches) {
  const bool first = stage == 0, last = stage == stages - 1;
  const std::vector<Action> actions =
      Actions(schedule, stage, stages, microbatches);
  std::vector<PipelineOp> program;
  std::vector<bool> input_posted(static_cast<size_t>(microbatches), false);
  auto post_input = [&](int i) {
    if (first || input_posted[static_cast<size_t>(i)]) return;
    program.push_back({PipelineOp::kRecvActivation, i});
    input_posted[static_cast<size_t>(i)] = true;
  };
  for (size_t k = 0; k < actions.size(); ++k) {
    const Action& a = actions[k];
    if (a.forward) {
      post_input(a.microbatch);
      program.push_back({PipelineOp::kForward, a.microbatch});
      if (!last) program.push_back({PipelineOp::kSendActivation, a.microbatch});
      continue;
    }
    if (!last) program.push_back({PipelineOp::kRecvGradient, a.microbatch});
    program.push_back({PipelineOp::kBackward, a.microbatch});
    // Megatron's pairing: the next forward's input is received before
    // this gradient is sent (the previous stage sends that input first).
    if (k + 1 < actions.size() && actions[k + 1].forward) {
      post_input(actions[k + 1].microbatch);
    }
    if (!first) program.push_back({PipelineOp::kSendGradient, a.microbatch});
  }
  return program;
}

int MicrobatchesInFlight(PipelineSchedule schedule, int stage, int stages,
                         int microbatches) {
  if (schedule == PipelineSchedule::kGPipe) return microbatches;
  return std::min(microbatches, stages - stage);
}

double BubbleFraction(int stages, int microbatches) {
  return (stages - 1.0) / (microbatches + stages - 1.0);
}

}  // namespace multislice::train
