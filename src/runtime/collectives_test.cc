// Every collective on every path (local, ICI, DCN, two-level), in f32 and
// bf16, with every reduction, on odd sizes and on meshes of 1 to 4 slices of
// 1 to 4 devices, checked against a reference computed here by a plain loop
// over the group that the mesh coordinates define. Several collectives are
// in flight at once on each device.
#include "runtime/collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/float_env.h"
#include "runtime/comm/dcn/test_redis_server.h"
#include "runtime/runtime.h"
#include "runtime/test_support.h"

namespace multislice::runtime {
namespace {

using comm::DType;
using comm::PartitionSegment;
using comm::ReduceOp;
using testing::GetElement;
using testing::ReferenceGroup;
using testing::SetElement;

// Small integers, so that every sum is exact in bf16 and f32 whatever the
// order of reduction.
float Value(int device, size_t i, int salt) {
  return static_cast<float>(
             static_cast<int>((device * 7 + i * 3 + salt * 5) % 11)) -
         5.0f;
}

float Combine(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kMin:
      return std::min(a, b);
  }
  return 0;
}

struct Buffer {
  DType dtype;
  std::vector<std::byte> bytes;
  Buffer(DType t, size_t n) : dtype(t), bytes(n * comm::SizeOf(t)) {}
  void* data() { return bytes.data(); }
  size_t size() const { return bytes.size() / comm::SizeOf(dtype); }
};

// Counts mismatches between a buffer and expected(i); prints the first few.
int Compare(const std::string& what, const Buffer& got,
            const std::function<float(size_t)>& expected) {
  int wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    float g = GetElement(got.dtype, got.bytes.data(), i), e = expected(i);
    if (g != e) {
      if (wrong < 3) {
        std::fprintf(stderr, "MISMATCH %s [%zu]: got %g want %g\n",
                     what.c_str(), i, g, e);
      }
      ++wrong;
    }
  }
  return wrong;
}

