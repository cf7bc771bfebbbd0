// MaxText's keys (the table in maxtext_keys.inc) and its way of typing YAML
// values: OmegaConf's resolvers (YAML 1.1 integers and floats, underscores
// allowed; true/false in three cases; null, ~ and an empty value) and
// pyconfig's top-level "none" rule. A quoted scalar is always a string.
#include "train/maxtext_keys.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <unordered_map>
#include <vector>

namespace multislice {
namespace {

using enum MaxTextKeyStatus;

#include "train/maxtext_keys.inc"

std::string Lowered(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return text;
}

std::string WithoutUnderscores(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
  return text;
}

// A plain (unquoted) scalar, as OmegaConf's YAML loader resolves it.
nlohmann::json PlainScalar(const std::string& text) {
  static const std::regex kInteger("[-+]?[0-9][0-9_]*");
  static const std::regex kFloat(
      "[-+]?(\\.[0-9]+|[0-9][0-9_]*(\\.[0-9_]*)?)([eE][-+]?[0-9]+)?");
  static const std::regex kSpecialFloat(
      "[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)");
  if (text.empty() || text == "~" || text == "null" || text == "Null" ||
      text == "NULL") {
    return nullptr;
  }
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  if (std::regex_match(text, kInteger)) {
    const std::string digits = WithoutUnderscores(text);
    const char* begin = digits.data() + (digits[0] == '+' ? 1 : 0);
    int64_t value = 0;
    auto [end, ec] =
        std::from_chars(begin, digits.data() + digits.size(), value);
    if (ec == std::errc()) return value;
    return std::strtod(digits.c_str(), nullptr);  // beyond int64: a float
  }
  if (std::regex_match(text, kFloat)) {
    return std::strtod(WithoutUnderscores(text).c_str(), nullptr);
  }
  if (std::regex_match(text, kSpecialFloat)) {
    if (text.find_first_of("nN") != std::string::npos) return NAN;
    return text[0] == '-' ? -HUGE_VAL : HUGE_VAL;
  }
  return text;
}

nlohmann::json Typed(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      // yaml-cpp tags a quoted scalar "!" and a plain one "?".
      return node.Tag() == "!" ? nlohmann::json(node.Scalar())
                               : PlainScalar(node.Scalar());
    case YAML::NodeType::Sequence: {
      nlohmann::json list = nlohmann::json::array();
      for (const YAML::Node& entry : node) list.push_back(Typed(entry));
      return list;
    }
    case YAML::NodeType::Map: {
      nlohmann::json map = nlohmann::json::object();
      for (const auto& entry : node) {
        map[entry.first.Scalar()] = Typed(entry.second);
      }
      return map;
    }
    default:
      return nullptr;
  }
}

// pyconfig: a top-level string "none", in any case, is None.
nlohmann::json NoneRule(nlohmann::json value) {
  if (value.is_string() && Lowered(value.get<std::string>()) == "none") {
    return nullptr;
  }
  return value;
}

std::string ValueError(std::string_view key, const std::string& shown,
                       const std::string& where, const std::string& expected) {
  return "key '" + std::string(key) + "' = '" + shown + "' in " + where +
         ": expected " + expected;
}

// The honoured keys that set TrainConfig through a conversion.
Status ApplyConversion(const MaxTextKey& key, const nlohmann::json& value,
                       const std::string& shown, const std::string& where,
                       MaxTextConversions& c, TrainConfig& config) {
  const std::string_view name = key.name;
  if (name == "warmup_steps_fraction") {
    if (!value.is_number() || value.get<double>() < 0 ||
        value.get<double>() > 1) {
      return InvalidArgument(
          ValueError(name, shown, where, "a number >= 0 and <= 1"));
    }
    c.warmup_steps_fraction = value.get<double>();
    c.warmup_where = where;
    return OkStatus();
  }
  if (name == "override_model_config") {  // read by the loader
    if (value.is_boolean()) return OkStatus();
    return InvalidArgument(ValueError(name, shown, where, "true or false"));
  }
  if (!value.is_number_integer() || value.get<int64_t>() < -1 ||
      value.get<int64_t>() > INT_MAX) {
    return InvalidArgument(
        ValueError(name, shown, where, "-1 or an integer >= 0"));
  }
  const int number = value.get<int>();
  if (name == "learning_rate_schedule_steps") {
    c.learning_rate_schedule_steps = number;
    c.schedule_where = where;
  } else if (name == "eval_steps") {
    // MaxText's -1 is the whole eval split; here eval_batches stays.
    if (number > 0) config.eval_batches = number;
  } else {
    return Internal("MaxText key '" + std::string(name) +
                    "' is honoured but has no conversion");
  }
  return OkStatus();
}

}  // namespace

std::span<const MaxTextKey> MaxTextKeys() { return kMaxTextKeyTable; }

const MaxTextKey* FindMaxTextKey(std::string_view name) {
  static const auto* const kByName = [] {
    auto* map = new std::unordered_map<std::string_view, const MaxTextKey*>;
    for (const MaxTextKey& key : kMaxTextKeyTable) (*map)[key.name] = &key;
    return map;
  }();
  auto it = kByName->find(name);
  return it == kByName->end() ? nullptr : it->second;
}

