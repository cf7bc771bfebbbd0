#include "train/metrics.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include "common/temp_dir.h"

namespace multislice::train {
namespace {

using nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void AppendRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out << bytes;
}

int CountOccurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

TEST(MetricsWriterTest, RoundTrip) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  {
    auto writer = MetricsWriter::Open(dir.path());
    ASSERT_TRUE(writer.ok()) << writer.status().message();
    EXPECT_EQ(writer->repaired_bytes(), 0);
    ASSERT_TRUE(writer->Write({{"step", 1}, {"loss", 2.5}}).ok());
    ASSERT_TRUE(
        writer->Write({{"step", 2}, {"loss", 2.25}, {"note", "a\nb"}}).ok());
  }
  {
    // Reopening appends rather than truncating.
    auto writer = MetricsWriter::Open(dir.path());
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->Write({{"step", 3}, {"loss", 2.0}}).ok());
  }
  const std::string path = dir.path() + "/metrics.jsonl";
  EXPECT_EQ(CountOccurrences(ReadFile(path), "\n"), 3);
  int64_t skipped = -1;
  auto records = MetricsWriter::ReadAll(path, &skipped);
  ASSERT_TRUE(records.ok()) << records.status().message();
  EXPECT_EQ(skipped, 0);
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[0]["step"], 1);
  EXPECT_EQ((*records)[0]["loss"], 2.5);
  EXPECT_EQ((*records)[1]["note"], "a\nb");
  EXPECT_EQ((*records)[2]["step"], 3);
}

TEST(MetricsWriterTest, RejectsNonObjectAndNonFiniteBecomesNull) {
  TempDir dir;
  auto writer = MetricsWriter::Open(dir.path());
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ(writer->Write(json::array({1, 2})).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(
      writer->Write({{"loss", std::numeric_limits<double>::quiet_NaN()}}).ok());
  auto records = MetricsWriter::ReadAll(writer->path());
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  EXPECT_TRUE((*records)[0]["loss"].is_null());
}

TEST(MetricsWriterTest, PartialTrailingLineSkippedAndRepaired) {
  TempDir dir;
  const std::string path = dir.path() + "/metrics.jsonl";
  {
    auto writer = MetricsWriter::Open(dir.path());
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->Write({{"step", 1}}).ok());
    ASSERT_TRUE(writer->Write({{"step", 2}}).ok());
  }
  const std::string whole = ReadFile(path);
  AppendRaw(path, "{\"step\": 3, \"lo");  // a write cut short by a kill

  int64_t skipped = -1;
  auto records = MetricsWriter::ReadAll(path, &skipped);
  ASSERT_TRUE(records.ok()) << records.status().message();
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(records->size(), 2u);

  auto writer = MetricsWriter::Open(dir.path());
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ(writer->repaired_bytes(), 15);
  EXPECT_EQ(ReadFile(path), whole);
  ASSERT_TRUE(writer->Write({{"step", 3}}).ok());
  records = MetricsWriter::ReadAll(path, &skipped);
  ASSERT_TRUE(records.ok());
  EXPECT_EQ(skipped, 0);
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[2]["step"], 3);
}

// A writer killed with SIGKILL mid-run leaves only whole lines (plus at most
// one partial tail), and a new writer continues the file cleanly.
TEST(MetricsWriterTest, SurvivesSigkillOfWriter) {
  TempDir dir;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto writer = MetricsWriter::Open(dir.path());
    if (!writer.ok()) ::_exit(3);
    const std::string padding(300, 'p');
    for (int64_t step = 0;; ++step) {
      if (!writer->Write({{"step", step}, {"padding", padding}}).ok()) {
        ::_exit(4);
      }
    }
  }
  ::usleep(50 * 1000);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int wait_status = 0;
  ASSERT_EQ(::waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wait_status)) << "child exited early";

  const std::string path = dir.path() + "/metrics.jsonl";
  int64_t skipped = -1;
  auto records = MetricsWriter::ReadAll(path, &skipped);
  ASSERT_TRUE(records.ok()) << records.status().message();
  EXPECT_LE(skipped, 1);
  ASSERT_GT(records->size(), 0u);
  for (size_t i = 0; i < records->size(); ++i) {
    ASSERT_EQ((*records)[i]["step"], static_cast<int64_t>(i));
  }
  auto writer = MetricsWriter::Open(dir.path());
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->Write({{"step", -1}}).ok());
  auto after = MetricsWriter::ReadAll(path, &skipped);
  ASSERT_TRUE(after.ok()) << after.status().message();
  EXPECT_EQ(skipped, 0);
  ASSERT_EQ(after->size(), records->size() + 1);
  EXPECT_EQ(after->back()["step"], -1);
}

