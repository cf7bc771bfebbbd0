// gcloud's --format and --filter (see gcloud_format.h): key paths and
// transforms, the printers, and the filter expression parser.
#include "cli/gcloud_format.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <regex>

namespace multislice::cli {
namespace {

using nlohmann::json;

// ----- keys -----

struct Segment {
  std::string name;          // empty: the indices apply to the value itself
  std::vector<int> indices;  // [i] after the name; negative from the end
};

struct Key {
  std::vector<Segment> segments;
  std::string transform;  // "", "basename", "segment", "len"
  int argument = -1;      // segment's index
};

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

std::optional<int> ParseIndex(std::string_view text) {
  static const std::regex kInt(R"(^-?[0-9]{1,6}$)");
  const std::string s(text);
  if (!std::regex_match(s, kInt)) return std::nullopt;
  return std::atoi(s.c_str());
}

Result<Segment> ParseSegment(std::string_view text, std::string_view key) {
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
std::string CamelCase(std::string_view name) {
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

json Walk(const json& value, const std::vector<Segment>& segments, size_t i) {
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

json ApplyTransform(const json& value, const Key& key) {
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

}  // namespace

json ValueOfKey(const json& resource, std::string_view key,
                const KeyAliases& aliases) {
  Result<Key> parsed = ParseKey(key, aliases);
  return parsed.ok() ? Resolve(resource, *parsed) : json();
}

std::string ColumnHeading(const FormatColumn& column) {
  if (!column.label.empty()) return column.label;
  static const std::regex kTransform(R"(\.[a-z]+\(-?[0-9]*\)$)");
  const std::string key = std::regex_replace(column.key, kTransform, "");
  std::string name = key.substr(key.rfind('.') + 1);
  name = name.substr(0, name.find('['));
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (std::isupper((unsigned char)c) && i > 0) out += '_';
    out += c == '-' ? '_' : static_cast<char>(std::toupper((unsigned char)c));
  }
  return out;
}

// ----- yaml -----

namespace {

bool NeedsQuotes(const std::string& s) {
  if (s.empty()) return true;
  static const std::regex kImplicit(
      R"(^(y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|)"
      R"(on|On|ON|off|Off|OFF|~|null|Null|NULL|=|<<)$|)"
      R"(^[-+]?(0|[1-9][0-9_]*|0[0-7_]+|0x[0-9a-fA-F_]+|0b[01_]+)$|)"
      R"(^[-+]?([0-9][0-9_]*)?\.[0-9_]*([eE][-+]?[0-9]+)?$|)"
      R"(^[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?$|)"
      R"(^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$|)"
      R"(^[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?)");
  if (std::regex_search(s, kImplicit)) return true;
  if (std::string("#,[]{}&*!|>'\"%@`").find(s[0]) != std::string::npos) {
    return true;
  }
  if ((s[0] == '-' || s[0] == '?' || s[0] == ':') &&
      (s.size() == 1 || s[1] == ' ')) {
    return true;
  }
  return s.front() == ' ' || s.back() == ' ' || s.back() == ':' ||
         s.find(": ") != std::string::npos || s.find(" #") != std::string::npos;
}

bool Printable(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x20 && c != '\n') return false;
    if (c == 0x7f) return false;
  }
  return true;
}

std::string DoubleQuoted(const std::string& s) {
  // JSON's escapes are valid in YAML's double-quoted style.
  return json(s).dump();
}

std::string Pad(int n) { return std::string(static_cast<size_t>(n), ' '); }

// A scalar after "key:" or "- " (with its leading space), or a block.
std::string YamlScalar(const json& v, int indent) {
  if (v.is_null()) return " null";
  if (v.is_boolean()) return v.get<bool>() ? " true" : " false";
  if (v.is_number()) return " " + v.dump();
  const std::string s = v.get<std::string>();
  if (!Printable(s)) return " " + DoubleQuoted(s);
  if (s.find('\n') != std::string::npos) {
    if (s.front() == ' ' || s.front() == '\n') return " " + DoubleQuoted(s);
    std::string body = s;
    std::string header = " |";
    if (body.back() != '\n') {
      header += "-";
    } else {
      body.pop_back();
      if (!body.empty() && body.back() == '\n') {
        header += "+";
      }
    }
    std::string out = header + "\n";
    for (size_t at = 0;;) {
      const size_t nl = body.find('\n', at);
      const std::string line = body.substr(at, nl - at);
      out += (line.empty() ? "" : Pad(indent) + line) + "\n";
      if (nl == std::string::npos) break;
      at = nl + 1;
    }
    out.pop_back();
    return out;
  }
  if (!NeedsQuotes(s)) return " " + s;
  std::string quoted = "'";
  for (char c : s) quoted += c == '\'' ? std::string("''") : std::string(1, c);
  return " " + quoted + "'";
}

std::string YamlKey(const std::string& key) {
  return YamlScalar(json(key), 0).substr(1);
}

void EmitYaml(const json& v, int indent, std::string& out);

// A list item: "- " then the item, whose first line shares the dash's line.
void EmitItem(const json& item, int indent, std::string& out) {
  if (item.is_object() && !item.empty()) {
    std::string inner;
    EmitYaml(item, indent + 2, inner);
    out += Pad(indent) + "- " + inner.substr(static_cast<size_t>(indent) + 2);
  } else if (item.is_array() && !item.empty()) {
    std::string inner;
    EmitYaml(item, indent + 2, inner);
    out += Pad(indent) + "- " + inner.substr(static_cast<size_t>(indent) + 2);
  } else if (item.is_object()) {
    out += Pad(indent) + "- {}\n";
  } else if (item.is_array()) {
    out += Pad(indent) + "- []\n";
  } else {
    out += Pad(indent) + "-" + YamlScalar(item, indent + 2) + "\n";
  }
}

void EmitYaml(const json& v, int indent, std::string& out) {
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      const json& value = it.value();
      out += Pad(indent) + YamlKey(it.key()) + ":";
      if (value.is_object() && !value.empty()) {
        out += "\n";
        EmitYaml(value, indent + 2, out);
      } else if (value.is_array() && !value.empty()) {
        out += "\n";
        EmitYaml(value, indent, out);
      } else if (value.is_object()) {
        out += " {}\n";
      } else if (value.is_array()) {
        out += " []\n";
      } else {
        out += YamlScalar(value, indent + 2) + "\n";
      }
    }
  } else if (v.is_array()) {
    for (const json& item : v) EmitItem(item, indent, out);
  } else {
    out += Pad(indent) + YamlScalar(v, indent + 2).substr(1) + "\n";
  }
}

}  // namespace

