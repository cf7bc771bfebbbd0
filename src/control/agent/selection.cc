#include "control/agent/selection.h"

#include <algorithm>
#include <charconv>

namespace multislice::control {
namespace {

// A whole decimal index 0..kMaxSelectionIndex, or -1.
int ParseIndex(std::string_view text) {
  if (text.empty() || text.size() > 5) return -1;
  int value = 0;
  auto [end, ec] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return -1;
  if (value < 0 || value > kMaxSelectionIndex) return -1;
  return value;
}

}  // namespace

bool Selection::Contains(int index) const {
  return all || std::binary_search(indices.begin(), indices.end(), index);
}

Result<Selection> ParseSelection(std::string_view text, std::string_view flag) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(std::string(flag) + ": '" + std::string(text) +
                           "' " + why);
  };
  const std::string expected =
      "is not all, an index (3), a list (0,2) or a range (1-3) of indices "
      "from 0 to " +
      std::to_string(kMaxSelectionIndex);
  Selection selection;
  if (text == "all") {
    selection.all = true;
    return selection;
  }
  if (text.empty()) return bad(expected);
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(start, comma - start);
    size_t dash = item.find('-');
    if (dash == std::string_view::npos) {
      int index = ParseIndex(item);
      if (index < 0) return bad(expected);
      selection.indices.push_back(index);
    } else {
      int first = ParseIndex(item.substr(0, dash));
      int last = ParseIndex(item.substr(dash + 1));
      if (first < 0 || last < 0) return bad(expected);
      if (first > last) {
        return bad("is not a range: " + std::to_string(first) +
                   " is greater than " + std::to_string(last));
      }
      for (int i = first; i <= last; ++i) selection.indices.push_back(i);
    }
    start = comma + 1;
  }
  std::sort(selection.indices.begin(), selection.indices.end());
  selection.indices.erase(
      std::unique(selection.indices.begin(), selection.indices.end()),
      selection.indices.end());
  return selection;
}

}  // namespace multislice::control
