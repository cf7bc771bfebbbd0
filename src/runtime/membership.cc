#include "runtime/membership.h"

#include <algorithm>
#include <exception>
#include <sstream>
#include <string>
#include <thread>

namespace multislice::runtime {
namespace {

std::string GoneKey(int process, int incarnation) {
  return "gone/" + std::to_string(process) +
         (incarnation > 0 ? "." + std::to_string(incarnation) : "");
}
std::string StartKey(const char* kind, int process, int incarnation) {
  return std::string(kind) + "/" + std::to_string(process) + "." +
         std::to_string(incarnation);
}
constexpr const char* kClosedKey = "admissions-closed";
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

std::string List(const std::vector<int>& v, const char* separator = ", ") {
  std::string out;
  for (int p : v) out += (out.empty() ? "" : separator) + std::to_string(p);
  return out;
}

}  // namespace

void RecordGone(gloo::rendezvous::Store& store, int process, int incarnation) {
  try {
    store.set(GoneKey(process, incarnation), {'1'});
  } catch (const std::exception&) {
  }
}

Result<std::vector<int>> AgreeOnGone(gloo::rendezvous::Store& store,
                                     int generation, int me,
                                     const std::vector<int>& members,
                                     const std::vector<int>& incarnations,
                                     std::chrono::milliseconds timeout) {
  auto gone_key = [&](int p) {
    return GoneKey(
        p, p < static_cast<int>(incarnations.size()) ? incarnations[p] : 0);
  };
  try {
    store.set(AliveKey(generation, me), {'1'});
  } catch (const std::exception& e) {
    return Unavailable(std::string("recording this process alive: ") +
                       e.what());
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> gone, open = members;
  for (;;) {
    if (Has(store, gone_key(me))) {
      return FailedPrecondition("this process was reported gone");
    }
    std::vector<int> still;
    for (int p : open) {
      if (Has(store, gone_key(p))) {
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

std::string FormatAdmission(const Admission& a) {
  return std::to_string(a.generation) + " " + std::to_string(a.step) + " " +
         List(a.members, ",") + " " + List(a.incarnations, ",");
}

Result<Admission> ParseAdmission(const std::string& text, int process_count) {
  auto bad = [&](const std::string& what) {
    return InvalidArgument("admission record '" + text + "': " + what);
  };
  std::istringstream in(text);
  Admission a;
  std::string members, incarnations, extra;
  if (!(in >> a.generation >> a.step >> members >> incarnations) ||
      (in >> extra)) {
    return bad("expected 'generation step members incarnations'");
  }
  if (a.generation < 1 || a.step < 0) {
    return bad("generation must be at least 1 and step at least 0");
  }
  auto numbers = [](const std::string& csv, std::vector<int>& out) {
    std::istringstream items(csv);
    for (std::string item; std::getline(items, item, ',');) {
      if (item.empty() || item.size() > 9 ||
          item.find_first_not_of("0123456789") != std::string::npos) {
        return false;
      }
      out.push_back(std::stoi(item));
    }
    return true;
  };
  if (!numbers(members, a.members) || !numbers(incarnations, a.incarnations)) {
    return bad("members and incarnations must be comma-separated numbers");
  }
  if (static_cast<int>(a.incarnations.size()) != process_count) {
    return bad("expected " + std::to_string(process_count) + " incarnations");
  }
  for (size_t i = 0; i < a.members.size(); ++i) {
    if (a.members[i] >= process_count ||
        (i > 0 && a.members[i] <= a.members[i - 1])) {
      return bad("members must increase and be below " +
                 std::to_string(process_count));
    }
  }
  return a;
}

Status RequestRejoin(gloo::rendezvous::Store& store, int process,
                     int incarnation) {
  try {
    store.set(StartKey("rejoin", process, incarnation), {'1'});
  } catch (const std::exception& e) {
    return Unavailable(std::string("asking to rejoin: ") + e.what());
  }
  return OkStatus();
}

bool RejoinRequested(gloo::rendezvous::Store& store, int process,
                     int incarnation) {
  return Has(store, StartKey("rejoin", process, incarnation));
}

Status RecordAdmission(gloo::rendezvous::Store& store, int process,
                       int incarnation, const Admission& admission) {
  const std::string text = FormatAdmission(admission);
  try {
    store.set(StartKey("admitted", process, incarnation),
              std::vector<char>(text.begin(), text.end()));
  } catch (const std::exception& e) {
    return Unavailable(std::string("recording an admission: ") + e.what());
  }
  return OkStatus();
}

void CloseAdmissions(gloo::rendezvous::Store& store) {
  try {
    store.set(kClosedKey, {'1'});
  } catch (const std::exception&) {
  }
}

Result<std::optional<Admission>> WaitForAdmission(
    gloo::rendezvous::Store& store, int process, int incarnation,
    int process_count, std::chrono::milliseconds timeout) {
  const std::string key = StartKey("admitted", process, incarnation);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (Has(store, key)) {
      std::vector<char> value;
      try {
        value = store.get(key);
      } catch (const std::exception& e) {
        return Unavailable(std::string("reading the admission: ") + e.what());
      }
      ASSIGN_OR_RETURN(Admission a,
                       ParseAdmission(std::string(value.begin(), value.end()),
                                      process_count));
      return std::optional<Admission>(a);
    }
    if (Has(store, kClosedKey)) return std::optional<Admission>();
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceeded(
          "the running slices did not admit this worker "
          "within " +
          std::to_string(timeout.count() / 1000) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace multislice::runtime
