// `multislice run`: MaxText's multihost_runner.py against an existing queued
// resource, through its hosts' agents (control/agent/runner.h).
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
  std::string command;
  std::string script_dir = ".";
  std::string run_name;
  bool use_existing_folder = false;
  ControllerFlags controller;
};

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  return code;
}

int RunRunCommand(const RunFlags& flags) {
  control::RunOptions options;
  if (flags.queued_resource.empty() == flags.tpu_prefix.empty()) {
    return Fail(2, "give exactly one of --qr and --tpu_prefix");
  }
  // Both go into URL paths.
  if (!flags.queued_resource.empty()) {
    Status id = control::ValidateResourceId("--qr", flags.queued_resource);
    if (!id.ok()) return Fail(2, id.message());
  }
  Status project = control::ValidateProjectId("--project", flags.project);
  if (!project.ok()) return Fail(2, project.message());
  options.queued_resource = flags.queued_resource;
  options.tpu_prefix = flags.tpu_prefix;
  options.project = flags.project;
  if (flags.command.empty()) return Fail(2, "--command: empty");
  options.command = flags.command;
  options.script_dir = flags.script_dir;
  options.run_name =
      flags.run_name.empty()
          ? control::DefaultRunName(std::chrono::system_clock::now())
          : flags.run_name;
  if (!control::ValidRunName(options.run_name)) {
    return Fail(2, "--run_name: '" + options.run_name +
                       "' is not 1 to 100 of [A-Za-z0-9._-] starting with a "
                       "letter or digit");
  }
  options.use_existing_folder = flags.use_existing_folder;
  auto access = control::ResolveControllerAccess(flags.controller.controller,
                                                 flags.controller.token_file);
  if (!access.ok()) return Fail(2, access.status().message());
  options.controller_url = access->url;
  options.token = access->token;
  options.terminal = ::isatty(STDERR_FILENO) == 1;
  options.cancel = control::CancelOnInterrupt();

  auto code = control::RunOnWorkers(options);
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
      "(MaxText's multihost_runner.py): packs --script_dir, copies it "
      "through the hosts' agents into RUN_NAME/ in each worker's directory, "
      "stops what an earlier `multislice run` left running there, starts "
      "the command in that folder with the worker's environment, and writes "
      "each worker's output to RUN_NAME/output_slice_SSSS_worker_WWWW.txt "
      "here (slice 0 worker 0's is also echoed). When a worker fails, the "
      "others are stopped and the exit code is that worker's; 0 when all "
      "succeed, 130 after Ctrl-C (which stops the commands).\n"
      "--tpu_prefix P picks the queued resource whose nodes are P-0, P-1, "
      "... (its node prefix, which defaults to its id) or whose single node "
      "is P.\n"
      "Example:\n"
      "  multislice run --qr my-qr --script_dir ./scripts "
      "--command 'bash train.sh' --run_name exp1 "
      "--controller http://127.0.0.1:8470 --token-file ~/.multislice/token");
  auto flags = std::make_shared<RunFlags>();
  AddStringFlag(cmd, "qr", &flags->queued_resource,
                "The queued resource's id.");
  AddStringFlag(cmd, "tpu_prefix", &flags->tpu_prefix,
                "Instead of --qr: the queued resource's node prefix.");
  AddStringFlag(cmd, "project", &flags->project,
                "The project --tpu_prefix looks in (every zone).")
      ->capture_default_str();
  AddStringFlag(cmd, "command", &flags->command,
                "The shell command to run on each worker (bash -c), in "
                "RUN_NAME/.")
      ->required();
  AddStringFlag(cmd, "script_dir", &flags->script_dir,
                "The directory copied to every worker.")
      ->capture_default_str();
  AddStringFlag(cmd, "run_name", &flags->run_name,
                "Names the folder on the workers and here (default: the UTC "
                "time, YYYY-MM-DD-HH-MM-SS).");
  AddBoolFlag(cmd, "use_existing_folder", &flags->use_existing_folder,
              "Skip the copy: RUN_NAME/ must already be on every worker.");
  AddControllerFlags(cmd, &flags->controller);
  table[cmd] = [flags] { return RunRunCommand(*flags); };
}

}  // namespace multislice::cli
