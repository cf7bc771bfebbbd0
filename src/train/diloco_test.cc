// DiLoCo's and Streaming DiLoCo's outer optimizer against the algorithm
// written out. Replicas on the diloco axis (devices of one slice, or
// slices; with fsdp 2 each device of a replica holds its own shard) move
// their inner copy of a shard by a replica-, step- and shard-specific amount
// at every inner step and call AfterInnerStep; a plain loop over all the
// replicas' values in double (Reference) runs the schedule and the formulas
// of diloco.h's header.
//   - Schedule: after every step each replica's inner values, the outer
//     parameters and the momentum equal the reference's within f32
//     rounding; outer and momentum are bitwise equal on every replica, and
//     with alpha = 0 so is a fragment's inner copy on the step it lands.
//     Plain DiLoCo (one fragment, tau 0) over ICI, DCN and DCN x fsdp, and
//     lr 1 / momentum 0 as the plain average; streaming with 2 interleaved
//     fragments, tau 1 and alpha 0.5 (the case of issue 17), alpha 0.25
//     (alpha and 1 - alpha swapped would pass at 0.5), alpha 0, tau 2, and
//     4 fragments one of which is empty on the shard.
//   - Resume: stopped after every step, settled, the outer state copied into
//     a fresh optimizer and resumed: bitwise the uninterrupted run to the
//     end; pending is 0 outside the fragment in flight and all 0 without.
//   - Wire: int8 and bf16 over 4 slices, one outer step per fragment, within
//     the bound of runtime/collectives.h (computed from the inputs with
//     wire.h's quantisers) of the f32 run, and fewer bytes on DCN.
// Then LayerFragments and ShardFragments on a 4-layer model's layouts.
#include "train/diloco.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "runtime/comm/types.h"
#include "runtime/test_support.h"
#include "runtime/wire.h"

