#include "runtime/hang_digest.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

namespace multislice::runtime {
namespace {

// One device of one reporting worker.
struct DeviceRef {
  const WorkerHangReport* worker;
  const DeviceHangState* state;
  bool operator<(const DeviceRef& o) const {
    return std::tie(worker->process, state->progress.device) <
           std::tie(o.worker->process, o.state->progress.device);
  }
};

// The devices of every report, by program.
std::map<int, std::vector<DeviceRef>> ByProgram(
    const std::vector<WorkerHangReport>& reports) {
  std::map<int, std::vector<DeviceRef>> programs;
  for (const WorkerHangReport& w : reports) {
    for (const DeviceHangState& s : w.devices) {
      programs[s.program].push_back({&w, &s});
    }
  }
  for (auto& [program, devices] : programs) {
    std::sort(devices.begin(), devices.end());
  }
  return programs;
}

const IssuedCollective* IssuedAt(const DeviceRef& d, uint64_t sequence) {
  for (const IssuedCollective& c : d.state->progress.recent) {
    if (c.sequence == sequence) return &c;
  }
  return nullptr;
}

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

// Adds a culprit once per process (the first reason wins).
void AddCulprit(HangDigest& digest, int process, const std::string& name,
                std::string reason) {
  for (const HangCulprit& c : digest.culprits) {
    if (c.process == process) return;
  }
  digest.culprits.push_back({process, name, std::move(reason)});
}

// The first position in one program's devices where the running hashes
// differ; the devices against the majority there become culprits.
bool FindMismatch(const std::vector<DeviceRef>& devices, HangDigest& digest) {
  std::set<uint64_t> positions;
  for (const DeviceRef& d : devices) {
    for (const IssuedCollective& c : d.state->progress.recent) {
      positions.insert(c.sequence);
    }
  }
  bool first_compared = true;
  for (uint64_t seq : positions) {
    // Devices by the hash they had after collective `seq`.
    std::map<uint64_t, std::vector<std::pair<DeviceRef, std::string>>> by_hash;
    for (const DeviceRef& d : devices) {
      if (const IssuedCollective* c = IssuedAt(d, seq)) {
        by_hash[c->hash].push_back({d, c->signature});
      }
    }
    size_t covered = 0;
    for (const auto& [hash, ds] : by_hash) covered += ds.size();
    if (covered < 2) continue;
    if (by_hash.size() == 1) {
      first_compared = false;
      continue;
    }
    // The majority; on a tie the group of the lowest device.
    auto majority = by_hash.begin();
    for (auto it = by_hash.begin(); it != by_hash.end(); ++it) {
      const auto& best = majority->second;
      const auto& cand = it->second;
      if (cand.size() > best.size() ||
          (cand.size() == best.size() &&
           cand.front().first < best.front().first)) {
        majority = it;
      }
    }
    ProgramMismatch m;
    m.sequence = seq;
    m.expected = majority->second.front().second;
    for (const auto& [hash, ds] : by_hash) {
      if (hash == majority->first) continue;
      if (m.issued.empty()) m.issued = ds.front().second;
      m.at_or_before |= first_compared || ds.front().second == m.expected;
      for (const auto& [d, signature] : ds) {
        AddCulprit(digest, d.worker->process, d.worker->name,
                   "device " + std::to_string(d.state->progress.device) +
                       " issued " + Quoted(signature) + " as collective #" +
                       std::to_string(seq) + " where " +
                       std::to_string(majority->second.size()) +
                       " other device(s) issued " + Quoted(m.expected));
      }
    }
    digest.mismatch = m;
    return true;
  }
  return false;
}

// Devices of one program behind the collective the furthest waiting ones
// are in: those computing before it, else those waiting in an earlier one.
void FindLaggards(const std::vector<DeviceRef>& devices, HangDigest& digest) {
  uint64_t furthest = 0, earliest = UINT64_MAX;
  for (const DeviceRef& d : devices) {
    if (const auto& p = d.state->progress.pending) {
      furthest = std::max(furthest, p->sequence);
      earliest = std::min(earliest, p->sequence);
    }
  }
  if (furthest == 0) return;  // nobody waits
  const std::string target = "collective #" + std::to_string(furthest);
  bool computing = false;
  for (const DeviceRef& d : devices) {
    const DeviceProgressSnapshot& p = d.state->progress;
    if (p.pending || p.issued >= furthest) continue;
    computing = true;
    AddCulprit(digest, d.worker->process, d.worker->name,
               "device " + std::to_string(p.device) + " has not issued " +
                   target + " that others wait in (it is computing after #" +
                   std::to_string(p.issued) + ")");
  }
  if (computing || earliest == furthest) return;
  for (const DeviceRef& d : devices) {
    const DeviceProgressSnapshot& p = d.state->progress;
    if (!p.pending || p.pending->sequence != earliest) continue;
    AddCulprit(digest, d.worker->process, d.worker->name,
               "device " + std::to_string(p.device) +
                   " waits in an earlier collective, " + p.pending->what +
                   " (" + p.pending->phase + "), than others (" + target + ")");
  }
}

// The collective most waiting devices are in.
std::string MostWaitedIn(const std::vector<WorkerHangReport>& reports) {
  std::map<std::string, int> count;
  for (const WorkerHangReport& w : reports) {
    for (const DeviceHangState& s : w.devices) {
      if (s.progress.pending) ++count[s.progress.pending->what];
    }
  }
  std::string best;
  int most = 0;
  for (const auto& [what, n] : count) {
    if (n > most) best = what, most = n;
  }
  return best;
}

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

}  // namespace

HangDigest AnalyzeHang(const std::vector<WorkerHangReport>& reports,
                       const std::vector<int>& expected,
                       const std::vector<std::string>& names,
                       double threshold_seconds, double grace_seconds) {
  HangDigest digest;
  digest.threshold_seconds = threshold_seconds;
  digest.workers = reports;
  std::sort(digest.workers.begin(), digest.workers.end(),
            [](const auto& a, const auto& b) { return a.process < b.process; });
  std::set<int> reported;
  for (const WorkerHangReport& w : reports) reported.insert(w.process);
  for (int p : expected) {
    if (reported.count(p)) continue;
    digest.silent.push_back(p);
    const std::string name = p >= 0 && p < static_cast<int>(names.size())
                                 ? names[p]
                                 : "process " + std::to_string(p);
    AddCulprit(digest, p, name,
               "did not report within " + Seconds(grace_seconds) +
                   " (stopped, hung outside its collectives, or unreachable)");
  }
  digest.waited_in = MostWaitedIn(digest.workers);
  const auto programs = ByProgram(digest.workers);
  bool mismatch = false;
  for (const auto& [program, devices] : programs) {
    mismatch = mismatch || FindMismatch(devices, digest);
  }
  digest.cause = mismatch ? "program mismatch" : "hang";
  if (digest.culprits.empty()) {
    for (const auto& [program, devices] : programs) {
      FindLaggards(devices, digest);
    }
  }
  return digest;
}

namespace {

nlohmann::json ToJson(const DeviceHangState& s) {
  const DeviceProgressSnapshot& p = s.progress;
  nlohmann::json recent = nlohmann::json::array();
  for (const IssuedCollective& c : p.recent) {
    // The hash as a string: JSON numbers above 2^53 do not survive every
    // reader.
    recent.push_back({{"sequence", c.sequence},
                      {"signature", c.signature},
                      {"hash", std::to_string(c.hash)}});
  }
  nlohmann::json j = {{"device", p.device},
                      {"program", s.program},
                      {"issued", p.issued},
                      {"hash", std::to_string(p.hash)},
                      {"recent", recent}};
  if (p.pending) {
    j["pending"] = {{"sequence", p.pending->sequence},
                    {"collective", p.pending->what},
                    {"phase", p.pending->phase},
                    {"seconds", p.pending->seconds}};
  }
  return j;
}

uint64_t HashField(const nlohmann::json& j, const char* key) {
  return std::stoull(j.at(key).get<std::string>());
}

DeviceHangState ParseDevice(const nlohmann::json& j) {
  DeviceHangState s;
  DeviceProgressSnapshot& p = s.progress;
  p.device = j.at("device").get<int>();
  s.program = j.at("program").get<int>();
  p.issued = j.at("issued").get<uint64_t>();
  p.hash = HashField(j, "hash");
  for (const nlohmann::json& c : j.at("recent")) {
    p.recent.push_back({c.at("sequence").get<uint64_t>(),
                        c.at("signature").get<std::string>(),
                        HashField(c, "hash")});
  }
  if (j.contains("pending")) {
    const nlohmann::json& q = j.at("pending");
    p.pending = PendingCollective{
        q.at("sequence").get<uint64_t>(), q.at("collective").get<std::string>(),
        q.at("phase").get<std::string>(), q.at("seconds").get<double>()};
  }
  return s;
}

// "device 0: waits in X (phase P) for 5.1 s" or "device 0: computing after
// #12 Y".
std::string DescribeDevice(const DeviceHangState& s) {
  const DeviceProgressSnapshot& p = s.progress;
  std::string line = "device " + std::to_string(p.device) + ": ";
  if (p.pending) {
    return line + "waits in " + p.pending->what + " (" + p.pending->phase +
           ") for " + Seconds(p.pending->seconds);
  }
  line += "computing after collective #" + std::to_string(p.issued);
  if (!p.recent.empty()) line += " " + Quoted(p.recent.back().signature);
  return line;
}

}  // namespace

nlohmann::json ToJson(const WorkerHangReport& report) {
  nlohmann::json devices = nlohmann::json::array();
  for (const DeviceHangState& s : report.devices) devices.push_back(ToJson(s));
  return {{"process", report.process},
          {"name", report.name},
          {"host", report.host},
          {"devices", devices}};
}

Result<WorkerHangReport> ParseWorkerHangReport(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    WorkerHangReport r;
    r.process = j.at("process").get<int>();
    r.name = j.at("name").get<std::string>();
    r.host = j.at("host").get<std::string>();
    for (const nlohmann::json& d : j.at("devices")) {
      r.devices.push_back(ParseDevice(d));
    }
    return r;
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("hang report is not one: ") + e.what());
  }
}

