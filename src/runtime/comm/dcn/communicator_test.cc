// Tests of the DCN communicator: every collective against a reference
// computed by plain loops, for 2, 3 and 4 ranks (one thread and one
// Communicator per rank), f32 and bf16, every reduction, sizes from 1 to 10^6
// elements, uneven splits, concurrent subgroups, byte counters, and the
// failures of a peer process that is killed or stopped.
//
// Data are small integers, so every sum is exact in bf16 too and results are
// compared bit for bit.
#include "runtime/comm/dcn/communicator.h"

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/bf16.h"
#include "common/temp_dir.h"
#include "runtime/comm/dcn/store.h"

namespace multislice::dcn {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kClusterTimeout(30000);
const std::vector<size_t> kSizes = {1, 7, 1000, 1000003};
const std::vector<DType> kTypes = {DType::kF32, DType::kBF16};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kMax,
                                    ReduceOp::kMin};

StoreAddress FileAddress(const std::string& dir) {
  StoreAddress a;
  a.kind = StoreAddress::Kind::kFile;
  a.path = dir;
  return a;
}

// An array of f32 or bf16 elements, read and written as floats.
class Array {
 public:
  Array(DType dtype, size_t n)
      : dtype_(dtype), bytes_(n * comm::SizeOf(dtype)) {
    for (size_t i = 0; i < n; ++i) Set(i, -1000.0f);  // Never a valid result.
  }
  template <typename Fn>
  static Array Of(DType dtype, size_t n, Fn f) {
    Array a(dtype, n);
    for (size_t i = 0; i < n; ++i) a.Set(i, f(i));
    return a;
  }
  size_t size() const { return bytes_.size() / comm::SizeOf(dtype_); }
  void* data() { return bytes_.data(); }
  float At(size_t i) const {
    if (dtype_ == DType::kF32) {
      float f;
      std::memcpy(&f, bytes_.data() + 4 * i, 4);
      return f;
    }
    uint16_t b;
    std::memcpy(&b, bytes_.data() + 2 * i, 2);
    return bf16::ToFloat(b);
  }
  void Set(size_t i, float f) {
    if (dtype_ == DType::kF32) {
      std::memcpy(bytes_.data() + 4 * i, &f, 4);
    } else {
      const uint16_t b = bf16::FromFloat(f);
      std::memcpy(bytes_.data() + 2 * i, &b, 2);
    }
  }

 private:
  DType dtype_;
  std::vector<char> bytes_;
};

// Member k's i-th input element: an integer in [-8, 8].
float Value(int k, size_t i, int salt = 0) {
  return static_cast<float>(
             static_cast<int>((i * 7 + static_cast<size_t>(k) * 13 +
                               static_cast<size_t>(salt) * 5) %
                              17)) -
         8.0f;
}

float Apply(ReduceOp op, float a, float b) {
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

// Compares `actual` with expected(i) over [0, n); reports the first mismatch.
template <typename Fn>
void ExpectArray(const Array& actual, size_t offset, size_t n, Fn expected,
                 const std::string& what) {
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < n; ++i) {
    if (actual.At(offset + i) != expected(i)) {
      if (wrong++ == 0) first = i;
    }
  }
  EXPECT_EQ(wrong, 0u) << what << ": first wrong element " << first << " is "
                       << actual.At(offset + first) << ", expected "
                       << expected(first);
}

std::string Describe(const char* op, int m, DType t, size_t n) {
  return std::string(op) + " m=" + std::to_string(m) + " " +
         std::string(comm::Name(t)) + " n=" + std::to_string(n);
}

DcnGroup Everyone(int m, int rank, uint32_t id = 0) {
  DcnGroup g;
  for (int r = 0; r < m; ++r) g.members.push_back(r);
  g.my_index = rank;
  g.id = id;
  return g;
}

// Uneven counts summing to n, some of them zero for small n.
std::vector<size_t> UnevenCounts(size_t n, int m) {
  std::vector<size_t> counts(m);
  const size_t weights = static_cast<size_t>(m) * (m + 1) / 2;
  size_t used = 0;
  for (int i = 0; i < m; ++i) {
    counts[i] = n * (i + 1) / weights;
    used += counts[i];
  }
  counts[m - 1] += n - used;
  return counts;
}

