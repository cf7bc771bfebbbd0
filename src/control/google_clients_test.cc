// Google's two Node.js clients of the Cloud TPU API (googleapis and
// @google-cloud/tpu) against an in-process controller whose fake agents make
// queued resources ACTIVE: testdata/google_clients.mjs calls every method
// of both libraries on /v2alpha1/ and /v2/ and reports each check; this test
// runs it and asserts its report (docs/control.md, "Google's client
// libraries"). The npm packages come from scripts/install_npm_test_deps.sh,
// which scripts/test.sh runs first.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "control/control_testing.h"
#include "control/controller.h"
#include "control/controller_fixture.h"
#include "control/fake_agent.h"
#include "control/http.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using testing::FakeAgent;
using testing::WaitFor;

const char kToken[] = "google-clients-test-token";
const char kParent[] = "projects/proj/locations/us-test1-a";
// The script's own bound; the CTest timeout (CMakeLists.txt) is above it.
const int kScriptTimeoutSeconds = 60;

// Where scripts/install_npm_test_deps.sh installs the packages.
std::string NpmCache() {
  const char* dir = std::getenv("MULTISLICE_NPM_CACHE");
  if (dir != nullptr && *dir != '\0') return dir;
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "") +
         "/.cache/multislice/npm-test";
}

// Why the packages in `cache` cannot be used, or "" when they can.
std::string NpmCacheProblem(const std::string& cache) {
  for (const char* package : {"googleapis", "@google-cloud/tpu"}) {
    const std::string path = cache + "/node_modules/" + package;
    if (!std::filesystem::exists(path + "/package.json")) {
      return std::string("the npm package ") + package + " is not in " + cache +
             "/node_modules: run scripts/install_npm_test_deps.sh (with "
             "MULTISLICE_NPM_CACHE set the same way) before this test";
    }
  }
  return "";
}

// `text` quoted for /bin/sh.
std::string ShellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct CommandResult {
  int exit_code = -1;  // 124: killed by `timeout`
  std::string output;  // stdout and stderr
};

// Runs `command` through /bin/sh, echoing and collecting its output.
CommandResult RunShell(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) {
    result.output += buffer;
    std::cout << buffer << std::flush;
  }
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

class GoogleClientsTest : public testing::ControllerFixture {
 protected:
  GoogleClientsTest() : ControllerFixture(kToken, "google-clients-") {}
  void SetUp() override {
    ControllerOptions options;
    options.reconcile_interval = std::chrono::milliseconds(20);
    StartController(options);
  }

  // `n` registered cpu-1 hosts in us-test1-a.
  void AddAgents(int n) {
    for (int i = 0; i < n; ++i) {
      ASSERT_FALSE(AddAgent("cpu-1").host_id().empty());
    }
  }

  json Get(const std::string& path) {
    Result<HttpResponse> r = client_->Call("GET", path, nullptr);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r->body : json();
  }

  // Runs testdata/google_clients.mjs against this controller; its report.
  json RunScript(CommandResult* run) {
    const std::string report = dir_.path() + "/report.json";
    const std::string command =
        "env MS_URL=" + ShellQuote(url_) + " MS_TOKEN=" + ShellQuote(kToken) +
        " MS_PARENT=" + ShellQuote(kParent) +
        " MS_NPM_CACHE=" + ShellQuote(NpmCache()) +
        " MS_REPORT=" + ShellQuote(report) + " timeout -k 5 " +
        std::to_string(kScriptTimeoutSeconds) + " node " +
        ShellQuote(GOOGLE_CLIENTS_SCRIPT);
    *run = RunShell(command);
    std::ifstream in(report);
    if (!in) return json();
    return json::parse(in, nullptr, false);
  }
};

// How many of a report's checks each library and API version ran.
std::map<std::string, int> ChecksPerSuite(const json& checks) {
  std::map<std::string, int> counts;
  for (const json& c : checks) {
    ++counts[c.value("lib", "") + " " + c.value("api", "")];
  }
  return counts;
}

TEST(GoogleClientsSetupTest, AMissingNpmCacheNamesTheInstallScript) {
  TempDir empty;
  ASSERT_TRUE(empty.ok());
  const std::string problem = NpmCacheProblem(empty.path());
  EXPECT_NE(problem.find("scripts/install_npm_test_deps.sh"), std::string::npos)
      << problem;
  EXPECT_NE(problem.find(empty.path()), std::string::npos) << problem;
}

TEST_F(GoogleClientsTest, BothLibrariesDecodeEveryMethodOnBothVersions) {
  const std::string problem = NpmCacheProblem(NpmCache());
  ASSERT_TRUE(problem.empty()) << problem;
  AddAgents(4);
  CommandResult run;
  const json report = RunScript(&run);
  ASSERT_NE(run.exit_code, 124)
      << "google_clients.mjs ran past " << kScriptTimeoutSeconds << " s";
  ASSERT_NE(run.exit_code, 127) << "node not found: Node.js 18+ is needed";
  ASSERT_TRUE(report.is_object() && report.contains("checks"))
      << "no report (exit " << run.exit_code << "):\n"
      << run.output;
  const json& checks = report["checks"];
  int failed = 0;
  for (const json& c : checks) {
    if (c.value("ok", false)) continue;
    ++failed;
    ADD_FAILURE() << c.value("lib", "") << " " << c.value("api", "") << " "
                  << c.value("call", "") << ": " << c.value("detail", "");
  }
  std::cout << checks.size() - failed << " of " << checks.size()
            << " library checks passed; versions " << report["versions"].dump()
            << "\n";
  EXPECT_EQ(run.exit_code, failed == 0 ? 0 : 1);
  // Every suite ran whole: one per library and version, each check once.
  const std::map<std::string, int> ran = ChecksPerSuite(checks);
  for (const auto& [suite, expected] :
       std::map<std::string, int>{{"googleapis v2alpha1", 23},
                                  {"googleapis v2", 23},
                                  {"@google-cloud/tpu v2alpha1", 21},
                                  {"@google-cloud/tpu v2", 21}}) {
    auto it = ran.find(suite);
    EXPECT_EQ(it == ran.end() ? 0 : it->second, expected) << suite;
  }
  // Each suite deleted what it created.
  EXPECT_TRUE(
      Get(std::string("/v2/") + kParent + "/queuedResources")["queuedResources"]
          .empty());
}

// Cloud TPU's AcceleratorConfig.Type enum names (V5LITE_POD, not
// V5LITEPOD), which @google-cloud/tpu decodes; cpu is beyond the enum.
TEST_F(GoogleClientsTest, AcceleratorConfigTypesAreCloudTpuEnumNames) {
  const std::map<std::string, std::string> expected = {
      {"v4-16", "V4"},
      {"v5litepod-16", "V5LITE_POD"},
      {"v5p-8", "V5P"},
      {"v6e-8", "V6E"},
      {"cpu-1", "CPU"}};
  for (const char* api : {"/v2alpha1/", "/v2/"}) {
    for (const auto& [type, generation] : expected) {
      const json t =
          Get(api + std::string(kParent) + "/acceleratorTypes/" + type);
      EXPECT_EQ(t["acceleratorConfigs"][0]["type"], generation)
          << api << type << ": " << t.dump();
      EXPECT_EQ(t["type"], type);
    }
  }
}

}  // namespace
}  // namespace multislice::control
