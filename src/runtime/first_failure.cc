#include "runtime/first_failure.h"

#include <charconv>
#include <exception>
#include <set>
#include <vector>

namespace multislice::runtime {
namespace {

std::string Key(int process) { return "lost/" + std::to_string(process); }

}  // namespace

std::optional<int> FirstFailure(int me, int lost, int process_count,
                                const LostRecord& record_of,
                                std::chrono::milliseconds wait) {
  std::set<int> seen = {me};
  int at = lost;
  for (int hops = 0; hops < process_count; ++hops) {
    if (!seen.insert(at).second) return std::nullopt;
    std::optional<int> next = record_of(at, wait);
    if (!next.has_value()) return at;
    if (*next < 0 || *next >= process_count) return at;
    at = *next;
  }
  return std::nullopt;
}

void RecordLost(gloo::rendezvous::Store& store, int me, int lost) {
  const std::string value = std::to_string(lost);
  try {
    store.set(Key(me), std::vector<char>(value.begin(), value.end()));
  } catch (const std::exception&) {
    // The store is gone too: the peers name whom they lost themselves.
  }
}

LostRecord StoreLostRecords(gloo::rendezvous::Store& store) {
  return [&store](int process,
                  std::chrono::milliseconds wait) -> std::optional<int> {
    try {
      store.wait({Key(process)}, wait);
      const std::vector<char> data = store.get(Key(process));
      int value = -1;
      auto [end, error] =
          std::from_chars(data.data(), data.data() + data.size(), value);
      if (error != std::errc() || end != data.data() + data.size()) {
        return std::nullopt;
      }
      return value;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
}

}  // namespace multislice::runtime
