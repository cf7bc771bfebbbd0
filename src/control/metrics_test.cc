// The controller's /metrics (metrics.h): the exposition text read back by
// a parser of its own here (the format's grammar, not the writer's code),
// histograms against counts made here from the same observations, hostile
// label values, bounded series, and a controller's numbers against its
// store, its API and the requests made to it.
#include "control/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <regex>

#include "control/metrics_fixture.h"
#include "control/store.h"
#include "control/validation.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using testing::CpuBody;
using testing::WaitFor;

// ---------------------------------------------------------------- parser

using Labels = std::map<std::string, std::string>;

struct ParsedSample {
  std::string name;
  Labels labels;
  double value = 0;
};

struct Parsed {
  std::map<std::string, std::string> types;  // family -> type
  std::map<std::string, std::string> helps;  // family -> help (unescaped)
  std::vector<ParsedSample> samples;

  // The samples named `name` whose labels include `match`.
  std::vector<ParsedSample> Find(const std::string& name,
                                 const Labels& match = {}) const {
    std::vector<ParsedSample> out;
    for (const ParsedSample& s : samples) {
      bool all = s.name == name;
      for (const auto& [k, v] : match) {
        auto it = s.labels.find(k);
        all = all && it != s.labels.end() && it->second == v;
      }
      if (all) out.push_back(s);
    }
    return out;
  }
  std::optional<double> Value(const std::string& name,
                              const Labels& labels) const {
    for (const ParsedSample& s : samples) {
      if (s.name == name && s.labels == labels) return s.value;
    }
    return std::nullopt;
  }
};

bool IsNameChar(char c, bool first) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
         (!first && std::isdigit(static_cast<unsigned char>(c)));
}

// Reads a metric or label name at text[*at]; "" when there is none.
std::string ReadName(const std::string& text, size_t* at) {
  const size_t begin = *at;
  while (*at < text.size() && IsNameChar(text[*at], *at == begin)) ++*at;
  return text.substr(begin, *at - begin);
}

// Reads a quoted label value at text[*at] (the opening quote), undoing
// \\, \" and \n; nullopt on any other escape or an unterminated value.
std::optional<std::string> ReadQuoted(const std::string& text, size_t* at) {
  if (*at >= text.size() || text[*at] != '"') return std::nullopt;
  std::string value;
  for (++*at; *at < text.size(); ++*at) {
    const char c = text[*at];
    if (c == '"') {
      ++*at;
      return value;
    }
    if (c == '\n') return std::nullopt;
    if (c != '\\') {
      value.push_back(c);
      continue;
    }
    if (++*at >= text.size()) return std::nullopt;
    const char e = text[*at];
    if (e == 'n') {
      value.push_back('\n');
    } else if (e == '\\' || e == '"') {
      value.push_back(e);
    } else {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::optional<double> ReadValue(const std::string& word) {
  if (word == "+Inf") return INFINITY;
  if (word == "-Inf") return -INFINITY;
  if (word == "NaN") return NAN;
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  if (word.empty() || *end != '\0') return std::nullopt;
  return v;
}

// One sample line; nullopt when it breaks the grammar.
std::optional<ParsedSample> ParseSampleLine(const std::string& line) {
  ParsedSample s;
  size_t at = 0;
  s.name = ReadName(line, &at);
  if (s.name.empty()) return std::nullopt;
  if (at < line.size() && line[at] == '{') {
    ++at;
    while (at < line.size() && line[at] != '}') {
      const std::string label = ReadName(line, &at);
      if (label.empty() || at >= line.size() || line[at] != '=') {
        return std::nullopt;
      }
      ++at;
      std::optional<std::string> value = ReadQuoted(line, &at);
      if (!value || s.labels.count(label)) return std::nullopt;
      s.labels[label] = *value;
      if (at < line.size() && line[at] == ',') ++at;
    }
    if (at >= line.size()) return std::nullopt;
    ++at;  // '}'
  }
  if (at >= line.size() || line[at] != ' ') return std::nullopt;
  std::optional<double> value = ReadValue(line.substr(at + 1));
  if (!value) return std::nullopt;
  s.value = *value;
  return s;
}

// The family a sample belongs to: its name, or without a histogram's
// suffix when that names a histogram family.
std::string FamilyOf(const std::string& name, const Parsed& p) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string sfx = suffix;
    if (name.size() > sfx.size() &&
        name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
      const std::string base = name.substr(0, name.size() - sfx.size());
      auto it = p.types.find(base);
      if (it != p.types.end() && it->second == "histogram") return base;
    }
  }
  return name;
}

// Parses the text format 0.0.4, failing the test at the first line that
// breaks it (a sample before its family's # TYPE included).
Parsed Parse(const std::string& text) {
  Parsed p;
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "no final newline";
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      size_t at = 7;
      const std::string name = ReadName(line, &at);
      EXPECT_FALSE(name.empty()) << line;
      EXPECT_TRUE(at < line.size() && line[at] == ' ') << line;
      const std::string rest = at < line.size() ? line.substr(at + 1) : "";
      if (line[2] == 'T') {
        EXPECT_TRUE(rest == "counter" || rest == "gauge" || rest == "histogram")
            << line;
        EXPECT_EQ(p.types.count(name), 0u) << "two # TYPE for " << name;
        p.types[name] = rest;
      } else {
        std::string help;
        for (size_t i = 0; i < rest.size(); ++i) {
          if (rest[i] == '\\' && i + 1 < rest.size()) {
            help.push_back(rest[++i] == 'n' ? '\n' : rest[i]);
          } else {
            help.push_back(rest[i]);
          }
        }
        p.helps[name] = help;
      }
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::optional<ParsedSample> s = ParseSampleLine(line);
    EXPECT_TRUE(s.has_value()) << "not a sample line: " << line;
    if (!s) continue;
    EXPECT_EQ(p.types.count(FamilyOf(s->name, p)), 1u)
        << s->name << " before its # TYPE";
    p.samples.push_back(*s);
  }
  return p;
}