TEST(MetricsWriterTest, FileWithOnlyAPartialLineIsEmptiedOnOpen) {
  TempDir dir;
  const std::string path = dir.path() + "/metrics.jsonl";
  AppendRaw(path, std::string(5000, 'x'));  // longer than one read block
  auto writer = MetricsWriter::Open(dir.path());
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ(writer->repaired_bytes(), 5000);
  EXPECT_EQ(std::filesystem::file_size(path), 0u);
}

TEST(MetricsWriterTest, ReadAllErrors) {
  TempDir dir;
  EXPECT_EQ(MetricsWriter::ReadAll(dir.path() + "/missing").status().code(),
            StatusCode::kNotFound);
  const std::string path = dir.path() + "/metrics.jsonl";
  AppendRaw(path, "{\"step\": 1}\n\nnot json\n");
  auto records = MetricsWriter::ReadAll(path);
  ASSERT_FALSE(records.ok());
  EXPECT_EQ(records.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(records.status().message().find("line 3"), std::string::npos)
      << records.status().message();
}

TEST(MetricsWriterTest, OpenFailsForMissingRunDir) {
  TempDir dir;
  auto writer = MetricsWriter::Open(dir.path() + "/no/such/dir");
  EXPECT_FALSE(writer.ok());
}

TEST(ProgressBarTest, ExactText) {
  EXPECT_EQ(ProgressBar(45, 100, 45.0 * 63 / 55, 20),
            "[#########-----------]  45/100  45%  ETA 1m03s");
  EXPECT_EQ(ProgressBar(0, 100, 0.0, 20),
            "[--------------------]   0/100   0%  ETA --");
  EXPECT_EQ(ProgressBar(100, 100, 100.0, 20),
            "[####################] 100/100 100%  done in 1m40s");
  EXPECT_EQ(ProgressBar(1, 3, 2.0, 6), "[##----] 1/3  33%  ETA 4s");
  EXPECT_EQ(ProgressBar(999, 1000, 3600.0 * 999, 10),
            "[#########-]  999/1000  99%  ETA 1h00m00s");
}

TEST(ProgressBarTest, EdgeCases) {
  EXPECT_EQ(ProgressBar(150, 100, 10.0, 4), "[####] 100/100 100%  done in 10s");
  EXPECT_EQ(ProgressBar(-5, 10, 1.0, 4), "[----]  0/10   0%  ETA --");
  EXPECT_EQ(ProgressBar(0, 0, 0.0, 4), "[----] 0/0   0%  ETA --");
  EXPECT_EQ(ProgressBar(1, 2, 1.0, -3), "[] 1/2  50%  ETA 1s");
  // The line keeps its length as the step advances.
  for (int64_t step : {1, 10, 500, 999}) {
    EXPECT_EQ(ProgressBar(step, 1000, 1.0, 30).find('/'),
              ProgressBar(0, 1000, 0.0, 30).find('/'));
  }
}

TEST(FormatDurationTest, Units) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(59.4), "59s");
  EXPECT_EQ(FormatDuration(59.6), "1m00s");
  EXPECT_EQ(FormatDuration(7507), "2h05m07s");
  EXPECT_EQ(FormatDuration(-1), "--");
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::infinity()), "--");
}