std::vector<size_t> Offsets(const std::vector<size_t>& counts) {
  std::vector<size_t> offsets(counts.size());
  size_t o = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    offsets[i] = o;
    o += counts[i];
  }
  return offsets;
}

// n communicators of one rendezvous, connected from n threads.
class LocalCluster {
 public:
  LocalCluster(int n, const std::string& dir,
               milliseconds timeout = kClusterTimeout)
      : comms_(n) {
    std::vector<Status> statuses(n);
    Run(n, [&](int r) {
      auto store = OpenStore(FileAddress(dir), "run/0", timeout);
      if (!store.ok()) {
        statuses[r] = store.status();
        return;
      }
      ConnectOptions options;
      options.rank = r;
      options.size = n;
      options.key_prefix = "dcn/col0";
      options.timeout = timeout;
      for (int k = 0; k < n; ++k) {
        options.peer_names.push_back("slice " + std::to_string(k));
      }
      auto comm = Communicator::Connect(**store, options);
      if (comm.ok()) {
        comms_[r] = std::move(*comm);
      } else {
        statuses[r] = comm.status();
      }
    });
    for (const Status& s : statuses) {
      EXPECT_TRUE(s.ok()) << s.message();
      if (!s.ok()) ok_ = false;
    }
  }

  bool ok() const { return ok_; }
  Communicator& comm(int r) { return *comms_[r]; }
  // Destroys rank r's communicator (closing its connections).
  void Close(int r) { comms_[r].reset(); }

  // Runs body(rank) on one thread per rank.
  void Run(const std::function<void(int)>& body) {
    Run(static_cast<int>(comms_.size()), body);
  }

 private:
  static void Run(int n, const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
    for (auto& t : threads) t.join();
  }

  std::vector<std::unique_ptr<Communicator>> comms_;
  bool ok_ = true;
};

class CollectiveTest : public testing::TestWithParam<int> {
 protected:
  TempDir dir_;
};

TEST_P(CollectiveTest, AllReduce) {
  const int m = GetParam();
  LocalCluster cluster(m, dir_.path());
  ASSERT_TRUE(cluster.ok());
  cluster.Run([&](int r) {
    Communicator& comm = cluster.comm(r);
    const DcnGroup g = Everyone(m, r);
    for (DType t : kTypes) {
      for (ReduceOp op : kOps) {
        for (size_t n : kSizes) {
          const std::string what = Describe("all_reduce", m, t, n) + " " +
                                   std::string(comm::Name(op));
          auto expected = [&](size_t i) {
            float acc = Value(0, i);
            for (int k = 1; k < m; ++k) acc = Apply(op, acc, Value(k, i));
            return acc;
          };
          Array in = Array::Of(t, n, [&](size_t i) { return Value(r, i); });
          Array out(t, n);
          Status s = comm.AllReduce(g, in.data(), out.data(), n, t, op,
                                    "test:all_reduce");
          ASSERT_TRUE(s.ok()) << what << ": " << s.message();
          ExpectArray(out, 0, n, expected, what);
          ExpectArray(
              in, 0, n, [&](size_t i) { return Value(r, i); },
              what + " (input untouched)");
          // In place.
          s = comm.AllReduce(g, in.data(), in.data(), n, t, op,
                             "test:all_reduce:in_place");
          ASSERT_TRUE(s.ok()) << what << ": " << s.message();
          ExpectArray(in, 0, n, expected, what + " in place");
        }
      }
    }
  });
}