// ---------------------------------------------------------------- units

TEST(ExpositionTest, HostileLabelValuesReadBackAsValidUtf8) {
  // Valid UTF-8 reads back byte for byte; a byte that starts no valid
  // sequence reads back as U+FFFD.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plain", "plain"},
      {"quote\"inside", "quote\"inside"},
      {"back\\slash", "back\\slash"},
      {"new\nline", "new\nline"},
      {"\\\"\n\\n", "\\\"\n\\n"},
      {"x\"} 1\nevil{a=\"b\"} 2", "x\"} 1\nevil{a=\"b\"} 2"},
      {"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80",
       "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"},
      {"bad\xFF", "bad\xEF\xBF\xBD"},
      {"cut\xE2\x82", "cut\xEF\xBF\xBD\xEF\xBF\xBD"},
      {std::string("nul\0byte", 8), std::string("nul\0byte", 8)},
      {"", ""}};
  CounterFamily family("hostile_total", "Help with \\ and\na newline.",
                       {"value", "index"});
  for (size_t i = 0; i < cases.size(); ++i) {
    family.Add({cases[i].first, std::to_string(i)}, static_cast<double>(i + 1));
  }
  ExpositionWriter out;
  family.Write(out);
  const Parsed p = Parse(out.text());
  EXPECT_EQ(p.helps.at("hostile_total"), "Help with \\ and\na newline.");
  ASSERT_EQ(p.samples.size(), cases.size()) << out.text();
  for (size_t i = 0; i < cases.size(); ++i) {
    std::optional<double> v =
        p.Value("hostile_total",
                {{"value", cases[i].second}, {"index", std::to_string(i)}});
    ASSERT_TRUE(v.has_value()) << "case " << i << " in\n" << out.text();
    EXPECT_EQ(*v, static_cast<double>(i + 1));
    EXPECT_TRUE(IsValidUtf8(cases[i].second));
  }
}

