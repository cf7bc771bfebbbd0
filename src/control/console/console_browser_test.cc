// The console end to end in a real browser: `multislice controller
// --local-hosts 4` on loopback and Debian's headless chromium driven by
// chromedriver over WebDriver (HTTP + JSON, spoken here with cpp-httplib).
// Saves a screenshot of each page to CONSOLE_TEST_OUTPUT_DIR (the build's
// src/control/console/console_test_output/).
//
// Skipped, saying why, when chromium or chromedriver is not installed
// (scripts/install_deps.sh installs both). Every wait is bounded; the
// controller (with its agents), chromedriver and chromium are always killed
// and reaped.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "common/temp_dir.h"
#include "control/http.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr char kElementKey[] = "element-6066-11e4-a52e-4f735466cecf";

bool WaitFor(const std::function<bool()>& done,
             std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

std::string FirstExisting(std::initializer_list<const char*> paths) {
  for (const char* p : paths) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

std::string Base64Decode(const std::string& in) {
  static const std::string kChars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (char c : in) {
    const size_t pos = kChars.find(c);
    if (pos == std::string::npos) continue;  // '=', newlines
    val = (val << 6) + static_cast<int>(pos);
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xff));
      bits -= 8;
    }
  }
  return out;
}

// Starts argv in its own process group, stdout and stderr to `log`; the
// child dies with this process (PR_SET_PDEATHSIG).
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    FILE* out = std::freopen(log.c_str(), "w", stdout);
    (void)out;
    ::dup2(STDOUT_FILENO, STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// SIGTERM to the group, up to 5 s, then SIGKILL; always reaped.
void StopGroup(pid_t pid) {
  if (pid <= 0) return;
  ::kill(-pid, SIGTERM);
  ::kill(pid, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) {
      ::kill(-pid, SIGKILL);  // stragglers of the group
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// Kills every process whose command line holds `marker` (the unique
// --user-data-dir of our chromium: only processes this test started).
void KillByMarker(const std::string& marker) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)),
                        std::istreambuf_iterator<char>());
    if (cmdline.find(marker) != std::string::npos) {
      ::kill(std::stoi(name), SIGKILL);
    }
  }
}

