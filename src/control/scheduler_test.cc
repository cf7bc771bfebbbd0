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
  in.free_hosts = {{"h1", "cpu-2", "", ""},
                   {"h2", "cpu-2", "", ""},
                   {"h3", "cpu-2", "", ""}};
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
  in.free_hosts.push_back({"h4", "v4-8", "", ""});
  d = Schedule(in);
  ASSERT_EQ(d.grants.size(), 2u);
  EXPECT_EQ(d.grants[0].name, "v4");
}

TEST(ScheduleTest, ReservedPreemptsSpotBeforeBestEffort) {
  SchedulerInput in;
  in.holders = {{"be",
                 1,
                 Tier::kBestEffort,
                 "cpu-2",
                 2,
                 true,
                 true,
                 false,
                 {"h1"},
                 "",
                 {}},
                {"spot-old",
                 2,
                 Tier::kSpot,
                 "cpu-2",
                 2,
                 true,
                 true,
                 false,
                 {"h2"},
                 "",
                 {}},
                {"spot-new",
                 3,
                 Tier::kSpot,
                 "cpu-2",
                 2,
                 true,
                 true,
                 false,
                 {"h3"},
                 "",
                 {}}};
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
  in.free_hosts = {{"h1", "cpu-2", "", ""}, {"h2", "cpu-2", "", ""}};
  in.quota_chips[static_cast<int>(Tier::kOnDemand)] = 4;
  in.holders = {{"failed",
                 1,
                 Tier::kOnDemand,
                 "cpu-2",
                 2,
                 true,
                 false,
                 false,
                 {},
                 "",
                 {}}};
  in.requests = {{"r", 2, Tier::kOnDemand, "cpu-2", 1, 2, 2, false, ""}};
  EXPECT_TRUE(Schedule(in).grants.empty());  // 2 held + 4 > 4
  in.holders.clear();
  EXPECT_EQ(Schedule(in).grants.size(), 1u);
}

// Hosts of an ICI domain "pa", "pb" or none, all v4 in one zone.
std::vector<SchedHost> V4Hosts(
    const std::vector<std::pair<std::string, std::string>>& id_domain) {
  std::vector<SchedHost> hosts;
  for (const auto& [id, domain] : id_domain) {
    hosts.push_back({id, "v4-16", "", domain});
  }
  return hosts;
}

// A v4-16 request: 2 hosts of 4 chips per slice.
SchedRequest V4_16(const std::string& name, int slices, bool repair = false) {
  return {name, 1, Tier::kOnDemand, "v4-16", 2, 8, slices, repair, ""};
}

TEST(ScheduleIciTest, MultiHostSliceTakesOneDomain) {
  SchedulerInput in;
  in.free_hosts = V4Hosts({{"a1", "pa"}, {"b1", "pb"}});
  in.requests = {V4_16("qr", 1)};
  // Two free hosts, but in two ICI domains: no slice.
  EXPECT_TRUE(Schedule(in).grants.empty());
  in.free_hosts = V4Hosts({{"a1", "pa"}, {"b1", "pb"}, {"b2", "pb"}});
  SchedulerDecision d = Schedule(in);
  ASSERT_EQ(d.grants.size(), 1u);
  EXPECT_EQ(d.grants[0].slice_hosts,
            (std::vector<std::vector<std::string>>{{"b1", "b2"}}));
  // Hosts without a domain combine with each other, never with a domain's.
  in.free_hosts = V4Hosts({{"a1", "pa"}, {"n1", ""}});
  EXPECT_TRUE(Schedule(in).grants.empty());
  in.free_hosts = V4Hosts({{"n1", ""}, {"a1", "pa"}, {"n2", ""}});
  d = Schedule(in);
  ASSERT_EQ(d.grants.size(), 1u);
  EXPECT_EQ(d.grants[0].slice_hosts,
            (std::vector<std::vector<std::string>>{{"n1", "n2"}}));
  // A one-host slice takes a host of any domain.
  in.free_hosts = V4Hosts({{"a1", "pa"}, {"b1", "pb"}});
  in.requests = {{"one", 1, Tier::kOnDemand, "v4-8", 1, 4, 2, false, ""}};
  d = Schedule(in);
  ASSERT_EQ(d.grants.size(), 1u);
  EXPECT_EQ(d.grants[0].slice_hosts,
            (std::vector<std::vector<std::string>>{{"a1"}, {"b1"}}));
}

