// `multislice queued-resources create|list|describe|delete|reset|cleanup`
// (spec 4.2, mirroring `gcloud compute tpus queued-resources`): a client of
// the controller's v2alpha1 API. gcloud's habits (--format, bare-word
// --filter, --quiet, names checked before any call, errors naming the CLI's
// flags) come from control_client.h and gcloud_format.h. `ssh` is declared
// in queued_resources_ssh.cc.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/control_client.h"
#include "cli/flags.h"
#include "cli/gcloud_format.h"
#include "control/api_types.h"
#include "control/validation.h"
#include "runtime/launcher.h"

namespace multislice::cli {
namespace {

using nlohmann::json;

struct QrFlags {
  ControllerFlags connection;
  std::string project;
  std::string zone;
  bool quiet = false;
  std::string id;
  // create
  std::string accelerator_type, runtime_version = "v2-alpha";
  std::string node_id, node_prefix;
  int node_count = 0;
  bool node_count_given = false;
  bool reserved = false, spot = false, best_effort = false;
  std::string valid_until_duration, valid_until_time, valid_after_duration,
      valid_after_time;
  std::string network, subnetwork;
  std::vector<std::string> tags, metadata, metadata_from_file;
  bool async = false;
  int wait_seconds = 600;
  // delete
  bool force = false;
  // list, describe
  std::string filter;
  OutputFlags output;
};

// The columns of `list` (gcloud's: NAME ZONE NODE_COUNT ACCELERATOR_TYPE
// STATE), the short keys --filter and --format accept, and the top-level
// fields a queued resource may have (for --filter's unknown-key check).
constexpr const char* kQrTable =
    "table(name.basename():label=NAME, name.segment(3):label=ZONE, "
    "nodes.len():label=NODE_COUNT, "
    "tpu.nodeSpec[0].node.acceleratorType:label=ACCELERATOR_TYPE, "
    "state.state:label=STATE)";
const KeyAliases kQrAliases = {
    {"zone", "name.segment(3)"},
    {"node_count", "nodes.len()"},
    {"accelerator_type", "tpu.nodeSpec[0].node.acceleratorType"},
    {"runtime_version", "tpu.nodeSpec[0].node.runtimeVersion"},
    {"state", "state.state"}};
const std::set<std::string> kQrFields = {
    "name",          "state",          "tpu",
    "nodes",         "tier",           "attempt",
    "createTime",    "stateHistory",   "guaranteed",
    "spot",          "bestEffort",     "queueingPolicy",
    "waitingReason", "quotaHeldChips", "reservationName"};

int Fail(const std::string& command, const Status& s) {
  std::fprintf(stderr, "multislice queued-resources %s: %s\n", command.c_str(),
               InCliTerms(s.message()).c_str());
  return ExitCodeFor(s);
}

std::string Parent(const QrFlags& f) {
  return "/v2alpha1/projects/" + f.project + "/locations/" + f.zone;
}

// gcloud durations: "30s", "10m", "6h", "2d", or plain seconds; returned in
// the API's form "Ns".
Result<std::string> ApiDuration(const std::string& flag,
                                const std::string& text) {
  static const std::regex kPattern(R"(^([0-9]+)([smhd]?)$)");
  std::smatch m;
  if (!std::regex_match(text, m, kPattern)) {
    return InvalidArgument("--" + flag + ": '" + text +
                           "' is not a duration such as 30s, 10m, 6h or 2d");
  }
  long long n = std::stoll(m[1]);
  const std::string unit = m[2];
  const long long scale = unit == "m"   ? 60
                          : unit == "h" ? 3600
                          : unit == "d" ? 86400
                                        : 1;
  return std::to_string(n * scale) + "s";
}

Result<json> CreateBody(const QrFlags& f) {
  json node = {{"accelerator_type", f.accelerator_type},
               {"runtime_version", f.runtime_version}};
  if (!f.network.empty() || !f.subnetwork.empty()) {
    node["network_config"] = json::object();
    if (!f.network.empty()) node["network_config"]["network"] = f.network;
    if (!f.subnetwork.empty()) {
      node["network_config"]["subnetwork"] = f.subnetwork;
    }
  }
  if (!f.tags.empty()) node["tags"] = f.tags;
  json metadata = json::object();
  for (const std::string& kv : f.metadata) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgument("--metadata: '" + kv + "' is not KEY=VALUE");
    }
    metadata[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const std::string& kv : f.metadata_from_file) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgument("--metadata-from-file: '" + kv +
                             "' is not KEY=FILE");
    }
    std::ifstream in(kv.substr(eq + 1), std::ios::binary);
    if (!in) {
      return InvalidArgument("--metadata-from-file: cannot read '" +
                             kv.substr(eq + 1) + "'");
    }
    std::stringstream text;
    text << in.rdbuf();
    metadata[kv.substr(0, eq)] = text.str();
  }
  if (!metadata.empty()) node["metadata"] = metadata;
  json spec = {{"parent", "projects/" + f.project + "/locations/" + f.zone},
               {"node", node}};
  if (!f.node_id.empty() && f.node_count_given) {
    return InvalidArgument("--node-id: give either --node-id or --node-count");
  }
  if (f.node_count_given) {
    spec["multi_node_params"] = {{"node_count", f.node_count}};
    if (!f.node_prefix.empty()) {
      spec["multi_node_params"]["node_id_prefix"] = f.node_prefix;
    }
  } else {
    spec["node_id"] = f.node_id.empty() ? f.id : f.node_id;
  }
  json body = {{"tpu", {{"node_spec", json::array({spec})}}}};
  if (f.reserved + f.spot + f.best_effort > 1) {
    return InvalidArgument(
        "--reserved: give at most one of --reserved, --spot, --best-effort");
  }
  if (f.reserved) body["guaranteed"] = {{"reserved", true}};
  if (f.spot) body["spot"] = json::object();
  if (f.best_effort) body["best_effort"] = json::object();
  json policy = json::object();
  if (!f.valid_until_duration.empty()) {
    ASSIGN_OR_RETURN(
        policy["valid_until_duration"],
        ApiDuration("valid-until-duration", f.valid_until_duration));
  }
  if (!f.valid_after_duration.empty()) {
    ASSIGN_OR_RETURN(
        policy["valid_after_duration"],
        ApiDuration("valid-after-duration", f.valid_after_duration));
  }
  if (!f.valid_until_time.empty()) {
    policy["valid_until_time"] = f.valid_until_time;
  }
  if (!f.valid_after_time.empty()) {
    policy["valid_after_time"] = f.valid_after_time;
  }
  if (!policy.empty()) body["queueing_policy"] = policy;
  return body;
}

