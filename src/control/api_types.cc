// Validation and JSON of queued resources and operations (see api_types.h).
#include "control/api_types.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <map>
#include <optional>
#include <set>

#include "control/validation.h"
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

// Protobuf's Duration bound: 10,000 years.
constexpr int64_t kMaxDurationSeconds = 315576000000;
// network_config.queue_count: 0 (unset) .. this.
constexpr int64_t kMaxQueueCount = 64;

// Where a body comes from. A request is checked in full. A record read back
// from the store was accepted by the version that wrote it, so only what
// that version checked is checked again (its ids by the older, wider rule;
// not the node options, the queueing policy's times, or the types checked
// since), so that a store written before a stricter rule still loads.
enum class Source { kRequest, kStored };

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

// "a string", "a number", ... for "expected X, got Y".
std::string TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "a list";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number with a fraction or exponent";
    default:
      return "a number";
  }
}

Status WrongType(const std::string& field, const std::string& expected,
                 const json& got) {
  return Field(field, "expected " + expected + ", got " + TypeName(got));
}

// Checks that object `j` at `path` has only `allowed` keys.
Status OnlyKeys(const json& j, const std::string& path,
                const std::set<std::string>& allowed) {
  if (!j.is_object()) return WrongType(path, "an object", j);
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (!allowed.count(key)) {
      return Field(Join(path, key), "unknown field");
    }
  }
  return OkStatus();
}

// The member `key` of object `parent`, or null when absent.
const json* Member(const json& parent, const std::string& key) {
  auto it = parent.find(key);
  return it == parent.end() ? nullptr : &*it;
}

Result<std::string> GetString(const json& parent, const std::string& key,
                              const std::string& path, size_t max_bytes,
                              bool required) {
  std::string field = Join(path, key);
  const json* v = Member(parent, key);
  if (v == nullptr) {
    if (required) return Field(field, "is required");
    return std::string();
  }
  if (!v->is_string()) return WrongType(field, "a string", *v);
  std::string s = v->get<std::string>();
  if (s.size() > max_bytes) {
    return Field(field, "longer than " + std::to_string(max_bytes) + " bytes");
  }
  return s;
}

Status CheckBool(const json& parent, const std::string& key,
                 const std::string& path) {
  const json* v = Member(parent, key);
  if (v != nullptr && !v->is_boolean()) {
    return WrongType(Join(path, key), "true or false", *v);
  }
  return OkStatus();
}

// A string member that, when given, is one of `values` (a proto enum).
Result<std::string> GetEnum(const json& parent, const std::string& key,
                            const std::string& path,
                            const std::vector<std::string>& values) {
  ASSIGN_OR_RETURN(std::string value, GetString(parent, key, path, 64, false));
  if (value.empty() && !parent.contains(key)) return value;
  if (std::find(values.begin(), values.end(), value) != values.end()) {
    return value;
  }
  std::string list;
  for (const std::string& v : values) list += (list.empty() ? "" : ", ") + v;
  return Field(Join(path, key),
               QuoteForMessage(value) + " is not one of " + list);
}

// An integer member in min..max; `absent` when not given.
Result<int64_t> GetInteger(const json& parent, const std::string& key,
                           const std::string& path, int64_t min, int64_t max,
                           int64_t absent) {
  const std::string field = Join(path, key);
  const json* v = Member(parent, key);
  if (v == nullptr) return absent;
  if (!v->is_number_integer()) return WrongType(field, "an integer", *v);
  const bool in_range =
      v->is_number_unsigned()
          ? v->get<uint64_t>() <= static_cast<uint64_t>(max) &&
                static_cast<int64_t>(v->get<uint64_t>()) >= min
          : v->get<int64_t>() >= min && v->get<int64_t>() <= max;
  if (!in_range) {
    return Field(field, v->dump() + " is outside " + std::to_string(min) +
                            ".." + std::to_string(max));
  }
  return v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>())
                                 : v->get<int64_t>();
}

// A list of at most kMaxListEntries strings of at most kMaxStringBytes.
Status CheckStringList(const json& parent, const std::string& key,
                       const std::string& path) {
  const std::string field = Join(path, key);
  const json* list = Member(parent, key);
  if (list == nullptr) return OkStatus();
  if (!list->is_array()) return WrongType(field, "a list", *list);
  if (list->size() > kMaxListEntries) {
    return Field(field,
                 "more than " + std::to_string(kMaxListEntries) + " entries");
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const json& item = (*list)[i];
    if (!item.is_string() ||
        item.get_ref<const std::string&>().size() > kMaxStringBytes) {
      return Field(field + "[" + std::to_string(i) + "]",
                   "expected a string of at most " +
                       std::to_string(kMaxStringBytes) + " bytes");
    }
  }
  return OkStatus();
}

// A protobuf JSON duration member, in milliseconds; nullopt when absent.
Result<std::optional<int64_t>> GetDuration(const json& parent,
                                           const std::string& key,
                                           const std::string& path) {
  const std::string field = Join(path, key);
  const json* v = Member(parent, key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_string()) return WrongType(field, "a string", *v);
  Result<int64_t> ms = ParseDurationMs(v->get_ref<const std::string&>());
  if (!ms.ok()) return Field(field, ms.status().message());
  return std::optional<int64_t>(*ms);
}

// The id rule of the version that wrote a stored record.
bool IsStoredId(std::string_view id) {
  if (id.empty() || id.size() > kMaxStringBytes) return false;
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) &&
        std::string_view("_.~+%-").find(c) == std::string_view::npos) {
      return false;
    }
  }
  return true;
}

Status CheckId(const std::string& field, const std::string& id, Source source) {
  if (source == Source::kRequest) return ValidateResourceId(field, id);
  if (IsStoredId(id)) return OkStatus();
  return Field(field, QuoteForMessage(id) + " is not a stored id");
}

int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

bool IsLeapYear(int year) {
  return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
}

int DaysInMonth(int year, int month) {
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return month == 2 && IsLeapYear(year) ? 29 : kDays[month - 1];
}

