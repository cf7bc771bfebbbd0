#include "train/prometheus_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "common/temp_dir.h"

namespace multislice::train {
namespace {

// What a scraper reads from a text exposition: each family's help and type,
// and its one sample's labels and value. Written from the format's
// description (0.0.4), independently of the formatter.
struct Family {
  std::string help, type;
  std::map<std::string, std::string> labels;
  double value = 0;
  bool sampled = false;
};

std::string Unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out += text[i];
      continue;
    }
    const char c = text[++i];
    out += c == 'n' ? '\n' : c;
  }
  return out;
}

// Label pairs of `{a="x",b="y"}`; quoted values may hold escaped quotes.
std::map<std::string, std::string> ParseLabels(const std::string& text) {
  std::map<std::string, std::string> labels;
  size_t at = 1;
  while (at < text.size() && text[at] != '}') {
    const size_t eq = text.find('=', at);
    const std::string name = text.substr(at, eq - at);
    size_t end = eq + 2;
    while (text[end] != '"') end += text[end] == '\\' ? 2 : 1;
    labels[name] = Unescape(text.substr(eq + 2, end - eq - 2));
    at = end + 1;
    if (text[at] == ',') ++at;
  }
  return labels;
}

double ParseValue(const std::string& text) {
  if (text == "NaN") return std::nan("");
  if (text == "+Inf") return INFINITY;
  if (text == "-Inf") return -INFINITY;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  EXPECT_EQ(*end, '\0') << "value '" << text << "'";
  return v;
}

// Every line is a HELP, a TYPE (both before the family's sample) or a
// sample of a declared family; fails the test otherwise.
std::map<std::string, Family> Parse(const std::string& text) {
  const std::regex name_re("[a-zA-Z_:][a-zA-Z0-9_:]*");
  std::map<std::string, Family> families;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const size_t space = line.find(' ', 7);
      const std::string name = line.substr(7, space - 7);
      EXPECT_TRUE(std::regex_match(name, name_re)) << line;
      Family& f = families[name];
      EXPECT_FALSE(f.sampled) << "metadata after the sample: " << line;
      (line[2] == 'H' ? f.help : f.type) = Unescape(line.substr(space + 1));
      continue;
    }
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    const std::string name = line.substr(0, std::min(brace, space));
    if (!families.count(name)) {
      ADD_FAILURE() << "undeclared sample: " << line;
      continue;
    }
    Family& f = families[name];
    EXPECT_FALSE(f.help.empty() || f.type.empty()) << line;
    if (brace != std::string::npos) {
      f.labels = ParseLabels(line.substr(brace, space - brace));
    }
    f.value = ParseValue(line.substr(space + 1));
    f.sampled = true;
  }
  EXPECT_TRUE(text.empty() || text.back() == '\n');
  return families;
}

TEST(PrometheusFileTest, ValuesAndEscapesReadBack) {
  const std::vector<PrometheusMetric> metrics = {
      {"a_total", "counts \\ and\nlines", PrometheusType::kCounter,
       12345678901},
      {"b", "a ratio", PrometheusType::kGauge, 0.1 + 0.2},
      {"c", "not a number", PrometheusType::kGauge, std::nan("")},
      {"d", "infinite", PrometheusType::kGauge, -INFINITY},
      {"e", "tiny", PrometheusType::kGauge, 1e-300}};
  const std::string text = FormatPrometheusText(
      metrics, {{"run", "a \"quoted\" \\ run\nname"}, {"attempt", "2"}});
  const std::map<std::string, Family> parsed = Parse(text);
  ASSERT_EQ(parsed.size(), metrics.size()) << text;
  for (const PrometheusMetric& m : metrics) {
    const Family& f = parsed.at(m.name);
    EXPECT_EQ(f.help, m.help);
    EXPECT_EQ(f.type, m.type == PrometheusType::kCounter ? "counter" : "gauge");
    EXPECT_EQ(f.labels.at("run"), "a \"quoted\" \\ run\nname");
    EXPECT_EQ(f.labels.at("attempt"), "2");
    if (std::isnan(m.value)) {
      EXPECT_TRUE(std::isnan(f.value));
    } else {
      EXPECT_EQ(f.value, m.value) << m.name;  // the shortest exact decimal
    }
  }
}

TEST(PrometheusFileTest, TrainingMetricsCarryTheSampleAndTheRun) {
  TrainingSample s;
  s.step = 42;
  s.loss = 2.718281828;
  s.learning_rate = 3e-4;
  s.grad_norm = 0.75;
  s.step_seconds = 0.125;
  s.tokens_per_second = 1024.5;
  s.goodput = 0.93;
  s.step_dcn_bytes = 4096;
  s.dcn_bytes_total = 1u << 20;
  std::map<std::string, Family> f = Parse(FormatTrainingMetrics("demo", s));
  EXPECT_EQ(f.count("multislice_train_mfu_ratio"), 0u) << "no peak: no MFU";
  EXPECT_EQ(f.at("multislice_train_step").value, 42);
  EXPECT_EQ(f.at("multislice_train_loss").value, s.loss);
  EXPECT_EQ(f.at("multislice_train_learning_rate").value, s.learning_rate);
  EXPECT_EQ(f.at("multislice_train_grad_norm").value, s.grad_norm);
  EXPECT_EQ(f.at("multislice_train_step_seconds").value, s.step_seconds);
  EXPECT_EQ(f.at("multislice_train_tokens_per_second").value, 1024.5);
  EXPECT_EQ(f.at("multislice_train_goodput_ratio").value, 0.93);
  EXPECT_EQ(f.at("multislice_train_step_dcn_bytes").value, 4096);
  EXPECT_EQ(f.at("multislice_train_dcn_bytes_total").type, "counter");
  EXPECT_EQ(f.at("multislice_train_dcn_bytes_total").value, 1 << 20);
  for (const auto& [name, family] : f) {
    EXPECT_EQ(family.labels.at("run"), "demo") << name;
  }
  s.mfu = 0.41;
  f = Parse(FormatTrainingMetrics("demo", s));
  EXPECT_EQ(f.at("multislice_train_mfu_ratio").value, 0.41);
}

TEST(PrometheusFileTest, RewritesByRenameAndLeavesNoTemporaryFile) {
  TempDir dir("multislice-prometheus-");
  const std::string path = dir.path() + "/train.prom";
  ASSERT_TRUE(WritePrometheusFile(path, "old 1\n").ok());
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  ASSERT_TRUE(WritePrometheusFile(path, "new 2\n").ok());
  struct stat after {};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  // A rename puts a new inode in place; a rewrite in place would keep it
  // (and a scrape could read half a file).
  EXPECT_NE(before.st_ino, after.st_ino);
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "new 2\n");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(e.path().filename(), "train.prom");
  }
  EXPECT_EQ(files, 1);
}

TEST(PrometheusFileTest, AMissingDirectoryIsOneSentenceNamingTheFile) {
  TempDir dir("multislice-prometheus-");
  const std::string path = dir.path() + "/missing/train.prom";
  const Status s = WritePrometheusFile(path, "x 1\n");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "cannot write the Prometheus file: cannot create " +
                             path + ".tmp." + std::to_string(::getpid()) +
                             ": No such file or directory");
}

}  // namespace
}  // namespace multislice::train
