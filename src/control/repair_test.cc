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
#include <optional>
#include <set>
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

// `multislice controller --local-hosts 3` in a child (heartbeat timeout
// 1 s), stopped and reaped when the test ends, with a client of its API and
// a queued resource "job" of two cpu-2 slices whose startup script appends
// "attempt slice pid time" to `starts`.
class LocalCluster {
 public:
  explicit LocalCluster(const std::string& dir,
                        std::vector<std::string> extra = {})
      : dir_(dir) {
    const std::string data = dir + "/controller";
    const std::string out_path = dir + "/controller.out";
    std::vector<std::string> args = {MULTISLICE_BINARY,
                                     "controller",
                                     "--port",
                                     "0",
                                     "--data-dir",
                                     data,
                                     "--heartbeat-timeout",
                                     "1",
                                     "--local-hosts",
                                     "3",
                                     "--local-accelerator-type",
                                     "cpu-2"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      FILE* out = std::freopen(out_path.c_str(), "w", stdout);
      (void)out;
      ::execv(MULTISLICE_BINARY, argv.data());
      ::_exit(127);
    }
    std::string url;
    WaitFor(
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
        std::chrono::seconds(10));
    Result<std::string> token = ReadToken(data + "/token");
    if (url.empty() || !token.ok()) return;
    client_.emplace(*ApiClient::Create(url, *token, std::chrono::seconds(5)));
  }
  // Whatever happened, the controller (and with it its agents and their
  // workers) is stopped and reaped.
  ~LocalCluster() {
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 300; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  bool ready() const { return client_.has_value(); }
  ApiClient& client() { return *client_; }
  std::string starts() const { return dir_ + "/starts"; }

  json Hosts() {
    Result<HttpResponse> r = client_->Call("GET", "/internal/v1/hosts");
    return r.ok() ? r->body.value("hosts", json::array()) : json::array();
  }
  bool HostLost(const std::string& id) {
    for (const json& h : Hosts()) {
      if (h["id"] == id) return h.value("lost", false);
    }
    return false;
  }
  // The QR's state ("" when it cannot be read), and its attempt.
  std::string State(int* attempt = nullptr) {
    Result<HttpResponse> r =
        client_->Call("GET", std::string(kParent) + "/queuedResources/job");
    if (!r.ok() || r->status != 200) return std::string();
    if (attempt) *attempt = r->body.value("attempt", 0);
    return r->body["state"].value("state", "");
  }
  json Job() {
    return client_->Call("GET", std::string(kParent) + "/queuedResources/job")
        ->body;
  }
  // Creates queued resource `id` of `slices` cpu-2 slices running `script`.
  bool Create(const std::string& id, int slices, const std::string& script) {
    json node_spec = {{"node",
                       {{"accelerator_type", "cpu-2"},
                        {"metadata", {{"startup-script", script}}}}}};
    if (slices > 1) {
      node_spec["multi_node_params"] = {{"node_count", slices}};
    } else {
      node_spec["node_id"] = id + "-0";
    }
    json body = {{"tpu", {{"node_spec", {node_spec}}}}};
    auto r = client_->Call(
        "POST",
        std::string(kParent) + "/queuedResources?queued_resource_id=" + id,
        &body);
    return r.ok() && r->status == 200;
  }
  std::string StateOf(const std::string& id) {
    Result<HttpResponse> r =
        client_->Call("GET", std::string(kParent) + "/queuedResources/" + id);
    if (!r.ok() || r->status != 200) return std::string();
    return r->body["state"].value("state", "");
  }
  json Workers(const std::string& id) {
    Result<HttpResponse> r =
        client_->Call("GET", "/internal/v1/queuedResources/" + id + "/workers");
    return r.ok() ? r->body.value("workers", json::array()) : json::array();
  }
  std::string data_dir() const { return dir_ + "/controller"; }

  bool CreateJob() {
    const std::string script =
        "#!/bin/bash\n"
        "echo \"$MULTISLICE_ATTEMPT $MEGASCALE_SLICE_ID $$ "
        "$(date +%s.%N)\" >> " +
        starts() +
        "\n"
        "env | sort > env-attempt-$MULTISLICE_ATTEMPT.txt\n"
        "exec sleep 600\n";
    json body = {{"tpu",
                  {{"node_spec",
                    {{{"multi_node_params", {{"node_count", 2}}},
                      {"node",
                       {{"accelerator_type", "cpu-2"},
                        {"metadata", {{"startup-script", script}}}}}}}}}}};
    auto r = client_->Call(
        "POST",
        std::string(kParent) + "/queuedResources?queued_resource_id=job",
        &body);
    return r.ok() && r->status == 200;
  }
  // The pid of the agent of host `id` (found by its directory).
  int AgentPid(const std::string& id) {
    std::string workdir;
    for (const json& h : Hosts()) {
      if (h["id"] == id) workdir = h["workdir"];
    }
    for (int child : Children(pid_)) {
      std::error_code ec;
      auto cwd = std::filesystem::read_symlink(
          "/proc/" + std::to_string(child) + "/cwd", ec);
      if (!ec && std::filesystem::equivalent(cwd, workdir, ec)) return child;
    }
    return -1;
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  std::optional<ApiClient> client_;
};

TEST(RepairTest, KilledAgentIsReplacedAndEverySliceRestarts) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  LocalCluster cluster(dir.path());
  ASSERT_TRUE(cluster.ready());
  ApiClient& client = cluster.client();
  auto hosts = [&] { return cluster.Hosts(); };
  ASSERT_TRUE(
      WaitFor([&] { return hosts().size() == 3; }, std::chrono::seconds(15)));
  const std::string starts = cluster.starts();
  auto state = [&](int* attempt = nullptr) { return cluster.State(attempt); };
  ASSERT_TRUE(cluster.CreateJob());
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

  // The host of slice 0 and its agent process.
  Result<HttpResponse> qr =
      client.Call("GET", std::string(kParent) + "/queuedResources/job");
  const std::string lost_host = qr->body["nodes"][0]["hosts"][0];
  const int agent_pid = cluster.AgentPid(lost_host);
  ASSERT_GT(agent_pid, 0) << "no agent of " << lost_host;
  const auto killed = Clock::now();
  ASSERT_EQ(::kill(agent_pid, SIGKILL), 0);
  ASSERT_TRUE(WaitFor([&] { return cluster.HostLost(lost_host); },
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

// Issue 12, defect 6: an agent frozen (SIGSTOP) beyond the heartbeat timeout
// had its slice replaced while its worker of the previous attempt ran on:
// two attempts of one slice at once. Now the worker's lease lapses and its
// guardian kills it, the replacement starts only after that lease has
// certainly expired, and the agent that wakes stops whatever it still runs
// before it registers again.
TEST(RepairTest, FrozenAgentNeverRunsTwoAttemptsOfASlice) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  LocalCluster cluster(dir.path());
  ASSERT_TRUE(cluster.ready());
  ASSERT_TRUE(WaitFor([&] { return cluster.Hosts().size() == 3; },
                      std::chrono::seconds(15)));
  ASSERT_TRUE(cluster.CreateJob());
  ASSERT_TRUE(WaitFor([&] { return cluster.State() == "ACTIVE"; },
                      std::chrono::seconds(15)));
  ASSERT_TRUE(WaitFor([&] { return ReadStarts(cluster.starts()).size() == 2; },
                      std::chrono::seconds(5)));
  const std::string frozen_host = cluster.Job()["nodes"][0]["hosts"][0];
  const int agent_pid = cluster.AgentPid(frozen_host);
  ASSERT_GT(agent_pid, 0);
  int frozen_worker = -1;
  for (const Start& s : ReadStarts(cluster.starts())) {
    if (s.slice == 0) frozen_worker = s.pid;
  }
  ASSERT_TRUE(Alive(frozen_worker));
  ASSERT_EQ(::kill(agent_pid, SIGSTOP), 0);
  const auto frozen = Clock::now();
  // Sample: at no moment two attempts of one slice alive.
  double worker_gone_ms = -1;
  int samples = 0, overlaps = 0, attempt = 0;
  const auto deadline = frozen + std::chrono::seconds(40);
  while (Clock::now() < deadline) {
    std::map<int, std::set<int>> alive;  // slice -> attempts alive
    for (const Start& s : ReadStarts(cluster.starts())) {
      if (Alive(s.pid)) alive[s.slice].insert(s.attempt);
    }
    ++samples;
    for (const auto& [slice, attempts] : alive) {
      if (attempts.size() > 1) ++overlaps;
    }
    if (worker_gone_ms < 0 && !Alive(frozen_worker)) {
      worker_gone_ms =
          std::chrono::duration<double, std::milli>(Clock::now() - frozen)
              .count();
    }
    if (cluster.State(&attempt) == "ACTIVE" && attempt == 2 &&
        ReadStarts(cluster.starts()).size() == 4) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double repaired_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - frozen).count();
  std::printf(
      "frozen agent: its worker killed by its lease after %.0f ms, ACTIVE "
      "again (attempt %d) after %.0f ms; %d samples, %d with two attempts of "
      "a slice alive\n",
      worker_gone_ms, attempt, repaired_ms, samples, overlaps);
  EXPECT_EQ(attempt, 2);
  EXPECT_EQ(overlaps, 0);
  EXPECT_GE(worker_gone_ms, 0) << "the frozen host's worker survived";
  EXPECT_LT(worker_gone_ms, 2000 + 1500);  // lease 2 s from the last beat
  // Wake it: it stops whatever it still runs and registers again, free.
  ASSERT_EQ(::kill(agent_pid, SIGCONT), 0);
  ASSERT_TRUE(WaitFor([&] { return !cluster.HostLost(frozen_host); },
                      std::chrono::seconds(10)));
  EXPECT_FALSE(Alive(frozen_worker));
  for (const json& h : cluster.Hosts()) {
    if (h["id"] != frozen_host) continue;
    for (const json& w : h.value("workers", json::array())) {
      EXPECT_NE(w.value("state", ""), "RUNNING") << w.dump();
    }
  }
}

// Issue 12, defect 7: a startup script could read the one shared token (from
// its guardian's command line, --token-file) and exec as root on another
// queued resource's host. Now a host's agent accepts only that host's
// secret, agents hold only a registration token, and with
// --local-worker-user the workers run as users who can read neither, nor
// each other's processes.
TEST(RepairTest, AWorkerCannotExecOnAnotherQueuedResourcesHost) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run workers as nobody";
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::filesystem::permissions(
      dir.path(),
      std::filesystem::perms::owner_all | std::filesystem::perms::others_exec);
  // One uid per local host (70001, 70002, ...; group 70000).
  LocalCluster cluster(dir.path(), {"--local-worker-user", "uids:70000"});
  ASSERT_TRUE(cluster.ready());
  ASSERT_TRUE(WaitFor([&] { return cluster.Hosts().size() == 3; },
                      std::chrono::seconds(15)));
  ASSERT_TRUE(cluster.Create("b", 1, "#!/bin/bash\nexec sleep 600\n"));
  ASSERT_TRUE(WaitFor([&] { return cluster.StateOf("b") == "ACTIVE"; },
                      std::chrono::seconds(15)));
  const json b = cluster.Workers("b")[0];
  const std::string b_address = b["agentAddress"];
  const std::string host = b_address.substr(0, b_address.rfind(':'));
  const std::string port = b_address.substr(b_address.rfind(':') + 1);
  const std::string report = dir.path() + "/report";
  std::filesystem::create_directories(report);
  std::filesystem::permissions(report, std::filesystem::perms::all);
  const std::string data = cluster.data_dir();
  // Everything A's worker can think of: the controller's and the agents'
  // token files, its guardian's command line (and the files it names),
  // every process's environment, and its own environment's values.
  std::string script = R"SH(#!/bin/bash
out=@REPORT@/attempts
try() {
  body='{"command":"id > @REPORT@/pwned"}'
  exec 3<>/dev/tcp/@HOST@/@PORT@ || { echo "$2 connect-failed" >> $out; return; }
  printf 'POST /agent/v1/exec HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' "$1" "${#body}" "$body" >&3
  echo "$2 $(head -1 <&3 | tr -d '\r')" >> $out
  exec 3>&-
}
candidates="@DATA@/token @DATA@/agent-token @DATA@/state.db"
for f in $(tr '\0' ' ' < /proc/$PPID/cmdline); do
  [ -f "$f" ] && candidates="$candidates $f"
done
for f in $candidates /proc/[0-9]*/environ; do
  if [ -r "$f" ] && t=$(head -c 4096 "$f" 2>/dev/null | tr '\0=' '  '); then
    echo "read $f ok" >> $out.files
    if head -c 65536 "$f" | tr '\0' '\n' | grep -q "^MULTISLICE_RUN_ID=" &&
       ! head -c 65536 "$f" | tr '\0' '\n' | grep -qx "MULTISLICE_RUN_ID=$MULTISLICE_RUN_ID"; then
      echo "foreign environment $f" >> $out.files
    fi
    for word in $t; do
      [ ${#word} -ge 16 ] && try "$word" "file:$f"
    done
  else
    echo "read $f denied" >> $out.files
  fi
done
for v in $(env | cut -d= -f2-); do [ ${#v} -ge 16 ] && try "$v" env; done
echo "uid $(id -u)" >> $out.files
touch @REPORT@/done
exec sleep 600
)SH";
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"@REPORT@", report},
                                                        {"@HOST@", host},
                                                        {"@PORT@", port},
                                                        {"@DATA@", data}}) {
    for (size_t at; (at = script.find(key)) != std::string::npos;) {
      script.replace(at, key.size(), value);
    }
  }
  ASSERT_TRUE(cluster.Create("a", 1, script));
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(report + "/done"); },
                      std::chrono::seconds(60)));
  std::ifstream files(report + "/attempts.files");
  std::string line, all_files;
  while (std::getline(files, line)) all_files += line + "\n";
  EXPECT_NE(all_files.find("read " + data + "/token denied"), std::string::npos)
      << all_files;
  EXPECT_NE(all_files.find("read " + data + "/agent-token denied"),
            std::string::npos)
      << all_files;
  EXPECT_EQ(all_files.find("uid 0\n"), std::string::npos) << "runs as root";
  // Nor the environment (rendezvous address and credentials) of the other
  // queued resource's worker.
  EXPECT_EQ(all_files.find("foreign environment"), std::string::npos)
      << all_files;
  std::ifstream attempts(report + "/attempts");
  int tried = 0, refused = 0;
  while (std::getline(attempts, line)) {
    ++tried;
    refused += line.find(" HTTP/1.1 401") != std::string::npos;
    EXPECT_EQ(line.find(" HTTP/1.1 2"), std::string::npos) << line;
  }
  std::printf(
      "%d exec attempts on the other queued resource's host with "
      "what its worker could read, %d refused with 401\n",
      tried, refused);
  EXPECT_GT(tried, 0);
  EXPECT_FALSE(std::filesystem::exists(report + "/pwned"));
  // The probe itself works: with that host's secret, exec is accepted.
  ApiClient agent = *ApiClient::Create("http://" + b_address,
                                       b["agentToken"].get<std::string>(),
                                       std::chrono::seconds(5));
  json body = {{"command", "true"}};
  Result<HttpResponse> exec = agent.Call("POST", "/agent/v1/exec", &body);
  ASSERT_TRUE(exec.ok());
  EXPECT_EQ(exec->status, 201);
}

}  // namespace
}  // namespace multislice::control
