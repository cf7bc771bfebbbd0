// Reporting for `multislice train`: the metrics log, the console progress
// bar and the loss plot.
//
// metrics.jsonl format (version 1): one JSON object per line, each line
// ending in '\n'. Every record is written with one write(2) call on a file
// opened with O_APPEND, so a killed process leaves whole lines plus at most
// one partial line at the end. MetricsWriter::Open cuts such a partial line
// off before appending; ReadAll skips it. Writers add the field
// "format_version" only if the caller puts it in a record; readers need
// nothing but one object per line.
//
// A record that cannot be written (a full disk: ENOSPC, EFBIG, EIO) is an
// error naming the file and strerror(errno), never dropped quietly; the
// bytes of the failed record are cut off again, so the file stays whole
// lines. Sync() makes the records durable and reports a failed write-back.
//
// Not thread-safe: one MetricsWriter per file, used from one thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "nlohmann/json.hpp"

namespace multislice::train {

inline constexpr char kMetricsFileName[] = "metrics.jsonl";

// Appends records to <run_dir>/metrics.jsonl. Move-only; closes the file
// when destroyed.
class MetricsWriter {
 public:
  // Opens (creating if needed) <run_dir>/metrics.jsonl for appending. The
  // run directory must exist. If the file ends in a partial line left by a
  // killed run, truncates the file to just after its last '\n' (or to empty
  // if it has none); repaired_bytes() then says how many bytes were cut.
  static Result<MetricsWriter> Open(const std::string& run_dir);

  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();

  // Appends `record` (must be a JSON object) as one line with a single
  // write(2); the bytes are in the kernel when this returns ok, so they
  // survive a kill of this process (not a machine crash: no fsync).
  // Non-finite numbers are written as null, as nlohmann::json does.
  // On failure the file is cut back to where this record began (when the
  // file allows it), so that it still ends in '\n'.
  Status Write(const nlohmann::json& record);

  // fdatasync: the records written so far survive a machine crash. An error
  // here (EIO, ENOSPC at write-back) means records may be lost.
  Status Sync();

  const std::string& path() const { return path_; }
  // Bytes of a partial trailing line removed by Open.
  int64_t repaired_bytes() const { return repaired_bytes_; }

  // Reads every complete line of `path` as a JSON object. A final line
  // without '\n' is from a killed writer: it is skipped and counted in
  // `*skipped_partial_lines` (0 or 1) when that is not null. A complete line
  // that is not a JSON object is an error naming its line number. Blank
  // lines are ignored. A path that is not a regular file is an error.
  static Result<std::vector<nlohmann::json>> ReadAll(
      const std::string& path, int64_t* skipped_partial_lines = nullptr);

 private:
  MetricsWriter(int fd, std::string path, int64_t repaired_bytes)
      : fd_(fd), path_(std::move(path)), repaired_bytes_(repaired_bytes) {}

  int fd_ = -1;
  std::string path_;
  int64_t repaired_bytes_ = 0;
};

// Resumes. Every step record carries "resume": 0 in the trainer's first
// start in a run directory, then one more at each start that writes
// records (NextResumeIndex). A resume from the checkpoint of step k trains
// and records steps k+1... again, so a step may have several records; the
// one that counts is the one of the highest resume (CurrentStepRecords):
// the earlier ones were trained by a start that stopped before the next
// checkpoint, their time is goodput's wasted progress (goodput.h). Nothing is
// removed from the file (a reader that wants every run of a step still has
// it). Records without the field (older files) count as resume 0.
inline constexpr char kResumeField[] = "resume";

// Goodput's fields of a step record (goodput.h), in seconds unless said:
//   "data_wait_s"         the part of step_time_s the step waited for its
//                         batch (DataIterator::At);
//   "checkpoint_block_s"  how long the saves after the previous step (a
//                         checkpoint's or in-memory replica's copy-out, and
//                         DiLoCo's settle before them) blocked training
//                         before this step began; 0 when none;
//   "goodput"             the run's goodput so far, 0 to 1: productive
//                         seconds over the wall seconds since the run's
//                         first start (the Reporter's running estimate;
//                         `multislice goodput` computes it exactly);
// and in the first step record of each start of the trainer:
//   "start_time"          Unix seconds at which this start's runtime
//                         start-up began;
//   "runtime_init_s"      Runtime::Create (mesh, DCN connect, device
//                         threads) and the start-up matmul peak;
//   "restore_s"           reading the checkpoint or the in-memory replica,
//                         with its broadcast (or a rejoining slice's state);
//   "training_prep_s"     the rest until the first step began: dataset,
//                         model, optimizer, data iterators, run directory.
// The four start fields lie end to end from start_time to the first step.
inline constexpr char kDataWaitField[] = "data_wait_s";
inline constexpr char kCheckpointBlockField[] = "checkpoint_block_s";
inline constexpr char kGoodputField[] = "goodput";
inline constexpr char kStartTimeField[] = "start_time";
inline constexpr char kRuntimeInitField[] = "runtime_init_s";
inline constexpr char kRestoreField[] = "restore_s";
inline constexpr char kTrainingPrepField[] = "training_prep_s";

// One more than the highest resume of the step records in `records`, or 0
// when there are none.
int64_t NextResumeIndex(const std::vector<nlohmann::json>& records);

// The record that counts for each step, in step order: of the records with
// that "step", the one with the highest resume, the last in file order
// among equals. Records without "step" are left out.
std::vector<nlohmann::json> CurrentStepRecords(
    const std::vector<nlohmann::json>& records);

// One console line showing training progress, for example
//   "[#########-----------]  45/100  45%  ETA 1m03s"
// `width` is the number of bar cells between the brackets (negative is taken
// as 0). `step` is clamped to [0, total]. The ETA is the mean time per step
// so far times the steps left; at step 0 it is "ETA --", and at step ==
// total the last field is "done in <elapsed>". Step and percent are
// right-aligned to the width of `total` and of "100" so the line keeps its
// length. total <= 0 shows an empty bar, "0/0" and 0%.
std::string ProgressBar(int64_t step, int64_t total, double elapsed_seconds,
                        int width);

// Formats seconds as "45s", "1m03s" or "2h05m07s" (rounded to the nearest
// second; negative or non-finite values as "--").
std::string FormatDuration(double seconds);

// Whether WriteFileAtomically makes the new file durable: kFsync for files
// a crash must not lose, kRenameOnly for one rewritten so often that only
// its readers' view matters (the Prometheus file, every step).
enum class FileSync { kFsync, kRenameOnly };

// Writes `contents` to `path` through a temporary file in the same
// directory (`path`.tmp.<pid>) that is fsynced (kFsync) and renamed over
// it, so readers see the old file or the new one (config.json, loss.svg).
// Errors name the file and strerror(errno); the temporary file is removed.
Status WriteFileAtomically(const std::string& path, const std::string& contents,
                           FileSync sync = FileSync::kFsync);

// Writes a self-contained SVG line chart of loss against step to `path`:
// axes with tick labels, the train series (blue) and validation series
// (orange) as polylines, a legend and `title` (XML-escaped). No external
// fonts, styles or scripts. Either series may be empty; points with a NaN
// or infinite coordinate are skipped. Written to a temporary file in the
// same directory, fsynced and renamed over `path`, so readers see either
// the old plot or the new one.
Status WriteLossPlotSvg(
    const std::string& path,
    const std::vector<std::pair<double, double>>& train,
    const std::vector<std::pair<double, double>>& validation,
    const std::string& title);

}  // namespace multislice::train
