// Validation and JSON of queued resources and operations (see api_types.h).
#include "control/api_types.h"

#include <cctype>
#include <cmath>
#include <ctime>
#include <map>
#include <set>

#include "runtime/mesh/topology.h"

namespace multislice::control {
namespace {

using nlohmann::json;

const char* const kStateNames[] = {
    "CREATING",     "ACCEPTED", "WAITING_FOR_RESOURCES",
    "PROVISIONING", "ACTIVE",   "SUSPENDING",
    "SUSPENDED",    "FAILED",   "DELETING"};
const char* const kTierNames[] = {"reserved", "on-demand", "spot",
                                  "best-effort"};

std::string SnakeToCamel(const std::string& key) {
  std::string out;
  bool upper = false;
  for (char c : key) {
    if (c == '_') {
      upper = true;
    } else {
      out.push_back(
          upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                : c);
      upper = false;
    }
  }
  return out;
}

std::string CamelToSnake(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      out.push_back('_');
      out.push_back(static_cast<char>(std::tolower(c)));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Field path in snake_case for messages: "tpu.node_spec[0].node".
std::string Join(const std::string& path, const std::string& camel_key) {
  std::string snake = CamelToSnake(camel_key);
  return path.empty() ? snake : path + "." + snake;
}

Status Field(const std::string& path, const std::string& what) {
  return InvalidArgument(path + ": " + what);
}

// Checks that object `j` at `path` has only `allowed` keys.
Status OnlyKeys(const json& j, const std::string& path,
                const std::set<std::string>& allowed) {
  if (!j.is_object()) return Field(path, "expected an object");
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (!allowed.count(key)) {
      return Field(Join(path, key), "unknown field");
    }
  }
  return OkStatus();
}

Result<std::string> GetString(const json& parent, const std::string& key,
                              const std::string& path, size_t max_bytes,
                              bool required) {
  std::string field = Join(path, key);
  if (!parent.contains(key)) {
    if (required) return Field(field, "is required");
    return std::string();
  }
  const json& v = parent[key];
  if (!v.is_string()) return Field(field, "expected a string");
  std::string s = v.get<std::string>();
  if (s.size() > max_bytes) {
    return Field(field, "longer than " + std::to_string(max_bytes) + " bytes");
  }
  return s;
}

int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

}  // namespace

std::string StateName(QrState state) {
  return kStateNames[static_cast<int>(state)];
}

Result<QrState> ParseStateName(std::string_view name) {
  for (int i = 0; i < 9; ++i) {
    if (name == kStateNames[i]) return static_cast<QrState>(i);
  }
  return InvalidArgument("unknown state '" + std::string(name) + "'");
}

std::string TierName(Tier tier) { return kTierNames[static_cast<int>(tier)]; }

Result<Tier> ParseTierName(std::string_view name) {
  for (int i = 0; i < kNumTiers; ++i) {
    if (name == kTierNames[i]) return static_cast<Tier>(i);
  }
  return InvalidArgument("unknown tier '" + std::string(name) +
                         "': expected reserved, on-demand, spot or "
                         "best-effort");
}

bool ValidResourceId(std::string_view id) {
  if (id.empty() || id.size() > kMaxStringBytes) return false;
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) &&
        std::string_view("_.~+%-").find(c) == std::string_view::npos) {
      return false;
    }
  }
  return true;
}