// A WebDriver session (W3C protocol) on chromedriver.
class Browser {
 public:
  Browser(int port) : client_("127.0.0.1", port) {
    client_.set_connection_timeout(5, 0);
    client_.set_read_timeout(30, 0);
    client_.set_write_timeout(10, 0);
  }
  // POST/GET/DELETE `path` under the session; the answer's "value".
  json Call(const std::string& method, const std::string& path,
            const json& body = json::object()) {
    const std::string full =
        path.rfind("/session", 0) == 0 ? path : "/session/" + session_ + path;
    httplib::Result r = method == "GET"      ? client_.Get(full)
                        : method == "DELETE" ? client_.Delete(full)
                                             : client_.Post(full, body.dump(),
                                                            "application/json");
    if (!r) {
      ADD_FAILURE() << method << " " << full << ": no answer from chromedriver";
      return json();
    }
    json answer = json::parse(r->body, nullptr, false);
    if (r->status != 200) {
      if (allow_stale_ && r->body.find("stale element") != std::string::npos) {
        stale_ = true;
        return json();
      }
      ADD_FAILURE() << method << " " << full << ": " << r->status << " "
                    << r->body.substr(0, 500);
      return json();
    }
    return answer.is_object() && answer.contains("value") ? answer["value"]
                                                          : json();
  }
  bool Start(const std::string& chromium, const std::string& user_data_dir) {
    json caps = {{"capabilities",
                  {{"alwaysMatch",
                    {{"browserName", "chrome"},
                     {"goog:chromeOptions",
                      {{"binary", chromium},
                       {"args",
                        {"--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--no-first-run",
                         "--disable-extensions", "--window-size=1440,1000",
                         "--force-device-scale-factor=1",
                         "--user-data-dir=" + user_data_dir}}}}}}}}};
    json v = Call("POST", "/session", caps);
    if (!v.is_object() || !v.contains("sessionId")) return false;
    session_ = v["sessionId"];
    return true;
  }
  void Quit() {
    if (session_.empty()) return;
    client_.set_read_timeout(10, 0);
    client_.Delete("/session/" + session_);
    session_.clear();
  }
  void Go(const std::string& url) { Call("POST", "/url", {{"url", url}}); }
  json Script(const std::string& script, const json& args = json::array()) {
    return Call("POST", "/execute/sync", {{"script", script}, {"args", args}});
  }
  // The element matching `css`, or "" (a failure) when none.
  std::string Find(const std::string& css) {
    json v =
        Call("POST", "/element", {{"using", "css selector"}, {"value", css}});
    if (v.is_object() && v.contains(kElementKey)) {
      return v[kElementKey].get<std::string>();
    }
    ADD_FAILURE() << "no element " << css << ": " << v.dump();
    return "";
  }
  // Clicks the element; tables are redrawn every poll, so an element gone
  // stale between finding and clicking is found again.
  void Click(const std::string& css) {
    for (int i = 0; i < 5; ++i) {
      const std::string e = Find(css);
      if (e.empty()) return;
      allow_stale_ = true;
      stale_ = false;
      Call("POST", "/element/" + e + "/click");
      allow_stale_ = false;
      if (!stale_) return;
    }
    ADD_FAILURE() << css << " went stale 5 times";
  }
  void Type(const std::string& css, const std::string& text,
            bool clear = true) {
    const std::string e = Find(css);
    if (e.empty()) return;
    if (clear) Call("POST", "/element/" + e + "/clear");
    Call("POST", "/element/" + e + "/value", {{"text", text}});
  }
  std::string Text(const std::string& css) {
    json v = Script(
        "const e = document.querySelector(arguments[0]);"
        "return e ? e.textContent : null;",
        {css});
    return v.is_string() ? v.get<std::string>() : "";
  }
  bool Visible(const std::string& css) {
    json v = Script(
        "const e = document.querySelector(arguments[0]);"
        "return !!e && e.offsetParent !== null;",
        {css});
    return v.is_boolean() && v.get<bool>();
  }
  bool WaitText(const std::string& css, const std::string& part,
                std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    bool ok = WaitFor([&] { return Text(css).find(part) != std::string::npos; },
                      timeout);
    if (!ok) {
      ADD_FAILURE() << "waited for '" << part << "' in " << css << "; text is '"
                    << Text(css) << "'";
    }
    return ok;
  }
  void Screenshot(const std::string& path) {
    json v = Call("GET", "/screenshot");
    if (!v.is_string()) return;
    std::ofstream(path, std::ios::binary) << Base64Decode(v.get<std::string>());
  }

 private:
  httplib::Client client_;
  std::string session_;
  bool allow_stale_ = false;
  bool stale_ = false;
};