TEST(ExpositionTest, SampleValuesReadBackExactly) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(-30, 30);
  for (int i = 0; i < 1000; ++i) {
    const double x = std::pow(10.0, exponent(rng)) * (i % 2 ? -1 : 1);
    EXPECT_EQ(std::strtod(FormatSampleValue(x).c_str(), nullptr), x);
  }
  for (double n : {0.0, 1.0, 42.0, 1e15, -7.0, 9007199254740991.0}) {
    const std::string text = FormatSampleValue(n);
    EXPECT_EQ(text.find_first_of(".e"), std::string::npos) << text;
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), n);
  }
  EXPECT_EQ(FormatSampleValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatSampleValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatSampleValue(NAN), "NaN");
}

TEST(HistogramTest, BucketsAreCumulativeAndCountSumAgree) {
  const std::vector<double> bounds = {0.001, 0.01, 0.1, 1, 10};
  HistogramFamily family("latency_seconds", "Latency.", {"route"}, bounds);
  std::mt19937_64 rng(11);
  std::exponential_distribution<double> draw(5.0);
  std::map<std::string, std::vector<double>> observed;
  for (int i = 0; i < 5000; ++i) {
    const std::string route = i % 3 ? "/a" : "/b";
    // Every tenth observation exactly on a bound (le is inclusive).
    const double v = i % 10 == 0 ? bounds[i % bounds.size()] : draw(rng) * 3;
    family.Observe({route}, v);
    observed[route].push_back(v);
  }
  ExpositionWriter out;
  family.Write(out);
  const Parsed p = Parse(out.text());
  EXPECT_EQ(p.types.at("latency_seconds"), "histogram");
  for (const auto& [route, values] : observed) {
    double previous = 0;
    for (double bound : bounds) {
      const int64_t at_most = std::count_if(
          values.begin(), values.end(), [&](double v) { return v <= bound; });
      const std::vector<ParsedSample> b =
          p.Find("latency_seconds_bucket",
                 {{"route", route}, {"le", FormatSampleValue(bound)}});
      ASSERT_EQ(b.size(), 1u) << route << " le " << bound;
      EXPECT_EQ(b[0].value, static_cast<double>(at_most));
      EXPECT_GE(b[0].value, previous);
      previous = b[0].value;
    }
    const double n = static_cast<double>(values.size());
    EXPECT_EQ(
        *p.Value("latency_seconds_bucket", {{"route", route}, {"le", "+Inf"}}),
        n);
    EXPECT_EQ(*p.Value("latency_seconds_count", {{"route", route}}), n);
    double sum = 0;
    for (double v : values) sum += v;
    EXPECT_NEAR(*p.Value("latency_seconds_sum", {{"route", route}}), sum,
                1e-9 * sum);
  }
}

TEST(FamilyTest, SeriesAreBoundedAndNothingIsLost) {
  CounterFamily family("paths_total", "Paths.", {"path"});
  const int distinct = 1000;
  for (int i = 0; i < distinct; ++i) family.Add({"/p/" + std::to_string(i)});
  ExpositionWriter out;
  family.Write(out);
  const Parsed p = Parse(out.text());
  EXPECT_EQ(p.samples.size(), kMaxSeriesPerFamily);
  double total = 0;
  for (const ParsedSample& s : p.samples) total += s.value;
  EXPECT_EQ(total, distinct);
  EXPECT_EQ(*p.Value("paths_total", {{"path", "other"}}),
            distinct - static_cast<double>(kMaxSeriesPerFamily - 1));
}

// The request as cpp-httplib's router leaves it after matching `pattern`.
httplib::Request Routed(const std::string& method, const std::string& path,
                        const std::string& pattern) {
  httplib::Request req;
  req.method = method;
  req.path = path;
  std::regex_match(req.path, req.matches, std::regex(pattern));
  return req;
}

