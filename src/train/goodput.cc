#include "train/goodput.h"

#include <algorithm>
#include <map>
#include <utility>

#include "train/metrics.h"

namespace multislice::train {
namespace {

struct StepRecord {
  int64_t step = 0;
  int attempt = 0;
  int64_t resume = 0;  // metrics.h's resume index: the trainer's start
  double end = 0;
  double seconds = 0;
};

}  // namespace

nlohmann::json Goodput::ToJson() const {
  return {{"wall_seconds", wall_seconds},
          {"training_seconds", training_seconds},
          {"steps", steps},
          {"recomputed_steps", recomputed_steps},
          {"recomputed_seconds", recomputed_seconds},
          {"failures", failures},
          {"detection_seconds", detection_seconds},
          {"repair_seconds", repair_seconds},
          {"restart_seconds", restart_seconds},
          {"other_seconds", other_seconds},
          {"goodput_percent", 100 * goodput}};
}

Result<Goodput> ComputeGoodput(double start, double end,
                               const std::vector<nlohmann::json>& records,
                               const std::vector<StateObservation>& states) {
  if (!(end > start)) {
    return InvalidArgument("goodput: the job ends before it starts");
  }
  std::vector<StepRecord> steps;
  for (const nlohmann::json& r : records) {
    if (!r.is_object() || !r.contains("step") || !r.contains("time")) continue;
    StepRecord s;
    s.step = r.value("step", int64_t{0});
    s.attempt = r.value("attempt", 0);
    s.resume = r.value(kResumeField, int64_t{0});
    s.end = r.value("time", 0.0);
    s.seconds = r.value("step_time_s", 0.0);
    if (s.end < start || s.end > end) continue;  // another job's records
    steps.push_back(s);
  }
  Goodput g;
  g.wall_seconds = end - start;
  // The last run of each step counts (the highest resume, as metrics.h's
  // CurrentStepRecords, then the latest); earlier runs were recomputed.
  std::map<int64_t, const StepRecord*> last;
  for (const StepRecord& s : steps) {
    auto it = last.find(s.step);
    if (it == last.end() ||
        std::pair(s.resume, s.end) >=
            std::pair(it->second->resume, it->second->end)) {
      last[s.step] = &s;
    }
  }
  for (const StepRecord& s : steps) {
    if (last[s.step] == &s) {
      g.training_seconds += s.seconds;
    } else {
      ++g.recomputed_steps;
      g.recomputed_seconds += s.seconds;
    }
  }
  g.steps = static_cast<int64_t>(last.size());

  // Failures: each start of the trainer (a new attempt of the job, or a
  // new resume within one) after the first one seen in the records.
  using Start = std::pair<int, int64_t>;                    // attempt, resume
  std::map<Start, std::pair<double, double>> attempt_span;  // first, last

  for (const StepRecord& s : steps) {
    auto [it, fresh] = attempt_span.try_emplace(Start(s.attempt, s.resume),
                                                s.end - s.seconds, s.end);
    if (!fresh) {
      it->second.first = std::min(it->second.first, s.end - s.seconds);
      it->second.second = std::max(it->second.second, s.end);
    }
  }
  for (auto it = attempt_span.begin(); it != attempt_span.end(); ++it) {
    auto next = std::next(it);
    if (next == attempt_span.end()) break;
    ++g.failures;
    const double last_step = it->second.second;
    const double first_step = next->second.first;
    double down = -1, up = -1;
    for (const StateObservation& o : states) {
      if (o.time < last_step) continue;
      if (down < 0 && o.state != "ACTIVE") down = o.time;
      // Attempt 0: an observation that does not know the attempt (the
      // controller's state history).
      if (down >= 0 && o.state == "ACTIVE" &&
          (o.attempt == 0 || o.attempt >= next->first.first)) {
        up = o.time;
        break;
      }
    }
    if (down < 0 || up < 0 || up > first_step) {
      // The runner missed the transition: count the whole gap as repair.
      g.repair_seconds += std::max(0.0, first_step - last_step);
      continue;
    }
    g.detection_seconds += down - last_step;
    g.repair_seconds += up - down;
    g.restart_seconds += first_step - up;
  }
  g.other_seconds = std::max(
      0.0, g.wall_seconds - g.training_seconds - g.recomputed_seconds -
               g.detection_seconds - g.repair_seconds - g.restart_seconds);
  g.goodput = g.training_seconds / g.wall_seconds;
  return g;
}

}  // namespace multislice::train