// The controller with 4 local cpu-1 hosts, and a browser session on it.
class ConsoleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium_ =
        FirstExisting({"/usr/lib/chromium/chromium", "/usr/bin/chromium"});
    driver_ = FirstExisting({"/usr/bin/chromedriver"});
    if (chromium_.empty() || driver_.empty()) {
      GTEST_SKIP() << "chromium or chromedriver is not installed (apt-get "
                      "install chromium chromium-driver, as "
                      "scripts/install_deps.sh does): browser test skipped";
    }
    ASSERT_TRUE(dir_.ok());
    out_dir_ = CONSOLE_TEST_OUTPUT_DIR;
    std::filesystem::create_directories(out_dir_);
    const std::string data = dir_.path() + "/controller";
    const std::string out_path = dir_.path() + "/controller.out";
    controller_ =
        Spawn({MULTISLICE_BINARY, "controller", "--port", "0", "--data-dir",
               data, "--local-hosts", "4", "--local-accelerator-type", "cpu-1"},
              out_path);
    ASSERT_TRUE(WaitFor(
        [&] {
          std::ifstream in(out_path);
          std::string word;
          while (in >> word) {
            if (word.rfind("http://", 0) == 0) {
              url_ = word;
              return true;
            }
          }
          return false;
        },
        std::chrono::seconds(10)))
        << "the controller printed no URL";
    Result<std::string> token = ReadToken(data + "/token");
    ASSERT_TRUE(token.ok());
    token_ = *token;
    client_ = std::make_unique<ApiClient>(
        *ApiClient::Create(url_, token_, std::chrono::seconds(5)));
    ASSERT_TRUE(WaitFor(
        [&] {
          Result<HttpResponse> r = client_->Call("GET", "/internal/v1/hosts");
          return r.ok() && r->body.value("hosts", json::array()).size() == 4;
        },
        std::chrono::seconds(15)));

    const int port = FreePort();
    ASSERT_GT(port, 0);
    driver_pid_ = Spawn({driver_, "--port=" + std::to_string(port)},
                        dir_.path() + "/chromedriver.log");
    browser_ = std::make_unique<Browser>(port);
    httplib::Client probe("127.0.0.1", port);
    probe.set_connection_timeout(1, 0);
    ASSERT_TRUE(WaitFor([&] { return static_cast<bool>(probe.Get("/status")); },
                        std::chrono::seconds(10)))
        << "chromedriver did not start";
    user_data_ = dir_.path() + "/chromium-profile";
    ASSERT_TRUE(browser_->Start(chromium_, user_data_))
        << "chromium did not start (see " << dir_.path()
        << "/chromedriver.log)";
  }

  void TearDown() override {
    if (browser_) browser_->Quit();
    StopGroup(driver_pid_);
    if (!user_data_.empty()) KillByMarker(user_data_);
    StopGroup(controller_);
  }

  void Shot(const std::string& name) {
    browser_->Screenshot(out_dir_ + "/" + name);
    std::printf("screenshot %s/%s\n", out_dir_.c_str(), name.c_str());
  }

  void SignIn() {
    browser_->Go(url_ + "/console");
    ASSERT_TRUE(WaitFor([&] { return browser_->Visible("#token"); },
                        std::chrono::seconds(10)));
    browser_->Type("#token", token_);
    browser_->Click("#token-submit");
    ASSERT_TRUE(WaitFor([&] { return browser_->Visible("#qr-table"); },
                        std::chrono::seconds(10)))
        << "status '" << browser_->Text("#status") << "', token error '"
        << browser_->Text("#token-error") << "', log "
        << browser_->Call("POST", "/se/log", {{"type", "browser"}}).dump()
        << " token value '"
        << browser_->Script("return document.getElementById('token').value")
        << "' storage " << browser_->Script("return sessionStorage.length");
  }

  std::string RowState(const std::string& id) {
    return browser_->Text("#qr-table tr[data-id='" + id + "'] td.state span");
  }

  // Creates queued resource `id` through the API; whether it was accepted.
  bool Create(const std::string& id, json body) {
    Result<HttpResponse> r = client_->Call(
        "POST",
        "/v2alpha1/projects/local/locations/local-a/queuedResources"
        "?queued_resource_id=" +
            id,
        &body);
    return r.ok() && r->status == 200;
  }

  TempDir dir_{"console_test_"};
  std::string chromium_, driver_, out_dir_, url_, token_, user_data_;
  pid_t controller_ = -1, driver_pid_ = -1;
  std::unique_ptr<ApiClient> client_;
  std::unique_ptr<Browser> browser_;
};