std::string_view MaxTextStatusName(MaxTextKeyStatus status) {
  switch (status) {
    case kHonoured:
      return "honoured";
    case kDefaultOnly:
      return "default only";
    case kIgnored:
      return "ignored";
  }
  return "";
}

nlohmann::json MaxTextValue(const YAML::Node& node) {
  return NoneRule(Typed(node));
}

nlohmann::json MaxTextValue(const std::string& text) {
  try {
    return MaxTextValue(YAML::Load(text));
  } catch (const YAML::Exception&) {
    return NoneRule(nlohmann::json(text));  // OmegaConf keeps it a string
  }
}

bool SameMaxTextValue(const nlohmann::json& a, const nlohmann::json& b) {
  // nlohmann compares integers with floats by value and containers element
  // by element, as Python does; a bool never equals a number here.
  return a == b;
}

Status CheckMaxTextDefault(const MaxTextKey& key, const nlohmann::json& value,
                           const std::string& shown, const std::string& where) {
  const nlohmann::json default_value =
      MaxTextValue(YAML::Load(key.default_yaml));
  if (SameMaxTextValue(value, default_value)) return OkStatus();
  const std::string instead = key.note;
  return InvalidArgument("key '" + std::string(key.name) + "' = '" + shown +
                         "' in " + where +
                         ": this trainer does not implement it, so only "
                         "MaxText's default " +
                         key.default_yaml + " is accepted" +
                         (instead.empty() ? "" : " (" + instead + ")"));
}

Status ApplyMaxTextKey(const MaxTextKey& key, const nlohmann::json& value,
                       const std::string& shown, const std::string& where,
                       MaxTextConversions& conversions, TrainConfig& config) {
  switch (key.status) {
    case kIgnored:
      return OkStatus();
    case kDefaultOnly:
      return CheckMaxTextDefault(key, value, shown, where);
    case kHonoured:
      return ApplyConversion(key, value, shown, where, conversions, config);
  }
  return OkStatus();
}

Result<std::string> OurSpelling(std::string_view key,
                                const nlohmann::json& value,
                                const std::string& text,
                                const std::string& where) {
  if (value.is_null()) {
    if (key == "max_num_checkpoints_to_keep") return std::to_string(INT_MAX);
    if (key == "num_diloco_fragments") return std::string("1");
  }
  if (key == "per_device_batch_size" && value.is_number_float()) {
    const double rows = value.get<double>();
    if (rows != std::floor(rows) || rows < INT_MIN || rows > INT_MAX) {
      return InvalidArgument(ValueError(
          key, text, where,
          "a whole number of sequences per device (MaxText's fractional "
          "per-device batches are not implemented here)"));
    }
    return std::to_string(static_cast<int>(rows));
  }
  return text;
}

Status ResolveMaxTextKeys(const MaxTextConversions& c, TrainConfig& config) {
  const int schedule = c.learning_rate_schedule_steps;
  if (config.steps == -1 && schedule > 0) config.steps = schedule;
  if (schedule != -1 && schedule != config.steps) {
    return InvalidArgument(
        "key 'learning_rate_schedule_steps' = " + std::to_string(schedule) +
        " in " + c.schedule_where + ": expected -1 or steps (" +
        std::to_string(config.steps) +
        "): the learning rate here warms up and decays over exactly the "
        "training steps");
  }
  if (c.warmup_steps_fraction && config.steps > 0) {
    config.warmup_steps =
        static_cast<int>(config.steps * *c.warmup_steps_fraction);
  }
  if (config.base_output_directory.empty()) {
    config.base_output_directory = "maxtext_output";  // MaxText's default
  }
  return OkStatus();
}

Result<std::string> FindModelFile(const std::string& model_name,
                                  const std::string& config_path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (model_name.ends_with(".yml") || model_name.ends_with(".yaml")) {
    if (fs::is_regular_file(model_name, error)) return model_name;
    return InvalidArgument("key 'model_name' = '" + model_name +
                           "': there is no such model file");
  }
  std::string name = model_name;
  if (const size_t at = name.find("-Instruct"); at != std::string::npos) {
    name.erase(at, std::strlen("-Instruct"));
  }
  const fs::path dir = fs::path(config_path).parent_path();
  std::vector<std::string> searched;
  for (const fs::path& place : {dir / "models", dir / ".." / "models", dir,
                                fs::path(MULTISLICE_CONFIGS_DIR) / "models"}) {
    std::string shown = place.lexically_normal().string();
    if (shown.empty()) shown = ".";
    if (std::find(searched.begin(), searched.end(), shown) != searched.end()) {
      continue;
    }
    searched.push_back(shown);
    const fs::path file = (place / (name + ".yml")).lexically_normal();
    if (fs::is_regular_file(file, error)) return file.string();
  }
  std::string places;
  for (size_t i = 0; i < searched.size(); ++i) {
    places += (i == 0                     ? ""
               : i + 1 == searched.size() ? " or "
                                          : ", ") +
              searched[i];
  }
  return InvalidArgument("key 'model_name' = '" + model_name +
                         "': there is no model file " + name + ".yml in " +
                         places);
}

}  // namespace multislice
