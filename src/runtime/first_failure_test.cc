#include "runtime/first_failure.h"

#include <gtest/gtest.h>

#include <map>

#include "common/temp_dir.h"
#include "runtime/comm/dcn/store.h"

namespace multislice::runtime {
namespace {

using std::chrono::milliseconds;

// Records held in a map; counts the waits for absent ones.
struct FakeRecords {
  std::map<int, int> lost;
  int empty_waits = 0;
  LostRecord Lookup() {
    return [this](int process, milliseconds) -> std::optional<int> {
      auto it = lost.find(process);
      if (it == lost.end()) {
        ++empty_waits;
        return std::nullopt;
      }
      return it->second;
    };
  }
};

TEST(FirstFailureTest, APeerWithoutARecordIsTheOneItStartedAt) {
  FakeRecords records;
  EXPECT_EQ(FirstFailure(0, 1, 4, records.Lookup(), milliseconds(1)), 1);
  EXPECT_EQ(records.empty_waits, 1);
}

TEST(FirstFailureTest, TheChainOfSurvivorsIsFollowedToTheCulprit) {
  // 3 lost 0, 0 lost 1; 1 (killed) recorded nothing.
  FakeRecords records;
  records.lost = {{3, 0}, {0, 1}};
  EXPECT_EQ(FirstFailure(2, 3, 4, records.Lookup(), milliseconds(1)), 1);
}

TEST(FirstFailureTest, ACycleOfRecordsNamesNoCulprit) {
  FakeRecords records;
  records.lost = {{1, 2}, {2, 1}};
  EXPECT_EQ(FirstFailure(0, 1, 3, records.Lookup(), milliseconds(1)),
            std::nullopt);
  // Coming back to the caller itself is a cycle too.
  records.lost = {{1, 0}};
  EXPECT_EQ(FirstFailure(0, 1, 3, records.Lookup(), milliseconds(1)),
            std::nullopt);
}

TEST(FirstFailureTest, ARecordOutOfRangeEndsTheChainThere) {
  FakeRecords records;
  records.lost = {{1, 7}};
  EXPECT_EQ(FirstFailure(0, 1, 3, records.Lookup(), milliseconds(1)), 1);
}

TEST(FirstFailureTest, RecordsGoThroughARendezvousStore) {
  TempDir dir;
  auto address = dcn::ParseStoreAddress("file://" + dir.path());
  ASSERT_TRUE(address.ok());
  auto store = dcn::OpenStore(*address, "run/0/", std::chrono::seconds(5));
  ASSERT_TRUE(store.ok());
  RecordLost(**store, 3, 0);
  RecordLost(**store, 0, 1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(FirstFailure(2, 3, 4, StoreLostRecords(**store), milliseconds(200)),
            1);
  // Only the culprit's absent record was waited for.
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1500));
}

}  // namespace
}  // namespace multislice::runtime
