#include "control/agent/selection.h"

#include <gtest/gtest.h>

namespace multislice::control {
namespace {

std::vector<int> Indices(std::string_view text) {
  auto s = ParseSelection(text, "--node");
  EXPECT_TRUE(s.ok()) << text << ": " << s.status().message();
  return s.ok() ? s->indices : std::vector<int>{-1};
}

TEST(SelectionTest, ParsesEveryForm) {
  auto all = ParseSelection("all", "--node");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->all);
  EXPECT_TRUE(all->Contains(12345));
  EXPECT_EQ(Indices("3"), (std::vector<int>{3}));
  EXPECT_EQ(Indices("2,0"), (std::vector<int>{0, 2}));
  EXPECT_EQ(Indices("1-3"), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(Indices("0,2-3,2"), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(Indices("4-4"), (std::vector<int>{4}));
  auto some = ParseSelection("1,3", "--worker");
  ASSERT_TRUE(some.ok());
  EXPECT_TRUE(some->Contains(3));
  EXPECT_FALSE(some->Contains(2));
}

TEST(SelectionTest, RejectsBadValuesWithOneLine) {
  for (const char* text :
       {"", "x", "-1", "1,", ",1", "1,,2", "1-", "-", "1-2-3", " 1", "1 ",
        "ALL", "1.5", "+1", "99999", "0-70000", "0x1"}) {
    auto s = ParseSelection(text, "--worker");
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().message().find('\n'), std::string::npos);
    EXPECT_EQ(
        s.status().message().rfind("--worker: '" + std::string(text) + "'", 0),
        0u)
        << s.status().message();
  }
  auto reversed = ParseSelection("3-1", "--node");
  ASSERT_FALSE(reversed.ok());
  EXPECT_EQ(reversed.status().message(),
            "--node: '3-1' is not a range: 3 is greater than 1");
}

}  // namespace
}  // namespace multislice::control
