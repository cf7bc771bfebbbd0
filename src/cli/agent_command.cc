// `multislice agent`: the host agent daemon (see control/agent/agent.h and
// docs/agent.md). Runs until SIGTERM or SIGINT, then stops every process
// group it started and exits 0; exits 1 when it cannot register with the
// controller within --register-timeout.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/flags.h"
#include "control/agent/agent.h"
#include "control/http.h"
#include "control/validation.h"
#include "runtime/mesh/topology.h"

namespace multislice::cli {
namespace {

constexpr const char* kName = "multislice agent";

volatile std::sig_atomic_t g_agent_stop_signal = 0;
void RecordAgentStop(int sig) { g_agent_stop_signal = sig; }

struct AgentFlags {
  std::string controller;
  std::string token_file;
  std::string accelerator_type;
  std::string zone;
  std::string ici_domain;
  int port = 0;
  std::string bind = "127.0.0.1";
  std::string advertise_address;
  std::string workdir = "multislice-agent";
  std::string hostname;
  int register_timeout_seconds = 30;
  std::string worker_user;
  int ssh_port = 22;
  std::string ssh_address;
};

bool ValidZone(const std::string& zone) {
  if (zone.empty() || zone.size() > 63) return false;
  for (char c : zone) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
      return false;
    }
  }
  return true;
}

// "http://HOST:PORT" without a path.
bool ValidControllerUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return false;
  const std::string rest = url.substr(scheme.size());
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      rest.find('/') != std::string::npos) {
    return false;
  }
  auto port = ParseInteger(rest.substr(colon + 1));
  return port && *port >= 1 && *port <= 65535;
}

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  return code;
}

