// Issue 12: no request can crash the controller, wedge it, or get a 5xx.
//
// A controller runs in-process on loopback with two fake agents (so that
// some creates are provisioned), and a bounded, seeded corpus is sent over
// real HTTP: structured bodies (every field x every JSON type, 16,000-deep
// nesting, bad UTF-8, truncations, BOMs...), path and query oddities of
// every route, random mutations, raw bytes and half-sent requests. Every
// answer must be below 500 and every error a google.rpc.Status; afterwards
// the store must still take writes. Then one regression test per defect
// of the issue, each the exact reproduction.
//
// MULTISLICE_API_FUZZ_SEED replays another seed; MULTISLICE_API_FUZZ_SECONDS
// changes the time budget of the corpus (default kCorpusSeconds);
// MULTISLICE_API_FUZZ_VERBOSE=1 prints every request and its answer.
#include "control/api_fuzz.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/temp_dir.h"
#include "control/api_types.h"
#include "control/control_testing.h"
#include "control/controller.h"
#include "control/fake_agent.h"
#include "control/validation.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using fuzz::Corpus;
using fuzz::CorpusOptions;
using fuzz::FuzzAnswer;
using fuzz::FuzzRequest;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using testing::WaitFor;

const char kToken[] = "api-fuzz-test-token";
const char kQrs[] =
    "/v2alpha1/projects/proj/locations/us-test1-a/queuedResources";
constexpr uint32_t kDefaultSeed = 12012;
constexpr double kCorpusSeconds = 14;
constexpr size_t kMaxRandomRequests = 20000;
constexpr int kRawRandomCases = 200;
constexpr size_t kMaxFailuresShown = 25;
// Raw cases: connections at once, and how long a server may take to
// answer before the client ends its side (an incomplete request's end).
constexpr int kRawThreads = 8;
constexpr std::chrono::milliseconds kRawEndAfter{100};

uint32_t Seed() {
  const char* text = std::getenv("MULTISLICE_API_FUZZ_SEED");
  return text != nullptr && *text ? static_cast<uint32_t>(std::stoul(text))
                                  : kDefaultSeed;
}

double CorpusSeconds() {
  const char* text = std::getenv("MULTISLICE_API_FUZZ_SECONDS");
  return text != nullptr && *text ? std::stod(text) : kCorpusSeconds;
}