namespace multislice::train {
namespace {

constexpr int64_t kCount = 1001;

float Start(int shard, int64_t i) {
  return 0.01f * static_cast<float>((i + 13 * shard) % 37) - 0.2f;
}
// What replica r's inner step t adds to value i of shard `shard`.
float Move(int r, int64_t t, int shard, int64_t i) {
  return 0.001f * static_cast<float>((r * 7 + t * 3 + shard * 5 + i) % 11) -
         0.005f;
}

// The test's fragments of the kCount values: 1 (the whole shard, given as
// no fragments), 2 interleaved, or 4 of which fragment 2 is empty.
FragmentRanges TestFragments(int fragments) {
  if (fragments == 2) return {{{0, 300}, {700, kCount}}, {{300, 700}}};
  if (fragments == 4) {
    return {{{0, 300}, {700, kCount}}, {{300, 500}}, {}, {{500, 700}}};
  }
  return {};
}
int FragmentOf(int fragments, int64_t i) {
  if (fragments == 1) return 0;
  if (i < 300 || i >= 700) return 0;
  if (fragments == 2 || i < 500) return 1;
  return 3;
}

struct Params {
  int ici_diloco = 1, dcn_diloco = 1, ici_fsdp = 1;
  int period = 1, fragments = 1, overlap = 0;
  double alpha = 0, lr = 1, mu = 0;
  int steps = 1;
  runtime::WireType wire = runtime::WireType::kF32;
};

OuterOptimizerOptions OptionsOf(const Params& p) {
  OuterOptimizerOptions o;
  o.learning_rate = p.lr;
  o.momentum = p.mu;
  o.replica_axes = {"diloco"};
  o.wire = p.wire;
  o.sync_period = p.period;
  o.fragments = TestFragments(p.fragments);
  o.overlap_steps = p.overlap;
  o.alpha = p.alpha;
  return o;
}

// Every replica's state after one step of the algorithm, in double.
struct ReferenceState {
  std::vector<std::vector<double>> inner;  // [replica][value]
  std::vector<double> outer, momentum;
  int started = -1, landed = -1;  // the fragments that did, or -1
};

// The algorithm for `replicas` replicas of shard `shard`, step by step: the
// state after each of steps 1..p.steps.
std::vector<ReferenceState> Reference(const Params& p, int replicas,
                                      int shard) {
  ReferenceState s;
  s.outer.resize(kCount);
  for (int64_t i = 0; i < kCount; ++i) s.outer[i] = Start(shard, i);
  s.momentum.assign(kCount, 0.0);
  s.inner.assign(replicas, s.outer);
  const int g = p.period / p.fragments;
  struct Sum {
    int fragment;
    int land_step;
    std::vector<double> sum;
  };
  std::optional<Sum> in_flight;
  auto land = [&] {
    const Sum& sum = *in_flight;
    for (int64_t i = 0; i < kCount; ++i) {
      if (FragmentOf(p.fragments, i) != sum.fragment) continue;
      const double delta = sum.sum[i] / replicas;
      s.momentum[i] = p.mu * s.momentum[i] + delta;
      s.outer[i] -= p.lr * (delta + p.mu * s.momentum[i]);
      for (int r = 0; r < replicas; ++r) {
        s.inner[r][i] = p.alpha * s.inner[r][i] + (1 - p.alpha) * s.outer[i];
      }
    }
    s.landed = sum.fragment;
    in_flight.reset();
  };
  std::vector<ReferenceState> states;
  for (int t = 1; t <= p.steps; ++t) {
    s.started = s.landed = -1;
    for (int r = 0; r < replicas; ++r) {
      for (int64_t i = 0; i < kCount; ++i) {
        s.inner[r][i] += Move(r, t, shard, i);
      }
    }
    if (in_flight && in_flight->land_step == t) land();
    for (int f = 0; f < p.fragments; ++f) {
      if (t % p.period != ((f + 1) * g) % p.period) continue;
      Sum sum{f, t + p.overlap, std::vector<double>(kCount, 0.0)};
      for (int64_t i = 0; i < kCount; ++i) {
        if (FragmentOf(p.fragments, i) != f) continue;
        for (int r = 0; r < replicas; ++r) {
          sum.sum[i] += s.outer[i] - s.inner[r][i];
        }
      }
      in_flight = std::move(sum);
      s.started = f;
      if (p.overlap == 0) land();
    }
    states.push_back(s);
  }
  return states;
}

// The number of values of `a` that differ bitwise from the diloco group's
// rank 0's copy (-1 when the broadcast fails).
int DifferFromRankZero(runtime::DeviceCollectives& coll,
                       const std::vector<float>& a,
                       const std::vector<bool>& where) {
  std::vector<float> first(a);
  if (!coll.Broadcast({"diloco"}, 0, first.data(), first.size(),
                      runtime::DType::kF32, "test/equal")
           .Wait()
           .ok()) {
    return -1;
  }
  int differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (where[i] && std::memcmp(&a[i], &first[i], sizeof(float)) != 0) {
      ++differ;
    }
  }
  return differ;
}

struct Device {
  int replica, replicas, shard;
};

Result<Device> DeviceOf(runtime::DeviceCollectives& coll) {
  ASSIGN_OR_RETURN(const runtime::AxisGroup* diloco, coll.Group({"diloco"}));
  ASSIGN_OR_RETURN(const runtime::AxisGroup* fsdp, coll.Group({"fsdp"}));
  return Device{diloco->rank, diloco->size, fsdp->rank};
}

// Options the header's rules refuse: AfterInnerStep says so, before any
// collective.
int CheckRefusals(runtime::DeviceCollectives& coll) {
  std::vector<float> inner(kCount, 0.0f);
  std::vector<OuterOptimizerOptions> refused(6, OptionsOf(Params{}));
  refused[0].sync_period = 0;
  refused[1].sync_period = 5;
  refused[1].fragments = TestFragments(2);
  refused[2].sync_period = 4;
  refused[2].fragments = TestFragments(2);
  refused[2].overlap_steps = 2;  // g = 2
  refused[3].alpha = 1.5;
  refused[4].sync_period = 2;
  refused[4].fragments = {{{0, 500}}, {{400, kCount}}};  // overlap
  refused[5].sync_period = 2;
  refused[5].fragments = {{{0, 500}}, {{501, kCount}}};  // a gap
  int wrong = 0;
  for (const OuterOptimizerOptions& o : refused) {
    OuterOptimizer outer(o, inner.data(), kCount);
    const Status s = outer.AfterInnerStep(coll, 1, inner.data());
    if (s.code() != StatusCode::kInvalidArgument) {
      std::fprintf(stderr, "refusal: got '%s'\n", s.message().c_str());
      ++wrong;
    }
  }
  return wrong;
}

int CheckSchedule(runtime::DeviceCollectives& coll, const Params& p) {
  Result<Device> d = DeviceOf(coll);
  if (!d.ok()) return 1;
  int wrong = CheckRefusals(coll);
  const std::vector<ReferenceState> want = Reference(p, d->replicas, d->shard);
  std::vector<float> inner(kCount);
  for (int64_t i = 0; i < kCount; ++i) inner[i] = Start(d->shard, i);
  OuterOptimizer outer(OptionsOf(p), inner.data(), kCount);
  if (outer.pending().size() != (p.overlap == 0 ? 0u : size_t{kCount})) {
    ++wrong;
  }
  const std::vector<bool> all(kCount, true);
  double max_error = 0;
  int64_t want_values = 0, want_bytes = 0;
  for (int t = 1; t <= p.steps; ++t) {
    for (int64_t i = 0; i < kCount; ++i) {
      inner[i] += Move(d->replica, t, d->shard, i);
    }
    const Status s = outer.AfterInnerStep(coll, t, inner.data());
    if (!s.ok()) {
      std::fprintf(stderr, "step %d: %s\n", t, s.message().c_str());
      return wrong + 1;
    }
    const ReferenceState& w = want[t - 1];
    auto check = [&](const char* what, const std::vector<float>& got,
                     const std::vector<double>& expected) {
      for (int64_t i = 0; i < kCount; ++i) {
        const double error = std::fabs(got[i] - expected[i]);
        max_error = std::max(max_error, error);
        if (!(error <= 1e-6) && wrong++ < 5) {
          std::fprintf(stderr, "step %d %s[%lld]: %.9g, want %.9g\n", t, what,
                       static_cast<long long>(i), got[i], expected[i]);
        }
      }
    };
    check("inner", inner, w.inner[d->replica]);
    check("outer", outer.outer(), w.outer);
    check("momentum", outer.momentum(), w.momentum);
    if (DifferFromRankZero(coll, outer.outer(), all) != 0) ++wrong;
    if (DifferFromRankZero(coll, outer.momentum(), all) != 0) ++wrong;
    if (p.alpha == 0 && w.landed >= 0) {
      std::vector<bool> landed(kCount);
      for (int64_t i = 0; i < kCount; ++i) {
        landed[i] = FragmentOf(p.fragments, i) == w.landed;
      }
      if (DifferFromRankZero(coll, inner, landed) != 0) ++wrong;
    }
    if (w.started >= 0) {
      int64_t n = 0;
      for (int64_t i = 0; i < kCount; ++i) {
        n += FragmentOf(p.fragments, i) == w.started;
      }
      want_values += n;
      want_bytes += static_cast<int64_t>(
          runtime::WireBytes(p.wire, static_cast<size_t>(n)));
    }
  }
  if (outer.synced_values() != want_values ||
      outer.synced_wire_bytes() != want_bytes) {
    std::fprintf(stderr, "synced %lld values, %lld bytes; want %lld, %lld\n",
                 static_cast<long long>(outer.synced_values()),
                 static_cast<long long>(outer.synced_wire_bytes()),
                 static_cast<long long>(want_values),
                 static_cast<long long>(want_bytes));
    ++wrong;
  }
  if (std::getenv("DILOCO_TEST_VERBOSE") != nullptr) {
    std::fprintf(stderr, "replica %d shard %d: max error %.3g\n", d->replica,
                 d->shard, max_error);
  }
  return wrong;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Snapshot {
  std::vector<float> inner, outer, momentum;
  bool operator==(const Snapshot& o) const {
    return SameBits(inner, o.inner) && SameBits(outer, o.outer) &&
           SameBits(momentum, o.momentum);
  }
};

int CheckResume(runtime::DeviceCollectives& coll, const Params& p) {
  Result<Device> d = DeviceOf(coll);
  if (!d.ok()) return 1;
  const OuterOptimizerOptions options = OptionsOf(p);
  std::vector<float> start(kCount);
  for (int64_t i = 0; i < kCount; ++i) start[i] = Start(d->shard, i);
  // Steps [from, to] of `outer` on `inner`, a snapshot after each.
  auto run = [&](OuterOptimizer& outer, std::vector<float>& inner, int from,
                 int to, std::vector<Snapshot>* snapshots) {
    for (int t = from; t <= to; ++t) {
      for (int64_t i = 0; i < kCount; ++i) {
        inner[i] += Move(d->replica, t, d->shard, i);
      }
      if (!outer.AfterInnerStep(coll, t, inner.data()).ok()) return false;
      if (snapshots != nullptr) {
        snapshots->push_back({inner, outer.outer(), outer.momentum()});
      }
    }
    return true;
  };
  std::vector<Snapshot> uninterrupted;
  {
    std::vector<float> inner = start;
    OuterOptimizer outer(options, inner.data(), kCount);
    if (!run(outer, inner, 1, p.steps, &uninterrupted)) return 1;
  }
  const int g = p.period / p.fragments;
  int wrong = 0;
  for (int stop = 1; stop < p.steps; ++stop) {
    std::vector<float> inner = start;
    OuterOptimizer first(options, inner.data(), kCount);
    if (!run(first, inner, 1, stop, nullptr) || !first.Settle().ok()) return 1;
    // What a checkpoint holds, and the fragment in flight by the schedule.
    const std::vector<float> outer = first.outer(), momentum = first.momentum(),
                             pending = first.pending();
    const int started = stop / g * g;
    const int in_flight = started >= 1 && started + p.overlap > stop
                              ? (started / g - 1) % p.fragments
                              : -1;
    int pending_set = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(pending.size()); ++i) {
      if (pending[i] == 0.0f) continue;
      if (FragmentOf(p.fragments, i) != in_flight) {
        ++wrong;  // a value outside the fragment in flight
      } else {
        ++pending_set;
      }
    }
    if (in_flight >= 0 && pending_set == 0) ++wrong;
    OuterOptimizer second(options, inner.data(), kCount);
    second.outer() = outer;
    second.momentum() = momentum;
    second.pending() = pending;
    second.Resume(stop);
    std::vector<Snapshot> resumed;
    if (!run(second, inner, stop + 1, p.steps, &resumed)) return 1;
    for (int t = stop + 1; t <= p.steps; ++t) {
      if (!(resumed[t - stop - 1] == uninterrupted[t - 1]) && wrong++ < 5) {
        std::fprintf(stderr, "resumed after %d: step %d differs\n", stop, t);
      }
    }
  }
  return wrong;
}

// The bound of collectives.h on |CompressedAllReduce - exact sum| for each
// value, when every member of the group is its own wire member (4 slices of
// one device): x[g] is member g's input, in group rank order.
std::vector<double> CompressedSumBound(
    runtime::WireType wire, const std::vector<std::vector<float>>& x) {
  const int members = static_cast<int>(x.size());
  const size_t n = x[0].size();
  std::vector<double> bound(n, 0.0);
  // The error of each value of v through the wire, with int8 blocks counted
  // from each chunk's start.
  auto wire_error = [&](const std::vector<float>& v) {
    std::vector<double> e(n);
    for (int c = 0; c < members; ++c) {
      const comm::Segment chunk = comm::PartitionSegment(n, members, c);
      for (size_t b = 0; b < chunk.count; b += runtime::kInt8Block) {
        const size_t len = std::min(runtime::kInt8Block, chunk.count - b);
        const float* block = v.data() + chunk.offset + b;
        const float scale = runtime::Int8Scale(block, len);
        for (size_t j = 0; j < len; ++j) {
          e[chunk.offset + b + j] = wire == runtime::WireType::kInt8
                                        ? runtime::Int8WireError(scale)
                                        : runtime::Bf16WireError(block[j]);
        }
      }
    }
    return e;
  };
  auto through_wire = [&](const std::vector<float>& v) {
    std::vector<float> y(n);
    std::vector<std::byte> bytes(runtime::WireBytes(wire, n));
    for (int c = 0; c < members; ++c) {
      const comm::Segment chunk = comm::PartitionSegment(n, members, c);
      runtime::Quantize(wire, v.data() + chunk.offset, chunk.count,
                        bytes.data());
      runtime::Dequantize(wire, bytes.data(), chunk.count,
                          y.data() + chunk.offset);
    }
    return y;
  };
  std::vector<float> r(n, 0.0f);
  std::vector<double> sum_abs(n, 0.0);
  for (int g = 0; g < members; ++g) {
    const std::vector<double> e = wire_error(x[g]);
    const std::vector<float> y = through_wire(x[g]);
    for (size_t i = 0; i < n; ++i) {
      bound[i] += e[i];
      r[i] += y[i];
      sum_abs[i] += std::fabs(y[i]);
    }
  }
  const std::vector<double> e_r = wire_error(r);
  for (size_t i = 0; i < n; ++i) {
    bound[i] += runtime::F32SumError(members, sum_abs[i]) + e_r[i];
  }
  return bound;
}

// One outer step per fragment (period 2, 2 fragments, tau 0, lr 1, momentum
// 0: outer -= sum / K) through `p.wire` and through f32, side by side.
int CheckWire(runtime::DeviceCollectives& coll, const Params& p) {
  Result<Device> d = DeviceOf(coll);
  if (!d.ok()) return 1;
  Params f32 = p;
  f32.wire = runtime::WireType::kF32;
  std::vector<float> inner_c(kCount), inner_f(kCount);
  for (int64_t i = 0; i < kCount; ++i) inner_c[i] = Start(d->shard, i);
  inner_f = inner_c;
  const std::vector<float> start = inner_c;
  OuterOptimizer compressed(OptionsOf(p), inner_c.data(), kCount);
  OuterOptimizer plain(OptionsOf(f32), inner_f.data(), kCount);
  int64_t dcn_c = 0, dcn_f = 0;
  auto dcn_sent = [&] {
    return static_cast<int64_t>(coll.counters().dcn_bytes_sent.load());
  };
  for (int t = 1; t <= 2; ++t) {
    for (int64_t i = 0; i < kCount; ++i) {
      inner_c[i] += Move(d->replica, t, d->shard, i);
      inner_f[i] += Move(d->replica, t, d->shard, i);
    }
    const int64_t before = dcn_sent();
    if (!plain.AfterInnerStep(coll, t, inner_f.data()).ok()) return 1;
    const int64_t middle = dcn_sent();
    if (!compressed.AfterInnerStep(coll, t, inner_c.data()).ok()) return 1;
    dcn_f += middle - before;
    dcn_c += dcn_sent() - middle;
  }
  // Every member's pseudo-gradient of each fragment, packed as the
  // optimizer packs it: fragment f started at step f + 1 from the start
  // values moved f + 1 times.
  const FragmentRanges fragments = TestFragments(2);
  int wrong = 0, differ = 0;
  double worst = 0;  // the largest error as a share of its bound
  for (int f = 0; f < 2; ++f) {
    std::vector<std::vector<float>> x(d->replicas);
    std::vector<int64_t> positions;
    for (const auto& [begin, end] : fragments[f]) {
      for (int64_t i = begin; i < end; ++i) positions.push_back(i);
    }
    for (int g = 0; g < d->replicas; ++g) {
      for (int64_t i : positions) {
        float inner = start[i];
        for (int t = 1; t <= f + 1; ++t) inner += Move(g, t, d->shard, i);
        x[g].push_back(start[i] - inner);
      }
    }
    const std::vector<double> bound = CompressedSumBound(p.wire, x);
    for (size_t k = 0; k < positions.size(); ++k) {
      const int64_t i = positions[k];
      double sum_abs = 0;
      for (int g = 0; g < d->replicas; ++g) sum_abs += std::fabs(x[g][k]);
      const float got = compressed.outer()[i], want = plain.outer()[i];
      // Each sum's error over K, and the rounding of each outer update.
      const double allowed =
          (bound[k] + runtime::F32SumError(d->replicas, sum_abs)) /
              d->replicas +
          0x1p-24 * (std::fabs(got) + std::fabs(want));
      if (!(std::fabs(got - want) <= allowed) && wrong++ < 5) {
        std::fprintf(stderr, "%s [%lld]: %.9g, f32 %.9g, bound %.3g\n",
                     std::string(runtime::Name(p.wire)).c_str(),
                     static_cast<long long>(i), got, want, allowed);
      }
      differ += got != want;
      worst = std::max(worst, std::fabs(got - want) / allowed);
    }
  }
  if (std::getenv("DILOCO_TEST_VERBOSE") != nullptr) {
    std::fprintf(stderr, "replica %d: %s error up to %.3g of the bound\n",
                 d->replica, std::string(runtime::Name(p.wire)).c_str(), worst);
  }
  if (differ == 0) ++wrong;  // nothing was compressed
  const int64_t want_bytes = static_cast<int64_t>(
      runtime::WireBytes(p.wire, 601) + runtime::WireBytes(p.wire, 400));
  if (compressed.synced_values() != kCount || plain.synced_values() != kCount ||
      compressed.synced_wire_bytes() != want_bytes ||
      plain.synced_wire_bytes() != 4 * kCount) {
    ++wrong;
  }
  const double ratio = static_cast<double>(dcn_c) /
                       static_cast<double>(std::max<int64_t>(dcn_f, 1));
  if (dcn_f == 0 || ratio > (p.wire == runtime::WireType::kInt8 ? 0.3 : 0.55)) {
    std::fprintf(stderr, "dcn bytes %lld against f32 %lld\n",
                 static_cast<long long>(dcn_c), static_cast<long long>(dcn_f));
    ++wrong;
  }
  return wrong;
}

// argv: --worker <mode> ici_diloco dcn_diloco ici_fsdp period fragments
// overlap alpha lr mu steps wire.
constexpr int kWorkerArgs = 14;

int WorkerMain(int argc, char** argv) {
  if (argc != kWorkerArgs) return 2;
  const std::string mode = argv[2];
  Params p;
  p.ici_diloco = std::atoi(argv[3]);
  p.dcn_diloco = std::atoi(argv[4]);
  p.ici_fsdp = std::atoi(argv[5]);
  p.period = std::atoi(argv[6]);
  p.fragments = std::atoi(argv[7]);
  p.overlap = std::atoi(argv[8]);
  p.alpha = std::atof(argv[9]);
  p.lr = std::atof(argv[10]);
  p.mu = std::atof(argv[11]);
  p.steps = std::atoi(argv[12]);
  Result<runtime::WireType> wire = runtime::ParseWireType(argv[13], "wire");
  if (!wire.ok()) return 2;
  p.wire = *wire;
  mesh::ParallelismConfig parallelism;
  parallelism.ici[mesh::kDiloco] = p.ici_diloco;
  parallelism.dcn[mesh::kDiloco] = p.dcn_diloco;
  parallelism.ici[mesh::kFsdp] = p.ici_fsdp;
  return runtime::testing::RunDeviceChecks(
      parallelism, [&](runtime::Runtime& rt, int local) {
        runtime::DeviceCollectives& coll = rt.collectives(local);
        if (mode == "schedule") return CheckSchedule(coll, p);
        if (mode == "resume") return CheckResume(coll, p);
        if (mode == "wire") return CheckWire(coll, p);
        return 1;
      });
}

struct Case {
  const char* name;
  const char* mode;
  int slices, devices;  // cpu-<devices> slices
  Params p;
};

// Replicas over ICI (one slice of 2) or DCN (slices of 1), or DCN replicas of
// fsdp 2 (slices of 2).
Params Mesh(int ici_diloco, int dcn_diloco, int ici_fsdp = 1) {
  Params p;
  p.ici_diloco = ici_diloco;
  p.dcn_diloco = dcn_diloco;
  p.ici_fsdp = ici_fsdp;
  return p;
}
Params Plain(Params p, double lr, double mu) {
  p.period = 3;
  p.lr = lr;
  p.mu = mu;
  p.steps = 9;
  return p;
}
Params Streaming(Params p, int period, int fragments, int overlap, double alpha,
                 int steps) {
  p.period = period;
  p.fragments = fragments;
  p.overlap = overlap;
  p.alpha = alpha;
  p.lr = 0.7;
  p.mu = 0.9;
  p.steps = steps;
  return p;
}
Params Wire(runtime::WireType wire) {
  Params p = Mesh(1, 4);
  p.period = 2;
  p.fragments = 2;
  p.steps = 2;
  p.wire = wire;
  return p;
}

// Test names and failures show the case's name, not its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class DilocoTest : public ::testing::TestWithParam<Case> {};

TEST_P(DilocoTest, IsTheAlgorithm) {
  const Case& c = GetParam();
  const Params& p = c.p;
  const std::vector<std::string> args = {"--worker",
                                         c.mode,
                                         std::to_string(p.ici_diloco),
                                         std::to_string(p.dcn_diloco),
                                         std::to_string(p.ici_fsdp),
                                         std::to_string(p.period),
                                         std::to_string(p.fragments),
                                         std::to_string(p.overlap),
                                         std::to_string(p.alpha),
                                         std::to_string(p.lr),
                                         std::to_string(p.mu),
                                         std::to_string(p.steps),
                                         std::string(runtime::Name(p.wire))};
  runtime::LaunchResult result =
      runtime::testing::RunSelfAsWorkers(c.slices, c.devices, args);
  EXPECT_EQ(result.exit_code, 0) << "failed worker " << result.failed_worker;
}

INSTANTIATE_TEST_SUITE_P(
    Replicas, DilocoTest,
    ::testing::Values(
        Case{"ici2_nesterov", "schedule", 1, 2, Plain(Mesh(2, 1), 0.7, 0.9)},
        Case{"dcn4_nesterov", "schedule", 4, 1, Plain(Mesh(1, 4), 0.7, 0.9)},
        // lr 1, momentum 0: the plain average.
        Case{"dcn2_average", "schedule", 2, 1, Plain(Mesh(1, 2), 1, 0)},
        Case{"dcn2_fsdp2_nesterov", "schedule", 2, 2,
             Plain(Mesh(1, 2, 2), 0.7, 0.9)},
        Case{"streaming_f2_tau1_alpha05", "schedule", 2, 1,
             Streaming(Mesh(1, 2), 4, 2, 1, 0.5, 12)},
        Case{"streaming_f2_tau1_alpha025", "schedule", 1, 2,
             Streaming(Mesh(2, 1), 4, 2, 1, 0.25, 12)},
        Case{"streaming_f2_tau1_alpha0", "schedule", 2, 1,
             Streaming(Mesh(1, 2), 4, 2, 1, 0, 12)},
        Case{"streaming_f2_tau2_fsdp2", "schedule", 2, 2,
             Streaming(Mesh(1, 2, 2), 6, 2, 2, 0.5, 12)},
        Case{"streaming_f4_empty_fragment", "schedule", 2, 1,
             Streaming(Mesh(1, 2), 8, 4, 1, 0.5, 16)},
        Case{"resume_plain", "resume", 2, 1, Plain(Mesh(1, 2), 0.7, 0.9)},
        Case{"resume_f2_tau1", "resume", 2, 1,
             Streaming(Mesh(1, 2), 4, 2, 1, 0.5, 12)},
        Case{"resume_f2_tau2", "resume", 2, 1,
             Streaming(Mesh(1, 2), 6, 2, 2, 0.5, 12)},
        Case{"wire_int8", "wire", 4, 1, Wire(runtime::WireType::kInt8)},
        Case{"wire_bf16", "wire", 4, 1, Wire(runtime::WireType::kBF16)}),
    [](const auto& info) { return std::string(info.param.name); });

// A 4-layer model small enough to walk every position.
model::DecoderConfig SmallModel() {
  return model::GptShape(16, 8, 8, 2, 4, 16);
}

// The fragment of each position (-1: none; -2: more than one).
std::vector<int> Owners(const FragmentRanges& fragments, int64_t count) {
  std::vector<int> owner(static_cast<size_t>(count), -1);
  for (size_t f = 0; f < fragments.size(); ++f) {
    for (const auto& [begin, end] : fragments[f]) {
      for (int64_t i = begin; i < end; ++i) {
        if (i < 0 || i >= count) return {};
        owner[i] = owner[i] == -1 ? static_cast<int>(f) : -2;
      }
    }
  }
  return owner;
}

TEST(LayerFragmentsTest, WholeTensorsByLayer) {
  const model::DecoderConfig m = SmallModel();
  const int layers = m.num_layers;
  for (int fragments : {1, 2, 4}) {
    for (int stages : {1, 2}) {
      for (int index = 0; index < stages; ++index) {
        for (int tensor : {1, 2}) {
          SCOPED_TRACE("F " + std::to_string(fragments) + ", stage " +
                       std::to_string(index) + " of " + std::to_string(stages) +
                       ", tensor " + std::to_string(tensor));
          const model::PipelineStage stage{index, stages};
          Result<FragmentRanges> got =
              LayerFragments(m, tensor, stage, fragments);
          ASSERT_TRUE(got.ok()) << got.status().message();
          ASSERT_EQ(got->size(), static_cast<size_t>(fragments));
          const std::vector<model::ParamTensor> layout =
              model::ParameterLayout(m, tensor, stage);
          const int64_t count = layout.back().offset + layout.back().size;
          const std::vector<int> owner = Owners(*got, count);
          ASSERT_EQ(owner.size(), static_cast<size_t>(count));
          for (const model::ParamTensor& t : layout) {
            int want = 0;  // wte (both copies) and wpe
            if (t.name.rfind("lnf.", 0) == 0) want = fragments - 1;
            if (t.name[0] == 'h') {
              want = std::atoi(t.name.c_str() + 1) * fragments / layers;
            }
            for (int64_t i = t.offset; i < t.offset + t.size; ++i) {
              ASSERT_EQ(owner[i], want) << t.name << " position " << i;
            }
          }
          if (fragments == 4 && stages == 2 && index == 1) {
            // Layers 2 and 3, the tied wte and lnf: nothing of fragment 1.
            EXPECT_TRUE((*got)[1].empty());
          }
        }
      }
    }
  }
}

TEST(LayerFragmentsTest, UnevenSplitFollowsTheIntegerDivision) {
  // F = 3 of 4 layers: [0, 1), [1, 2), [2, 4).
  const model::DecoderConfig m = SmallModel();
  Result<FragmentRanges> got = LayerFragments(m, 1, {}, 3);
  ASSERT_TRUE(got.ok());
  const std::vector<int> owner = Owners(*got, model::NumParameters(m, 1));
  const int want_by_layer[] = {0, 1, 2, 2};
  for (const model::ParamTensor& t : model::ParameterLayout(m, 1)) {
    if (t.name[0] != 'h') continue;
    EXPECT_EQ(owner[t.offset], want_by_layer[std::atoi(t.name.c_str() + 1)])
        << t.name;
  }
}

TEST(LayerFragmentsTest, RefusesFragmentsOutsideOneToLayers) {
  const model::DecoderConfig m = SmallModel();
  for (int fragments : {0, 5}) {
    Result<FragmentRanges> got = LayerFragments(m, 1, {}, fragments);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find("num_diloco_fragments"),
              std::string::npos);
  }
}

