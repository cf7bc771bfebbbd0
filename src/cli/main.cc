// The `multislice` binary: one executable, one subcommand per capability.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/command.h"
#include "cli/commands.h"
#include "cli/platform.h"

namespace multislice::cli {
namespace {

// Finds the innermost subcommand that was given on the command line.
const CLI::App* ParsedLeaf(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    return ParsedLeaf(*sub);
  }
  return &app;
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
    // One line for the user, naming the command it is about (e.g.
    // "multislice mesh: --ici_fsdp_parallelism: 'abc' is not an integer");
    // the full usage is one --help away.
    std::string command = "multislice";
    const CLI::App* leaf = &app;
    int depth = 1;
    while (!leaf->get_subcommands().empty()) {
      leaf = leaf->get_subcommands().front();
      command += " " + leaf->get_name();
      ++depth;
    }
    // A word where a command was expected: name it and the choices.
    std::vector<const CLI::App*> choices =
        leaf->get_subcommands([](const CLI::App*) { return true; });
    if (!choices.empty() && depth < argc && argv[depth][0] != '-') {
      std::string names;
      for (const CLI::App* c : choices) {
        names += (names.empty() ? "" : ", ") + c->get_name();
      }
      std::fprintf(stderr,
                   "%s: unknown command '%s': expected one of %s (see %s "
                   "--help)\n",
                   command.c_str(), argv[depth], names.c_str(),
                   command.c_str());
      return 2;
    }
    std::fprintf(stderr, "%s: %s (see %s --help)\n", command.c_str(), e.what(),
                 command.c_str());
    return 2;
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