Result<json> ParseJsonText(std::string_view text) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    // e.byte is the 1-based index of the last character read: the one at
    // which the parser gave up.
    size_t offset = e.byte == 0 ? 0 : e.byte - 1;
    if (offset > text.size()) offset = text.size();
    int line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < offset; ++i) {
      if (text[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    const size_t column = offset - line_start + 1;
    std::string what = e.what();
    // nlohmann's text: "[json.exception.parse_error.101] parse error at line
    // 3, column 5: syntax error while parsing object - ..."; keep the part
    // after the position.
    size_t colon = what.find(": ", what.find("parse error"));
    std::string detail =
        colon == std::string::npos ? what : what.substr(colon + 2);
    return InvalidArgument("malformed JSON at line " + std::to_string(line) +
                           ", column " + std::to_string(column) + ": " +
                           detail);
  }
}

Result<int64_t> ParseDurationMs(std::string_view text) {
  std::string s(text);
  auto bad = [&] {
    return InvalidArgument("'" + s +
                           "' is not a duration in seconds such as "
                           "\"3600s\" or \"1.5s\"");
  };
  if (s.size() < 2 || s.back() != 's') return bad();
  std::string number = s.substr(0, s.size() - 1);
  if (number.empty() ||
      number.find_first_not_of("0123456789.") != std::string::npos ||
      std::count(number.begin(), number.end(), '.') > 1 || number == ".") {
    return bad();
  }
  double seconds = std::strtod(number.c_str(), nullptr);
  if (!std::isfinite(seconds) || seconds > 315576000000.0) return bad();
  return static_cast<int64_t>(std::llround(seconds * 1000.0));
}

Result<int64_t> ParseTimestampMs(std::string_view text) {
  std::string s(text);
  auto bad = [&] {
    return InvalidArgument("'" + s +
                           "' is not an RFC 3339 time such as "
                           "\"2024-05-01T10:00:00Z\"");
  };
  int y, mo, d, h, mi, sec;
  int consumed = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi,
                  &sec, &consumed) != 6 ||
      consumed != 19) {
    return bad();
  }
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) {
    return bad();
  }
  size_t pos = 19;
  int64_t millis = 0;
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    int digits = 0;
    while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) {
      if (digits < 3) millis = millis * 10 + (s[pos] - '0');
      ++digits;
      ++pos;
    }
    if (digits == 0) return bad();
    for (int i = digits; i < 3; ++i) millis *= 10;
  }
  int64_t offset_minutes = 0;
  if (pos < s.size() && (s[pos] == 'Z' || s[pos] == 'z') &&
      pos + 1 == s.size()) {
  } else if (pos + 6 == s.size() && (s[pos] == '+' || s[pos] == '-') &&
             s[pos + 3] == ':') {
    int oh = 0, om = 0;
    if (std::sscanf(s.c_str() + pos + 1, "%2d:%2d", &oh, &om) != 2) {
      return bad();
    }
    offset_minutes = (s[pos] == '+' ? 1 : -1) * (oh * 60 + om);
  } else {
    return bad();
  }
  int64_t days = DaysFromCivil(y, mo, d);
  int64_t seconds = days * 86400 + h * 3600 + mi * 60 + sec;
  return (seconds - offset_minutes * 60) * 1000 + millis;
}

std::string FormatTimestamp(int64_t ms) {
  std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  return buf;
}

Result<json> ToCamelCase(const json& value, const std::string& path) {
  if (value.is_array()) {
    json out = json::array();
    for (size_t i = 0; i < value.size(); ++i) {
      ASSIGN_OR_RETURN(
          json item,
          ToCamelCase(value[i], path + "[" + std::to_string(i) + "]"));
      out.push_back(std::move(item));
    }
    return out;
  }
  if (!value.is_object()) return value;
  json out = json::object();
  for (const auto& [key, item] : value.items()) {
    const std::string camel = SnakeToCamel(key);
    const std::string field = Join(path, camel);
    if (out.contains(camel)) {
      return Field(field, "given twice (as '" + key +
                              "' and its other "
                              "spelling)");
    }
    if (camel == "metadata" || camel == "labels") {
      out[camel] = item;  // user keys such as "startup-script" stay as given
    } else {
      ASSIGN_OR_RETURN(out[camel], ToCamelCase(item, field));
    }
  }
  return out;
}

