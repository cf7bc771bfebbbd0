// What `multislice run` (runner.h, on agents; slurm_runner.h, on Slurm)
// needs before anything runs, shared by both paths: its options, the
// queued resource they name (by id or by MaxText's --tpu_prefix), and the
// script directory packed for the workers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "common/temp_dir.h"
#include "control/http.h"

namespace multislice::control {

// Every exec a `run` starts is tagged with this prefix + the run name; a
// later run stops every exec of the worker tagged with the prefix.
inline constexpr const char* kRunTagPrefix = "multislice-run/";

struct RunOptions {
  std::string controller_url;  // "http://HOST:PORT"
  std::string token;
  // Which queued resource: its id, or (when empty) the one whose nodes are
  // named `{tpu_prefix}-0, -1, ...` or whose single node is `{tpu_prefix}`
  // (see FindQueuedResourceByPrefix).
  std::string queued_resource;
  std::string tpu_prefix;
  std::string project = "local";  // where tpu_prefix is looked up
  // The zone tpu_prefix is looked up in ("-": every zone); with
  // queued_resource, the zone it must be in.
  std::string zone = "-";
  std::string command;  // run as `bash -c command` on each worker
  std::string script_dir = ".";
  // The flags as typed, for messages (MaxText spells them --SCRIPT_DIR...).
  std::string script_dir_flag = "--script_dir";
  std::string tpu_prefix_flag = "--tpu_prefix";
  std::string run_name;  // ValidRunName
  bool use_existing_folder = false;
  // <output_dir>/<run_name>/ gets the output files (and pack.h's marker,
  // so that it is never packed).
  std::string output_dir = "runs";
  std::chrono::milliseconds http_timeout{10000};
  std::chrono::milliseconds poll_interval{100};
  // An agent that stops answering for this long fails its worker (255).
  std::chrono::milliseconds agent_lost_after{15000};
  // Without a terminal: how often the progress line is printed.
  std::chrono::milliseconds progress_interval{3000};
  // SIGTERM to SIGKILL when commands are stopped.
  std::chrono::milliseconds stop_grace{2000};
  // Bounds packing, and unpacking on each worker.
  std::chrono::milliseconds setup_timeout{300000};
  FILE* out = stdout;     // slice 0 worker 0's output
  FILE* err = stderr;     // progress and messages
  bool terminal = false;  // `err` is a terminal: redraw the progress line
  const std::atomic<bool>* cancel = nullptr;
};

// 1 to 100 of [A-Za-z0-9._-], starting with a letter or digit.
bool ValidRunName(const std::string& name);

// The default run name: the UTC time as YYYY-MM-DD-HH-MM-SS (MaxText's).
std::string DefaultRunName(std::chrono::system_clock::time_point now);

// The id of the queued resource of `project` (in `zone`, "-": any) whose
// nodes are `{prefix}-0 ... {prefix}-{n-1}` (its node_id_prefix, which
// defaults to its id) or whose single node is `{prefix}` (its node_id).
// NotFound when none is; InvalidArgument naming them when several are.
Result<std::string> FindQueuedResourceByPrefix(const ApiClient& controller,
                                               const std::string& project,
                                               const std::string& prefix,
                                               const std::string& zone = "-");

// What RunOnWorkers checks before calling anything: a command, exactly one
// of queued_resource and tpu_prefix, a valid run name (InvalidArgument).
Status ValidateRunOptions(const RunOptions& options);

// The queued resource `options` names: by its id (in options.zone, when
// not "-") or by options.tpu_prefix (FindQueuedResourceByPrefix).
struct RunTarget {
  std::string id;
  // Its API answer (v2alpha1) when options.project's listing has it; null
  // for a --qr of another project, which the agents' path still reaches by
  // its id alone.
  nlohmann::json answer;
};
Result<RunTarget> FindRunTarget(const RunOptions& options);

class RunOutput;

// options.script_dir packed by pack.h's rules into a temporary directory,
// removed with this object.
struct PackedScripts {
  TempDir dir{"multislice-run-"};
  std::string archive;  // the tar.gz in it
};
// Makes the run's output folder first (output.MarkFolder()), so that it is
// never packed; refuses a directory whose files add up to more than
// kMaxUploadBytes (256 MiB, what an agent accepts) naming
// options.script_dir_flag.
Result<std::unique_ptr<PackedScripts>> PackRunScripts(const RunOptions& options,
                                                      RunOutput& output);

}  // namespace multislice::control