// Reads text[pos, pos + count) as decimal digits; false unless all are.
bool ReadDigits(std::string_view text, size_t pos, size_t count, int* value) {
  if (pos + count > text.size()) return false;
  int v = 0;
  for (size_t i = pos; i < pos + count; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    v = v * 10 + (text[i] - '0');
  }
  *value = v;
  return true;
}

// The date and time fields of an RFC 3339 time.
struct CivilTime {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
};

// Reads "YYYY-MM-DDTHH:MM:SS" at the start of `text`; "" when it is there
// and names a real instant, else why not (a "no" without reason is
// "syntax").
std::string ReadCivilTime(std::string_view text, CivilTime* t) {
  const bool shaped = text.size() >= 19 && ReadDigits(text, 0, 4, &t->year) &&
                      text[4] == '-' && ReadDigits(text, 5, 2, &t->month) &&
                      text[7] == '-' && ReadDigits(text, 8, 2, &t->day) &&
                      (text[10] == 'T' || text[10] == 't') &&
                      ReadDigits(text, 11, 2, &t->hour) && text[13] == ':' &&
                      ReadDigits(text, 14, 2, &t->minute) && text[16] == ':' &&
                      ReadDigits(text, 17, 2, &t->second);
  if (!shaped) return "syntax";
  if (t->year < 1) return "year 0000 does not exist";
  if (t->month < 1 || t->month > 12) {
    return "month " + std::to_string(t->month) + " is not 01..12";
  }
  if (t->day < 1 || t->day > DaysInMonth(t->year, t->month)) {
    return "day " + std::to_string(t->day) + " does not exist in " +
           std::string(text.substr(0, 7));
  }
  if (t->hour > 23) return "hour " + std::to_string(t->hour) + " is not 00..23";
  if (t->minute > 59) {
    return "minute " + std::to_string(t->minute) + " is not 00..59";
  }
  if (t->second > 59) {
    return "second " + std::to_string(t->second) +
           " is not 00..59 (leap seconds are not accepted)";
  }
  return "";
}

// The fraction ".ddd" (1..9 digits) at text[*pos], as milliseconds
// (truncated, as protobuf's Timestamp keeps nanoseconds); false when a '.'
// has no digits or too many.
bool ReadFraction(std::string_view text, size_t* pos, int64_t* millis) {
  *millis = 0;
  if (*pos >= text.size() || text[*pos] != '.') return true;
  size_t digits = 0;
  for (++*pos; *pos < text.size() &&
               std::isdigit(static_cast<unsigned char>(text[*pos]));
       ++*pos, ++digits) {
    if (digits < 3) *millis = *millis * 10 + (text[*pos] - '0');
  }
  for (size_t i = digits; i < 3; ++i) *millis *= 10;
  return digits >= 1 && digits <= 9;
}

// The zone "Z" or "+HH:MM"/"-HH:MM" that must end `text` at `pos`, as
// minutes east of UTC; "" or why not.
std::string ReadZone(std::string_view text, size_t pos, int* minutes) {
  *minutes = 0;
  if (pos + 1 == text.size() && (text[pos] == 'Z' || text[pos] == 'z')) {
    return "";
  }
  int hours = 0, mins = 0;
  if (pos + 6 != text.size() || (text[pos] != '+' && text[pos] != '-') ||
      !ReadDigits(text, pos + 1, 2, &hours) || text[pos + 3] != ':' ||
      !ReadDigits(text, pos + 4, 2, &mins)) {
    return "syntax";
  }
  if (hours > 23 || mins > 59) return "the offset is not -23:59..+23:59";
  *minutes = (text[pos] == '+' ? 1 : -1) * (hours * 60 + mins);
  return "";
}

// Whether `value` nests arrays and objects more than `limit` deep (a
// scalar is 0 deep, [] is 1), counted without recursion.
bool NestedDeeperThan(const json& value, int limit) {
  std::vector<std::pair<const json*, int>> stack = {{&value, 1}};
  while (!stack.empty()) {
    const auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    if (depth > limit) return true;
    for (const json& child : *v) stack.push_back({&child, depth + 1});
  }
  return false;
}

}  // namespace
namespace {

// nlohmann's tree builder, plus the path of the value being read so that an
// error about a value names its field. nlohmann's parser is iterative; the
// depth is bounded before it runs (CheckJsonText), so the tree is safe to
// copy, compare and dump, which recurse.
class PathTrackingSax {
 public:
  struct Error {
    size_t position = 0;  // 1-based byte index of the last byte read
    int id = 0;           // nlohmann's exception id: 101 syntax, 406 range
    std::string what;
    std::string token;
    std::string path;  // the field being read, as written: "a.b[2]"
  };

  explicit PathTrackingSax(json& result)
      : dom_(result, /*allow_exceptions=*/false) {}

  bool null() { return Element(), dom_.null(); }
  bool boolean(bool v) { return Element(), dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) {
    return Element(), dom_.number_integer(v);
  }
  bool number_unsigned(json::number_unsigned_t v) {
    return Element(), dom_.number_unsigned(v);
  }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    return Element(), dom_.number_float(v, s);
  }
  bool string(json::string_t& v) { return Element(), dom_.string(v); }
  bool binary(json::binary_t& v) { return Element(), dom_.binary(v); }
  bool start_object(std::size_t n) {
    Element();
    frames_.push_back({false, "", 0});
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    frames_.back().key = k;
    return dom_.key(k);
  }
  bool end_object() {
    frames_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    Element();
    frames_.push_back({true, "", 0});
    return dom_.start_array(n);
  }
  bool end_array() {
    frames_.pop_back();
    return dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token,
                   const Exception& e) {
    error_ = {position, e.id, e.what(), token, PendingPath()};
    return false;
  }

  const std::optional<Error>& error() const { return error_; }

 private:
  struct Frame {
    bool is_array;
    std::string key;  // objects: the member being read
    size_t count;     // arrays: the elements started so far
  };

