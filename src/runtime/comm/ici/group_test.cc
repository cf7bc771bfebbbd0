// Runs every ICI collective on 1-4 member threads and compares each member's
// result bit for bit with a plain loop over all members' inputs. The f32
// accumulation order is member order 0..k-1 in both, so sums are exact
// matches too. Byte counters are checked against the formulas of group.h.
#include "runtime/comm/ici/group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/bf16.h"

namespace multislice::ici {
namespace {

using comm::PartitionSegment;
using comm::Segment;
using comm::SizeOf;
using Bytes = std::vector<char>;
using namespace std::chrono_literals;

constexpr auto kTestTimeout = 60s;

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// `count` random elements over several binades (so sums round), as bytes.
Bytes RandomArray(DType dtype, size_t count, uint64_t seed) {
  Bytes bytes(count * SizeOf(dtype));
  uint64_t state = seed * 1000003 + 11;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t x = SplitMix(state);
    const float v = std::ldexp(
        static_cast<float>(static_cast<int32_t>(x & 0xffffff) - 0x800000) /
            0x800000,
        static_cast<int>((x >> 32) % 16) - 8);
    if (dtype == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t b = bf16::FromFloat(v);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
  }
  return bytes;
}

float Load(DType dtype, const Bytes& a, size_t i) {
  if (dtype == DType::kF32) {
    float v;
    std::memcpy(&v, a.data() + 4 * i, 4);
    return v;
  }
  uint16_t b;
  std::memcpy(&b, a.data() + 2 * i, 2);
  return bf16::ToFloat(b);
}

void Store(DType dtype, Bytes& a, size_t i, float v) {
  if (dtype == DType::kF32) {
    std::memcpy(a.data() + 4 * i, &v, 4);
  } else {
    const uint16_t b = bf16::FromFloat(v);
    std::memcpy(a.data() + 2 * i, &b, 2);
  }
}

// op over ins[0..k)[i] in member order, in f32, rounded once.
Bytes ReferenceReduce(DType dtype, ReduceOp op, const std::vector<Bytes>& ins,
                      size_t count) {
  if (ins.size() == 1) return ins[0];
  Bytes out(count * SizeOf(dtype));
  for (size_t i = 0; i < count; ++i) {
    float acc = Load(dtype, ins[0], i);
    for (size_t q = 1; q < ins.size(); ++q) {
      const float x = Load(dtype, ins[q], i);
      switch (op) {
        case ReduceOp::kSum:
          acc = acc + x;
          break;
        case ReduceOp::kMax:
          acc = acc > x ? acc : x;
          break;
        case ReduceOp::kMin:
          acc = acc < x ? acc : x;
          break;
      }
    }
    Store(dtype, out, i, acc);
  }
  return out;
}

// The elements of `full` at `segments`, packed in order.
Bytes Pack(const Bytes& full, const std::vector<Segment>& segments, size_t es) {
  Bytes out;
  for (const Segment& s : segments) {
    out.insert(out.end(), full.begin() + s.offset * es,
               full.begin() + (s.offset + s.count) * es);
  }
  return out;
}

// Runs fn(rank) on k threads at once and returns their statuses.
std::vector<Status> RunMembers(int k, const std::function<Status(int)>& fn) {
  std::vector<Status> statuses(k);
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] { statuses[r] = fn(r); });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

void ExpectAllOk(const std::vector<Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok())
        << "member " << r << ": " << statuses[r].message();
  }
}

// Index of the first differing element, or -1 (so a failure is readable).
long FirstMismatch(const Bytes& got, const Bytes& want, size_t es) {
  if (got == want) return -1;
  if (got.size() != want.size()) return -2;
  for (size_t i = 0; i * es < got.size(); ++i) {
    if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0) {
      return static_cast<long>(i);
    }
  }
  return -1;
}

// How the tests split an array between k members.
enum class LayoutKind {
  kBalanced,  // PartitionSegment: one contiguous (uneven) segment each
  kStrided,   // 3k chunks; member r owns chunks r, r + k, r + 2k
  kReversed,  // as kStrided, packed in the order r + 2k, r, r + k
};

