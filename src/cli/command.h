// How subcommands plug into the `multislice` binary.
//
// Each command file defines one `Add<Name>Command(CLI::App& root,
// CommandTable& table)` that declares its subcommand, flags and help (with an
// example) on `root`, and records in `table` the function that runs it once
// the command line has been parsed. That function returns the process exit
// code: 0 on success, 2 for bad input (after printing one line that names the
// flag or field, the value and what was expected), 1 for a runtime failure.
// commands.h registers each one under a help group with a one-line summary.
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

// The groups of `multislice --help`, listed in the order of their first
// command's registration.
inline constexpr char kTrainGroup[] = "Train and measure";
inline constexpr char kPlanGroup[] = "Plan";
inline constexpr char kClusterGroup[] = "Queued resources and clusters";
inline constexpr char kBenchmarkGroup[] = "Benchmarks";
// Where a command added without RegisterCommand is listed.
inline constexpr char kOtherGroup[] = "Other commands";

using AddCommandFunction = void (*)(CLI::App& root, CommandTable& table);

// Runs `add` (which declares one command on `root`) and lists that command
// in `multislice --help` under `group` with `summary`, one short line.
void RegisterCommand(CLI::App& root, CommandTable& table, const char* group,
                     const char* summary, AddCommandFunction add);

// Help lines are wrapped at this many columns, in every command's --help.
inline constexpr size_t kHelpWidth = 100;

// Sets up `root` as the `multislice` app: its description, examples and the
// `multislice help COMMAND` pointer, and the help formatter every command
// added afterwards inherits (groups, one-line summaries, wrapping).
void ConfigureRootApp(CLI::App& root);

// Wraps every line of `text` longer than `width`: prose at spaces, with the
// continuation indented as its line; an indented example command line at
// spaces outside quotes, ending the line with " \" (a quoted word too long
// for a line is split inside its quotes as 'a '\<newline>'b', which the
// shell reads as one word), so that examples still paste into a shell.
std::string WrapHelpText(const std::string& text, size_t width);

}  // namespace multislice::cli