TEST_P(CollectiveTest, ReduceScatterWithUnevenCounts) {
  const int m = GetParam();
  LocalCluster cluster(m, dir_.path());
  ASSERT_TRUE(cluster.ok());
  cluster.Run([&](int r) {
    Communicator& comm = cluster.comm(r);
    const DcnGroup g = Everyone(m, r);
    for (DType t : kTypes) {
      for (ReduceOp op : kOps) {
        for (size_t n : kSizes) {
          const std::string what = Describe("reduce_scatter", m, t, n) + " " +
                                   std::string(comm::Name(op));
          const std::vector<size_t> counts = UnevenCounts(n, m);
          const size_t offset = Offsets(counts)[r];
          Array in = Array::Of(t, n, [&](size_t i) { return Value(r, i); });
          Array out(t, counts[r]);
          Status s = comm.ReduceScatter(g, in.data(), out.data(), counts, t, op,
                                        "test:reduce_scatter");
          ASSERT_TRUE(s.ok()) << what << ": " << s.message();
          ExpectArray(
              out, 0, counts[r],
              [&](size_t i) {
                float acc = Value(0, offset + i);
                for (int k = 1; k < m; ++k) {
                  acc = Apply(op, acc, Value(k, offset + i));
                }
                return acc;
              },
              what);
          ExpectArray(
              in, 0, n, [&](size_t i) { return Value(r, i); },
              what + " (input untouched)");
        }
      }
    }
  });
}

TEST_P(CollectiveTest, AllGatherWithUnevenCounts) {
  const int m = GetParam();
  LocalCluster cluster(m, dir_.path());
  ASSERT_TRUE(cluster.ok());
  cluster.Run([&](int r) {
    Communicator& comm = cluster.comm(r);
    const DcnGroup g = Everyone(m, r);
    for (DType t : kTypes) {
      for (size_t n : kSizes) {
        const std::string what = Describe("all_gather", m, t, n);
        const std::vector<size_t> counts = UnevenCounts(n, m);
        const std::vector<size_t> offsets = Offsets(counts);
        Array in =
            Array::Of(t, counts[r], [&](size_t i) { return Value(r, i); });
        Array out(t, n);
        Status s = comm.AllGather(g, in.data(), out.data(), counts, t,
                                  "test:all_gather");
        ASSERT_TRUE(s.ok()) << what << ": " << s.message();
        for (int k = 0; k < m; ++k) {
          ExpectArray(
              out, offsets[k], counts[k], [&](size_t i) { return Value(k, i); },
              what + " block " + std::to_string(k));
        }
      }
    }
  });
}

TEST_P(CollectiveTest, BroadcastFromEveryRoot) {
  const int m = GetParam();
  LocalCluster cluster(m, dir_.path());
  ASSERT_TRUE(cluster.ok());
  cluster.Run([&](int r) {
    Communicator& comm = cluster.comm(r);
    const DcnGroup g = Everyone(m, r);
    for (DType t : kTypes) {
      for (size_t n : kSizes) {
        for (int root = 0; root < m; ++root) {
          const std::string what =
              Describe("broadcast", m, t, n) + " root " + std::to_string(root);
          Array buf =
              r == root
                  ? Array::Of(t, n, [&](size_t i) { return Value(root, i, 3); })
                  : Array(t, n);
          Status s =
              comm.Broadcast(g, root, buf.data(), n, t, "test:broadcast");
          ASSERT_TRUE(s.ok()) << what << ": " << s.message();
          ExpectArray(
              buf, 0, n, [&](size_t i) { return Value(root, i, 3); }, what);
        }
      }
    }
  });
}

TEST_P(CollectiveTest, AllToAllWithUnevenCounts) {
  const int m = GetParam();
  LocalCluster cluster(m, dir_.path());
  ASSERT_TRUE(cluster.ok());
  // Elements member i sends to member j; zero for some pairs when n is small.
  auto count = [m](size_t n, int i, int j) {
    return n * static_cast<size_t>(1 + (i + 2 * j) % 3) / (3 * m);
  };
  auto value = [](int from, int to, size_t k) {
    return static_cast<float>(
               static_cast<int>((k * 3 + static_cast<size_t>(from) * 5 +
                                 static_cast<size_t>(to) * 11) %
                                19)) -
           9.0f;
  };
  cluster.Run([&](int r) {
    Communicator& comm = cluster.comm(r);
    const DcnGroup g = Everyone(m, r);
    for (DType t : kTypes) {
      for (size_t n : kSizes) {
        const std::string what = Describe("all_to_all", m, t, n);
        std::vector<size_t> send_counts(m), recv_counts(m);
        for (int j = 0; j < m; ++j) {
          send_counts[j] = count(n * m, r, j);
          recv_counts[j] = count(n * m, j, r);
        }
        const std::vector<size_t> send_offsets = Offsets(send_counts);
        const std::vector<size_t> recv_offsets = Offsets(recv_counts);
        Array in(t, send_offsets[m - 1] + send_counts[m - 1]);
        for (int j = 0; j < m; ++j) {
          for (size_t k = 0; k < send_counts[j]; ++k) {
            in.Set(send_offsets[j] + k, value(r, j, k));
          }
        }
        Array out(t, recv_offsets[m - 1] + recv_counts[m - 1]);
        Status s = comm.AllToAll(g, in.data(), out.data(), send_counts,
                                 recv_counts, t, "test:all_to_all");
        ASSERT_TRUE(s.ok()) << what << ": " << s.message();
        for (int i = 0; i < m; ++i) {
          ExpectArray(
              out, recv_offsets[i], recv_counts[i],
              [&](size_t k) { return value(i, r, k); },
              what + " from " + std::to_string(i));
        }
      }
    }
  });
}