nlohmann::json ToJson(const HangDigest& digest) {
  nlohmann::json culprits = nlohmann::json::array();
  for (const HangCulprit& c : digest.culprits) {
    culprits.push_back(
        {{"process", c.process}, {"worker", c.name}, {"reason", c.reason}});
  }
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerHangReport& w : digest.workers) workers.push_back(ToJson(w));
  nlohmann::json j = {{"cause", digest.cause},
                      {"threshold_seconds", digest.threshold_seconds},
                      {"culprits", culprits},
                      {"waited_in", digest.waited_in},
                      {"silent", digest.silent},
                      {"workers", workers},
                      {"file", digest.file}};
  if (digest.mismatch) {
    j["mismatch"] = {{"sequence", digest.mismatch->sequence},
                     {"expected", digest.mismatch->expected},
                     {"issued", digest.mismatch->issued},
                     {"at_or_before", digest.mismatch->at_or_before}};
  }
  return j;
}

Result<HangDigest> ParseHangDigest(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    HangDigest d;
    d.cause = j.at("cause").get<std::string>();
    d.threshold_seconds = j.at("threshold_seconds").get<double>();
    for (const nlohmann::json& c : j.at("culprits")) {
      d.culprits.push_back({c.at("process").get<int>(),
                            c.at("worker").get<std::string>(),
                            c.at("reason").get<std::string>()});
    }
    d.waited_in = j.at("waited_in").get<std::string>();
    d.silent = j.at("silent").get<std::vector<int>>();
    for (const nlohmann::json& w : j.at("workers")) {
      ASSIGN_OR_RETURN(WorkerHangReport r, ParseWorkerHangReport(w.dump()));
      d.workers.push_back(std::move(r));
    }
    d.file = j.at("file").get<std::string>();
    if (j.contains("mismatch")) {
      const nlohmann::json& m = j.at("mismatch");
      d.mismatch = ProgramMismatch{
          m.at("sequence").get<uint64_t>(), m.at("expected").get<std::string>(),
          m.at("issued").get<std::string>(), m.at("at_or_before").get<bool>()};
    }
    return d;
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("hang digest is not one: ") + e.what());
  }
}