TEST_F(ConsoleTest, WithoutTokenOnlyThePromptShowsAndTheApiRefuses) {
  browser_->Go(url_ + "/console");
  ASSERT_TRUE(WaitFor([&] { return browser_->Visible("#token"); },
                      std::chrono::seconds(10)));
  for (const char* view : {"#nav", "#view-list", "#view-create",
                           "#view-details", "#view-capacity"}) {
    EXPECT_FALSE(browser_->Visible(view)) << view << " shows without a token";
  }
  // The fragment of another page does not get past the prompt either.
  browser_->Go(url_ + "/console/#/capacity");
  EXPECT_TRUE(WaitFor([&] { return browser_->Visible("#token"); },
                      std::chrono::seconds(5)));
  EXPECT_FALSE(browser_->Visible("#view-capacity"));
  Shot("01-token-prompt.png");

  // Every API call without the token is refused, from the page too.
  json status = browser_->Call(
      "POST", "/execute/async",
      {{"script",
        "const done = arguments[arguments.length - 1];"
        "fetch('/v2alpha1/projects/local/locations/-/queuedResources')"
        ".then(r => done(r.status), e => done(String(e)));"},
       {"args", json::array()}});
  EXPECT_EQ(status, 401);
  httplib::Client plain(url_);
  plain.set_connection_timeout(5, 0);
  for (const char* path :
       {"/v2alpha1/projects/local/locations/-/queuedResources",
        "/internal/v1/hosts", "/internal/v1/capacity",
        "/internal/v1/queuedResources/x/logs",
        "/internal/v1/queuedResources/x/operations"}) {
    httplib::Result r = plain.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << path;
  }
  httplib::Result r = plain.Post(
      "/v2alpha1/projects/local/locations/local-a/queuedResources"
      "?queued_resource_id=x",
      "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);

  // A wrong token is refused and not kept.
  browser_->Type("#token", "not-the-token");
  browser_->Click("#token-submit");
  EXPECT_TRUE(browser_->WaitText("#token-error", "refused"));
  EXPECT_FALSE(browser_->Visible("#view-list"));
  EXPECT_TRUE(browser_->Script("return sessionStorage.length").get<int>() == 0);
}

TEST_F(ConsoleTest, CreateWatchDetailsResetDeleteAndCapacity) {
  const auto t0 = Clock::now();
  ASSERT_NO_FATAL_FAILURE(SignIn());

  // Create form: an invalid name is caught by the page's own check, and,
  // with that check off, the API's message shows beside the field.
  browser_->Click("#nav-create");
  ASSERT_TRUE(browser_->WaitText("#f-accel", "cpu-1"));
  browser_->Type("#f-name", "bad name!");
  browser_->Click("#create-submit");
  ASSERT_TRUE(browser_->WaitText("#err-name", "does not match"));
  EXPECT_EQ(browser_->Script("return document.getElementById('err-name')"
                             ".dataset.source"),
            "client");
  browser_->Script(
      "document.getElementById('create-form').dataset.clientChecks = 'off'");
  browser_->Click("#create-submit");
  ASSERT_TRUE(WaitFor(
      [&] {
        return browser_->Script(
                   "return document.getElementById('err-name')"
                   ".dataset.source") == "api";
      },
      std::chrono::seconds(10)));
  const std::string api_message = browser_->Text("#err-name");
  EXPECT_NE(api_message.find("queued_resource_id: 'bad name!' does not match"),
            std::string::npos)
      << api_message;
  EXPECT_EQ(browser_->Script("return document.getElementById('f-name')"
                             ".getAttribute('aria-invalid')"),
            "true");
  Shot("03-create-form-error.png");
  browser_->Script(
      "document.getElementById('create-form').dataset.clientChecks = 'on'");

  // A valid 2-slice queued resource through the form.
  browser_->Type("#f-name", "web1");
  browser_->Type("#f-tags", "console, e2e");
  EXPECT_EQ(browser_->Script("return document.getElementById('f-multislice')"
                             ".checked"),
            true);
  browser_->Type("#f-slices", "2");
  browser_->Type("#f-prefix", "web1-slice");
  browser_->Click("#create-submit");
  ASSERT_TRUE(WaitFor(
      [&] { return browser_->Script("return location.hash") == "#/list"; },
      std::chrono::seconds(10)))
      << "create did not return to the list: " << browser_->Text("#err-form")
      << browser_->Text("#status");

  ASSERT_TRUE(WaitFor([&] { return RowState("web1") == "ACTIVE"; },
                      std::chrono::seconds(20)))
      << "web1 is " << RowState("web1");
  EXPECT_NE(browser_->Text("#qr-table tr[data-id='web1']").find("on-demand"),
            std::string::npos);

  // A spot queued resource on the 2 hosts left, preempted by a reserved
  // one: SUSPENDED, it still holds quota, and its row is marked.
  auto create = [&](const std::string& id, const std::string& tier) {
    json body = {{"tpu",
                  {{"node_spec",
                    {{{"multi_node_params", {{"node_count", 2}}},
                      {"node", {{"accelerator_type", "cpu-1"}}}}}}}}};
    if (tier == "spot") body["spot"] = json::object();
    if (tier == "reserved") body["guaranteed"] = {{"reserved", true}};
    return Create(id, body);
  };
  ASSERT_TRUE(create("spot1", "spot"));
  ASSERT_TRUE(WaitFor([&] { return RowState("spot1") == "ACTIVE"; },
                      std::chrono::seconds(20)));
  ASSERT_TRUE(create("res1", "reserved"));
  ASSERT_TRUE(WaitFor([&] { return RowState("res1") == "ACTIVE"; },
                      std::chrono::seconds(20)));
  ASSERT_TRUE(WaitFor([&] { return RowState("spot1") == "SUSPENDED"; },
                      std::chrono::seconds(10)));
  EXPECT_TRUE(browser_->Visible("#qr-table tr.holds-quota[data-id='spot1']"));
  EXPECT_NE(
      browser_->Text("#qr-table tr[data-id='spot1']").find("holds 2 chips"),
      std::string::npos);
  EXPECT_FALSE(browser_->Visible("#qr-table tr.holds-quota[data-id='web1']"));
  EXPECT_NE(browser_->Text("#quota-note").find("2 chips"), std::string::npos);
  // The state filter hides the others.
  browser_->Script(
      "const s = document.getElementById('filter-state'); s.value = 'ACTIVE';"
      "s.dispatchEvent(new Event('change'));");
  EXPECT_TRUE(WaitFor([&] { return RowState("spot1").empty(); },
                      std::chrono::seconds(5)));
  browser_->Script(
      "const s = document.getElementById('filter-state'); s.value = '';"
      "s.dispatchEvent(new Event('change'));");
  ASSERT_TRUE(WaitFor([&] { return !RowState("spot1").empty(); },
                      std::chrono::seconds(5)));
  Shot("02-queued-resources.png");

  // Details: history, nodes, operations, log tails; then reset.
  // By keyboard: focus the row's link, wait past a redraw (the focus
  // stays), press Enter.
  browser_->Script(
      "document.querySelector(\"#qr-table a[data-qr='web1']\").focus()");
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ(browser_->Script("return document.activeElement.dataset.qr"),
            "web1");
  browser_->Call("POST", "/actions",
                 {{"actions",
                   {{{"type", "key"},
                     {"id", "keyboard"},
                     {"actions",
                      {{{"type", "keyDown"}, {"value", "\uE007"}},
                       {{"type", "keyUp"}, {"value", "\uE007"}}}}}}}});
  ASSERT_TRUE(browser_->WaitText("#details-state", "ACTIVE"));
  ASSERT_TRUE(browser_->WaitText("#nodes-table", "web1-slice-1"));
  ASSERT_TRUE(browser_->WaitText("#history-table", "PROVISIONING"));
  ASSERT_TRUE(browser_->WaitText("#ops-table", "create"));
  ASSERT_TRUE(browser_->WaitText("#logs", "attempt 1"));
  browser_->Click("#reset-btn");
  ASSERT_TRUE(WaitFor([&] { return browser_->Visible("#confirm-ok"); },
                      std::chrono::seconds(5)));
  browser_->Click("#confirm-ok");
  ASSERT_TRUE(
      browser_->WaitText("#details-attempt", "2", std::chrono::seconds(20)));
  ASSERT_TRUE(browser_->WaitText("#details-state", "ACTIVE"));
  ASSERT_TRUE(browser_->WaitText("#ops-table", "reset"));
  browser_->Click("#logs-refresh");
  ASSERT_TRUE(browser_->WaitText("#logs", "attempt 2"));
  Shot("04-details.png");

  // Capacity: 4 hosts, 2 used by web1, chips per tier.
  browser_->Click("#nav-capacity");
  ASSERT_TRUE(browser_->WaitText("#capacity-summary", "cpu-1"));
  ASSERT_TRUE(browser_->WaitText("#capacity-hosts", "USED"));
  ASSERT_TRUE(browser_->WaitText("#tier-table", "on-demand"));
  ASSERT_TRUE(browser_->WaitText("#tier-table", "2 chips (1 queued resource)"));
  EXPECT_NE(browser_->Text("#capacity-summary tbody").find("local-a"),
            std::string::npos);
  Shot("05-capacity.png");

  // Delete web1 and spot1 by checkbox: web1 is ACTIVE, so the page asks
  // for force explicitly.
  browser_->Click("#nav-list");
  ASSERT_TRUE(WaitFor([&] { return RowState("web1") == "ACTIVE"; },
                      std::chrono::seconds(10)));
  browser_->Click("#qr-table tr[data-id='web1'] input.row-select");
  browser_->Click("#qr-table tr[data-id='spot1'] input.row-select");
  browser_->Click("#delete-selected");
  ASSERT_TRUE(WaitFor([&] { return browser_->Visible("#confirm-ok"); },
                      std::chrono::seconds(5)));
  EXPECT_NE(browser_->Text("#confirm-text").find("force"), std::string::npos);
  Shot("06-force-delete.png");
  browser_->Click("#confirm-ok");
  ASSERT_TRUE(WaitFor(
      [&] { return RowState("web1").empty() && RowState("spot1").empty(); },
      std::chrono::seconds(20)))
      << "web1 is '" << RowState("web1") << "'";
  Result<HttpResponse> gone = client_->Call(
      "GET", "/v2alpha1/projects/local/locations/local-a/queuedResources/web1");
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->status, 404);
  std::printf("browser test: %.1f s\n",
              std::chrono::duration<double>(Clock::now() - t0).count());
}

