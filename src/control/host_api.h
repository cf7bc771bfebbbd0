// The controller's internal API under /internal/v1/
// (docs/control-protocol.md): agents register and heartbeat; the admin
// command, the console and `multislice job` read hosts, capacity, the
// workers, operations and logs of a queued resource, and fail a host.
#pragma once

#include "control/control_state.h"
#include "control/routes.h"

namespace multislice::control {

class HostApi {
 public:
  explicit HostApi(ControlState& state) : state_(state) {}

  // Routes the internal API on `server`, behind the bearer check of
  // `token`.
  void Mount(httplib::Server& server, const std::string& token);
  // Routes only the agents' channel (registration, heartbeats): the server
  // of the agent port.
  void MountAgentChannel(httplib::Server& server, const std::string& token);
  // The agent port, told to agents when they register (before serving).
  void set_agent_port(int port) { agent_port_ = port; }

 private:
  void HandleRegister(const httplib::Request& req, httplib::Response& res);
  void HandleHeartbeat(const httplib::Request& req, httplib::Response& res);
  void HandleFailHost(const httplib::Request& req, httplib::Response& res);
  void HandleHosts(const httplib::Request& req, httplib::Response& res);
  void HandleCapacity(const httplib::Request& req, httplib::Response& res);
  void HandleQrOperations(const httplib::Request& req, httplib::Response& res);
  void HandleWorkers(const httplib::Request& req, httplib::Response& res);
  void HandleLogs(const httplib::Request& req, httplib::Response& res);

  ControlState& state_;
  int agent_port_ = 0;
};

}  // namespace multislice::control