// The sweep one device runs; returns the number of wrong values.
int SweepOnDevice(Runtime& rt, int local, size_t large, int* checked) {
  DeviceCollectives& coll = rt.collectives(local);
  const int me = rt.local_devices()[local];
  const std::vector<std::vector<std::string>> axes_sets = {
      {"data"},
      {"stage"},
      {"fsdp"},
      {"tensor"},
      {"data", "fsdp"},
      {"fsdp", "data"},
      {"data", "fsdp", "tensor"}};
  int wrong = 0, salt = 0;
  for (const auto& axes : axes_sets) {
    const std::vector<int> group = ReferenceGroup(rt.mesh(), axes, me);
    const int p = static_cast<int>(group.size());
    const int r = static_cast<int>(std::find(group.begin(), group.end(), me) -
                                   group.begin());
    std::string label;
    for (const std::string& a : axes) label += a + ",";
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (size_t count : {size_t{1}, size_t{7}, large}) {
        ++salt;
        const std::string tag = label + std::string(comm::Name(dtype)) + "," +
                                std::to_string(count);
        auto fill = [&](Buffer& b, int device, size_t offset) {
          for (size_t i = 0; i < b.size(); ++i) {
            SetElement(dtype, b.data(), i, Value(device, offset + i, salt));
          }
        };
        // Issue everything, then wait: several collectives in flight.
        Buffer in(dtype, count);
        fill(in, me, 0);
        const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};
        std::vector<Buffer> reduced(3, Buffer(dtype, count));
        std::vector<CollectiveHandle> handles;
        for (int o = 0; o < 3; ++o) {
          handles.push_back(coll.AllReduce(axes, in.bytes.data(),
                                           reduced[o].data(), count, dtype,
                                           ops[o], "sweep"));
        }
        Buffer in_place(dtype, count);
        fill(in_place, me, 0);
        handles.push_back(coll.AllReduce(axes, in_place.data(), in_place.data(),
                                         count, dtype, ReduceOp::kSum));
        const comm::Segment mine = PartitionSegment(count, p, r);
        Buffer scattered(dtype, mine.count);
        handles.push_back(coll.ReduceScatter(axes, in.bytes.data(),
                                             scattered.data(), count, dtype,
                                             ReduceOp::kSum));
        Buffer gather_in(dtype, mine.count), gathered(dtype, count);
        fill(gather_in, me, mine.offset);
        handles.push_back(coll.AllGather(axes, gather_in.data(),
                                         gathered.data(), count, dtype));
        Buffer exchanged(dtype, static_cast<size_t>(p) * mine.count);
        handles.push_back(coll.AllToAll(axes, in.bytes.data(), exchanged.data(),
                                        count, dtype));
        const int root = salt % p;
        Buffer broadcast(dtype, count);
        fill(broadcast, me, 0);
        handles.push_back(
            coll.Broadcast(axes, root, broadcast.data(), count, dtype));
        handles.push_back(coll.Barrier(axes));
        for (CollectiveHandle& h : handles) {
          Status s = h.Wait();
          if (!s.ok()) {
            std::fprintf(stderr, "FAILED %s: %s\n", tag.c_str(),
                         s.message().c_str());
            return 1 << 20;
          }
        }
        auto over_group = [&](ReduceOp op, size_t i) {
          float acc = Value(group[0], i, salt);
          for (int s = 1; s < p; ++s)
            acc = Combine(op, acc, Value(group[s], i, salt));
          return acc;
        };
        for (int o = 0; o < 3; ++o) {
          wrong += Compare(
              "all_reduce " + std::string(comm::Name(ops[o])) + " " + tag,
              reduced[o], [&](size_t i) { return over_group(ops[o], i); });
        }
        wrong += Compare("all_reduce in-place " + tag, in_place, [&](size_t i) {
          return over_group(ReduceOp::kSum, i);
        });
        wrong += Compare("reduce_scatter " + tag, scattered, [&](size_t i) {
          return over_group(ReduceOp::kSum, mine.offset + i);
        });
        wrong += Compare("all_gather " + tag, gathered, [&](size_t i) {
          for (int s = 0; s < p; ++s) {
            comm::Segment c = PartitionSegment(count, p, s);
            if (i >= c.offset && i < c.offset + c.count) {
              return Value(group[s], i, salt);
            }
          }
          return -100.0f;
        });
        wrong += Compare("all_to_all " + tag, exchanged, [&](size_t i) {
          return Value(group[i / mine.count], mine.offset + i % mine.count,
                       salt);
        });
        wrong += Compare("broadcast " + tag, broadcast,
                         [&](size_t i) { return Value(group[root], i, salt); });
        *checked += 8;
      }
    }
  }
  return wrong;
}

