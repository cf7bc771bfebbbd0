// The public queued-resources API (spec 4.1) under /v2alpha1/ and /v2/:
// create, get, list, delete and reset of queued resources, and their
// long-running operations. Each handler validates its input, changes the
// shared state under its lock, persists it and wakes the reconciler; none
// calls an agent.
#pragma once

#include "control/control_state.h"
#include "control/routes.h"

namespace multislice::control {

class PublicApi {
 public:
  explicit PublicApi(ControlState& state) : state_(state) {}

  // Routes the API on `server`, behind the bearer check of `token`.
  void Mount(httplib::Server& server, const std::string& token);

  // Creates queued resource `id` from the request `body` (as version `api`
  // reads it) and answers its operation, or the refusal. `as_node`: made by
  // nodes.create (`tpu-vm create`), so that nodes.delete may delete it.
  // Takes mu.
  void Create(const std::string& api, const std::string& project,
              const std::string& zone, const std::string& id,
              const nlohmann::json& body, bool as_node, httplib::Response& res);
  // Deletes queued resource `name` (force: also an ACTIVE one, its nodes
  // first) and answers its operation, or the refusal. Takes mu.
  void Delete(const std::string& api, const std::string& name, bool force,
              httplib::Response& res);

 private:
  void HandleCreate(const httplib::Request& req, httplib::Response& res);
  void HandleGet(const httplib::Request& req, httplib::Response& res);
  void HandleList(const httplib::Request& req, httplib::Response& res);
  void HandleDelete(const httplib::Request& req, httplib::Response& res);
  void HandleReset(const httplib::Request& req, httplib::Response& res);
  void HandleOperation(const httplib::Request& req, httplib::Response& res);
  // The operation the path names, or nullptr after answering 400 or 404.
  // Holds mu.
  const OperationRecord* FindOperation(const httplib::Request& req,
                                       httplib::Response& res);
  void HandleListOperations(const httplib::Request& req,
                            httplib::Response& res);
  // operations.cancel and operations.delete: the operation must exist; the
  // answer is google.protobuf.Empty. Neither changes the transition under
  // way (a delete of the queued resource is how a user stops one), as the
  // long-running-operations API allows ("best effort").
  void HandleForgetOperation(const httplib::Request& req,
                             httplib::Response& res);
  // The end of a user's change to an existing queued resource (delete,
  // reset): persists `r` with its new operation, makes them current, wakes
  // the reconcile loop and answers the operation. Holds mu.
  void CommitUserChange(QueuedResourceRecord& r, const OperationRecord& op,
                        const std::string& log_line, httplib::Response& res);

  ControlState& state_;
};

}  // namespace multislice::control
