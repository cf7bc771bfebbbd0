// `multislice queued-resources ssh`: runs a command on chosen workers of a
// queued resource through their agents (control/agent/ssh.h). Takes
// gcloud's --zone, --project and --quiet too; the queued resource must be in
// that zone.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/control_client.h"
#include "cli/flags.h"
#include "control/agent/remote_exec.h"
#include "control/agent/selection.h"
#include "control/agent/ssh.h"

namespace multislice::cli {
namespace {

constexpr const char* kName = "multislice queued-resources ssh";

struct SshFlags {
  std::string queued_resource;
  std::string node = "all";
  std::string worker = "all";
  std::string command;
  int batch_size = 0;
  int batch_wait_seconds = 10;
  ControllerFlags controller;
  std::string project, zone;
  bool quiet = false;
};

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", kName, message.c_str());
  return code;
}

// The queued resource in --project/--zone (the workers' listing knows ids
// only).
Result<nlohmann::json> GetLocated(const SshFlags& flags) {
  ASSIGN_OR_RETURN(control::ApiClient client,
                   MakeControllerClient(flags.controller));
  return CheckedBody(client.Call(
      "GET", "/v2alpha1/projects/" + flags.project + "/locations/" +
                 flags.zone + "/queuedResources/" + flags.queued_resource));
}

// A queued resource on Slurm capacity (controller --capacity slurm): its
// workers are the tasks of Slurm job `clusterJob`, so the command runs as
// one more step of that job on the chosen workers' nodes (srun --overlap:
// beside the workers' own step), each output line labelled as on agents.
// srun's exit code is the highest of the workers'.
int ExecSshOverSlurm(const SshFlags& flags, const nlohmann::json& qr,
                     const control::Selection& nodes,
                     const control::Selection& workers) {
  const std::string job = qr.value("clusterJob", "");
  std::string nodelist, labels;
  int count = 0;
  const nlohmann::json list = qr.value("nodes", nlohmann::json::array());
  for (size_t i = 0; i < list.size(); ++i) {
    if (!nodes.Contains(static_cast<int>(i))) continue;
    const nlohmann::json hosts =
        list[i].value("hosts", nlohmann::json::array());
    for (size_t w = 0; w < hosts.size(); ++w) {
      if (!workers.Contains(static_cast<int>(w)) || !hosts[w].is_string()) {
        continue;
      }
      const std::string host = hosts[w];
      nodelist += (nodelist.empty() ? "" : ",") + host;
      labels += host + ":" + std::to_string(i) + ":" + std::to_string(w) + " ";
      ++count;
    }
  }
  if (count == 0) {
    return Fail(2, "--node " + flags.node + " --worker " + flags.worker +
                       ": no worker of " + flags.queued_resource +
                       " runs there (is it ACTIVE?)");
  }
  const std::string script =
      "for e in $MULTISLICE_SSH_LABELS; do IFS=: read -r h n w <<<\"$e\"; "
      "[ \"$h\" = \"$SLURMD_NODENAME\" ] && break; done; "
      "bash -c \"$MULTISLICE_SSH_COMMAND\" 2>&1 | "
      "sed -u \"s/^/[node $n worker $w] /\"; exit ${PIPESTATUS[0]}";
  ::setenv("MULTISLICE_SSH_LABELS", labels.c_str(), 1);
  ::setenv("MULTISLICE_SSH_COMMAND", flags.command.c_str(), 1);
  std::vector<std::string> args = {"srun",
                                   "--jobid=" + job,
                                   "--overlap",
                                   "--quiet",
                                   "--nodelist=" + nodelist,
                                   "--nodes=" + std::to_string(count),
                                   "--ntasks=" + std::to_string(count),
                                   "--ntasks-per-node=1",
                                   "bash",
                                   "-c",
                                   script};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp("srun", argv.data());
  return Fail(1, "cannot run srun (Slurm's client) for " +
                     flags.queued_resource +
                     ", a queued resource on Slurm: " + std::strerror(errno));
}

int RunSshCommand(const SshFlags& flags) {
  control::SshOptions options;
  options.queued_resource = flags.queued_resource;
  auto nodes = control::ParseSelection(flags.node, "--node");
  if (!nodes.ok()) return Fail(2, nodes.status().message());
  auto workers = control::ParseSelection(flags.worker, "--worker");
  if (!workers.ok()) return Fail(2, workers.status().message());
  options.nodes = *nodes;
  options.workers = *workers;
  if (flags.command.empty()) return Fail(2, "--command: empty");
  options.command = flags.command;
  if (flags.batch_size < 0) {
    return Fail(2, "--batch-size: expected at least 0 (0: all at once), got " +
                       std::to_string(flags.batch_size));
  }
  options.batch_size = flags.batch_size;
  if (flags.batch_wait_seconds < 1 || flags.batch_wait_seconds > 86400) {
    return Fail(2, "--batch-wait: expected 1 to 86400 seconds, got " +
                       std::to_string(flags.batch_wait_seconds));
  }
  options.batch_wait = std::chrono::seconds(flags.batch_wait_seconds);
  if (Status name = CheckResourceName("QR", flags.queued_resource);
      !name.ok()) {
    return Fail(2, name.message());
  }
  Result<nlohmann::json> located = GetLocated(flags);
  if (!located.ok()) {
    return Fail(ExitCodeFor(located.status()),
                InCliTerms(located.status().message()));
  }
  if (located->contains("clusterJob")) {
    return ExecSshOverSlurm(flags, *located, *nodes, *workers);
  }
  auto access = control::ResolveControllerAccess(flags.controller.controller,
                                                 flags.controller.token_file);
  if (!access.ok()) return Fail(2, access.status().message());
  options.controller_url = access->url;
  options.token = access->token;
  options.cancel = control::CancelOnInterrupt();

  auto code = control::RunSsh(options);
  if (!code.ok())
    return Fail(ExitCodeFor(code.status()), code.status().message());
  return *code;
}

}  // namespace