  void Element() {
    if (!frames_.empty() && frames_.back().is_array) ++frames_.back().count;
  }
  // The path of the value about to be read (the innermost array's next
  // element).
  std::string PendingPath() const {
    std::string path;
    for (size_t i = 0; i < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.is_array) {
        const size_t index = i + 1 == frames_.size() ? f.count : f.count - 1;
        path += "[" + std::to_string(index) + "]";
      } else {
        path += (path.empty() ? "" : ".") + f.key;
      }
    }
    return path;
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::vector<Frame> frames_;
  std::optional<Error> error_;
};

Status JsonError(std::string_view text, const PathTrackingSax::Error& e) {
  if (e.id == 406) {  // a number past the range of a double: 1e999
    // Everything up to the number's last byte has been read.
    const size_t start =
        e.position >= e.token.size() ? e.position - e.token.size() : 0;
    const std::string field = e.path.empty() ? "body" : e.path;
    return InvalidArgument(field + ": the number " + QuoteForMessage(e.token) +
                           " at " + TextPosition(text, start) +
                           " is out of range (numbers must be finite)");
  }
  const size_t offset = e.position == 0 ? 0 : e.position - 1;
  const std::string where = TextPosition(text, offset);
  // nlohmann's text: "[json.exception.parse_error.101] parse error at line
  // 3, column 5: syntax error while parsing object - ..."; keep the part
  // after the position.
  const size_t colon = e.what.find(": ", e.what.find("parse error"));
  const std::string detail =
      colon == std::string::npos ? e.what : e.what.substr(colon + 2);
  return InvalidArgument("malformed JSON at " + where + ": " + detail);
}

// ToCamelCase below the depth check.
Result<json> CamelCaseTree(const json& value, const std::string& path) {
  if (value.is_array()) {
    json out = json::array();
    for (size_t i = 0; i < value.size(); ++i) {
      ASSIGN_OR_RETURN(
          json item,
          CamelCaseTree(value[i], path + "[" + std::to_string(i) + "]"));
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
      ASSIGN_OR_RETURN(out[camel], CamelCaseTree(item, field));
    }
  }
  return out;
}

// tpu.node_spec[0]'s node_id or multi_node_params: the node ids.
Status ParseNodeIds(const json& ns, const std::string& ns_path,
                    const std::string& id, Source source,
                    QueuedResourceSpec& spec) {
  ASSIGN_OR_RETURN(std::string node_id,
                   GetString(ns, "nodeId", ns_path, kMaxStringBytes, false));
  const json* multi = Member(ns, "multiNodeParams");
  if (!node_id.empty() && multi != nullptr) {
    return Field(ns_path + ".node_id",
                 "cannot be given together with multi_node_params");
  }
  if (multi == nullptr) {
    if (node_id.empty()) node_id = id;
    RETURN_IF_ERROR(CheckId(ns_path + ".node_id", node_id, source));
    spec.node_ids.push_back(node_id);
    return OkStatus();
  }
  const std::string mpath = ns_path + ".multi_node_params";
  RETURN_IF_ERROR(
      OnlyKeys(*multi, mpath, {"nodeCount", "nodeIdPrefix", "workloadType"}));
  // Where Google places the slices; here they go wherever the scheduler
  // finds hosts, whichever is asked.
  RETURN_IF_ERROR(GetEnum(*multi, "workloadType", mpath,
                          {"WORKLOAD_TYPE_UNSPECIFIED", "THROUGHPUT_OPTIMIZED",
                           "AVAILABILITY_OPTIMIZED"})
                      .status());
  if (!multi->contains("nodeCount")) {
    return Field(mpath + ".node_count", "is required");
  }
  ASSIGN_OR_RETURN(const int64_t n,
                   GetInteger(*multi, "nodeCount", mpath, 2, kMaxNodeCount, 0));
  ASSIGN_OR_RETURN(std::string prefix, GetString(*multi, "nodeIdPrefix", mpath,
                                                 kMaxStringBytes, false));
  if (prefix.empty()) prefix = id;
  const std::string prefix_field = mpath + ".node_id_prefix";
  RETURN_IF_ERROR(CheckId(prefix_field, prefix, source));
  for (int64_t i = 0; i < n; ++i) {
    spec.node_ids.push_back(prefix + "-" + std::to_string(i));
  }
  const std::string& longest = spec.node_ids.back();
  if (source == Source::kRequest && longest.size() > kMaxIdLength) {
    return Field(prefix_field,
                 QuoteForMessage(prefix) + " makes node ids such as '" +
                     longest + "' longer than " + std::to_string(kMaxIdLength) +
                     " characters (it defaults to the queued resource id)");
  }
  return OkStatus();
}

Status CheckNetworkConfig(const json* net, const std::string& path,
                          Source source) {
  RETURN_IF_ERROR(OnlyKeys(*net, path,
                           {"network", "subnetwork", "enableExternalIps",
                            "canIpForward", "queueCount"}));
  RETURN_IF_ERROR(
      GetString(*net, "network", path, kMaxStringBytes, false).status());
  RETURN_IF_ERROR(
      GetString(*net, "subnetwork", path, kMaxStringBytes, false).status());
  RETURN_IF_ERROR(CheckBool(*net, "enableExternalIps", path));
  if (source == Source::kStored) return OkStatus();
  RETURN_IF_ERROR(CheckBool(*net, "canIpForward", path));
  return GetInteger(*net, "queueCount", path, 0, kMaxQueueCount, 0).status();
}

// node.network_config, and v2alpha1's node.network_configs (one per
// network of a multi-network node): accepted, type-checked.
Status ParseNetworkConfig(const json& node, const std::string& npath,
                          Source source) {
  if (const json* net = Member(node, "networkConfig")) {
    RETURN_IF_ERROR(CheckNetworkConfig(net, npath + ".network_config", source));
  }
  const json* nets = Member(node, "networkConfigs");
  if (nets == nullptr) return OkStatus();
  const std::string path = npath + ".network_configs";
  if (!nets->is_array()) return WrongType(path, "a list", *nets);
  if (nets->size() > kMaxListEntries) {
    return Field(path,
                 "more than " + std::to_string(kMaxListEntries) + " entries");
  }
  for (size_t i = 0; i < nets->size(); ++i) {
    RETURN_IF_ERROR(CheckNetworkConfig(
        &(*nets)[i], path + "[" + std::to_string(i) + "]", source));
  }
  return OkStatus();
}

