// `multislice bench collectives` end to end: its table parses as nccl-tests'
// (all_reduce_perf and friends) does for the parsers people use on it.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"

namespace multislice::cli {
namespace {

using testing_util::ReadFile;

// A row as the common nccl-tests parsers read it: every line that is not a
// comment is a data line of 13 columns.
struct DataLine {
  long long size = 0, count = 0;
  std::string type, redop;
  int root = 0;
  double time[2] = {0, 0}, algbw[2] = {0, 0}, busbw[2] = {0, 0};
  long long wrong[2] = {0, 0};
};

struct Parsed {
  std::vector<DataLine> rows;
  std::vector<std::string> stray;  // neither comment, blank nor data
  bool saw_groups = false, saw_columns = false;
  std::string out_of_bounds;
  double avg_busbw = -1;
};

Parsed ParseNcclTests(const std::string& out) {
  static const std::regex data(
      R"(^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+))"
      R"(\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+))"
      R"(\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s*$)");
  static const std::regex avg(R"(^# Avg bus bandwidth\s*:\s*([\d.eE+-]+))");
  static const std::regex oob(R"(^# Out of bounds values\s*:\s*(\d+ \w+))");
  static const std::regex columns(
      R"(^#\s+size\s+count\s+type\s+redop\s+root\s+time\s+algbw\s+busbw)"
      R"(\s+#wrong\s+time\s+algbw\s+busbw\s+#wrong\s*$)");
  Parsed p;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (std::regex_search(line, m, avg)) p.avg_busbw = std::stod(m[1]);
      if (std::regex_search(line, m, oob)) p.out_of_bounds = m[1];
      if (line.find("out-of-place") != std::string::npos &&
          line.find("in-place") > line.find("out-of-place")) {
        p.saw_groups = true;
      }
      p.saw_columns |= std::regex_search(line, columns);
      continue;
    }
    if (!std::regex_match(line, m, data)) {
      p.stray.push_back(line);
      continue;
    }
    DataLine d;
    d.size = std::stoll(m[1]);
    d.count = std::stoll(m[2]);
    d.type = m[3];
    d.redop = m[4];
    d.root = std::stoi(m[5]);
    for (int g = 0; g < 2; ++g) {
      d.time[g] = std::stod(m[6 + 4 * g]);
      d.algbw[g] = std::stod(m[7 + 4 * g]);
      d.busbw[g] = std::stod(m[8 + 4 * g]);
      d.wrong[g] = std::stoll(m[9 + 4 * g]);
    }
    p.rows.push_back(d);
  }
  return p;
}

TEST(BenchCollectivesTest, OutputParsesAsNcclTests) {
  const std::string dir = ::testing::TempDir();
  testing_util::Child c = testing_util::Spawn(
      {"bench", "collectives", "--num_slices", "2", "--accelerator_type",
       "cpu-2", "--minbytes", "1K", "--maxbytes", "8K", "--iters", "2",
       "--warmup_iters", "1", "--baselines", "none"},
      {}, dir, "bench_collectives");
  ASSERT_EQ(testing_util::WaitExit(c, 240), 0) << ReadFile(c.err);
  const std::string out = ReadFile(c.out);
  Parsed p = ParseNcclTests(out);
  EXPECT_TRUE(p.stray.empty()) << "not a comment nor a data line: "
                               << (p.stray.empty() ? "" : p.stray[0]) << "\n"
                               << out;
  EXPECT_EQ(out.find("[slice"), std::string::npos) << out;
  EXPECT_TRUE(p.saw_groups) << out;
  EXPECT_TRUE(p.saw_columns) << out;
  // 3 ops x 3 paths x 4 sizes (1K, 2K, 4K, 8K).
  ASSERT_EQ(p.rows.size(), 36u) << out;
  double sum = 0;
  for (const DataLine& d : p.rows) {
    EXPECT_EQ(d.type, "float");
    EXPECT_TRUE(d.redop == "sum" || d.redop == "none") << d.redop;
    EXPECT_EQ(d.root, -1);
    EXPECT_EQ(d.count * 4, d.size);
    for (int g = 0; g < 2; ++g) {
      EXPECT_EQ(d.wrong[g], 0);
      EXPECT_GT(d.time[g], 0);
      sum += d.busbw[g];
    }
  }
  EXPECT_EQ(p.out_of_bounds, "0 OK") << out;
  // The average of every busbw printed (each rounded to 2 decimals).
  ASSERT_GE(p.avg_busbw, 0) << out;
  EXPECT_NEAR(p.avg_busbw, sum / (2 * p.rows.size()), 0.006) << out;
}

}  // namespace
}  // namespace multislice::cli