Result<QueuedResourceSpec> ParseQueuedResource(const json& input,
                                               const std::string& id,
                                               int64_t now_ms) {
  if (!input.is_object()) {
    return InvalidArgument("body: expected a JSON object (a QueuedResource)");
  }
  ASSIGN_OR_RETURN(json body, ToCamelCase(input));
  RETURN_IF_ERROR(
      OnlyKeys(body, "",
               {"name", "tpu", "guaranteed", "spot", "bestEffort",
                "queueingPolicy", "reservationName", "state", "createTime"}));
  // Output-only fields are ignored, as Google's API does.
  body.erase("name");
  body.erase("state");
  body.erase("createTime");
  QueuedResourceSpec spec;

  if (!body.contains("tpu")) return Field("tpu", "is required");
  const json& tpu = body["tpu"];
  RETURN_IF_ERROR(OnlyKeys(tpu, "tpu", {"nodeSpec"}));
  if (!tpu.contains("nodeSpec")) return Field("tpu.node_spec", "is required");
  const json& specs = tpu["nodeSpec"];
  if (!specs.is_array()) return Field("tpu.node_spec", "expected a list");
  if (specs.size() != 1) {
    return Field("tpu.node_spec", "exactly one entry is accepted, got " +
                                      std::to_string(specs.size()));
  }
  const json& ns = specs[0];
  const std::string ns_path = "tpu.node_spec[0]";
  RETURN_IF_ERROR(
      OnlyKeys(ns, ns_path, {"parent", "nodeId", "multiNodeParams", "node"}));
  ASSIGN_OR_RETURN(std::string parent,
                   GetString(ns, "parent", ns_path, kMaxStringBytes, false));
  (void)parent;
  ASSIGN_OR_RETURN(std::string node_id,
                   GetString(ns, "nodeId", ns_path, kMaxStringBytes, false));
  const bool has_multi = ns.contains("multiNodeParams");
  if (!node_id.empty() && has_multi) {
    return Field(ns_path + ".node_id",
                 "cannot be given together with multi_node_params");
  }
  if (has_multi) {
    const json& multi = ns["multiNodeParams"];
    const std::string mpath = ns_path + ".multi_node_params";
    RETURN_IF_ERROR(OnlyKeys(multi, mpath, {"nodeCount", "nodeIdPrefix"}));
    if (!multi.contains("nodeCount")) {
      return Field(mpath + ".node_count", "is required");
    }
    const json& count = multi["nodeCount"];
    if (!count.is_number_integer()) {
      return Field(mpath + ".node_count", "expected an integer");
    }
    const int64_t n = count.get<int64_t>();
    if (n < 2 || n > kMaxNodeCount) {
      return Field(mpath + ".node_count", std::to_string(n) +
                                              " is outside 2.." +
                                              std::to_string(kMaxNodeCount));
    }
    ASSIGN_OR_RETURN(std::string prefix, GetString(multi, "nodeIdPrefix", mpath,
                                                   kMaxStringBytes, false));
    if (prefix.empty()) prefix = id;
    if (!ValidResourceId(prefix)) {
      return Field(mpath + ".node_id_prefix",
                   "'" + prefix + "' does not match ^[A-Za-z0-9_.~+%-]+$");
    }
    for (int64_t i = 0; i < n; ++i) {
      spec.node_ids.push_back(prefix + "-" + std::to_string(i));
    }
  } else {
    if (node_id.empty()) node_id = id;
    if (!ValidResourceId(node_id)) {
      return Field(ns_path + ".node_id",
                   "'" + node_id + "' does not match ^[A-Za-z0-9_.~+%-]+$");
    }
    spec.node_ids.push_back(node_id);
  }

  if (!ns.contains("node")) return Field(ns_path + ".node", "is required");
  const json& node = ns["node"];
  const std::string npath = ns_path + ".node";
  RETURN_IF_ERROR(OnlyKeys(
      node, npath,
      {"acceleratorType", "runtimeVersion", "networkConfig", "tags", "metadata",
       "description", "labels", "serviceAccount", "schedulingConfig",
       "dataDisks", "shieldedInstanceConfig", "acceleratorConfig"}));
  ASSIGN_OR_RETURN(spec.accelerator_type,
                   GetString(node, "acceleratorType", npath, 64, true));
  Result<mesh::AcceleratorType> type =
      mesh::ParseAcceleratorType(spec.accelerator_type);
  if (!type.ok()) {
    return Field(npath + ".accelerator_type", type.status().message());
  }
  ASSIGN_OR_RETURN(
      spec.runtime_version,
      GetString(node, "runtimeVersion", npath, kMaxStringBytes, false));
  if (node.contains("networkConfig")) {
    const json& net = node["networkConfig"];
    const std::string path = npath + ".network_config";
    RETURN_IF_ERROR(OnlyKeys(net, path,
                             {"network", "subnetwork", "enableExternalIps",
                              "canIpForward", "queueCount"}));
    RETURN_IF_ERROR(
        GetString(net, "network", path, kMaxStringBytes, false).status());
    RETURN_IF_ERROR(
        GetString(net, "subnetwork", path, kMaxStringBytes, false).status());
    if (net.contains("enableExternalIps") &&
        !net["enableExternalIps"].is_boolean()) {
      return Field(path + ".enable_external_ips", "expected true or false");
    }
  }
  if (node.contains("tags")) {
    const json& tags = node["tags"];
    if (!tags.is_array()) return Field(npath + ".tags", "expected a list");
    if (tags.size() > kMaxListEntries) {
      return Field(npath + ".tags",
                   "more than " + std::to_string(kMaxListEntries) + " entries");
    }
    for (size_t i = 0; i < tags.size(); ++i) {
      if (!tags[i].is_string() ||
          tags[i].get<std::string>().size() > kMaxStringBytes) {
        return Field(npath + ".tags[" + std::to_string(i) + "]",
                     "expected a string of at most " +
                         std::to_string(kMaxStringBytes) + " bytes");
      }
    }
  }
  for (const char* map_key : {"metadata", "labels"}) {
    if (!node.contains(map_key)) continue;
    const json& map = node[map_key];
    const std::string path = npath + "." + map_key;
    if (!map.is_object()) return Field(path, "expected an object of strings");
    if (map.size() > kMaxListEntries) {
      return Field(path,
                   "more than " + std::to_string(kMaxListEntries) + " entries");
    }
    for (const auto& [key, value] : map.items()) {
      const size_t limit =
          key == "startup-script" ? kMaxStartupScriptBytes : kMaxStringBytes;
      if (key.size() > kMaxStringBytes || !value.is_string() ||
          value.get<std::string>().size() > limit) {
        return Field(
            path + "[\"" + key.substr(0, 64) + "\"]",
            "expected a string of at most " + std::to_string(limit) + " bytes");
      }
    }
    if (std::string(map_key) == "metadata" && map.contains("startup-script")) {
      spec.startup_script = map["startup-script"].get<std::string>();
    }
  }

  int tiers = 0;
  if (body.contains("guaranteed")) {
    ++tiers;
    const json& g = body["guaranteed"];
    RETURN_IF_ERROR(OnlyKeys(g, "guaranteed", {"reserved", "minDuration"}));
    if (g.contains("reserved") && !g["reserved"].is_boolean()) {
      return Field("guaranteed.reserved", "expected true or false");
    }
    spec.tier = g.value("reserved", false) ? Tier::kReserved : Tier::kOnDemand;
  }
  if (body.contains("spot")) {
    ++tiers;
    RETURN_IF_ERROR(OnlyKeys(body["spot"], "spot", {}));
    spec.tier = Tier::kSpot;
  }
  if (body.contains("bestEffort")) {
    ++tiers;
    RETURN_IF_ERROR(OnlyKeys(body["bestEffort"], "best_effort", {}));
    spec.tier = Tier::kBestEffort;
  }
  if (tiers > 1) {
    return Field("guaranteed",
                 "give at most one of guaranteed, spot and "
                 "best_effort");
  }
  if (body.contains("reservationName")) {
    RETURN_IF_ERROR(
        GetString(body, "reservationName", "", kMaxStringBytes, false)
            .status());
  }
  if (body.contains("queueingPolicy")) {
    const json& q = body["queueingPolicy"];
    const std::string path = "queueing_policy";
    RETURN_IF_ERROR(OnlyKeys(q, path,
                             {"validUntilDuration", "validUntilTime",
                              "validAfterDuration", "validAfterTime"}));
    if (q.contains("validUntilDuration") && q.contains("validUntilTime")) {
      return Field(path,
                   "give at most one of valid_until_duration and "
                   "valid_until_time");
    }
    if (q.contains("validAfterDuration") && q.contains("validAfterTime")) {
      return Field(path,
                   "give at most one of valid_after_duration and "
                   "valid_after_time");
    }
    for (const char* key : {"validUntilDuration", "validUntilTime",
                            "validAfterDuration", "validAfterTime"}) {
      if (!q.contains(key)) continue;
      const std::string field = Join(path, key);
      if (!q[key].is_string()) return Field(field, "expected a string");
      const std::string text = q[key].get<std::string>();
      const bool is_duration =
          std::string(key).find("Duration") != std::string::npos;
      Result<int64_t> ms =
          is_duration ? ParseDurationMs(text) : ParseTimestampMs(text);
      if (!ms.ok()) return Field(field, ms.status().message());
      const int64_t when = is_duration ? now_ms + *ms : *ms;
      if (std::string(key).rfind("validUntil", 0) == 0) {
        spec.valid_until_ms = when;
      } else {
        spec.valid_after_ms = when;
      }
    }
  }
  spec.body = std::move(body);
  return spec;
}

