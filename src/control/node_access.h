// What `gcloud compute tpus tpu-vm ssh|scp` and `queued-resources ssh|scp`
// need of the controller beyond a node's GET, as Google's services answer
// them:
//   POST  /{v2,v2alpha1}/projects/P/locations/Z/nodes/N:getGuestAttributes
//         each worker's hostkeys/ (its sshd's public keys: gcloud names the
//         worker's known_hosts entry after them)
//   PATCH /{v2,v2alpha1}/projects/P/locations/Z/nodes/N?updateMask=metadata
//         the node's metadata (gcloud adds its public key to ssh-keys); an
//         operation that ends once every host of the node applied it
//   GET   /compute/{v1,beta,alpha}/projects/P
//         the Compute API's project: no project-wide metadata, so no
//         project-wide keys (a key opens only the node it was added to) and
//         OS Login off
// and the agents' side of it: what a host's heartbeat answer carries (the
// ssh-keys of the node holding it, on behalf of that queued resource), what
// its agent reports back, and the node updates that report ends.
//
// Thread-safety: the handlers take the state's lock; the functions below
// expect it held.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "control/control_state.h"
#include "control/routes.h"

namespace multislice::control {

// A node: the queued resource that made it and its index there.
struct NodeRef {
  QueuedResourceRecord* record = nullptr;
  size_t index = 0;
};

// With mu held: node `id` of project/zone.
std::optional<NodeRef> FindNode(ControlState& state, const std::string& project,
                                const std::string& zone, const std::string& id);
// "projects/P/locations/Z/nodes/ID".
std::string NodeName(const std::string& project, const std::string& zone,
                     const std::string& id);
// With mu held: the node a path .../projects/P/locations/Z/nodes/ID names
// (matches 2, 3 and 4), validated; nullopt after answering 400 or 404.
std::optional<NodeRef> NodeOfPath(ControlState& state,
                                  const httplib::Request& req,
                                  httplib::Response& res);

// How long a metadata patch's operation waits for the hosts to apply it.
inline constexpr int64_t kNodeUpdateTimeoutMs = 30000;

class NodeAccessApi {
 public:
  explicit NodeAccessApi(ControlState& state) : state_(state) {}

  // Routes the three calls on `server`, behind the bearer check of `token`.
  void Mount(httplib::Server& server, const std::string& token);

 private:
  void HandlePatchNode(const httplib::Request& req, httplib::Response& res);
  void HandleGetGuestAttributes(const httplib::Request& req,
                                httplib::Response& res);
  void HandleGetProject(const httplib::Request& req, httplib::Response& res);

  ControlState& state_;
};

// With mu held: what host `host_id`'s heartbeat answer carries under "ssh":
// {"owner": the uid of the queued resource holding it, "generation": its
// node's metadata generation, "keys": the node's ssh-keys}, or
// {"owner": ""} when no queued resource holds it.
nlohmann::json SshKeysForHost(const ControlState& state,
                              const std::string& host_id);

// With mu held: records what host `h`'s agent reported applying (a
// heartbeat's "ssh": {"owner", "generation"}; anything else is ignored),
// then ends the node updates that completes.
void NoteSshApplied(ControlState& state, Host& h, const nlohmann::json& report);

// With mu held: ends (persisting them) the node updates whose live hosts
// have all applied them, whose node is gone, or whose deadline has passed.
// The reconcile loop calls it too, for the deadlines.
void FinishNodeUpdates(ControlState& state);

}  // namespace multislice::control
