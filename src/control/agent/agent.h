// The host agent: the controller's hands on one host.
//
// An Agent serves the `/agent/v1/` API of docs/control-protocol.md on a
// loopback port, registers its host with the controller (`/internal/v1/`)
// and sends heartbeats carrying the status of its workers. A worker is one
// startup-script process group (`/bin/bash startup-script.sh` in
// `<workdir>/workers/{name}/`, output appended to `startup-script.log`, each
// attempt starting with `=== attempt N ===`); an exec is one `bash -c
// COMMAND` process group whose output is kept in `<workdir>/exec/{id}.log`
// and read back by offset. Workers and execs live only in memory: when the
// agent goes, its process groups go with it (Shutdown() stops them, and
// PR_SET_PDEATHSIG kills them if the agent is killed).
//
// Thread-safety: every public method may be called from any thread.
// Shutdown() is idempotent and also run by the destructor.
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "control/agent/workers.h"
#include "control/process.h"

namespace multislice::control {

// Limits on what a request may carry.
inline constexpr size_t kMaxScriptBytes = 256 * 1024;
inline constexpr size_t kMaxEnvEntries = 256;
inline constexpr size_t kMaxEnvValueBytes = 64 * 1024;
// A file sent with PUT /agent/v1/workers/{name}/files (every other call's
// body is bounded by kMaxBodyBytes).
inline constexpr size_t kMaxUploadBytes = 256u << 20;

struct AgentOptions {
  std::string controller_url;  // "http://HOST:PORT"
  std::string token;           // bearer token of every call, both ways
  std::string hostname;        // empty: gethostname()
  std::string zone;
  std::string accelerator_type;
  // The hosts joined to this one by ICI (the pod it is cabled into): the
  // controller puts a multi-host slice on one domain's hosts. "": none.
  std::string ici_domain;
  int port = 0;  // 0: any free port (see Agent::port())
  // The address the API listens on (0.0.0.0 for every interface), and the
  // one sent to the controller as agentAddress (empty: `bind`). Agents on
  // other machines than the controller bind a reachable address and
  // advertise it; their workers' TPU_WORKER_HOSTNAMES come from it.
  std::string bind = "127.0.0.1";
  std::string advertise_address;
  // Where workers/ and exec/ live; created when absent.
  std::string workdir;
  // The first registration retries (with backoff) until this has passed;
  // then the agent fails (see Agent::Failed()). Later re-registrations (after
  // a 404 heartbeat) retry without limit.
  std::chrono::milliseconds register_timeout{30000};
  // Bounds each call to the controller.
  std::chrono::milliseconds http_timeout{5000};
  // Grace between SIGTERM and SIGKILL when Shutdown() stops the groups, and
  // for a PUT that must clear what an exited attempt left running.
  std::chrono::milliseconds stop_grace{5000};
  // Starts the process groups; null: a real launcher owned by the agent.
  // When given, it must outlive the agent.
  ProcessLauncher *launcher = nullptr;
  // Workers run as this user (its uid and primary group), so that they can
  // read none of this agent's files or memory (docs/control.md, Threat
  // model). Empty: the agent's own user.
  std::string worker_user;
  // This host's sshd (ssh_server.h), which `gcloud compute tpus tpu-vm ssh`
  // reaches: the port (0: none) and the address it listens on (empty: the
  // advertised address, else `bind`). When it cannot start (no root, no
  // openssh-server, the address taken) the agent runs without one and says
  // why in its log.
  int ssh_port = 0;
  std::string ssh_address;
};

class Agent {
 public:
  // Validates the options, creates the workdir, binds bind:port and
  // starts serving and registering (in the background). Fails on bad
  // options or when the port cannot be bound.
  static Result<std::unique_ptr<Agent>> Start(AgentOptions options);

  ~Agent();
  Agent(const Agent &) = delete;
  Agent &operator=(const Agent &) = delete;

  int port() const;
  // "ADVERTISE:PORT", as sent to the controller.
  std::string address() const;

  // Waits until the first registration succeeded (ok) or failed for good
  // (its error); at most register_timeout plus one call's timeout.
  Status WaitRegistered();
  // The id the controller gave this host; empty before registration.
  std::string host_id() const;
  // Whether the first registration failed for good (the agent then serves
  // no purpose and its command exits).
  bool Failed() const;

  // The worker statuses, as sent in heartbeats (sorted by name).
  nlohmann::json WorkerStatuses();

  // Stops heartbeats, stops every worker and exec group (SIGTERM, grace,
  // SIGKILL, waiting until each group is gone) and the HTTP server.
  void Shutdown();

  struct Impl;

 private:
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace multislice::control
