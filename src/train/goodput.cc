#include "train/goodput.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "train/metrics.h"

namespace multislice::train {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Where a second of wall time went: a badput bucket (its Badput's value;
// not INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, which is its parts, nor
// OTHER, which is what is left), the productive time, or one of the
// recovery's parts.
enum Slot : int {
  kProductive = kBadputCount,
  kDetection,
  kRepair,
  kRestart,
  kUnsplit,
  kSlotCount,
};
using Slots = std::array<double, kSlotCount>;

constexpr int Bucket(Badput b) { return static_cast<int>(b); }

struct Span {
  double begin = 0, end = 0;
  int slot = kProductive;
};

// One step record as goodput reads it (metrics.h's fields).
struct StepRecord {
  int64_t step = 0;
  int attempt = 0;
  int64_t resume = 0;
  double end = 0, seconds = 0, data_wait = 0, checkpoint_block = 0;
  std::optional<double> start_time;  // the first record of a start
  double runtime_init = 0, restore = 0, training_prep = 0;
  bool counts = false;  // the record that counts for its step
  double startup = 0;   // PROGRAM_STARTUP: beyond the start's median step

  double begin() const { return end - seconds; }
  // The step's own time, without waiting for its batch.
  double compute() const { return std::max(0.0, seconds - data_wait); }
};

// A start of the trainer: (attempt, resume), its records in time order.
using StartKey = std::pair<int, int64_t>;
using Starts = std::map<StartKey, std::vector<StepRecord*>>;

double NonNegative(const nlohmann::json& r, const char* field) {
  const auto it = r.find(field);
  if (it == r.end() || !it->is_number()) return 0;
  const double v = it->get<double>();
  return std::isfinite(v) && v > 0 ? v : 0;
}

std::vector<StepRecord> ParseSteps(const std::vector<nlohmann::json>& records,
                                   double start, double end) {
  std::vector<StepRecord> steps;
  for (const nlohmann::json& r : records) {
    if (!r.is_object() || !r.contains("step") || !r.contains("time")) continue;
    StepRecord s;
    s.step = r.value("step", int64_t{0});
    s.attempt = r.value("attempt", 0);
    s.resume = r.value(kResumeField, int64_t{0});
    s.end = r.value("time", 0.0);
    s.seconds = NonNegative(r, "step_time_s");
    s.data_wait = std::min(s.seconds, NonNegative(r, kDataWaitField));
    s.checkpoint_block = NonNegative(r, kCheckpointBlockField);
    if (r.contains(kStartTimeField) && r[kStartTimeField].is_number()) {
      s.start_time = r[kStartTimeField].get<double>();
      s.runtime_init = NonNegative(r, kRuntimeInitField);
      s.restore = NonNegative(r, kRestoreField);
      s.training_prep = NonNegative(r, kTrainingPrepField);
    }
    if (s.end < start || s.end > end) continue;  // another job's records
    steps.push_back(s);
  }
  return steps;
}

// The last run of each step counts (the highest resume, as metrics.h's
// CurrentStepRecords, then the latest); earlier runs were trained again.
void MarkCounting(std::vector<StepRecord>& steps) {
  std::map<int64_t, StepRecord*> last;
  for (StepRecord& s : steps) {
    StepRecord*& slot = last[s.step];
    if (slot == nullptr ||
        std::pair(s.resume, s.end) >= std::pair(slot->resume, slot->end)) {
      slot = &s;
    }
  }
  for (auto& [step, s] : last) s->counts = true;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Groups the records by start and gives each start's first step its
// PROGRAM_STARTUP: what it took beyond the median of that start's other
// steps (of every start's, when it has no other; none: nothing).
Starts GroupStarts(std::vector<StepRecord>& steps) {
  Starts starts;
  for (StepRecord& s : steps) {
    starts[StartKey(s.attempt, s.resume)].push_back(&s);
  }
  std::vector<double> all_later;
  for (auto& [key, records] : starts) {
    std::sort(records.begin(), records.end(),
              [](const StepRecord* a, const StepRecord* b) {
                return a->end < b->end;
              });
    for (size_t i = 1; i < records.size(); ++i) {
      all_later.push_back(records[i]->compute());
    }
  }
  for (auto& [key, records] : starts) {
    std::vector<double> later;
    for (size_t i = 1; i < records.size(); ++i) {
      later.push_back(records[i]->compute());
    }
    if (later.empty()) later = all_later;
    if (later.empty()) continue;
    StepRecord* first = records.front();
    first->startup = std::max(0.0, first->compute() - Median(later));
  }
  return starts;
}

// A step's intervals: the blocking saves before it, its wait for the
// batch, its start-up, then its training (productive or wasted).
void AddStepSpans(const StepRecord& s, std::vector<Span>& spans) {
  const double b = s.begin();
  spans.push_back({b - s.checkpoint_block, b, Bucket(Badput::kCheckpointSave)});
  spans.push_back({b, b + s.data_wait, Bucket(Badput::kDataLoadingSync)});
  const double trained = b + s.data_wait + std::min(s.startup, s.compute());
  spans.push_back({b + s.data_wait, trained, Bucket(Badput::kProgramStartup)});
  spans.push_back({trained, s.end,
                   s.counts ? kProductive : Bucket(Badput::kWastedProgress)});
}

// A start's way to its first step: the runtime, the restore, the rest of
// the preparation.
void AddStartSpans(const StepRecord& first, std::vector<Span>& spans) {
  if (!first.start_time) return;
  const double init_end = *first.start_time + first.runtime_init;
  const double restore_end = init_end + first.restore;
  spans.push_back(
      {*first.start_time, init_end, Bucket(Badput::kTpuInitialization)});
  spans.push_back({init_end, restore_end, Bucket(Badput::kCheckpointRestore)});
  spans.push_back({restore_end, restore_end + first.training_prep,
                   Bucket(Badput::kTrainingPrep)});
}

// When the queued resource was first seen out of ACTIVE after `after`, and
// ACTIVE again for `attempt` or later; -1 each when not seen.
std::pair<double, double> DownAndUp(const std::vector<StateObservation>& states,
                                    double after, int attempt) {
  double down = -1;
  for (const StateObservation& o : states) {
    if (o.time < after) continue;
    if (down < 0 && o.state != "ACTIVE") down = o.time;
    // Attempt 0: an observation that does not know the attempt (the
    // controller's state history).
    if (down >= 0 && o.state == "ACTIVE" &&
        (o.attempt == 0 || o.attempt >= attempt)) {
      return {down, o.time};
    }
  }
  return {-1, -1};
}

// One disruption: from the failed start's last step to the next start.
struct Disruption {
  double last_end = 0;     // the failed start's last step ended
  double next_begin = 0;   // the next start began (its start_time)
  double first_begin = 0;  // its first step began
  double down = -1, up = -1;
  // Issue 6's rule: a transition not seen before the first step of the
  // next start is no split at all.
  bool observed() const { return down >= 0 && up >= 0 && up <= first_begin; }
};

// Between each start and the next in time (by their first steps: the
// attempt numbers of a run directory used by jobs and by hand need not
// grow).
std::vector<Disruption> Disruptions(
    const Starts& starts, const std::vector<StateObservation>& states) {
  std::vector<const std::vector<StepRecord*>*> ordered;
  for (const auto& [key, records] : starts) ordered.push_back(&records);
  std::sort(ordered.begin(), ordered.end(),
            [](auto* a, auto* b) { return a->front()->end < b->front()->end; });
  std::vector<Disruption> out;
  for (size_t i = 0; i + 1 < ordered.size(); ++i) {
    Disruption d;
    d.last_end = -kInfinity;
    for (const StepRecord* s : *ordered[i]) {
      d.last_end = std::max(d.last_end, s->end);
    }
    const StepRecord& first = *ordered[i + 1]->front();
    d.first_begin = first.begin();
    d.next_begin = first.start_time.value_or(d.first_begin);
    std::tie(d.down, d.up) = DownAndUp(states, d.last_end, first.attempt);
    out.push_back(d);
  }
  return out;
}

// The recovery's intervals, its split clipped to the gap before the next
// start (what comes after is that start's own buckets).
void AddRecoverySpans(const Disruption& d, std::vector<Span>& spans) {
  const double lo = d.last_end, hi = std::max(lo, d.next_begin);
  if (!d.observed()) {
    spans.push_back({lo, hi, kUnsplit});
    return;
  }
  auto clip = [&](double t) { return std::clamp(t, lo, hi); };
  spans.push_back({lo, clip(d.down), kDetection});
  spans.push_back({clip(d.down), clip(d.up), kRepair});
  spans.push_back({clip(d.up), hi, kRestart});
}

// Each span's seconds inside [lo, hi] to its slot; where spans overlap the
// one that begins first keeps the overlap.
Slots Sweep(std::vector<Span> spans, double lo, double hi) {
  std::stable_sort(
      spans.begin(), spans.end(),
      [](const Span& a, const Span& b) { return a.begin < b.begin; });
  Slots slots{};
  double covered = lo;
  for (const Span& s : spans) {
    const double begin = std::max(s.begin, covered);
    const double end = std::min(s.end, hi);
    if (end <= begin) continue;
    slots[s.slot] += end - begin;
    covered = end;
  }
  return slots;
}

// The seconds of [begin, end] inside [lo, hi].
double Overlap(double begin, double end, double lo, double hi) {
  return std::max(0.0, std::min(end, hi) - std::max(begin, lo));
}

// Issue 6's summary fields, clipped to the window.
void AddSummary(const std::vector<StepRecord>& steps,
                const std::vector<Disruption>& disruptions, double lo,
                double hi, Goodput& g) {
  for (const StepRecord& s : steps) {
    const double inside = Overlap(s.begin(), s.end, lo, hi);
    (s.counts ? g.training_seconds : g.recomputed_seconds) += inside;
    if (s.end < lo || s.end > hi) continue;
    if (s.counts) {
      ++g.steps;
    } else {
      ++g.recomputed_steps;
    }
  }
  for (const Disruption& d : disruptions) {
    if (d.last_end >= lo && d.last_end <= hi) ++g.failures;
    if (!d.observed()) {
      g.repair_seconds += Overlap(d.last_end, d.first_begin, lo, hi);
      continue;
    }
    g.detection_seconds += Overlap(d.last_end, d.down, lo, hi);
    g.repair_seconds += Overlap(d.down, d.up, lo, hi);
    g.restart_seconds += Overlap(d.up, d.first_begin, lo, hi);
  }
  g.other_seconds = std::max(
      0.0, g.wall_seconds - g.training_seconds - g.recomputed_seconds -
               g.detection_seconds - g.repair_seconds - g.restart_seconds);
}

void SetBuckets(const Slots& slots, Goodput& g) {
  std::copy_n(slots.begin(), kBadputCount, g.badput.begin());
  g.productive_seconds = slots[kProductive];
  g.recovery = {slots[kDetection], slots[kRepair], slots[kRestart],
                slots[kUnsplit]};
  const RecoverySplit& r = g.recovery;
  g.badput[Bucket(Badput::kInfrastructureRecovery)] =
      r.detection_seconds + r.repair_seconds + r.restart_seconds +
      r.unsplit_seconds;
  double accounted = g.productive_seconds;
  for (int b = 0; b < kBadputCount; ++b) {
    if (b != Bucket(Badput::kOther)) accounted += g.badput[b];
  }
  g.badput[Bucket(Badput::kOther)] = std::max(0.0, g.wall_seconds - accounted);
}

}  // namespace

const char* BadputName(Badput b) {
  static constexpr const char* kNames[kBadputCount] = {
      "TPU_INITIALIZATION",
      "TRAINING_PREP",
      "PROGRAM_STARTUP",
      "DATA_LOADING_SYNC",
      "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
      "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
      "WASTED_PROGRESS_FROM_DISRUPTION",
      "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
      "OTHER"};
  return kNames[Bucket(b)];
}

nlohmann::json Goodput::ToJson() const {
  nlohmann::json badput_json = nlohmann::json::object();
  for (int b = 0; b < kBadputCount; ++b) {
    badput_json[BadputName(static_cast<Badput>(b))] = badput[b];
  }
  badput_json[BadputName(Badput::kInfrastructureRecovery)] = {
      {"seconds", seconds(Badput::kInfrastructureRecovery)},
      {"detection_seconds", recovery.detection_seconds},
      {"repair_seconds", recovery.repair_seconds},
      {"restart_seconds", recovery.restart_seconds},
      {"unsplit_seconds", recovery.unsplit_seconds}};
  return {{"start_time", start},
          {"end_time", end},
          {"wall_seconds", wall_seconds},
          {"productive_seconds", productive_seconds},
          {"badput", badput_json},
          {"goodput_percent", 100 * goodput},
          {"steps", steps},
          {"recomputed_steps", recomputed_steps},
          {"failures", failures},
          {"training_seconds", training_seconds},
          {"recomputed_seconds", recomputed_seconds},
          {"detection_seconds", detection_seconds},
          {"repair_seconds", repair_seconds},
          {"restart_seconds", restart_seconds},
          {"other_seconds", other_seconds}};
}

Result<Goodput> ComputeGoodput(double start, double end,
                               const std::vector<nlohmann::json>& records,
                               const std::vector<StateObservation>& states,
                               double window_start) {
  if (!(end > start)) {
    return InvalidArgument("goodput: the job ends before it starts");
  }
  const double lo = std::max(start, window_start);
  if (!(end > lo)) {
    return InvalidArgument("goodput: the window ends before it starts");
  }
  std::vector<StepRecord> steps = ParseSteps(records, start, end);
  MarkCounting(steps);
  const Starts starts = GroupStarts(steps);
  const std::vector<Disruption> disruptions = Disruptions(starts, states);
  std::vector<Span> spans;
  for (const StepRecord& s : steps) AddStepSpans(s, spans);
  for (const auto& [key, records_of_start] : starts) {
    AddStartSpans(*records_of_start.front(), spans);
  }
  for (const Disruption& d : disruptions) AddRecoverySpans(d, spans);

  Goodput g;
  g.start = lo;
  g.end = end;
  g.wall_seconds = end - lo;
  SetBuckets(Sweep(std::move(spans), lo, end), g);
  AddSummary(steps, disruptions, lo, end, g);
  g.goodput = g.productive_seconds / g.wall_seconds;
  return g;
}

std::optional<std::pair<double, double>> RecordSpan(
    const std::vector<nlohmann::json>& records) {
  const std::vector<StepRecord> steps =
      ParseSteps(records, -kInfinity, kInfinity);
  if (steps.empty()) return std::nullopt;
  double first = kInfinity, last = -kInfinity;
  for (const StepRecord& s : steps) {
    first = std::min(first, s.start_time.value_or(s.begin()));
    last = std::max(last, s.end);
  }
  return std::pair(first, last);
}

double ProductiveSecondsUpTo(const std::vector<nlohmann::json>& records,
                             int64_t up_to_step) {
  std::vector<StepRecord> steps = ParseSteps(records, -kInfinity, kInfinity);
  MarkCounting(steps);
  GroupStarts(steps);
  double productive = 0;
  for (const StepRecord& s : steps) {
    if (s.counts && s.step <= up_to_step) {
      productive += s.compute() - std::min(s.startup, s.compute());
    }
  }
  return productive;
}

}  // namespace multislice::train