Layout MakeLayout(LayoutKind kind, size_t count, int k) {
  if (kind == LayoutKind::kBalanced) return comm::BalancedLayout(count, k);
  Layout layout(k);
  for (int r = 0; r < k; ++r) {
    const int order[3] = {kind == LayoutKind::kStrided ? 0 : 2,
                          kind == LayoutKind::kStrided ? 1 : 0,
                          kind == LayoutKind::kStrided ? 2 : 1};
    for (int c : order) {
      layout[r].push_back(PartitionSegment(count, 3 * k, r + c * k));
    }
  }
  return layout;
}

const char* LayoutName(LayoutKind kind) {
  switch (kind) {
    case LayoutKind::kBalanced:
      return "balanced";
    case LayoutKind::kStrided:
      return "strided";
    case LayoutKind::kReversed:
      return "reversed";
  }
  return "?";
}

std::string DTypeName(DType d) { return d == DType::kF32 ? "f32" : "bf16"; }

const std::vector<size_t> kCounts = {1, 7, 1000, 1000003};

// ---------------------------------------------------------------- AllReduce

using ReduceParam = std::tuple<DType, ReduceOp, size_t, int>;

class AllReduceTest : public ::testing::TestWithParam<ReduceParam> {};

TEST_P(AllReduceTest, EveryMemberGetsTheReduction) {
  const auto [dtype, op, count, k] = GetParam();
  const size_t es = SizeOf(dtype);
  std::vector<Bytes> ins;
  for (int r = 0; r < k; ++r) ins.push_back(RandomArray(dtype, count, r));
  const Bytes want = ReferenceReduce(dtype, op, ins, count);

  for (bool in_place : {false, true}) {
    Group group(k, "allreduce", kTestTimeout);
    std::vector<Bytes> outs(k, Bytes(count * es, 0x5a));
    if (in_place) outs = ins;
    std::vector<uint64_t> sent(k, 0);
    ExpectAllOk(RunMembers(k, [&](int r) {
      const void* in = in_place ? outs[r].data() : ins[r].data();
      return group.AllReduce(r, in, outs[r].data(), count, dtype, op, &sent[r]);
    }));
    for (int r = 0; r < k; ++r) {
      EXPECT_EQ(FirstMismatch(outs[r], want, es), -1)
          << "member " << r << (in_place ? " in place" : "");
      const size_t share = PartitionSegment(count, k, r).count;
      const size_t expected =
          k == 1 ? 0 : (count - share + (k - 1) * share) * es;
      EXPECT_EQ(sent[r], expected) << "member " << r;
    }
  }
}

std::string ReduceParamName(const ::testing::TestParamInfo<ReduceParam>& i) {
  const auto [dtype, op, count, k] = i.param;
  return DTypeName(dtype) + "_" + std::string(comm::Name(op)) + "_count" +
         std::to_string(count) + "_k" + std::to_string(k);
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, AllReduceTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                       ::testing::Values(ReduceOp::kSum, ReduceOp::kMax,
                                         ReduceOp::kMin),
                       ::testing::ValuesIn(kCounts),
                       ::testing::Values(1, 2, 3, 4)),
    ReduceParamName);

// The fused pass's bytes per member, summed, equal a ring's 2(k-1)/k * S
// per member when the count divides evenly.
TEST(AllReduceBytesTest, BalancedCountMatchesRing) {
  const int k = 4;
  const size_t count = 4096;
  Group group(k, "ring", kTestTimeout);
  std::vector<Bytes> bufs(k, Bytes(count * 4, 0));
  std::vector<uint64_t> sent(k, 0);
  ExpectAllOk(RunMembers(k, [&](int r) {
    return group.AllReduce(r, bufs[r].data(), bufs[r].data(), count,
                           DType::kF32, ReduceOp::kSum, &sent[r]);
  }));
  for (int r = 0; r < k; ++r) EXPECT_EQ(sent[r], 2 * (k - 1) * count * 4 / k);
}

// ------------------------------------------------------------ ReduceScatter

using LayoutReduceParam = std::tuple<DType, ReduceOp, size_t, int, LayoutKind>;

class ReduceScatterTest : public ::testing::TestWithParam<LayoutReduceParam> {};

