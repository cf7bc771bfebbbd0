#include "cli/command.h"

namespace multislice::cli {

std::vector<std::string>& CommandLine() {
  static std::vector<std::string> line;
  return line;
}

std::map<std::string, FlagAliases>& CommandFlagAliases() {
  static std::map<std::string, FlagAliases> aliases;
  return aliases;
}

}  // namespace multislice::cli
