// The shape every controller handler has, and the bearer check in front of
// the ones that need a token.
#pragma once

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// False after answering 400 with `s`'s sentence.
inline bool Valid(const Status& s, httplib::Response& res) {
  if (!s.ok()) WriteError(res, 400, "INVALID_ARGUMENT", s.message());
  return s.ok();
}

// A list's pageSize (0 or absent: 100) and pageToken (the position after
// which the page starts: 0 for the first page).
struct PageRequest {
  int size = 0;
  int64_t after = 0;
};

// The request's page, or nullopt after answering 400.
inline std::optional<PageRequest> PageOf(const httplib::Request& req,
                                         httplib::Response& res) {
  Result<int> size = ParsePageSize(
      req.has_param("pageSize") ? req.get_param_value("pageSize") : "0");
  if (!Valid(size.status(), res)) return std::nullopt;
  Result<int64_t> after = ParsePageToken(req.get_param_value("pageToken"));
  if (!Valid(after.status(), res)) return std::nullopt;
  return PageRequest{*size, *after};
}

// Answers one page of `items` under `key`, the token being the offset of
// the next page.
inline void WritePage(const httplib::Request& req, httplib::Response& res,
                      const std::string& key,
                      const std::vector<nlohmann::json>& items) {
  std::optional<PageRequest> page = PageOf(req, res);
  if (!page) return;
  const size_t begin = std::min(items.size(), static_cast<size_t>(page->after));
  const size_t end = std::min(items.size(), begin + page->size);
  nlohmann::json out = {{key, nlohmann::json::array()}};
  for (size_t i = begin; i < end; ++i) out[key].push_back(items[i]);
  if (end < items.size()) out["nextPageToken"] = FormatPageToken(end);
  WriteJson(res, 200, out);
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
