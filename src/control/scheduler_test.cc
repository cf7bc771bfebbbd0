// Property test of the gang scheduler: random sequences of requests,
// deletions, host failures and recoveries, checked after every step against
// rules written out independently here.
#include "control/scheduler.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace multislice::control {
namespace {

TEST(HostFitsTest, FamilyAndCpuSize) {
  EXPECT_TRUE(HostFits("cpu-2", "cpu-2"));
  EXPECT_FALSE(HostFits("cpu-2", "cpu-4"));
  EXPECT_TRUE(HostFits("v4-8", "v4-16"));
  EXPECT_TRUE(HostFits("v4", "v4-16"));
  EXPECT_FALSE(HostFits("v5p-8", "v4-16"));
  EXPECT_FALSE(HostFits("cpu-2", "v4-8"));
  EXPECT_FALSE(HostFits("cpu", "cpu-2"));
  EXPECT_FALSE(HostFits("cpu-2", "bogus"));
}

TEST(ScheduleTest, AllOrNothingAndFifo) {
  SchedulerInput in;
  in.free_hosts = {
      {"h1", "cpu-2", ""}, {"h2", "cpu-2", ""}, {"h3", "cpu-2", ""}};
  in.requests = {{"big", 1, Tier::kOnDemand, "cpu-2", 1, 2, 4, false, ""},
                 {"small", 2, Tier::kOnDemand, "cpu-2", 1, 2, 1, false, ""},
                 {"spot", 3, Tier::kSpot, "cpu-2", 1, 2, 2, false, ""}};
  SchedulerDecision d = Schedule(in);
  // "big" needs 4 hosts: nothing for it, and "small" waits behind it (FIFO);
  // the spot tier is not blocked by on-demand.
  ASSERT_EQ(d.grants.size(), 1u);
  EXPECT_EQ(d.grants[0].name, "spot");
  EXPECT_EQ(d.grants[0].slice_hosts.size(), 2u);
  // A request of another type does not wait behind "big".
  in.requests.push_back({"v4", 4, Tier::kOnDemand, "v4-8", 1, 4, 1, false, ""});
  in.free_hosts.push_back({"h4", "v4-8", ""});
  d = Schedule(in);
  ASSERT_EQ(d.grants.size(), 2u);
  EXPECT_EQ(d.grants[0].name, "v4");
}

TEST(ScheduleTest, ReservedPreemptsSpotBeforeBestEffort) {
  SchedulerInput in;
  in.holders = {
      {"be", 1, Tier::kBestEffort, "cpu-2", 2, true, true, false, {"h1"}, ""},
      {"spot-old", 2, Tier::kSpot, "cpu-2", 2, true, true, false, {"h2"}, ""},
      {"spot-new", 3, Tier::kSpot, "cpu-2", 2, true, true, false, {"h3"}, ""}};
  in.requests = {{"res", 4, Tier::kReserved, "cpu-2", 1, 2, 1, false, ""}};
  SchedulerDecision d = Schedule(in);
  EXPECT_TRUE(d.grants.empty());
  ASSERT_EQ(d.preempted.size(), 1u);
  EXPECT_EQ(d.preempted[0], "spot-new");
  in.requests[0].slices = 3;
  d = Schedule(in);
  std::set<std::string> p(d.preempted.begin(), d.preempted.end());
  EXPECT_EQ(p, (std::set<std::string>{"be", "spot-old", "spot-new"}));
  in.requests[0].slices = 4;  // cannot fit even by preempting all
  EXPECT_TRUE(Schedule(in).preempted.empty());
  in.requests[0].tier = Tier::kOnDemand;  // only reserved preempts
  in.requests[0].slices = 1;
  EXPECT_TRUE(Schedule(in).preempted.empty());
}

TEST(ScheduleTest, QuotaCountsFailedAndSuspended) {
  SchedulerInput in;
  in.free_hosts = {{"h1", "cpu-2", ""}, {"h2", "cpu-2", ""}};
  in.quota_chips[static_cast<int>(Tier::kOnDemand)] = 4;
  in.holders = {
      {"failed", 1, Tier::kOnDemand, "cpu-2", 2, true, false, false, {}, ""}};
  in.requests = {{"r", 2, Tier::kOnDemand, "cpu-2", 1, 2, 2, false, ""}};
  EXPECT_TRUE(Schedule(in).grants.empty());  // 2 held + 4 > 4
  in.holders.clear();
  EXPECT_EQ(Schedule(in).grants.size(), 1u);
}

// The model of the property test: queued resources with their hosts.
struct ModelQr {
  std::string name;
  int64_t seq;
  Tier tier;
  std::string type;
  std::string zone;
  int slices;
  int chips_per_slice;
  enum { kWaiting, kRunning, kSuspending, kSuspended } state = kWaiting;
  std::vector<std::vector<std::string>> slice_hosts;  // empty slice: missing
  int missing() const {
    int n = 0;
    for (const auto& s : slice_hosts) n += s.empty();
    return n;
  }
};

class Model {
 public:
  explicit Model(uint32_t seed) : rng_(seed) {
    const char* types[] = {"cpu-2", "cpu-4"};
    for (int i = 0; i < 8; ++i) AddHost(types[Rand(2)]);
    for (int t = 0; t < kNumTiers; ++t) {
      quota_[t] = Rand(3) == 0 ? -1 : 2 * static_cast<int64_t>(2 + Rand(8));
    }
  }

