// Tests for MaxText's key table: it lists exactly the keys of the shipped
// configs/maxtext/base.yml with their defaults, docs/maxtext_keys.md says
// the same, MaxText's YAML typing (known answers from OmegaConf's and
// pyconfig's rules), the default-only refusals, and the model-file lookup.
#include "train/maxtext_keys.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "common/temp_dir.h"

namespace multislice {
namespace {

// A file of the source tree (MULTISLICE_SOURCE_DIR is set by CMake).
std::string SourcePath(const std::string& relative) {
  return std::string(MULTISLICE_SOURCE_DIR) + "/" + relative;
}

TEST(MaxTextKeysTest, TableListsTheShippedBaseYmlKeysInOrder) {
  const YAML::Node root =
      YAML::LoadFile(SourcePath("configs/maxtext/base.yml"));
  std::vector<std::string> file_keys;
  for (const auto& entry : root) file_keys.push_back(entry.first.Scalar());
  EXPECT_EQ(file_keys.size(), 696u);
  std::vector<std::string> table_keys;
  for (const MaxTextKey& key : MaxTextKeys()) table_keys.push_back(key.name);
  EXPECT_EQ(table_keys, file_keys);
}

// Each default in the table is the file's value, typed the same way.
TEST(MaxTextKeysTest, TableDefaultsAreTheFilesValues) {
  const YAML::Node root =
      YAML::LoadFile(SourcePath("configs/maxtext/base.yml"));
  for (const auto& entry : root) {
    const MaxTextKey* key = FindMaxTextKey(entry.first.Scalar());
    ASSERT_NE(key, nullptr) << entry.first.Scalar();
    EXPECT_TRUE(SameMaxTextValue(MaxTextValue(entry.second),
                                 MaxTextValue(YAML::Load(key->default_yaml))))
        << key->name << ": " << key->default_yaml;
  }
}

TEST(MaxTextKeysTest, HonouredKeysNameATrainConfigKey) {
  const std::vector<std::string> ours = TrainConfigKeys();
  for (const MaxTextKey& key : MaxTextKeys()) {
    if (key.status != MaxTextKeyStatus::kHonoured) {
      EXPECT_STREQ(key.ours, "") << key.name;
      continue;
    }
    if (std::string(key.ours) == "(loader)") continue;  // override_model_config
    EXPECT_NE(std::find(ours.begin(), ours.end(), key.ours), ours.end())
        << key.name << " -> " << key.ours;
  }
  EXPECT_EQ(FindMaxTextKey("no_such_key"), nullptr);
}

// docs/maxtext_keys.md's table: one row `| key | status | ... |` per key.
TEST(MaxTextKeysTest, DocTableMatchesTheCodeTable) {
  std::ifstream doc(SourcePath("docs/maxtext_keys.md"));
  ASSERT_TRUE(doc.good());
  std::map<std::string, std::string> documented;
  std::string line;
  bool in_table = false;  // the rows after "## Every key"
  while (std::getline(doc, line)) {
    if (line.starts_with("## ")) in_table = line == "## Every key";
    if (!in_table || !line.starts_with("| `")) continue;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    std::string cell;
    while (std::getline(row, cell, '|')) {
      const size_t begin = cell.find_first_not_of(' ');
      const size_t end = cell.find_last_not_of(' ');
      cells.push_back(begin == std::string::npos
                          ? ""
                          : cell.substr(begin, end - begin + 1));
    }
    ASSERT_GE(cells.size(), 2u) << line;
    const std::string key = cells[0].substr(1, cells[0].size() - 2);
    EXPECT_TRUE(documented.emplace(key, cells[1]).second) << "twice: " << key;
  }
  std::map<std::string, std::string> coded;
  for (const MaxTextKey& key : MaxTextKeys()) {
    coded[key.name] = std::string(MaxTextStatusName(key.status));
  }
  for (const auto& [key, status] : coded) {
    auto it = documented.find(key);
    EXPECT_TRUE(it != documented.end() && it->second == status)
        << key << ": the code says " << status << ", the doc "
        << (it == documented.end() ? "nothing" : it->second);
  }
  for (const auto& [key, status] : documented) {
    EXPECT_TRUE(coded.contains(key)) << "the doc lists " << key;
  }
  EXPECT_EQ(documented.size(), 696u);
}

// OmegaConf's YAML 1.1 resolvers and pyconfig's "none" rule.
TEST(MaxTextKeysTest, ValuesAreTypedAsMaxTextReadsThem) {
  using nlohmann::json;
  const std::vector<std::pair<std::string, json>> known = {
      {"10_000", 10000},
      {"150_001", 150001},
      {"-1", -1},
      {"+3", 3},
      {"1.e-05", 1e-5},
      {"3.e-5", 3e-5},
      {"12.0", 12.0},
      {"0.", 0.0},
      {"1e-8", 1e-8},
      {"None", nullptr},
      {"none", nullptr},
      {"'None'", nullptr},  // pyconfig's rule reads the string, quoted or not
      {"null", nullptr},
      {"~", nullptr},
      {"", nullptr},
      {"True", true},
      {"FALSE", false},
      {"yes", "yes"},
      {"'1'", "1"},
      {"\"true\"", "true"},
      {"tfds", "tfds"},
      {"c4/en:3.1.0", "c4/en:3.1.0"},
      {"[]", json::array()},
      {"['silu', linear]", json::array({"silu", "linear"})},
      {"[[a, []], [b, [c]]]",
       json::array({json::array({"a", json::array()}),
                    json::array({"b", json::array({"c"})})})},
      {"{}", json::object()},
      {"{a: 1}", json{{"a", 1}}},
  };
  for (const auto& [text, expected] : known) {
    const json value = MaxTextValue(text);
    EXPECT_EQ(value, expected) << text;
    EXPECT_EQ(value.type(), expected.type()) << text;
  }
  EXPECT_EQ(MaxTextValue("[a"), "[a");  // not YAML: OmegaConf keeps a string
  // Python's equality: 1 == 1.0, element by element; a bool is no number.
  EXPECT_TRUE(
      SameMaxTextValue(MaxTextValue("[1, 2.0]"), MaxTextValue("[1.0, 2]")));
  EXPECT_TRUE(SameMaxTextValue(MaxTextValue("0"), MaxTextValue("0.0")));
  EXPECT_FALSE(SameMaxTextValue(MaxTextValue("1"), MaxTextValue("true")));
  EXPECT_FALSE(SameMaxTextValue(MaxTextValue("'1'"), MaxTextValue("1")));
  EXPECT_FALSE(SameMaxTextValue(MaxTextValue("{a: 1}"), MaxTextValue("{}")));
  EXPECT_FALSE(SameMaxTextValue(MaxTextValue("[1]"), MaxTextValue("1")));
  EXPECT_FALSE(SameMaxTextValue(MaxTextValue("''"), MaxTextValue("null")));
}

TEST(MaxTextKeysTest, DefaultOnlyKeysRefuseOtherValuesInOneSentence) {
  const MaxTextKey* mask = FindMaxTextKey("trainable_parameters_mask");
  ASSERT_NE(mask, nullptr);
  EXPECT_EQ(mask->status, MaxTextKeyStatus::kDefaultOnly);
  EXPECT_TRUE(CheckMaxTextDefault(*mask, MaxTextValue("[]"), "[]", "x").ok());
  EXPECT_EQ(CheckMaxTextDefault(*mask, MaxTextValue("['.*norm']"), "['.*norm']",
                                "the command line")
                .message(),
            "key 'trainable_parameters_mask' = '['.*norm']' in the command "
            "line: this trainer does not implement it, so only MaxText's "
            "default [] is accepted (every parameter is trained)");
  const MaxTextKey* sparsity = FindMaxTextKey("weight_sparsity_n");
  ASSERT_NE(sparsity, nullptr);
  EXPECT_TRUE(
      CheckMaxTextDefault(*sparsity, MaxTextValue("None"), "None", "x").ok());
  EXPECT_FALSE(
      CheckMaxTextDefault(*sparsity, MaxTextValue("2"), "2", "x").ok());
  const MaxTextKey* storage = FindMaxTextKey("checkpoint_storage_use_ocdbt");
  ASSERT_NE(storage, nullptr);
  EXPECT_EQ(storage->status, MaxTextKeyStatus::kIgnored);
}

class ModelFileTest : public ::testing::Test {
 protected:
  void Touch(const std::string& relative) {
    const std::filesystem::path path = dir_.path() + "/" + relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << "base_emb_dim: 8\n";
  }
  TempDir dir_;
};

// MaxText's order: the config's models/, then its ../models/; then the
// config's own directory and the project's configs/models/.
TEST_F(ModelFileTest, SearchOrderAndPaths) {
  const std::string config = dir_.path() + "/configs/maxtext/base.yml";
  Touch("configs/maxtext/base.yml");
  Touch("configs/models/m.yml");
  Result<std::string> found = FindModelFile("m", config);
  ASSERT_TRUE(found.ok()) << found.status().message();
  EXPECT_EQ(*found, dir_.path() + "/configs/models/m.yml");
  Touch("configs/maxtext/models/m.yml");
  EXPECT_EQ(*FindModelFile("m", config),
            dir_.path() + "/configs/maxtext/models/m.yml");
  EXPECT_EQ(*FindModelFile("m-Instruct", config),
            dir_.path() + "/configs/maxtext/models/m.yml");
  Touch("configs/maxtext/own.yml");
  EXPECT_EQ(*FindModelFile("own", config),
            dir_.path() + "/configs/maxtext/own.yml");
  // The project's own model files, from anywhere.
  Result<std::string> project = FindModelFile("gpt3-tiny", config);
  ASSERT_TRUE(project.ok()) << project.status().message();
  EXPECT_EQ(*project, SourcePath("configs/models/gpt3-tiny.yml"));
  // A path.
  EXPECT_EQ(*FindModelFile(dir_.path() + "/configs/models/m.yml", config),
            dir_.path() + "/configs/models/m.yml");
}

TEST_F(ModelFileTest, MissingModelFileNamesWhereItLooked) {
  const std::string config = dir_.path() + "/configs/maxtext/base.yml";
  Result<std::string> missing = FindModelFile("llama9-1t", config);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message(),
            "key 'model_name' = 'llama9-1t': there is no model file "
            "llama9-1t.yml in " +
                dir_.path() + "/configs/maxtext/models, " + dir_.path() +
                "/configs/models, " + dir_.path() + "/configs/maxtext or " +
                SourcePath("configs/models"));
  EXPECT_EQ(FindModelFile(dir_.path() + "/none.yml", config).status().message(),
            "key 'model_name' = '" + dir_.path() +
                "/none.yml': there is no such model file");
}

}  // namespace
}  // namespace multislice