std::string FormatHangDigest(const HangDigest& digest) {
  std::string text = "hang digest: ";
  if (digest.mismatch) {
    const ProgramMismatch& m = *digest.mismatch;
    text += "program mismatch: the first differing collective is #" +
            std::to_string(m.sequence) + (m.at_or_before ? " or earlier" : "") +
            ", " + Quoted(m.issued) + " against " + Quoted(m.expected);
  } else {
    text +=
        "no collective finished within " + Seconds(digest.threshold_seconds);
    if (!digest.waited_in.empty())
      text += "; most devices wait in " + digest.waited_in;
  }
  text += "\n";
  if (digest.culprits.empty()) {
    text +=
        "  no culprit found among the workers: every device waits in "
        "the same collective\n";
  }
  for (const HangCulprit& c : digest.culprits) {
    text += "  culprit: " + c.name + " (process " + std::to_string(c.process) +
            "): " + c.reason + "\n";
  }
  for (const WorkerHangReport& w : digest.workers) {
    for (const DeviceHangState& s : w.devices) {
      text += "  " + w.name + " on " + w.host + ", " + DescribeDevice(s) + "\n";
    }
  }
  if (!digest.file.empty()) text += "  digest: " + digest.file + "\n";
  return text;
}

}  // namespace multislice::runtime
