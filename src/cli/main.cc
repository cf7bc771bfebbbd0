// The `multislice` binary: one executable, one subcommand per capability.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/command.h"
#include "cli/commands.h"
#include "cli/platform.h"
#include "common/suggest.h"

namespace multislice::cli {
namespace {

// Finds the innermost subcommand that was given on the command line.
const CLI::App* ParsedLeaf(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    return ParsedLeaf(*sub);
  }
  return &app;
}

// The flag names `leaf` takes, with their dashes ("--num_slices", "-n").
std::vector<std::string> FlagNames(const CLI::App& leaf) {
  std::vector<std::string> names;
  for (const CLI::Option* o :
       leaf.get_options([](const CLI::Option*) { return true; })) {
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : o->get_snames()) names.push_back("-" + s);
  }
  return names;
}

// The first of `given` that is a flag `leaf` does not take, as typed
// without its "=value"; empty when there is none.
std::string UnknownFlag(const CLI::App& leaf,
                        const std::vector<std::string>& given) {
  const std::vector<std::string> known = FlagNames(leaf);
  for (const std::string& arg : given) {
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") continue;
    if (arg[1] != '-' && std::isdigit(static_cast<unsigned char>(arg[1]))) {
      continue;  // a negative number
    }
    const std::string name = arg.substr(0, arg.find('='));
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return name;
    }
  }
  return "";
}

// "; did you mean 'X'?" when X of `known` is close to `word`.
std::string DidYouMean(const std::string& word,
                       const std::vector<std::string>& known) {
  const std::string closest = ClosestName(word, known);
  return closest.empty() ? "" : "; did you mean '" + closest + "'?";
}

// One line for the user, naming the command it is about (e.g.
// "multislice mesh: --ici_fsdp_parallelism: 'abc' is not an integer"),
// with the closest flag or command to a mistyped one; exit code 2. The
// full usage is one --help away.
int ReportParseError(const CLI::App& app, const CLI::ParseError& e,
                     const std::vector<std::string>& given) {
  std::string command = "multislice";
  const CLI::App* leaf = &app;
  size_t depth = 0;
  while (!leaf->get_subcommands().empty()) {
    leaf = leaf->get_subcommands().front();
    command += " " + leaf->get_name();
    ++depth;
  }
  const std::string see = " (see " + command + " --help)";
  // A word where a command was expected: name it and the choices.
  std::vector<const CLI::App*> choices =
      leaf->get_subcommands([](const CLI::App*) { return true; });
  if (!choices.empty() && depth < given.size() && given[depth][0] != '-') {
    std::vector<std::string> names;
    std::string list;
    for (const CLI::App* c : choices) {
      names.push_back(c->get_name());
      list += (list.empty() ? "" : ", ") + c->get_name();
    }
    std::fprintf(stderr,
                 "%s: unknown command '%s'%s (expected one of %s; see %s "
                 "--help)\n",
                 command.c_str(), given[depth].c_str(),
                 DidYouMean(given[depth], names).c_str(), list.c_str(),
                 command.c_str());
    return 2;
  }
  const std::string unknown =
      dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr
          ? UnknownFlag(*leaf, given)
          : "";
  if (!unknown.empty()) {
    std::fprintf(stderr, "%s: unknown flag %s%s%s\n", command.c_str(),
                 unknown.c_str(), DidYouMean(unknown, FlagNames(*leaf)).c_str(),
                 see.c_str());
    return 2;
  }
  std::fprintf(stderr, "%s: %s%s\n", command.c_str(), e.what(), see.c_str());
  return 2;
}

int Main(int argc, char** argv) {
  CLI::App app{"", "multislice"};
  ConfigureRootApp(app);  // before the commands, which inherit its help
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Print help for every command.");
  app.set_version_flag("--version", "multislice " MULTISLICE_VERSION);
  CommandLine().assign(argv, argv + argc);
  CommandTable table;
  AddAllCommands(app, table);
  // Rewrite a command's multi-letter short flags (e.g. shardings' -dd).
  std::vector<std::string> args =
      ApplyFlagAliases(std::vector<std::string>(argv + 1, argv + argc));
  // `multislice help [COMMAND...]`, as git and gcloud take it.
  if (!args.empty() && args.front() == "help") {
    args.erase(args.begin());
    args.push_back("--help");
  }
  const std::vector<std::string> given = args;
  std::reverse(args.begin(), args.end());  // CLI11 takes them reversed
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return ReportParseError(app, e, given);
  }
  auto it = table.find(ParsedLeaf(app));
  if (it == table.end()) {
    std::fprintf(stderr, "multislice: choose a command (see --help)\n");
    return 2;
  }
  if (Status cap = CheckIsaCap(); !cap.ok()) {
    std::string command = "multislice";
    for (const CLI::App* leaf = &app; !leaf->get_subcommands().empty();) {
      leaf = leaf->get_subcommands().front();
      command += " " + leaf->get_name();
    }
    std::fprintf(stderr, "%s: %s\n", command.c_str(), cap.message().c_str());
    return 2;
  }
  return it->second();
}

}  // namespace
}  // namespace multislice::cli

int main(int argc, char** argv) { return multislice::cli::Main(argc, argv); }