// Returns every number in every points="..." attribute.
std::vector<double> PolylineCoordinates(const std::string& svg) {
  std::vector<double> out;
  std::regex points_re("points=\"([^\"]*)\"");
  std::regex number_re("-?[0-9]+(\\.[0-9]+)?");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), points_re);
       it != std::sregex_iterator(); ++it) {
    const std::string points = (*it)[1];
    for (auto n = std::sregex_iterator(points.begin(), points.end(), number_re);
         n != std::sregex_iterator(); ++n) {
      out.push_back(std::stod(n->str()));
    }
  }
  return out;
}

void ExpectNoTempFiles(const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos)
        << entry.path();
  }
}

TEST(LossPlotTest, BothSeries) {
  TempDir dir;
  const std::string path = dir.path() + "/loss.svg";
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::pair<double, double>> train = {
      {0, 10.5}, {10, 6.0}, {20, nan}, {30, 3.2}, {inf, 1.0}, {40, 2.9}};
  std::vector<std::pair<double, double>> validation = {{20, 5.0}, {40, 3.5}};
  ASSERT_TRUE(
      WriteLossPlotSvg(path, train, validation, "GPT <small> & \"fast\"").ok());
  const std::string svg = ReadFile(path);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(CountOccurrences(svg, "<polyline"), 2);
  EXPECT_NE(svg.find("GPT &lt;small&gt; &amp; &quot;fast&quot;"),
            std::string::npos);
  EXPECT_NE(svg.find(">train</text>"), std::string::npos);
  EXPECT_NE(svg.find(">validation</text>"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("@import"), std::string::npos);
  // Tick labels cover the data: steps 0..40, loss up to 10.5.
  EXPECT_NE(svg.find(">40</text>"), std::string::npos);
  EXPECT_NE(svg.find(">0</text>"), std::string::npos);
  // Every plotted coordinate lies inside the 720x440 canvas; 4 finite train
  // points and 2 validation points, two numbers each.
  const std::vector<double> coordinates = PolylineCoordinates(svg);
  EXPECT_EQ(coordinates.size(), 12u);
  for (double c : coordinates) {
    EXPECT_GE(c, 0);
    EXPECT_LE(c, 720);
  }
  for (size_t i = 1; i < coordinates.size(); i += 2) {
    EXPECT_LE(coordinates[i], 440);
  }
  ExpectNoTempFiles(dir.path());
}

TEST(LossPlotTest, EmptyAndDegenerateSeries) {
  TempDir dir;
  const std::string path = dir.path() + "/loss.svg";
  ASSERT_TRUE(WriteLossPlotSvg(path, {}, {}, "empty").ok());
  std::string svg = ReadFile(path);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(CountOccurrences(svg, "<polyline"), 0);

  // One point: a constant range must not divide by zero; overwrite in place.
  ASSERT_TRUE(WriteLossPlotSvg(path, {{5, 2.0}}, {}, "one").ok());
  svg = ReadFile(path);
  EXPECT_EQ(CountOccurrences(svg, "<polyline"), 1);
  EXPECT_EQ(CountOccurrences(svg, "<circle"), 1);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  for (double c : PolylineCoordinates(svg)) {
    EXPECT_GE(c, 0);
    EXPECT_LE(c, 720);
  }
  ExpectNoTempFiles(dir.path());
}

// A full disk: metrics.jsonl on /dev/full (every write is ENOSPC). The
// failed record is an error naming the file and strerror's text.
TEST(MetricsWriterTest, WriteOnAFullDiskIsAnError) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::filesystem::create_symlink("/dev/full",
                                  dir.path() + "/" + kMetricsFileName);
  Result<MetricsWriter> writer = MetricsWriter::Open(dir.path());
  ASSERT_TRUE(writer.ok()) << writer.status().message();
  const Status s = writer->Write({{"step", 1}, {"loss", 2.5}});
  EXPECT_EQ(s.message(), "cannot write " + dir.path() +
                             "/metrics.jsonl: No space left on device");
  // Reading it back refuses a device instead of reading zeros forever.
  EXPECT_FALSE(MetricsWriter::ReadAll(writer->path()).ok());
}

