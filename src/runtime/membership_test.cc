#include "runtime/membership.h"

#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "common/temp_dir.h"
#include "runtime/comm/dcn/store.h"

namespace multislice::runtime {
namespace {

using std::chrono::milliseconds;

class MembershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    auto address = dcn::ParseStoreAddress("file://" + dir_.path());
    ASSERT_TRUE(address.ok());
    auto store = dcn::OpenStore(*address, "run/0/", milliseconds(5000));
    ASSERT_TRUE(store.ok()) << store.status().message();
    store_ = *store;
  }
  TempDir dir_{"membership-test-"};
  std::shared_ptr<gloo::rendezvous::Store> store_;
};

// Two survivors of three agree on the third, which the launcher records
// gone after they started waiting.
TEST_F(MembershipTest, SurvivorsAgreeOnTheProcessTheLauncherRecorded) {
  std::optional<Result<std::vector<int>>> seen[2];
  std::thread survivors[2];
  for (int p = 0; p < 2; ++p) {
    survivors[p] = std::thread([&, p] {
      seen[p] = AgreeOnGone(*store_, 0, p, {0, 1, 2}, milliseconds(5000));
    });
  }
  std::this_thread::sleep_for(milliseconds(200));
  RecordGone(*store_, 2);
  for (std::thread& t : survivors) t.join();
  for (int p = 0; p < 2; ++p) {
    ASSERT_TRUE(seen[p].has_value());
    ASSERT_TRUE(seen[p]->ok()) << seen[p]->status().message();
    EXPECT_EQ(**seen[p], std::vector<int>({2}));
  }
}

// A process that recorded itself alive and was then stopped is gone; the
// generations do not mix (an alive record of generation 0 does not count
// in generation 1).
TEST_F(MembershipTest, GoneWinsOverAliveAndGenerationsAreSeparate) {
  RecordGone(*store_, 2);
  ASSERT_TRUE(
      AgreeOnGone(*store_, 0, 1, {0, 1, 2}, milliseconds(1)).status().code() ==
      StatusCode::kDeadlineExceeded);
  auto first = AgreeOnGone(*store_, 0, 0, {0, 1, 2}, milliseconds(2000));
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(*first, std::vector<int>({2}));
  auto next = AgreeOnGone(*store_, 1, 0, {0, 1}, milliseconds(300));
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(next.status().message().find("processes 1 "), std::string::npos)
      << next.status().message();
}

TEST_F(MembershipTest, AProcessReportedGoneIsTold) {
  RecordGone(*store_, 1);
  auto seen = AgreeOnGone(*store_, 0, 1, {0, 1}, milliseconds(1000));
  ASSERT_FALSE(seen.ok());
  EXPECT_EQ(seen.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace multislice::runtime