json QueuedResourceRecord::ToStorage() const {
  json nodes_json = json::array();
  for (const NodeRecord& n : nodes) {
    nodes_json.push_back({{"nodeId", n.node_id},
                          {"state", n.state},
                          {"health", n.health},
                          {"hosts", n.hosts},
                          {"started", n.started}});
  }
  json history = json::array();
  for (const StateChange& c : state_history) {
    history.push_back({{"state", c.state},
                       {"timeMs", c.time_ms},
                       {"initiator", c.initiator}});
  }
  return {{"name", name},
          {"project", project},
          {"zone", zone},
          {"id", id},
          {"seq", seq},
          {"createMs", create_ms},
          {"body", spec.body},
          {"validUntilMs", spec.valid_until_ms},
          {"validAfterMs", spec.valid_after_ms},
          {"hostsPerSlice", hosts_per_slice},
          {"chipsPerSlice", chips_per_slice},
          {"state", StateName(state)},
          {"stateInitiator", state_initiator},
          {"failedError", failed_error},
          {"holdsQuota", holds_quota},
          {"attempt", attempt},
          {"stage", stage},
          {"nodes", nodes_json},
          {"retiredHosts", retired_hosts},
          {"deleteRequested", delete_requested},
          {"waitingOps", waiting_ops},
          {"coordinator", coordinator},
          {"stateHistory", history}};
}

