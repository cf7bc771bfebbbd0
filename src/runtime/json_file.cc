#include "runtime/json_file.h"

#include <filesystem>
#include <fstream>

namespace multislice::runtime {

Status WriteJsonFile(const std::string& path, const nlohmann::json& document,
                     const std::string& what) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return Internal("cannot write " + what + " " + tmp);
    out << document.dump();
    out.flush();
    if (!out) return Internal("cannot write " + what + " " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Internal("cannot rename " + tmp + ": " + ec.message());
  return OkStatus();
}

}  // namespace multislice::runtime