TEST_P(ReduceScatterTest, EachMemberGetsItsSegmentsReduced) {
  const auto [dtype, op, count, k, kind] = GetParam();
  const size_t es = SizeOf(dtype);
  const Layout layout = MakeLayout(kind, count, k);
  std::vector<Bytes> ins;
  for (int r = 0; r < k; ++r) ins.push_back(RandomArray(dtype, count, 10 + r));
  const Bytes full = ReferenceReduce(dtype, op, ins, count);

  Group group(k, "reducescatter", kTestTimeout);
  std::vector<Bytes> outs(k);
  for (int r = 0; r < k; ++r) outs[r].assign(OwnedCount(layout, r) * es, 1);
  std::vector<uint64_t> sent(k, 0);
  ExpectAllOk(RunMembers(k, [&](int r) {
    return group.ReduceScatter(r, ins[r].data(), outs[r].data(), layout, dtype,
                               op, &sent[r]);
  }));
  for (int r = 0; r < k; ++r) {
    EXPECT_EQ(FirstMismatch(outs[r], Pack(full, layout[r], es), es), -1)
        << "member " << r;
    const size_t expected = k == 1 ? 0 : (count - OwnedCount(layout, r)) * es;
    EXPECT_EQ(sent[r], expected) << "member " << r;
  }

  if (kind != LayoutKind::kBalanced) return;
  // out pointing into in at the member's own segment.
  std::vector<Bytes> bufs = ins;
  ExpectAllOk(RunMembers(k, [&](int r) {
    char* own = bufs[r].data() + layout[r][0].offset * es;
    return group.ReduceScatter(r, bufs[r].data(), own, layout, dtype, op,
                               nullptr);
  }));
  for (int r = 0; r < k; ++r) {
    const Segment s = layout[r][0];
    const Bytes got(bufs[r].begin() + s.offset * es,
                    bufs[r].begin() + (s.offset + s.count) * es);
    EXPECT_EQ(FirstMismatch(got, Pack(full, layout[r], es), es), -1)
        << "member " << r << " in place";
  }
}

std::string LayoutReduceParamName(
    const ::testing::TestParamInfo<LayoutReduceParam>& i) {
  const auto [dtype, op, count, k, kind] = i.param;
  return DTypeName(dtype) + "_" + std::string(comm::Name(op)) + "_count" +
         std::to_string(count) + "_k" + std::to_string(k) + "_" +
         LayoutName(kind);
}

const auto kLayoutKinds = ::testing::Values(
    LayoutKind::kBalanced, LayoutKind::kStrided, LayoutKind::kReversed);

INSTANTIATE_TEST_SUITE_P(
    AllCases, ReduceScatterTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                       ::testing::Values(ReduceOp::kSum, ReduceOp::kMax,
                                         ReduceOp::kMin),
                       ::testing::ValuesIn(kCounts),
                       ::testing::Values(1, 2, 3, 4), kLayoutKinds),
    LayoutReduceParamName);

// -------------------------------------------- AllGather, Scatter, AllToAll

using LayoutParam = std::tuple<DType, size_t, int, LayoutKind>;

std::string LayoutParamName(const ::testing::TestParamInfo<LayoutParam>& i) {
  const auto [dtype, count, k, kind] = i.param;
  return DTypeName(dtype) + "_count" + std::to_string(count) + "_k" +
         std::to_string(k) + "_" + LayoutName(kind);
}

class AllGatherTest : public ::testing::TestWithParam<LayoutParam> {};

TEST_P(AllGatherTest, EveryMemberGetsEverySegment) {
  const auto [dtype, count, k, kind] = GetParam();
  const size_t es = SizeOf(dtype);
  const Layout layout = MakeLayout(kind, count, k);
  const Bytes full = RandomArray(dtype, count, 42);
  std::vector<Bytes> ins;
  for (int r = 0; r < k; ++r) ins.push_back(Pack(full, layout[r], es));

  Group group(k, "allgather", kTestTimeout);
  std::vector<Bytes> outs(k, Bytes(count * es, 0x33));
  std::vector<uint64_t> sent(k, 0);
  ExpectAllOk(RunMembers(k, [&](int r) {
    return group.AllGather(r, ins[r].data(), outs[r].data(), layout, dtype,
                           &sent[r]);
  }));
  for (int r = 0; r < k; ++r) {
    EXPECT_EQ(FirstMismatch(outs[r], full, es), -1) << "member " << r;
    EXPECT_EQ(sent[r], (k - 1) * OwnedCount(layout, r) * es) << "member " << r;
  }

  if (kind != LayoutKind::kBalanced) return;
  // in pointing into out at the member's own segment.
  std::vector<Bytes> bufs(k, Bytes(count * es, 0x44));
  for (int r = 0; r < k; ++r) {
    std::memcpy(bufs[r].data() + layout[r][0].offset * es, ins[r].data(),
                ins[r].size());
  }
  ExpectAllOk(RunMembers(k, [&](int r) {
    const char* own = bufs[r].data() + layout[r][0].offset * es;
    return group.AllGather(r, own, bufs[r].data(), layout, dtype, nullptr);
  }));
  for (int r = 0; r < k; ++r) {
    EXPECT_EQ(FirstMismatch(bufs[r], full, es), -1)
        << "member " << r << " in place";
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, AllGatherTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                       ::testing::ValuesIn(kCounts),
                       ::testing::Values(1, 2, 3, 4), kLayoutKinds),
    LayoutParamName);