TEST(RequestLabelsTest, RoutesNeverCarryTheClientsBytes) {
  const std::string qr = R"(/(v2alpha1|v2)/projects/([^/]+)/locations/([^/]+))"
                         R"(/queuedResources/([^/:]+):reset)";
  const std::string hostile =
      "/v2/projects/p\"}x/locations/z\n/"
      "queuedResources/evil-id:reset";
  EXPECT_EQ(RouteLabel(Routed("POST", hostile, qr)),
            "/*/projects/*/locations/*/queuedResources/*:reset");
  EXPECT_EQ(RouteLabel(Routed("GET", "/metrics", "/metrics")), "/metrics");
  EXPECT_EQ(RouteLabel(Routed("GET", "/no/such/path", qr)), "other");
  // A group inside another counts once.
  EXPECT_EQ(RouteLabel(Routed("GET", "/a/bc/d", "/a/(b(c))/d")), "/a/*/d");
  EXPECT_EQ(MethodLabel("DELETE"), "DELETE");
  EXPECT_EQ(MethodLabel("BREW"), "other");
  EXPECT_EQ(StatusClassLabel(204), "2xx");
  EXPECT_EQ(StatusClassLabel(404), "4xx");
  EXPECT_EQ(StatusClassLabel(42), "other");
}

// ---------------------------------------------------------- a controller

