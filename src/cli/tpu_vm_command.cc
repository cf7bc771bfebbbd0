// `multislice tpu-vm list|describe|ssh|scp` (mirroring `gcloud compute tpus
// tpu-vm`): the nodes of queued resources as TPU VMs. A node is named as
// Cloud TPU names it (the controller's nodes resource): the QR's --node-id,
// or PREFIX-0 ... PREFIX-(n-1) for --node-count (PREFIX: --node-prefix, else
// the QR's id). ssh and scp reach the node's workers through their hosts'
// agents, with the code `queued-resources ssh` uses (control/agent/ssh.h,
// remote_exec.h); scp uploads with the agent's file API, which has no
// download, so copies go to the node only.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/control_client.h"
#include "cli/flags.h"
#include "cli/gcloud_format.h"
#include "control/agent/agent.h"
#include "control/agent/remote_exec.h"
#include "control/agent/selection.h"
#include "control/agent/ssh.h"

namespace multislice::cli {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// gcloud's tpu-vm list columns, as far as a local node has them.
constexpr const char* kNodeTable =
    "table(name.basename():label=NAME, name.segment(3):label=ZONE, "
    "acceleratorType:label=ACCELERATOR_TYPE, state:label=STATUS, "
    "health:label=HEALTH, queuedResource.basename():label=QUEUED_RESOURCE)";
const KeyAliases kNodeAliases = {
    {"zone", "name.segment(3)"},
    {"status", "state"},
    {"accelerator_type", "acceleratorType"},
    {"queued_resource", "queuedResource.basename()"}};
const std::set<std::string> kNodeFields = {
    "name",       "acceleratorType",  "runtimeVersion",
    "state",      "health",           "queuedResource",
    "createTime", "networkEndpoints", "metadata",
    "tags",       "networkConfig"};

struct TpuVmFlags {
  ControllerFlags connection;
  std::string project, zone;
  bool quiet = false;
  std::string node;
  // list, describe
  std::string filter;
  OutputFlags output;
  // ssh, scp
  std::string worker = "0";
  std::string command;
  int batch_size = 0;
  bool recurse = false;
  std::vector<std::string> paths;  // scp: SRC... NODE:DEST
};

int Fail(const std::string& command, const Status& s) {
  std::fprintf(stderr, "multislice tpu-vm %s: %s\n", command.c_str(),
               InCliTerms(s.message()).c_str());
  return ExitCodeFor(s);
}

std::string NodesPath(const TpuVmFlags& f) {
  return "/v2alpha1/projects/" + f.project + "/locations/" + f.zone + "/nodes";
}

int RunList(const TpuVmFlags& f) {
  const char* kCmd = "list";
  Result<OutputFormat> format =
      ParseOutputFlags(f.output, kNodeTable, kNodeTable);
  if (!format.ok()) return Fail(kCmd, format.status());
  Result<ResourceFilter> filter = ParseFilter(f.filter, kNodeAliases);
  if (!filter.ok()) return Fail(kCmd, filter.status());
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  Result<json> all = ListAllPages(*client, NodesPath(f), "nodes");
  if (!all.ok()) return Fail(kCmd, all.status());
  Status keys = CheckFilterKeys(*filter, *all, kNodeAliases, kNodeFields);
  if (!keys.ok()) return Fail(kCmd, keys);
  json listed = json::array();
  for (const json& node : *all) {
    if (filter->matches(node)) listed.push_back(node);
  }
  std::fputs(FormatList(*format, listed, kNodeAliases).c_str(), stdout);
  if (listed.empty() && format->kind == OutputFormat::Kind::kTable) {
    std::fprintf(stderr, "Listed 0 items.\n");
  }
  return 0;
}

int RunDescribe(const TpuVmFlags& f) {
  const char* kCmd = "describe";
  if (Status s = CheckResourceName("NODE", f.node); !s.ok()) {
    return Fail(kCmd, s);
  }
  Result<OutputFormat> format = ParseOutputFlags(f.output, "yaml", kNodeTable);
  if (!format.ok()) return Fail(kCmd, format.status());
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  Result<json> node =
      CheckedBody(client->Call("GET", NodesPath(f) + "/" + f.node));
  if (!node.ok()) return Fail(kCmd, node.status());
  std::fputs(FormatOne(*format, *node, kNodeAliases).c_str(), stdout);
  return 0;
}

// Where a node's workers are: its queued resource and its index there.
struct NodePlace {
  std::string queued_resource;
  int index = 0;
};

Result<NodePlace> LocateNode(const control::ApiClient& client,
                             const TpuVmFlags& f) {
  RETURN_IF_ERROR(CheckResourceName("NODE", f.node));
  ASSIGN_OR_RETURN(
      json node, CheckedBody(client.Call("GET", NodesPath(f) + "/" + f.node)));
  NodePlace place;
  place.queued_resource =
      ValueOfKey(node, "queuedResource.basename()", {}).get<std::string>();
  ASSIGN_OR_RETURN(
      json qr,
      CheckedBody(client.Call(
          "GET", "/v2alpha1/projects/" + f.project + "/locations/" + f.zone +
                     "/queuedResources/" + place.queued_resource)));
  const json nodes = qr.value("nodes", json::array());
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].value("nodeId", "") == f.node) {
      place.index = static_cast<int>(i);
      return place;
    }
  }
  return NotFound("node " + f.node + " is not a node of queued resource " +
                  place.queued_resource);
}

