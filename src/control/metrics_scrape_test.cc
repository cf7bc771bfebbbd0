// The controller's /metrics scraped by a real Prometheus server (Debian's
// prometheus package, scripts/install_deps.sh): a controller on loopback
// with queued resources in four states, Prometheus scraping it every second
// on the metrics listener (no token), on the API port with the token file
// and on the API port with a wrong token; its query API must then give the
// counts the controller's API gives, a hostile hostname back byte for byte,
// the request histogram, and the wrong token's target down.
//
// Skipped, saying why, without /usr/bin/prometheus. Prometheus runs from
// a temporary directory (its config, its TSDB), never as this machine's
// service; every wait is bounded and it is stopped (SIGTERM, SIGKILL after
// 5 s) and reaped whatever the outcome.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

#include "common/temp_dir.h"
#include "control/metrics_fixture.h"
#include "control/process.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using testing::WaitFor;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
const char kToken[] = "scrape-test-token-0123456789";
// Every byte the exposition must escape, and UTF-8 of more than one byte.
const char kHostileHostname[] = "evil\"host\\name\nline{x=\"1\"} caf\xC3\xA9";

// A loopback port nobody listened on a moment ago.
int UnusedLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool bound =
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  return bound ? ntohs(addr.sin_port) : -1;
}

std::string Tail(const std::string& path, size_t bytes = 4000) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

class MetricsScrapeTest : public testing::MetricsFixture {
 protected:
  MetricsScrapeTest() : MetricsFixture(kToken) {}

  void TearDown() override {
    if (prometheus_) {
      Result<ProcessState> stopped =
          prometheus_->Stop(std::chrono::seconds(5), std::chrono::seconds(5));
      EXPECT_TRUE(stopped.ok()) << stopped.status().message();
      EXPECT_FALSE(ProcessGroupAlive(prometheus_->pid()));
      if (HasFailure()) {
        std::printf("prometheus log:\n%s\n",
                    Tail(work_.path() + "/log").c_str());
      }
    }
    MetricsFixture::TearDown();
  }

  // prometheus.yml: three jobs of one target each, every second.
  void WriteConfig() {
    const std::string token_file = work_.path() + "/token";
    std::ofstream(token_file) << kToken << "\n";
    const std::string api = "127.0.0.1:" + std::to_string(controller_->port());
    const std::string open =
        "127.0.0.1:" + std::to_string(controller_->metrics_port());
    std::ofstream(work_.path() + "/prometheus.yml")
        << "global:\n"
           "  scrape_interval: 1s\n"
           "  scrape_timeout: 1s\n"
           "scrape_configs:\n"
           "  - job_name: open\n"
           "    static_configs: [{targets: ['"
        << open
        << "']}]\n"
           "  - job_name: authed\n"
           "    authorization: {credentials_file: '"
        << token_file
        << "'}\n"
           "    static_configs: [{targets: ['"
        << api
        << "']}]\n"
           "  - job_name: wrong-token\n"
           "    authorization: {credentials: 'not-the-controller-token'}\n"
           "    static_configs: [{targets: ['"
        << api << "']}]\n";
  }

