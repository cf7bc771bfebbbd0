// What compute commands say about the machine, end to end through the real
// binary: the first line names the ISA level and the matmul route, under
// every MULTISLICE_MAX_ISA this CPU can run; a bad cap and a bad dtype end
// in one line and exit code 2; an explicit bfloat16 on the route through
// float32 kernels gets its note; peak --dtype measures only that dtype.
#include "cli/platform.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"
#include "common/cpu_isa.h"
#include "common/temp_dir.h"

namespace multislice::cli {
namespace {

using testing_util::Child;
using testing_util::ReadFile;
using testing_util::Spawn;
using testing_util::WaitExit;

struct Output {
  int code = -1;
  std::string out, err;
};

Output RunBinary(const std::vector<std::string>& args,
                 const std::vector<std::string>& env) {
  static int runs = 0;
  static TempDir dir;
  Child c = Spawn(args, env, dir.path(), "run" + std::to_string(++runs));
  Output o;
  o.code = WaitExit(c, 120);
  o.out = ReadFile(c.out);
  o.err = ReadFile(c.err);
  return o;
}

std::string FirstLine(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

const std::vector<std::string> kTinyShardings = {
    "shardings", "-d", "64", "-b", "64", "-n", "1", "--steps", "1"};

// For each level this CPU has: the first line of shardings names it and the
// route it implies.
TEST(PlatformTest, ShardingsFirstLineNamesIsaAndRouteUnderEveryCap) {
  for (Isa cap : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512}) {
    if (cap > DetectedIsa()) continue;
    const std::string name(IsaName(cap));
    Output o = RunBinary(kTinyShardings, {"MULTISLICE_MAX_ISA=" + name});
    ASSERT_EQ(o.code, 0) << o.err;
    const std::string line = FirstLine(o.out);
    EXPECT_EQ(line.rfind("multislice shardings: CPU ", 0), 0u) << line;
    EXPECT_NE(line.find(", ISA " + name), std::string::npos) << line;
    EXPECT_NE(line.find("matmul bfloat16 via float32 kernels (" + name + ")"),
              std::string::npos)
        << line;
  }
}

TEST(PlatformTest, JsonCarriesThePlatformAndOneDtypeSpelling) {
  std::vector<std::string> args = kTinyShardings;
  args.insert(args.end(), {"--dtype", "f32", "--json"});
  Output o = RunBinary(args, {"MULTISLICE_MAX_ISA=avx2"});
  ASSERT_EQ(o.code, 0) << o.err;
  nlohmann::json j = nlohmann::json::parse(o.out.substr(o.out.find('{')));
  EXPECT_EQ(j["dtype"], "float32");
  EXPECT_EQ(j["platform"]["isa"],
            DetectedIsa() >= Isa::kAvx2 ? "avx2" : "baseline");
  EXPECT_EQ(j["platform"]["matmul"].get<std::string>().rfind("float32 (", 0),
            0u);
}

TEST(PlatformTest, ExplicitBfloat16OnFloat32KernelsGetsOneNote) {
  std::vector<std::string> args = kTinyShardings;
  args.insert(args.end(), {"--dtype", "bfloat16"});
  Output o = RunBinary(args, {"MULTISLICE_MAX_ISA=baseline"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("multislice shardings: note: dtype bfloat16 on a CPU "
                       "without bf16 matmul instructions (baseline)"),
            std::string::npos)
      << o.out;
  // The default dtype is not an explicit request.
  Output quiet = RunBinary(kTinyShardings, {"MULTISLICE_MAX_ISA=baseline"});
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.out.find("note: dtype"), std::string::npos) << quiet.out;
}

TEST(PlatformTest, BadCapAndBadDtypeEndInOneLineAndExitTwo) {
  Output cap = RunBinary(kTinyShardings, {"MULTISLICE_MAX_ISA=avx3"});
  EXPECT_EQ(cap.code, 2);
  EXPECT_EQ(cap.err,
            "multislice shardings: MULTISLICE_MAX_ISA: 'avx3' is not an ISA "
            "level; expected one of baseline, avx2, avx512, avx512_bf16, "
            "amx\n");
  Output peak = RunBinary({"peak", "--dtype", "fp8"}, {});
  EXPECT_EQ(peak.code, 2);
  EXPECT_EQ(peak.err,
            "multislice peak: --dtype: 'fp8' is not a dtype; expected "
            "bfloat16 (bf16) or float32 (f32)\n");
}

TEST(PlatformTest, PeakDtypeMeasuresOnlyThatDtypeOnTheRunsRoute) {
  Output o =
      RunBinary({"peak", "--dtype", "bf16", "--square", "64", "-d", "32", "-b",
                 "32", "--reps", "1", "--membw_bytes", "1M", "--json"},
                {"MULTISLICE_MAX_ISA=avx2"});
  ASSERT_EQ(o.code, 0) << o.err;
  nlohmann::json j = nlohmann::json::parse(o.out);
  ASSERT_EQ(j["matmul"].size(), 1u);
  EXPECT_EQ(j["matmul"]["bfloat16"],
            std::string("bfloat16 via float32 kernels (") +
                (DetectedIsa() >= Isa::kAvx2 ? "avx2" : "baseline") + ")");
  for (const auto& row : j["matmuls"]) {
    EXPECT_EQ(row["ab_type"], "bfloat16");
    EXPECT_NE(row["impl"].get<std::string>().find("widened to float32"),
              std::string::npos)
        << row["impl"];
  }
}

}  // namespace
}  // namespace multislice::cli