TEST(ScheduleIciTest, GangOverDomainsInPreferenceOrder) {
  SchedulerInput in;
  // Preferred first: b1 (its domain holds a slice), then pa.
  in.free_hosts = V4Hosts(
      {{"c1", "pc"}, {"b1", "pb"}, {"a1", "pa"}, {"a2", "pa"}, {"b2", "pb"}});
  in.requests = {V4_16("qr", 2)};
  SchedulerDecision d = Schedule(in);
  ASSERT_EQ(d.grants.size(), 1u);
  EXPECT_EQ(d.grants[0].slice_hosts, (std::vector<std::vector<std::string>>{
                                         {"b1", "b2"}, {"a1", "a2"}}));
  // Three slices need three domains of two: all or nothing.
  in.requests = {V4_16("qr", 3)};
  EXPECT_TRUE(Schedule(in).grants.empty());
  // One domain may hold several slices.
  in.free_hosts =
      V4Hosts({{"a1", "pa"}, {"a2", "pa"}, {"a3", "pa"}, {"a4", "pa"}});
  in.requests = {V4_16("qr", 2)};
  d = Schedule(in);
  ASSERT_EQ(d.grants.size(), 1u);
  EXPECT_EQ(d.grants[0].slice_hosts, (std::vector<std::vector<std::string>>{
                                         {"a1", "a2"}, {"a3", "a4"}}));
}

TEST(ScheduleIciTest, RepairTakesOneDomain) {
  SchedulerInput in;
  // The survivor of the lost slice (a2) and a spare of another domain (b3)
  // cannot form the replacement.
  in.free_hosts = V4Hosts({{"a2", "pa"}, {"b3", "pb"}});
  in.requests = {V4_16("qr", 1, /*repair=*/true)};
  EXPECT_TRUE(Schedule(in).grants.empty());
  in.free_hosts = V4Hosts({{"a2", "pa"}, {"b3", "pb"}, {"a5", "pa"}});
  SchedulerDecision d = Schedule(in);
  ASSERT_EQ(d.grants.size(), 1u);
  EXPECT_EQ(d.grants[0].slice_hosts,
            (std::vector<std::vector<std::string>>{{"a2", "a5"}}));
}

TEST(ScheduleIciTest, PreemptsOnlyWhenTheDomainsFit) {
  SchedulerInput in;
  in.free_hosts = V4Hosts({{"a1", "pa"}});
  SchedHolder spot{"spot", 1,     Tier::kSpot, "v4-16", 8,     true,
                   true,   false, {"x1"},      "",      {"pb"}};
  in.holders = {spot};
  in.requests = {{"res", 2, Tier::kReserved, "v4-16", 2, 8, 1, false, ""}};
  // The spot's host is in another domain than the free one: preempting it
  // would not make a slice.
  SchedulerDecision d = Schedule(in);
  EXPECT_TRUE(d.preempted.empty());
  EXPECT_TRUE(d.grants.empty());
  in.holders[0].host_ici_domains = {"pa"};
  d = Schedule(in);
  EXPECT_EQ(d.preempted, std::vector<std::string>{"spot"});
  // A host already being freed counts by its domain too.
  in.holders[0].suspending = true;
  in.holders[0].preemptible = false;
  in.holders[0].host_ici_domains = {"pb"};
  in.free_hosts = V4Hosts({{"a1", "pa"}, {"b1", "pb"}});
  in.requests.push_back(
      {"low", 3, Tier::kOnDemand, "v4-16", 2, 8, 1, false, ""});
  d = Schedule(in);
  // res waits for x1 (pb) with b1, and holds back the free hosts: low gets
  // nothing.
  EXPECT_TRUE(d.preempted.empty());
  EXPECT_TRUE(d.grants.empty());
}

// The model of the property test: queued resources with their hosts.
struct ModelQr {
  std::string name;
  int64_t seq;
  Tier tier;
  std::string type;
  std::string zone;
  int slices;
  int hosts_per_slice;
  int chips_per_slice;
  enum { kWaiting, kRunning, kSuspending, kSuspended } state = kWaiting;
  std::vector<std::vector<std::string>> slice_hosts;  // empty slice: missing
  int missing() const {
    int n = 0;
    for (const auto& s : slice_hosts) n += s.empty();
    return n;
  }
};

// The slice types of the model, written out from Cloud TPU's tables: a v4
// host has 4 chips; a cpu-N slice is one host.
struct ModelType {
  const char* name;
  int hosts_per_slice;
  int chips_per_slice;
};
constexpr ModelType kModelTypes[] = {{"cpu-2", 1, 2},  {"cpu-4", 1, 4},
                                     {"v4-8", 1, 4},   {"v4-16", 2, 8},
                                     {"v4-32", 4, 16}, {"v4-16", 2, 8}};
// Host types: a v4 host registers as its family or as a v4 type.
const char* const kModelHostTypes[] = {"cpu-2", "cpu-4", "v4", "v4-16"};

// Whether a host of `host_type` serves a slice of `slice_type`: cpu-N
// exactly, v4 hosts any v4 slice.
bool ModelFits(const std::string& host_type, const std::string& slice_type) {
  if (slice_type.rfind("v4-", 0) == 0) {
    return host_type == "v4" || host_type.rfind("v4-", 0) == 0;
  }
  return host_type == slice_type;
}

class Model {
 public:
  explicit Model(uint32_t seed) : rng_(seed) {
    for (int i = 0; i < 12; ++i) AddHost(kModelHostTypes[Rand(4)]);
    for (int t = 0; t < kNumTiers; ++t) {
      quota_[t] = Rand(3) == 0 ? -1 : 2 * static_cast<int64_t>(2 + Rand(8));
    }
  }