bool QueuedResourceRecord::RecordStateChange(int64_t now_ms) {
  const std::string name = StateName(state);
  if (!state_history.empty() && state_history.back().state == name &&
      state_history.back().initiator == state_initiator) {
    return false;
  }
  state_history.push_back({name, now_ms, state_initiator});
  if (state_history.size() > kMaxStateHistory) {
    state_history.erase(state_history.begin(),
                        state_history.end() - kMaxStateHistory);
  }
  return true;
}

Result<QueuedResourceRecord> QueuedResourceRecord::FromStorage(const json& j) {
  try {
    QueuedResourceRecord r;
    r.name = j.at("name");
    r.project = j.at("project");
    r.zone = j.at("zone");
    r.id = j.at("id");
    r.seq = j.at("seq");
    r.create_ms = j.at("createMs");
    ASSIGN_OR_RETURN(r.spec, ParseQueuedResource(j.at("body"), r.id, 0));
    r.spec.valid_until_ms = j.at("validUntilMs");
    r.spec.valid_after_ms = j.at("validAfterMs");
    r.hosts_per_slice = j.at("hostsPerSlice");
    r.chips_per_slice = j.at("chipsPerSlice");
    ASSIGN_OR_RETURN(r.state, ParseStateName(j.at("state").get<std::string>()));
    r.state_initiator = j.at("stateInitiator");
    r.failed_error = j.at("failedError");
    r.holds_quota = j.at("holdsQuota");
    r.attempt = j.at("attempt");
    r.stage = j.at("stage");
    for (const json& n : j.at("nodes")) {
      NodeRecord node;
      node.node_id = n.at("nodeId");
      node.state = n.at("state");
      node.health = n.at("health");
      node.hosts = n.at("hosts").get<std::vector<std::string>>();
      node.started = n.at("started");
      r.nodes.push_back(std::move(node));
    }
    r.retired_hosts = j.at("retiredHosts").get<std::vector<std::string>>();
    r.delete_requested = j.at("deleteRequested");
    r.waiting_ops = j.at("waitingOps").get<std::vector<std::string>>();
    r.coordinator = j.at("coordinator");
    // Absent in records written before the history existed.
    for (const json& c : j.value("stateHistory", json::array())) {
      r.state_history.push_back({c.at("state").get<std::string>(),
                                 c.at("timeMs").get<int64_t>(),
                                 c.at("initiator").get<std::string>()});
    }
    return r;
  } catch (const json::exception& e) {
    return Internal(std::string("stored queued resource is malformed: ") +
                    e.what());
  }
}

