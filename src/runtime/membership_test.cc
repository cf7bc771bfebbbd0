#include "runtime/membership.h"

#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "common/temp_dir.h"
#include "runtime/comm/dcn/store.h"

namespace multislice::runtime {
namespace {

using std::chrono::milliseconds;

const std::vector<int> kFirstStarts = {0, 0, 0};  // incarnations by process

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
      seen[p] = AgreeOnGone(*store_, 0, p, {0, 1, 2}, kFirstStarts,
                            milliseconds(5000));
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
      AgreeOnGone(*store_, 0, 1, {0, 1, 2}, kFirstStarts, milliseconds(1))
          .status()
          .code() == StatusCode::kDeadlineExceeded);
  auto first =
      AgreeOnGone(*store_, 0, 0, {0, 1, 2}, kFirstStarts, milliseconds(2000));
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(*first, std::vector<int>({2}));
  auto next =
      AgreeOnGone(*store_, 1, 0, {0, 1}, kFirstStarts, milliseconds(300));
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(next.status().message().find("processes 1 "), std::string::npos)
      << next.status().message();
}

TEST_F(MembershipTest, AProcessReportedGoneIsTold) {
  RecordGone(*store_, 1);
  auto seen =
      AgreeOnGone(*store_, 0, 1, {0, 1}, kFirstStarts, milliseconds(1000));
  ASSERT_FALSE(seen.ok());
  EXPECT_EQ(seen.status().code(), StatusCode::kFailedPrecondition);
}

// A restarted process's old gone record does not make it gone again; its
// new start's record does.
TEST_F(MembershipTest, GoneRecordsNameTheStart) {
  RecordGone(*store_, 2);  // the first start of process 2
  const std::vector<int> restarted = {0, 0, 1};
  std::optional<Result<std::vector<int>>> seen[2];
  std::thread survivors[2];
  for (int p = 0; p < 2; ++p) {
    survivors[p] = std::thread([&, p] {
      seen[p] =
          AgreeOnGone(*store_, 3, p, {0, 1, 2}, restarted, milliseconds(5000));
    });
  }
  std::this_thread::sleep_for(milliseconds(200));
  auto alive =
      AgreeOnGone(*store_, 3, 2, {0, 1, 2}, restarted, milliseconds(5000));
  for (std::thread& t : survivors) t.join();
  ASSERT_TRUE(alive.ok()) << alive.status().message();
  EXPECT_TRUE(alive->empty());
  for (int p = 0; p < 2; ++p) {
    ASSERT_TRUE(seen[p]->ok()) << seen[p]->status().message();
    EXPECT_TRUE((*seen[p])->empty());
  }
  RecordGone(*store_, 2, 1);
  auto again =
      AgreeOnGone(*store_, 4, 0, {0, 1, 2}, restarted, milliseconds(300));
  EXPECT_EQ(again.status().code(), StatusCode::kDeadlineExceeded);  // 1
  auto both =
      AgreeOnGone(*store_, 4, 1, {0, 1, 2}, restarted, milliseconds(2000));
  ASSERT_TRUE(both.ok()) << both.status().message();
  EXPECT_EQ(*both, std::vector<int>({2}));
}

// A restarted worker asks; the survivors see the request of that start
// only; the admission it waits for comes back as recorded.
TEST_F(MembershipTest, ARestartedWorkerIsAdmittedAsRecorded) {
  EXPECT_FALSE(RejoinRequested(*store_, 2, 1));
  ASSERT_TRUE(RequestRejoin(*store_, 2, 1).ok());
  EXPECT_TRUE(RejoinRequested(*store_, 2, 1));
  EXPECT_FALSE(RejoinRequested(*store_, 2, 2));
  Admission a;
  a.generation = 2;
  a.step = 14;
  a.members = {0, 1, 2};
  a.incarnations = {0, 0, 1};
  std::optional<Result<std::optional<Admission>>> got;
  std::thread waiter(
      [&] { got = WaitForAdmission(*store_, 2, 1, 3, milliseconds(5000)); });
  std::this_thread::sleep_for(milliseconds(100));
  ASSERT_TRUE(RecordAdmission(*store_, 2, 1, a).ok());
  waiter.join();
  ASSERT_TRUE(got->ok()) << got->status().message();
  ASSERT_TRUE(got->value().has_value());
  const Admission& b = *got->value();
  EXPECT_EQ(b.generation, 2);
  EXPECT_EQ(b.step, 14);
  EXPECT_EQ(b.members, a.members);
  EXPECT_EQ(b.incarnations, a.incarnations);
  // Nobody admits start 2: it is told once the admissions close.
  EXPECT_EQ(
      WaitForAdmission(*store_, 2, 2, 3, milliseconds(100)).status().code(),
      StatusCode::kDeadlineExceeded);
  CloseAdmissions(*store_);
  auto closed = WaitForAdmission(*store_, 2, 2, 3, milliseconds(5000));
  ASSERT_TRUE(closed.ok());
  EXPECT_FALSE(closed->has_value());
}

TEST(AdmissionTest, MalformedRecordsAreRefusedInOneSentence) {
  EXPECT_TRUE(ParseAdmission("2 14 0,1,2 0,0,1", 3).ok());
  for (const char* bad :
       {"", "2 14 0,1,2", "2 14 0,1,2 0,0,1 x", "0 14 0,1 0,0,0",
        "2 -1 0,1 0,0,0", "2 14 0,,2 0,0,1", "2 14 0,1,x 0,0,1",
        "2 14 0,1,2 0,0", "2 14 1,0 0,0,0", "2 14 0,3 0,0,0",
        "2 14 0,1 0,0,99999999999"}) {
    auto a = ParseAdmission(bad, 3);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(a.status().message().find("admission record '" +
                                        std::string(bad) + "': "),
              0u)
        << a.status().message();
  }
}

}  // namespace
}  // namespace multislice::runtime
