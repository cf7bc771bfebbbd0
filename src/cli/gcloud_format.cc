// gcloud's --format (see gcloud_format.h): the yaml printer, the format
// parser and the list and describe printers. Key paths are gcloud_keys.h's,
// filters gcloud_filter.cc's.
#include "cli/gcloud_format.h"

#include <algorithm>
#include <cctype>
#include <regex>

#include "cli/gcloud_keys.h"

namespace multislice::cli {

using gcloud_keys::Cell;
using gcloud_keys::Key;
using gcloud_keys::ParseKey;
using gcloud_keys::Resolve;
using gcloud_keys::Trim;
using gcloud_keys::Unquote;
using nlohmann::json;

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

namespace {

// The cells of a table (headings from ColumnHeading) or csv (headings the
// keys as written), the heading row first unless [no-heading].
Rows RowsWithHeading(const OutputFormat& format, const json& resources,
                     const KeyAliases& aliases, bool csv) {
  Rows rows = CellRows(format, resources, aliases, csv ? ";" : ",");
  if (format.no_heading) return rows;
  std::vector<std::string> heading;
  for (const FormatColumn& c : format.columns) {
    heading.push_back(csv ? (c.label.empty() ? c.key : c.label)
                          : ColumnHeading(c));
  }
  rows.insert(rows.begin(), heading);
  return rows;
}

std::string JoinedRows(const Rows& rows, const char* separator, bool csv) {
  std::string out;
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      out += (i ? separator : "") + (csv ? CsvField(row[i]) : row[i]);
    }
    out += "\n";
  }
  return out;
}

// One document per resource, each after "---", as gcloud lists them.
std::string Documents(const OutputFormat& format, const json& resources,
                      const KeyAliases& aliases,
                      std::string (*print)(const json&)) {
  std::string out;
  for (const json& r : resources) {
    out += "---\n" + print(Projected(format, r, aliases));
  }
  return out;
}

}  // namespace

std::string FormatList(const OutputFormat& format, const json& resources,
                       const KeyAliases& aliases) {
  using K = OutputFormat::Kind;
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
      return Documents(format, resources, aliases, ToYaml);
    case K::kFlattened:
      return Documents(format, resources, aliases, Flattened);
    case K::kTable:
      if (resources.empty()) return "";
      return Table(RowsWithHeading(format, resources, aliases, false));
    case K::kValue:
      return JoinedRows(CellRows(format, resources, aliases, ";"), "\t", false);
    case K::kCsv:
      if (resources.empty()) return "";
      return JoinedRows(RowsWithHeading(format, resources, aliases, true), ",",
                        true);
  }
  return "";
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

}  // namespace multislice::cli
