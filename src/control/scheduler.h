// Gang scheduling of queued resources onto hosts: a pure function of the
// current state, so that it can be property-tested without a controller.
//
// Rules (spec 4.1, issue 5 point 3):
// - All or nothing: a request gets hosts for every one of its slices in one
//   grant, or nothing.
// - Repairs first: a queued resource that lost slices gets replacement hosts
//   before any new request (oldest first, all of its missing slices or none).
// - Tiers in priority order reserved, on-demand, spot, best-effort; strict
//   FIFO inside a tier: when the oldest waiting request of a tier cannot be
//   placed, no younger request of that tier that competes for the same hosts
//   (SliceTypesCompete) is; one over the tier's quota blocks the whole tier.
//   A blocked tier does not block lower tiers.
// - Per-tier quotas in chips: the chips of every queued resource that holds
//   quota (admitted and not yet deleted, FAILED and SUSPENDED included) plus
//   the request's must stay within its tier's quota.
// - A request of no hosts (hosts_per_slice 0) is granted on quota alone: on
//   a cluster scheduler's capacity (Slurm) the cluster places it, and the
//   controller only keeps each tier within its quota, in the same FIFO.
// - A reserved request that does not fit free capacity preempts running
//   spot queued resources first (youngest first), then best-effort ones, but
//   only when that makes it fit; the free hosts it will use are held back
//   from lower tiers meanwhile.
// - A slice of type T takes T's hosts_per_slice hosts whose type fits T
//   (HostFits), in the queued resource's zone.
// - ICI domains: the hosts of a multi-host slice (hosts_per_slice > 1) are
//   joined by ICI, so they all come from one ICI domain (SchedHost::
//   ici_domain); hosts registered without one ("") combine only with each
//   other. A one-host slice takes a host of any domain. Repairs follow the
//   same rule (a replacement slice is again one domain's hosts, not
//   necessarily the domain of the slice it replaces). Among the domains
//   that can hold a slice, the one of the most preferred fitting host is
//   taken first; since a slice uses exactly one domain's hosts, this greedy
//   choice places as many slices as any other would.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "control/api_types.h"

namespace multislice::control {

// Whether a host registered with `host_type` can serve a slice of
// `slice_type`: the same family, and for cpu-N the same N.
bool HostFits(const std::string& host_type, const std::string& slice_type);

// Whether slices of types a and b can take the same hosts (same family; for
// cpu-N the same N).
bool SliceTypesCompete(const std::string& a, const std::string& b);

struct SchedHost {
  std::string id;
  std::string accelerator_type;
  std::string zone;        // "" fits any zone
  std::string ici_domain;  // hosts joined by ICI; "" only with other ""
};

// Whether zones a and b match: equal, or either is "" (any).
bool ZonesMatch(const std::string& a, const std::string& b);

// A queued resource that wants hosts: a new one (WAITING_FOR_RESOURCES) or
// one being repaired (missing_slices > 0).
struct SchedRequest {
  std::string name;
  int64_t seq = 0;
  Tier tier = Tier::kOnDemand;
  std::string accelerator_type;
  int hosts_per_slice = 1;  // 0: placed by a cluster, granted on quota
  int chips_per_slice = 1;
  int slices = 1;          // slices wanted (all slices for a new request)
  bool is_repair = false;  // already holds quota and its other slices
  std::string zone;        // hosts must be in this zone ("" any)
};

// A queued resource that holds hosts or quota.
struct SchedHolder {
  std::string name;
  int64_t seq = 0;
  Tier tier = Tier::kOnDemand;
  std::string accelerator_type;
  int chips = 0;  // total chips held against the tier's quota
  bool holds_quota = false;
  bool preemptible = false;  // running spot/best-effort, not yet suspending
  bool suspending = false;   // already being preempted: its hosts will free
  std::vector<std::string> hosts;
  std::string zone;
  // The ICI domain of each of `hosts`, in the same order; shorter (or
  // empty): the rest are "".
  std::vector<std::string> host_ici_domains;
};

struct SchedulerInput {
  std::vector<SchedHost> free_hosts;   // healthy and unassigned, preferred
                                       // first
  std::vector<SchedRequest> requests;  // any order
  std::vector<SchedHolder> holders;
  int64_t quota_chips[kNumTiers] = {-1, -1, -1, -1};  // -1: unlimited
};

struct Grant {
  std::string name;
  std::vector<std::vector<std::string>> slice_hosts;  // per slice
};

struct SchedulerDecision {
  std::vector<Grant> grants;           // in the order they were made
  std::vector<std::string> preempted;  // holders to suspend
};

SchedulerDecision Schedule(const SchedulerInput& input);

}  // namespace multislice::control