  int Rand(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  void AddHost(const std::string& type) {
    std::string id = "h" + std::to_string(next_host_++);
    host_type_[id] = type;
    host_zone_[id] = Rand(2) ? "za" : "zb";
    free_.insert(id);
  }

  void RandomEvent() {
    const int e = Rand(10);
    if (e < 4) {  // a new request
      ModelQr q;
      q.name = "qr" + std::to_string(next_seq_);
      q.seq = next_seq_++;
      q.tier = static_cast<Tier>(Rand(kNumTiers));
      q.type = Rand(2) ? "cpu-2" : "cpu-4";
      q.zone = Rand(2) ? "za" : "zb";
      q.slices = 1 + Rand(3);
      q.chips_per_slice = q.type == "cpu-2" ? 2 : 4;
      q.slice_hosts.assign(q.slices, {});
      qrs_[q.name] = q;
    } else if (e < 6 && !qrs_.empty()) {  // a deletion
      auto it = qrs_.begin();
      std::advance(it, Rand(static_cast<int>(qrs_.size())));
      for (const auto& s : it->second.slice_hosts) {
        for (const auto& h : s) free_.insert(h);
      }
      qrs_.erase(it);
    } else if (e < 8 && !host_type_.empty()) {  // a host fails
      auto it = host_type_.begin();
      std::advance(it, Rand(static_cast<int>(host_type_.size())));
      const std::string id = it->first;
      host_type_.erase(it);
      free_.erase(id);
      for (auto& [name, q] : qrs_) {
        for (auto& s : q.slice_hosts) {
          if (std::find(s.begin(), s.end(), id) != s.end()) {
            // The whole slice is replaced: its other hosts go back free.
            for (const auto& h : s) {
              if (h != id) free_.insert(h);
            }
            s.clear();
          }
        }
      }
    } else if (e < 9) {  // a host comes (back)
      AddHost(Rand(2) ? "cpu-2" : "cpu-4");
    } else {  // suspensions complete
      for (auto& [name, q] : qrs_) {
        if (q.state != ModelQr::kSuspending) continue;
        q.state = ModelQr::kSuspended;
        for (auto& s : q.slice_hosts) {
          for (const auto& h : s) free_.insert(h);
          s.clear();
        }
      }
    }
  }

  SchedulerInput Input() const {
    SchedulerInput in;
    for (const std::string& id : free_) {
      in.free_hosts.push_back({id, host_type_.at(id), host_zone_.at(id)});
    }
    for (const auto& [name, q] : qrs_) {
      if (q.state == ModelQr::kWaiting) {
        in.requests.push_back({q.name, q.seq, q.tier, q.type, 1,
                               q.chips_per_slice, q.slices, false, q.zone});
        continue;
      }
      if (q.state == ModelQr::kRunning && q.missing() > 0) {
        in.requests.push_back({q.name, q.seq, q.tier, q.type, 1,
                               q.chips_per_slice, q.missing(), true, q.zone});
      }
      SchedHolder h{q.name,
                    q.seq,
                    q.tier,
                    q.type,
                    q.slices * q.chips_per_slice,
                    true,
                    false,
                    q.state == ModelQr::kSuspending,
                    {},
                    q.zone};
      h.preemptible = q.state == ModelQr::kRunning &&
                      (q.tier == Tier::kSpot || q.tier == Tier::kBestEffort);
      for (const auto& s : q.slice_hosts) {
        h.hosts.insert(h.hosts.end(), s.begin(), s.end());
      }
      in.holders.push_back(h);
    }
    for (int t = 0; t < kNumTiers; ++t) in.quota_chips[t] = quota_[t];
    return in;
  }

  // Checks the decision against the rules, then applies it.
  void CheckAndApply(const SchedulerInput& in, const SchedulerDecision& d) {
    std::set<std::string> granted_hosts;
    std::set<std::string> granted;
    for (const Grant& g : d.grants) {
      ASSERT_TRUE(qrs_.count(g.name)) << g.name;
      ASSERT_TRUE(granted.insert(g.name).second) << "granted twice " << g.name;
      ModelQr& q = qrs_[g.name];
      const bool repair = q.state == ModelQr::kRunning;
      ASSERT_TRUE(repair || q.state == ModelQr::kWaiting);
      // All or nothing: every slice (every missing one for a repair).
      ASSERT_EQ(static_cast<int>(g.slice_hosts.size()),
                repair ? q.missing() : q.slices)
          << g.name;
      for (const auto& s : g.slice_hosts) {
        ASSERT_EQ(s.size(), 1u);  // hosts_per_slice of cpu-N
        for (const std::string& h : s) {
          ASSERT_TRUE(free_.count(h)) << h << " is not free";
          ASSERT_TRUE(granted_hosts.insert(h).second) << h << " given twice";
          ASSERT_EQ(host_type_.at(h), q.type);
          ASSERT_EQ(host_zone_.at(h), q.zone) << h << " is in another zone";
        }
      }
    }
    // FIFO within a tier: the granted new requests of a tier and slice type
    // are the oldest of that tier and type.
    for (int t = 0; t < kNumTiers; ++t) {
      std::set<std::string> gap;  // types with an older request left waiting
      for (const auto& [seq, name] : WaitingBySeq(static_cast<Tier>(t))) {
        const std::string type = qrs_.at(name).type + "/" + qrs_.at(name).zone;
        if (!granted.count(name)) {
          gap.insert(type);
        } else {
          ASSERT_FALSE(gap.count(type))
              << name << " overtook an older request of tier " << t;
        }
      }
    }
    // Preemption takes only running spot/best-effort, and spot first.
    bool reserved_waiting = !WaitingBySeq(Tier::kReserved).empty();
    std::set<std::string> victims(d.preempted.begin(), d.preempted.end());
    for (const std::string& v : d.preempted) {
      ASSERT_TRUE(reserved_waiting);
      const ModelQr& q = qrs_.at(v);
      ASSERT_EQ(q.state, ModelQr::kRunning);
      ASSERT_TRUE(q.tier == Tier::kSpot || q.tier == Tier::kBestEffort);
      if (q.tier == Tier::kBestEffort) {
        for (const auto& [name, other] : qrs_) {
          if (other.tier == Tier::kSpot && other.state == ModelQr::kRunning &&
              other.type == q.type && other.zone == q.zone) {
            ASSERT_TRUE(victims.count(name))
                << "best-effort " << v << " preempted before spot " << name;
          }
        }
      }
    }
    // Progress: with no repair pending and nothing preempted, the oldest
    // request of the highest waiting tier is placed when it fits.
    bool repairs = false;
    for (const SchedRequest& r : in.requests) repairs |= r.is_repair;
    for (int t = 0; t < kNumTiers && !repairs; ++t) {
      auto waiting = WaitingBySeq(static_cast<Tier>(t));
      if (waiting.empty()) continue;
      const ModelQr& head = qrs_.at(waiting.begin()->second);
      int fitting = 0;
      for (const std::string& h : free_) {
        fitting +=
            host_type_.at(h) == head.type && host_zone_.at(h) == head.zone;
      }
      const int64_t chips = head.slices * head.chips_per_slice;
      if (fitting >= head.slices &&
          (quota_[t] < 0 || Used(static_cast<Tier>(t)) + chips <= quota_[t]) &&
          d.preempted.empty()) {
        bool higher_holds_back = false;
        for (int u = 0; u < t; ++u) {
          higher_holds_back |= !WaitingBySeq(static_cast<Tier>(u)).empty();
        }
        if (!higher_holds_back) {
          ASSERT_TRUE(granted.count(head.name))
              << head.name << " fits but was not placed";
        }
      }
      break;
    }
    // Apply.
    for (const Grant& g : d.grants) {
      ModelQr& q = qrs_[g.name];
      size_t next = 0;
      for (auto& s : q.slice_hosts) {
        if (s.empty()) s = g.slice_hosts[next++];
      }
      q.state = ModelQr::kRunning;
      for (const auto& s : g.slice_hosts) {
        for (const auto& h : s) free_.erase(h);
      }
    }
    for (const std::string& v : d.preempted) {
      qrs_[v].state = ModelQr::kSuspending;
    }
    // Quotas are never exceeded.
    for (int t = 0; t < kNumTiers; ++t) {
      if (quota_[t] >= 0) {
        ASSERT_LE(Used(static_cast<Tier>(t)), quota_[t]) << "tier " << t;
      }
    }
    // Never partly provisioned: a running queued resource has every slice
    // or is being repaired (and then only lost slices are empty).
    for (const auto& [name, q] : qrs_) {
      if (q.state == ModelQr::kWaiting) {
        for (const auto& s : q.slice_hosts) ASSERT_TRUE(s.empty());
      }
    }
  }

  int64_t Used(Tier t) const {
    int64_t used = 0;
    for (const auto& [name, q] : qrs_) {
      if (q.tier == t && q.state != ModelQr::kWaiting) {
        used += q.slices * q.chips_per_slice;
      }
    }
    return used;
  }

  std::map<int64_t, std::string> WaitingBySeq(Tier t) const {
    std::map<int64_t, std::string> out;
    for (const auto& [name, q] : qrs_) {
      if (q.tier == t && q.state == ModelQr::kWaiting) out[q.seq] = name;
    }
    return out;
  }

  size_t running() const {
    size_t n = 0;
    for (const auto& [name, q] : qrs_) n += q.state == ModelQr::kRunning;
    return n;
  }

 private:
  std::mt19937 rng_;
  int next_host_ = 0;
  int64_t next_seq_ = 0;
  int64_t quota_[kNumTiers];
  std::map<std::string, std::string> host_type_;
  std::map<std::string, std::string> host_zone_;
  std::set<std::string> free_;
  std::map<std::string, ModelQr> qrs_;
};

TEST(SchedulePropertyTest, RandomSequencesKeepTheRules) {
  size_t grants = 0, preemptions = 0;
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    Model model(seed);
    for (int step = 0; step < 150; ++step) {
      model.RandomEvent();
      SchedulerInput in = model.Input();
      SchedulerDecision d = Schedule(in);
      grants += d.grants.size();
      preemptions += d.preempted.size();
      model.CheckAndApply(in, d);
      if (::testing::Test::HasFatalFailure()) {
        FAIL() << "seed " << seed << " step " << step;
      }
    }
  }
  // The sequences exercised what they are meant to.
  EXPECT_GT(grants, 1000u);
  EXPECT_GT(preemptions, 10u);
}

}  // namespace
}  // namespace multislice::control