// Send/Recv over each axis set, in the two patterns a pipeline uses: a
// chain (rank r receives from r - 1, then sends to r + 1, all started before
// any wait) and a neighbour exchange (even ranks send to r + 1 and receive
// from it, odd ranks the other way round), f32 and bf16, odd sizes; each
// received buffer equals what the reference group's sender filled in. A peer
// that is not another rank is refused.
int CheckPointToPoint(Runtime& rt, int local, size_t large) {
  DeviceCollectives& coll = rt.collectives(local);
  const int me = rt.local_devices()[local];
  int wrong = 0, salt = 500;
  for (const std::vector<std::string>& axes :
       std::vector<std::vector<std::string>>{{"data"},
                                             {"stage"},
                                             {"fsdp"},
                                             {"tensor"},
                                             {"data", "fsdp", "tensor"}}) {
    const std::vector<int> group = ReferenceGroup(rt.mesh(), axes, me);
    const int p = static_cast<int>(group.size());
    const int r = static_cast<int>(std::find(group.begin(), group.end(), me) -
                                   group.begin());
    if (coll.Send(axes, r, nullptr, 0, DType::kF32).Wait().code() !=
        StatusCode::kInvalidArgument) {
      ++wrong;
    }
    if (p == 1) continue;
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (size_t count : {size_t{1}, size_t{7}, large}) {
        ++salt;
        auto fill = [&](Buffer& b, int device) {
          for (size_t i = 0; i < b.size(); ++i) {
            SetElement(dtype, b.data(), i, Value(device, i, salt));
          }
        };
        auto check = [&](const Buffer& got, int from, const char* what) {
          wrong +=
              Compare(std::string(what) + " " + std::string(comm::Name(dtype)),
                      got, [&](size_t i) { return Value(from, i, salt); });
        };
        // The chain.
        Buffer mine(dtype, count), in(dtype, count);
        fill(mine, me);
        CollectiveHandle got, sent;
        if (r > 0) got = coll.Recv(axes, r - 1, in.data(), count, dtype);
        if (r + 1 < p) sent = coll.Send(axes, r + 1, mine.data(), count, dtype);
        // Peers on two hosts at different positions on them are refused
        // (on both sides alike); every other pair must meet.
        const Status got_status = got.Wait(), sent_status = sent.Wait();
        auto refused = [](const Status& s) {
          return s.code() == StatusCode::kFailedPrecondition;
        };
        if (!got_status.ok() && !refused(got_status)) return wrong + 1;
        if (!sent_status.ok() && !refused(sent_status)) return wrong + 1;
        if (r > 0 && got_status.ok()) check(in, group[r - 1], "chain");
        // The neighbour exchange.
        const int peer = r % 2 == 0 ? r + 1 : r - 1;
        if (peer >= p) continue;
        Buffer back(dtype, count);
        CollectiveHandle first, second;
        if (r % 2 == 0) {
          first = coll.Send(axes, peer, mine.data(), count, dtype);
          second = coll.Recv(axes, peer, back.data(), count, dtype);
        } else {
          first = coll.Recv(axes, peer, back.data(), count, dtype);
          second = coll.Send(axes, peer, mine.data(), count, dtype);
        }
        const Status first_status = first.Wait(), second_status = second.Wait();
        if (refused(first_status) && refused(second_status)) continue;
        if (!first_status.ok() || !second_status.ok()) return wrong + 1;
        check(back, group[peer], "exchange");
      }
    }
  }
  if (wrong) std::fprintf(stderr, "send/recv: %d wrong\n", wrong);
  return wrong;
}

// A reduce-scatter over fsdp followed, without waiting, by an all-reduce
// over data of its output (`after`): the result is the sum over both axes.
int CheckChainedCollectives(Runtime& rt, int local) {
  DeviceCollectives& coll = rt.collectives(local);
  const int me = rt.local_devices()[local];
  const std::vector<int> fsdp = ReferenceGroup(rt.mesh(), {"fsdp"}, me);
  const std::vector<int> data = ReferenceGroup(rt.mesh(), {"data"}, me);
  const int p = static_cast<int>(fsdp.size());
  const int r =
      static_cast<int>(std::find(fsdp.begin(), fsdp.end(), me) - fsdp.begin());
  const size_t count = 100003;
  const comm::Segment mine = PartitionSegment(count, p, r);
  std::vector<float> in(count), shard(mine.count);
  for (size_t i = 0; i < count; ++i) in[i] = Value(me, i, 99);
  CollectiveHandle scattered =
      coll.ReduceScatter({"fsdp"}, in.data(), shard.data(), count, DType::kF32,
                         ReduceOp::kSum, "chain");
  CollectiveHandle reduced =
      coll.AllReduce({"data"}, shard.data(), shard.data(), mine.count,
                     DType::kF32, ReduceOp::kSum, "chain", scattered);
  if (!reduced.Wait().ok() || !scattered.Wait().ok()) return 1;
  int wrong = 0;
  for (size_t i = 0; i < mine.count; ++i) {
    float want = 0;
    // Sum over the data group of each member's own fsdp group.
    for (int d : data) {
      for (int f : ReferenceGroup(rt.mesh(), {"fsdp"}, d)) {
        want += Value(f, mine.offset + i, 99);
      }
    }
    wrong += shard[i] != want;
  }
  if (wrong) std::fprintf(stderr, "chained collectives: %d wrong\n", wrong);
  return wrong;
}