// node.metadata and node.labels: objects of strings; the startup script.
Status ParseStringMaps(const json& node, const std::string& npath,
                       QueuedResourceSpec& spec) {
  for (const char* map_key : {"metadata", "labels"}) {
    const json* map = Member(node, map_key);
    if (map == nullptr) continue;
    RETURN_IF_ERROR(ValidateStringMap(*map, npath + "." + map_key));
    if (std::string(map_key) == "metadata" && map->contains("startup-script")) {
      spec.startup_script = map->at("startup-script").get<std::string>();
    }
  }
  return OkStatus();
}

// node.service_account, scheduling_config, data_disks,
// shielded_instance_config and accelerator_config: accepted, type-checked,
// not acted on.
Status ParseNodeOptions(const json& node, const std::string& npath) {
  if (const json* sa = Member(node, "serviceAccount")) {
    const std::string path = npath + ".service_account";
    RETURN_IF_ERROR(OnlyKeys(*sa, path, {"email", "scope"}));
    RETURN_IF_ERROR(
        GetString(*sa, "email", path, kMaxStringBytes, false).status());
    RETURN_IF_ERROR(CheckStringList(*sa, "scope", path));
  }
  if (const json* sc = Member(node, "schedulingConfig")) {
    const std::string path = npath + ".scheduling_config";
    RETURN_IF_ERROR(
        OnlyKeys(*sc, path,
                 {"preemptible", "reserved", "spot", "provisioningModel",
                  "reservationName", "terminationTimestamp"}));
    for (const char* key : {"preemptible", "reserved", "spot"}) {
      RETURN_IF_ERROR(CheckBool(*sc, key, path));
    }
    for (const char* key :
         {"provisioningModel", "reservationName", "terminationTimestamp"}) {
      RETURN_IF_ERROR(
          GetString(*sc, key, path, kMaxStringBytes, false).status());
    }
  }
  if (const json* disks = Member(node, "dataDisks")) {
    const std::string path = npath + ".data_disks";
    if (!disks->is_array()) return WrongType(path, "a list", *disks);
    if (disks->size() > kMaxListEntries) {
      return Field(path,
                   "more than " + std::to_string(kMaxListEntries) + " entries");
    }
    for (size_t i = 0; i < disks->size(); ++i) {
      const std::string disk_path = path + "[" + std::to_string(i) + "]";
      const json& disk = (*disks)[i];
      RETURN_IF_ERROR(
          OnlyKeys(disk, disk_path, {"sourceDisk", "mode", "workerIds"}));
      RETURN_IF_ERROR(CheckStringList(disk, "workerIds", disk_path));
      RETURN_IF_ERROR(
          GetString(disk, "sourceDisk", disk_path, kMaxStringBytes, false)
              .status());
      ASSIGN_OR_RETURN(std::string mode,
                       GetString(disk, "mode", disk_path, 64, false));
      if (!mode.empty() && mode != "READ_WRITE" && mode != "READ_ONLY" &&
          mode != "DISK_MODE_UNSPECIFIED") {
        return Field(disk_path + ".mode", QuoteForMessage(mode) +
                                              " is not READ_WRITE or "
                                              "READ_ONLY");
      }
    }
  }
  if (const json* shielded = Member(node, "shieldedInstanceConfig")) {
    const std::string path = npath + ".shielded_instance_config";
    RETURN_IF_ERROR(OnlyKeys(*shielded, path, {"enableSecureBoot"}));
    RETURN_IF_ERROR(CheckBool(*shielded, "enableSecureBoot", path));
  }
  if (const json* accel = Member(node, "acceleratorConfig")) {
    const std::string path = npath + ".accelerator_config";
    RETURN_IF_ERROR(OnlyKeys(*accel, path, {"type", "topology"}));
    RETURN_IF_ERROR(GetString(*accel, "type", path, 64, false).status());
    RETURN_IF_ERROR(GetString(*accel, "topology", path, 64, false).status());
  }
  if (const json* boot = Member(node, "bootDiskConfig")) {
    const std::string path = npath + ".boot_disk_config";
    RETURN_IF_ERROR(OnlyKeys(
        *boot, path,
        {"customerEncryptionKey", "diskSizeGb", "enableConfidentialCompute",
         "provisionedIops", "provisionedThroughput", "sourceImage"}));
    if (const json* key = Member(*boot, "customerEncryptionKey")) {
      RETURN_IF_ERROR(
          OnlyKeys(*key, path + ".customer_encryption_key", {"kmsKeyName"}));
      RETURN_IF_ERROR(GetString(*key, "kmsKeyName",
                                path + ".customer_encryption_key",
                                kMaxStringBytes, false)
                          .status());
    }
    RETURN_IF_ERROR(CheckBool(*boot, "enableConfidentialCompute", path));
    RETURN_IF_ERROR(
        GetString(*boot, "sourceImage", path, kMaxStringBytes, false).status());
    // int64 fields: protobuf JSON writes them as strings.
    for (const char* key :
         {"diskSizeGb", "provisionedIops", "provisionedThroughput"}) {
      const json* v = Member(*boot, key);
      if (v != nullptr && !v->is_number_integer() && !v->is_string()) {
        return WrongType(Join(path, key), "an integer", *v);
      }
    }
  }
  RETURN_IF_ERROR(
      GetString(node, "cidrBlock", npath, kMaxStringBytes, false).status());
  // v2alpha1's autocheckpoint (a checkpoint taken by the service before a
  // maintenance event): `multislice train` checkpoints itself
  // (checkpoint_period), so only its default is accepted.
  RETURN_IF_ERROR(CheckBool(node, "autocheckpointEnabled", npath));
  if (node.value("autocheckpointEnabled", false)) {
    return Field(npath + ".autocheckpoint_enabled",
                 "true is not implemented here (multislice train checkpoints "
                 "itself: checkpoint_period); leave it false");
  }
  return OkStatus();
}

