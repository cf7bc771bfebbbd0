// `multislice queued-resources create|list|describe|delete|reset` (spec
// 4.2, mirroring `gcloud compute tpus queued-resources`): a client of the
// controller's v2alpha1 API. `ssh` is declared in queued_resources_ssh.cc.
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
#include "control/api_types.h"
#include "runtime/launcher.h"

namespace multislice::cli {
namespace {

using nlohmann::json;

struct QrFlags {
  ControllerFlags connection;
  std::string project = "local";
  std::string zone = "local-a";
  std::string id;
  // create
  std::string accelerator_type, runtime_version = "v2-alpha";
  std::string node_id, node_prefix;
  int node_count = 0;
  bool reserved = false, spot = false, best_effort = false;
  std::string valid_until_duration, valid_until_time, valid_after_duration,
      valid_after_time;
  std::string network, subnetwork;
  std::vector<std::string> tags, metadata, metadata_from_file;
  bool async = false;
  int wait_seconds = 600;
  // delete
  bool force = false;
  // list
  std::string filter, format;
};

int Fail(const std::string& command, const Status& s) {
  std::fprintf(stderr, "multislice queued-resources %s: %s\n", command.c_str(),
               s.message().c_str());
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
  if (!f.node_id.empty() && f.node_count > 0) {
    return InvalidArgument("--node-id: give either --node-id or --node-count");
  }
  if (f.node_count > 0) {
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
  if (!r.ok()) return r.status();
  if (r->status < 200 || r->status >= 300) {
    return control::ErrorFromResponse(*r);
  }
  return r->body;
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
  if (f.accelerator_type.empty()) {
    return Fail(kCmd, InvalidArgument("--accelerator-type: is required"));
  }
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
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  Result<json> qr =
      Checked(client->Call("GET", Parent(f) + "/queuedResources/" + f.id));
  if (!qr.ok()) return Fail(kCmd, qr.status());
  std::printf("%s\n", qr->dump(2).c_str());
  return 0;
}

// The value of a list column or filter key for one queued resource.
std::string Column(const json& qr, const std::string& key) {
  const std::string name = qr.value("name", "");
  if (key == "name") return name.substr(name.rfind('/') + 1);
  if (key == "zone") {
    size_t at = name.find("/locations/");
    size_t end = name.find('/', at + 11);
    return at == std::string::npos ? "" : name.substr(at + 11, end - at - 11);
  }
  if (key == "node_count" || key == "nodecount") {
    return std::to_string(qr.value("nodes", json::array()).size());
  }
  if (key == "accelerator_type" || key == "acceleratortype") {
    try {
      return qr["tpu"]["nodeSpec"][0]["node"].value("acceleratorType", "");
    } catch (const json::exception&) {
      return "";
    }
  }
  if (key == "state") return StateOf(qr);
  if (key == "tier") return qr.value("tier", "");
  return "";
}

// gcloud-like filters: terms KEY=VALUE, KEY!=VALUE, KEY:SUBSTRING, joined by
// spaces or AND; keys name, zone, state, accelerator_type, node_count, tier
// (case-insensitive).
Result<std::function<bool(const json&)>> ParseFilter(const std::string& text) {
  std::vector<std::function<bool(const json&)>> terms;
  std::istringstream in(text);
  std::string term;
  static const std::regex kTerm(R"(^([A-Za-z_.]+)(!=|=|:)(.*)$)");
  while (in >> term) {
    if (term == "AND") continue;
    std::smatch m;
    if (!std::regex_match(term, m, kTerm)) {
      return InvalidArgument("--filter: '" + term +
                             "' is not KEY=VALUE, KEY!=VALUE or KEY:VALUE");
    }
    std::string key = m[1];
    for (char& c : key) c = static_cast<char>(std::tolower(c));
    if (key.rfind("state.", 0) == 0) key = "state";
    if (key == "accelerator-type") key = "accelerator_type";
    static const std::set<std::string> kKeys = {"name",
                                                "zone",
                                                "state",
                                                "accelerator_type",
                                                "acceleratortype",
                                                "node_count",
                                                "nodecount",
                                                "tier"};
    if (!kKeys.count(key)) {
      return InvalidArgument("--filter: unknown key '" + key +
                             "': expected name, zone, state, "
                             "accelerator_type, node_count or tier");
    }
    const std::string op = m[2], value = m[3];
    terms.push_back([key, op, value](const json& qr) {
      const std::string v = Column(qr, key);
      if (op == "=") return v == value;
      if (op == "!=") return v != value;
      return v.find(value) != std::string::npos;
    });
  }
  return std::function<bool(const json&)>([terms](const json& qr) {
    for (const auto& t : terms) {
      if (!t(qr)) return false;
    }
    return true;
  });
}

int RunList(const QrFlags& f) {
  const char* kCmd = "list";
  if (!f.format.empty() && f.format != "json" && f.format != "table") {
    return Fail(kCmd, InvalidArgument("--format: '" + f.format +
                                      "' is not json or table"));
  }
  Result<std::function<bool(const json&)>> filter = ParseFilter(f.filter);
  if (!filter.ok()) return Fail(kCmd, filter.status());
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  json all = json::array();
  std::string token;
  for (int page = 0; page < 10000; ++page) {
    Result<json> r = Checked(
        client->Call("GET", Parent(f) + "/queuedResources?pageSize=500" +
                                (token.empty() ? "" : "&pageToken=" + token)));
    if (!r.ok()) return Fail(kCmd, r.status());
    for (const json& qr : r->value("queuedResources", json::array())) {
      if ((*filter)(qr)) all.push_back(qr);
    }
    token = r->value("nextPageToken", "");
    if (token.empty()) break;
  }
  if (f.format == "json") {
    std::printf("%s\n", all.dump(2).c_str());
  } else {
    const std::vector<std::string> keys = {"name", "zone", "node_count",
                                           "accelerator_type", "state"};
    std::vector<std::vector<std::string>> rows = {
        {"NAME", "ZONE", "NODE_COUNT", "ACCELERATOR_TYPE", "STATE"}};
    for (const json& qr : all) {
      std::vector<std::string> row;
      for (const std::string& k : keys) row.push_back(Column(qr, k));
      rows.push_back(row);
    }
    std::vector<size_t> width(keys.size(), 0);
    for (const auto& row : rows) {
      for (size_t i = 0; i < row.size(); ++i) {
        width[i] = std::max(width[i], row[i].size());
      }
    }
    for (const auto& row : rows) {
      std::string line;
      for (size_t i = 0; i < row.size(); ++i) {
        line += row[i];
        if (i + 1 < row.size()) {
          line += std::string(width[i] - row[i].size() + 2, ' ');
        }
      }
      std::printf("%s\n", line.c_str());
    }
  }
  // FAILED and SUSPENDED queued resources still hold quota: say so.
  int holding = 0;
  long long chips = 0;
  for (const json& qr : all) {
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
  return 0;
}

// Deletes every FAILED or SUSPENDED queued resource of the zone: they hold
// quota until deleted (spec 4.1: offer cleanup).
int RunCleanup(const QrFlags& f) {
  const char* kCmd = "cleanup";
  Result<control::ApiClient> client = MakeControllerClient(f.connection);
  if (!client.ok()) return Fail(kCmd, client.status());
  std::vector<std::string> ids;
  long long chips = 0;
  std::string token;
  for (int page = 0; page < 10000; ++page) {
    Result<json> r = Checked(
        client->Call("GET", Parent(f) + "/queuedResources?pageSize=500" +
                                (token.empty() ? "" : "&pageToken=" + token)));
    if (!r.ok()) return Fail(kCmd, r.status());
    for (const json& qr : r->value("queuedResources", json::array())) {
      const std::string state = StateOf(qr);
      if (state == "FAILED" || state == "SUSPENDED") {
        ids.push_back(Column(qr, "name"));
        chips += qr.value("quotaHeldChips", 0LL);
      }
    }
    token = r->value("nextPageToken", "");
    if (token.empty()) break;
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

void AddLocationFlags(CLI::App* cmd, QrFlags* f) {
  AddControllerFlags(cmd, &f->connection);
  AddStringFlag(cmd, "project", &f->project, "Project of the resource.")
      ->capture_default_str();
  AddStringFlag(cmd, "zone", &f->zone, "Zone of the resource.")
      ->capture_default_str();
}

void AddWaitFlags(CLI::App* cmd, QrFlags* f) {
  AddBoolFlag(cmd, "async", &f->async,
              "Return once the request is accepted, without waiting.");
  AddIntFlag(cmd, "wait_timeout", &f->wait_seconds,
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
      "(or FAILED), printing each state.\n"
      "Example:\n"
      "  multislice queued-resources create my-qr --accelerator-type cpu-2 "
      "--node-count 2 --metadata-from-file startup-script=train.sh "
      "--controller http://127.0.0.1:8470 --token-file "
      "multislice-controller/token");
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
    AddIntFlag(create, "node_count", &f->node_count,
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
  table[create] = [create_flags] { return RunCreate(*create_flags); };

  auto list_flags = std::make_shared<QrFlags>();
  CLI::App* list = qr->add_subcommand(
      "list",
      "Lists queued resources as NAME ZONE NODE_COUNT ACCELERATOR_TYPE "
      "STATE; --zone - lists every zone.\n"
      "Example:\n"
      "  multislice queued-resources list --filter state=ACTIVE");
  AddLocationFlags(list, list_flags.get());
  AddStringFlag(list, "filter", &list_flags->filter,
                "Terms KEY=VALUE, KEY!=VALUE or KEY:SUBSTRING (keys name, "
                "zone, state, accelerator_type, node_count, tier).");
  AddStringFlag(list, "format", &list_flags->format,
                "table (default) or json.");
  table[list] = [list_flags] { return RunList(*list_flags); };

  auto describe_flags = std::make_shared<QrFlags>();
  CLI::App* describe =
      qr->add_subcommand("describe",
                         "Prints a queued resource as JSON.\nExample:\n"
                         "  multislice queued-resources describe my-qr");
  describe->add_option("QR", describe_flags->id, "The queued resource's id.")
      ->required();
  AddLocationFlags(describe, describe_flags.get());
  table[describe] = [describe_flags] { return RunDescribe(*describe_flags); };

  auto delete_flags = std::make_shared<QrFlags>();
  CLI::App* del = qr->add_subcommand(
      "delete",
      "Deletes a queued resource and waits until it is gone. Without "
      "--force only ACCEPTED, FAILED or SUSPENDED ones.\nExample:\n"
      "  multislice queued-resources delete my-qr --force");
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
  AddIntFlag(cleanup, "wait_timeout", &cleanup_flags->wait_seconds,
             "Seconds to wait for each deletion.")
      ->capture_default_str();
  table[cleanup] = [cleanup_flags] { return RunCleanup(*cleanup_flags); };

  AddQueuedResourcesSshCommand(*qr, table);
}

}  // namespace multislice::cli
