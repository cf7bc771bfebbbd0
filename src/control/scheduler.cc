// The gang scheduler (see scheduler.h for the rules).
#include "control/scheduler.h"

#include <algorithm>
#include <map>
#include <set>

#include "runtime/mesh/topology.h"

namespace multislice::control {

bool HostFits(const std::string& host_type, const std::string& slice_type) {
  Result<mesh::AcceleratorType> slice = mesh::ParseAcceleratorType(slice_type);
  if (!slice.ok()) return false;
  Result<mesh::AcceleratorType> host = mesh::ParseAcceleratorType(host_type);
  if (!host.ok()) {
    // A host may register with a bare family ("v4").
    return slice->family != "cpu" && host_type == slice->family;
  }
  if (host->family != slice->family) return false;
  return slice->family != "cpu" || host->num_chips == slice->num_chips;
}

bool SliceTypesCompete(const std::string& a, const std::string& b) {
  Result<mesh::AcceleratorType> ta = mesh::ParseAcceleratorType(a);
  Result<mesh::AcceleratorType> tb = mesh::ParseAcceleratorType(b);
  if (!ta.ok() || !tb.ok()) return a == b;
  if (ta->family != tb->family) return false;
  return ta->family != "cpu" || ta->num_chips == tb->num_chips;
}

bool ZonesMatch(const std::string& a, const std::string& b) {
  return a.empty() || b.empty() || a == b;
}

namespace {

bool Fits(const SchedHost& h, const std::string& type,
          const std::string& zone) {
  return HostFits(h.accelerator_type, type) && ZonesMatch(h.zone, zone);
}

// The free hosts not yet given out, in a stable order.
class HostPool {
 public:
  // Keeps the caller's order: it is the order of preference.
  explicit HostPool(const std::vector<SchedHost>& hosts) : hosts_(hosts) {}
  int CountFitting(const std::string& type, const std::string& zone) const {
    int n = 0;
    for (const SchedHost& h : hosts_) n += Fits(h, type, zone);
    return n;
  }
  // Takes `n` fitting hosts, or none when fewer fit.
  std::vector<std::string> Take(const std::string& type,
                                const std::string& zone, int n) {
    if (CountFitting(type, zone) < n) return {};
    std::vector<std::string> taken;
    for (auto it = hosts_.begin();
         it != hosts_.end() && static_cast<int>(taken.size()) < n;) {
      if (Fits(*it, type, zone)) {
        taken.push_back(it->id);
        it = hosts_.erase(it);
      } else {
        ++it;
      }
    }
    return taken;
  }

 private:
  std::vector<SchedHost> hosts_;
};

Grant MakeGrant(const SchedRequest& r, const std::vector<std::string>& hosts) {
  Grant g;
  g.name = r.name;
  for (int s = 0; s < r.slices; ++s) {
    g.slice_hosts.emplace_back(hosts.begin() + s * r.hosts_per_slice,
                               hosts.begin() + (s + 1) * r.hosts_per_slice);
  }
  return g;
}

}  // namespace

SchedulerDecision Schedule(const SchedulerInput& input) {
  SchedulerDecision decision;
  HostPool pool(input.free_hosts);
  int64_t used[kNumTiers] = {0, 0, 0, 0};
  for (const SchedHolder& h : input.holders) {
    if (h.holds_quota) used[static_cast<int>(h.tier)] += h.chips;
  }
  std::vector<SchedRequest> requests = input.requests;
  std::stable_sort(requests.begin(), requests.end(),
                   [](const SchedRequest& a, const SchedRequest& b) {
                     return a.seq < b.seq;
                   });
  // Repairs first: they already hold quota.
  for (const SchedRequest& r : requests) {
    if (!r.is_repair) continue;
    std::vector<std::string> hosts =
        pool.Take(r.accelerator_type, r.zone, r.slices * r.hosts_per_slice);
    if (!hosts.empty()) decision.grants.push_back(MakeGrant(r, hosts));
  }
  std::set<std::string> preempted;
  for (int t = 0; t < kNumTiers; ++t) {
    const Tier tier = static_cast<Tier>(t);
    // Slice types whose oldest request of this tier waits: younger requests
    // that compete for the same hosts wait behind it.
    std::vector<std::string> blocked_types;
    for (const SchedRequest& r : requests) {
      if (r.is_repair || r.tier != tier) continue;
      bool behind = false;
      for (const std::string& b : blocked_types) {
        behind |= SliceTypesCompete(b, r.accelerator_type);
      }
      if (behind) continue;
      const int64_t chips = static_cast<int64_t>(r.chips_per_slice) * r.slices;
      const int64_t quota = input.quota_chips[t];
      if (quota >= 0 && used[t] + chips > quota) break;  // FIFO: tier blocked
      const int needed = r.slices * r.hosts_per_slice;
      std::vector<std::string> hosts =
          pool.Take(r.accelerator_type, r.zone, needed);
      if (!hosts.empty() || needed == 0) {
        used[t] += chips;
        decision.grants.push_back(MakeGrant(r, hosts));
        continue;
      }
      if (tier == Tier::kReserved) {
        // Would preempting spot, then best-effort, make it fit?
        int available = pool.CountFitting(r.accelerator_type, r.zone);
        std::vector<const SchedHolder*> victims;
        for (const SchedHolder& h : input.holders) {
          if (!h.suspending) continue;
          for (const std::string& host : h.hosts) {
            (void)host;
            available += HostFits(h.accelerator_type, r.accelerator_type) &&
                         ZonesMatch(h.zone, r.zone);
          }
        }
        std::vector<const SchedHolder*> candidates;
        for (const SchedHolder& h : input.holders) {
          if (h.preemptible && !preempted.count(h.name) &&
              (h.tier == Tier::kSpot || h.tier == Tier::kBestEffort) &&
              HostFits(h.accelerator_type, r.accelerator_type) &&
              ZonesMatch(h.zone, r.zone)) {
            candidates.push_back(&h);
          }
        }
        std::stable_sort(candidates.begin(), candidates.end(),
                         [](const SchedHolder* a, const SchedHolder* b) {
                           if (a->tier != b->tier) return a->tier < b->tier;
                           return a->seq > b->seq;  // youngest first
                         });
        for (const SchedHolder* h : candidates) {
          if (available >= needed) break;
          victims.push_back(h);
          available += static_cast<int>(h->hosts.size());
        }
        if (available >= needed) {
          for (const SchedHolder* h : victims) {
            preempted.insert(h->name);
            decision.preempted.push_back(h->name);
          }
          // Hold back the free hosts it will use from lower tiers.
          pool.Take(
              r.accelerator_type, r.zone,
              std::min(needed, pool.CountFitting(r.accelerator_type, r.zone)));
        }
      }
      blocked_types.push_back(r.accelerator_type);  // FIFO
    }
  }
  return decision;
}

}  // namespace multislice::control
