// `multislice admin`: operator tools of the control plane. `fail-host HOST`
// injects a host failure (the controller treats the host as lost and
// repairs its queued resource); `hosts` lists the registered hosts;
// `wait-ready` waits until a controller that is starting answers.
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/control_client.h"
#include "cli/flags.h"

namespace multislice::cli {
namespace {

struct AdminFlags {
  ControllerFlags connection;
  std::string host;
  int wait_seconds = 60;  // wait-ready
};

int Fail(const std::string& cmd, const Status& s) {
  std::fprintf(stderr, "multislice admin %s: %s\n", cmd.c_str(),
               s.message().c_str());
  return ExitCodeFor(s);
}

int RunFailHost(const AdminFlags& f) {
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail("fail-host", client.status());
  Result<control::HttpResponse> r =
      client->Call("POST", "/internal/v1/hosts/" + f.host + ":fail");
  if (!r.ok()) return Fail("fail-host", r.status());
  if (r->status != 200) {
    return Fail("fail-host", control::ErrorFromResponse(*r));
  }
  const std::string qr = r->body.value("queuedResource", "");
  std::printf("host %s marked lost%s\n",
              r->body.value("hostId", f.host).c_str(),
              qr.empty() ? " (it ran no queued resource)"
                         : ("; repairing " + qr).c_str());
  return 0;
}

int RunHosts(const AdminFlags& f) {
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail("hosts", client.status());
  Result<control::HttpResponse> r = client->Call("GET", "/internal/v1/hosts");
  if (!r.ok()) return Fail("hosts", r.status());
  if (r->status != 200) return Fail("hosts", control::ErrorFromResponse(*r));
  std::printf("%-10s %-14s %-22s %-10s %-6s %s\n", "HOST", "TYPE", "AGENT",
              "ICI_DOMAIN", "STATE", "QUEUED_RESOURCE");
  for (const auto& h : r->body.value("hosts", nlohmann::json::array())) {
    std::string qr = h.value("queuedResource", "");
    qr = qr.substr(qr.rfind('/') + 1);
    const std::string ici_domain = h.value("iciDomain", "");
    std::printf("%-10s %-14s %-22s %-10s %-6s %s\n", h.value("id", "").c_str(),
                h.value("acceleratorType", "").c_str(),
                h.value("agentAddress", "").c_str(),
                ici_domain.empty() ? "-" : ici_domain.c_str(),
                h.value("lost", false) ? "LOST" : "OK",
                qr.empty() ? "-" : qr.c_str());
  }
  return 0;
}

// One readiness check: the token file is there and the controller answers
// an authenticated call; the hosts registered so far when it does.
Result<int> ReadyHosts(const ControllerFlags& connection) {
  ControllerFlags quick = connection;
  quick.timeout_seconds = 2;
  ASSIGN_OR_RETURN(control::ApiClient client, MakeControllerClient(quick));
  ASSIGN_OR_RETURN(control::HttpResponse r,
                   client.Call("GET", "/internal/v1/hosts"));
  if (r.status != 200) return control::ErrorFromResponse(r);
  return static_cast<int>(
      r.body.value("hosts", nlohmann::json::array()).size());
}

// Polls ReadyHosts every 200 ms, saying so at once and every 4 s, until
// it answers (exit 0) or --timeout_seconds pass (exit 1, the last reason).
int RunWaitReady(const AdminFlags& f) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto next_line = start;
  for (;;) {
    Result<int> hosts = ReadyHosts(f.connection);
    const double waited =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (hosts.ok()) {
      std::printf("the controller is ready (%d hosts registered)\n", *hosts);
      return 0;
    }
    if (waited >= f.wait_seconds) {
      return Fail("wait-ready",
                  Unavailable("the controller was not ready within " +
                              std::to_string(f.wait_seconds) +
                              " s: " + hosts.status().message()));
    }
    if (Clock::now() >= next_line) {
      std::fprintf(stderr,
                   "multislice admin wait-ready: waiting (%.0f s): %s\n",
                   waited, hosts.status().message().c_str());
      next_line += std::chrono::seconds(4);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

void AddAdminCommand(CLI::App& root, CommandTable& table) {
  CLI::App* admin =
      root.add_subcommand("admin", "Operator tools of the control plane.");
  admin->require_subcommand(1);
  auto fail_flags = std::make_shared<AdminFlags>();
  CLI::App* fail = admin->add_subcommand(
      "fail-host",
      "Injects a host failure: the controller treats HOST (its id, agent "
      "address or hostname) as lost, as if its heartbeats had stopped, and "
      "repairs the queued resource that used it.\n"
      "Example:\n"
      "  multislice admin fail-host host-2");
  fail->add_option("HOST", fail_flags->host, "Host id, e.g. host-2.")
      ->required();
  AddControllerFlags(fail, &fail_flags->connection);
  table[fail] = [fail_flags] { return RunFailHost(*fail_flags); };

  auto hosts_flags = std::make_shared<AdminFlags>();
  CLI::App* hosts = admin->add_subcommand(
      "hosts",
      "Lists the registered hosts, their ICI domain (agent --ici-domain; "
      "- for none), state and queued resource.\n"
      "Example:\n"
      "  multislice admin hosts");
  AddControllerFlags(hosts, &hosts_flags->connection);
  table[hosts] = [hosts_flags] { return RunHosts(*hosts_flags); };

  auto wait_flags = std::make_shared<AdminFlags>();
  CLI::App* wait = admin->add_subcommand(
      "wait-ready",
      "Waits until the controller answers (its token file written, its API "
      "listening), e.g. after starting it in the background, saying what it "
      "waits for every 4 s; exit 1 after --timeout_seconds.\n"
      "Example:\n"
      "  multislice controller --data-dir runs/controller --local-hosts 2 &\n"
      "  multislice admin wait-ready --controller http://127.0.0.1:8470 "
      "--token-file runs/controller/token");
  AddControllerFlags(wait, &wait_flags->connection);
  AddIntFlag(wait, "timeout_seconds", &wait_flags->wait_seconds,
             "How long to wait.");
  table[wait] = [wait_flags] {
    if (wait_flags->wait_seconds < 1) {
      return Fail("wait-ready",
                  InvalidArgument("--timeout_seconds: expected at least 1, "
                                  "got " +
                                  std::to_string(wait_flags->wait_seconds)));
    }
    return RunWaitReady(*wait_flags);
  };
}

}  // namespace multislice::cli