// tpu.node_spec[0].node.
Status ParseNode(const json& ns, const std::string& ns_path, Source source,
                 QueuedResourceSpec& spec) {
  const json* node = Member(ns, "node");
  if (node == nullptr) return Field(ns_path + ".node", "is required");
  const std::string npath = ns_path + ".node";
  RETURN_IF_ERROR(
      OnlyKeys(*node, npath,
               {"acceleratorType", "runtimeVersion", "networkConfig", "tags",
                "metadata", "description", "labels", "serviceAccount",
                "schedulingConfig", "dataDisks", "shieldedInstanceConfig",
                "acceleratorConfig", "networkConfigs", "cidrBlock",
                "bootDiskConfig", "autocheckpointEnabled"}));
  ASSIGN_OR_RETURN(spec.accelerator_type,
                   GetString(*node, "acceleratorType", npath, 64, true));
  Result<mesh::AcceleratorType> type =
      mesh::ParseAcceleratorType(spec.accelerator_type);
  if (!type.ok()) {
    return Field(npath + ".accelerator_type", type.status().message());
  }
  ASSIGN_OR_RETURN(
      spec.runtime_version,
      GetString(*node, "runtimeVersion", npath, kMaxStringBytes, false));
  RETURN_IF_ERROR(ParseNetworkConfig(*node, npath, source));
  RETURN_IF_ERROR(CheckStringList(*node, "tags", npath));
  RETURN_IF_ERROR(ParseStringMaps(*node, npath, spec));
  if (source == Source::kStored) return OkStatus();
  RETURN_IF_ERROR(
      GetString(*node, "description", npath, kMaxStringBytes, false).status());
  return ParseNodeOptions(*node, npath);
}

// guaranteed / spot / best_effort: the tier.
Status ParseTier(const json& body, Source source, QueuedResourceSpec& spec) {
  int tiers = 0;
  if (const json* g = Member(body, "guaranteed")) {
    ++tiers;
    RETURN_IF_ERROR(OnlyKeys(*g, "guaranteed", {"reserved", "minDuration"}));
    RETURN_IF_ERROR(CheckBool(*g, "reserved", "guaranteed"));
    if (source == Source::kRequest) {
      RETURN_IF_ERROR(GetDuration(*g, "minDuration", "guaranteed").status());
    }
    spec.tier = g->value("reserved", false) ? Tier::kReserved : Tier::kOnDemand;
  }
  if (const json* spot = Member(body, "spot")) {
    ++tiers;
    RETURN_IF_ERROR(OnlyKeys(*spot, "spot", {}));
    spec.tier = Tier::kSpot;
  }
  if (const json* best = Member(body, "bestEffort")) {
    ++tiers;
    RETURN_IF_ERROR(OnlyKeys(*best, "best_effort", {}));
    spec.tier = Tier::kBestEffort;
  }
  if (tiers > 1) {
    return Field("guaranteed",
                 "give at most one of guaranteed, spot and "
                 "best_effort");
  }
  // gcloud's GA --reserved sends reservation_name
  // ".../reservations/-" (any reservation of the project): the reserved
  // tier.
  ASSIGN_OR_RETURN(
      const std::string reservation,
      GetString(body, "reservationName", "", kMaxStringBytes, false));
  if (!reservation.empty()) {
    if (tiers > 0 && spec.tier != Tier::kReserved &&
        spec.tier != Tier::kOnDemand) {
      return Field("reservation_name",
                   "a reservation cannot be combined with spot or "
                   "best_effort");
    }
    spec.tier = Tier::kReserved;
  }
  // v2alpha1's provisioning_model: STANDARD is the tier objects' choice;
  // SPOT and RESERVATION_BOUND are the spot and reserved tiers.
  ASSIGN_OR_RETURN(const std::string model,
                   GetEnum(body, "provisioningModel", "",
                           {"PROVISIONING_MODEL_UNSPECIFIED", "STANDARD",
                            "SPOT", "RESERVATION_BOUND", "FLEX_START"}));
  if (model == "FLEX_START") {
    return Field("provisioning_model",
                 "FLEX_START is not implemented here (STANDARD, SPOT or "
                 "RESERVATION_BOUND; a queued resource waits in its tier's "
                 "queue until hosts are free)");
  }
  const Tier wanted = model == "SPOT"                ? Tier::kSpot
                      : model == "RESERVATION_BOUND" ? Tier::kReserved
                                                     : spec.tier;
  if ((model == "SPOT" || model == "RESERVATION_BOUND") && tiers > 0 &&
      spec.tier != wanted) {
    return Field("provisioning_model",
                 QuoteForMessage(model) + " contradicts the " +
                     TierName(spec.tier) + " tier also given");
  }
  spec.tier = wanted;
  return OkStatus();
}

Status ParseQueueingPolicy(const json& body, int64_t now_ms,
                           QueuedResourceSpec& spec) {
  const json* q = Member(body, "queueingPolicy");
  if (q == nullptr) return OkStatus();
  const std::string path = "queueing_policy";
  RETURN_IF_ERROR(OnlyKeys(*q, path,
                           {"validUntilDuration", "validUntilTime",
                            "validAfterDuration", "validAfterTime"}));
  if (q->contains("validUntilDuration") && q->contains("validUntilTime")) {
    return Field(path,
                 "give at most one of valid_until_duration and "
                 "valid_until_time");
  }
  if (q->contains("validAfterDuration") && q->contains("validAfterTime")) {
    return Field(path,
                 "give at most one of valid_after_duration and "
                 "valid_after_time");
  }
  for (const std::string key : {"validUntilDuration", "validUntilTime",
                                "validAfterDuration", "validAfterTime"}) {
    int64_t when = 0;
    if (key.find("Duration") != std::string::npos) {
      ASSIGN_OR_RETURN(std::optional<int64_t> ms, GetDuration(*q, key, path));
      if (!ms) continue;
      when = now_ms + *ms;
    } else {
      ASSIGN_OR_RETURN(std::string text,
                       GetString(*q, key, path, kMaxStringBytes, false));
      if (!q->contains(key)) continue;
      Result<int64_t> ms = ParseTimestampMs(text);
      if (!ms.ok()) return Field(Join(path, key), ms.status().message());
      when = *ms;
    }
    if (key.rfind("validUntil", 0) == 0) {
      spec.valid_until_ms = when;
    } else {
      spec.valid_after_ms = when;
    }
  }
  return OkStatus();
}

