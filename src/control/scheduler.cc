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

// Hosts counted per ICI domain, for the slices of `hosts_per_slice` hosts
// they can hold: every host of a multi-host slice comes from one domain, a
// one-host slice from any.
class DomainCounts {
 public:
  explicit DomainCounts(int hosts_per_slice)
      : hosts_per_slice_(std::max(1, hosts_per_slice)) {}
  void Add(const std::string& ici_domain) {
    ++counts_[hosts_per_slice_ > 1 ? ici_domain : std::string()];
  }
  int Slices() const {
    int slices = 0;
    for (const auto& [domain, n] : counts_) slices += n / hosts_per_slice_;
    return slices;
  }
  int Hosts(const std::string& ici_domain) const {
    auto it = counts_.find(hosts_per_slice_ > 1 ? ici_domain : std::string());
    return it == counts_.end() ? 0 : it->second;
  }

 private:
  int hosts_per_slice_;
  std::map<std::string, int> counts_;
};

// The free hosts not yet given out, in a stable order.
class HostPool {
 public:
  // Keeps the caller's order: it is the order of preference.
  explicit HostPool(const std::vector<SchedHost>& hosts) : hosts_(hosts) {}
  // The fitting hosts per ICI domain.
  DomainCounts Count(const std::string& type, const std::string& zone,
                     int hosts_per_slice) const {
    DomainCounts counts(hosts_per_slice);
    for (const SchedHost& h : hosts_) {
      if (Fits(h, type, zone)) counts.Add(h.ici_domain);
    }
    return counts;
  }
  // Takes `slices` slices of `hosts_per_slice` fitting hosts each, every
  // multi-host slice from one ICI domain, or nothing when fewer fit. Each
  // slice goes to the domain of the most preferred fitting host whose
  // domain still holds a slice, and takes that domain's most preferred
  // hosts.
  std::vector<std::vector<std::string>> Take(const std::string& type,
                                             const std::string& zone,
                                             int hosts_per_slice, int slices) {
    if (Count(type, zone, hosts_per_slice).Slices() < slices) return {};
    const bool one_domain = hosts_per_slice > 1;
    std::vector<std::vector<std::string>> taken;
    for (int s = 0; s < slices; ++s) {
      const DomainCounts counts = Count(type, zone, hosts_per_slice);
      std::string domain;
      for (const SchedHost& h : hosts_) {
        if (Fits(h, type, zone) &&
            counts.Hosts(h.ici_domain) >= hosts_per_slice) {
          domain = h.ici_domain;
          break;
        }
      }
      std::vector<std::string> slice;
      for (auto it = hosts_.begin();
           it != hosts_.end() &&
           static_cast<int>(slice.size()) < hosts_per_slice;) {
        if (Fits(*it, type, zone) &&
            (!one_domain || it->ici_domain == domain)) {
          slice.push_back(it->id);
          it = hosts_.erase(it);
        } else {
          ++it;
        }
      }
      taken.push_back(std::move(slice));
    }
    return taken;
  }
  // Takes up to `n` fitting hosts whatever their domain (held back for a
  // reserved request that waits for preempted hosts).
  void HoldBack(const std::string& type, const std::string& zone, int n) {
    int held = 0;
    for (auto it = hosts_.begin(); it != hosts_.end() && held < n;) {
      if (Fits(*it, type, zone)) {
        it = hosts_.erase(it);
        ++held;
      } else {
        ++it;
      }
    }
  }

 private:
  std::vector<SchedHost> hosts_;
};

// The ICI domain of holder h's i-th host.
const std::string& HeldIciDomain(const SchedHolder& h, size_t i) {
  static const std::string kNone;
  return i < h.host_ici_domains.size() ? h.host_ici_domains[i] : kNone;
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
    std::vector<std::vector<std::string>> slices =
        pool.Take(r.accelerator_type, r.zone, r.hosts_per_slice, r.slices);
    if (!slices.empty()) decision.grants.push_back({r.name, slices});
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
      std::vector<std::vector<std::string>> slices =
          pool.Take(r.accelerator_type, r.zone, r.hosts_per_slice, r.slices);
      if (!slices.empty() || needed == 0) {
        if (needed == 0) slices.assign(r.slices, {});
        used[t] += chips;
        decision.grants.push_back({r.name, slices});
        continue;
      }
      if (tier == Tier::kReserved) {
        // Would preempting spot, then best-effort, make it fit?
        // Slices that free and freeing hosts could hold, per ICI domain.
        DomainCounts available =
            pool.Count(r.accelerator_type, r.zone, r.hosts_per_slice);
        std::vector<const SchedHolder*> victims;
        for (const SchedHolder& h : input.holders) {
          if (!h.suspending ||
              !HostFits(h.accelerator_type, r.accelerator_type) ||
              !ZonesMatch(h.zone, r.zone)) {
            continue;
          }
          for (size_t i = 0; i < h.hosts.size(); ++i) {
            available.Add(HeldIciDomain(h, i));
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
          if (available.Slices() >= r.slices) break;
          victims.push_back(h);
          for (size_t i = 0; i < h->hosts.size(); ++i) {
            available.Add(HeldIciDomain(*h, i));
          }
        }
        if (available.Slices() >= r.slices) {
          for (const SchedHolder* h : victims) {
            preempted.insert(h->name);
            decision.preempted.push_back(h->name);
          }
          // Hold back the free hosts it will use from lower tiers.
          pool.HoldBack(r.accelerator_type, r.zone, needed);
        }
      }
      blocked_types.push_back(r.accelerator_type);  // FIFO
    }
  }
  return decision;
}

}  // namespace multislice::control
