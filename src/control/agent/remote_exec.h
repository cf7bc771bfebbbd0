// The client side of the host agents, shared by `queued-resources ssh`
// (ssh.h) and `run` (runner.h): the workers of a queued resource as the
// controller lists them, the agent calls a client makes (exec, output by
// offset, stop, tagged stop, file upload), and RemoteExec, one command
// started on one worker and polled until it ends.
//
// Thread-safety: AgentClient is immutable and may be used from several
// threads; a RemoteExec is used by one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "control/http.h"

namespace multislice::control {

// One worker of a queued resource, as the controller lists it
// (GET /internal/v1/queuedResources/{qr}/workers).
struct WorkerTarget {
  int node_index = 0;         // the slice
  int worker = 0;             // TPU_WORKER_ID within the slice
  std::string agent_address;  // "HOST:PORT"
  std::string worker_name;    // "{qr}.{nodeIndex}.{worker}"
  // The bearer its agent accepts (the host's secret, from the controller's
  // admin-only listing); empty: the caller's token.
  std::string agent_token;
};

// The bearer for calls to `target`'s agent.
inline const std::string& AgentTokenFor(const WorkerTarget& target,
                                        const std::string& token) {
  return target.agent_token.empty() ? token : target.agent_token;
}

// Every worker of queued resource `qr`, in node then worker order.
// NotFound for an unknown queued resource, FailedPrecondition when it has
// no workers (not ACTIVE), Unavailable when the controller cannot be
// reached.
Result<std::vector<WorkerTarget>> ListQueuedResourceWorkers(
    const ApiClient& controller, const std::string& qr);

// The controller's URL and token from the --controller and --token-file
// flags, each defaulting to $MULTISLICE_CONTROLLER / $MULTISLICE_TOKEN_FILE.
// InvalidArgument naming the flag when neither gives a usable value.
struct ControllerAccess {
  std::string url;  // "http://HOST:PORT"
  std::string token;
};
Result<ControllerAccess> ResolveControllerAccess(
    const std::string& controller_flag, const std::string& token_file_flag);

// Makes SIGINT and SIGTERM set the returned flag instead of ending the
// process (the runners then stop their remote commands and return 130).
const std::atomic<bool>* CancelOnInterrupt();

// What POST /agent/v1/exec runs on a worker.
struct ExecRequest {
  std::string command;    // run as `bash -c command`
  std::string directory;  // relative to the worker's directory; empty: it
  std::string tag;        // empty: none
  nlohmann::json env = nlohmann::json::object();  // {"NAME": "value"}
};

// One answer of GET /agent/v1/exec/{id}.
struct ExecOutput {
  std::string output;
  long long next_offset = 0;
  bool done = false;
  int exit_code = -1;  // when done
};

// The calls a client makes to one agent. Non-2xx answers are returned as
// errors (ErrorFromResponse); connection failures are Unavailable.
class AgentClient {
 public:
  static Result<AgentClient> Create(const std::string& address,
                                    const std::string& token,
                                    std::chrono::milliseconds timeout);

  // POST /agent/v1/exec; returns the exec id.
  Result<std::string> StartExec(const std::string& worker,
                                const ExecRequest& request) const;
  Result<ExecOutput> ReadExec(const std::string& id, long long offset) const;
  // POST /agent/v1/exec/{id}:stop; returns once the group is gone.
  Status StopExec(const std::string& id, std::chrono::milliseconds grace) const;
  // POST /agent/v1/workers/{worker}/execs:stop; returns how many execs
  // were stopped.
  Result<int> StopTaggedExecs(const std::string& worker,
                              const std::string& tag_prefix,
                              std::chrono::milliseconds grace) const;
  // PUT /agent/v1/workers/{worker}/files?path=REL with `bytes` as the body.
  Status PutFile(const std::string& worker, const std::string& path,
                 const std::string& bytes) const;

  const std::string& address() const { return address_; }

 private:
  AgentClient(std::string address, std::string token,
              std::chrono::milliseconds timeout, ApiClient api)
      : address_(std::move(address)),
        token_(std::move(token)),
        timeout_(timeout),
        api_(std::move(api)) {}
  // A client whose timeout also covers a stop of `grace`.
  Result<ApiClient> StopClient(std::chrono::milliseconds grace) const;

  std::string address_;
  std::string token_;
  std::chrono::milliseconds timeout_;
  ApiClient api_;
};

struct ExecTimings {
  std::chrono::milliseconds http_timeout{10000};
  // An agent that stops answering for this long fails its command (255).
  std::chrono::milliseconds agent_lost_after{15000};
};

// One command on one worker: started once, then polled until done.
class RemoteExec {
 public:
  RemoteExec(WorkerTarget target, std::string token, ExecTimings timings)
      : target_(std::move(target)),
        token_(std::move(token)),
        timings_(timings) {}

  Status Start(const ExecRequest& request);

  // What one Poll() brought.
  struct Progress {
    std::string output;  // new output (stdout and stderr together)
    bool done = false;   // the command has ended (or its agent is lost)
    int exit_code = -1;  // when done; 255 when the agent is lost
    Status lost;         // not ok when the agent stopped answering
  };
  // Reads the output that has arrived since the last call (several chunks
  // when a backlog waits). Requires a successful Start().
  Progress Poll();
  // Stops the command (SIGTERM, grace, SIGKILL) and waits for it to end.
  Status Stop(std::chrono::milliseconds grace);

  const WorkerTarget& target() const { return target_; }
  bool started() const { return client_.has_value(); }

 private:
  WorkerTarget target_;
  std::string token_;
  ExecTimings timings_;
  std::optional<AgentClient> client_;
  std::string exec_id_;
  long long offset_ = 0;
  std::chrono::steady_clock::time_point last_answer_;
};

// Runs fn(0) ... fn(count - 1) on at most `max_threads` threads at once and
// returns when all have returned.
void ForEachConcurrently(size_t count, size_t max_threads,
                         const std::function<void(size_t)>& fn);

}  // namespace multislice::control