// v2alpha1's run_duration (the service deletes the nodes after it) and
// traffic_config: type-checked; a run duration is not implemented here, so
// only its absence is accepted.
Status ParseRunOptions(const json& body) {
  if (const json* run = Member(body, "runDuration")) {
    RETURN_IF_ERROR(
        OnlyKeys(*run, "run_duration", {"maxRunDuration", "terminationTime"}));
    RETURN_IF_ERROR(
        GetDuration(*run, "maxRunDuration", "run_duration").status());
    RETURN_IF_ERROR(GetString(*run, "terminationTime", "run_duration",
                              kMaxStringBytes, false)
                        .status());
    if (!run->empty()) {
      return Field("run_duration",
                   "a run duration is not implemented here (a queued "
                   "resource runs until it is deleted: delete it with "
                   "--force, or let the job end)");
    }
  }
  if (const json* traffic = Member(body, "trafficConfig")) {
    RETURN_IF_ERROR(
        OnlyKeys(*traffic, "traffic_config", {"anticipatedTrafficMatrix"}));
    if (const json* m = Member(*traffic, "anticipatedTrafficMatrix")) {
      if (!m->is_object()) {
        return WrongType("traffic_config.anticipated_traffic_matrix",
                         "an object", *m);
      }
    }
  }
  return OkStatus();
}

Result<QueuedResourceSpec> ParseSpec(const json& input, const std::string& id,
                                     int64_t now_ms, Source source) {
  if (!input.is_object()) {
    return InvalidArgument("body: expected a JSON object (a QueuedResource)");
  }
  ASSIGN_OR_RETURN(json body, ToCamelCase(input));
  RETURN_IF_ERROR(
      OnlyKeys(body, "",
               {"name", "tpu", "guaranteed", "spot", "bestEffort",
                "queueingPolicy", "reservationName", "state", "createTime",
                "provisioningModel", "runDuration", "trafficConfig"}));
  // Output-only fields are ignored, as Google's API does.
  body.erase("name");
  body.erase("state");
  body.erase("createTime");
  QueuedResourceSpec spec;

  const json* tpu = Member(body, "tpu");
  if (tpu == nullptr) return Field("tpu", "is required");
  RETURN_IF_ERROR(OnlyKeys(*tpu, "tpu", {"nodeSpec"}));
  const json* specs = Member(*tpu, "nodeSpec");
  if (specs == nullptr) return Field("tpu.node_spec", "is required");
  if (!specs->is_array()) return WrongType("tpu.node_spec", "a list", *specs);
  if (specs->size() != 1) {
    return Field("tpu.node_spec", "exactly one entry is accepted, got " +
                                      std::to_string(specs->size()));
  }
  const json& ns = (*specs)[0];
  const std::string ns_path = "tpu.node_spec[0]";
  RETURN_IF_ERROR(
      OnlyKeys(ns, ns_path, {"parent", "nodeId", "multiNodeParams", "node"}));
  RETURN_IF_ERROR(
      GetString(ns, "parent", ns_path, kMaxStringBytes, false).status());
  RETURN_IF_ERROR(ParseNodeIds(ns, ns_path, id, source, spec));
  RETURN_IF_ERROR(ParseNode(ns, ns_path, source, spec));
  RETURN_IF_ERROR(ParseTier(body, source, spec));
  RETURN_IF_ERROR(ParseRunOptions(body));
  // A stored record keeps its deadlines as numbers (validUntilMs).
  if (source == Source::kRequest) {
    RETURN_IF_ERROR(ParseQueueingPolicy(body, now_ms, spec));
  }
  spec.body = std::move(body);
  return spec;
}

}  // namespace

Status ValidateStringMap(const json& map, const std::string& path) {
  if (!map.is_object()) return WrongType(path, "an object of strings", map);
  if (map.size() > kMaxListEntries) {
    return Field(path,
                 "more than " + std::to_string(kMaxListEntries) + " entries");
  }
  for (const auto& [key, value] : map.items()) {
    const size_t limit = key == "startup-script" || key == "ssh-keys"
                             ? kMaxStartupScriptBytes
                             : kMaxStringBytes;
    if (key.size() > kMaxStringBytes || !value.is_string() ||
        value.get_ref<const std::string&>().size() > limit) {
      const std::string quoted = QuoteForMessage(key);
      return Field(
          path + "[\"" + quoted.substr(1, quoted.size() - 2) + "\"]",
          "expected a string of at most " + std::to_string(limit) + " bytes");
    }
  }
  return OkStatus();
}

std::string StateName(QrState state) {
  return kStateNames[static_cast<int>(state)];
}

Result<QrState> ParseStateName(std::string_view name) {
  for (int i = 0; i < 9; ++i) {
    if (name == kStateNames[i]) return static_cast<QrState>(i);
  }
  return InvalidArgument("unknown state " + QuoteForMessage(name));
}

std::string TierName(Tier tier) { return kTierNames[static_cast<int>(tier)]; }

Result<Tier> ParseTierName(std::string_view name) {
  for (int i = 0; i < kNumTiers; ++i) {
    if (name == kTierNames[i]) return static_cast<Tier>(i);
  }
  return InvalidArgument("unknown tier " + QuoteForMessage(name) +
                         ": expected reserved, on-demand, spot or "
                         "best-effort");
}

bool ValidResourceId(std::string_view id) { return IsResourceId(id); }

Result<json> ParseJsonText(std::string_view text) {
  RETURN_IF_ERROR(CheckJsonText(text, kMaxJsonDepth));
  json result;
  PathTrackingSax sax(result);
  try {
    if (json::sax_parse(text.begin(), text.end(), &sax)) return result;
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("malformed JSON: ") + e.what());
  }
  if (sax.error()) return JsonError(text, *sax.error());
  return InvalidArgument("malformed JSON");
}