// MULTISLICE_API_FUZZ_VERBOSE=1: every request's label, status and answer.
bool Verbose() {
  static const bool verbose =
      std::getenv("MULTISLICE_API_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

// The create body of SimpleBody() with `member` (raw JSON text, e.g.
// "\"bogus\":[[...]]") added first.
std::string SimpleBodyWith(const std::string& member) {
  return "{" + member + "," + fuzz::SimpleBody().substr(1);
}

// SimpleBody() with tpu.node_spec[0].node.description set to `raw` (JSON
// text).
std::string BodyWithDescription(const std::string& raw) {
  std::string body = fuzz::SimpleBody();
  const std::string node = "\"node\":{";
  body.insert(body.find(node) + node.size(), "\"description\":" + raw + ",");
  return body;
}

class ApiFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    ControllerOptions options;
    options.data_dir = dir_.path() + "/data";
    options.token = kToken;
    options.heartbeat_interval = std::chrono::milliseconds(100);
    Result<std::unique_ptr<Controller>> c = Controller::Start(options);
    ASSERT_TRUE(c.ok()) << c.status().message();
    controller_ = std::move(*c);
    port_ = controller_->port();
    // One answer from each listener: both serve, so a Stop() right after
    // this cannot race their start (cpp-httplib's stop() does nothing to
    // a server whose listen loop has not begun yet, and the join hangs).
    for (int port : {port_, controller_->agent_port()}) {
      ASSERT_TRUE(fuzz::SendBytes(port, "GET / HTTP/1.1\r\n\r\n").answered);
    }
  }
  void TearDown() override {
    agents_.clear();  // agents first: they call the controller
    controller_.reset();
  }

  void AddAgents(int n) {
    const std::string url = "http://127.0.0.1:" + std::to_string(port_);
    for (int i = 0; i < n; ++i) {
      agents_.push_back(
          std::make_unique<testing::FakeAgent>(url, kToken, "cpu-2"));
      testing::FakeAgent& a = *agents_.back();
      ASSERT_TRUE(WaitFor([&] { return !a.host_id().empty(); }));
    }
  }

  FuzzAnswer Call(const std::string& method, const std::string& target,
                  const std::string& body = "") {
    FuzzRequest r;
    r.label = method + " " + target;
    r.method = method;
    r.target = target;
    r.body = body;
    return fuzz::Send(port_, kToken, r);
  }
  FuzzAnswer Create(const std::string& id, const std::string& body) {
    return Call("POST", std::string(kQrs) + "?queued_resource_id=" + id, body);
  }
  std::string State(const std::string& id) {
    const FuzzAnswer a = Call("GET", std::string(kQrs) + "/" + id);
    const json qr = json::parse(a.body, nullptr, false);
    if (a.status != 200 || !qr.is_object() || !qr.contains("state")) {
      return "<" + std::to_string(a.status) + ">";
    }
    return qr["state"].value("state", "");
  }

  // After the corpus: the store still takes writes (a create, a get, a
  // forced delete, the same id again: defect 1), the internal API answers,
  // and no agent was taken for lost.
  void ExpectStillServingAndWritable() {
    EXPECT_EQ(Create("fz-after", fuzz::SimpleBody()).status, 200);
    const FuzzAnswer got = Call("GET", std::string(kQrs) + "/fz-after");
    EXPECT_EQ(got.status, 200) << got.body;
    EXPECT_NE(got.body.find("queuedResources/fz-after"), std::string::npos);
    EXPECT_EQ(Call("DELETE", std::string(kQrs) + "/fz-after?force=true").status,
              200);
    EXPECT_TRUE(WaitFor([&] { return State("fz-after") == "<404>"; }))
        << State("fz-after");
    EXPECT_EQ(Create("fz-after", fuzz::SimpleBody()).status, 200);
    for (const char* internal :
         {"/internal/v1/hosts", "/internal/v1/capacity",
          "/internal/v1/queuedResources/fz-after/operations"}) {
      EXPECT_EQ(Call("GET", internal).status, 200) << internal;
    }
    const json hosts =
        json::parse(Call("GET", "/internal/v1/hosts").body, nullptr, false);
    ASSERT_TRUE(hosts.is_object() && hosts["hosts"].is_array());
    for (const auto& a : agents_) {
      for (const json& h : hosts["hosts"]) {
        if (h.value("id", "") != a->host_id()) continue;
        EXPECT_FALSE(h.value("lost", false)) << h.dump();
      }
    }
  }

  TempDir dir_;
  std::unique_ptr<Controller> controller_;
  int port_ = 0;
  std::vector<std::unique_ptr<testing::FakeAgent>> agents_;
};

// ------------------------------------------------------------- the fuzz

// What the corpus saw: statuses, failures, the slowest answer.
struct FuzzStats {
  std::map<int, int> statuses;  // 0: no answer
  int sent = 0;
  int skipped = 0;  // left out when the time budget ran out
  std::vector<std::string> failures;
  std::vector<std::string> raw_echoes;  // messages holding U+FFFD
  double slowest_ms = 0;
  std::string slowest;

  void Fail(const std::string& what) {
    if (failures.size() < kMaxFailuresShown) ADD_FAILURE() << what;
    failures.push_back(what);
  }
};

class ApiFuzzRun {
 public:
  ApiFuzzRun(int port, FuzzStats& stats, Clock::time_point deadline)
      : port_(port), stats_(stats), deadline_(deadline) {}

  bool TimeLeft() const { return Clock::now() < deadline_; }
  Clock::time_point deadline() const { return deadline_; }

  void Run(const FuzzRequest& request) {
    const FuzzAnswer answer = fuzz::Send(port_, kToken, request);
    Record(request.label, answer);
    if (Verbose()) {
      std::printf("    %d %s: %s\n", answer.status, request.label.c_str(),
                  fuzz::Printable(answer.body, 160).c_str());
    }
    const std::string problem = fuzz::CheckApiAnswer(request, answer);
    if (!problem.empty()) {
      stats_.Fail(request.label + ": " + problem + "\n  request: " +
                  fuzz::Printable(fuzz::Serialize(request, kToken), 400));
    } else if (answer.status >= 400 &&
               fuzz::ErrorMessage(answer).find("\xEF\xBF\xBD") !=
                   std::string::npos &&
               stats_.raw_echoes.size() < 10) {
      stats_.raw_echoes.push_back(request.label + ": " +
                                  fuzz::ErrorMessage(answer).substr(0, 160));
    }
  }

