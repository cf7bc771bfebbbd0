#include "runtime/membership.h"

#include <algorithm>
#include <exception>
#include <string>
#include <thread>

namespace multislice::runtime {
namespace {

std::string GoneKey(int process) { return "gone/" + std::to_string(process); }
std::string AliveKey(int generation, int process) {
  return "members/" + std::to_string(generation) + "/alive/" +
         std::to_string(process);
}

// Whether `key` is in the store now (a wait of a millisecond).
bool Has(gloo::rendezvous::Store& store, const std::string& key) {
  try {
    store.wait({key}, std::chrono::milliseconds(1));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::string List(const std::vector<int>& v) {
  std::string out;
  for (int p : v) out += (out.empty() ? "" : ", ") + std::to_string(p);
  return out;
}

}  // namespace

void RecordGone(gloo::rendezvous::Store& store, int process) {
  try {
    store.set(GoneKey(process), {'1'});
  } catch (const std::exception&) {
  }
}

Result<std::vector<int>> AgreeOnGone(gloo::rendezvous::Store& store,
                                     int generation, int me,
                                     const std::vector<int>& members,
                                     std::chrono::milliseconds timeout) {
  try {
    store.set(AliveKey(generation, me), {'1'});
  } catch (const std::exception& e) {
    return Unavailable(std::string("recording this process alive: ") +
                       e.what());
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> gone, open = members;
  for (;;) {
    if (Has(store, GoneKey(me))) {
      return FailedPrecondition("this process was reported gone");
    }
    std::vector<int> still;
    for (int p : open) {
      if (Has(store, GoneKey(p))) {
        gone.push_back(p);
      } else if (!Has(store, AliveKey(generation, p))) {
        still.push_back(p);
      }
    }
    open = std::move(still);
    if (open.empty()) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceeded("processes " + List(open) +
                              " neither recorded themselves alive nor were "
                              "reported gone within " +
                              std::to_string(timeout.count() / 1000) +
                              " s after a peer was lost");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::sort(gone.begin(), gone.end());
  return gone;
}

}  // namespace multislice::runtime