class ScatterTest : public ::testing::TestWithParam<LayoutParam> {};

TEST_P(ScatterTest, EachMemberGetsItsSegmentsFromEveryRoot) {
  const auto [dtype, count, k, kind] = GetParam();
  const size_t es = SizeOf(dtype);
  const Layout layout = MakeLayout(kind, count, k);
  const Bytes full = RandomArray(dtype, count, 7);
  Group group(k, "scatter", kTestTimeout);
  for (int root = 0; root < k; ++root) {
    std::vector<Bytes> outs(k);
    for (int r = 0; r < k; ++r) outs[r].assign(OwnedCount(layout, r) * es, 9);
    std::vector<uint64_t> sent(k, 0);
    ExpectAllOk(RunMembers(k, [&](int r) {
      return group.Scatter(r, root, r == root ? full.data() : nullptr,
                           outs[r].data(), layout, dtype, &sent[r]);
    }));
    for (int r = 0; r < k; ++r) {
      EXPECT_EQ(FirstMismatch(outs[r], Pack(full, layout[r], es), es), -1)
          << "member " << r << " root " << root;
      const size_t expected =
          r == root && k > 1 ? (count - OwnedCount(layout, r)) * es : 0;
      EXPECT_EQ(sent[r], expected) << "member " << r << " root " << root;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, ScatterTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                       ::testing::ValuesIn(kCounts),
                       ::testing::Values(1, 2, 3, 4), kLayoutKinds),
    LayoutParamName);

// ---------------------------------------------------- Broadcast, AllToAll

using PlainParam = std::tuple<DType, size_t, int>;

std::string PlainParamName(const ::testing::TestParamInfo<PlainParam>& i) {
  const auto [dtype, count, k] = i.param;
  return DTypeName(dtype) + "_count" + std::to_string(count) + "_k" +
         std::to_string(k);
}

class BroadcastTest : public ::testing::TestWithParam<PlainParam> {};

TEST_P(BroadcastTest, EveryMemberGetsTheRootsBufferFromEveryRoot) {
  const auto [dtype, count, k] = GetParam();
  const size_t es = SizeOf(dtype);
  Group group(k, "broadcast", kTestTimeout);
  for (int root = 0; root < k; ++root) {
    std::vector<Bytes> bufs;
    for (int r = 0; r < k; ++r) {
      bufs.push_back(RandomArray(dtype, count, 100 * root + r));
    }
    const Bytes want = bufs[root];
    std::vector<uint64_t> sent(k, 0);
    ExpectAllOk(RunMembers(k, [&](int r) {
      return group.Broadcast(r, root, bufs[r].data(), count, dtype, &sent[r]);
    }));
    for (int r = 0; r < k; ++r) {
      EXPECT_EQ(FirstMismatch(bufs[r], want, es), -1)
          << "member " << r << " root " << root;
      size_t expected = 0;
      if (k > 1 && r == root) {
        expected = count * es;
      } else if (k > 1) {
        const int index = r < root ? r : r - 1;
        expected = (k - 2) * PartitionSegment(count, k - 1, index).count * es;
      }
      EXPECT_EQ(sent[r], expected) << "member " << r << " root " << root;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, BroadcastTest,
                         ::testing::Combine(::testing::Values(DType::kF32,
                                                              DType::kBF16),
                                            ::testing::ValuesIn(kCounts),
                                            ::testing::Values(1, 2, 3, 4)),
                         PlainParamName);

class AllToAllTest : public ::testing::TestWithParam<PlainParam> {};

// Member i sends c(i, j) elements to member j, with c uneven per pair (some
// zero). Senders pack their blocks in destination order; receivers pack
// theirs in reverse source order, so offsets differ on both sides.
TEST_P(AllToAllTest, UnevenPerPairCounts) {
  const auto [dtype, count, k] = GetParam();
  const size_t es = SizeOf(dtype);
  auto pair_count = [&](int i, int j) -> size_t {
    const size_t base = count / k;
    return (i + 2 * j) % 3 == 0 ? base / 2 : base + (i + j) % 3;
  };
  Layout send(k, std::vector<Segment>(k)), recv(k, std::vector<Segment>(k));
  std::vector<size_t> in_size(k, 0), out_size(k, 0);
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < k; ++j) {
      send[i][j] = {in_size[i], pair_count(i, j)};
      in_size[i] += pair_count(i, j);
    }
  }
  for (int j = 0; j < k; ++j) {
    for (int i = k - 1; i >= 0; --i) {
      recv[j][i] = {out_size[j], pair_count(i, j)};
      out_size[j] += pair_count(i, j);
    }
  }
  std::vector<Bytes> ins, outs;
  for (int r = 0; r < k; ++r) {
    ins.push_back(RandomArray(dtype, in_size[r], 50 + r));
    outs.emplace_back(out_size[r] * es, 0x77);
  }
  Group group(k, "alltoall", kTestTimeout);
  std::vector<uint64_t> sent(k, 0);
  ExpectAllOk(RunMembers(k, [&](int r) {
    return group.AllToAll(r, ins[r].data(), outs[r].data(), send, recv, dtype,
                          &sent[r]);
  }));
  for (int j = 0; j < k; ++j) {
    Bytes want(out_size[j] * es);
    for (int i = 0; i < k; ++i) {
      std::memcpy(want.data() + recv[j][i].offset * es,
                  ins[i].data() + send[i][j].offset * es,
                  send[i][j].count * es);
    }
    EXPECT_EQ(FirstMismatch(outs[j], want, es), -1) << "member " << j;
    size_t expected = 0;
    for (int other = 0; other < k; ++other) {
      if (other != j) expected += pair_count(j, other) * es;
    }
    EXPECT_EQ(sent[j], expected) << "member " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, AllToAllTest,
                         ::testing::Combine(::testing::Values(DType::kF32,
                                                              DType::kBF16),
                                            ::testing::ValuesIn(kCounts),
                                            ::testing::Values(1, 2, 3, 4)),
                         PlainParamName);

TEST(AllToAllValidationTest, MismatchedCountsAreInvalid) {
  Group group(2, "a2a", kTestTimeout);
  Layout send = {{{0, 1}, {1, 2}}, {{0, 1}, {1, 1}}};
  Layout recv = {{{0, 1}, {1, 1}}, {{0, 1}, {1, 1}}};  // recv[1][0] != 2
  float in[4] = {}, out[4] = {};
  const Status s = group.AllToAll(0, in, out, send, recv, DType::kF32, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("send[0][1]"), std::string::npos) << s.message();
}

// ------------------------------------------------ sequencing and failures

// Back-to-back operations of different kinds on fresh buffers: a fast member
// must never run into the next operation while a slow one is in the last.
TEST(GroupSequenceTest, ManyConsecutiveMixedOperations) {
  const int k = 4;
  const size_t count = 37;
  Group group(k, "sequence", kTestTimeout);
  std::vector<std::vector<float>> results(k);
  ExpectAllOk(RunMembers(k, [&](int r) -> Status {
    for (int iter = 0; iter < 300; ++iter) {
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = iter * 100 + r + i;
      RETURN_IF_ERROR(group.AllReduce(r, buf.data(), buf.data(), count,
                                      DType::kF32, ReduceOp::kSum, nullptr));
      for (size_t i = 0; i < count; ++i) {
        const float want = 4 * (iter * 100.0f + i) + 6;
        if (buf[i] != want) {
          return Internal("iteration " + std::to_string(iter) + " element " +
                          std::to_string(i) + ": " + std::to_string(buf[i]));
        }
      }
      const int root = iter % k;
      std::vector<float> b(count, static_cast<float>(r * 1000 + iter));
      RETURN_IF_ERROR(
          group.Broadcast(r, root, b.data(), count, DType::kF32, nullptr));
      if (b[count - 1] != root * 1000 + iter) {
        return Internal("broadcast " + std::to_string(iter));
      }
      RETURN_IF_ERROR(group.Barrier(r));
    }
    return OkStatus();
  }));
}

TEST(GroupFailureTest, BarrierTimesOutNamingTheMissingMember) {
  Group group(2, "lonely", 200ms);
  const auto start = std::chrono::steady_clock::now();
  const Status s = group.Barrier(0);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(),
            "ici group lonely: timed out after 0.2 s waiting for member(s) 1 "
            "in barrier");
  EXPECT_GE(elapsed, 200ms);
  EXPECT_LT(elapsed, 20s);  // not a timing assertion: only "it did return"
  // The group is unusable afterwards, for every member.
  EXPECT_EQ(group.Barrier(1).code(), StatusCode::kFailedPrecondition);
  float x = 0;
  EXPECT_EQ(group.AllReduce(0, &x, &x, 1, DType::kF32, ReduceOp::kSum, nullptr)
                .code(),
            StatusCode::kFailedPrecondition);
}

TEST(GroupFailureTest, OtherWaitersGiveUpToo) {
  Group group(3, "partial", 200ms);
  float bufs[3] = {};
  const std::vector<Status> statuses = RunMembers(2, [&](int r) {
    return group.AllReduce(r, &bufs[r], &bufs[r], 1, DType::kF32,
                           ReduceOp::kSum, nullptr);
  });
  int timed_out = 0;
  for (const Status& s : statuses) {
    if (s.code() == StatusCode::kDeadlineExceeded) {
      ++timed_out;
      EXPECT_NE(s.message().find("waiting for member(s) 2 in allreduce:enter"),
                std::string::npos)
          << s.message();
    } else {
      EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
    }
  }
  EXPECT_GE(timed_out, 1);
}

TEST(GroupFailureTest, MismatchedOperationsAreReportedAndGroupStaysUsable) {
  Group group(2, "mixed", kTestTimeout);
  std::vector<float> bufs[2] = {std::vector<float>(20, 1.0f),
                                std::vector<float>(20, 2.0f)};
  const std::vector<Status> statuses = RunMembers(2, [&](int r) {
    return group.AllReduce(r, bufs[r].data(), bufs[r].data(), r == 0 ? 10 : 20,
                           DType::kF32, ReduceOp::kSum, nullptr);
  });
  for (const Status& s : statuses) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("allreduce of 10 float32 sum"),
              std::string::npos)
        << s.message();
  }
  EXPECT_EQ(bufs[0][0], 1.0f);  // nothing was reduced
  ExpectAllOk(RunMembers(2, [&](int r) {
    return group.AllReduce(r, bufs[r].data(), bufs[r].data(), 20, DType::kF32,
                           ReduceOp::kSum, nullptr);
  }));
  EXPECT_EQ(bufs[0][19], 3.0f);
  EXPECT_EQ(bufs[1][0], 3.0f);
}

