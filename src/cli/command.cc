#include "cli/command.h"

namespace multislice::cli {

std::vector<std::string>& CommandLine() {
  static std::vector<std::string> line;
  return line;
}

}  // namespace multislice::cli
