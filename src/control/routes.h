// The shape every controller handler has, and the bearer check in front of
// the ones that need a token.
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "control/api_types.h"
#include "control/http.h"
#include "control/validation.h"

namespace multislice::control {

using Handler =
    std::function<void(const httplib::Request&, httplib::Response&)>;

// `h`, answered only for requests that carry `token` (401/403 otherwise).
inline Handler WithBearer(const std::string& token, Handler h) {
  return [token, h = std::move(h)](const httplib::Request& req,
                                   httplib::Response& res) {
    if (!RequireBearer(req, res, token)) return;
    h(req, res);
  };
}

// `r`, or nullptr after answering 404 for the queued resource `key`.
inline QueuedResourceRecord* FoundOr404(QueuedResourceRecord* r,
                                        const std::string& key,
                                        httplib::Response& res) {
  if (!r) {
    WriteError(res, 404, "NOT_FOUND",
               "queued resource " + QuoteForMessage(key) + " not found");
  }
  return r;
}

}  // namespace multislice::control