  void StartPrometheus() {
    prometheus_port_ = UnusedLoopbackPort();
    ASSERT_GT(prometheus_port_, 0);
    ProcessSpec spec;
    spec.argv = {
        kPrometheus, "--config.file=" + work_.path() + "/prometheus.yml",
        "--storage.tsdb.path=" + work_.path() + "/tsdb",
        "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port_)};
    spec.directory = work_.path();
    spec.log_path = work_.path() + "/log";
    Result<std::unique_ptr<ProcessGroup>> started = launcher_->Start(spec);
    ASSERT_TRUE(started.ok()) << started.status().message();
    prometheus_ = std::move(*started);
  }

  // The result vector of an instant query; empty on any error.
  json Query(const std::string& promql) {
    httplib::Client http("127.0.0.1", prometheus_port_);
    http.set_connection_timeout(1, 0);
    http.set_read_timeout(2, 0);
    const httplib::Params params = {{"query", promql}};
    auto res = http.Get("/api/v1/query", params, httplib::Headers());
    if (!res || res->status != 200) return json::array();
    json body = json::parse(res->body, nullptr, false);
    if (!body.is_object() || body.value("status", "") != "success") {
      return json::array();
    }
    return body["data"].value("result", json::array());
  }
  // state -> tier -> value of multislice_queued_resources for `job`.
  std::map<std::pair<std::string, std::string>, double> Counts(
      const std::string& job) {
    std::map<std::pair<std::string, std::string>, double> out;
    for (const json& r :
         Query("multislice_queued_resources{job=\"" + job + "\"}")) {
      out[{r["metric"].value("state", ""), r["metric"].value("tier", "")}] =
          std::stod(r["value"][1].get<std::string>());
    }
    return out;
  }
  double Up(const std::string& job) {
    json r = Query("up{job=\"" + job + "\"}");
    return r.size() == 1 ? std::stod(r[0]["value"][1].get<std::string>()) : -1;
  }

  TempDir work_{"multislice-prometheus-"};
  std::unique_ptr<ProcessLauncher> launcher_ = NewProcessLauncher();
  std::unique_ptr<ProcessGroup> prometheus_;
  int prometheus_port_ = -1;
};

TEST_F(MetricsScrapeTest, PrometheusSeesWhatTheApiSays) {
  if (::access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus
                 << " is not installed (scripts/install_deps.sh installs "
                    "Debian's prometheus)";
  }
  ASSERT_TRUE(work_.ok());
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  options.metrics_bind_address = "127.0.0.1";
  StartController(options);
  ASSERT_GT(controller_->metrics_port(), 0);
  AddAgent();
  // A host of a type nobody asks for, named with every byte to escape.
  const json host = {{"hostname", kHostileHostname},
                     {"zone", "us-test1-a"},
                     {"acceleratorType", "cpu-8"},
                     {"agentAddress", "127.0.0.1:1"},
                     {"workdir", "/nonexistent"}};
  HttpResponse registered = Call("POST", "/internal/v1/hosts:register", &host);
  ASSERT_EQ(registered.status, 200);
  const std::string hostile_id = registered.body["hostId"];

  const std::map<std::string, std::string> tiers = {
      {"a", "on-demand"}, {"b", "spot"}, {"c", "best-effort"}, {"d", "spot"}};
  ASSERT_EQ(Create("a", ""), 200);
  ASSERT_TRUE(WaitFor([&] { return State("a") == "ACTIVE"; }));
  ASSERT_EQ(Create("b", "spot"), 200);
  ASSERT_EQ(Create("c", "best-effort"), 200);
  ASSERT_EQ(Create("d", "spot", {{"valid_after_duration", "3600s"}}), 200);
  ASSERT_TRUE(WaitFor([&] {
    return State("b") == "WAITING_FOR_RESOURCES" &&
           State("c") == "WAITING_FOR_RESOURCES";
  }));
  // The reference: what the API says of each.
  std::map<std::pair<std::string, std::string>, double> expected;
  for (const auto& [id, tier] : tiers) expected[{State(id), tier}] += 1;
  ASSERT_EQ(expected.size(), 4u);

  WriteConfig();
  StartPrometheus();
  auto matches = [&](const std::string& job) {
    std::map<std::pair<std::string, std::string>, double> seen = Counts(job);
    if (seen.size() != 9u * kNumTiers) return false;  // zeros too
    for (const auto& [key, value] : seen) {
      const double want = expected.count(key) ? expected.at(key) : 0;
      if (value != want) return false;
    }
    return true;
  };
  const bool seen = WaitFor(
      [&] {
        return matches("open") && matches("authed") && Up("open") == 1 &&
               Up("authed") == 1 && Up("wrong-token") == 0;
      },
      std::chrono::seconds(30));
  ASSERT_TRUE(seen) << "up: open " << Up("open") << ", authed " << Up("authed")
                    << ", wrong-token " << Up("wrong-token");
  EXPECT_TRUE(matches("open"));
  EXPECT_TRUE(matches("authed"));
  EXPECT_TRUE(Counts("wrong-token").empty());

  // The hostile hostname, back byte for byte.
  const json ages = Query(
      "multislice_host_heartbeat_age_seconds{job=\"open\","
      "host=\"" +
      hostile_id + "\"}");
  ASSERT_EQ(ages.size(), 1u) << ages.dump();
  EXPECT_EQ(ages[0]["metric"].value("hostname", ""), kHostileHostname);
  // The scrapes themselves, timed on the metrics listener once answered,
  // so from the second scrape on.
  auto scrapes = [&] {
    return Query(
        "multislice_http_request_duration_seconds_count{job=\"open\","
        "listener=\"metrics\",route=\"/metrics\",method=\"GET\","
        "status_class=\"2xx\"} >= 1");
  };
  EXPECT_TRUE(
      WaitFor([&] { return scrapes().size() == 1; }, std::chrono::seconds(10)))
      << scrapes().dump();
}

}  // namespace
}  // namespace multislice::control