// The command of `tpu-vm ssh`: --command, else standard input when it is
// not a terminal (as `ssh host < script` runs it).
Result<std::string> SshCommand(const TpuVmFlags& f) {
  if (!f.command.empty()) return f.command;
  if (::isatty(STDIN_FILENO)) {
    return InvalidArgument(
        "--command: not given, and an interactive shell is not supported: "
        "give --command=CMD or pipe the commands on standard input");
  }
  std::stringstream in;
  in << std::cin.rdbuf();
  if (in.str().find_first_not_of(" \t\n") == std::string::npos) {
    return InvalidArgument(
        "--command: not given and standard input holds no command");
  }
  return in.str();
}

int RunSsh(const TpuVmFlags& f) {
  const char* kCmd = "ssh";
  Result<std::string> command = SshCommand(f);
  if (!command.ok()) return Fail(kCmd, command.status());
  auto workers = control::ParseSelection(f.worker, "--worker");
  if (!workers.ok()) return Fail(kCmd, workers.status());
  if (f.batch_size < 0) {
    return Fail(kCmd, InvalidArgument("--batch-size: expected at least 0 (0: "
                                      "all at once), got " +
                                      std::to_string(f.batch_size)));
  }
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  Result<NodePlace> place = LocateNode(*client, f);
  if (!place.ok()) return Fail(kCmd, place.status());
  auto access = control::ResolveControllerAccess(f.connection.controller,
                                                 f.connection.token_file);
  if (!access.ok()) return Fail(kCmd, access.status());
  control::SshOptions options;
  options.controller_url = access->url;
  options.token = access->token;
  options.queued_resource = place->queued_resource;
  options.nodes.indices = {place->index};
  options.workers = *workers;
  options.command = *command;
  options.batch_size = f.batch_size;
  options.cancel = control::CancelOnInterrupt();
  Result<int> code = control::RunSsh(options);
  if (!code.ok()) return Fail(kCmd, code.status());
  return *code;
}

// ----- scp -----

// One local file and where it goes, relative to the worker's directory.
struct Upload {
  std::string local;
  std::string remote;
};

// DEST as a path relative to the worker's directory ("~/a/./b" -> "a/b").
Result<std::string> RemotePath(const std::string& dest) {
  std::string rest = dest;
  if (rest == "~" || rest.rfind("~/", 0) == 0)
    rest.erase(0, 1);
  else if (!rest.empty() && rest[0] == '/') {
    return InvalidArgument(
        "NODE:DEST: '" + dest +
        "' is absolute: destinations are relative to the worker's directory "
        "(where ssh commands run), e.g. my-tpu:data/ or my-tpu:~/data/");
  }
  std::string out;
  std::stringstream parts(rest);
  for (std::string part; std::getline(parts, part, '/');) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      return InvalidArgument("NODE:DEST: '" + dest +
                             "' leaves the worker's directory ('..')");
    }
    out += (out.empty() ? "" : "/") + part;
  }
  return out;
}

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

