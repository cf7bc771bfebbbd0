// The pipeline programs of GPipe and 1F1B, for p = 2..8 stages and m = 1..16
// microbatches: every stage runs each microbatch's forward then backward
// once; the two sides of every pair of neighbours issue their messages in
// the same order; the programs finish when each device has one FIFO stream
// on which a message completes only when both sides have reached it (the
// runtime's rendezvous, the strictest case); 1F1B keeps at most p - s
// microbatches in flight; and with unit times (F = 1, B = 2, messages free)
// the step lasts (m + p - 1) (F + B), the bubble (p - 1) / (m + p - 1).
#include "train/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <utility>
#include <vector>

namespace multislice::train {
namespace {

using Kind = PipelineOp::Kind;

// A message between neighbours: (is gradient, microbatch).
using Message = std::pair<bool, int>;

bool IsMessage(Kind k) {
  return k == Kind::kRecvActivation || k == Kind::kSendActivation ||
         k == Kind::kRecvGradient || k == Kind::kSendGradient;
}
bool IsGradient(Kind k) {
  return k == Kind::kRecvGradient || k == Kind::kSendGradient;
}
// The neighbour a message op talks to: -1 the previous stage, +1 the next.
int Direction(Kind k) {
  return k == Kind::kRecvActivation || k == Kind::kSendGradient ? -1 : 1;
}

std::vector<std::vector<PipelineOp>> Programs(PipelineSchedule s, int p,
                                              int m) {
  std::vector<std::vector<PipelineOp>> programs;
  for (int stage = 0; stage < p; ++stage) {
    programs.push_back(StageProgram(s, stage, p, m));
  }
  return programs;
}

class PipelineScheduleTest : public ::testing::TestWithParam<PipelineSchedule> {
};

TEST_P(PipelineScheduleTest, EachMicrobatchRunsForwardThenBackwardOnce) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      const auto programs = Programs(GetParam(), p, m);
      for (int s = 0; s < p; ++s) {
        std::vector<int> state(m, 0);  // 0 none, 1 forward, 2 backward
        int in_flight = 0, most = 0;
        for (const PipelineOp& op : programs[s]) {
          if (op.kind == Kind::kForward) {
            ASSERT_EQ(state[op.microbatch]++, 0) << p << " " << m << " " << s;
            most = std::max(most, ++in_flight);
          } else if (op.kind == Kind::kBackward) {
            ASSERT_EQ(state[op.microbatch]++, 1) << p << " " << m << " " << s;
            --in_flight;
          }
        }
        EXPECT_EQ(std::count(state.begin(), state.end(), 2), m);
        EXPECT_EQ(most, MicrobatchesInFlight(GetParam(), s, p, m))
            << p << " " << m << " " << s;
      }
    }
  }
}

TEST_P(PipelineScheduleTest, NeighboursIssueTheirMessagesInTheSameOrder) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      const auto programs = Programs(GetParam(), p, m);
      for (int s = 0; s + 1 < p; ++s) {
        std::vector<Message> lower, upper;
        for (const PipelineOp& op : programs[s]) {
          if (IsMessage(op.kind) && Direction(op.kind) == 1) {
            lower.push_back({IsGradient(op.kind), op.microbatch});
          }
        }
        for (const PipelineOp& op : programs[s + 1]) {
          if (IsMessage(op.kind) && Direction(op.kind) == -1) {
            upper.push_back({IsGradient(op.kind), op.microbatch});
          }
        }
        EXPECT_EQ(lower, upper) << p << " stages, " << m << " microbatches, "
                                << "pair " << s;
        EXPECT_EQ(lower.size(), 2u * m);
      }
    }
  }
}