int RunAgent(const AgentFlags& flags) {
  if (!ValidControllerUrl(flags.controller)) {
    return Fail(2, "--controller: '" + flags.controller +
                       "' is not an address like http://127.0.0.1:8470");
  }
  if (auto type = mesh::ParseAcceleratorType(flags.accelerator_type);
      !type.ok()) {
    return Fail(2, "--accelerator-type: " + type.status().message());
  }
  if (!ValidZone(flags.zone)) {
    return Fail(2, "--zone: '" + flags.zone +
                       "' is not a zone name (1 to 63 of [a-z0-9-], e.g. "
                       "us-central2-b)");
  }
  if (Status s = control::ValidateIciDomain("--ici-domain", flags.ici_domain);
      !s.ok()) {
    return Fail(2, s.message());
  }
  if (flags.port < 0 || flags.port > 65535) {
    return Fail(2, "--port: expected 0 (any free port) to 65535, got " +
                       std::to_string(flags.port));
  }
  if (flags.ssh_port < 0 || flags.ssh_port > 65535) {
    return Fail(2, "--ssh-port: expected 0 (no sshd) to 65535, got " +
                       std::to_string(flags.ssh_port));
  }
  if (!flags.ssh_address.empty() &&
      flags.ssh_address.find_first_not_of("0123456789.") != std::string::npos) {
    return Fail(
        2, "--ssh-address: '" + flags.ssh_address + "' is not an IPv4 address");
  }
  if (flags.register_timeout_seconds < 1 ||
      flags.register_timeout_seconds > 86400) {
    return Fail(2, "--register-timeout: expected 1 to 86400 seconds, got " +
                       std::to_string(flags.register_timeout_seconds));
  }
  if (flags.workdir.empty()) return Fail(2, "--workdir: empty");
  if (flags.hostname.size() > 253) {
    return Fail(2, "--hostname: longer than 253 characters");
  }
  auto token = control::ReadToken(flags.token_file);
  if (!token.ok()) return Fail(2, "--token-file: " + token.status().message());

  control::AgentOptions options;
  options.controller_url = flags.controller;
  options.token = *token;
  options.hostname = flags.hostname;
  options.zone = flags.zone;
  options.accelerator_type = flags.accelerator_type;
  options.ici_domain = flags.ici_domain;
  options.port = flags.port;
  options.bind = flags.bind;
  options.advertise_address = flags.advertise_address;
  options.workdir = flags.workdir;
  options.worker_user = flags.worker_user;
  options.ssh_port = flags.ssh_port;
  options.ssh_address = flags.ssh_address;
  options.register_timeout =
      std::chrono::seconds(flags.register_timeout_seconds);

  // Children must not inherit a blocked or ignored SIGTERM; the handler
  // only records the signal, the loop below does the work.
  struct sigaction action {};
  action.sa_handler = RecordAgentStop;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  auto agent = control::Agent::Start(options);
  if (!agent.ok())
    return Fail(ExitCodeFor(agent.status()), agent.status().message());
  // Registration runs in the background; a signal ends the wait at once.
  bool announced = false;
  while (g_agent_stop_signal == 0) {
    if ((*agent)->Failed()) {
      Status failure = (*agent)->WaitRegistered();
      (*agent)->Shutdown();
      return Fail(1, failure.message());
    }
    if (!announced && !(*agent)->host_id().empty()) {
      // One line on stdout for whoever started the agent (e.g. to learn the
      // port chosen for --port 0).
      std::printf("agent %s listening on %s\n", (*agent)->host_id().c_str(),
                  (*agent)->address().c_str());
      std::fflush(stdout);
      announced = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::fprintf(stderr, "%s: stopping every worker and exiting\n", kName);
  (*agent)->Shutdown();
  return 0;
}

}  // namespace

void AddAgentCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "agent",
      "Runs the host agent: registers this host with the controller, sends "
      "heartbeats, and runs the startup scripts and commands the controller "
      "and `queued-resources ssh` ask for, each as its own process group "
      "under --workdir (workers/NAME/startup-script.log holds a worker's "
      "output). Listens on --bind (127.0.0.1 by default; a host of a "
      "multi-machine job binds a reachable address and advertises it). On "
      "SIGTERM it stops every process "
      "group (SIGTERM, then SIGKILL after 5 s) and exits. See docs/agent.md.\n"
      "Example:\n"
      "  multislice agent --controller http://127.0.0.1:8470 "
      "--token-file ~/.multislice/token --accelerator-type cpu-2 "
      "--zone us-central2-b --workdir /tmp/agent-0");
  auto flags = std::make_shared<AgentFlags>();
  AddStringFlag(cmd, "controller", &flags->controller,
                "The controller, http://HOST:PORT.")
      ->required();
  AddStringFlag(cmd, "token_file", &flags->token_file,
                "File holding the controller's bearer token.")
      ->required();
  AddStringFlag(cmd, "accelerator_type", &flags->accelerator_type,
                "This host's accelerator type, e.g. cpu-2 or v5p-8.")
      ->required();
  AddStringFlag(cmd, "zone", &flags->zone, "This host's zone.")->required();
  AddStringFlag(cmd, "ici_domain", &flags->ici_domain,
                "The hosts joined to this one by ICI (e.g. pod0): a slice "
                "of several hosts takes them all from one domain. Default: "
                "none (such hosts form slices only with each other).");
  AddIntFlag(cmd, "port", &flags->port,
             "Port of the agent API; 0 picks a free one.")
      ->capture_default_str();
  AddStringFlag(cmd, "bind", &flags->bind,
                "Address the agent API listens on (0.0.0.0: every "
                "interface).")
      ->capture_default_str();
  AddStringFlag(cmd, "advertise_address", &flags->advertise_address,
                "Address the controller and the other workers reach this "
                "host at (default: --bind).");
  AddStringFlag(cmd, "workdir", &flags->workdir,
                "Directory for the workers' directories and exec output.")
      ->capture_default_str();
  AddStringFlag(cmd, "worker_user", &flags->worker_user,
                "Run workers as this user (not the agent's), so that a job "
                "can read none of the agent's secrets; see docs/control.md, "
                "Threat model.");
  AddIntFlag(cmd, "ssh_port", &flags->ssh_port,
             "Port of this host's sshd, which gcloud's tpu-vm ssh and scp "
             "reach with the keys of the node holding the host (its "
             "ssh-keys metadata); 0: none. Needs root and openssh-server; "
             "without them the agent runs without one (docs/agent.md).")
      ->capture_default_str();
  AddStringFlag(cmd, "ssh_address", &flags->ssh_address,
                "Address this host's sshd listens on, and the node's "
                "networkEndpoints show (default: --advertise-address, else "
                "--bind).");
  AddStringFlag(cmd, "hostname", &flags->hostname,
                "Name reported to the controller (default: this host's).");
  AddIntFlag(cmd, "register_timeout", &flags->register_timeout_seconds,
             "Seconds to keep retrying the first registration before "
             "exiting with code 1.")
      ->capture_default_str();
  table[cmd] = [flags] { return RunAgent(*flags); };
}

}  // namespace multislice::cli
