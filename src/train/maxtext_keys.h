// MaxText's configuration keys: the 696 top-level keys of MaxText's base.yml
// (configs/maxtext/base.yml) with MaxText's default and what `multislice
// train` does with each (docs/maxtext_keys.md has the same table):
//
//   honoured      the key is one of TrainConfig's, or maps onto one (an
//                 alias or a conversion, done by LoadTrainConfig);
//   default only  not implemented here: the value must equal MaxText's
//                 default, compared as parsed YAML (numbers, strings, bools,
//                 null, lists, maps), else one sentence refuses it;
//   ignored       changes nothing here (XLA, TPU kernels, JAX sharding
//                 rules, inference tools): any value is accepted.
//
// Values are typed as MaxText reads them: OmegaConf's YAML (a command-line
// value is YAML too), then pyconfig's rule that a top-level string "none"
// (any case) is None.
#pragma once

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "train/config.h"

namespace multislice {

enum class MaxTextKeyStatus { kHonoured, kDefaultOnly, kIgnored };

struct MaxTextKey {
  const char* name;
  MaxTextKeyStatus status;
  const char* default_yaml;  // MaxText's default, as base.yml writes it
  const char* ours;          // kHonoured: the TrainConfig key it sets; else ""
  // kHonoured: the conversion, if any; kDefaultOnly: what this trainer does
  // instead (said in the refusal; may be empty); kIgnored: why it is.
  const char* note;
};

// Every key of MaxText's base.yml, in its order. Static storage.
std::span<const MaxTextKey> MaxTextKeys();

// The key named `name`, or nullptr.
const MaxTextKey* FindMaxTextKey(std::string_view name);

// "honoured", "default only" or "ignored" (the words of the doc's table).
std::string_view MaxTextStatusName(MaxTextKeyStatus status);

// `node` as MaxText reads it: null, bool, integer, float, string (a quoted
// scalar always), list or map; a top-level "none" string is null.
nlohmann::json MaxTextValue(const YAML::Node& node);

// A command-line value as OmegaConf reads it: `text` as YAML (a plain string
// where it is not YAML), typed as MaxTextValue.
nlohmann::json MaxTextValue(const std::string& text);

// Whether two typed values are equal as Python compares them: numbers by
// value (1 == 1.0), lists and maps element by element.
bool SameMaxTextValue(const nlohmann::json& a, const nlohmann::json& b);

// For a kDefaultOnly key: OK when `value` equals MaxText's default;
// otherwise kInvalidArgument naming the key, `shown` (the value as given),
// `where`, the default and what this trainer does instead.
Status CheckMaxTextDefault(const MaxTextKey& key, const nlohmann::json& value,
                           const std::string& shown, const std::string& where);

// The honoured MaxText keys that are not TrainConfig keys, as the layers of
// a load set them; ResolveMaxTextKeys applies them to the final config.
struct MaxTextConversions {
  // warmup_steps = int(schedule steps x fraction); a later warmup_steps
  // clears it (the later key wins).
  std::optional<double> warmup_steps_fraction;
  int learning_rate_schedule_steps = -1;     // -1 = steps
  std::string warmup_where, schedule_where;  // for errors
};

// Applies a key of MaxText's that is not a TrainConfig key (nor an alias of
// one): checks a kDefaultOnly key's value, accepts a kIgnored one, and
// records or applies a kHonoured one's conversion.
Status ApplyMaxTextKey(const MaxTextKey& key, const nlohmann::json& value,
                       const std::string& shown, const std::string& where,
                       MaxTextConversions& conversions, TrainConfig& config);

// MaxText's spellings of values of TrainConfig keys, as the text the key's
// own parser reads: None for max_num_checkpoints_to_keep (keep all:
// 2147483647) and num_diloco_fragments (1), a whole float for
// per_device_batch_size (12.0 = 12; a fraction is refused). Other values
// give `text` back.
Result<std::string> OurSpelling(std::string_view key,
                                const nlohmann::json& value,
                                const std::string& text,
                                const std::string& where);

// After every layer: steps -1 from learning_rate_schedule_steps, which must
// then equal steps; warmup_steps from warmup_steps_fraction; an empty
// base_output_directory becomes MaxText's maxtext_output.
Status ResolveMaxTextKeys(const MaxTextConversions& conversions,
                          TrainConfig& config);

// The model file of model_name=NAME, MaxText's layout: NAME.yml in the
// config file's models/, its ../models/, its own directory, then the
// project's configs/models/ (NAME without a "-Instruct" suffix, as MaxText
// looks it up); a NAME ending in .yml or .yaml is a path. kInvalidArgument
// naming where it looked when there is none.
Result<std::string> FindModelFile(const std::string& model_name,
                                  const std::string& config_path);

}  // namespace multislice
