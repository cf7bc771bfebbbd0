#include "cli/command.h"

#include <algorithm>
#include <memory>
#include <sstream>

namespace multislice::cli {
namespace {

constexpr size_t kNameColumn = 24;  // where descriptions start in lists

std::map<const CLI::App*, std::string>& CommandSummaries() {
  static std::map<const CLI::App*, std::string> summaries;
  return summaries;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// Words of one line at spaces; continuation lines start with `indent`.
std::string WrapProse(const std::string& line, size_t indent, size_t width) {
  std::istringstream words(line);
  std::string word, out, current(indent, ' ');
  bool empty = true;
  while (words >> word) {
    if (!empty && current.size() + 1 + word.size() > width) {
      out += current + "\n";
      current = std::string(indent, ' ');
      empty = true;
    }
    current += (empty ? "" : " ") + word;
    empty = false;
  }
  return out + current;
}

// The shell words of a line, each with its quotes.
std::vector<std::string> ShellWords(const std::string& line) {
  std::vector<std::string> words;
  std::string word;
  char quote = 0;
  for (char c : line) {
    if (quote == 0 && c == ' ') {
      if (!word.empty()) words.push_back(word);
      word.clear();
      continue;
    }
    if (quote == 0 && (c == '\'' || c == '"')) {
      quote = c;
    } else if (c == quote) {
      quote = 0;
    }
    word += c;
  }
  if (!word.empty()) words.push_back(word);
  return words;
}

// Keeps a flag and its value on one line: "--paths ici" is one unit.
std::vector<std::string> FlagsWithValues(const std::vector<std::string>& w) {
  std::vector<std::string> units;
  for (size_t i = 0; i < w.size(); ++i) {
    const bool value_follows = i + 1 < w.size() && w[i][0] == '-' &&
                               w[i + 1][0] != '-' && w[i + 1][0] != '#' &&
                               w[i + 1] != "|" && w[i + 1][0] != '>';
    units.push_back(value_follows ? w[i] + " " + w[i + 1] : w[i]);
    if (value_follows) ++i;
  }
  return units;
}

// Splits a quoted word at its last space inside the quotes that keeps the
// first part within `room` columns (with the closing quote and "\"):
// 'a b c' -> 'a b '\ and 'c'. Returns false when there is no such space.
bool SplitQuoted(const std::string& word, size_t room, std::string* first,
                 std::string* rest) {
  const size_t open = word.find_first_of("'\"");
  if (open == std::string::npos || room < 3) return false;
  const char q = word[open];
  const size_t limit = std::min(word.size(), room - 2);
  for (size_t i = limit; i > open + 1; --i) {
    if (word[i - 1] != ' ') continue;
    if (word.find(q, open + 1) < i) return false;  // outside the quotes
    *first = word.substr(0, i) + q + "\\";
    *rest = q + word.substr(i);
    return true;
  }
  return false;
}

// An example command line, wrapped so that it still pastes into a shell.
std::string WrapShell(const std::string& line, size_t indent, size_t width) {
  const std::string more(indent + 4, ' ');
  std::string out, current(indent, ' ');
  bool empty = true;
  std::vector<std::string> words = FlagsWithValues(ShellWords(line));
  for (size_t i = 0; i < words.size(); ++i) {
    std::string word = words[i];
    const size_t sep = empty ? 0 : 1;
    if (current.size() + sep + word.size() + 2 <= width ||
        (i + 1 == words.size() &&
         current.size() + sep + word.size() <= width)) {
      current += (empty ? "" : " ") + word;
      empty = false;
      continue;
    }
    std::string first, rest;
    if (SplitQuoted(word, width - current.size() - sep, &first, &rest)) {
      // The rest starts at column 0: spaces before it would end the word.
      out += current + (empty ? "" : " ") + first + "\n";
      current.clear();
      words[i--] = rest;
      empty = true;
      continue;
    }
    if (!empty) {
      out += current + " \\\n";
      current = more;
      empty = true;
    }
    if (current.size() + word.size() + 2 > width &&
        SplitQuoted(word, width - current.size(), &first, &rest)) {
      out += current + first + "\n";
      current.clear();
      words[i--] = rest;
      continue;
    }
    current += word;
    empty = false;
  }
  return out + current;
}

bool IsExample(const std::string& trimmed, size_t indent) {
  if (indent < 2) return false;
  const size_t at = trimmed.find("multislice ");
  return at == 0 || (at != std::string::npos &&
                     trimmed.substr(0, at).find('=') != std::string::npos);
}

// The first sentence of a description, for lists without a summary.
std::string FirstSentence(const std::string& text) {
  std::string first = text.substr(0, text.find('\n'));
  const size_t stop = first.find(". ");
  if (stop != std::string::npos) first = first.substr(0, stop + 1);
  return first;
}

class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() {
    column_width(kNameColumn);
    label("SUBCOMMAND", "COMMAND");
    label("SUBCOMMANDS", "COMMANDS");
  }

  std::string make_description(const CLI::App* app) const override {
    // A blank line between the description and the usage.
    const std::string text = Wrap(CLI::Formatter::make_description(app));
    return text.empty() ? text : text + "\n";
  }
  std::string make_usage(const CLI::App* app, std::string name) const override {
    return Wrap(CLI::Formatter::make_usage(app, name));
  }
  std::string make_footer(const CLI::App* app) const override {
    // CLI11 copies a parent's footer into every subcommand: the root's
    // examples belong to `multislice --help` only.
    const CLI::App* parent = app->get_parent();
    if (parent != nullptr && parent->get_footer() == app->get_footer()) {
      return "";
    }
    return Wrap(CLI::Formatter::make_footer(app));
  }
  std::string make_subcommand(const CLI::App* sub) const override {
    auto it = CommandSummaries().find(sub);
    return Column(sub->get_display_name(true),
                  it != CommandSummaries().end()
                      ? it->second
                      : FirstSentence(sub->get_description()));
  }
  std::string make_option(const CLI::Option* opt,
                          bool is_positional) const override {
    return Column(make_option_name(opt, is_positional) + make_option_opts(opt),
                  make_option_desc(opt));
  }

 private:
  static std::string Wrap(const std::string& text) {
    if (text.empty()) return text;
    std::string out = WrapHelpText(text, kHelpWidth);
    return text.back() == '\n' && out.back() != '\n' ? out + "\n" : out;
  }

  // "  name" padded to the column, then the description wrapped beside it.
  std::string Column(const std::string& name, const std::string& desc) const {
    std::string out = "  " + name;
    if (desc.empty()) return out + "\n";
    if (out.size() >= column_width_) {
      out += "\n" + std::string(column_width_, ' ');
    } else {
      out += std::string(column_width_ - out.size(), ' ');
    }
    bool first = true;
    for (const std::string& line : SplitLines(desc)) {
      std::string wrapped = WrapProse(line, column_width_, kHelpWidth);
      out += first ? wrapped.substr(column_width_) : "\n" + wrapped;
      first = false;
    }
    return out + "\n";
  }
};

}  // namespace

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

std::string WrapHelpText(const std::string& text, size_t width) {
  std::string out;
  bool continued = false;  // the line before was an example ending in '\'
  for (const std::string& line : SplitLines(text)) {
    if (!out.empty()) out += "\n";
    const size_t indent = std::min(line.find_first_not_of(' '), line.size());
    const std::string trimmed = line.substr(indent);
    const bool example = continued || IsExample(trimmed, indent);
    continued = example && !line.empty() && line.back() == '\\';
    if (line.size() <= width) {
      out += line;
    } else if (example) {
      out += WrapShell(trimmed, indent, width);
    } else {
      out += WrapProse(trimmed, indent, width);
    }
  }
  return out;
}

void RegisterCommand(CLI::App& root, CommandTable& table, const char* group,
                     const char* summary, AddCommandFunction add) {
  const size_t before = root.get_subcommands({}).size();
  add(root, table);
  std::vector<CLI::App*> all = root.get_subcommands({});
  for (size_t i = before; i < all.size(); ++i) {
    all[i]->group(group);
    CommandSummaries()[all[i]] = summary;
  }
}

void ConfigureRootApp(CLI::App& root) {
  root.formatter(std::make_shared<HelpFormatter>());
  root.description(
      "multislice: one training job across several slices of accelerators "
      "(Cloud TPU Multislice, rebuilt on CPU devices).");
  root.footer(
      "Examples:\n"
      "  multislice mesh --accelerator_type cpu-4 --num_slices 2 "
      "--dcn_data_parallelism 2 --ici_fsdp_parallelism 4\n"
      "  multislice shardings -dd 2 -if 2          # 2 slices of 2 devices\n"
      "  multislice train configs/quickstart.yml\n"
      "  multislice plan --accelerator_type v4-16 --num_slices 4\n"
      "  multislice bench collectives --num_slices 2 --accelerator_type cpu-2 "
      "--maxbytes 64M\n"
      "  multislice controller --port 8470 --data-dir runs/controller "
      "--local-hosts 4\n"
      "  multislice queued-resources create my-qr --accelerator-type cpu-2 "
      "--node-count 2\n"
      "\n"
      "Run 'multislice help COMMAND' (or 'multislice COMMAND --help') for a "
      "command's flags and examples, and 'multislice --help-all' for every "
      "command's.");
}

}  // namespace multislice::cli