TEST_P(CollectiveTest, BarrierWaitsForEveryone) {
  const int m = GetParam();
  LocalCluster cluster(m, dir_.path());
  ASSERT_TRUE(cluster.ok());
  std::atomic<int> arrived{0};
  cluster.Run([&](int r) {
    const DcnGroup g = Everyone(m, r);
    for (int round = 1; round <= 5; ++round) {
      // Late arrivals, so that an early exit would be seen.
      std::this_thread::sleep_for(milliseconds(r * 5));
      arrived.fetch_add(1);
      Status s = cluster.comm(r).Barrier(g, "test:barrier");
      ASSERT_TRUE(s.ok()) << s.message();
      EXPECT_GE(arrived.load(), round * m);
      // Second barrier: nobody starts the next round before all have seen
      // the count of this one.
      ASSERT_TRUE(cluster.comm(r).Barrier(g, "test:barrier:2").ok());
    }
  });
}

TEST_P(CollectiveTest, RingAllReduceSendsTwiceTheShareOfEachMember) {
  const int m = GetParam();
  LocalCluster cluster(m, dir_.path());
  ASSERT_TRUE(cluster.ok());
  cluster.Run([&](int r) {
    Communicator& comm = cluster.comm(r);
    const DcnGroup g = Everyone(m, r);
    for (DType t : kTypes) {
      const size_t n = 1000003, esize = comm::SizeOf(t);
      Array in = Array::Of(t, n, [&](size_t i) { return Value(r, i); });
      Array out(t, n);
      const uint64_t before = comm.bytes_sent();
      ASSERT_TRUE(comm.AllReduce(g, in.data(), out.data(), n, t, ReduceOp::kSum,
                                 "test:bytes")
                      .ok());
      const uint64_t sent = comm.bytes_sent() - before;
      // Reduce-scatter sends every chunk but this member's own, all-gather
      // every chunk but the next member's.
      const size_t own = comm::PartitionSegment(n, m, r).count;
      const size_t next = comm::PartitionSegment(n, m, (r + 1) % m).count;
      EXPECT_EQ(sent, (2 * n - own - next) * esize);
      const double ideal = 2.0 * (m - 1) / m * static_cast<double>(n * esize);
      EXPECT_NEAR(static_cast<double>(sent), ideal, 2.0 * esize);

      const uint64_t rs_before = comm.bytes_sent();
      const std::vector<size_t> counts = UnevenCounts(n, m);
      Array shard(t, counts[r]);
      ASSERT_TRUE(comm.ReduceScatter(g, in.data(), shard.data(), counts, t,
                                     ReduceOp::kSum, "test:bytes")
                      .ok());
      EXPECT_EQ(comm.bytes_sent() - rs_before, (n - counts[r]) * esize);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectiveTest, testing::Values(2, 3, 4),
                         [](const testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

TEST(SubgroupTest, ConcurrentSubgroupsDoNotMix) {
  TempDir dir;
  LocalCluster cluster(4, dir.path());
  ASSERT_TRUE(cluster.ok());
  const size_t n = 1000003;
  cluster.Run([&](int r) {
    Communicator& comm = cluster.comm(r);
    // Ranks {0, 2} and {3, 1} (member order differs from rank order) work
    // at the same time on the same communicator.
    const std::vector<int> members =
        r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{3, 1};
    DcnGroup pair;
    pair.members = members;
    pair.my_index = members[0] == r ? 0 : 1;
    pair.id = r % 2 == 0 ? 101 : 202;
    const DcnGroup all = Everyone(4, r, 7);
    for (int iteration = 0; iteration < 3; ++iteration) {
      const int salt = iteration + 1;
      Array in = Array::Of(DType::kF32, n,
                           [&](size_t i) { return Value(r, i, salt); });
      Array out(DType::kF32, n);
      Status s = comm.AllReduce(pair, in.data(), out.data(), n, DType::kF32,
                                ReduceOp::kSum, "test:pair:all_reduce");
      ASSERT_TRUE(s.ok()) << s.message();
      ExpectArray(
          out, 0, n,
          [&](size_t i) {
            return Value(members[0], i, salt) + Value(members[1], i, salt);
          },
          "pair all_reduce");

      const std::vector<size_t> counts = {n / 3, n - n / 3};
      Array gathered(DType::kBF16, n);
      Array mine = Array::Of(DType::kBF16, counts[pair.my_index],
                             [&](size_t i) { return Value(r, i, salt); });
      s = comm.AllGather(pair, mine.data(), gathered.data(), counts,
                         DType::kBF16, "test:pair:all_gather");
      ASSERT_TRUE(s.ok()) << s.message();
      ExpectArray(
          gathered, 0, counts[0],
          [&](size_t i) { return Value(members[0], i, salt); },
          "pair all_gather block 0");
      ExpectArray(
          gathered, counts[0], counts[1],
          [&](size_t i) { return Value(members[1], i, salt); },
          "pair all_gather block 1");

      // The whole communicator in between.
      Array total(DType::kBF16, 1000);
      Array one = Array::Of(DType::kBF16, 1000,
                            [&](size_t i) { return Value(r, i, salt); });
      s = comm.AllReduce(all, one.data(), total.data(), 1000, DType::kBF16,
                         ReduceOp::kMax, "test:all:all_reduce");
      ASSERT_TRUE(s.ok()) << s.message();
      ExpectArray(
          total, 0, 1000,
          [&](size_t i) {
            float acc = Value(0, i, salt);
            for (int k = 1; k < 4; ++k) {
              acc = std::max(acc, Value(k, i, salt));
            }
            return acc;
          },
          "all all_reduce");
    }
  });
}

TEST(SubgroupTest, OverlappingGroupsInDifferentOrders) {
  TempDir dir;
  LocalCluster cluster(3, dir.path());
  ASSERT_TRUE(cluster.ok());
  const size_t n = 300000;
  // Rank 1 belongs to {0, 1} (id 5) and {1, 2} (id 6) and runs the second
  // group's operation first; rank 0 has already sent it data meanwhile.
  cluster.Run([&](int r) {
    Communicator& comm = cluster.comm(r);
    auto run = [&](std::vector<int> members, uint32_t id) {
      DcnGroup g;
      g.members = members;
      g.my_index = members[0] == r ? 0 : 1;
      g.id = id;
      Array in =
          Array::Of(DType::kF32, n, [&](size_t i) { return Value(r, i, id); });
      Array out(DType::kF32, n);
      Status s = comm.AllReduce(g, in.data(), out.data(), n, DType::kF32,
                                ReduceOp::kSum, "test:overlap");
      ASSERT_TRUE(s.ok()) << s.message();
      ExpectArray(
          out, 0, n,
          [&](size_t i) {
            return Value(members[0], i, id) + Value(members[1], i, id);
          },
          "group " + std::to_string(id));
    };
    if (r == 0) run({0, 1}, 5);
    if (r == 1) {
      run({1, 2}, 6);
      run({0, 1}, 5);
    }
    if (r == 2) run({1, 2}, 6);
  });
}

TEST(SubgroupTest, SingleMemberGroupCopies) {
  TempDir dir;
  LocalCluster cluster(2, dir.path());
  ASSERT_TRUE(cluster.ok());
  cluster.Run([&](int r) {
    Communicator& comm = cluster.comm(r);
    DcnGroup self;
    self.members = {r};
    self.my_index = 0;
    self.id = 9;
    const size_t n = 1000;
    Array in =
        Array::Of(DType::kBF16, n, [&](size_t i) { return Value(r, i); });
    Array out(DType::kBF16, n);
    auto same = [&](size_t i) { return Value(r, i); };
    ASSERT_TRUE(comm.AllReduce(self, in.data(), out.data(), n, DType::kBF16,
                               ReduceOp::kSum, "self")
                    .ok());
    ExpectArray(out, 0, n, same, "all_reduce");
    Array out2(DType::kBF16, n);
    ASSERT_TRUE(comm.ReduceScatter(self, in.data(), out2.data(), {n},
                                   DType::kBF16, ReduceOp::kMax, "self")
                    .ok());
    ExpectArray(out2, 0, n, same, "reduce_scatter");
    Array out3(DType::kBF16, n);
    ASSERT_TRUE(
        comm.AllGather(self, in.data(), out3.data(), {n}, DType::kBF16, "self")
            .ok());
    ExpectArray(out3, 0, n, same, "all_gather");
    Array out4(DType::kBF16, n);
    ASSERT_TRUE(comm.AllToAll(self, in.data(), out4.data(), {n}, {n},
                              DType::kBF16, "self")
                    .ok());
    ExpectArray(out4, 0, n, same, "all_to_all");
    ASSERT_TRUE(
        comm.Broadcast(self, 0, in.data(), n, DType::kBF16, "self").ok());
    ExpectArray(in, 0, n, same, "broadcast");
    ASSERT_TRUE(comm.Barrier(self, "self").ok());
    EXPECT_EQ(comm.bytes_sent(), 0u);
  });
}

TEST(CommunicatorTest, BadArgumentsAreRefusedWithoutBreakingIt) {
  TempDir dir;
  LocalCluster cluster(2, dir.path());
  ASSERT_TRUE(cluster.ok());
  cluster.Run([&](int r) {
    Communicator& comm = cluster.comm(r);
    EXPECT_EQ(comm.rank(), r);
    EXPECT_EQ(comm.size(), 2);
    float x[4] = {1, 2, 3, 4}, y[4];
    DcnGroup wrong_index = Everyone(2, 1 - r);
    EXPECT_EQ(
        comm.AllReduce(wrong_index, x, y, 4, DType::kF32, ReduceOp::kSum, "bad")
            .code(),
        StatusCode::kInvalidArgument);
    DcnGroup repeated;
    repeated.members = {r, r};
    EXPECT_EQ(comm.Barrier(repeated, "bad").code(),
              StatusCode::kInvalidArgument);
    DcnGroup outside;
    outside.members = {r, 5};
    EXPECT_EQ(comm.Barrier(outside, "bad").code(),
              StatusCode::kInvalidArgument);
    const DcnGroup g = Everyone(2, r);
    EXPECT_EQ(comm.AllGather(g, x, y, {1, 1, 2}, DType::kF32, "bad").code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.Broadcast(g, 2, x, 4, DType::kF32, "bad").code(),
              StatusCode::kInvalidArgument);
    // Still usable.
    Status s = comm.AllReduce(g, x, y, 4, DType::kF32, ReduceOp::kSum, "ok");
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(y[3], 8.0f);
  });
}

TEST(CommunicatorTest, GlooAllreduceRunsOnTheSameConnections) {
  TempDir dir;
  LocalCluster cluster(2, dir.path());
  ASSERT_TRUE(cluster.ok());
  cluster.Run([&](int r) {
    std::vector<float> data(1000, static_cast<float>(r + 1));
    gloo::AllreduceOptions opts(cluster.comm(r).gloo_context());
    opts.setOutput(data.data(), data.size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
    gloo::allreduce(opts);
    EXPECT_EQ(data[999], 3.0f);
    // Ours still works afterwards.
    float y = 0, x = 1;
    ASSERT_TRUE(cluster.comm(r)
                    .AllReduce(Everyone(2, r), &x, &y, 1, DType::kF32,
                               ReduceOp::kSum, "after gloo")
                    .ok());
    EXPECT_EQ(y, 2.0f);
  });
}

TEST(CommunicatorTest, MissingPeerEndsConnectAtTheTimeout) {
  TempDir dir;
  auto store = OpenStore(FileAddress(dir.path()), "run/0", milliseconds(500));
  ASSERT_TRUE(store.ok());
  ConnectOptions options;
  options.rank = 0;
  options.size = 2;
  options.key_prefix = "dcn/col0";
  options.timeout = milliseconds(500);
  const auto start = Clock::now();
  auto comm = Communicator::Connect(**store, options);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded)
      << comm.status().message();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));

  options.rank = 2;
  EXPECT_EQ(Communicator::Connect(**store, options).status().code(),
            StatusCode::kInvalidArgument);
}

// Faults. A child process forked before this process starts any thread
// joins a 2-rank communicator as "child process" and runs all-reduces until
// it is killed or stopped.
constexpr size_t kFaultElems = size_t{8} << 20;  // 32 MiB of f32

ConnectOptions FaultOptions(int rank, milliseconds timeout) {
  ConnectOptions options;
  options.rank = rank;
  options.size = 2;
  options.key_prefix = "dcn/fault";
  options.timeout = timeout;
  options.peer_names = {"parent process", "child process"};
  return options;
}

// What the child runs until it is killed or stopped: all-reduces, or (as the
// root) broadcasts, whose receiver is most often in the middle of reading a
// segment when the sender dies.
enum class ChildWork { kAllReduce, kBroadcast };

[[noreturn]] void RunChild(const std::string& dir, ChildWork work) {
  auto store = OpenStore(FileAddress(dir), "run/0", milliseconds(20000));
  if (!store.ok()) _exit(2);
  auto comm =
      Communicator::Connect(**store, FaultOptions(1, milliseconds(60000)));
  if (!comm.ok()) _exit(3);
  std::vector<float> in(kFaultElems, 1.0f), out(kFaultElems);
  const DcnGroup g = Everyone(2, 1);
  Status s;
  while (s.ok()) {
    s = work == ChildWork::kAllReduce
            ? (*comm)->AllReduce(g, in.data(), out.data(), in.size(),
                                 DType::kF32, ReduceOp::kSum, "child")
            : (*comm)->Broadcast(g, 1, in.data(), in.size(), DType::kF32,
                                 "child");
  }
  _exit(0);
}

// Kills and reaps the child whatever happens to the test.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  ~Child() { Reap(); }
  pid_t pid() const { return pid_; }
  void Reap() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_;
};

TEST(CommunicatorFaultTest, KilledPeerIsUnavailable) {
  TempDir dir;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) RunChild(dir.path(), ChildWork::kAllReduce);
  Child child(pid);

  // A long timeout: a failure must be seen by the connection breaking, not
  // by the timeout.
  auto store = OpenStore(FileAddress(dir.path()), "run/0", milliseconds(20000));
  ASSERT_TRUE(store.ok());
  auto comm =
      Communicator::Connect(**store, FaultOptions(0, milliseconds(20000)));
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  std::vector<float> in(kFaultElems, 2.0f), out(kFaultElems);
  const DcnGroup g = Everyone(2, 0);
  ASSERT_TRUE((*comm)
                  ->AllReduce(g, in.data(), out.data(), in.size(), DType::kF32,
                              ReduceOp::kSum, "warm-up")
                  .ok());
  EXPECT_EQ(out[12345], 3.0f);

  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(150));
    kill(child.pid(), SIGKILL);
  });
  Status s;
  const auto start = Clock::now();
  for (int i = 0; i < 10000 && s.ok(); ++i) {
    s = (*comm)->AllReduce(g, in.data(), out.data(), in.size(), DType::kF32,
                           ReduceOp::kSum, "dcn:all_reduce:killed");
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  killer.join();
  child.Reap();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
  EXPECT_NE(
      s.message().find("child process failed during dcn:all_reduce:killed: "),
      std::string::npos)
      << s.message();
  EXPECT_LT(seconds, 15.0) << s.message();
  std::cerr << "killed peer: " << s.message() << " (after " << seconds
            << " s)\n";

  // The communicator refuses further work with the same cause.
  Status after = (*comm)->Barrier(g, "after");
  EXPECT_EQ(after.code(), StatusCode::kUnavailable);
  EXPECT_NE(after.message().find("child process"), std::string::npos);
}