// The disk fills up in the middle of a record (a file size limit, set in a
// child): the record's partial bytes are cut off again, so the file holds
// exactly the records that were written, whole, and the error says why.
TEST(MetricsWriterTest, RecordCutShortIsRemoved) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.path() + "/" + kMetricsFileName;
  const std::string padding(300, 'x');
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{4096, RLIM_INFINITY};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(2);
    Result<MetricsWriter> writer = MetricsWriter::Open(dir.path());
    if (!writer.ok()) ::_exit(3);
    for (int step = 1; step <= 100; ++step) {
      Status s = writer->Write({{"step", step}, {"pad", padding}});
      if (!s.ok()) {
        const bool named =
            s.message() == "cannot write " + path + ": File too large";
        ::_exit(named && step > 1 ? 10 + step : 4);
      }
    }
    ::_exit(5);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  const int failed_step = WEXITSTATUS(status) - 10;
  ASSERT_GT(failed_step, 1) << "exit " << WEXITSTATUS(status);
  const std::string text = ReadFile(path);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  int64_t partial = -1;
  Result<std::vector<json>> records = MetricsWriter::ReadAll(path, &partial);
  ASSERT_TRUE(records.ok());
  EXPECT_EQ(partial, 0);
  EXPECT_EQ(static_cast<int>(records->size()), failed_step - 1);
  EXPECT_TRUE(MetricsWriter::Open(dir.path()).ok());
}

TEST(MetricsWriterTest, SyncMakesRecordsDurable) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  Result<MetricsWriter> writer = MetricsWriter::Open(dir.path());
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->Write({{"step", 1}}).ok());
  EXPECT_TRUE(writer->Sync().ok());
}

TEST(WriteFileAtomicallyTest, ReplacesTheFileOrNamesTheError) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.path() + "/config.json";
  ASSERT_TRUE(WriteFileAtomically(path, "{\"a\": 1}\n").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "{\"a\": 2}\n").ok());
  EXPECT_EQ(ReadFile(path), "{\"a\": 2}\n");
  ExpectNoTempFiles(dir.path());
  const Status s = WriteFileAtomically(dir.path() + "/none/config.json", "x");
  EXPECT_EQ(s.message().rfind(
                "cannot create " + dir.path() + "/none/config.json.tmp.", 0),
            0u)
      << s.message();
  EXPECT_NE(s.message().find(": No such file or directory"), std::string::npos)
      << s.message();
}

TEST(LossPlotTest, FailsWithoutLeavingTempFile) {
  TempDir dir;
  const Status status =
      WriteLossPlotSvg(dir.path() + "/missing/loss.svg", {{1, 1}}, {}, "t");
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("loss plot"), std::string::npos);
  ExpectNoTempFiles(dir.path());
}

}  // namespace
}  // namespace multislice::train

namespace multislice::train {
namespace {

// Issue 13 (first-hour trap): a resumed run logged its steps again with the
// same attempt, so nothing told the superseded records apart. Each start
// writes one more "resume"; the record of the highest resume counts.
TEST(ResumeRecordsTest, HighestResumeOfEachStepCounts) {
  EXPECT_EQ(NextResumeIndex({}), 0);
  EXPECT_EQ(NextResumeIndex({{{"note", "no step"}}}), 0);
  // An older file without the field: its records are resume 0.
  EXPECT_EQ(NextResumeIndex({{{"step", 1}}, {{"step", 2}}}), 1);

  std::vector<nlohmann::json> records;
  for (int s = 1; s <= 7; ++s) {
    records.push_back({{"step", s}, {"resume", 0}, {"loss", 10.0 + s}});
  }
  // Resumed from the step-5 checkpoint: 6 and 7 again, then 8.
  for (int s = 6; s <= 8; ++s) {
    records.push_back({{"step", s}, {"resume", 1}, {"loss", 20.0 + s}});
  }
  EXPECT_EQ(NextResumeIndex(records), 2);
  const std::vector<nlohmann::json> current = CurrentStepRecords(records);
  ASSERT_EQ(current.size(), 8u);
  for (int s = 1; s <= 8; ++s) {
    EXPECT_EQ(current[s - 1]["step"], s);
    EXPECT_EQ(current[s - 1]["loss"], (s <= 5 ? 10.0 : 20.0) + s) << s;
  }
}

}  // namespace
}  // namespace multislice::train