void AddQueuedResourcesSshCommand(CLI::App& queued_resources,
                                  CommandTable& table) {
  CLI::App* cmd = queued_resources.add_subcommand(
      "ssh",
      "Runs COMMAND (with bash -c, in the worker's directory and with its "
      "startup-script environment) on the chosen workers of a queued "
      "resource, through their hosts' agents. Every output line is printed "
      "as '[node N worker W] line'. Exits with the first non-zero exit code "
      "of a worker, in the order they finished (255 when an agent cannot be "
      "reached), or 0 when all succeed. On a controller with --capacity "
      "slurm the command runs as a step of the queued resource's Slurm job "
      "(srun --overlap on the chosen workers' nodes; the exit code is "
      "srun's, the highest of the workers').\n"
      "Batches: with --batch-size B, at most B workers run at once. A "
      "command that waits for every worker (a training job) would deadlock "
      "in batches, so when --batch-wait seconds pass without any worker of "
      "the running batch finishing while others still wait to start, one "
      "line says so and all the remaining workers start at once.\n"
      "Examples:\n"
      "  multislice queued-resources ssh my-qr --node=all --worker=all "
      "--command 'hostname; echo $MEGASCALE_SLICE_ID' "
      "--controller http://127.0.0.1:8470 --token-file ~/.multislice/token\n"
      "  multislice queued-resources ssh my-qr --zone=us-central1-a "
      "--node=all --worker=all --command=\"hostname\" --batch-size=4");
  auto flags = std::make_shared<SshFlags>();
  cmd->add_option("QR", flags->queued_resource, "The queued resource's id.")
      ->required();
  AddStringFlag(cmd, "node", &flags->node,
                "Nodes (slices) by index: all, i, i,j or a-b.")
      ->capture_default_str();
  AddStringFlag(cmd, "worker", &flags->worker,
                "Workers within each node: all, i, i,j or a-b.")
      ->capture_default_str();
  AddStringFlag(cmd, "command", &flags->command,
                "The shell command to run on each worker.")
      ->required();
  AddDashedIntFlag(cmd, "batch_size", &flags->batch_size,
                   "Workers running at once; 0: all.")
      ->capture_default_str();
  AddDashedIntFlag(cmd, "batch_wait", &flags->batch_wait_seconds,
                   "Seconds without a worker finishing after which all waiting "
                   "workers start (see above).")
      ->capture_default_str();
  AddControllerFlags(cmd, &flags->controller);
  AddLocationFlags(cmd, &flags->project, &flags->zone);
  AddQuietFlag(cmd, &flags->quiet);
  table[cmd] = [flags] { return RunSshCommand(*flags); };
}

}  // namespace multislice::cli