// A loopback connection to `port` that has sent `bytes`; -1 on failure.
int ConnectAndSend(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::write(fd, bytes.data(), bytes.size()) !=
          static_cast<ssize_t>(bytes.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

const char kToken[] = "metrics-test-token";

class ControllerMetricsTest : public testing::MetricsFixture {
 protected:
  ControllerMetricsTest() : MetricsFixture(kToken) {}

  // GET /metrics on the API port with `token`; the status and the body.
  std::pair<int, std::string> Scrape(const std::string& token = kToken) {
    httplib::Client http(url_);
    http.set_read_timeout(10, 0);
    auto res = http.Get("/metrics", {{"Authorization", "Bearer " + token}});
    if (!res) return {0, ""};
    if (res->status == 200) {
      EXPECT_EQ(res->get_header_value("Content-Type"), kExpositionContentType);
    }
    return {res->status, res->body};
  }
};

TEST_F(ControllerMetricsTest, QueuedResourceCountsEqualTheStore) {
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  StartController(options);
  AddAgent();
  AddAgent();
  ASSERT_EQ(Create("a-reserved", "reserved"), 200);
  ASSERT_EQ(Create("b-on-demand", ""), 200);
  ASSERT_TRUE(WaitFor([&] {
    return State("a-reserved") == "ACTIVE" && State("b-on-demand") == "ACTIVE";
  }));
  // Both hosts held: these wait, expire or are not due yet.
  ASSERT_EQ(Create("c-spot", "spot"), 200);
  ASSERT_EQ(Create("d-best-effort", "best-effort"), 200);
  ASSERT_EQ(Create("e-expires", "", {{"valid_until_duration", "0.2s"}}), 200);
  ASSERT_EQ(Create("f-later", "spot", {{"valid_after_duration", "3600s"}}),
            200);
  ASSERT_TRUE(WaitFor([&] {
    return State("e-expires") == "FAILED" &&
           State("c-spot") == "WAITING_FOR_RESOURCES" &&
           State("d-best-effort") == "WAITING_FOR_RESOURCES";
  }));
  EXPECT_EQ(State("f-later"), "ACCEPTED");
  const auto [status, text] = Scrape();
  ASSERT_EQ(status, 200);
  EXPECT_EQ(Scrape("wrong-token-of-16-chars").first, 401);
  const Parsed p = Parse(text);
  EXPECT_EQ(p.types.at("multislice_queued_resources"), "gauge");

  // Hosts: both held; each beat within the last second.
  EXPECT_EQ(*p.Value("multislice_hosts", {{"state", "USED"}}), 2);
  EXPECT_EQ(*p.Value("multislice_hosts", {{"state", "FREE"}}), 0);
  EXPECT_EQ(*p.Value("multislice_hosts", {{"state", "LOST"}}), 0);
  std::set<std::string> aged;
  for (const ParsedSample& s :
       p.Find("multislice_host_heartbeat_age_seconds")) {
    aged.insert(s.labels.at("host"));
    EXPECT_GE(s.value, 0);
    EXPECT_LT(s.value, 1.0);
  }
  EXPECT_EQ(aged, (std::set<std::string>{agents_[0]->host_id(),
                                         agents_[1]->host_id()}));

  // Every state x tier, against the store once the controller is gone.
  controller_.reset();
  Result<std::unique_ptr<Store>> store =
      Store::Open(dir_.path() + "/data/state.db");
  ASSERT_TRUE(store.ok()) << store.status().message();
  Result<StoreSnapshot> snapshot = (*store)->Load();
  ASSERT_TRUE(snapshot.ok());
  std::map<std::pair<std::string, std::string>, double> stored;
  for (const QueuedResourceRecord& r : snapshot->queued_resources) {
    stored[{StateName(r.state), TierName(r.spec.tier)}] += 1;
  }
  EXPECT_EQ(snapshot->queued_resources.size(), 6u);
  const std::vector<ParsedSample> gauges =
      p.Find("multislice_queued_resources");
  EXPECT_EQ(gauges.size(), 9u * kNumTiers);  // zeros too
  double total = 0;
  for (const ParsedSample& g : gauges) {
    const std::pair<std::string, std::string> key = {g.labels.at("state"),
                                                     g.labels.at("tier")};
    EXPECT_TRUE(ParseStateName(key.first).ok()) << key.first;
    EXPECT_TRUE(ParseTierName(key.second).ok()) << key.second;
    EXPECT_EQ(g.value, stored.count(key) ? stored[key] : 0)
        << key.first << " " << key.second;
    total += g.value;
  }
  EXPECT_EQ(total, 6);
}

TEST_F(ControllerMetricsTest, RequestsAreTimedByRouteNotByPath) {
  StartController();
  const std::string list = std::string(kParent) + "/queuedResources";
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Call("GET", list).status, 200);
  EXPECT_EQ(Call("GET", list + "/nosuch-qr").status, 404);
  EXPECT_EQ(Call("GET", list + "/nosuch-qr-2").status, 404);
  EXPECT_EQ(Call("GET", "/nosuch/path").status, 404);
  EXPECT_EQ(Scrape("wrong-token-of-16-chars").first, 401);
  // A request line that is not HTTP: answered 400 before routing.
  const int fd = ConnectAndSend(controller_->port(), "NOT-HTTP\r\n\r\n");
  ASSERT_GE(fd, 0);
  char answer[512];
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  EXPECT_GT(::read(fd, answer, sizeof(answer)), 0);
  ::close(fd);

  const auto [status, text] = Scrape();
  ASSERT_EQ(status, 200);
  const Parsed p = Parse(text);
  const std::string h = "multislice_http_request_duration_seconds";
  const std::string route = "/*/projects/*/locations/*/queuedResources";
  auto count = [&](const Labels& labels) {
    double n = 0;
    for (const ParsedSample& s : p.Find(h + "_count", labels)) n += s.value;
    return n;
  };
  EXPECT_EQ(count({{"listener", "api"},
                   {"route", route},
                   {"method", "GET"},
                   {"status_class", "2xx"}}),
            3);
  EXPECT_EQ(count({{"route", route + "/*"}, {"status_class", "4xx"}}), 2);
  EXPECT_EQ(count({{"route", "other"}, {"status_class", "4xx"}}), 1);
  // The scrape itself is timed once its answer is written: only the
  // refused one is counted so far.
  EXPECT_EQ(count({{"route", "/metrics"}, {"status_class", "4xx"}}), 1);
  EXPECT_EQ(count({{"route", "/metrics"}, {"status_class", "2xx"}}), 0);
  EXPECT_EQ(count({}), 7);
  EXPECT_EQ(*p.Value("multislice_http_unrouted_requests_total",
                     {{"listener", "api"}, {"code", "400"}}),
            1);
  // No byte of the paths asked for (their ids, project, zone) is a label.
  for (const ParsedSample& s : p.samples) {
    for (const auto& [label, value] : s.labels) {
      for (const char* word : {"nosuch", "/proj/", "us-test1-a", "v2alpha1"}) {
        EXPECT_EQ(value.find(word), std::string::npos) << label << " " << value;
      }
    }
  }
}

TEST_F(ControllerMetricsTest, RepairsAndLostHostsAreCounted) {
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  // The failed host fences its slice for a lease (2 s) after its last
  // heartbeat.
  options.heartbeat_timeout = std::chrono::milliseconds(1000);
  options.fence_margin = std::chrono::milliseconds(0);
  StartController(options);
  for (int i = 0; i < 3; ++i) AddAgent();
  json body = CpuBody(2);
  ASSERT_EQ(
      Call("POST",
           std::string(kParent) + "/queuedResources?queued_resource_id=pair",
           &body)
          .status,
      200);
  ASSERT_TRUE(WaitFor([&] { return State("pair") == "ACTIVE"; }));
  auto value = [&](const std::string& name) {
    std::optional<double> v = Parse(Scrape().second).Value(name, {});
    return v ? *v : -1;
  };
  EXPECT_EQ(value("multislice_repairs_started_total"), 0);
  // The admin fails one of its hosts: that slice is repaired on the third.
  const json workers =
      Call("GET", "/internal/v1/queuedResources/pair/workers").body;
  const std::string host = workers["workers"][0]["hostId"];
  ASSERT_EQ(Call("POST", "/internal/v1/hosts/" + host + ":fail").status, 200);
  ASSERT_TRUE(WaitFor([&] { return State("pair") != "ACTIVE"; }));
  ASSERT_TRUE(WaitFor([&] { return State("pair") == "ACTIVE"; },
                      std::chrono::seconds(20)));
  EXPECT_EQ(value("multislice_hosts_lost_total"), 1);
  EXPECT_EQ(value("multislice_repairs_started_total"), 1);
  EXPECT_EQ(value("multislice_repairs_completed_total"), 1);
}

// Scrapers that send half a request and wait: on the metrics listener they
// hold at most its own threads, for its read timeout; the API, the
// heartbeats and the token-gated /metrics go on meanwhile, and the listener
// answers again once they are cut off.
TEST_F(ControllerMetricsTest, StalledScrapersHoldNothingTheApiNeeds) {
  ControllerOptions options;
  options.heartbeat_timeout = std::chrono::milliseconds(1000);
  options.heartbeat_interval = std::chrono::milliseconds(100);
  options.metrics_bind_address = "127.0.0.1";
  StartController(options);
  AddAgent();
  const int metrics_port = controller_->metrics_port();
  ASSERT_GT(metrics_port, 0);
  std::vector<int> stalled;
  for (int i = 0; i < 12; ++i) {
    const int fd = ConnectAndSend(metrics_port, "GET /metrics HTTP/1.1\r\n");
    if (fd >= 0) stalled.push_back(fd);
  }
  EXPECT_EQ(stalled.size(), 12u);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  double slowest_ms = 0;
  while (std::chrono::steady_clock::now() < end) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(Scrape().first, 200);
    EXPECT_EQ(Call("GET", std::string(kParent) + "/queuedResources").status,
              200);
    slowest_ms = std::max(slowest_ms, std::chrono::duration<double, std::milli>(
                                          std::chrono::steady_clock::now() - t0)
                                          .count());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf(
      "slowest API call + token scrape under 12 stalled scrapers: "
      "%.1f ms\n",
      slowest_ms);
  EXPECT_LT(slowest_ms, 500);
  const json hosts = Call("GET", "/internal/v1/hosts").body["hosts"];
  ASSERT_EQ(hosts.size(), 1u);
  EXPECT_FALSE(hosts[0].value("lost", true)) << "heartbeats were held up";
  // Past the listener's read timeout its threads are free again, though
  // the stalled connections are still open.
  httplib::Client open("127.0.0.1", metrics_port);
  open.set_read_timeout(1, 0);
  EXPECT_TRUE(WaitFor(
      [&] {
        auto res = open.Get("/metrics");
        return res && res->status == 200 &&
               res->body.find("multislice_queued_resources") !=
                   std::string::npos;
      },
      std::chrono::seconds(10)));
  for (int fd : stalled) ::close(fd);
}

}  // namespace
}  // namespace multislice::control
