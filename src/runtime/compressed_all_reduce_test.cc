// DeviceCollectives::CompressedAllReduce over 4 devices on each path: one
// slice of 4 (shared memory), 4 slices of 1 (DCN) and 2 slices of 2 (two
// levels). On every device, in int8 and bf16:
//   - out against the exact sum (in double, by a plain loop over the group
//     the mesh coordinates define) within the bound of collectives.h,
//     computed here from the inputs alone;
//   - out bit for bit the algorithm of collectives.h replayed here with the
//     quantisers of wire.h (chunks, blocks, order of the sum);
//   - the same bits on every member (a hash of out, all-gathered);
//   - NaN propagation: one member's NaN spoils one value (bf16) or one
//     block (int8) on every member;
//   - the bytes the runtime counts on the link, exactly two slots per other
//     wire member, about 1/4 (int8) and 1/2 (bf16) of AllReduce's;
//   - over DCN, the ICI stream stays free while a late member is awaited.
// kF32 equals AllReduce bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "runtime/collectives.h"
#include "runtime/runtime.h"
#include "runtime/test_support.h"
#include "runtime/wire.h"

namespace multislice::runtime {
namespace {

using comm::PartitionSegment;
using comm::Segment;
using testing::ReferenceGroup;

// Pseudo-random values of magnitudes from 2^-12 to 2^12, by region, with an
// outlier 1000 times larger every 997 values (a block whose small values
// int8 flattens).
float Value(int device, size_t i) {
  uint32_t h = static_cast<uint32_t>(device) * 2654435761u ^
               static_cast<uint32_t>(i) * 2246822519u;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  const float unit = static_cast<float>(h >> 8) * 0x1p-23f - 1.0f;
  const int exponent = static_cast<int>((i / 300) % 25) - 12;
  return std::ldexp(unit, exponent) * (i % 997 == 0 ? 1000.0f : 1.0f);
}

// Who the wire members are, from the group: the slices when it spans
// slices, else the hosts, else (on one host) each member; each as its hosts'
// members' group ranks, [wire member][host][i]. And the chunks the values
// are quantised in (int8 blocks start at each chunk's start): the array, or
// each device's piece after the f32 reduce-scatters of the inner levels,
// split over the wire members.
struct WireLayout {
  std::vector<std::vector<std::vector<int>>> members;
  std::vector<Segment> chunks;  // covering [0, count)
};

WireLayout LayoutOf(const AxisGroup& g, size_t count) {
  WireLayout w;
  const int m = g.dcn_size, h = g.host_size, k = g.local_size;
  auto host = [&](int q) {
    std::vector<int> ranks;
    for (int i = 0; i < k; ++i) ranks.push_back(g.NetRankOf(q, i));
    return ranks;
  };
  std::vector<Segment> pieces;
  if (g.path() == Path::kShared || (k == 1 && (m == 1 || h == 1))) {
    for (int r = 0; r < g.size; ++r) w.members.push_back({{r}});
    pieces = {{0, count}};
  } else {
    const bool slices = m > 1 && h > 1;
    for (int x = 0; x < (slices ? m : g.net_size); ++x) {
      w.members.emplace_back();
      for (int e = 0; e < (slices ? h : 1); ++e) {
        w.members.back().push_back(host(slices ? x * h + e : x));
      }
    }
    for (const auto& shard : comm::BalancedLayout(count, k)) {
      for (int e = 0; e < (slices ? h : 1); ++e) {
        const Segment s = PartitionSegment(shard[0].count, slices ? h : 1, e);
        pieces.push_back({shard[0].offset + s.offset, s.count});
      }
    }
  }
  const int n = static_cast<int>(w.members.size());
  for (const Segment& piece : pieces) {
    for (int c = 0; c < n; ++c) {
      const Segment s = PartitionSegment(piece.count, n, c);
      w.chunks.push_back({piece.offset + s.offset, s.count});
    }
  }
  return w;
}

// The input of every group rank.
std::vector<std::vector<float>> Inputs(const std::vector<int>& group,
                                       size_t count) {
  std::vector<std::vector<float>> x(group.size(), std::vector<float>(count));
  for (size_t r = 0; r < group.size(); ++r) {
    for (size_t i = 0; i < count; ++i) x[r][i] = Value(group[r], i);
  }
  return x;
}

std::vector<float> RoundTrip(WireType wire, const float* v, size_t n) {
  std::vector<std::byte> bytes(WireBytes(wire, n));
  Quantize(wire, v, n, bytes.data());
  std::vector<float> out(n);
  Dequantize(wire, bytes.data(), n, out.data());
  return out;
}

// The algorithm replayed: the wire members' f32 inputs (each host adds its
// members' in in order of i, as the shared-memory reduce-scatter does, then
// the hosts are added: exact for two, whose order does not matter), each
// chunk through the wire, summed in wire member order, through the wire
// again.
std::vector<float> Replay(WireType wire, const WireLayout& layout,
                          const std::vector<std::vector<float>>& x) {
  const size_t count = x[0].size();
  std::vector<std::vector<float>> v;
  for (const auto& hosts : layout.members) {
    std::vector<float> total(count, 0.0f);
    for (size_t e = 0; e < hosts.size(); ++e) {
      std::vector<float> sum(x[hosts[e][0]]);
      for (size_t i = 1; i < hosts[e].size(); ++i) {
        for (size_t j = 0; j < count; ++j) sum[j] += x[hosts[e][i]][j];
      }
      for (size_t j = 0; j < count; ++j) {
        total[j] = e == 0 ? sum[j] : total[j] + sum[j];
      }
    }
    v.push_back(total);
  }
  std::vector<float> out(count);
  for (const Segment& c : layout.chunks) {
    std::vector<float> r(c.count, 0.0f);
    for (size_t w = 0; w < v.size(); ++w) {
      const std::vector<float> y =
          RoundTrip(wire, v[w].data() + c.offset, c.count);
      for (size_t i = 0; i < c.count; ++i) r[i] = w == 0 ? y[i] : r[i] + y[i];
    }
    const std::vector<float> back = RoundTrip(wire, r.data(), c.count);
    std::copy(back.begin(), back.end(), out.begin() + c.offset);
  }
  return out;
}

float Up(double v) {
  return std::nextafter(static_cast<float>(v),
                        std::numeric_limits<float>::infinity());
}

// The error bound of one value through the wire for any value of magnitude
// at most `magnitude` (bf16), or in a block whose largest magnitude is at
// most `block_max` (int8).
double WireErrorUpTo(WireType wire, double magnitude, double block_max) {
  if (wire == WireType::kBF16) {
    return std::max(Bf16WireError(Up(magnitude)), 0x1p-126);
  }
  const double scale = std::max(block_max / 127 * (1 + 0x1p-23), 0x1p-126);
  return Int8WireError(Up(scale));
}

// The bound of collectives.h for every value, from the inputs: the wire
// members' inputs and the reduced values are only known up to the f32
// rounding of the sums, so each term takes its largest value over that
// range (every term grows with the magnitude).
std::vector<double> Bound(WireType wire, const WireLayout& layout,
                          const std::vector<std::vector<float>>& x,
                          std::vector<double>* exact) {
  const size_t count = x[0].size();
  const size_t n = layout.members.size();
  // Per wire member and value: the largest |v_w| and the error of v_w.
  std::vector<std::vector<double>> v_max(n, std::vector<double>(count));
  std::vector<double> host_error(count, 0), sum_abs(count, 0);
  exact->assign(count, 0);
  for (size_t w = 0; w < n; ++w) {
    std::vector<int> ranks;
    for (const std::vector<int>& host : layout.members[w]) {
      ranks.insert(ranks.end(), host.begin(), host.end());
    }
    for (size_t i = 0; i < count; ++i) {
      double p = 0, a = 0;
      for (int r : ranks) p += x[r][i], a += std::fabs(x[r][i]);
      const double h = F32SumError(static_cast<int>(ranks.size()), a);
      v_max[w][i] = std::fabs(p) + h;
      host_error[i] += h;
      (*exact)[i] += p;
      sum_abs[i] += a;
    }
  }
  std::vector<double> bound(count);
  std::vector<double> r_max(count), quantised(count, 0), y_abs(count, 0);
  for (const Segment& c : layout.chunks) {
    for (size_t b = c.offset; b < c.offset + c.count; b += kInt8Block) {
      const size_t end = std::min(b + kInt8Block, c.offset + c.count);
      for (size_t w = 0; w < n; ++w) {
        const double block_max =
            *std::max_element(v_max[w].begin() + b, v_max[w].begin() + end);
        for (size_t i = b; i < end; ++i) {
          const double e = WireErrorUpTo(wire, v_max[w][i], block_max);
          quantised[i] += e;
          y_abs[i] += v_max[w][i] + e;
        }
      }
      for (size_t i = b; i < end; ++i) {
        const double sum = F32SumError(static_cast<int>(n), y_abs[i]);
        r_max[i] = std::fabs((*exact)[i]) + host_error[i] + quantised[i] + sum;
        bound[i] = host_error[i] + quantised[i] + sum;
      }
      const double r_block =
          *std::max_element(r_max.begin() + b, r_max.begin() + end);
      for (size_t i = b; i < end; ++i) {
        // The exact sum in double of at most 4 values: off by 3 ulps.
        bound[i] +=
            WireErrorUpTo(wire, r_max[i], r_block) + 4 * 0x1p-53 * sum_abs[i];
      }
    }
  }
  return bound;
}

uint64_t Hash(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  for (float f : v) h = (h ^ std::bit_cast<uint32_t>(f)) * 1099511628211ull;
  return h;
}

// Whether every member of the group holds the same hash: all-gathered as 4
// bf16-sized carriers each (AllGather only moves bytes).
bool SameOnEveryMember(DeviceCollectives& coll, const Axes& axes, int p,
                       uint64_t hash) {
  std::vector<uint64_t> all(p);
  if (!coll.AllGather(axes, &hash, all.data(), 4 * p, DType::kBF16, "hash")
           .Wait()
           .ok()) {
    return false;
  }
  return std::all_of(all.begin(), all.end(),
                     [&](uint64_t h) { return h == hash; });
}

bool Bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Values, replay, bound and sameness for one count; returns wrong values.
int CheckValues(Runtime& rt, int local, const Axes& axes, size_t count) {
  DeviceCollectives& coll = rt.collectives(local);
  const int me = rt.local_devices()[local];
  const std::vector<int> group = ReferenceGroup(rt.mesh(), axes, me);
  const int p = static_cast<int>(group.size());
  const AxisGroup& g = **coll.Group(axes);
  const std::vector<std::vector<float>> x = Inputs(group, count);
  const std::vector<float>& in =
      x[std::find(group.begin(), group.end(), me) - group.begin()];
  const WireType wires[] = {WireType::kInt8, WireType::kBF16};
  // Everything in flight at once, the int8 one also in place.
  std::vector<std::vector<float>> out(2, std::vector<float>(count, -7.0f));
  std::vector<float> in_place(in), f32(count), all_reduced(count);
  std::vector<CollectiveHandle> handles;
  for (int t = 0; t < 2; ++t) {
    handles.push_back(coll.CompressedAllReduce(axes, in.data(), out[t].data(),
                                               count, wires[t], "values"));
  }
  handles.push_back(coll.CompressedAllReduce(
      axes, in_place.data(), in_place.data(), count, WireType::kInt8));
  handles.push_back(coll.CompressedAllReduce(axes, in.data(), f32.data(), count,
                                             WireType::kF32));
  handles.push_back(coll.AllReduce(axes, in.data(), all_reduced.data(), count,
                                   DType::kF32, ReduceOp::kSum));
  for (CollectiveHandle& h : handles) {
    Status s = h.Wait();
    if (!s.ok()) {
      std::fprintf(stderr, "FAILED: %s\n", s.message().c_str());
      return 1 << 20;
    }
  }
  int wrong = 0;
  const std::string tag = g.axes_label + " (" + PathName(g.path()) +
                          ") count " + std::to_string(count);
  if (!Bitwise(f32, all_reduced)) {
    std::fprintf(stderr, "%s: f32 wire differs from AllReduce\n", tag.c_str());
    ++wrong;
  }
  if (!Bitwise(in_place, out[0])) {
    std::fprintf(stderr, "%s: int8 in place differs\n", tag.c_str());
    ++wrong;
  }
  const WireLayout layout = LayoutOf(g, count);
  for (int t = 0; t < 2; ++t) {
    const std::string what = tag + " " + std::string(Name(wires[t]));
    if (!Bitwise(out[t], Replay(wires[t], layout, x))) {
      std::fprintf(stderr, "%s: not the replayed algorithm\n", what.c_str());
      ++wrong;
    }
    if (!SameOnEveryMember(coll, axes, p, Hash(out[t]))) {
      std::fprintf(stderr, "%s: members differ\n", what.c_str());
      ++wrong;
    }
    std::vector<double> exact;
    const std::vector<double> bound = Bound(wires[t], layout, x, &exact);
    double worst = 0, max_error = 0, max_sum = 0;
    int over = 0;
    for (size_t i = 0; i < count; ++i) {
      const double error = std::fabs(out[t][i] - exact[i]);
      if (!(error <= bound[i])) {
        if (over++ < 3) {
          std::fprintf(stderr, "%s [%zu]: |%.9g - %.9g| > bound %.3g\n",
                       what.c_str(), i, out[t][i], exact[i], bound[i]);
        }
      }
      worst = std::max(worst, error / bound[i]);
      max_error = std::max(max_error, error);
      max_sum = std::max(max_sum, std::fabs(exact[i]));
    }
    wrong += over;
    if (rt.process_index() == 0 && local == 0 && count > 1000) {
      std::printf(
          "%s: error at most %.3g of the bound, at most %.3g of the largest "
          "|sum|\n",
          what.c_str(), worst, max_error / max_sum);
    }
  }
  return wrong;
}

// Started with `after` behind the all-reduce that writes its input, without
// waiting: the same bits as when started once that input is there.
int CheckAfter(Runtime& rt, int local, const Axes& axes) {
  DeviceCollectives& coll = rt.collectives(local);
  const size_t count = 10007;
  std::vector<float> in(count), reduced(count), chained(count), plain(count);
  for (size_t i = 0; i < count; ++i) {
    in[i] = Value(rt.local_devices()[local], i);
  }
  CollectiveHandle first = coll.AllReduce(axes, in.data(), reduced.data(),
                                          count, DType::kF32, ReduceOp::kSum);
  CollectiveHandle second =
      coll.CompressedAllReduce(axes, reduced.data(), chained.data(), count,
                               WireType::kInt8, "chained", first);
  if (!second.Wait().ok() || !first.Wait().ok()) return 1;
  if (!coll.CompressedAllReduce(axes, reduced.data(), plain.data(), count,
                                WireType::kInt8)
           .Wait()
           .ok()) {
    return 1;
  }
  if (!Bitwise(chained, plain)) {
    std::fprintf(stderr, "int8 after an all-reduce differs\n");
    return 1;
  }
  return 0;
}

// Over DCN, the quantise / reduce / dequantise phases run on the DCN
// stream: while the compressed all-reduce waits for a member that starts it
// late, the device's ICI stream stays free (an all-reduce over the size-1
// tensor axis, a copy on the ICI stream, finishes first). Not on the paths
// whose inner levels all-gather over ICI at the end (several devices of the
// group on a host), where the ICI stream waits by design, as in AllReduce.
int CheckIciStaysFree(Runtime& rt, int local, const Axes& axes) {
  DeviceCollectives& coll = rt.collectives(local);
  const AxisGroup& g = **coll.Group(axes);
  if (g.path() == Path::kShared || g.local_size > 1) return 0;
  const size_t count = 4099;
  std::vector<float> in(count, 1.0f), out(count), copy(count);
  int wrong = 0;
  for (WireType wire : {WireType::kInt8, WireType::kBF16}) {
    const bool late = g.rank == 0;
    if (late) std::this_thread::sleep_for(std::chrono::milliseconds(400));
    CollectiveHandle compressed =
        coll.CompressedAllReduce(axes, in.data(), out.data(), count, wire);
    if (!coll.AllReduce({"tensor"}, in.data(), copy.data(), count, DType::kF32,
                        ReduceOp::kSum)
             .Wait()
             .ok()) {
      return 1;
    }
    if (!late && compressed.Done()) {
      std::fprintf(stderr,
                   "%s over %s: an ICI-stream copy waited for the compressed "
                   "all-reduce over DCN\n",
                   std::string(Name(wire)).c_str(), g.axes_label.c_str());
      ++wrong;
    }
    if (!compressed.Wait().ok()) return 1;
  }
  return wrong;
}

// Group rank 1 holds a NaN at index `at`: every member gets NaN there
// (bf16) or in that value's whole int8 block, and finite values elsewhere.
int CheckNaN(Runtime& rt, int local, const Axes& axes) {
  DeviceCollectives& coll = rt.collectives(local);
  const AxisGroup& g = **coll.Group(axes);
  const size_t count = 3001, at = 1234;
  std::vector<float> in(count);
  for (size_t i = 0; i < count; ++i)
    in[i] = Value(rt.local_devices()[local], i);
  if (g.rank == 1) in[at] = std::numeric_limits<float>::quiet_NaN();
  size_t block_begin = 0, block_end = 0;
  for (const Segment& c : LayoutOf(g, count).chunks) {
    if (at >= c.offset && at < c.offset + c.count) {
      block_begin = c.offset + (at - c.offset) / kInt8Block * kInt8Block;
      block_end = std::min(block_begin + kInt8Block, c.offset + c.count);
    }
  }
  int wrong = 0;
  for (WireType wire : {WireType::kInt8, WireType::kBF16}) {
    std::vector<float> out(count);
    if (!coll.CompressedAllReduce(axes, in.data(), out.data(), count, wire)
             .Wait()
             .ok()) {
      return 1;
    }
    for (size_t i = 0; i < count; ++i) {
      const bool want_nan =
          wire == WireType::kInt8 ? i >= block_begin && i < block_end : i == at;
      if (std::isnan(out[i]) != want_nan) ++wrong;
    }
    if (wrong) {
      std::fprintf(stderr, "%s NaN over %s: %d values wrong\n",
                   std::string(Name(wire)).c_str(), g.axes_label.c_str(),
                   wrong);
    }
  }
  return wrong;
}

// The bytes on the group's outermost link (DCN, else between the slice's
// hosts, else shared memory) of one all-reduce of `count` values: f32
// AllReduce, then the compressed ones, which must send exactly two slots to
// each other wire member there and the same bytes as AllReduce on the inner
// links.
int CheckBytes(Runtime& rt, int local, const Axes& axes) {
  DeviceCollectives& coll = rt.collectives(local);
  const AxisGroup& g = **coll.Group(axes);
  const size_t count = (1 << 18) + 13;
  std::vector<float> in(count, 1.0f), out(count);
  const char* names[] = {"shared memory", "the slice's hosts", "DCN"};
  const int outer = g.dcn_size > 1 ? 2 : g.host_size > 1 ? 1 : 0;
  auto counters = [&] {
    return std::array<double, 3>{
        static_cast<double>(coll.counters().ici_bytes_sent.load()),
        static_cast<double>(coll.counters().slice_net_bytes_sent.load()),
        static_cast<double>(coll.counters().dcn_bytes_sent.load())};
  };
  auto sent = [&](const std::function<CollectiveHandle()>& start,
                  std::array<double, 3>* bytes) {
    const std::array<double, 3> before = counters();
    if (!start().Wait().ok()) return false;
    const std::array<double, 3> after = counters();
    for (int l = 0; l < 3; ++l) (*bytes)[l] = after[l] - before[l];
    return true;
  };
  std::array<double, 3> f32;
  if (!sent(
          [&] {
            return coll.AllReduce(axes, in.data(), out.data(), count,
                                  DType::kF32, ReduceOp::kSum);
          },
          &f32)) {
    return 1;
  }
  // This device's piece of the values and the wire members it is split over.
  const int n = static_cast<int>(LayoutOf(g, count).members.size());
  size_t values = count;
  if (outer > 0) {
    values = PartitionSegment(values, g.local_size, g.local_rank).count;
  }
  if (outer == 2) {
    values = PartitionSegment(values, g.host_size, g.host_rank).count;
  }
  int wrong = 0;
  for (WireType wire : {WireType::kInt8, WireType::kBF16}) {
    std::array<double, 3> got;
    if (!sent(
            [&] {
              return coll.CompressedAllReduce(axes, in.data(), out.data(),
                                              count, wire);
            },
            &got)) {
      return 1;
    }
    const size_t slot =
        (WireBytes(wire, PartitionSegment(values, n, 0).count) + 1) / 2 * 2;
    const double want = 2.0 * (n - 1) * slot;
    const double ratio = got[outer] / f32[outer];
    const double ideal = wire == WireType::kInt8 ? 0.25 * (1 + 4.0 / 256) : 0.5;
    const std::string what = std::string(Name(wire)) + " over " + g.axes_label +
                             " (" + PathName(g.path()) + ", " +
                             std::to_string(n) + " wire members)";
    if (rt.process_index() == 0 && local == 0) {
      std::printf(
          "%s: %.0f bytes per device over %s against f32 AllReduce's %.0f: "
          "ratio %.4f\n",
          what.c_str(), got[outer], names[outer], f32[outer], ratio);
    }
    // AllReduce's ring moves 2 (n-1)/n of the f32 values (within an element
    // per chunk).
    if (got[outer] != want || std::fabs(ratio - ideal) > 0.001) {
      std::fprintf(stderr, "%s: %.0f bytes, want %.0f (ratio %.4f)\n",
                   what.c_str(), got[outer], want, ratio);
      ++wrong;
    }
    for (int l = 0; l < outer; ++l) {
      if (got[l] != f32[l]) {
        std::fprintf(stderr, "%s: %.0f bytes over %s, AllReduce %.0f\n",
                     what.c_str(), got[l], names[l], f32[l]);
        ++wrong;
      }
    }
  }
  return wrong;
}

int WorkerMain(int argc, char** argv) {
  // argv: self --worker ici(4) dcn(4) axis[,axis...]
  constexpr int kArgs = 3 + 2 * mesh::kNumAxes;
  if (argc != kArgs) return 2;
  Axes axes;
  std::string list = argv[kArgs - 1];
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    axes.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return testing::RunDeviceChecks(
      testing::ParallelismFromArgs(argv + 2), [&](Runtime& rt, int local) {
        return CheckValues(rt, local, axes, 100003) +
               CheckValues(rt, local, axes, 0) +
               CheckValues(rt, local, axes, 3) + CheckAfter(rt, local, axes) +
               CheckValues(rt, local, axes, 7) + CheckNaN(rt, local, axes) +
               CheckBytes(rt, local, axes) + CheckIciStaysFree(rt, local, axes);
      });
}

struct Case {
  std::string type;  // cpu-N: one host per slice; a TPU type: several
  int slices;
  testing::AxisValues ici, dcn;
  std::string axes;
};

class CompressedAllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(CompressedAllReduceTest,
       WithinTheBoundTheSameOnEveryMemberInFewerBytes) {
  const Case& c = GetParam();
  std::vector<std::string> args = {"--worker"};
  for (const std::string& v : testing::ParallelismArgs(c.ici, c.dcn)) {
    args.push_back(v);
  }
  args.push_back(c.axes);
  LaunchResult result = testing::RunSelfAsWorkersOf(c.type, c.slices, args);
  EXPECT_EQ(result.exit_code, 0) << "failed worker " << result.failed_worker;
}

// ici and dcn: diloco, data, stage, fsdp, tensor. The three paths over 4
// devices, and 2 slices of v4-16 (2 hosts of 4 devices each), f32 between the
// slice's hosts and compressed over DCN: 16 devices (4 on each host), and 4
// (one on each host, stages across the hosts).
INSTANTIATE_TEST_SUITE_P(
    Paths, CompressedAllReduceTest,
    ::testing::Values(
        Case{"cpu-4", 1, {1, 1, 1, 4, 1}, {1, 1, 1, 1, 1}, "fsdp"},
        Case{"cpu-1", 4, {1, 1, 1, 1, 1}, {1, 4, 1, 1, 1}, "data"},
        Case{"cpu-2", 2, {1, 1, 1, 2, 1}, {1, 2, 1, 1, 1}, "data,fsdp"},
        Case{"v4-16", 2, {1, 1, 1, 8, 1}, {1, 2, 1, 1, 1}, "data,fsdp"},
        Case{"v4-16", 2, {1, 1, 2, 4, 1}, {1, 2, 1, 1, 1}, "data,stage"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      std::string name = c.type + "x" + std::to_string(c.slices) + "_" + c.axes;
      std::replace(name.begin(), name.end(), ',', '_');
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

}  // namespace
}  // namespace multislice::runtime

int main(int argc, char** argv) {
  return multislice::runtime::testing::WorkerOrTestsMain(
      argc, argv, multislice::runtime::WorkerMain);
}
