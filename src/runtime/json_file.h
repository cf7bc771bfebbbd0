// Writes a JSON document through a temporary file and a rename, so that a
// reader never sees half of it (traces, the hang digest).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace multislice::runtime {

// `what` names the file in errors, e.g. "trace file".
Status WriteJsonFile(const std::string& path, const nlohmann::json& document,
                     const std::string& what);

}  // namespace multislice::runtime