// Gloo never signals a receive whose bytes are being read when the sender
// dies; the communicator's failure watch must end that wait too.
TEST(CommunicatorFaultTest, KilledBroadcastRootIsUnavailable) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    TempDir dir;
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) RunChild(dir.path(), ChildWork::kBroadcast);
    Child child(pid);

    auto store =
        OpenStore(FileAddress(dir.path()), "run/0", milliseconds(20000));
    ASSERT_TRUE(store.ok());
    auto comm =
        Communicator::Connect(**store, FaultOptions(0, milliseconds(20000)));
    ASSERT_TRUE(comm.ok()) << comm.status().message();
    std::vector<float> buf(kFaultElems);
    const DcnGroup g = Everyone(2, 0);
    std::thread killer([&] {
      std::this_thread::sleep_for(milliseconds(100 + 37 * attempt));
      kill(child.pid(), SIGKILL);
    });
    Status s;
    const auto start = Clock::now();
    for (int i = 0; i < 100000 && s.ok(); ++i) {
      s = (*comm)->Broadcast(g, 1, buf.data(), buf.size(), DType::kF32,
                             "dcn:broadcast:killed");
    }
    const double seconds =
        std::chrono::duration<double>(Clock::now() - start).count();
    killer.join();
    child.Reap();
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
    EXPECT_NE(s.message().find("child process failed during "
                               "dcn:broadcast:killed: "),
              std::string::npos)
        << s.message();
    EXPECT_LT(seconds, 15.0) << s.message();
  }
}