  int Rand(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  void AddHost(const std::string& type) {
    std::string id = "h" + std::to_string(next_host_++);
    host_type_[id] = type;
    host_zone_[id] = Rand(2) ? "za" : "zb";
    const char* domains[] = {"", "pa", "pb"};
    host_domain_[id] = domains[Rand(3)];
    free_.insert(id);
  }

  void RandomEvent() {
    const int e = Rand(10);
    if (e < 4) {  // a new request
      ModelQr q;
      q.name = "qr" + std::to_string(next_seq_);
      q.seq = next_seq_++;
      q.tier = static_cast<Tier>(Rand(kNumTiers));
      const ModelType& type = kModelTypes[Rand(std::size(kModelTypes))];
      q.type = type.name;
      q.zone = Rand(2) ? "za" : "zb";
      q.slices = 1 + Rand(3);
      q.hosts_per_slice = type.hosts_per_slice;
      q.chips_per_slice = type.chips_per_slice;
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
      AddHost(kModelHostTypes[Rand(4)]);
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
      in.free_hosts.push_back(
          {id, host_type_.at(id), host_zone_.at(id), host_domain_.at(id)});
    }
    for (const auto& [name, q] : qrs_) {
      if (q.state == ModelQr::kWaiting) {
        in.requests.push_back({q.name, q.seq, q.tier, q.type, q.hosts_per_slice,
                               q.chips_per_slice, q.slices, false, q.zone});
        continue;
      }
      if (q.state == ModelQr::kRunning && q.missing() > 0) {
        in.requests.push_back({q.name, q.seq, q.tier, q.type, q.hosts_per_slice,
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
                    q.zone,
                    {}};
      h.preemptible = q.state == ModelQr::kRunning &&
                      (q.tier == Tier::kSpot || q.tier == Tier::kBestEffort);
      for (const auto& s : q.slice_hosts) {
        for (const std::string& id : s) {
          h.hosts.push_back(id);
          h.host_ici_domains.push_back(host_domain_.at(id));
        }
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
        ASSERT_EQ(static_cast<int>(s.size()), q.hosts_per_slice) << g.name;
        for (const std::string& h : s) {
          ASSERT_TRUE(free_.count(h)) << h << " is not free";
          ASSERT_TRUE(granted_hosts.insert(h).second) << h << " given twice";
          ASSERT_TRUE(ModelFits(host_type_.at(h), q.type))
              << h << " (" << host_type_.at(h) << ") for " << q.type;
          ASSERT_EQ(host_zone_.at(h), q.zone) << h << " is in another zone";
          // A multi-host slice is joined by ICI: one domain ("" included).
          ASSERT_EQ(host_domain_.at(h), host_domain_.at(s[0]))
              << g.name << ": " << h << " and " << s[0]
              << " are in different ICI domains";
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
      // Slices the free hosts can hold: per ICI domain for multi-host ones.
      std::map<std::string, int> fitting_per_domain;
      for (const std::string& h : free_) {
        if (ModelFits(host_type_.at(h), head.type) &&
            host_zone_.at(h) == head.zone) {
          ++fitting_per_domain[head.hosts_per_slice > 1 ? host_domain_.at(h)
                                                        : ""];
        }
      }
      int fitting_slices = 0;
      for (const auto& [domain, n] : fitting_per_domain) {
        fitting_slices += n / head.hosts_per_slice;
      }
      const int64_t chips = head.slices * head.chips_per_slice;
      if (fitting_slices >= head.slices &&
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
  std::map<std::string, std::string> host_domain_;
  std::set<std::string> free_;
  std::map<std::string, ModelQr> qrs_;
};

TEST(SchedulePropertyTest, RandomSequencesKeepTheRules) {
  size_t grants = 0, preemptions = 0, multi_host_grants = 0;
  size_t multi_host_repairs = 0;
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    Model model(seed);
    for (int step = 0; step < 150; ++step) {
      model.RandomEvent();
      SchedulerInput in = model.Input();
      SchedulerDecision d = Schedule(in);
      grants += d.grants.size();
      preemptions += d.preempted.size();
      for (const Grant& g : d.grants) {
        if (g.slice_hosts.empty() || g.slice_hosts[0].size() < 2) continue;
        ++multi_host_grants;
        for (const SchedRequest& r : in.requests) {
          multi_host_repairs += r.name == g.name && r.is_repair;
        }
      }
      model.CheckAndApply(in, d);
      if (::testing::Test::HasFatalFailure()) {
        FAIL() << "seed " << seed << " step " << step;
      }
    }
  }
  // The sequences exercised what they are meant to.
  EXPECT_GT(grants, 1000u);
  EXPECT_GT(preemptions, 10u);
  EXPECT_GT(multi_host_grants, 100u);
  EXPECT_GT(multi_host_repairs, 30u);
}

}  // namespace
}  // namespace multislice::control