Result<int64_t> ParseDurationMs(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(QuoteForMessage(text) +
                           " is not a duration in seconds such as "
                           "\"3600s\" or \"1.5s\"" +
                           (why.empty() ? "" : ": " + why));
  };
  if (text.size() < 2 || text.back() != 's') return bad("");
  const std::string_view number = text.substr(0, text.size() - 1);
  const size_t dot = number.find('.');
  const std::string_view whole = number.substr(0, dot);
  const std::string_view fraction =
      dot == std::string_view::npos ? "" : number.substr(dot + 1);
  const auto digits = [](std::string_view s) {
    return std::all_of(s.begin(), s.end(),
                       [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(whole) || !digits(fraction) ||
      (whole.empty() && fraction.empty()) ||
      (dot != std::string_view::npos && fraction.empty()) ||
      fraction.size() > 9) {
    return bad("");
  }
  if (whole.size() > 12) return bad("at most 12 digits before the point");
  int64_t seconds = 0;
  for (char c : whole) seconds = seconds * 10 + (c - '0');
  if (seconds > kMaxDurationSeconds) {
    return bad("longer than " + std::to_string(kMaxDurationSeconds) +
               "s (10,000 years)");
  }
  int64_t millis = 0;
  for (size_t i = 0; i < 3; ++i) {
    millis = millis * 10 + (i < fraction.size() ? fraction[i] - '0' : 0);
  }
  const bool round_up = fraction.size() > 3 && fraction[3] >= '5';
  return seconds * 1000 + millis + (round_up ? 1 : 0);
}

Result<int64_t> ParseTimestampMs(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(QuoteForMessage(text) +
                           " is not an RFC 3339 time such as "
                           "\"2024-05-01T10:00:00Z\"" +
                           (why == "syntax" ? "" : ": " + why));
  };
  CivilTime t;
  std::string why = ReadCivilTime(text, &t);
  if (!why.empty()) return bad(why);
  size_t pos = 19;
  int64_t millis = 0;
  if (!ReadFraction(text, &pos, &millis)) {
    return bad("a fraction of a second has 1 to 9 digits");
  }
  int offset_minutes = 0;
  why = ReadZone(text, pos, &offset_minutes);
  if (!why.empty()) {
    return bad(why == "syntax" ? "it must end in Z or an offset such as +02:00"
                               : why);
  }
  const int64_t days = DaysFromCivil(t.year, t.month, t.day);
  const int64_t seconds = days * 86400 + t.hour * 3600 + t.minute * 60 +
                          t.second - int64_t{offset_minutes} * 60;
  return seconds * 1000 + millis;
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
  if (NestedDeeperThan(value, kMaxJsonDepth)) {
    return Field(path.empty() ? "body" : path,
                 "arrays and objects are nested more than " +
                     std::to_string(kMaxJsonDepth) + " deep");
  }
  return CamelCaseTree(value, path);
}

// The fields of a v2alpha1 node spec that v2 does not have, refused on
// /v2/ with the field named.
Status RefuseV2Alpha1NodeFields(const json& ns) {
  const std::string path = "tpu.node_spec[0]";
  auto refuse = [](const std::string& field) {
    return InvalidArgument(field +
                           ": not a field of the v2 API (it is v2alpha1's: "
                           "use the /v2alpha1/ API)");
  };
  const json* multi = Member(ns, "multisliceParams");
  if (multi != nullptr && multi->is_object() &&
      multi->contains("workloadType")) {
    return refuse(path + ".multislice_params.workload_type");
  }
  const json* node = Member(ns, "node");
  if (node == nullptr || !node->is_object()) return OkStatus();
  for (const char* key : {"autocheckpointEnabled", "bootDiskConfig"}) {
    if (node->contains(key)) return refuse(Join(path + ".node", key));
  }
  if (const json* sc = Member(*node, "schedulingConfig");
      sc && sc->is_object()) {
    for (const char* key :
         {"provisioningModel", "reservationName", "terminationTimestamp"}) {
      if (sc->contains(key)) {
        return refuse(Join(path + ".node.scheduling_config", key));
      }
    }
  }
  if (const json* disks = Member(*node, "dataDisks");
      disks && disks->is_array()) {
    for (size_t i = 0; i < disks->size(); ++i) {
      if ((*disks)[i].is_object() && (*disks)[i].contains("workerIds")) {
        return refuse(path + ".node.data_disks[" + std::to_string(i) +
                      "].worker_ids");
      }
    }
  }
  return OkStatus();
}

Result<QueuedResourceSpec> ParseQueuedResource(const json& body,
                                               const std::string& id,
                                               int64_t now_ms,
                                               const std::string& api) {
  if (api != "v2" || !body.is_object()) {
    return ParseSpec(body, id, now_ms, Source::kRequest);
  }
  // v2: its own names, checked here, then the v2alpha1 form.
  ASSIGN_OR_RETURN(json v2, ToCamelCase(body));
  if (v2.contains("bestEffort")) {
    return InvalidArgument(
        "best_effort: not a field of the v2 QueuedResource (it is v2alpha1's; "
        "use spot, or the /v2alpha1/ API)");
  }
  for (const char* key :
       {"provisioningModel", "runDuration", "trafficConfig"}) {
    if (v2.contains(key)) {
      return InvalidArgument(CamelToSnake(key) +
                             ": not a field of the v2 QueuedResource (it is "
                             "v2alpha1's: use the /v2alpha1/ API)");
    }
  }
  if (v2.contains("tpu") && v2["tpu"].is_object() &&
      v2["tpu"].contains("nodeSpec") && v2["tpu"]["nodeSpec"].is_array()) {
    for (json& ns : v2["tpu"]["nodeSpec"]) {
      if (!ns.is_object()) continue;
      RETURN_IF_ERROR(RefuseV2Alpha1NodeFields(ns));
      if (ns.contains("multiNodeParams")) {
        return InvalidArgument(
            "tpu.node_spec[0].multi_node_params: not a field of the v2 API "
            "(it is v2alpha1's; v2 calls it multislice_params)");
      }
      if (ns.contains("multisliceParams")) {
        ns["multiNodeParams"] = std::move(ns["multisliceParams"]);
        ns.erase("multisliceParams");
      }
    }
  }
  return ParseSpec(v2, id, now_ms, Source::kRequest);
}

