// Packing a script directory for `multislice run` and `multislice job`
// (MaxText's tar of --SCRIPT_DIR), with the rules a user expects:
//
//  - output folders are never packed: a directory holding any of
//    kNeverPackTags (the marker every run and job output folder gets, a
//    run's output_slice_0000_worker_0000.txt, a job's
//    main_command_log_slice_0_worker_0, a controller's agent-token) is left
//    out with everything in it (tar --exclude-tag-all), so neither the
//    run's own output nor earlier runs' nor a controller's data directory
//    (its tokens) is shipped, and tar never reads a file that is being
//    written;
//  - in a git work tree, only what git would commit is packed (tracked
//    files and untracked ones .gitignore does not exclude): a repository's
//    build/ and runs/ stay home, as gcloud's uploads honour .gitignore;
//  - the directory is measured first (a walk, no reading): when the files
//    to pack add up to more than max_bytes it is refused at once, naming
//    its largest entries, before any time goes into packing;
//  - on a terminal a progress line (bytes packed of the total) is redrawn
//    while tar runs, and one line says what was packed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"

namespace multislice::control {

// The file every output folder of `run` and `job` holds.
inline constexpr const char* kOutputMarker = ".multislice-output";
// Directories holding any of these are never packed.
inline constexpr const char* kNeverPackTags[] = {
    kOutputMarker, "output_slice_0000_worker_0000.txt",
    "main_command_log_slice_0_worker_0", "agent-token"};

// Creates `dir` (and its parents) and writes kOutputMarker into it.
Status MarkOutputFolder(const std::string& dir);

struct DirectorySize {
  uint64_t bytes = 0;  // regular files (symbolic links are packed as links)
  uint64_t files = 0;
  uint64_t entries = 0;  // files, directories and links: tar headers
  // The top-level entries, largest first: name (a '/' after directories)
  // and bytes.
  std::vector<std::pair<std::string, uint64_t>> largest;
  // The directory is in a git work tree: only the files git would commit
  // are packed (tracked ones, and untracked ones no .gitignore excludes),
  // as gcloud uploads what .gcloudignore, made from .gitignore, leaves.
  bool git = false;
};

// What PackDirectory would pack of `dir`, by the rules above.
Result<DirectorySize> MeasureDirectory(const std::string& dir);

struct PackOptions {
  std::string dir;                     // the script directory
  std::string archive;                 // the tar.gz to write
  std::string flag = "--script_dir";   // named in messages
  std::string program = "multislice";  // prefixes the lines on `err`
  uint64_t max_bytes = 256ull << 20;   // what the files may add up to
  std::chrono::milliseconds timeout{300000};
  const std::atomic<bool>* cancel = nullptr;
  FILE* err = stderr;     // the summary line (nullptr: none)
  bool terminal = false;  // `err` is a terminal: draw the progress line
};

struct PackSummary {
  DirectorySize size;
  uint64_t archive_bytes = 0;
  double seconds = 0;
};

// Measures, refuses (InvalidArgument naming options.flag) or packs
// options.dir into options.archive by spawning tar with an argv.
// DeadlineExceeded after the timeout, Aborted when `cancel` is set,
// Internal naming tar's last message when it fails.
Result<PackSummary> PackDirectory(const PackOptions& options);

// "1.5 MiB", "730 MiB", "1.8 GiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace multislice::control
