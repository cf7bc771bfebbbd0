#include "runtime/hang_watch.h"

#include <gloo/common/error.h>
#include <pthread.h>

#include <algorithm>
#include <filesystem>

#include "runtime/json_file.h"

namespace multislice::runtime {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kAlarm[] = "hang/alarm";
constexpr char kDigest[] = "hang/digest";

std::string ReportKey(int process) {
  return "hang/report/" + std::to_string(process);
}

// Whether `key` is in the store, without waiting.
bool Present(gloo::rendezvous::Store& store, const std::string& key) {
  try {
    store.wait({key}, std::chrono::milliseconds(1));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::vector<char> Bytes(const std::string& text) {
  return std::vector<char>(text.begin(), text.end());
}

// A set that may race with another worker's (redis refuses a second one).
void SetOnce(gloo::rendezvous::Store& store, const std::string& key,
             const std::string& value) {
  try {
    store.set(key, Bytes(value));
  } catch (const std::exception&) {
  }
}

std::string Get(gloo::rendezvous::Store& store, const std::string& key) {
  try {
    const std::vector<char> bytes = store.get(key);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace

HangWatch::HangWatch(HangWatchOptions options)
    : options_(std::move(options)), thread_([this] { Loop(); }) {}

HangWatch::~HangWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HangWatch::Arm(std::chrono::milliseconds threshold,
                    const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  threshold_ = threshold;
  path_ = path;
}

std::chrono::milliseconds HangWatch::threshold() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threshold_;
}

void HangWatch::Loop() {
  pthread_setname_np(pthread_self(), "hang-watch");
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, options_.poll, [&] { return stop_; })) {
    const std::chrono::milliseconds threshold = threshold_;
    if (threshold.count() <= 0) continue;
    lock.unlock();
    const bool stuck = options_.oldest_pending() > threshold;
    if (stuck || AlarmRaised()) {
      RunRound(stuck);
      return;
    }
    lock.lock();
  }
}

bool HangWatch::AlarmRaised() { return Present(*options_.store, kAlarm); }

void HangWatch::RunRound(bool raise_alarm) {
  round_started_ = true;
  gloo::rendezvous::Store& store = *options_.store;
  if (raise_alarm) SetOnce(store, kAlarm, std::to_string(options_.process));
  SetOnce(store, ReportKey(options_.process), ToJson(options_.report()).dump());
  const std::vector<int> live = options_.live();
  const Clock::time_point end = Clock::now() + options_.grace;
  std::vector<WorkerHangReport> reports = CollectReports(live, end);
  options_.on_digest(DigestOf(reports, live));
}

// Waits until every live process reported or `end`, then reads the reports
// there are (an unreadable one counts as missing).
std::vector<WorkerHangReport> HangWatch::CollectReports(
    const std::vector<int>& live, Clock::time_point end) {
  gloo::rendezvous::Store& store = *options_.store;
  std::vector<std::string> keys;
  for (int p : live) keys.push_back(ReportKey(p));
  while (Clock::now() < end) {
    try {
      store.wait(keys, std::chrono::milliseconds(1));
      break;
    } catch (const std::exception&) {
      std::this_thread::sleep_for(options_.poll / 4);
    }
  }
  std::vector<WorkerHangReport> reports;
  for (int p : live) {
    if (!Present(store, ReportKey(p))) continue;
    Result<WorkerHangReport> r =
        ParseWorkerHangReport(Get(store, ReportKey(p)));
    if (r.ok()) reports.push_back(std::move(*r));
  }
  return reports;
}

// The lowest worker that reported analyses and writes; the others take its
// digest, or analyse on their own when it does not come within the grace.
HangDigest HangWatch::DigestOf(const std::vector<WorkerHangReport>& reports,
                               const std::vector<int>& live) {
  gloo::rendezvous::Store& store = *options_.store;
  const double threshold = threshold_.count() / 1000.0;
  const double grace = options_.grace.count() / 1000.0;
  HangDigest own = AnalyzeHang(reports, live, options_.names, threshold, grace);
  int writer = options_.process;
  for (const WorkerHangReport& r : reports)
    writer = std::min(writer, r.process);
  if (writer != options_.process) {
    const Clock::time_point end = Clock::now() + options_.grace;
    while (Clock::now() < end && !Present(store, kDigest)) {
      std::this_thread::sleep_for(options_.poll / 4);
    }
    // The writer's digest, when it came: its reports are those everyone's
    // lines then name.
    if (Present(store, kDigest)) {
      Result<HangDigest> theirs = ParseHangDigest(Get(store, kDigest));
      if (theirs.ok()) return *theirs;
    }
    return own;
  }
  std::string file;
  {
    std::lock_guard<std::mutex> lock(mu_);
    file = path_;
  }
  if (!file.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(
        std::filesystem::path(file).parent_path(), ec);
    own.file = file;
    if (!WriteJsonFile(file, ToJson(own), "hang digest").ok()) own.file = "";
  }
  SetOnce(store, kDigest, ToJson(own).dump());
  return own;
}

}  // namespace multislice::runtime
