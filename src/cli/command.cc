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

std::vector<std::string> ApplyFlagAliases(std::vector<std::string> args) {
  if (args.empty()) return args;
  auto aliases = CommandFlagAliases().find(args[0]);
  if (aliases == CommandFlagAliases().end()) return args;
  for (size_t i = 1; i < args.size(); ++i) {
    auto it = aliases->second.find(args[i]);
    if (it != aliases->second.end()) args[i] = it->second;
  }
  return args;
}

}  // namespace multislice::cli
