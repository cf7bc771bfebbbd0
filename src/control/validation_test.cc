#include "control/validation.h"

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "control/http.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Utf8Test, AcceptsWellFormedAndLocatesTheFirstBadByte) {
  for (const char* good : {"", "abc", "\xC3\xA9", "\xE2\x82\xAC",
                           "\xF0\x9D\x84\x9E", "\xF4\x8F\xBF\xBF"}) {
    EXPECT_TRUE(IsValidUtf8(good)) << good;
  }
  struct Case {
    std::string text;
    size_t offset;
  };
  const Case bad[] = {
      {"\xFF", 0},              // never in UTF-8
      {"ab\x80", 2},            // a lone continuation byte
      {"\xC0\xAF", 0},          // overlong '/'
      {"a\xE0\x80\xAF", 1},     // overlong, three bytes
      {"\xED\xA0\x80", 0},      // a surrogate
      {"\xF4\x90\x80\x80", 0},  // past U+10FFFF
      {"ok\xE2\x82", 2},        // cut short
      {"\xC3\xA9\xC3", 2},      // cut short after a good character
      {"\xE2\x28\xA1", 0},      // a bad second byte
  };
  for (const Case& c : bad) {
    size_t offset = 99;
    EXPECT_FALSE(IsValidUtf8(c.text, &offset)) << c.text;
    EXPECT_EQ(offset, c.offset) << c.text;
  }
}

TEST(QuoteForMessageTest, EscapesWhatCouldMisleadAndCutsAtCharacters) {
  EXPECT_EQ(QuoteForMessage("bad name!"), "'bad name!'");
  EXPECT_EQ(QuoteForMessage("a'b\\c"), "'a\\'b\\\\c'");
  EXPECT_EQ(QuoteForMessage("p\xFF"), "'p\\xFF'");
  EXPECT_EQ(QuoteForMessage(std::string("a\0b\n", 4)), "'a\\x00b\\x0A'");
  EXPECT_EQ(QuoteForMessage("\xC3\xA9t\xC3\xA9"), "'\xC3\xA9t\xC3\xA9'");
  EXPECT_EQ(QuoteForMessage("x\xE2\x80\xAEy"), "'x\\u202Ey'");  // RLO
  EXPECT_EQ(QuoteForMessage("\xC2\x85"), "'\\u0085'");          // C1 NEL
  // 100 two-byte characters cut after 10 characters, never mid-character.
  std::string long_value;
  for (int i = 0; i < 100; ++i) long_value += "\xC3\xA9";
  const std::string quoted = QuoteForMessage(long_value, 10);
  EXPECT_EQ(quoted, "'" + long_value.substr(0, 20) + "...'");
  EXPECT_TRUE(IsValidUtf8(QuoteForMessage(long_value)));
  EXPECT_EQ(QuoteForMessage("abc", 3), "'abc'");
  // A cut sequence is shown byte by byte.
  EXPECT_EQ(QuoteForMessage("\xE2\x82"), "'\\xE2\\x82'");
}

TEST(ResourceIdTest, Rfc1035LabelsOnly) {
  for (const std::string& good : std::vector<std::string>{
           "a", "qr1", "seed-qr", "x-0", "a1-b2", std::string(63, 'a')}) {
    EXPECT_TRUE(ValidateResourceId("queued_resource_id", good).ok()) << good;
    EXPECT_TRUE(IsResourceId(good)) << good;
  }
  for (const std::string& bad :
       std::vector<std::string>{".", "..", "-x", "x-", "%", "%2e", "A", "Qr",
                                "a_b", "a.b", "a/b", "a b", "1a", "\xC3\xA9",
                                "a\xFF", "a~", "a+b", std::string(64, 'a')}) {
    Status s = ValidateResourceId("queued_resource_id", bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_FALSE(IsResourceId(bad)) << bad;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message().rfind("queued_resource_id: '", 0), 0u) << s.message();
    EXPECT_TRUE(Contains(s.message(), "does not match")) << s.message();
    EXPECT_TRUE(Contains(s.message(), "63 characters")) << s.message();
    EXPECT_TRUE(IsValidUtf8(s.message())) << s.message();
  }
  EXPECT_EQ(ValidateResourceId("queued_resource_id", "").message(),
            "queued_resource_id: is required");
  EXPECT_TRUE(Contains(ValidateResourceId("f", "a\xFF").message(), "'a\\xFF'"));
  // The console's wording (console_browser_test) is kept.
  EXPECT_EQ(ValidateResourceId("queued_resource_id", "bad name!")
                .message()
                .rfind("queued_resource_id: 'bad name!' does not match", 0),
            0u);
  EXPECT_TRUE(ValidateOperationId("operation", "operation-0123abcd").ok());
  EXPECT_FALSE(ValidateOperationId("operation", "..").ok());
}

