// `queued-resources ssh`: one command on chosen workers of a queued
// resource, through their hosts' agents.
//
// RunSsh asks the controller for the queued resource's workers
// (GET /internal/v1/queuedResources/{qr}/workers), starts the command on the
// selected ones with POST /agent/v1/exec, polls their output and prints
// every line as "[node N worker W] line". It returns the first non-zero exit
// code in the order the workers finished (0 when all succeed; 255 for a
// worker whose agent could not be reached, as ssh does).
//
// Batches and the no-deadlock rule: with batch_size B > 0 at most B workers
// run at a time and the next starts when one finishes. A command that waits
// for every worker (a training job's rendezvous) would never finish in a
// batch smaller than the worker count, so: when `batch_wait` passes without
// any worker finishing while others still wait to start, RunSsh prints one
// line saying so and starts all the remaining workers at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"
#include "control/agent/remote_exec.h"
#include "control/agent/selection.h"

namespace multislice::control {

struct SshOptions {
  std::string controller_url;  // "http://HOST:PORT"
  std::string token;
  std::string queued_resource;  // the queued resource's id
  Selection nodes;              // by nodeIndex
  Selection workers;            // by worker index within the node
  std::string command;          // run as `bash -c command` on each worker
  int batch_size = 0;           // 0: all at once
  std::chrono::milliseconds batch_wait{10000};
  std::chrono::milliseconds http_timeout{10000};
  std::chrono::milliseconds poll_interval{100};
  // An agent that stops answering for this long fails its worker (255).
  std::chrono::milliseconds agent_lost_after{15000};
  FILE* out = stdout;  // prefixed output lines
  FILE* err = stderr;  // RunSsh's own messages
  // When set to true (e.g. from a SIGINT handler), the running commands are
  // stopped and RunSsh returns 130.
  const std::atomic<bool>* cancel = nullptr;
};

// One worker of a queued resource, as the controller lists it.
using SshTarget = WorkerTarget;

// The exit code of the command (see above), or an error before any command
// started: the controller unreachable, an unknown queued resource
// (NotFound), or a selection naming no worker or an index out of range
// (InvalidArgument).
Result<int> RunSsh(const SshOptions& options);

}  // namespace multislice::control