std::string ToYaml(const json& resource) {
  std::string out;
  if (resource.is_object() && resource.empty()) return "{}\n";
  if (resource.is_array() && resource.empty()) return "[]\n";
  EmitYaml(resource, 0, out);
  return out;
}

// ----- formats -----

namespace {

// Splits at top-level commas (not inside parentheses or quotes).
std::vector<std::string> SplitTopLevel(std::string_view text) {
  std::vector<std::string> out;
  std::string current;
  int depth = 0;
  char quote = 0;
  for (char c : text) {
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '(') {
      ++depth;
    } else if (c == ')') {
      --depth;
    } else if (c == ',' && depth == 0) {
      out.push_back(Trim(current));
      current.clear();
      continue;
    }
    current += c;
  }
  if (!Trim(current).empty() || !out.empty()) out.push_back(Trim(current));
  return out;
}

std::string Unquote(const std::string& text) {
  if (text.size() >= 2 && (text[0] == '"' || text[0] == '\'') &&
      text.back() == text[0]) {
    return text.substr(1, text.size() - 2);
  }
  return text;
}

Status FormatError(std::string_view text, const std::string& why) {
  return InvalidArgument("--format: '" + std::string(text) + "' " + why);
}

Result<FormatColumn> ParseColumn(std::string_view format_text,
                                 const std::string& text) {
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t colon = text.find(':', at);
    parts.push_back(Trim(text.substr(at, colon - at)));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  FormatColumn column{parts[0], ""};
  Result<Key> key = ParseKey(column.key, {});
  if (!key.ok())
    return FormatError(format_text, "has " + key.status().message());
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& attr = parts[i];
    if (attr.rfind("label=", 0) == 0) {
      column.label = Unquote(attr.substr(6));
    } else if (attr.rfind("sort=", 0) != 0 && attr.rfind("align=", 0) != 0 &&
               attr != "reverse") {
      return FormatError(format_text, "has the column attribute '" + attr +
                                          "': expected label=HEADING");
    }
  }
  return column;
}

