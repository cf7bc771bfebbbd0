// gcloud's --format and --filter for the commands that list or describe
// resources (`queued-resources list|describe`, `tpu-vm list|describe`), so
// that the lines users paste from Cloud TPU documents behave as they do with
// `gcloud compute tpus` (gcloud topic formats / filters / projections).
//
// Formats: yaml (describe's default: keys sorted, list items at their key's
// indentation, multi-line strings as `|` blocks, strings quoted when YAML
// would read them as something else), json, table (list's default), value,
// csv, flattened and none, each with an optional projection
// `NAME(KEY[:label=HEADING], ...)` and the attribute `[no-heading]`. A KEY
// is a dotted path (`state.state`, `tpu.nodeSpec[0].node.acceleratorType`,
// `nodes.nodeId` maps over a list) optionally ending in a transform:
// `basename()`, `segment(I)` (the I-th '/'-separated part, negative from
// the end), `len()`. A key that is not found is also tried in camelCase
// (`accelerator_type` -> `acceleratorType`) and then case-insensitively.
// Aliases (`zone` -> `name.segment(3)`) are the command's short names.
//
// Filters: terms `KEY=VALUE`, `KEY!=VALUE`, `KEY:PATTERN`, `KEY~REGEX`,
// `KEY!~REGEX` and bare words (gcloud's global restriction: the word
// appears in any value of the resource), joined by spaces or AND, OR, NOT
// (or a leading '-'), with parentheses and "quoted values". `:` and bare
// words match case-insensitively, as substrings, or as globs when the
// pattern has `*` (`KEY:*`: the key is present and not empty); `=` is
// exact (a glob with `*`), and a value with '/' (a resource name) also
// equals its last segment, so `name=my-qr` finds
// projects/p/locations/z/queuedResources/my-qr.
//
// Thread-safety: every function is pure.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace multislice::cli {

// Short key names a command offers, e.g. {"zone", "name.segment(3)"}.
using KeyAliases = std::map<std::string, std::string>;

// One column of a projection.
struct FormatColumn {
  std::string key;    // as written, e.g. "name.basename()"
  std::string label;  // the heading given with :label=, else empty
};

struct OutputFormat {
  enum class Kind { kYaml, kJson, kTable, kValue, kCsv, kFlattened, kNone };
  Kind kind = Kind::kYaml;
  std::vector<FormatColumn> columns;  // empty: no projection
  bool no_heading = false;
};

// Parses a --format value such as "yaml", "json", "table(name, state)",
// "value(name.basename())", "csv[no-heading](name,zone)". A table, value or
// csv without a projection takes the columns of `default_format` (the
// command's own table). InvalidArgument naming --format on anything else.
Result<OutputFormat> ParseFormat(std::string_view text,
                                 std::string_view default_format = "");

// The value of `key` (a projection key, see above) in `resource`; null
// when absent.
nlohmann::json ValueOfKey(const nlohmann::json& resource, std::string_view key,
                          const KeyAliases& aliases);

// The heading gcloud derives for a column: its label, else the last name
// of its key in upper snake case (acceleratorType -> ACCELERATOR_TYPE).
std::string ColumnHeading(const FormatColumn& column);

// `resource` as gcloud's yaml printer writes it (ends with a newline).
std::string ToYaml(const nlohmann::json& resource);

// A list command's output: `resources` (an array) in `format`. Empty for an
// empty list (gcloud prints nothing then).
std::string FormatList(const OutputFormat& format,
                       const nlohmann::json& resources,
                       const KeyAliases& aliases);

// A describe command's output: one resource in `format`.
std::string FormatOne(const OutputFormat& format,
                      const nlohmann::json& resource,
                      const KeyAliases& aliases);

// A parsed --filter.
struct ResourceFilter {
  std::function<bool(const nlohmann::json&)> matches;
  std::set<std::string> keys;  // the keys its terms name (not bare words)
};

// Parses a --filter expression (see above); the empty text matches all.
// InvalidArgument naming --filter, the term and what was expected.
Result<ResourceFilter> ParseFilter(std::string_view text,
                                   const KeyAliases& aliases);

// InvalidArgument naming the first key of `filter` that is neither an
// alias, nor in `known`, nor a top-level field of any of `resources` (an
// array): a misspelt key would otherwise silently match nothing.
Status CheckFilterKeys(const ResourceFilter& filter,
                       const nlohmann::json& resources,
                       const KeyAliases& aliases,
                       const std::set<std::string>& known);

}  // namespace multislice::cli
