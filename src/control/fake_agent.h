// Test support: an in-process stand-in for `multislice agent` that speaks
// the agent side of docs/control-protocol.md without running processes. It
// registers, heartbeats, and records every worker it was asked to start and
// stop, with times, so tests can check that attempts never overlap.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "control/http.h"

namespace multislice::control::testing {

struct FakeWorker {
  std::string name;
  int attempt = 0;
  nlohmann::json env;
  std::string script;
  bool running = false;
  std::chrono::steady_clock::time_point started, stopped;
};

class FakeAgent {
 public:
  FakeAgent(std::string controller_url, std::string token,
            std::string accelerator_type, std::string zone = "us-test1-a",
            std::string ip = "127.0.0.1", std::string ici_domain = "",
            bool ssh = false)
      : controller_url_(std::move(controller_url)),
        token_(std::move(token)),
        type_(std::move(accelerator_type)),
        zone_(std::move(zone)),
        ip_(std::move(ip)),
        ici_domain_(std::move(ici_domain)),
        ssh_(ssh) {
    auto authed = [this](auto fn) {
      return [this, fn](const httplib::Request& req, httplib::Response& res) {
        if (!RequireBearer(req, res, credential())) return;
        fn(req, res);
      };
    };
    server_.Get("/agent/v1/health",
                authed([this](const httplib::Request&, httplib::Response& res) {
                  if (paused_) {
                    WriteError(res, 503, "UNAVAILABLE", "paused");
                    return;
                  }
                  WriteJson(res, 200, {{"hostId", host_id()}});
                }));
    server_.Get("/agent/v1/workers",
                authed([this](const httplib::Request&, httplib::Response& res) {
                  std::lock_guard<std::mutex> lock(mu_);
                  nlohmann::json list = nlohmann::json::array();
                  for (const auto& [name, w] : current_)
                    list.push_back(Status(w));
                  WriteJson(res, 200, {{"workers", list}});
                }));
    server_.Put(
        R"(/agent/v1/workers/([a-z0-9.-]+))",
        authed([this](const httplib::Request& req, httplib::Response& res) {
          std::this_thread::sleep_for(put_delay);
          nlohmann::json body = nlohmann::json::parse(req.body);
          std::lock_guard<std::mutex> lock(mu_);
          const std::string name = req.matches[1];
          auto it = current_.find(name);
          if (it != current_.end() && it->second.running) {
            WriteError(res, 409, "ALREADY_EXISTS", name + " runs");
            return;
          }
          FakeWorker w;
          w.name = name;
          w.attempt = body.at("attempt");
          w.env = body.at("env");
          w.script = body.at("script");
          w.running = true;
          w.started = std::chrono::steady_clock::now();
          current_[name] = w;
          history_.push_back(w);
          WriteJson(res, 201, Status(w));
        }));
    server_.Post(
        R"(/agent/v1/workers/([a-z0-9.-]+):stop)",
        authed([this](const httplib::Request& req, httplib::Response& res) {
          std::this_thread::sleep_for(stop_delay);
          std::lock_guard<std::mutex> lock(mu_);
          const std::string name = req.matches[1];
          auto it = current_.find(name);
          if (it == current_.end()) {
            WriteError(res, 404, "NOT_FOUND", name);
            return;
          }
          if (it->second.running) {
            it->second.running = false;
            it->second.stopped = std::chrono::steady_clock::now();
            for (FakeWorker& h : history_) {
              if (h.name == name && h.attempt == it->second.attempt) {
                h.running = false;
                h.stopped = it->second.stopped;
              }
            }
          }
          WriteJson(res, 200, Status(it->second));
        }));
    port_ = server_.bind_to_any_port(ip_);
    server_thread_ = std::thread([this] { server_.listen_after_bind(); });
    heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  }

  ~FakeAgent() { Kill(); }

  // The agent dies: no more answers, no more heartbeats, and its workers
  // die with it (a real agent's process groups get PR_SET_PDEATHSIG).
  void Kill() {
    stop_ = true;
    server_.stop();
    if (server_thread_.joinable()) server_thread_.join();
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (FakeWorker* w : AllWorkers()) {
      if (w->running) {
        w->running = false;
        w->stopped = now;
      }
    }
  }
  // Stops (or resumes) heartbeats, and fails the controller's liveness
  // probe meanwhile: an agent the controller should declare lost. Worker
  // calls still answer, so its workers can be stopped.
  void PauseHeartbeats(bool paused) { paused_ = paused; }
  // Stops (or resumes) heartbeats only: the agent answers every call (and
  // still registers when it has no host id).
  void StopHeartbeatsOnly(bool stopped) { silent_ = stopped; }