TEST(PathSegmentTest, ProjectsAndZones) {
  // Every project and zone the tests, the CLI and the console use.
  for (const char* project : {"p", "pa", "proj", "local", "123",
                              "my-project-12", "example.com:proj"}) {
    EXPECT_TRUE(ValidateProjectId("project", project).ok()) << project;
  }
  for (const std::string& bad : std::vector<std::string>{
           "", "..", ".", "%FF", "p\xFF", "P", "-p", "p-", "\xC3\xA9", "a/b",
           "a b", std::string(64, 'p')}) {
    Status s = ValidateProjectId("project", bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.message().rfind("project: '", 0), 0u) << s.message();
    EXPECT_TRUE(IsValidUtf8(s.message()));
  }
  for (const char* zone : {"z", "local-a", "us-test1-a", "other"}) {
    EXPECT_TRUE(ValidateZone("location", zone, false).ok()) << zone;
  }
  EXPECT_TRUE(ValidateZone("location", "-", true).ok());
  EXPECT_FALSE(ValidateZone("location", "-", false).ok());
  for (const char* bad : {"", "..", "Z", "a_b", "us.a", "a:b", "--"}) {
    EXPECT_FALSE(ValidateZone("location", bad, true).ok()) << bad;
  }
  for (const char* domain : {"", "pod0", "a", "rack-12-b"}) {
    EXPECT_TRUE(ValidateIciDomain("iciDomain", domain).ok()) << domain;
  }
  for (const char* bad : {"-", "Pod0", "pod_0", "pod0-", "a.b", " "}) {
    EXPECT_FALSE(ValidateIciDomain("iciDomain", bad).ok()) << bad;
  }
  EXPECT_EQ(ValidateIciDomain("iciDomain", "Pod0").message(),
            "iciDomain: 'Pod0' is not an ICI domain name such as 'pod0': "
            "expected lowercase letters, digits and '-', starting and ending "
            "with a letter or digit, at most 63 characters (or nothing: no "
            "domain)");
  EXPECT_FALSE(ValidateIciDomain("iciDomain", std::string(64, 'a')).ok());
  EXPECT_TRUE(ValidateIciDomain("iciDomain", std::string(63, 'a')).ok());
  EXPECT_TRUE(ValidateParent("p", "-", true).ok());
  EXPECT_EQ(ValidateParent("p%", "z", false).message().rfind("project:", 0),
            0u);
  EXPECT_EQ(ValidateQueuedResourceName("p", "z", "Q")
                .message()
                .rfind("queued_resource: 'Q'", 0),
            0u);
  EXPECT_EQ(ValidateQueuedResourceName("p", "-", "q")
                .message()
                .rfind("location: '-'", 0),
            0u);
  EXPECT_TRUE(ValidateOperationName("p", "z", "operation-00ff").ok());
  EXPECT_EQ(
      ValidateOperationName("p", "z", "op/x").message().rfind("operation: ", 0),
      0u);
}