// A peer that leaves right after the last operation it shares with this
// process is not a failure of that operation; a later one fails at once.
TEST(CommunicatorFaultTest, PeerLeavingAfterTheLastOperationIsNotAFailure) {
  for (int attempt = 0; attempt < 10; ++attempt) {
    TempDir dir;
    LocalCluster cluster(2, dir.path());
    ASSERT_TRUE(cluster.ok());
    std::vector<float> buf(size_t{1} << 20, 1.0f);
    std::vector<float> received(buf.size());
    std::thread receiver([&] {
      Status s =
          cluster.comm(1).Broadcast(Everyone(2, 1), 0, received.data(),
                                    received.size(), DType::kF32, "last");
      EXPECT_TRUE(s.ok()) << s.message();
      cluster.Close(1);
    });
    Status s = cluster.comm(0).Broadcast(Everyone(2, 0), 0, buf.data(),
                                         buf.size(), DType::kF32, "last");
    EXPECT_TRUE(s.ok()) << s.message();
    receiver.join();
    s = cluster.comm(0).Barrier(Everyone(2, 0), "after the peer left");
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
    EXPECT_NE(s.message().find("slice 1 failed during after the peer left"),
              std::string::npos)
        << s.message();
  }
}

TEST(CommunicatorFaultTest, StoppedPeerExceedsTheDeadline) {
  TempDir dir;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) RunChild(dir.path(), ChildWork::kAllReduce);
  Child child(pid);

  const milliseconds timeout(2000);
  auto store = OpenStore(FileAddress(dir.path()), "run/0", milliseconds(20000));
  ASSERT_TRUE(store.ok());
  auto comm = Communicator::Connect(**store, FaultOptions(0, timeout));
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  std::vector<float> in(kFaultElems, 2.0f), out(kFaultElems);
  const DcnGroup g = Everyone(2, 0);
  ASSERT_TRUE((*comm)
                  ->AllReduce(g, in.data(), out.data(), in.size(), DType::kF32,
                              ReduceOp::kSum, "warm-up")
                  .ok());

  ASSERT_EQ(kill(child.pid(), SIGSTOP), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child.pid(), &wstatus, WUNTRACED), child.pid());
  ASSERT_TRUE(WIFSTOPPED(wstatus));

  const auto start = Clock::now();
  Status s =
      (*comm)->AllReduce(g, in.data(), out.data(), in.size(), DType::kF32,
                         ReduceOp::kSum, "dcn:all_reduce:stopped");
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  child.Reap();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.message();
  EXPECT_EQ(s.message(),
            "child process did not answer within 2 s during "
            "dcn:all_reduce:stopped");
  EXPECT_LT(seconds, 10.0);
  std::cerr << "stopped peer: " << s.message() << " (after " << seconds
            << " s)\n";
}

}  // namespace
}  // namespace multislice::dcn
