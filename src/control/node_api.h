// The node methods of the Cloud TPU API beyond get, list and patch, as
// `gcloud compute tpus tpu-vm` calls them:
//   POST   nodes?nodeId=N (create)  a queued resource of one node named N,
//          made at once (`tpu-vm create`): it waits, is placed and
//          repaired like any other, and shows in queued-resources list
//   DELETE nodes/N                  deletes such a queued resource; a node
//          of a queued resource made as one is refused, naming it
//   POST   nodes/N:stop, :start     refused: a node's hosts stay held until
//          its queued resource is deleted (as Cloud TPU refuses them for
//          queued resources' nodes)
//   POST   nodes/N:performMaintenance   refused: no maintenance is pending
//   POST   nodes/N:simulateMaintenanceEvent   the host of the first worker
//          given (worker 0 by default) is lost, as in a maintenance event:
//          the queued resource is repaired (docs/control.md, Repair)
//   POST   locations/Z:generateServiceIdentity   the TPU service agent's
//          identity (`tpu-vm service-identity create`)
#pragma once

#include "control/control_state.h"
#include "control/public_api.h"
#include "control/routes.h"

namespace multislice::control {

class NodeApi {
 public:
  NodeApi(ControlState& state, PublicApi& queued_resources)
      : state_(state), queued_resources_(queued_resources) {}

  // Routes them on `server`, behind the bearer check of `token`.
  void Mount(httplib::Server& server, const std::string& token);

 private:
  void HandleCreate(const httplib::Request& req, httplib::Response& res);
  void HandleDelete(const httplib::Request& req, httplib::Response& res);
  void HandleRefused(const httplib::Request& req, httplib::Response& res);
  void HandleSimulateMaintenance(const httplib::Request& req,
                                 httplib::Response& res);
  void HandleServiceIdentity(const httplib::Request& req,
                             httplib::Response& res);

  ControlState& state_;
  PublicApi& queued_resources_;
};

}  // namespace multislice::control
