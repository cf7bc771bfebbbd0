// `multislice run`: MaxText's multihost_runner.py against an existing queued
// resource, through its hosts' agents (control/agent/runner.h) or, on a
// controller with --capacity slurm, as steps of its Slurm job
// (control/agent/slurm_runner.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/control_client.h"
#include "cli/flags.h"
#include "control/agent/remote_exec.h"
#include "control/agent/runner.h"
#include "control/validation.h"

namespace multislice::cli {
namespace {

constexpr const char* kName = "multislice run";

struct RunFlags {
  std::string queued_resource;
  std::string tpu_prefix;
  std::string project = "local";
  std::string zone;
  std::string command;
  std::string script_dir = ".";
  std::string run_name;
  std::string output_dir = "runs";
  bool use_existing_folder = false;
  bool internal_ip = false;  // multihost_runner.py's; no effect here
  ControllerFlags controller;
};

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  return code;
}

// The flags' checks, each naming the flag as typed; the options to run.
Result<control::RunOptions> Options(const CLI::App* cmd, const RunFlags& f) {
  const std::string prefix = Spelled(cmd, "tpu_prefix", "TPU_PREFIX");
  if (f.queued_resource.empty() == f.tpu_prefix.empty()) {
    return InvalidArgument("give exactly one of --qr and " + prefix);
  }
  // They go into URL paths.
  if (!f.queued_resource.empty()) {
    RETURN_IF_ERROR(control::ValidateResourceId("--qr", f.queued_resource));
  }
  RETURN_IF_ERROR(control::ValidateProjectId(Spelled(cmd, "project", "PROJECT"),
                                             f.project));
  if (!f.zone.empty()) {
    RETURN_IF_ERROR(
        control::ValidateZone(Spelled(cmd, "zone", "ZONE"), f.zone, false));
  }
  const std::string command = Spelled(cmd, "command", "COMMAND");
  if (f.command.empty()) {
    return InvalidArgument(command +
                           ": expected the command to run on every worker");
  }
  control::RunOptions options;
  options.queued_resource = f.queued_resource;
  options.tpu_prefix = f.tpu_prefix;
  options.tpu_prefix_flag = prefix;
  options.project = f.project;
  options.zone = f.zone.empty() ? "-" : f.zone;
  options.command = f.command;
  options.script_dir = f.script_dir;
  options.script_dir_flag = Spelled(cmd, "script_dir", "SCRIPT_DIR");
  options.output_dir = f.output_dir;
  options.run_name =
      f.run_name.empty()
          ? control::DefaultRunName(std::chrono::system_clock::now())
          : f.run_name;
  if (!control::ValidRunName(options.run_name)) {
    return InvalidArgument(Spelled(cmd, "run_name", "RUN_NAME") + ": '" +
                           options.run_name +
                           "' is not 1 to 100 of [A-Za-z0-9._-] starting "
                           "with a letter or digit");
  }
  if (f.output_dir.empty()) {
    return InvalidArgument("--output_dir: expected a directory");
  }
  options.use_existing_folder = f.use_existing_folder;
  return options;
}

int RunRunCommand(const CLI::App* cmd, const RunFlags& flags) {
  Result<control::RunOptions> options = Options(cmd, flags);
  if (!options.ok()) return Fail(2, options.status().message());
  auto access = control::ResolveControllerAccess(flags.controller.controller,
                                                 flags.controller.token_file);
  if (!access.ok()) return Fail(2, access.status().message());
  options->controller_url = access->url;
  options->token = access->token;
  options->terminal = ::isatty(STDERR_FILENO) == 1;
  options->cancel = control::CancelOnInterrupt();
  if (flags.internal_ip) {
    std::fprintf(stderr,
                 "%s: --INTERNAL_IP has no effect: the workers are reached "
                 "at the addresses their agents registered, or through "
                 "Slurm\n",
                 kName);
  }
  auto code = control::RunOnWorkers(*options);
  if (!code.ok()) {
    return Fail(ExitCodeFor(code.status()), code.status().message());
  }
  return *code;
}

}  // namespace

