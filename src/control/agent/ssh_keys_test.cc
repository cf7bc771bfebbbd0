#include "control/agent/ssh_keys.h"

#include <gtest/gtest.h>

namespace multislice::control {
namespace {

constexpr const char* kEd =
    "AAAAC3NzaC1lZDI1NTE5AAAAIDZqw0U6tqv4K2mFJZtL1b2m4c1oV4h9vC0yq8hB1xQe";
constexpr const char* kRsa = "AAAAB3NzaC1yc2EAAAADAQABAAABAQC7";
constexpr int64_t kNow = 1796536800;  // 2026-12-06T06:00:00Z

TEST(SshKeysTest, GcloudsLinesGroupByUser) {
  // What gcloud appends: "USER:TYPE BASE64 USER", after a newline.
  const std::string value = std::string("\nroot:ssh-ed25519 ") + kEd +
                            " root\nalice:ssh-rsa " + kRsa +
                            " alice@laptop\r\nroot:ssh-rsa " + kRsa + "\n";
  const SshKeyLines lines = ParseSshKeys(value, kNow);
  EXPECT_TRUE(lines.skipped.empty()) << lines.skipped[0];
  ASSERT_EQ(lines.by_user.size(), 2u);
  EXPECT_EQ(lines.by_user.at("root"),
            (std::vector<std::string>{std::string("ssh-ed25519 ") + kEd,
                                      std::string("ssh-rsa ") + kRsa}));
  EXPECT_EQ(lines.by_user.at("alice"),
            std::vector<std::string>{std::string("ssh-rsa ") + kRsa});
}

TEST(SshKeysTest, HostileLinesAreSkippedWithTheirReason) {
  const std::string value =
      std::string("root:command=\"sh\" ssh-ed25519 ") + kEd + "\n" +
      "no colon here\n" + "../etc:ssh-ed25519 " + kEd + "\n" +
      "-root:ssh-ed25519 " + kEd + "\n" + "root:ssh-ed25519 not*base64!\n" +
      "root:ssh-ed25519\n" + "root:ssh-ed25519 " + kEd + " x\x01y\n" +
      "a-user-name-that-is-far-too-long-for-linux:ssh-ed25519 " + kEd + "\n";
  const SshKeyLines lines = ParseSshKeys(value, kNow);
  EXPECT_TRUE(lines.by_user.empty());
  ASSERT_EQ(lines.skipped.size(), 8u);
  EXPECT_NE(lines.skipped[0].find("line 1: 'command=\"sh\"' is not an OpenSSH"),
            std::string::npos)
      << lines.skipped[0];
  EXPECT_NE(lines.skipped[1].find("line 2: expected USER:KEY"),
            std::string::npos);
  EXPECT_NE(lines.skipped[2].find("'../etc' is not a user name"),
            std::string::npos);
  EXPECT_NE(lines.skipped[4].find("not base64"), std::string::npos);
  EXPECT_NE(lines.skipped[5].find("expected 'TYPE BASE64"), std::string::npos);
  EXPECT_NE(lines.skipped[6].find("control character"), std::string::npos);
}

TEST(SshKeysTest, ExpiredGoogleSshKeysAreSkipped) {
  const std::string value =
      std::string("old:ssh-ed25519 ") + kEd +
      " google-ssh {\"userName\":\"old@x.com\",\"expireOn\":"
      "\"2026-12-06T05:59:59+0000\"}\n" +
      "new:ssh-ed25519 " + kEd +
      " google-ssh {\"userName\":\"new@x.com\",\"expireOn\":"
      "\"2026-12-06T07:00:00+01:00\"}\n" +
      "later:ssh-ed25519 " + kEd +
      " google-ssh {\"userName\":\"l@x.com\",\"expireOn\":"
      "\"2026-12-06T06:00:01.5Z\"}\n" +
      "bad:ssh-ed25519 " + kEd + " google-ssh {\"expireOn\":\"tomorrow\"}\n";
  const SshKeyLines lines = ParseSshKeys(value, kNow);
  // 07:00+01:00 is 06:00Z: expired at kNow, as is 05:59:59Z.
  EXPECT_EQ(lines.by_user.count("old"), 0u);
  EXPECT_EQ(lines.by_user.count("new"), 0u);
  EXPECT_EQ(lines.by_user.count("later"), 1u);
  ASSERT_EQ(lines.skipped.size(), 3u);
  EXPECT_NE(lines.skipped[0].find("line 1: it expired"), std::string::npos);
  EXPECT_NE(lines.skipped[2].find("not an RFC 3339 time"), std::string::npos);
}

TEST(SshKeysTest, BoundsHold) {
  std::string many;
  for (size_t i = 0; i < kMaxSshKeys + 3; ++i) {
    many += "u" + std::to_string(i % 7) + ":ssh-ed25519 " + kEd + "\n";
  }
  SshKeyLines lines = ParseSshKeys(many, kNow);
  EXPECT_EQ(lines.skipped.size(), 3u);
  lines = ParseSshKeys(std::string(kMaxSshKeysBytes + 1, 'a'), kNow);
  EXPECT_TRUE(lines.by_user.empty());
  ASSERT_EQ(lines.skipped.size(), 1u);
  EXPECT_NE(lines.skipped[0].find("the whole value"), std::string::npos);
}

TEST(SshKeysTest, UserNames) {
  EXPECT_TRUE(ValidSshUser("root"));
  EXPECT_TRUE(ValidSshUser("first.last_1-2"));
  EXPECT_FALSE(ValidSshUser(""));
  EXPECT_FALSE(ValidSshUser(".hidden"));
  EXPECT_FALSE(ValidSshUser("a/b"));
  EXPECT_FALSE(ValidSshUser("a b"));
  EXPECT_FALSE(ValidSshUser(std::string(33, 'a')));
}

}  // namespace
}  // namespace multislice::control