// The files of `sources` and their remote paths under `dest`, which is a
// directory when it ends with '/', is the worker's directory itself, or
// receives several sources.
Result<std::vector<Upload>> PlanUploads(const std::vector<std::string>& sources,
                                        const std::string& dest_text,
                                        bool recurse) {
  ASSIGN_OR_RETURN(std::string dest, RemotePath(dest_text));
  const bool into = dest.empty() || dest_text.back() == '/' ||
                    dest_text.back() == '.' || sources.size() > 1;
  std::vector<Upload> uploads;
  for (const std::string& src : sources) {
    std::error_code ec;
    const fs::path path(src);
    const std::string name = fs::path(src).lexically_normal().filename();
    const std::string target =
        into ? Join(dest, name.empty() ? path.parent_path().filename().string()
                                       : name)
             : dest;
    if (fs::is_directory(path, ec)) {
      if (!recurse) {
        return InvalidArgument("SRC: '" + src +
                               "' is a directory: give --recurse");
      }
      for (const auto& entry : fs::recursive_directory_iterator(path, ec)) {
        if (!entry.is_regular_file()) continue;
        uploads.push_back(
            {entry.path().string(),
             Join(target, fs::relative(entry.path(), path).string())});
      }
    } else if (fs::is_regular_file(path, ec)) {
      if (target.empty()) {
        return InvalidArgument("NODE:DEST: give a file or directory name");
      }
      uploads.push_back({src, target});
    } else {
      return InvalidArgument("SRC: '" + src + "' is not a file or directory" +
                             (src.find(':') != std::string::npos
                                  ? " (copying from a TPU VM is not "
                                    "supported: the agent has no download)"
                                  : ""));
    }
  }
  return uploads;
}