// The bytes per device of one collective on each level against the
// formula (docs/runtime.md, "Bytes per level"): with m slices, h hosts per
// slice and k_l group members per host (k = h k_l per slice), an all-reduce
// of S bytes sends 2(m-1)/(m k) S over DCN and 2(h-1)/(h k_l) S between the
// slice's hosts; a reduce-scatter of S bytes (and an all-gather whose output
// is S bytes) half of each.
int CheckBytesPerLevel(Runtime& rt, int local, const char* op) {
  DeviceCollectives& coll = rt.collectives(local);
  const Axes axes = {"data", "fsdp"};
  const AxisGroup& g = **coll.Group(axes);
  if (g.size == 1) return 0;
  const size_t count = (1 << 20) + 13;
  std::vector<float> in(count, 1.0f), out(count, 0.0f);
  const uint64_t dcn0 = coll.counters().dcn_bytes_sent;
  const uint64_t net0 = coll.counters().slice_net_bytes_sent;
  const comm::Segment mine = PartitionSegment(count, g.size, g.rank);
  Status s;
  const std::string name = op;
  if (name == "all_reduce") {
    s = coll.AllReduce(axes, in.data(), out.data(), count, DType::kF32,
                       ReduceOp::kSum)
            .Wait();
  } else if (name == "reduce_scatter") {
    s = coll.ReduceScatter(axes, in.data(), out.data(), count, DType::kF32,
                           ReduceOp::kSum)
            .Wait();
  } else {
    s = coll.AllGather(axes, in.data() + mine.offset, out.data(), count,
                       DType::kF32)
            .Wait();
  }
  if (!s.ok()) return 1;
  const double m = g.dcn_size, h = g.host_size, kl = g.local_size;
  const double k = h * kl, bytes = count * 4.0;
  const double factor = name == "all_reduce" ? 2 : 1;
  const double want_dcn = factor * (m - 1) / (m * k) * bytes;
  const double want_net = factor * (h - 1) / (h * kl) * bytes;
  const double got_dcn = coll.counters().dcn_bytes_sent - dcn0;
  const double got_net = coll.counters().slice_net_bytes_sent - net0;
  // Balanced splits of an odd count differ from S/k by under one element
  // per chunk.
  auto near = [&](double got, double want) {
    return std::abs(got - want) <= 16.0 * g.size + 0.001 * want;
  };
  if (rt.process_index() == 0 && local == 0) {
    std::printf(
        "%s of %zu floats over data,fsdp (m=%d h=%d k_l=%d): %.0f DCN "
        "bytes per device (formula %.0f), %.0f between the slice's "
        "hosts (formula %.0f)\n",
        op, count, g.dcn_size, g.host_size, g.local_size, got_dcn, want_dcn,
        got_net, want_net);
  }
  if (!near(got_dcn, want_dcn) || !near(got_net, want_net)) {
    std::fprintf(stderr,
                 "%s over data,fsdp (m=%d h=%d k_l=%d): %.0f DCN bytes "
                 "(formula %.0f), %.0f slice-network bytes (formula %.0f)\n",
                 op, g.dcn_size, g.host_size, g.local_size, got_dcn, want_dcn,
                 got_net, want_net);
    return 1;
  }
  return 0;
}