json QueuedResourceRecord::ToStorage() const {
  json nodes_json = json::array();
  for (const NodeRecord& n : nodes) {
    json node = {{"nodeId", n.node_id},
                 {"state", n.state},
                 {"health", n.health},
                 {"hosts", n.hosts},
                 {"started", n.started}};
    if (!n.metadata.is_null()) node["metadata"] = n.metadata;
    if (n.metadata_generation > 0) {
      node["metadataGeneration"] = n.metadata_generation;
    }
    nodes_json.push_back(std::move(node));
  }
  json updates = json::array();
  for (const NodeUpdate& u : node_updates) {
    updates.push_back({{"op", u.op},
                       {"nodeId", u.node_id},
                       {"generation", u.generation},
                       {"deadlineMs", u.deadline_ms}});
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
          {"uid", uid},
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
          {"clusterJob", cluster_job},
          {"stateHistory", history},
          {"nodeUpdates", updates},
          {"createdAsNode", created_as_node}};
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
    // Records written before uids existed: one from what is unique to them.
    r.uid = j.value(
        "uid", "s" + std::to_string(r.seq) + "-" + std::to_string(r.create_ms));
    ASSIGN_OR_RETURN(r.spec, ParseSpec(j.at("body"), r.id, 0, Source::kStored));
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
      // Absent before nodes could be patched.
      if (n.contains("metadata") && n["metadata"].is_object()) {
        node.metadata = n["metadata"];
      }
      node.metadata_generation = n.value("metadataGeneration", int64_t{0});
      r.nodes.push_back(std::move(node));
    }
    r.retired_hosts = j.at("retiredHosts").get<std::vector<std::string>>();
    r.delete_requested = j.at("deleteRequested");
    r.waiting_ops = j.at("waitingOps").get<std::vector<std::string>>();
    r.coordinator = j.at("coordinator");
    r.cluster_job = j.value("clusterJob", "");  // absent before Slurm
    // Absent in records written before the history existed.
    for (const json& c : j.value("stateHistory", json::array())) {
      r.state_history.push_back({c.at("state").get<std::string>(),
                                 c.at("timeMs").get<int64_t>(),
                                 c.at("initiator").get<std::string>()});
    }
    r.created_as_node = j.value("createdAsNode", false);
    for (const json& u : j.value("nodeUpdates", json::array())) {
      r.node_updates.push_back({u.at("op").get<std::string>(),
                                u.at("nodeId").get<std::string>(),
                                u.at("generation").get<int64_t>(),
                                u.at("deadlineMs").get<int64_t>()});
    }
    return r;
  } catch (const json::exception& e) {
    return Internal(std::string("stored queued resource is malformed: ") +
                    e.what());
  }
}

json QueuedResourceRecord::NodeMetadata(const NodeRecord& n) const {
  if (n.metadata.is_object()) return n.metadata;
  const json& specs = spec.body.contains("tpu") && spec.body["tpu"].is_object()
                          ? spec.body["tpu"].value("nodeSpec", json::array())
                          : json::array();
  if (specs.is_array() && !specs.empty() && specs[0].is_object() &&
      specs[0].contains("node") && specs[0]["node"].is_object()) {
    const json& node = specs[0]["node"];
    if (node.contains("metadata") && node["metadata"].is_object()) {
      return node["metadata"];
    }
  }
  return json::object();
}

std::string QueuedResourceRecord::NodeNumericId(size_t index) const {
  // Google's ids are decimal int64s; this one is the record's uid (128
  // random bits, hex) folded to 60 bits, plus the node's index.
  uint64_t folded = 0;
  for (size_t i = 0; i < uid.size() && i < 15; ++i) {
    const char c = uid[i];
    const int digit = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                      : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
                                                                  : c % 16;
    folded = folded * 16 + static_cast<uint64_t>(digit);
  }
  return std::to_string(folded + index);
}

void QueuedResourceRecord::ExpandNodeSpecs(json& out) const {
  // As Google's service answers: a multislice request's one node spec
  // (multiNodeParams / multisliceParams) comes back as one spec per node,
  // each with its nodeId. gcloud reads them: `queued-resources ssh --node`
  // picks nodes by index in this list, and list's NODE_COUNT is its length.
  if (!out.contains("tpu") || !out["tpu"].is_object() ||
      !out["tpu"].contains("nodeSpec") || !out["tpu"]["nodeSpec"].is_array() ||
      out["tpu"]["nodeSpec"].size() != 1 || nodes.empty()) {
    return;
  }
  json one = out["tpu"]["nodeSpec"][0];
  if (!one.is_object() ||
      !(one.contains("multiNodeParams") || one.contains("multisliceParams"))) {
    return;
  }
  one.erase("multiNodeParams");
  one.erase("multisliceParams");
  json expanded = json::array();
  for (const NodeRecord& n : nodes) {
    json spec_of_node = one;
    spec_of_node["nodeId"] = n.node_id;
    expanded.push_back(std::move(spec_of_node));
  }
  out["tpu"]["nodeSpec"] = std::move(expanded);
}

json QueuedResourceRecord::ToApi(const std::string& api) const {
  json out = spec.body;
  if (api == "v2" && out.contains("tpu") && out["tpu"].contains("nodeSpec")) {
    for (json& ns : out["tpu"]["nodeSpec"]) {
      if (ns.is_object() && ns.contains("multiNodeParams")) {
        ns["multisliceParams"] = std::move(ns["multiNodeParams"]);
        ns.erase("multiNodeParams");
      }
    }
  }
  ExpandNodeSpecs(out);
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
  // On Slurm capacity: the job holding the nodes (`queued-resources ssh`
  // runs there as a step of it).
  if (!cluster_job.empty()) out["clusterJob"] = cluster_job;
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
