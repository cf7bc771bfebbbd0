// Repair end to end with real processes: `multislice controller
// --local-hosts 3` (three `multislice agent` children), a queued resource of
// two cpu-2 slices whose startup script records its attempt, slice and pid
// and sleeps. One agent is killed with SIGKILL; the controller must detect
// the loss, provision a replacement slice on the spare host, stop the other
// slice's script, and rerun both with MULTISLICE_ATTEMPT=2, with no attempt-1
// process left alive. Prints the create->ACTIVE latency after the scripts
// started, the detection time and the time to ACTIVE again.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "common/temp_dir.h"
#include "control/http.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
const char kParent[] = "/v2alpha1/projects/p/locations/local-a";

bool WaitFor(const std::function<bool()>& done,
             std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

double WallSeconds() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool Alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() &&
         line[paren + 2] != 'Z';
}

// The children of `pid` (all its threads).
std::vector<int> Children(int pid) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(
           "/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "children");
    int child;
    while (in >> child) out.push_back(child);
  }
  return out;
}

struct Start {
  int attempt, slice, pid;
  double time;
};

std::vector<Start> ReadStarts(const std::string& path) {
  std::vector<Start> out;
  std::ifstream in(path);
  Start s;
  while (in >> s.attempt >> s.slice >> s.pid >> s.time) out.push_back(s);
  return out;
}

TEST(RepairTest, KilledAgentIsReplacedAndEverySliceRestarts) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string data = dir.path() + "/controller";
  const std::string out_path = dir.path() + "/controller.out";
  pid_t controller = ::fork();
  if (controller == 0) {
    FILE* out = std::freopen(out_path.c_str(), "w", stdout);
    (void)out;
    ::execl(MULTISLICE_BINARY, MULTISLICE_BINARY, "controller", "--port", "0",
            "--data-dir", data.c_str(), "--heartbeat-timeout", "1",
            "--local-hosts", "3", "--local-accelerator-type", "cpu-2",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Whatever happens below, the controller (and with it its agents and
  // their workers) is stopped and reaped.
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      ::kill(pid, SIGTERM);
      for (int i = 0; i < 300; ++i) {
        if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reaper{controller};

  std::string url;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::ifstream in(out_path);
        std::string word;
        while (in >> word) {
          if (word.rfind("http://", 0) == 0) {
            url = word;
            return true;
          }
        }
        return false;
      },
      std::chrono::seconds(10)));
  Result<std::string> token = ReadToken(data + "/token");
  ASSERT_TRUE(token.ok());
  ApiClient client = *ApiClient::Create(url, *token, std::chrono::seconds(5));
  auto hosts = [&] {
    Result<HttpResponse> r = client.Call("GET", "/internal/v1/hosts");
    return r.ok() ? r->body.value("hosts", json::array()) : json::array();
  };
  ASSERT_TRUE(
      WaitFor([&] { return hosts().size() == 3; }, std::chrono::seconds(15)));

  const std::string starts = dir.path() + "/starts";
  const std::string script =
      "#!/bin/bash\n"
      "echo \"$MULTISLICE_ATTEMPT $MEGASCALE_SLICE_ID $$ "
      "$(date +%s.%N)\" >> " +
      starts +
      "\n"
      "env | sort > env-attempt-$MULTISLICE_ATTEMPT.txt\n"
      "exec sleep 600\n";
  json body = {{"tpu",
                {{"node_spec",
                  {{{"multi_node_params", {{"node_count", 2}}},
                    {"node",
                     {{"accelerator_type", "cpu-2"},
                      {"metadata", {{"startup-script", script}}}}}}}}}}};
  auto state = [&](int* attempt = nullptr) {
    Result<HttpResponse> r =
        client.Call("GET", std::string(kParent) + "/queuedResources/job");
    if (!r.ok() || r->status != 200) return std::string();
    if (attempt) *attempt = r->body.value("attempt", 0);
    return r->body["state"].value("state", "");
  };
  ASSERT_EQ(client
                .Call("POST",
                      std::string(kParent) +
                          "/queuedResources?queued_resource_id=job",
                      &body)
                ->status,
            200);
  ASSERT_TRUE(
      WaitFor([&] { return state() == "ACTIVE"; }, std::chrono::seconds(15)));
  const double active_at = WallSeconds();
  ASSERT_TRUE(WaitFor([&] { return ReadStarts(starts).size() == 2; },
                      std::chrono::seconds(5)));
  std::vector<Start> first = ReadStarts(starts);
  double last_start = 0;
  for (const Start& s : first) {
    EXPECT_EQ(s.attempt, 1);
    last_start = std::max(last_start, s.time);
  }
  std::printf("ACTIVE observed %.0f ms after the last startup script started\n",
              (active_at - last_start) * 1000);
  EXPECT_LT(active_at - last_start, 1.0);

  // The host of slice 0 and its agent process (found by its directory).
  Result<HttpResponse> qr =
      client.Call("GET", std::string(kParent) + "/queuedResources/job");
  const std::string lost_host = qr->body["nodes"][0]["hosts"][0];
  std::string workdir;
  for (const json& h : hosts()) {
    if (h["id"] == lost_host) workdir = h["workdir"];
  }
  int agent_pid = -1;
  for (int child : Children(controller)) {
    std::error_code ec;
    auto cwd = std::filesystem::read_symlink(
        "/proc/" + std::to_string(child) + "/cwd", ec);
    if (!ec && std::filesystem::equivalent(cwd, workdir, ec)) {
      agent_pid = child;
    }
  }
  ASSERT_GT(agent_pid, 0) << "no agent runs in " << workdir;
  const auto killed = Clock::now();
  ASSERT_EQ(::kill(agent_pid, SIGKILL), 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const json& h : hosts()) {
          if (h["id"] == lost_host) return h.value("lost", false);
        }
        return false;
      },
      std::chrono::seconds(5)));
  const double detect_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - killed).count();
  int attempt = 0;
  ASSERT_TRUE(
      WaitFor([&] { return state(&attempt) == "ACTIVE" && attempt == 2; },
              std::chrono::seconds(15)));
  const double repair_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - killed).count();
  std::printf(
      "host loss detected after %.0f ms (heartbeat timeout 1000 ms); "
      "ACTIVE again after %.0f ms\n",
      detect_ms, repair_ms);
  EXPECT_LT(detect_ms, 1000 + 1000);
  EXPECT_LT(repair_ms, 10000);

  qr = client.Call("GET", std::string(kParent) + "/queuedResources/job");
  EXPECT_NE(qr->body["nodes"][0]["hosts"][0], lost_host);
  ASSERT_TRUE(WaitFor([&] { return ReadStarts(starts).size() == 4; },
                      std::chrono::seconds(5)));
  std::map<int, int> second;  // slice -> pid of attempt 2
  double first_second_start = 1e300;
  for (const Start& s : ReadStarts(starts)) {
    if (s.attempt == 2) {
      second[s.slice] = s.pid;
      first_second_start = std::min(first_second_start, s.time);
    }
  }
  EXPECT_EQ(second.size(), 2u) << "both slices rerun with attempt 2";
  for (const Start& s : first) {
    EXPECT_FALSE(Alive(s.pid)) << "attempt-1 process " << s.pid << " alive";
  }
  for (const auto& [slice, pid] : second) EXPECT_TRUE(Alive(pid));
}

}  // namespace
}  // namespace multislice::control