int WorkerMain(int argc, char** argv) {
  // argv: self --worker ici(4) dcn(4) [large count of the sweep], the
  // values in axis order (testing::ParallelismArgs).
  constexpr int kArgs = 2 + 2 * mesh::kNumAxes;
  if (argc != kArgs && argc != kArgs + 1) return 2;
  const size_t large = argc == kArgs + 1 ? std::atol(argv[kArgs]) : 1000003;
  auto env = ReadWorkerEnv(ProcessEnvironment());
  if (!env.ok() || !env->has_value()) {
    std::fprintf(stderr, "worker environment missing\n");
    return 2;
  }
  RuntimeOptions options;
  options.env = **env;
  options.parallelism = testing::ParallelismFromArgs(argv + 2);
  options.timeout = std::chrono::seconds(60);
  auto rt = Runtime::Create(options);
  if (!rt.ok()) {
    std::fprintf(stderr, "runtime: %s\n", rt.status().message().c_str());
    return 1;
  }
  std::vector<int> wrong(rt.value()->local_devices().size());
  std::vector<int> checked(wrong.size());
  Status s = (*rt)->RunOnDevices([&](int local) {
    // Device threads flush subnormals (common/float_env.h).
    volatile float tiny = 1e-39f;
    const int flushes = ThisThreadFlushesSubnormals() && tiny * 1.0f == 0.0f;
    if (!flushes) std::fprintf(stderr, "device %d keeps subnormals\n", local);
    wrong[local] = SweepOnDevice(**rt, local, large, &checked[local]) +
                   CheckChainedCollectives(**rt, local) +
                   CheckPointToPoint(**rt, local, large) +
                   CheckBytesPerLevel(**rt, local, "all_reduce") +
                   CheckBytesPerLevel(**rt, local, "reduce_scatter") +
                   CheckBytesPerLevel(**rt, local, "all_gather") +
                   (flushes ? 0 : 1);
    return OkStatus();
  });
  int total_wrong = 0, total_checked = 0;
  for (size_t i = 0; i < wrong.size(); ++i) {
    total_wrong += wrong[i];
    total_checked += checked[i];
  }
  std::printf("checked %d collectives on %zu devices: %d wrong values\n",
              total_checked, wrong.size(), total_wrong);
  return s.ok() && total_wrong == 0 ? 0 : 1;
}

struct MeshCase {
  int slices, devices;
  testing::AxisValues ici, dcn;
};

class CollectivesTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(CollectivesTest, EveryOpPathDtypeAndReductionMatchesTheReference) {
  const MeshCase& c = GetParam();
  std::vector<std::string> args = {"--worker"};
  for (const std::string& v : testing::ParallelismArgs(c.ici, c.dcn)) {
    args.push_back(v);
  }
  LaunchResult result = testing::RunSelfAsWorkers(c.slices, c.devices, args);
  EXPECT_EQ(result.exit_code, 0) << "failed worker " << result.failed_worker;
}

// Slices of several hosts (a TPU type run on CPU devices: each host a worker
// process of chips-per-host devices): axes inside a host, across the hosts
// of a slice, across slices, and all three at once.
struct MultiHostCase {
  std::string type;
  int slices;
  testing::AxisValues ici, dcn;
};

class MultiHostCollectivesTest
    : public ::testing::TestWithParam<MultiHostCase> {};

TEST_P(MultiHostCollectivesTest, EveryOpMatchesTheReferenceAcrossHosts) {
  const MultiHostCase& c = GetParam();
  std::vector<std::string> args = {"--worker"};
  for (const std::string& v : testing::ParallelismArgs(c.ici, c.dcn)) {
    args.push_back(v);
  }
  args.push_back("65537");  // up to 32 devices: a smaller large size
  LaunchResult result = testing::RunSelfAsWorkersOf(c.type, c.slices, args);
  EXPECT_EQ(result.exit_code, 0) << "failed worker " << result.failed_worker;
}