json QueuedResourceRecord::ToApi() const {
  json out = spec.body;
  out["name"] = name;
  out["createTime"] = FormatTimestamp(create_ms);
  json state_json = {{"state", StateName(state)},
                     {"stateInitiator", state_initiator}};
  if (state == QrState::kFailed && !failed_error.empty()) {
    state_json["failedData"] = {{"error",
                                 {{"code", 9},
                                  {"message", failed_error},
                                  {"status", "FAILED_PRECONDITION"}}}};
  }
  if (state == QrState::kSuspended || state == QrState::kSuspending) {
    state_json["suspendedData"] = json::object();
  }
  out["state"] = state_json;
  // Beyond Google's schema: the slices, and the quota a FAILED or SUSPENDED
  // queued resource still holds (spec 4.1: make that visible).
  json nodes_json = json::array();
  for (const NodeRecord& n : nodes) {
    nodes_json.push_back({{"nodeId", n.node_id},
                          {"state", n.state},
                          {"health", n.health},
                          {"hosts", n.hosts}});
  }
  out["nodes"] = nodes_json;
  out["tier"] = TierName(spec.tier);
  out["attempt"] = attempt;
  out["quotaHeldChips"] = holds_quota ? total_chips() : 0;
  json history = json::array();
  for (const StateChange& c : state_history) {
    history.push_back({{"state", c.state},
                       {"time", FormatTimestamp(c.time_ms)},
                       {"initiator", c.initiator}});
  }
  out["stateHistory"] = history;
  return out;
}

json OperationRecord::ToStorage() const {
  return {{"name", name},          {"target", target},
          {"verb", verb},          {"apiVersion", api_version},
          {"createMs", create_ms}, {"endMs", end_ms},
          {"done", done},          {"response", response},
          {"error", error}};
}

Result<OperationRecord> OperationRecord::FromStorage(const json& j) {
  try {
    OperationRecord op;
    op.name = j.at("name");
    op.target = j.at("target");
    op.verb = j.at("verb");
    op.api_version = j.at("apiVersion");
    op.create_ms = j.at("createMs");
    op.end_ms = j.at("endMs");
    op.done = j.at("done");
    op.response = j.at("response");
    op.error = j.at("error");
    return op;
  } catch (const json::exception& e) {
    return Internal(std::string("stored operation is malformed: ") + e.what());
  }
}

json OperationRecord::ToApi() const {
  json metadata = {
      {"@type", "type.googleapis.com/google.cloud.common.OperationMetadata"},
      {"createTime", FormatTimestamp(create_ms)},
      {"target", target},
      {"verb", verb},
      {"cancelRequested", false},
      {"apiVersion", api_version}};
  if (done) metadata["endTime"] = FormatTimestamp(end_ms);
  json out = {{"name", name}, {"metadata", metadata}, {"done", done}};
  if (done) {
    if (!error.is_null()) {
      out["error"] = error;
    } else {
      out["response"] = response;
    }
  }
  return out;
}

}  // namespace multislice::control
