// The read-only resources of the Cloud TPU API beside queued resources, as
// Google's client libraries and gcloud call them: the nodes queued resources
// made (projects.locations.nodes.list/get), accelerator types, runtime
// versions and locations (also on /v1/, which gax uses for locations).
#pragma once

#include "control/control_state.h"
#include "control/routes.h"

namespace multislice::control {

// Node `index` of `r` as the Node resource: what its create body said of
// it, with its name, id, state, health, metadata (patched or as created),
// endpoints and queued resource. With mu held (`hosts` is the state's).
nlohmann::json NodeJson(const QueuedResourceRecord& r, size_t index,
                        const std::map<std::string, Host>& hosts);

class ResourceApi {
 public:
  explicit ResourceApi(ControlState& state) : state_(state) {}

  // Routes them on `server`, behind the bearer check of `token`.
  void Mount(httplib::Server& server, const std::string& token);

 private:
  void HandleListNodes(const httplib::Request& req, httplib::Response& res);
  void HandleGetNode(const httplib::Request& req, httplib::Response& res);
  void HandleListAcceleratorTypes(const httplib::Request& req,
                                  httplib::Response& res);
  void HandleGetAcceleratorType(const httplib::Request& req,
                                httplib::Response& res);
  void HandleListRuntimeVersions(const httplib::Request& req,
                                 httplib::Response& res);
  void HandleGetRuntimeVersion(const httplib::Request& req,
                               httplib::Response& res);
  void HandleListLocations(const httplib::Request& req, httplib::Response& res);
  void HandleGetLocation(const httplib::Request& req, httplib::Response& res);

  // With mu held: every node of the project (zone "-": of every zone), in
  // creation order, as the API shows it.
  std::vector<nlohmann::json> Nodes(const std::string& project,
                                    const std::string& zone);
  // With mu held: the zones this controller knows (hosts and records).
  std::vector<std::string> Zones();

  ControlState& state_;
};

}  // namespace multislice::control