Result<json> Checked(Result<control::HttpResponse> r) {
  return CheckedBody(std::move(r));
}

// What gcloud checks before it calls: names, and the slice count in the
// flag's terms (the API would name tpu.node_spec[0].multi_node_params).
Status CheckCreateFlags(const QrFlags& f) {
  RETURN_IF_ERROR(CheckResourceName("QR", f.id));
  if (f.accelerator_type.empty()) {
    return InvalidArgument("--accelerator-type: is required");
  }
  if (!f.node_id.empty())
    RETURN_IF_ERROR(CheckResourceName("--node-id", f.node_id));
  if (f.node_count_given &&
      (f.node_count < 2 || f.node_count > control::kMaxNodeCount)) {
    return InvalidArgument("--node-count: " + std::to_string(f.node_count) +
                           " is not from 2 to " +
                           std::to_string(control::kMaxNodeCount) +
                           " (for one slice give --node-id, or neither flag)");
  }
  if (!f.node_prefix.empty()) {
    if (!f.node_count_given) {
      return InvalidArgument("--node-prefix: needs --node-count");
    }
    RETURN_IF_ERROR(CheckResourceName("--node-prefix", f.node_prefix));
    const std::string last =
        f.node_prefix + "-" + std::to_string(f.node_count - 1);
    if (last.size() > control::kMaxIdLength) {
      return InvalidArgument(
          "--node-prefix: '" + f.node_prefix + "' makes node names such as '" +
          last + "' longer than " + std::to_string(control::kMaxIdLength) +
          " characters");
    }
  }
  return OkStatus();
}

std::string StateOf(const json& qr) {
  return qr.contains("state") ? qr["state"].value("state", "") : "";
}

