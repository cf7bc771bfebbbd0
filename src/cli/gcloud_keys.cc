// Resource key paths and cells for gcloud's --format and --filter (see
// gcloud_keys.h).
#include "cli/gcloud_keys.h"

#include <cctype>
#include <cstdlib>
#include <optional>
#include <regex>

namespace multislice::cli::gcloud_keys {

using nlohmann::json;

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower((unsigned char)c));
  return out;
}

std::string Trim(std::string_view text) {
  size_t b = text.find_first_not_of(" \t\n");
  if (b == std::string_view::npos) return "";
  size_t e = text.find_last_not_of(" \t\n");
  return std::string(text.substr(b, e - b + 1));
}

static std::optional<int> ParseIndex(std::string_view text) {
  static const std::regex kInt(R"(^-?[0-9]{1,6}$)");
  const std::string s(text);
  if (!std::regex_match(s, kInt)) return std::nullopt;
  return std::atoi(s.c_str());
}

static Result<Segment> ParseSegment(std::string_view text,
                                    std::string_view key) {
  static const std::regex kSegment(
      R"(^([A-Za-z_][A-Za-z0-9_-]*)?((\[-?[0-9]+\])*)$)");
  const std::string s(text);
  std::smatch m;
  if (s.empty() || !std::regex_match(s, m, kSegment)) {
    return InvalidArgument("'" + std::string(key) +
                           "' is not a key such as state.state or "
                           "tpu.nodeSpec[0].node.acceleratorType");
  }
  Segment segment{m[1], {}};
  const std::string brackets = m[2];
  for (size_t at = 0; at < brackets.size();) {
    const size_t end = brackets.find(']', at);
    segment.indices.push_back(
        *ParseIndex(std::string_view(brackets).substr(at + 1, end - at - 1)));
    at = end + 1;
  }
  return segment;
}

Result<Key> ParseKey(std::string_view text, const KeyAliases& aliases) {
  std::string key = Trim(text);
  if (auto alias = aliases.find(key); alias != aliases.end()) {
    key = alias->second;
  }
  Key out;
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t dot = key.find('.', at);
    parts.push_back(key.substr(at, dot - at));
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  static const std::regex kCall(R"(^([a-z]+)\((-?[0-9]*)\)$)");
  std::smatch m;
  if (parts.size() > 1 && std::regex_match(parts.back(), m, kCall)) {
    out.transform = m[1];
    const std::string arg = m[2];
    const bool takes_arg = out.transform == "segment";
    if (out.transform != "basename" && out.transform != "len" && !takes_arg) {
      return InvalidArgument("'" + key + "': unknown transform '" +
                             out.transform +
                             "()': expected basename(), segment(I) or len()");
    }
    if (!takes_arg && !arg.empty()) {
      return InvalidArgument("'" + key + "': " + out.transform +
                             "() takes no argument");
    }
    out.argument = arg.empty() ? -1 : *ParseIndex(arg);
    parts.pop_back();
  }
  for (const std::string& part : parts) {
    ASSIGN_OR_RETURN(Segment s, ParseSegment(part, key));
    out.segments.push_back(std::move(s));
  }
  return out;
}

// "accelerator_type" -> "acceleratorType".
static std::string CamelCase(std::string_view name) {
  std::string out;
  bool upper = false;
  for (char c : name) {
    if (c == '_') {
      upper = true;
    } else {
      out += upper ? static_cast<char>(std::toupper((unsigned char)c)) : c;
      upper = false;
    }
  }
  return out;
}

const json* Member(const json& object, const std::string& name) {
  if (auto it = object.find(name); it != object.end()) return &*it;
  if (auto it = object.find(CamelCase(name)); it != object.end()) return &*it;
  const std::string lower = Lower(CamelCase(name));
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (Lower(it.key()) == lower) return &*it;
  }
  return nullptr;
}

static json Walk(const json& value, const std::vector<Segment>& segments,
                 size_t i) {
  if (i == segments.size()) return value;
  const Segment& s = segments[i];
  if (value.is_array() && !s.name.empty()) {
    json out = json::array();
    for (const json& item : value) {
      json v = Walk(item, segments, i);
      if (!v.is_null()) out.push_back(std::move(v));
    }
    return out;
  }
  const json* current = &value;
  if (!s.name.empty()) {
    if (!value.is_object()) return nullptr;
    current = Member(value, s.name);
    if (current == nullptr) return nullptr;
  }
  for (int index : s.indices) {
    if (!current->is_array()) return nullptr;
    const long size = static_cast<long>(current->size());
    const long at = index < 0 ? size + index : index;
    if (at < 0 || at >= size) return nullptr;
    current = &(*current)[static_cast<size_t>(at)];
  }
  return Walk(*current, segments, i + 1);
}

static json ApplyTransform(const json& value, const Key& key) {
  if (key.transform == "len") {
    if (value.is_array() || value.is_object()) return value.size();
    if (value.is_string()) return value.get_ref<const std::string&>().size();
    return 0;
  }
  if (value.is_array()) {
    json out = json::array();
    for (const json& item : value) out.push_back(ApplyTransform(item, key));
    return out;
  }
  if (!value.is_string()) return value;
  const std::string& text = value.get_ref<const std::string&>();
  if (key.transform == "basename") return text.substr(text.rfind('/') + 1);
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t slash = text.find('/', at);
    parts.push_back(text.substr(at, slash - at));
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
  const long n = static_cast<long>(parts.size());
  const long at = key.argument < 0 ? n + key.argument : key.argument;
  return at >= 0 && at < n ? json(parts[static_cast<size_t>(at)]) : json();
}

json Resolve(const json& resource, const Key& key) {
  json value = Walk(resource, key.segments, 0);
  return key.transform.empty() ? value : ApplyTransform(value, key);
}

// A cell of a table, value or csv row.
std::string Cell(const json& value, const char* list_separator) {
  if (value.is_null()) return "";
  if (value.is_string()) return value.get<std::string>();
  if (value.is_boolean()) return value.get<bool>() ? "True" : "False";
  if (value.is_array()) {
    std::string out;
    for (const json& item : value) {
      out += (out.empty() ? "" : list_separator) + Cell(item, list_separator);
    }
    return out;
  }
  return value.dump();
}

std::string Unquote(const std::string& text) {
  if (text.size() >= 2 && (text[0] == '"' || text[0] == '\'') &&
      text.back() == text[0]) {
    return text.substr(1, text.size() - 2);
  }
  return text;
}

}  // namespace multislice::cli::gcloud_keys
