// The safetensors format (Hugging Face's), written and read exactly: what
// `multislice export` writes and `multislice import` reads.
//
// A file is
//   8 bytes     N, the header's length, unsigned little-endian
//   N bytes     a JSON object: per tensor "name": {"dtype": "F32", "shape":
//               [d0, d1, ...], "data_offsets": [begin, end]}, plus an optional
//               "__metadata__": {string: string}; padded with spaces so that
//               8 + N is a multiple of 8, as the reference writer pads it
//   the data    every tensor's bytes, row-major, little-endian, at
//               [begin, end) counted from the first byte after the header
//
// Writing: f32 tensors in the order given, contiguous from offset 0, one
// tensor's values in memory at a time; the file appears whole or not at all
// (PATH.tmp.<pid>, fsync, rename, fsync of the directory).
//
// Reading treats the file as hostile: the header length is bounded
// (kSafetensorsMaxHeaderBytes) and must lie inside the file, the JSON must
// parse (nesting deeper than the format's is refused while parsing), names
// are unique, every tensor's dtype is F32, BF16 or F16, its shape's size
// times the dtype's width equals its byte range, and the ranges, sorted,
// tile the data section exactly (no overlap, no gap, nothing past the end or
// left over), as the reference reader requires. Each refusal is one
// sentence naming the file, the tensor and what is wrong (kInvalidArgument).
// Tensors are then read on demand with pread, never past the range the
// header gave them; BF16 and F16 are widened to f32.
//
// Thread-safety: a SafetensorsReader's const methods may be called from
// several threads (pread does not move a shared offset).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace multislice::train {

// The largest header Open reads (the reference reader's limit is 100 MB).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// One tensor of a file: dtype "F32", "BF16" or "F16"; its bytes [begin, end)
// of the data section.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;

  int64_t elements() const;
};

// A tensor to write as F32: `fill` writes its elements (the product of
// shape; 1 for shape []) into the buffer it is given.
struct SafetensorsSource {
  std::string name;
  std::vector<int64_t> shape;
  std::function<void(float* out)> fill;
};

struct SafetensorsWriteOptions {
  // "__metadata__" (left out when empty); transformers expects
  // {"format": "pt"}.
  std::map<std::string, std::string> metadata;
  // Called after each tensor with the bytes of the file written so far and
  // its total size; may be empty.
  std::function<void(uint64_t written, uint64_t total)> progress;
};

// Writes `path` atomically (see above). kInvalidArgument for an empty,
// duplicate or "__metadata__" name or a negative dimension; kInternal naming
// the file and strerror(errno) for an I/O failure, after which neither the
// file nor its temporary exists (an older file at `path` is left as it was).
Status WriteSafetensors(const std::string& path,
                        const std::vector<SafetensorsSource>& tensors,
                        const SafetensorsWriteOptions& options = {});

class SafetensorsReader {
 public:
  // Opens `path` and checks its header (see above). A missing or unreadable
  // file is kInvalidArgument too, naming it and strerror(errno).
  static Result<SafetensorsReader> Open(const std::string& path);

  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  ~SafetensorsReader();

  const std::string& path() const { return path_; }
  // Sorted by their place in the data section.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }
  // The tensor named `name`, or null.
  const SafetensorsTensor* Find(const std::string& name) const;

  // Reads one of tensors() into out (elements() floats), widening BF16 and
  // F16. kInvalidArgument naming the file and tensor if the file no longer
  // holds the bytes its header promised (it shrank since Open); kInternal
  // for another read error.
  Status ReadF32(const SafetensorsTensor& tensor, float* out) const;

 private:
  SafetensorsReader() = default;

  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;  // 8 + the header's length
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// IEEE half precision to f32, exactly (subnormals, infinities and NaN
// included).
float HalfToFloat(uint16_t half);

}  // namespace multislice::train