void AddRunCommand(CLI::App& root, CommandTable& table) {
  CLI::App* cmd = root.add_subcommand(
      "run",
      "Runs COMMAND on every worker of an existing queued resource at once "
      "(MaxText's multihost_runner.py): packs --script_dir, stops what an "
      "earlier `multislice run` left running on the workers, copies the "
      "scripts into RUN_NAME/ in each worker's directory, starts the command "
      "in that folder with the worker's environment (the startup script's), "
      "and writes each worker's output to OUTPUT_DIR/RUN_NAME/output_slice_"
      "SSSS_worker_WWWW.txt here (slice 0 worker 0's is also echoed). When a "
      "worker fails, the others are stopped and the exit code is that "
      "worker's; 0 when all succeed, 130 after Ctrl-C (which stops the "
      "commands).\n"
      "The workers are reached through their hosts' agents or, for a queued "
      "resource of a controller with --capacity slurm, as steps of its Slurm "
      "job (srun --jobid=JOB --overlap on the workers' nodes, from here: a "
      "host with Slurm's client; the scripts reach every node on srun's "
      "stdin).\n"
      "--tpu_prefix P picks the queued resource whose nodes are P-0, P-1, "
      "... (its node prefix, which defaults to its id) or whose single node "
      "is P. multihost_runner.py's upper-case flags (--TPU_PREFIX, "
      "--COMMAND, --SCRIPT_DIR, --RUN_NAME, --USE_EXISTING_FOLDER, "
      "--PROJECT, --ZONE) work too.\n"
      "Example:\n"
      "  multislice run --qr my-qr --script_dir ./scripts "
      "--command 'bash train.sh' --run_name exp1 "
      "--controller http://127.0.0.1:8470 --token-file ~/.multislice/token");
  auto flags = std::make_shared<RunFlags>();
  RunFlags* f = flags.get();
  AddStringFlag(cmd, "qr", &f->queued_resource, "The queued resource's id.");
  AddStringFlag(cmd, "tpu_prefix", &f->tpu_prefix,
                "Instead of --qr: the queued resource's node prefix (also "
                "--TPU_PREFIX).");
  AddStringAlias(cmd, "TPU_PREFIX", &f->tpu_prefix);
  AddStringFlag(cmd, "project", &f->project,
                "The project --tpu_prefix looks in (also --PROJECT).")
      ->capture_default_str();
  AddStringAlias(cmd, "PROJECT", &f->project);
  AddStringFlag(cmd, "zone", &f->zone,
                "The zone --tpu_prefix looks in (default: every zone); with "
                "--qr, the zone it must be in (also --ZONE).");
  AddStringAlias(cmd, "ZONE", &f->zone);
  AddStringFlag(cmd, "command", &f->command,
                "Required: the shell command to run on each worker (bash -c), "
                "in RUN_NAME/ (also --COMMAND).");
  AddStringAlias(cmd, "COMMAND", &f->command);
  AddStringFlag(cmd, "script_dir", &f->script_dir,
                "The directory copied to every worker, without the output "
                "folders of runs and jobs in it; at most 256 MiB (also "
                "--SCRIPT_DIR).")
      ->capture_default_str();
  AddStringAlias(cmd, "SCRIPT_DIR", &f->script_dir);
  AddStringFlag(cmd, "run_name", &f->run_name,
                "Names the folder on the workers and here (default: the UTC "
                "time, YYYY-MM-DD-HH-MM-SS; also --RUN_NAME).");
  AddStringAlias(cmd, "RUN_NAME", &f->run_name);
  AddStringFlag(cmd, "output_dir", &f->output_dir,
                "The output files go to OUTPUT_DIR/RUN_NAME/ here.")
      ->capture_default_str();
  AddBoolFlag(cmd, "use_existing_folder", &f->use_existing_folder,
              "Skip the copy: RUN_NAME/ must already be on every worker "
              "(also --USE_EXISTING_FOLDER=True).");
  AddBoolAlias(cmd, "USE_EXISTING_FOLDER", &f->use_existing_folder);
  AddBoolAlias(cmd, "INTERNAL_IP", &f->internal_ip);
  AddControllerFlags(cmd, &f->controller);
  table[cmd] = [cmd, flags] { return RunRunCommand(cmd, *flags); };
}

}  // namespace multislice::cli