Result<std::string> ReadLocalFile(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return InvalidArgument("SRC: cannot read '" + path + "'");
  if (size > control::kMaxUploadBytes) {
    return InvalidArgument("SRC: '" + path + "' is larger than the " +
                           std::to_string(control::kMaxUploadBytes >> 20) +
                           " MiB an upload may be");
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (!in) return InvalidArgument("SRC: cannot read '" + path + "'");
  return bytes.str();
}

// The chosen workers of the node (by --worker), with their agents.
Result<std::vector<control::WorkerTarget>> NodeWorkers(
    const control::ApiClient& client, const NodePlace& place,
    const control::Selection& workers) {
  ASSIGN_OR_RETURN(
      std::vector<control::WorkerTarget> all,
      control::ListQueuedResourceWorkers(client, place.queued_resource));
  std::vector<control::WorkerTarget> chosen;
  int max_worker = -1;
  for (control::WorkerTarget& t : all) {
    if (t.node_index != place.index) continue;
    max_worker = std::max(max_worker, t.worker);
    if (workers.Contains(t.worker)) chosen.push_back(std::move(t));
  }
  if (chosen.empty()) {
    return InvalidArgument(
        "--worker: selects no worker: the node has "
        "workers 0 to " +
        std::to_string(max_worker));
  }
  return chosen;
}

Status CopyToWorkers(const std::vector<control::WorkerTarget>& targets,
                     const std::vector<Upload>& uploads,
                     const std::string& token, const std::string& node) {
  std::vector<std::string> bytes;
  size_t total = 0;
  for (const Upload& u : uploads) {
    ASSIGN_OR_RETURN(std::string b, ReadLocalFile(u.local));
    total += b.size();
    bytes.push_back(std::move(b));
  }
  for (const control::WorkerTarget& t : targets) {
    ASSIGN_OR_RETURN(control::AgentClient agent,
                     control::AgentClient::Create(
                         t.agent_address, control::AgentTokenFor(t, token),
                         std::chrono::seconds(120)));
    for (size_t i = 0; i < uploads.size(); ++i) {
      Status put = agent.PutFile(t.worker_name, uploads[i].remote, bytes[i]);
      if (!put.ok()) {
        return put.WithContext("worker " + std::to_string(t.worker) + " (" +
                               uploads[i].remote + ")");
      }
    }
    std::printf("Copied %zu file%s (%zu bytes) to %s worker %d\n",
                uploads.size(), uploads.size() == 1 ? "" : "s", total,
                node.c_str(), t.worker);
  }
  return OkStatus();
}

int RunScp(TpuVmFlags f) {
  const char* kCmd = "scp";
  if (f.paths.size() < 2) {
    return Fail(kCmd, InvalidArgument("SRC... NODE:DEST: expected at least "
                                      "one source and a destination"));
  }
  const std::string last = f.paths.back();
  const size_t colon = last.find(':');
  if (colon == std::string::npos) {
    return Fail(kCmd,
                InvalidArgument("NODE:DEST: '" + last +
                                "' names no node (copying from a TPU VM is not "
                                "supported: the agent has no download)"));
  }
  f.node = last.substr(0, colon);
  const std::vector<std::string> sources(f.paths.begin(), f.paths.end() - 1);
  Result<std::vector<Upload>> uploads =
      PlanUploads(sources, last.substr(colon + 1), f.recurse);
  if (!uploads.ok()) return Fail(kCmd, uploads.status());
  auto workers = control::ParseSelection(f.worker, "--worker");
  if (!workers.ok()) return Fail(kCmd, workers.status());
  auto access = control::ResolveControllerAccess(f.connection.controller,
                                                 f.connection.token_file);
  if (!access.ok()) return Fail(kCmd, access.status());
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  Result<NodePlace> place = LocateNode(*client, f);
  if (!place.ok()) return Fail(kCmd, place.status());
  Result<std::vector<control::WorkerTarget>> targets =
      NodeWorkers(*client, *place, *workers);
  if (!targets.ok()) return Fail(kCmd, targets.status());
  Status copied = CopyToWorkers(*targets, *uploads, access->token, f.node);
  if (!copied.ok()) return Fail(kCmd, copied);
  return 0;
}

// ----- registration -----

void AddCommonFlags(CLI::App* cmd, TpuVmFlags* f) {
  AddControllerFlags(cmd, &f->connection);
  AddLocationFlags(cmd, &f->project, &f->zone);
  AddQuietFlag(cmd, &f->quiet);
}

void AddListAndDescribe(CLI::App* tpu_vm, CommandTable& table) {
  auto list_flags = std::make_shared<TpuVmFlags>();
  CLI::App* list = tpu_vm->add_subcommand(
      "list",
      "Lists the TPU VMs (nodes of queued resources) of a zone as NAME ZONE "
      "ACCELERATOR_TYPE STATUS HEALTH QUEUED_RESOURCE; --zone - lists every "
      "zone. --filter and --format as in queued-resources list.\n"
      "Examples:\n"
      "  multislice tpu-vm list --zone=us-central1-a\n"
      "  multislice tpu-vm list --zone=us-central1-a --filter=my-qr "
      "--format='value(name.basename(),networkEndpoints.ipAddress)'");
  AddCommonFlags(list, list_flags.get());
  AddStringFlag(list, "filter", &list_flags->filter,
                "gcloud filter expression: bare words, KEY=VALUE, KEY:PATTERN "
                "... (short keys zone, status, accelerator_type, "
                "queued_resource).");
  AddOutputFlags(list, &list_flags->output, "the table above");
  table[list] = [list_flags] { return RunList(*list_flags); };

  auto describe_flags = std::make_shared<TpuVmFlags>();
  CLI::App* describe = tpu_vm->add_subcommand(
      "describe",
      "Prints a TPU VM (a node of a queued resource), as YAML by default: "
      "its accelerator type, state, health, network endpoints (one per "
      "worker) and queued resource.\n"
      "Examples:\n"
      "  multislice tpu-vm describe my-tpu --zone=us-central1-a\n"
      "  multislice tpu-vm describe my-tpu-0 --zone=us-central1-a "
      "--format='value(state,health)'");
  describe->add_option("NODE", describe_flags->node, "The node's name.")
      ->required();
  AddCommonFlags(describe, describe_flags.get());
  AddOutputFlags(describe, &describe_flags->output, "yaml");
  table[describe] = [describe_flags] { return RunDescribe(*describe_flags); };
}

void AddSsh(CLI::App* tpu_vm, CommandTable& table) {
  auto flags = std::make_shared<TpuVmFlags>();
  CLI::App* ssh = tpu_vm->add_subcommand(
      "ssh",
      "Runs a command on workers of a TPU VM through their hosts' agents, "
      "as queued-resources ssh does (bash -c, in the worker's directory, "
      "with its startup-script environment; output lines prefixed '[node N "
      "worker W] '; the first non-zero exit code). Without --command the "
      "command is read from standard input; an interactive shell is not "
      "supported.\n"
      "Examples:\n"
      "  multislice tpu-vm ssh my-tpu --zone=us-central1-a --worker=all "
      "--command=\"hostname\"\n"
      "  echo 'python3 -V' | multislice tpu-vm ssh my-tpu "
      "--zone=us-central1-a");
  ssh->add_option("NODE", flags->node, "The node's name.")->required();
  AddCommonFlags(ssh, flags.get());
  AddStringFlag(ssh, "worker", &flags->worker,
                "Workers of the node: all, i, i,j or a-b.")
      ->capture_default_str();
  AddStringFlag(ssh, "command", &flags->command,
                "The shell command to run on each worker.");
  AddDashedIntFlag(ssh, "batch_size", &flags->batch_size,
                   "Workers running at once; 0: all.")
      ->capture_default_str();
  table[ssh] = [flags] { return RunSsh(*flags); };
}

void AddScp(CLI::App* tpu_vm, CommandTable& table) {
  auto flags = std::make_shared<TpuVmFlags>();
  CLI::App* scp = tpu_vm->add_subcommand(
      "scp",
      "Copies local files to workers of a TPU VM through their agents' "
      "upload API (written atomically, mode 0600). DEST is relative to the "
      "worker's directory, where ssh commands run (~/ means it too); it is "
      "a directory when it ends with '/' or several sources are given. "
      "Copying from a TPU VM is not supported (the agent has no download).\n"
      "Examples:\n"
      "  multislice tpu-vm scp train.sh my-tpu:~/ --zone=us-central1-a "
      "--worker=all\n"
      "  multislice tpu-vm scp --recurse maxtext my-tpu:code/ "
      "--zone=us-central1-a --worker=all");
  scp->add_option("PATHS", flags->paths, "SRC... NODE:DEST")->required();
  AddCommonFlags(scp, flags.get());
  AddStringFlag(scp, "worker", &flags->worker,
                "Workers of the node: all, i, i,j or a-b.")
      ->capture_default_str();
  AddBoolFlag(scp, "recurse", &flags->recurse, "Copy directories.");
  table[scp] = [flags] { return RunScp(*flags); };
}

}  // namespace

void AddTpuVmCommand(CLI::App& root, CommandTable& table) {
  CLI::App* tpu_vm = root.add_subcommand(
      "tpu-vm",
      "TPU VMs: the nodes of queued resources, named as Cloud TPU names "
      "them (the QR's --node-id, or PREFIX-0 ... for --node-count); mirrors "
      "gcloud compute tpus tpu-vm. The controller comes from --controller "
      "or $MULTISLICE_CONTROLLER, its token from --token-file or "
      "$MULTISLICE_TOKEN_FILE.");
  tpu_vm->require_subcommand(1);
  AddListAndDescribe(tpu_vm, table);
  AddSsh(tpu_vm, table);
  AddScp(tpu_vm, table);
}

}  // namespace multislice::cli