// A worker whose training hung printed the hang digest: the details page
// shows its verdict above the logs, and nothing for one that did not.
TEST_F(ConsoleTest, TheDetailsPagePointsAtAHangDigest) {
  ASSERT_NO_FATAL_FAILURE(SignIn());
  auto create = [&](const std::string& id, const std::string& script) {
    json body = {{"tpu",
                  {{"node_spec",
                    {{{"node_id", id},
                      {"node",
                       {{"accelerator_type", "cpu-1"},
                        {"metadata", {{"startup-script", script}}}}}}}}}}};
    return Create(id, body);
  };
  // What `multislice train` prints through the launcher on a hang.
  const std::string script =
      "echo '[slice 0 worker 0] step 3/8  loss 5.0'; "
      "echo '[slice 0 worker 0] multislice: slice 0 worker 0: hang digest: no "
      "collective finished within 3.0 s; most devices wait in "
      "all_reduce[data]#16 grads'; "
      "echo '[slice 0 worker 0]   culprit: slice 1 worker 0 (process 1): did "
      "not report within 3.0 s'; "
      "echo '[slice 0 worker 0]   slice 0 worker 0 on h, device 0: waits'; "
      "echo '[slice 0 worker 0]   digest: /runs/r/hang_digest.json'; "
      "echo '[slice 0 worker 0] multislice train: the job is stuck (hang); "
      "suspected culprit(s): slice 1 worker 0; hang digest: "
      "/runs/r/hang_digest.json'";
  ASSERT_TRUE(create("hung1", script));
  ASSERT_TRUE(create("fine1", "echo all good"));
  browser_->Script("location.hash = '#/details/hung1'");
  ASSERT_TRUE(
      browser_->WaitText("#details-state", "ACTIVE", std::chrono::seconds(20)));
  ASSERT_TRUE(browser_->WaitText("#logs", "culprit", std::chrono::seconds(20)));
  browser_->Click("#logs-refresh");
  ASSERT_TRUE(browser_->WaitText("#hang-lines",
                                 "culprit: slice 1 worker 0 (process 1)"));
  EXPECT_TRUE(browser_->Visible("#hang-digest"));
  const std::string lines = browser_->Text("#hang-lines");
  EXPECT_EQ(lines.find("hang digest: no collective finished"), 0u) << lines;
  EXPECT_NE(lines.find("digest: /runs/r/hang_digest.json"), std::string::npos)
      << lines;
  EXPECT_EQ(lines.find("waits"), std::string::npos) << lines;  // not devices
  Shot("07-hang-digest.png");

  browser_->Script("location.hash = '#/details/fine1'");
  ASSERT_TRUE(
      browser_->WaitText("#logs", "all good", std::chrono::seconds(20)));
  EXPECT_FALSE(browser_->Visible("#hang-digest"));
}

}  // namespace
}  // namespace multislice::control