TEST(GroupFailureTest, BadRankIsInvalid) {
  Group group(2, "ranks", kTestTimeout);
  EXPECT_EQ(group.Barrier(2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(group.Barrier(-1).code(), StatusCode::kInvalidArgument);
  float x = 0;
  EXPECT_EQ(group.Broadcast(0, 5, &x, 1, DType::kF32, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// ------------------------------------------------------------------ Domain

TEST(DomainTest, SameKeySameGroupFromManyThreads) {
  Domain domain(kTestTimeout);
  std::vector<std::shared_ptr<Group>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      got[t] = domain.GetOrCreate(t % 2 == 0 ? "axis=x/0" : "axis=y/0", 4);
    });
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(got[t], got[t % 2]);
    EXPECT_EQ(got[t]->size(), 4);
  }
  EXPECT_NE(got[0], got[1]);
  EXPECT_EQ(got[0]->name(), "axis=x/0");
}

TEST(DomainTest, GroupsFromTheDomainWork) {
  Domain domain(kTestTimeout);
  std::vector<float> bufs[3] = {{1, 2}, {3, 4}, {5, 6}};
  ExpectAllOk(RunMembers(3, [&](int r) {
    std::shared_ptr<Group> g = domain.GetOrCreate("g", 3);
    return g->AllReduce(r, bufs[r].data(), bufs[r].data(), 2, DType::kF32,
                        ReduceOp::kMax, nullptr);
  }));
  for (const auto& b : bufs) EXPECT_EQ(b, (std::vector<float>{5, 6}));
}

}  // namespace
}  // namespace multislice::ici