const std::map<std::string, OutputFormat::Kind>& Kinds() {
  using K = OutputFormat::Kind;
  static const std::map<std::string, K> kinds = {
      {"yaml", K::kYaml},      {"json", K::kJson},
      {"table", K::kTable},    {"value", K::kValue},
      {"csv", K::kCsv},        {"none", K::kNone},
      {"text", K::kFlattened}, {"flattened", K::kFlattened}};
  return kinds;
}

}  // namespace

Result<OutputFormat> ParseFormat(std::string_view text,
                                 std::string_view default_format) {
  static const std::regex kFormat(
      R"(^\s*([a-z]+)\s*(\[([^\]]*)\])?\s*(\((.*)\))?\s*$)");
  const std::string s(text);
  std::smatch m;
  if (!std::regex_match(s, m, kFormat) || !Kinds().count(m[1])) {
    return FormatError(text,
                       "is not a format: expected yaml, json, table, value, "
                       "csv, flattened or none, optionally with (KEY, ...)");
  }
  OutputFormat format;
  format.kind = Kinds().at(m[1]);
  for (const std::string& attr : SplitTopLevel(m[3].str())) {
    if (attr == "no-heading") {
      format.no_heading = true;
    } else if (!attr.empty()) {
      return FormatError(
          text, "has the attribute '" + attr + "': expected no-heading");
    }
  }
  if (m[4].matched) {
    for (const std::string& column : SplitTopLevel(m[5].str())) {
      if (column.empty()) return FormatError(text, "has an empty column");
      ASSIGN_OR_RETURN(FormatColumn c, ParseColumn(text, column));
      format.columns.push_back(std::move(c));
    }
  }
  using K = OutputFormat::Kind;
  const bool tabular = format.kind == K::kTable || format.kind == K::kValue ||
                       format.kind == K::kCsv;
  if (tabular && format.columns.empty() && !default_format.empty()) {
    ASSIGN_OR_RETURN(OutputFormat fallback, ParseFormat(default_format));
    format.columns = fallback.columns;
  }
  if (tabular && format.columns.empty()) {
    return FormatError(
        text, "needs columns, e.g. " + std::string(m[1]) + "(name, state)");
  }
  return format;
}

