// Internal to the gcloud format and filter units (gcloud_format.cc,
// gcloud_filter.cc): resource key paths (`a.b[0].c`, a trailing
// `basename()`, `segment(I)` or `len()`), their resolution in a JSON
// resource, and the text of a value in a table cell. See gcloud_format.h
// for the rules users see.
//
// Thread-safety: every function is pure.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cli/gcloud_format.h"
#include "common/status.h"

namespace multislice::cli::gcloud_keys {

struct Segment {
  std::string name;          // empty: the indices apply to the value itself
  std::vector<int> indices;  // [i] after the name; negative from the end
};

struct Key {
  std::vector<Segment> segments;
  std::string transform;  // "", "basename", "segment", "len"
  int argument = -1;      // segment's index
};

// `text` (after replacing an alias) as a key; InvalidArgument saying why
// not (without a flag name: the caller adds it).
Result<Key> ParseKey(std::string_view text, const KeyAliases& aliases);
// The value of `key` in `resource`; null when absent.
nlohmann::json Resolve(const nlohmann::json& resource, const Key& key);
// The member `name` of `object`: exact, else in camelCase, else ignoring
// case; nullptr when none.
const nlohmann::json* Member(const nlohmann::json& object,
                             const std::string& name);
// A value as a table cell: strings as they are, True/False, numbers, list
// items joined by `list_separator`, objects as JSON.
std::string Cell(const nlohmann::json& value, const char* list_separator);

std::string Lower(std::string_view text);
std::string Trim(std::string_view text);
// `text` without one pair of enclosing quotes (" or ').
std::string Unquote(const std::string& text);

}  // namespace multislice::cli::gcloud_keys