TEST(PagingTest, PageSizeAndTokenRefuseGarbage) {
  EXPECT_EQ(*ParsePageSize("10"), 10);
  EXPECT_EQ(*ParsePageSize("0"), kDefaultPageSize);
  EXPECT_EQ(*ParsePageSize("1000"), 1000);
  for (const std::string& bad : std::vector<std::string>{
           "", "x", "-1", "1001", "10000", " 5", "5 ", "+5", "1e2", "\xFF"}) {
    Result<int> size = ParsePageSize(bad);
    ASSERT_FALSE(size.ok()) << bad;
    EXPECT_EQ(size.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(size.status().message().rfind("page_size: '", 0), 0u);
    EXPECT_TRUE(IsValidUtf8(size.status().message()));
  }
  EXPECT_EQ(*ParsePageToken(""), 0);
  EXPECT_EQ(*ParsePageToken(FormatPageToken(42)), 42);
  for (const std::string& bad : std::vector<std::string>{
           "%FF", "\xFF\xFE\x00\x01", "-1", "1e3", " 5", "abc",
           "99999999999999999999", std::string(5000, '7')}) {
    Result<int64_t> token = ParsePageToken(bad);
    ASSERT_FALSE(token.ok()) << bad;
    EXPECT_EQ(token.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(token.status().message().rfind("page_token: '", 0), 0u);
    EXPECT_TRUE(IsValidUtf8(token.status().message()));
    EXPECT_LT(token.status().message().size(), 400u);
  }
}

TEST(CheckJsonTextTest, BoundsDepthOutsideStringsAndChecksUtf8) {
  const std::string ok64 = std::string(64, '[') + std::string(64, ']');
  EXPECT_TRUE(CheckJsonText(ok64, 64).ok());
  Status deep = CheckJsonText("[" + ok64 + "]", 64);
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.message(),
            "malformed JSON at line 1, column 65: arrays and objects are "
            "nested more than 64 deep");
  // Brackets in strings, escaped quotes included, do not count.
  const std::string in_string =
      "{\"a\": \"\\\"" + std::string(100, '[') + "\", \"b\": [1]}";
  EXPECT_TRUE(CheckJsonText(in_string, 2).ok());
  EXPECT_FALSE(CheckJsonText("{\"a\": [[1]]}", 2).ok());
  // Closing brackets do not go below zero.
  EXPECT_TRUE(CheckJsonText("]]]][", 1).ok());
  Status utf8 = CheckJsonText("{\n  \"a\": \"\xFF\"}", 64);
  ASSERT_FALSE(utf8.ok());
  EXPECT_EQ(utf8.message(),
            "malformed JSON at line 2, column 9: invalid UTF-8 (byte \\xFF); "
            "JSON text must be UTF-8");
  EXPECT_EQ(TextPosition("ab\ncd", 4), "line 2, column 2");
}

// cpp-httplib decodes the path before routing: a handler sees the bytes of
// `%FF`, so the checks above (not a decoder of our own) are what refuse
// them, and the answer is a 400 with valid JSON, not a 500.
TEST(PathSegmentTest, HttplibDecodesSegmentsAndTheCheckAnswers400) {
  httplib::Server server;
  std::string seen;
  server.Get(R"(/projects/([^/]+)/x)",
             [&](const httplib::Request& req, httplib::Response& res) {
               seen = req.matches[1];
               Status s = ValidateProjectId("project", seen);
               if (!s.ok()) {
                 WriteError(res, 400, "INVALID_ARGUMENT", s.message());
               } else {
                 WriteJson(res, 200, {{"project", seen}});
               }
             });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread thread([&] { server.listen_after_bind(); });
  httplib::Client client("127.0.0.1", port);
  auto bad = client.Get("/projects/p%FF/x");
  auto ok = client.Get("/projects/p%61/x");
  auto slash = client.Get("/projects/a%2Fb/x");
  server.stop();
  thread.join();
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  nlohmann::json body = nlohmann::json::parse(bad->body);
  EXPECT_EQ(body["error"]["message"].get<std::string>().rfind(
                "project: 'p\\xFF' is not a project id", 0),
            0u)
      << bad->body;
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(nlohmann::json::parse(ok->body)["project"], "pa");
  ASSERT_TRUE(slash);  // %2F is a '/' before routing: no route matches
  EXPECT_EQ(slash->status, 404);
}

}  // namespace
}  // namespace multislice::control