// v4-16: 2 hosts of 4 devices; v5litepod-16: 4 hosts of 4. ici and dcn:
// diloco, data, stage, fsdp, tensor.
INSTANTIATE_TEST_SUITE_P(
    Slices, MultiHostCollectivesTest,
    ::testing::Values(
        MultiHostCase{"v4-16", 1, {1, 1, 1, 8, 1}, {1, 1, 1, 1, 1}},
        MultiHostCase{"v4-16", 1, {1, 2, 1, 4, 1}, {1, 1, 1, 1, 1}},
        MultiHostCase{"v4-16", 1, {1, 1, 1, 4, 2}, {1, 1, 1, 1, 1}},
        MultiHostCase{"v4-16", 2, {1, 1, 1, 8, 1}, {1, 2, 1, 1, 1}},
        MultiHostCase{"v4-16", 2, {1, 2, 1, 2, 2}, {1, 1, 1, 2, 1}},
        MultiHostCase{"v4-16", 3, {1, 4, 1, 2, 1}, {1, 3, 1, 1, 1}},
        MultiHostCase{"v5litepod-16", 1, {1, 1, 1, 4, 4}, {1, 1, 1, 1, 1}},
        MultiHostCase{"v5litepod-16", 2, {1, 1, 1, 16, 1}, {1, 2, 1, 1, 1}},
        // Two stages, one per host of the slice, fsdp inside each host.
        MultiHostCase{"v4-16", 1, {1, 1, 2, 4, 1}, {1, 1, 1, 1, 1}}),
    [](const ::testing::TestParamInfo<MultiHostCase>& info) {
      const MultiHostCase& c = info.param;
      std::string type = c.type;
      std::replace(type.begin(), type.end(), '-', '_');
      return type + "x" + std::to_string(c.slices) + "_ici" +
             testing::AxisDigits(c.ici) + "_dcn" + testing::AxisDigits(c.dcn);
    });

// The same job meeting in a Redis store instead of a directory, as workers
// on several machines would.
TEST(CollectivesRedisTest, TwoSlicesMeetThroughRedis) {
  dcn::testing::RedisServer redis;
  ASSERT_TRUE(redis.ready()) << "redis-server did not start";
  std::vector<std::string> args = {"--worker"};
  for (const std::string& v :
       testing::ParallelismArgs({1, 1, 1, 2, 1}, {1, 2, 1, 1, 1})) {
    args.push_back(v);
  }
  LaunchResult result = testing::RunSelfAsWorkers(2, 2, args, "redis-run",
                                                  redis.address().ToString());
  EXPECT_EQ(result.exit_code, 0) << "failed worker " << result.failed_worker;
}

// slices x devices; ici and dcn: diloco, data, stage, fsdp, tensor.
INSTANTIATE_TEST_SUITE_P(
    Meshes, CollectivesTest,
    ::testing::Values(MeshCase{1, 1, {1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}},
                      MeshCase{1, 2, {1, 1, 1, 2, 1}, {1, 1, 1, 1, 1}},
                      MeshCase{2, 1, {1, 1, 1, 1, 1}, {1, 2, 1, 1, 1}},
                      MeshCase{2, 2, {1, 1, 1, 2, 1}, {1, 2, 1, 1, 1}},
                      MeshCase{2, 2, {1, 2, 1, 1, 1}, {1, 1, 1, 2, 1}},
                      MeshCase{1, 4, {1, 1, 1, 2, 2}, {1, 1, 1, 1, 1}},
                      MeshCase{2, 4, {1, 1, 1, 2, 2}, {1, 2, 1, 1, 1}},
                      MeshCase{3, 2, {1, 1, 1, 2, 1}, {1, 3, 1, 1, 1}},
                      MeshCase{4, 2, {1, 1, 1, 1, 2}, {1, 2, 1, 2, 1}},
                      // Pipeline stages across slices, with fsdp inside.
                      MeshCase{2, 2, {1, 1, 1, 2, 1}, {1, 1, 2, 1, 1}},
                      // Stages inside a slice and data across slices.
                      MeshCase{2, 2, {1, 1, 2, 1, 1}, {1, 2, 1, 1, 1}}),
    [](const ::testing::TestParamInfo<MeshCase>& info) {
      const MeshCase& c = info.param;
      return std::to_string(c.slices) + "x" + std::to_string(c.devices) +
             "_ici" + testing::AxisDigits(c.ici) + "_dcn" +
             testing::AxisDigits(c.dcn);
    });

}  // namespace
}  // namespace multislice::runtime

int main(int argc, char** argv) {
  return multislice::runtime::testing::WorkerOrTestsMain(
      argc, argv, multislice::runtime::WorkerMain);
}