TEST(ShardFragmentsTest, ThreeShardsKeepEveryPositionsFragment) {
  const model::DecoderConfig m = SmallModel();
  Result<FragmentRanges> layers = LayerFragments(m, 1, {}, 4);
  ASSERT_TRUE(layers.ok());
  const int64_t model_count = model::NumParameters(m, 1);
  for (const auto& [fragments, count] :
       {std::pair{*layers, model_count}, std::pair{TestFragments(4), kCount}}) {
    const std::vector<int> whole = Owners(fragments, count);
    int64_t begin = 0;
    for (int s = 0; s < 3; ++s) {
      const comm::Segment shard =
          comm::PartitionSegment(static_cast<size_t>(count), 3, s);
      ASSERT_EQ(static_cast<int64_t>(shard.offset), begin);
      const auto n = static_cast<int64_t>(shard.count);
      const FragmentRanges cut = ShardFragments(fragments, begin, n);
      ASSERT_EQ(cut.size(), fragments.size());
      const std::vector<int> owner = Owners(cut, n);
      ASSERT_EQ(owner.size(), static_cast<size_t>(n)) << "a range outside";
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(owner[i], whole[begin + i]) << "shard " << s << " at " << i;
      }
      begin += n;
    }
  }
  // The middle third of the test fragments holds none of fragment 0.
  const FragmentRanges middle = ShardFragments(TestFragments(2), 334, 334);
  EXPECT_TRUE(middle[0].empty());
  ASSERT_EQ(middle[1].size(), 1u);
  EXPECT_EQ(middle[1][0], (std::pair<int64_t, int64_t>{0, 334}));
}

}  // namespace
}  // namespace multislice::train

int main(int argc, char** argv) {
  return multislice::runtime::testing::WorkerOrTestsMain(
      argc, argv, multislice::train::WorkerMain);
}
