// Flag helpers: dual spellings, and values parsed by us so that every bad
// value is one sentence naming the flag (by its underscore name), the value
// and what was expected.
#include "cli/flags.h"

#include <cctype>
#include <charconv>
#include <climits>
#include <string_view>

namespace multislice::cli {
namespace {

std::string Dashed(std::string name) {
  for (char& c : name) {
    if (c == '_') c = '-';
  }
  return name;
}

std::string Lower(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return lower;
}

}  // namespace

std::string FlagNames(const std::string& underscore_name,
                      const std::string& short_name) {
  std::string names = "--" + underscore_name;
  const std::string dashed = Dashed(underscore_name);
  if (dashed != underscore_name) names += ",--" + dashed;
  if (!short_name.empty()) {
    names += "," + (short_name[0] == '-' ? short_name : "-" + short_name);
  }
  return names;
}

std::optional<long long> ParseInteger(const std::string& text) {
  std::string_view digits = text;
  if (!digits.empty() && digits[0] == '-') digits.remove_prefix(1);
  if (digits.empty()) return std::nullopt;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  long long value = 0;
  auto [end, error] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

namespace {

// An integer option of `names`, its errors naming `flag`.
CLI::Option* IntOption(CLI::App* app, const std::string& names,
                       const std::string& flag, int* target,
                       const std::string& description) {
  CLI::Option* option = app->add_option_function<std::string>(
      names,
      [flag, target](const std::string& text) {
        const std::optional<long long> value = ParseInteger(text);
        if (!value) {
          throw CLI::ValidationError(flag, "'" + text + "' is not an integer");
        }
        if (*value < INT_MIN || *value > INT_MAX) {
          throw CLI::ValidationError(flag,
                                     "'" + text + "' is not an integer from " +
                                         std::to_string(INT_MIN) + " to " +
                                         std::to_string(INT_MAX));
        }
        *target = static_cast<int>(*value);
      },
      description);
  return option->type_name("INT")
      ->default_str(std::to_string(*target))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

CLI::Option* StringOption(CLI::App* app, const std::string& names,
                          std::string* target, const std::string& description) {
  CLI::Option* option = app->add_option_function<std::string>(
      names, [target](const std::string& text) { *target = text; },
      description);
  option->type_name("TEXT")->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  if (!target->empty()) option->default_str(*target);
  return option;
}

}  // namespace

CLI::Option* AddIntFlag(CLI::App* app, const std::string& underscore_name,
                        int* target, const std::string& description) {
  return IntOption(app, FlagNames(underscore_name), "--" + underscore_name,
                   target, description);
}

CLI::Option* AddSizeFlag(CLI::App* app, const std::string& underscore_name,
                         long long* target, const std::string& description) {
  const std::string flag = "--" + underscore_name;
  CLI::Option* option = app->add_option_function<std::string>(
      FlagNames(underscore_name),
      [flag, target](const std::string& text) {
        const long long bytes = ParseByteSize(text);
        if (bytes < 0) {
          throw CLI::ValidationError(
              flag,
              "'" + text + "' is not a byte size (e.g. 1048576, 64K, 256MiB)");
        }
        *target = bytes;
      },
      description);
  return option->type_name("SIZE")
      ->default_str(std::to_string(*target))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

CLI::Option* AddStringFlag(CLI::App* app, const std::string& underscore_name,
                           std::string* target,
                           const std::string& description) {
  return StringOption(app, FlagNames(underscore_name), target, description);
}

CLI::Option* AddBoolFlag(CLI::App* app, const std::string& underscore_name,
                         bool* target, const std::string& description) {
  return app->add_flag(FlagNames(underscore_name), *target, description);
}

CLI::Option* AddIntAlias(CLI::App* app, const std::string& alias, int* target) {
  return IntOption(app, "--" + alias, "--" + alias, target, "")->group("");
}

CLI::Option* AddStringAlias(CLI::App* app, const std::string& alias,
                            std::string* target) {
  return StringOption(app, "--" + alias, target, "")->group("");
}

CLI::Option* AddBoolAlias(CLI::App* app, const std::string& alias,
                          bool* target) {
  const std::string flag = "--" + alias;
  CLI::Option* option = app->add_option_function<std::string>(
      flag,
      [flag, target](const std::string& text) {
        const std::string value = Lower(text);
        if (value.empty() || value == "true" || value == "1" ||
            value == "yes") {
          *target = true;
        } else if (value == "false" || value == "0" || value == "no") {
          *target = false;
        } else {
          throw CLI::ValidationError(flag,
                                     "'" + text + "' is not true or false");
        }
      },
      "");
  return option->expected(0, 1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->group("");
}

std::string Spelled(const CLI::App* app, const std::string& underscore_name,
                    const std::string& alias) {
  const CLI::Option* option = app->get_option_no_throw("--" + alias);
  return option != nullptr && option->count() > 0 ? "--" + alias
                                                  : "--" + underscore_name;
}

void AddParallelismFlags(CLI::App* app, mesh::ParallelismConfig* config) {
  for (int i = 0; i < mesh::kNumAxes; ++i) {
    const std::string axis = mesh::kAxisNames[i];
    AddIntFlag(app,
               "ici_" + std::string(mesh::kAxisKeyWords[i]) + "_parallelism",
               &config->ici[i],
               "Devices of each slice along the " + axis +
                   " axis, over ICI; the ici values multiply to the devices "
                   "per slice (-1: whatever the others leave).");
  }
  for (int i = 0; i < mesh::kNumAxes; ++i) {
    const std::string axis = mesh::kAxisNames[i];
    AddIntFlag(app,
               "dcn_" + std::string(mesh::kAxisKeyWords[i]) + "_parallelism",
               &config->dcn[i],
               "Slices along the " + axis +
                   " axis, over DCN; the dcn values multiply to the number "
                   "of slices (-1: whatever the others leave).");
  }
}

long long ParseByteSize(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') {
    ++digits;
  }
  if (digits == 0) return -1;
  unsigned long long number = 0;
  auto [end, error] =
      std::from_chars(text.data(), text.data() + digits, number);
  if (error != std::errc() || end != text.data() + digits) return -1;

  const std::string suffix = Lower(std::string_view(text).substr(digits));
  int shift = 0;  // K/M/G/T are binary: 1K = 1024 bytes
  if (suffix.empty() || suffix == "b") {
    shift = 0;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    shift = 10;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    shift = 20;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    shift = 30;
  } else if (suffix == "t" || suffix == "tb" || suffix == "tib") {
    shift = 40;
  } else {
    return -1;
  }
  if (number > (static_cast<unsigned long long>(LLONG_MAX) >> shift)) {
    return -1;
  }
  return static_cast<long long>(number << shift);
}

}  // namespace multislice::cli