namespace {

using Rows = std::vector<std::vector<std::string>>;

Rows CellRows(const OutputFormat& format, const json& resources,
              const KeyAliases& aliases, const char* list_separator) {
  Rows rows;
  for (const json& r : resources) {
    std::vector<std::string> row;
    for (const FormatColumn& c : format.columns) {
      row.push_back(Cell(ValueOfKey(r, c.key, aliases), list_separator));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string Table(const Rows& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += Pad(int(width[i] - row[i].size() + 2));
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// The projection of `resource` on the format's columns, for json and yaml.
json Projected(const OutputFormat& format, const json& resource,
               const KeyAliases& aliases) {
  if (format.columns.empty()) return resource;
  json out = json::object();
  for (const FormatColumn& c : format.columns) {
    json value = ValueOfKey(resource, c.key, aliases);
    if (value.is_null()) continue;
    static const std::regex kPlain(
        R"(^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$)");
    if (!std::regex_match(c.key, kPlain)) {
      out[c.label.empty() ? c.key : c.label] = std::move(value);
      continue;
    }
    json* at = &out;
    for (size_t b = 0;;) {
      const size_t dot = c.key.find('.', b);
      json& next = (*at)[c.key.substr(b, dot - b)];
      if (dot == std::string::npos) {
        next = std::move(value);
        break;
      }
      if (!next.is_object()) next = json::object();
      at = &next;
      b = dot + 1;
    }
  }
  return out;
}

void FlattenInto(const json& v, const std::string& prefix,
                 std::vector<std::pair<std::string, std::string>>& out) {
  if (v.is_object() && !v.empty()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      FlattenInto(it.value(),
                  prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    }
  } else if (v.is_array() && !v.empty()) {
    for (size_t i = 0; i < v.size(); ++i) {
      FlattenInto(v[i], prefix + "[" + std::to_string(i) + "]", out);
    }
  } else {
    out.emplace_back(prefix, v.is_object()  ? "{}"
                             : v.is_array() ? "[]"
                                            : Cell(v, ";"));
  }
}

std::string Flattened(const json& resource) {
  std::vector<std::pair<std::string, std::string>> lines;
  FlattenInto(resource, "", lines);
  size_t width = 0;
  for (const auto& [key, value] : lines) width = std::max(width, key.size());
  std::string out;
  for (const auto& [key, value] : lines) {
    out += key + ":" + Pad(int(width - key.size() + 1)) + value + "\n";
  }
  return out;
}

}  // namespace

std::string FormatList(const OutputFormat& format, const json& resources,
                       const KeyAliases& aliases) {
  using K = OutputFormat::Kind;
  std::string out;
  switch (format.kind) {
    case K::kNone:
      return "";
    case K::kJson: {
      json all = json::array();
      for (const json& r : resources) {
        all.push_back(Projected(format, r, aliases));
      }
      return all.dump(2) + "\n";
    }
    case K::kYaml:
      for (const json& r : resources) {
        out += "---\n" + ToYaml(Projected(format, r, aliases));
      }
      return out;
    case K::kFlattened:
      for (const json& r : resources) {
        out += "---\n" + Flattened(Projected(format, r, aliases));
      }
      return out;
    case K::kTable: {
      if (resources.empty()) return "";
      Rows rows = CellRows(format, resources, aliases, ",");
      if (!format.no_heading) {
        std::vector<std::string> heading;
        for (const FormatColumn& c : format.columns) {
          heading.push_back(ColumnHeading(c));
        }
        rows.insert(rows.begin(), heading);
      }
      return Table(rows);
    }
    case K::kValue:
      for (const auto& row : CellRows(format, resources, aliases, ";")) {
        std::string line;
        for (size_t i = 0; i < row.size(); ++i) {
          line += (i ? "\t" : "") + row[i];
        }
        out += line + "\n";
      }
      return out;
    case K::kCsv: {
      if (resources.empty()) return "";
      Rows rows = CellRows(format, resources, aliases, ";");
      if (!format.no_heading) {
        std::vector<std::string> heading;
        for (const FormatColumn& c : format.columns) {
          heading.push_back(c.label.empty() ? c.key : c.label);
        }
        rows.insert(rows.begin(), heading);
      }
      for (const auto& row : rows) {
        std::string line;
        for (size_t i = 0; i < row.size(); ++i) {
          line += (i ? "," : "") + CsvField(row[i]);
        }
        out += line + "\n";
      }
      return out;
    }
  }
  return out;
}

std::string FormatOne(const OutputFormat& format, const json& resource,
                      const KeyAliases& aliases) {
  using K = OutputFormat::Kind;
  switch (format.kind) {
    case K::kYaml:
      return ToYaml(Projected(format, resource, aliases));
    case K::kJson:
      return Projected(format, resource, aliases).dump(2) + "\n";
    case K::kFlattened:
      return Flattened(Projected(format, resource, aliases));
    default:
      return FormatList(format, json::array({resource}), aliases);
  }
}

// ----- filters -----

namespace {

using Predicate = std::function<bool(const json&)>;

bool Glob(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

void Leaves(const json& v, std::vector<std::string>& out) {
  if (v.is_object() || v.is_array()) {
    for (const json& item : v) Leaves(item, out);
  } else if (!v.is_null()) {
    out.push_back(Cell(v, ","));
  }
}

// `:` and bare words: case-insensitive substring, or glob with '*'.
bool Has(const std::string& value, const std::string& pattern) {
  const std::string v = Lower(value), p = Lower(pattern);
  if (p.find('*') == std::string::npos) return v.find(p) != std::string::npos;
  return Glob(p, v);
}

bool Equals(const std::string& value, const std::string& expected) {
  const std::string base = value.substr(value.rfind('/') + 1);
  if (expected.find('*') != std::string::npos) {
    return Glob(expected, value) || Glob(expected, base);
  }
  return value == expected || base == expected;
}

bool Compare(const std::string& value, const std::string& op,
             const std::string& expected) {
  char* end_v = nullptr;
  char* end_e = nullptr;
  const double v = std::strtod(value.c_str(), &end_v);
  const double e = std::strtod(expected.c_str(), &end_e);
  const bool numeric =
      !value.empty() && !expected.empty() && *end_v == 0 && *end_e == 0;
  const int c = numeric ? (v < e   ? -1
                           : v > e ? 1
                                   : 0)
                        : value.compare(expected);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

Status FilterError(const std::string& term, const std::string& why) {
  return InvalidArgument("--filter: '" + term + "' " + why);
}

Result<Predicate> TermPredicate(const std::string& term,
                                const KeyAliases& aliases,
                                std::set<std::string>& keys) {
  static const char* kOps[] = {"!=", "!~", "<=", ">=", "=", "~", ":", "<", ">"};
  size_t at = std::string::npos;
  std::string op;
  char quote = 0;
  for (size_t i = 0; i < term.size() && op.empty(); ++i) {
    if (quote) {
      if (term[i] == quote) quote = 0;
      continue;
    }
    if (term[i] == '"' || term[i] == '\'') {
      quote = term[i];
      continue;
    }
    for (const char* candidate : kOps) {
      if (term.compare(i, std::strlen(candidate), candidate) == 0) {
        at = i;
        op = candidate;
        break;
      }
    }
  }
  if (op.empty()) {  // a bare word: any value of the resource
    const std::string word = Unquote(term);
    return Predicate([word](const json& r) {
      std::vector<std::string> leaves;
      Leaves(r, leaves);
      return std::any_of(leaves.begin(), leaves.end(),
                         [&](const std::string& v) { return Has(v, word); });
    });
  }
  const std::string key_text = term.substr(0, at);
  const std::string value = Unquote(term.substr(at + op.size()));
  Result<Key> key = ParseKey(key_text, aliases);
  if (key_text.empty() || !key.ok()) {
    return FilterError(term,
                       "does not start with a key such as name or "
                       "state.state");
  }
  if (value.empty()) {
    return FilterError(term, "has no value after '" + op + "'");
  }
  keys.insert(Trim(key_text));
  std::optional<std::regex> regex;
  if (op == "~" || op == "!~") {
    try {
      regex.emplace(value);
    } catch (const std::regex_error&) {
      return FilterError(
          term, "has '" + value + "', which is not a regular expression");
    }
  }
  return Predicate([key = *key, op, value, regex](const json& r) {
    const json v = Resolve(r, key);
    std::vector<std::string> leaves;
    Leaves(v, leaves);
    auto any = [&](const std::function<bool(const std::string&)>& f) {
      return std::any_of(leaves.begin(), leaves.end(), f);
    };
    if (op == "=") return any([&](auto& s) { return Equals(s, value); });
    if (op == "!=") return !any([&](auto& s) { return Equals(s, value); });
    if (op == "~")
      return any([&](auto& s) { return std::regex_search(s, *regex); });
    if (op == "!~")
      return !any([&](auto& s) { return std::regex_search(s, *regex); });
    if (op == ":") {
      if (value == "*") return any([](auto& s) { return !s.empty(); });
      return any([&](auto& s) { return Has(s, value); });
    }
    return any([&](auto& s) { return Compare(s, op, value); });
  });
}

// Words and parentheses; a parenthesis right after a name (a transform's
// call) and quoted text stay inside the word.
Result<std::vector<std::string>> Tokens(std::string_view text) {
  std::vector<std::string> tokens;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (std::isspace((unsigned char)c)) {
      ++i;
    } else if (c == '(' || c == ')') {
      tokens.emplace_back(1, c);
      ++i;
    } else {
      std::string word;
      int depth = 0;
      while (i < text.size()) {
        const char d = text[i];
        if (d == '"' || d == '\'') {
          const size_t end = text.find(d, i + 1);
          if (end == std::string_view::npos) {
            return InvalidArgument("--filter: '" + std::string(text) +
                                   "' has an unclosed quote");
          }
          word += text.substr(i, end - i + 1);
          i = end + 1;
          continue;
        }
        if (std::isspace((unsigned char)d)) break;
        if (d == '(' && !word.empty() &&
            std::isalpha((unsigned char)word.back())) {
          ++depth;
        } else if (d == '(') {
          break;
        } else if (d == ')' && depth == 0) {
          break;
        } else if (d == ')') {
          --depth;
        }
        word += d;
        ++i;
      }
      tokens.push_back(word);
    }
  }
  return tokens;
}

class FilterParser {
 public:
  FilterParser(std::vector<std::string> tokens, const KeyAliases& aliases,
               std::string text)
      : tokens_(std::move(tokens)), aliases_(aliases), text_(std::move(text)) {}

  Result<Predicate> Parse(std::set<std::string>& keys) {
    keys_ = &keys;
    ASSIGN_OR_RETURN(Predicate p, Or());
    if (at_ < tokens_.size()) {
      return FilterError(text_, "has an unexpected '" + tokens_[at_] + "'");
    }
    return p;
  }

 private:
  bool Peek(const char* word) const {
    return at_ < tokens_.size() && tokens_[at_] == word;
  }

  Result<Predicate> Or() {
    ASSIGN_OR_RETURN(Predicate left, And());
    while (Peek("OR")) {
      ++at_;
      ASSIGN_OR_RETURN(Predicate right, And());
      left = [l = left, r = right](const json& x) { return l(x) || r(x); };
    }
    return left;
  }

  Result<Predicate> And() {
    ASSIGN_OR_RETURN(Predicate left, Unary());
    while (at_ < tokens_.size() && !Peek("OR") && !Peek(")")) {
      if (Peek("AND")) ++at_;
      ASSIGN_OR_RETURN(Predicate right, Unary());
      left = [l = left, r = right](const json& x) { return l(x) && r(x); };
    }
    return left;
  }

  Result<Predicate> Unary() {
    if (at_ >= tokens_.size()) {
      return FilterError(text_, "ends where a term was expected");
    }
    std::string token = tokens_[at_];
    if (token == "NOT" || (token.size() > 1 && token[0] == '-')) {
      if (token == "NOT") {
        ++at_;
      } else {
        tokens_[at_] = token.substr(1);
      }
      ASSIGN_OR_RETURN(Predicate p, Unary());
      return Predicate([p](const json& x) { return !p(x); });
    }
    ++at_;
    if (token == "(") {
      ASSIGN_OR_RETURN(Predicate p, Or());
      if (!Peek(")")) return FilterError(text_, "has an unclosed '('");
      ++at_;
      return p;
    }
    if (token == ")" || token == "AND" || token == "OR") {
      return FilterError(text_,
                         "has '" + token + "' where a term was expected");
    }
    return TermPredicate(token, aliases_, *keys_);
  }

  std::vector<std::string> tokens_;
  const KeyAliases& aliases_;
  std::string text_;
  size_t at_ = 0;
  std::set<std::string>* keys_ = nullptr;
};

}  // namespace

Result<ResourceFilter> ParseFilter(std::string_view text,
                                   const KeyAliases& aliases) {
  ResourceFilter filter;
  if (Trim(text).empty()) {
    filter.matches = [](const json&) { return true; };
    return filter;
  }
  ASSIGN_OR_RETURN(std::vector<std::string> tokens, Tokens(text));
  FilterParser parser(std::move(tokens), aliases, std::string(text));
  ASSIGN_OR_RETURN(filter.matches, parser.Parse(filter.keys));
  return filter;
}

Status CheckFilterKeys(const ResourceFilter& filter, const json& resources,
                       const KeyAliases& aliases,
                       const std::set<std::string>& known) {
  if (resources.empty()) return OkStatus();
  for (const std::string& key : filter.keys) {
    const std::string first = key.substr(0, key.find_first_of(".["));
    if (aliases.count(key) || aliases.count(first) || known.count(first)) {
      continue;
    }
    const bool present =
        std::any_of(resources.begin(), resources.end(), [&](const json& r) {
          return r.is_object() && Member(r, first) != nullptr;
        });
    if (present) continue;
    std::set<std::string> names(known);
    for (const auto& [alias, target] : aliases) names.insert(alias);
    for (const json& r : resources) {
      for (auto it = r.begin(); r.is_object() && it != r.end(); ++it) {
        names.insert(it.key());
      }
    }
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    return InvalidArgument("--filter: unknown key '" + first +
                           "': expected one of " + list);
  }
  return OkStatus();
}

}  // namespace multislice::cli