// Polls the queued resource until `done` says so; prints each new state on
// stderr. Returns the last answer (null JSON when it is gone).
Result<json> WaitFor(const control::ApiClient& client, const QrFlags& f,
                     const std::function<bool(const json&, bool gone)>& done) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(f.wait_seconds);
  std::string last_state, last_reason;
  const bool progress = runtime::ShowProgress();
  while (true) {
    Result<control::HttpResponse> r =
        client.Call("GET", Parent(f) + "/queuedResources/" + f.id);
    if (!r.ok()) return r.status();
    const bool gone = r->status == 404;
    if (!gone && r->status != 200) return control::ErrorFromResponse(*r);
    json qr = gone ? json() : r->body;
    const std::string state = gone ? "deleted" : StateOf(qr);
    // Why it waits, as the controller explains it: always said, since a
    // wait can be long.
    const std::string reason =
        qr.is_object() ? qr.value("waitingReason", "") : "";
    if (state != last_state || reason != last_reason) {
      if (!reason.empty()) {
        std::fprintf(stderr, "%s: %s: %s\n", f.id.c_str(), state.c_str(),
                     reason.c_str());
      } else if (progress || !last_state.empty()) {
        std::fprintf(stderr, "%s: %s\n", f.id.c_str(), state.c_str());
      }
      last_state = state;
      last_reason = reason;
    }
    if (done(qr, gone)) return qr;
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceeded("gave up waiting after " +
                              std::to_string(f.wait_seconds) + " s; " + f.id +
                              " is " + state + " (see --wait-timeout)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

int RunCreate(const QrFlags& f) {
  const char* kCmd = "create";
  if (Status s = CheckCreateFlags(f); !s.ok()) return Fail(kCmd, s);
  Result<json> body = CreateBody(f);
  if (!body.ok()) return Fail(kCmd, body.status());
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  Result<json> op = Checked(client->Call(
      "POST", Parent(f) + "/queuedResources?queued_resource_id=" + f.id,
      &*body));
  if (!op.ok()) return Fail(kCmd, op.status());
  if (f.async) {
    std::printf("Create request issued for: [%s]\noperation: %s\n",
                f.id.c_str(), op->value("name", "").c_str());
    return 0;
  }
  Result<json> qr = WaitFor(*client, f, [](const json& q, bool gone) {
    const std::string s = StateOf(q);
    return gone || s == "ACTIVE" || s == "FAILED" || s == "SUSPENDED";
  });
  if (!qr.ok()) return Fail(kCmd, qr.status());
  const std::string state = qr->is_null() ? "deleted" : StateOf(*qr);
  std::printf("Created queued resource [%s]: %s\n", f.id.c_str(),
              state.c_str());
  if (state == "FAILED") {
    std::fprintf(stderr, "multislice queued-resources create: %s\n",
                 (*qr)["state"]["failedData"]["error"]
                     .value("message", "failed")
                     .c_str());
  }
  return state == "ACTIVE" ? 0 : 1;
}

int RunDelete(const QrFlags& f) {
  const char* kCmd = "delete";
  if (Status s = CheckResourceName("QR", f.id); !s.ok()) return Fail(kCmd, s);
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  Result<json> op =
      Checked(client->Call("DELETE", Parent(f) + "/queuedResources/" + f.id +
                                         (f.force ? "?force=true" : "")));
  if (!op.ok()) return Fail(kCmd, op.status());
  if (f.async) {
    std::printf("Delete request issued for: [%s]\noperation: %s\n",
                f.id.c_str(), op->value("name", "").c_str());
    return 0;
  }
  Result<json> qr =
      WaitFor(*client, f, [](const json&, bool gone) { return gone; });
  if (!qr.ok()) return Fail(kCmd, qr.status());
  std::printf("Deleted queued resource [%s]\n", f.id.c_str());
  return 0;
}

int RunReset(const QrFlags& f) {
  const char* kCmd = "reset";
  if (Status s = CheckResourceName("QR", f.id); !s.ok()) return Fail(kCmd, s);
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  Result<json> before =
      Checked(client->Call("GET", Parent(f) + "/queuedResources/" + f.id));
  if (!before.ok()) return Fail(kCmd, before.status());
  const int attempt = before->value("attempt", 0);
  Result<json> op = Checked(
      client->Call("POST", Parent(f) + "/queuedResources/" + f.id + ":reset"));
  if (!op.ok()) return Fail(kCmd, op.status());
  if (f.async) {
    std::printf("Reset request issued for: [%s]\n", f.id.c_str());
    return 0;
  }
  Result<json> qr = WaitFor(*client, f, [&](const json& q, bool gone) {
    return gone ||
           (StateOf(q) == "ACTIVE" && q.value("attempt", 0) > attempt) ||
           StateOf(q) == "FAILED";
  });
  if (!qr.ok()) return Fail(kCmd, qr.status());
  const std::string state = qr->is_null() ? "deleted" : StateOf(*qr);
  std::printf("Reset queued resource [%s]: %s (attempt %d)\n", f.id.c_str(),
              state.c_str(), qr->is_null() ? 0 : qr->value("attempt", 0));
  return state == "ACTIVE" ? 0 : 1;
}

int RunDescribe(const QrFlags& f) {
  const char* kCmd = "describe";
  if (Status s = CheckResourceName("QR", f.id); !s.ok()) return Fail(kCmd, s);
  Result<OutputFormat> format = ParseOutputFlags(f.output, "yaml", kQrTable);
  if (!format.ok()) return Fail(kCmd, format.status());
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  Result<json> qr =
      Checked(client->Call("GET", Parent(f) + "/queuedResources/" + f.id));
  if (!qr.ok()) return Fail(kCmd, qr.status());
  std::fputs(FormatOne(*format, *qr, kQrAliases).c_str(), stdout);
  return 0;
}

// FAILED and SUSPENDED queued resources still hold quota: say so.
void NoteHeldQuota(const json& listed) {
  int holding = 0;
  long long chips = 0;
  for (const json& qr : listed) {
    const std::string s = StateOf(qr);
    const long long held = qr.value("quotaHeldChips", 0LL);
    if ((s == "FAILED" || s == "SUSPENDED") && held > 0) {
      ++holding;
      chips += held;
    }
  }
  if (holding > 0) {
    std::fprintf(stderr,
                 "note: %d FAILED or SUSPENDED queued resource%s still hold "
                 "%lld chips of quota until deleted (multislice "
                 "queued-resources cleanup)\n",
                 holding, holding == 1 ? "" : "s", chips);
  }
}

int RunList(const QrFlags& f) {
  const char* kCmd = "list";
  Result<OutputFormat> format = ParseOutputFlags(f.output, kQrTable, kQrTable);
  if (!format.ok()) return Fail(kCmd, format.status());
  Result<ResourceFilter> filter = ParseFilter(f.filter, kQrAliases);
  if (!filter.ok()) return Fail(kCmd, filter.status());
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  Result<json> all =
      ListAllPages(*client, Parent(f) + "/queuedResources", "queuedResources");
  if (!all.ok()) return Fail(kCmd, all.status());
  Status keys = CheckFilterKeys(*filter, *all, kQrAliases, kQrFields);
  if (!keys.ok()) return Fail(kCmd, keys);
  json listed = json::array();
  for (const json& qr : *all) {
    if (filter->matches(qr)) listed.push_back(qr);
  }
  std::fputs(FormatList(*format, listed, kQrAliases).c_str(), stdout);
  if (listed.empty() && format->kind == OutputFormat::Kind::kTable) {
    std::fprintf(stderr, "Listed 0 items.\n");  // as gcloud says it
  }
  NoteHeldQuota(listed);
  return 0;
}

// Deletes every FAILED or SUSPENDED queued resource of the zone: they hold
// quota until deleted (spec 4.1: offer cleanup).
int RunCleanup(const QrFlags& f) {
  const char* kCmd = "cleanup";
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  Result<json> all =
      ListAllPages(*client, Parent(f) + "/queuedResources", "queuedResources");
  if (!all.ok()) return Fail(kCmd, all.status());
  std::vector<std::string> ids;
  long long chips = 0;
  for (const json& qr : *all) {
    const std::string state = StateOf(qr);
    if (state == "FAILED" || state == "SUSPENDED") {
      ids.push_back(ValueOfKey(qr, "name.basename()", {}).get<std::string>());
      chips += qr.value("quotaHeldChips", 0LL);
    }
  }
  for (const std::string& id : ids) {
    Result<json> op =
        Checked(client->Call("DELETE", Parent(f) + "/queuedResources/" + id));
    if (!op.ok()) return Fail(kCmd, op.status().WithContext(id));
    std::fprintf(stderr, "deleting %s\n", id.c_str());
  }
  for (const std::string& id : ids) {
    QrFlags one = f;
    one.id = id;
    Result<json> gone =
        WaitFor(*client, one, [](const json&, bool gone) { return gone; });
    if (!gone.ok()) return Fail(kCmd, gone.status());
  }
  std::printf(
      "Deleted %zu FAILED or SUSPENDED queued resource%s (%lld chips "
      "of quota released)\n",
      ids.size(), ids.size() == 1 ? "" : "s", chips);
  return 0;
}

// --controller, --token-file, --project, --zone and --quiet: every
// subcommand takes them, as gcloud's do.
void AddLocationFlags(CLI::App* cmd, QrFlags* f) {
  AddControllerFlags(cmd, &f->connection);
  cli::AddLocationFlags(cmd, &f->project, &f->zone);
  AddQuietFlag(cmd, &f->quiet);
}

void AddWaitFlags(CLI::App* cmd, QrFlags* f) {
  AddBoolFlag(cmd, "async", &f->async,
              "Return once the request is accepted, without waiting.");
  AddDashedIntFlag(cmd, "wait_timeout", &f->wait_seconds,
                   "Seconds to wait for the final state.")
      ->capture_default_str();
}

}  // namespace

void AddQueuedResourcesCommand(CLI::App& root, CommandTable& table) {
  CLI::App* qr = root.add_subcommand(
      "queued-resources",
      "Queued resources: slices requested together, provisioned all or "
      "nothing, repaired when a host fails (mirrors gcloud compute tpus "
      "queued-resources). The controller comes from --controller or "
      "$MULTISLICE_CONTROLLER, its token from --token-file or "
      "$MULTISLICE_TOKEN_FILE.");
  qr->require_subcommand(1);

  auto create_flags = std::make_shared<QrFlags>();
  CLI::App* create = qr->add_subcommand(
      "create",
      "Requests slices as one queued resource and waits until it is ACTIVE "
      "(or FAILED), printing each state. Names (QR, --node-id, "
      "--node-prefix) follow Cloud TPU's rule: 1 to 63 lower-case letters, "
      "digits and hyphens, starting with a letter.\n"
      "Examples:\n"
      "  multislice queued-resources create my-qr --accelerator-type cpu-2 "
      "--node-count 2 --metadata-from-file startup-script=train.sh "
      "--controller http://127.0.0.1:8470 --token-file "
      "multislice-controller/token\n"
      "  multislice queued-resources create my-qr "
      "--accelerator-type=cpu-1 --runtime-version=v2-alpha-tpuv5-lite "
      "--node-count=2 --node-prefix=my-tpu --zone=us-central1-a --reserved");
  {
    QrFlags* f = create_flags.get();
    create->add_option("QR", f->id, "The queued resource's id.")->required();
    AddLocationFlags(create, f);
    AddStringFlag(create, "accelerator_type", &f->accelerator_type,
                  "Type of each slice, e.g. cpu-2 or v5p-8.");
    AddStringFlag(create, "runtime_version", &f->runtime_version,
                  "Runtime version (recorded).")
        ->capture_default_str();
    AddStringFlag(create, "node_id", &f->node_id, "One slice with this id.");
    AddDashedIntFlag(create, "node_count", &f->node_count,
                     "Number of slices, 2 to 256.");
    AddStringFlag(create, "node_prefix", &f->node_prefix,
                  "Prefix of the slices' ids (default: the QR id).");
    AddBoolFlag(create, "reserved", &f->reserved, "Use reserved capacity.");
    AddBoolFlag(create, "spot", &f->spot,
                "Use spot capacity (preempted by reserved requests).");
    AddBoolFlag(create, "best_effort", &f->best_effort,
                "Use best-effort capacity.");
    AddStringFlag(create, "valid_until_duration", &f->valid_until_duration,
                  "Fail if not provisioned within this long (30s, 10m, 6h).");
    AddStringFlag(create, "valid_until_time", &f->valid_until_time,
                  "Fail if not provisioned by this RFC 3339 time.");
    AddStringFlag(create, "valid_after_duration", &f->valid_after_duration,
                  "Not provisioned before this long from now.");
    AddStringFlag(create, "valid_after_time", &f->valid_after_time,
                  "Not provisioned before this RFC 3339 time.");
    AddStringFlag(create, "network", &f->network, "Network (recorded).");
    AddStringFlag(create, "subnetwork", &f->subnetwork,
                  "Subnetwork (recorded).");
    create->add_option(FlagNames("tags"), f->tags, "Tags (recorded).")
        ->delimiter(',');
    create->add_option(FlagNames("metadata"), f->metadata,
                       "KEY=VALUE metadata, e.g. startup-script='...'; "
                       "repeat for more.");
    create->add_option(FlagNames("metadata_from_file"), f->metadata_from_file,
                       "KEY=FILE metadata read from a file, e.g. "
                       "startup-script=train.sh.");
    AddWaitFlags(create, f);
  }
  CLI::Option* node_count = create->get_option("--node_count");
  table[create] = [create_flags, node_count] {
    create_flags->node_count_given = node_count->count() > 0;
    return RunCreate(*create_flags);
  };

  auto list_flags = std::make_shared<QrFlags>();
  CLI::App* list = qr->add_subcommand(
      "list",
      "Lists queued resources as NAME ZONE NODE_COUNT ACCELERATOR_TYPE "
      "STATE (gcloud's table); --zone - lists every zone. --filter takes "
      "gcloud's expressions: a bare word found in any field (the seed's "
      "--filter=${QR_ID}), KEY=VALUE, KEY!=VALUE, KEY:PATTERN (substring "
      "or glob), KEY~REGEX, joined by AND, OR, NOT and parentheses; short "
      "keys name, zone, state, accelerator_type, node_count, tier, or any "
      "dotted field path.\n"
      "Examples:\n"
      "  multislice queued-resources list --filter=my-qr --zone=us-central1-a\n"
      "  multislice queued-resources list --filter 'state=ACTIVE AND "
      "node_count>1' --format 'value(name.basename())'");
  AddLocationFlags(list, list_flags.get());
  AddStringFlag(list, "filter", &list_flags->filter,
                "gcloud filter expression (see above).");
  AddOutputFlags(list, &list_flags->output, "the table above");
  table[list] = [list_flags] { return RunList(*list_flags); };

  auto describe_flags = std::make_shared<QrFlags>();
  CLI::App* describe = qr->add_subcommand(
      "describe",
      "Prints a queued resource, as YAML by default (gcloud's "
      "`state:\\n  state: ACTIVE`).\n"
      "Examples:\n"
      "  multislice queued-resources describe my-qr --zone=us-central1-a\n"
      "  multislice queued-resources describe my-qr --format "
      "'value(state.state)'");
  describe->add_option("QR", describe_flags->id, "The queued resource's id.")
      ->required();
  AddLocationFlags(describe, describe_flags.get());
  AddOutputFlags(describe, &describe_flags->output, "yaml");
  table[describe] = [describe_flags] { return RunDescribe(*describe_flags); };

  auto delete_flags = std::make_shared<QrFlags>();
  CLI::App* del = qr->add_subcommand(
      "delete",
      "Deletes a queued resource and waits until it is gone. Without "
      "--force only ACCEPTED, FAILED or SUSPENDED ones. Never prompts "
      "(--quiet is accepted).\nExample:\n"
      "  multislice queued-resources delete my-qr --zone=us-central1-a "
      "--force --async");
  del->add_option("QR", delete_flags->id, "The queued resource's id.")
      ->required();
  AddLocationFlags(del, delete_flags.get());
  AddBoolFlag(del, "force", &delete_flags->force,
              "Delete its slices first, whatever its state.");
  AddWaitFlags(del, delete_flags.get());
  table[del] = [delete_flags] { return RunDelete(*delete_flags); };

  auto reset_flags = std::make_shared<QrFlags>();
  CLI::App* reset = qr->add_subcommand(
      "reset",
      "Restarts the startup scripts of every slice of an ACTIVE queued "
      "resource (old processes stopped first; MULTISLICE_ATTEMPT + 1) and "
      "waits until it is ACTIVE again.\nExample:\n"
      "  multislice queued-resources reset my-qr");
  reset->add_option("QR", reset_flags->id, "The queued resource's id.")
      ->required();
  AddLocationFlags(reset, reset_flags.get());
  AddWaitFlags(reset, reset_flags.get());
  table[reset] = [reset_flags] { return RunReset(*reset_flags); };

  auto cleanup_flags = std::make_shared<QrFlags>();
  CLI::App* cleanup = qr->add_subcommand(
      "cleanup",
      "Deletes every FAILED or SUSPENDED queued resource of the zone, which "
      "hold quota until deleted, and waits until they are gone.\nExample:\n"
      "  multislice queued-resources cleanup --zone us-central2-b");
  AddLocationFlags(cleanup, cleanup_flags.get());
  AddDashedIntFlag(cleanup, "wait_timeout", &cleanup_flags->wait_seconds,
                   "Seconds to wait for each deletion.")
      ->capture_default_str();
  table[cleanup] = [cleanup_flags] { return RunCleanup(*cleanup_flags); };

  AddQueuedResourcesSshCommand(*qr, table);
}

}  // namespace multislice::cli
