// "Did you mean": the known name closest to a mistyped one.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace multislice {

// Levenshtein distance between `a` and `b`.
inline size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The name of `known` closest to `word` when it is close enough to be a
// slip (at most a third of its length away, and 3 edits; the first of
// equals); empty otherwise.
inline std::string ClosestName(std::string_view word,
                               const std::vector<std::string>& known) {
  std::string best;
  size_t best_distance = std::min<size_t>(3, word.size() / 3 + 1);
  for (const std::string& name : known) {
    const size_t d = EditDistance(word, name);
    if (d < best_distance || (d == best_distance && best.empty())) {
      best = name;
      best_distance = d;
    }
  }
  return best;
}

}  // namespace multislice
