// How subcommands plug into the `multislice` binary.
//
// Each command file defines one `Add<Name>Command(CLI::App& root,
// CommandTable& table)` that declares its subcommand, flags and help (with an
// example) on `root`, and records in `table` the function that runs it once
// the command line has been parsed. That function returns the process exit
// code: 0 on success, 2 for bad input (after printing one line that names the
// flag or field, the value and what was expected), 1 for a runtime failure.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace multislice::cli {

using CommandTable = std::map<const CLI::App*, std::function<int()>>;

// The command line of this process, as main() received it. Commands that
// launch local workers re-run it in every worker.
std::vector<std::string>& CommandLine();

// Multi-letter short flags that CLI11 cannot declare (shardings.py's `-dd`,
// `-if`, ...), per command: main() rewrites them to their long names before
// parsing. Keyed by the command's name, e.g. "shardings".
using FlagAliases = std::map<std::string, std::string>;
std::map<std::string, FlagAliases>& CommandFlagAliases();

// args (without the program name) with the aliases of the command named by
// args[0] replaced by their long names.
std::vector<std::string> ApplyFlagAliases(std::vector<std::string> args);

}  // namespace multislice::cli