  // Runs `requests` until the deadline.
  void RunAll(const char* phase, const std::vector<FuzzRequest>& requests) {
    size_t i = 0;
    RunGenerated(phase, requests.size(), [&] { return requests[i++]; });
  }

  // Runs `count` requests made by `next`, until the deadline.
  void RunGenerated(const char* phase, size_t count,
                    const std::function<FuzzRequest()>& next) {
    const auto start = Clock::now();
    size_t ran = 0;
    for (; ran < count && TimeLeft(); ++ran) Run(next());
    stats_.skipped += static_cast<int>(count - ran);
    PrintPhase(phase, ran, count, start);
  }

  // Raw bytes, kRawThreads connections at a time: an answer, when one
  // comes, must be below 500, and no connection may hang.
  void RunRaw(const std::vector<std::string>& cases) {
    const auto start = Clock::now();
    std::vector<FuzzAnswer> answers(cases.size());
    std::vector<char> ran(cases.size(), 0);
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kRawThreads; ++t) {
      threads.emplace_back([&] {
        for (size_t i = next++; i < cases.size() && TimeLeft(); i = next++) {
          answers[i] = fuzz::SendBytes(port_, cases[i], fuzz::kAnswerTimeout,
                                       kRawEndAfter);
          ran[i] = 1;
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < cases.size(); ++i) {
      if (!ran[i]) continue;
      CheckRaw(cases[i], answers[i]);
    }
    const size_t count = std::count(ran.begin(), ran.end(), 1);
    stats_.skipped += static_cast<int>(cases.size() - count);
    PrintPhase("raw", count, cases.size(), start);
  }

 private:
  static void PrintPhase(const char* phase, size_t ran, size_t count,
                         Clock::time_point start) {
    std::printf("  %-9s %5zu of %5zu requests in %6.0f ms\n", phase, ran, count,
                std::chrono::duration<double, std::milli>(Clock::now() - start)
                    .count());
  }

  void CheckRaw(const std::string& bytes, const FuzzAnswer& answer) {
    Record("raw bytes", answer);
    const bool hung =
        !answer.answered && answer.failure.rfind("timeout", 0) == 0;
    if (hung || answer.status >= 500) {
      stats_.Fail(
          "raw bytes: " +
          (hung ? answer.failure : "status " + std::to_string(answer.status)) +
          "\n  request: " + fuzz::Printable(bytes, 400));
    }
  }

  void Record(const std::string& label, const FuzzAnswer& answer) {
    ++stats_.sent;
    ++stats_.statuses[answer.answered ? answer.status : 0];
    if (answer.ms > stats_.slowest_ms) {
      stats_.slowest_ms = answer.ms;
      stats_.slowest = label;
    }
  }

  int port_;
  FuzzStats& stats_;
  Clock::time_point deadline_;
};

// Half-sent requests (the client goes away) and slow ones (sent in pieces).
void RunPartialRequests(int port, Corpus& corpus, FuzzStats& stats) {
  const std::vector<FuzzRequest> bodies = corpus.BodyCases();
  for (int i = 0; i < 30; ++i) {
    const std::string bytes =
        fuzz::Serialize(bodies[i % bodies.size()], kToken);
    fuzz::SendAndAbandon(port, bytes.substr(0, corpus.rng()() % bytes.size()));
  }
  for (int i = 0; i < 4; ++i) {
    const FuzzRequest& request = bodies[i];
    const FuzzAnswer answer =
        fuzz::SendSlowly(port, fuzz::Serialize(request, kToken), 3,
                         std::chrono::milliseconds(40));
    const std::string problem = fuzz::CheckApiAnswer(request, answer);
    if (!problem.empty()) stats.Fail("slow " + request.label + ": " + problem);
  }
  std::printf("  %-9s %5d abandoned, 4 slow\n", "partial", 30);
}

void PrintStats(const FuzzStats& stats, uint32_t seed, double seconds) {
  std::printf(
      "api_fuzz: seed %u, %d requests in %.1f s (%d left out by the "
      "time budget), %zu failures\n  statuses:",
      seed, stats.sent, seconds, stats.skipped, stats.failures.size());
  for (const auto& [status, count] : stats.statuses) {
    std::printf(" %s%d x%d", status == 0 ? "none:" : "", status, count);
  }
  std::printf("\n  slowest: %.0f ms (%s)\n", stats.slowest_ms,
              stats.slowest.c_str());
  for (const std::string& echo : stats.raw_echoes) {
    std::printf("  note, raw bytes echoed as U+FFFD: %s\n", echo.c_str());
  }
}

// Every phase of the corpus, within CorpusSeconds().
void RunCorpus(Corpus& corpus, int port, int agent_port, FuzzStats& stats) {
  const auto deadline =
      Clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(CorpusSeconds() * 1000));
  ApiFuzzRun run(port, stats, deadline);
  run.RunAll("body", corpus.BodyCases());
  run.RunAll("path", corpus.PathCases());
  run.RunAll("query", corpus.QueryCases());
  run.RunAll("internal", corpus.InternalCases());
  run.RunRaw(corpus.RawCases(kToken, kRawRandomCases));
  // The agents' channel: its own port, threads and timeouts.
  ApiFuzzRun agent_run(agent_port, stats, deadline);
  agent_run.RunAll("agents", corpus.InternalCases());
  agent_run.RunRaw(corpus.RawCases(kToken, kRawRandomCases / 4));
  RunPartialRequests(port, corpus, stats);
  run.RunGenerated("random", kMaxRandomRequests,
                   [&] { return corpus.RandomRequest(); });
}

TEST_F(ApiFuzzTest, NoRequestCrashesWedgesOrGets5xx) {
  AddAgents(2);
  ASSERT_EQ(Create("fz-active", fuzz::SimpleBody()).status, 200);
  ASSERT_TRUE(WaitFor([&] { return State("fz-active") == "ACTIVE"; }));
  const uint32_t seed = Seed();
  std::printf("api_fuzz seed %u (MULTISLICE_API_FUZZ_SEED replays one)\n",
              seed);
  CorpusOptions options;
  options.existing_ids = {"fz-active"};
  for (const auto& a : agents_) {
    options.hosts.push_back({a->host_id(), a->credential()});
  }
  Corpus corpus(options, seed);
  FuzzStats stats;
  const auto start = Clock::now();
  RunCorpus(corpus, port_, controller_->agent_port(), stats);
  PrintStats(stats, seed,
             std::chrono::duration<double>(Clock::now() - start).count());
  EXPECT_TRUE(stats.failures.empty())
      << stats.failures.size() << " answers broke the rules (seed " << seed
      << ")";
  ExpectStillServingAndWritable();
}

// ---------------------------------------------------- the issue's defects

// Defect 1: 'p%FF' as the project of a create answered 500 and left the
// store's transaction open, so every later write failed.
TEST_F(ApiFuzzTest, Defect1ProjectNotUtf8Is400AndWritesStillWork) {
  const std::string parent = "/v2alpha1/projects/p/locations/local-a";
  const FuzzAnswer bad = Call("POST",
                              "/v2alpha1/projects/p%FF/locations/local-a/"
                              "queuedResources?queued_resource_id=x",
                              fuzz::SimpleBody());
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(fuzz::ErrorMessage(bad).rfind("project: ", 0), 0u) << bad.body;
  const std::string create = parent + "/queuedResources?queued_resource_id=";
  EXPECT_EQ(Call("POST", create + "x", fuzz::SimpleBody()).status, 200);
  EXPECT_EQ(Call("DELETE", parent + "/queuedResources/x?force=true").status,
            200);
  const std::string x = parent + "/queuedResources/x";
  EXPECT_TRUE(WaitFor([&] { return Call("GET", x).status == 404; }));
  EXPECT_EQ(Call("POST", create + "x", fuzz::SimpleBody()).status, 200);
  EXPECT_EQ(Call("POST", create + "y", fuzz::SimpleBody()).status, 200);
  EXPECT_EQ(Call("GET", parent + "/queuedResources/y").status, 200);
}

// Defect 2: arrays nested 16,000 deep in an unknown field (32 KB)
// overflowed the parser's stack and killed the controller.
TEST_F(ApiFuzzTest, Defect2DeepNestingIs400NamingTheLimit) {
  const std::string body =
      SimpleBodyWith("\"bogus\":" + fuzz::DeepArrays(16000));
  EXPECT_GE(body.size(), 32000u);
  const FuzzAnswer a = Create("deep", body);
  EXPECT_EQ(a.status, 400) << a.body;
  const std::string limit =
      "nested more than " + std::to_string(kMaxJsonDepth) + " deep";
  EXPECT_NE(fuzz::ErrorMessage(a).find(limit), std::string::npos) << a.body;
  EXPECT_EQ(Call("GET", kQrs).status, 200);
  EXPECT_EQ(Create("after-deep", fuzz::SimpleBody()).status, 200);
}

// Defect 8, each case of the issue.
TEST_F(ApiFuzzTest, Defect8InvalidUtf8InABodyIs400) {
  const FuzzAnswer a = Create("utf8", BodyWithDescription("\"\xC3\x28\""));
  EXPECT_EQ(a.status, 400) << a.body;
  EXPECT_NE(fuzz::ErrorMessage(a).find("UTF-8"), std::string::npos) << a.body;
}

TEST_F(ApiFuzzTest, Defect8NumberOutOfRangeIs400) {
  std::string body = fuzz::SimpleBody();
  body.insert(1, "\"queueing_policy\":{\"valid_until_duration\":1e999999},");
  const FuzzAnswer a = Create("huge", body);
  EXPECT_EQ(a.status, 400) << a.body;
  EXPECT_NE(fuzz::ErrorMessage(a).find("'1e999999'"), std::string::npos)
      << a.body;
}

// The message quotes the id cut at 64 characters, never inside 'é'.
TEST_F(ApiFuzzTest, Defect8LongIdMessageIsValidUtf8) {
  const std::string id = std::string(79, 'a') + "%C3%A9";
  for (const FuzzAnswer& a : {Create(id, fuzz::SimpleBody()),
                              Call("GET", std::string(kQrs) + "/" + id)}) {
    EXPECT_EQ(a.status, 400) << a.body;
    const std::string message = fuzz::ErrorMessage(a);
    EXPECT_TRUE(IsValidUtf8(message)) << a.body;
    EXPECT_EQ(message.find("\xEF\xBF\xBD"), std::string::npos) << message;
    EXPECT_NE(message.find("queued_resource"), std::string::npos) << message;
  }
}

TEST_F(ApiFuzzTest, Defect8PercentFFInPathsAndPageTokenIs400) {
  for (const char* method : {"GET", "DELETE"}) {
    const FuzzAnswer a = Call(method, std::string(kQrs) + "/%FF");
    EXPECT_EQ(a.status, 400) << method << " " << a.body;
    EXPECT_EQ(fuzz::ErrorMessage(a).rfind("queued_resource: ", 0), 0u)
        << a.body;
  }
  const FuzzAnswer page = Call("GET", std::string(kQrs) + "?pageToken=%FF");
  EXPECT_EQ(page.status, 400) << page.body;
  EXPECT_EQ(fuzz::ErrorMessage(page).rfind("page_token: ", 0), 0u) << page.body;
}

TEST_F(ApiFuzzTest, Defect8DotsHyphenAndPercentIdsAre400) {
  for (const std::string id : {".", "..", "-x", "%"}) {
    const FuzzAnswer created = Create(id, fuzz::SimpleBody());
    EXPECT_EQ(created.status, 400) << id << ": " << created.body;
    EXPECT_EQ(fuzz::ErrorMessage(created).rfind("queued_resource_id: ", 0), 0u)
        << created.body;
    for (const char* method : {"GET", "DELETE"}) {
      const FuzzAnswer a = Call(method, std::string(kQrs) + "/" + id);
      EXPECT_EQ(a.status, 400) << method << " " << id << ": " << a.body;
    }
  }
}

TEST_F(ApiFuzzTest, Defect8ProjectAndZoneSegmentsAreValidated) {
  for (const std::string bad : {"p%FF", ".."}) {
    const std::string as_project =
        "/v2alpha1/projects/" + bad + "/locations/us-test1-a/queuedResources";
    const std::string as_zone =
        "/v2alpha1/projects/proj/locations/" + bad + "/queuedResources";
    for (const auto& [base, field] : {std::pair{as_project, "project: "},
                                      std::pair{as_zone, "location: "}}) {
      for (const FuzzAnswer& a :
           {Call("POST", base + "?queued_resource_id=ok", fuzz::SimpleBody()),
            Call("GET", base), Call("GET", base + "/ok")}) {
        EXPECT_EQ(a.status, 400) << base << ": " << a.body;
        EXPECT_EQ(fuzz::ErrorMessage(a).rfind(field, 0), 0u) << a.body;
      }
    }
  }
}

TEST_F(ApiFuzzTest, Defect8DescriptionOfAnotherJsonTypeIs400) {
  for (const char* raw : {"7", "-1.5", "true", "null", "[]", "{}", "[\"d\"]"}) {
    const FuzzAnswer a = Create("described", BodyWithDescription(raw));
    EXPECT_EQ(a.status, 400) << raw << ": " << a.body;
    EXPECT_NE(fuzz::ErrorMessage(a).find("node.description: expected a string"),
              std::string::npos)
        << a.body;
  }
}

TEST_F(ApiFuzzTest, Defect8ImpossibleTimestampsAre400) {
  for (const auto& [field, time] :
       {std::pair{"valid_after_time", "2024-02-30T00:00:00Z"},
        std::pair{"valid_until_time", "2024-01-01T00:00:60Z"}}) {
    std::string body = fuzz::SimpleBody();
    body.insert(1, "\"queueing_policy\":{\"" + std::string(field) + "\":\"" +
                       time + "\"},");
    const FuzzAnswer a = Create("timed", body);
    EXPECT_EQ(a.status, 400) << time << ": " << a.body;
    const std::string message = fuzz::ErrorMessage(a);
    EXPECT_EQ(message.rfind("queueing_policy." + std::string(field), 0), 0u)
        << message;
    EXPECT_NE(message.find(time), std::string::npos) << message;
  }
}

// ------------------------------------------------ found by this corpus

// A heartbeat's body is parsed without the depth bound that every other
// body has (CheckJsonText), and keeping its workers copies the tree, which
// recurses once per level: workers nested 100,000 deep (200 KB, under the
// 1 MiB body limit) overflowed the HTTP thread's stack and killed the
// controller (SIGSEGV in basic_json's copy constructor, called from
// HostApi::HandleHeartbeat). The request, with the host's own secret:
//   POST /internal/v1/hosts/host-1:heartbeat
//   {"workers":[[[[...100,000 levels...]]]]}
// Whether the controller survives it, and answers 400 as for any body
// nested too deep.
bool DeepHeartbeatIsRefused() {
  TempDir dir;
  ControllerOptions options;
  options.data_dir = dir.path() + "/data";
  options.token = kToken;
  Result<std::unique_ptr<Controller>> c = Controller::Start(options);
  if (!c.ok()) return false;
  const int port = (*c)->port();
  const FuzzAnswer reg = fuzz::Send(
      port, kToken,
      fuzz::MakeRequest("register", "POST", "/internal/v1/hosts:register",
                        R"({"hostname": "h", "zone": "us-test1-a",
                            "acceleratorType": "cpu-1",
                            "agentAddress": "127.0.0.1:1",
                            "workdir": "/nonexistent"})"));
  const json host = json::parse(reg.body, nullptr, false);
  if (reg.status != 200 || !host.is_object()) return false;
  FuzzRequest beat = fuzz::MakeRequest(
      "deep heartbeat", "POST",
      "/internal/v1/hosts/" + host.value("hostId", "") + ":heartbeat",
      "{\"workers\":[" + fuzz::DeepArrays(100000) + "]}");
  beat.token = host.value("hostSecret", "");
  const FuzzAnswer a = fuzz::Send(port, kToken, beat);
  std::fprintf(stderr, "heartbeat nested 100000 deep: %d %s\n", a.status,
               a.body.c_str());
  const std::string limit =
      "nested more than " + std::to_string(kMaxJsonDepth) + " deep";
  return a.status == 400 &&
         fuzz::ErrorMessage(a).find(limit) != std::string::npos &&
         fuzz::Send(port, kToken,
                    fuzz::MakeRequest("hosts", "GET", "/internal/v1/hosts"))
                 .status == 200;
}

// In a child process, so that the crash fails this test alone.
TEST(ApiFuzzDeathTest, HeartbeatWithDeeplyNestedWorkersIs400) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(::_exit(DeepHeartbeatIsRefused() ? 0 : 1),
              ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace multislice::control