// Runs the programs on one FIFO stream per stage; false on a deadlock.
bool RunsToTheEnd(const std::vector<std::vector<PipelineOp>>& programs) {
  const int p = static_cast<int>(programs.size());
  std::vector<size_t> pc(p, 0);
  std::vector<std::deque<PipelineOp>> stream(p);
  std::vector<std::map<Message, bool>> received(p);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {  // device threads: post, or compute
      while (pc[s] < programs[s].size()) {
        const PipelineOp& op = programs[s][pc[s]];
        if (IsMessage(op.kind)) {
          stream[s].push_back(op);
        } else {
          const bool grad = op.kind == Kind::kBackward;
          const bool needs = grad ? s + 1 < p : s > 0;
          if (needs && !received[s][{grad, op.microbatch}]) break;
        }
        ++pc[s];
        progress = true;
      }
    }
    for (int s = 0; s < p; ++s) {  // streams: the heads that meet
      if (stream[s].empty()) continue;
      const PipelineOp op = stream[s].front();
      const int peer = s + Direction(op.kind);
      if (stream[peer].empty()) continue;
      const PipelineOp other = stream[peer].front();
      if (other.microbatch != op.microbatch ||
          IsGradient(other.kind) != IsGradient(op.kind) ||
          Direction(other.kind) != -Direction(op.kind)) {
        continue;
      }
      stream[s].pop_front();
      stream[peer].pop_front();
      const Message message{IsGradient(op.kind), op.microbatch};
      received[op.kind == Kind::kRecvActivation ||
                       op.kind == Kind::kRecvGradient
                   ? s
                   : peer][message] = true;
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s) {
    if (pc[s] < programs[s].size() || !stream[s].empty()) return false;
  }
  return true;
}

TEST_P(PipelineScheduleTest, ProgramsFinishOnRendezvousStreams) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      EXPECT_TRUE(RunsToTheEnd(Programs(GetParam(), p, m)))
          << p << " stages, " << m << " microbatches";
    }
  }
}

// The step's length with F = 1 and B = 2 time units, messages free.
double StepTime(const std::vector<std::vector<PipelineOp>>& programs) {
  const int p = static_cast<int>(programs.size());
  std::map<std::pair<int, Message>, double> done;  // (stage, message) -> t
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (pc[s] < programs[s].size()) {
        const PipelineOp& op = programs[s][pc[s]];
        if (op.kind == Kind::kForward || op.kind == Kind::kBackward) {
          const bool grad = op.kind == Kind::kBackward;
          const int from = grad ? s + 1 : s - 1;
          double ready = 0;
          if (from >= 0 && from < p) {
            auto it = done.find({from, {grad, op.microbatch}});
            if (it == done.end()) break;
            ready = it->second;
          }
          clock[s] = std::max(clock[s], ready) + (grad ? 2.0 : 1.0);
          done[{s, {grad, op.microbatch}}] = clock[s];
        }
        ++pc[s];
        progress = true;
      }
    }
  }
  return *std::max_element(clock.begin(), clock.end());
}

TEST_P(PipelineScheduleTest, BubbleIsTheFormulas) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      const double step = StepTime(Programs(GetParam(), p, m));
      EXPECT_DOUBLE_EQ(step, (m + p - 1) * 3.0) << p << " " << m;
      EXPECT_DOUBLE_EQ(1.0 - 3.0 * m / step, BubbleFraction(p, m));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineScheduleTest,
                         ::testing::Values(PipelineSchedule::kGPipe,
                                           PipelineSchedule::k1F1B),
                         [](const auto& info) {
                           return PipelineScheduleName(info.param);
                         });

TEST(PipelineScheduleNames, ParseBothSpellingsAndRefuseOthers) {
  EXPECT_EQ(*ParsePipelineSchedule("GPipe"), PipelineSchedule::kGPipe);
  EXPECT_EQ(*ParsePipelineSchedule("1f1b"), PipelineSchedule::k1F1B);
  Result<PipelineSchedule> bad = ParsePipelineSchedule("interleaved");
  EXPECT_EQ(bad.status().message(),
            "key 'pipeline_parallel_schedule' = 'interleaved': expected GPipe "
            "or 1F1B");
}

}  // namespace
}  // namespace multislice::train