  std::string address() const { return ip_ + ":" + std::to_string(port_); }
  // What its API accepts and its heartbeats carry: the secret the
  // controller issued, or the token before that.
  std::string credential() const {
    std::lock_guard<std::mutex> lock(mu_);
    return secret_.empty() ? token_ : secret_;
  }
  std::string host_id() const {
    std::lock_guard<std::mutex> lock(mu_);
    return host_id_;
  }
  std::vector<FakeWorker> history() const {
    std::lock_guard<std::mutex> lock(mu_);
    return history_;
  }
  int running() const {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& [name, w] : current_) n += w.running;
    return n;
  }

  std::chrono::milliseconds put_delay{0};
  std::chrono::milliseconds stop_delay{0};

  // With ssh (constructor): the host key it registers, and the ssh-keys
  // (owner, generation, keys) of the last heartbeat answer; while
  // hold_ssh_keys, it reports the keys it had before as applied.
  static constexpr const char* kHostKey =
      "AAAAC3NzaC1lZDI1NTE5AAAAIFakeHostKey";
  std::atomic<bool> hold_ssh_keys{false};
  nlohmann::json ssh_keys() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ssh_keys_;
  }
  nlohmann::json ssh_applied() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ssh_applied_;
  }

 private:
  std::vector<FakeWorker*> AllWorkers() {
    std::vector<FakeWorker*> all;
    for (auto& [name, w] : current_) all.push_back(&w);
    for (FakeWorker& w : history_) all.push_back(&w);
    return all;
  }

  static nlohmann::json Status(const FakeWorker& w) {
    return {{"name", w.name},
            {"attempt", w.attempt},
            {"pid", 1},
            {"state", w.running ? "RUNNING" : "EXITED"},
            {"directory", "/nonexistent/" + w.name}};
  }

  void HeartbeatLoop() {
    Result<ApiClient> client = ApiClient::Create(
        controller_url_, token_, std::chrono::milliseconds(1000));
    while (!stop_) {
      if (!paused_) {
        std::string id = host_id();
        if (id.empty()) {
          nlohmann::json body = {{"hostname", ip_},
                                 {"zone", zone_},
                                 {"acceleratorType", type_},
                                 {"agentAddress", address()},
                                 {"workdir", "/nonexistent"}};
          // Sent only when set, as agents from before ICI domains did.
          if (!ici_domain_.empty()) body["iciDomain"] = ici_domain_;
          if (ssh_) {
            body["sshAddress"] = ip_ + ":22";
            body["sshHostKeys"] = {{"ssh-ed25519", kHostKey}};
          }
          Result<HttpResponse> r =
              client->Call("POST", "/internal/v1/hosts:register", &body);
          if (r.ok() && r->status == 200) {
            std::lock_guard<std::mutex> lock(mu_);
            host_id_ = r->body.at("hostId");
            secret_ = r->body.value("hostSecret", "");
          }
        } else if (!silent_) {
          nlohmann::json body = {{"workers", nlohmann::json::array()}};
          if (ssh_) body["ssh"] = ssh_applied();
          Result<ApiClient> beat = ApiClient::Create(
              controller_url_, credential(), std::chrono::milliseconds(1000));
          Result<HttpResponse> r = beat->Call(
              "POST", "/internal/v1/hosts/" + id + ":heartbeat", &body);
          if (r.ok() && r->status == 404) {
            std::lock_guard<std::mutex> lock(mu_);
            host_id_.clear();
          }
          if (ssh_ && r.ok() && r->status == 200 && r->body.contains("ssh")) {
            std::lock_guard<std::mutex> lock(mu_);
            ssh_keys_ = r->body["ssh"];
            if (!hold_ssh_keys) {
              ssh_applied_ = {{"owner", ssh_keys_.value("owner", "")},
                              {"generation", ssh_keys_.value("generation", 0)}};
            }
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  std::string controller_url_, token_, type_, zone_, ip_, ici_domain_;
  const bool ssh_ = false;
  nlohmann::json ssh_keys_ = nlohmann::json::object();
  nlohmann::json ssh_applied_ = {{"owner", ""}, {"generation", -1}};
  httplib::Server server_;
  int port_ = 0;
  std::thread server_thread_, heartbeat_thread_;
  std::atomic<bool> stop_{false}, paused_{false}, silent_{false};
  mutable std::mutex mu_;
  std::string host_id_;
  std::string secret_;  // from the registration answer, as the agent keeps it
  std::map<std::string, FakeWorker> current_;
  std::vector<FakeWorker> history_;
};

}  // namespace multislice::control::testing
