// Which nodes and workers `queued-resources ssh` runs on: the values of its
// --node and --worker flags.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace multislice::control {

// The largest index a selection may name (a queued resource has at most 256
// nodes, a node at most a few thousand workers).
inline constexpr int kMaxSelectionIndex = 65535;

struct Selection {
  bool all = false;
  std::vector<int> indices;  // sorted, without duplicates; empty when all

  bool Contains(int index) const;
};

// Parses "all", "i", "i,j,...", "a-b" and combinations such as "0,2-3"
// (whitespace is not allowed). `flag` names the flag in errors, e.g.
// "--node: 'x' is not all, an index (3), a list (0,2) or a range (1-3)".
// Indices are 0..kMaxSelectionIndex and a range needs a <= b.
Result<Selection> ParseSelection(std::string_view text, std::string_view flag);

}  // namespace multislice::control
