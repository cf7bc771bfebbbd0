// TFRecord files of tf.train.Example records, read without TensorFlow: the
// record framing as TensorFlow's RecordWriter writes it, CRC32C, and the few
// protobuf messages of an Example, parsed from the wire format here (no
// libprotobuf: four small messages do not need a generated parser).
//
// A record (tensorflow/core/lib/io/record_writer.h):
//   u64  length, little-endian
//   u32  masked CRC32C of the 8 length bytes
//   u8[length]  data
//   u32  masked CRC32C of the data
// where masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8.
// The data of each record is a serialized tf.train.Example:
//   Example  { Features features = 1; }
//   Features { map<string, Feature> feature = 1; }   (entries: key = 1,
//                                                      value = 2)
//   Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list
//              = 2; Int64List int64_list = 3; } }
//   BytesList { repeated bytes value = 1; }
// Protobuf's merge rules apply: a repeated map key keeps its last value, the
// last oneof field seen wins, a message field seen twice is merged.
//
// Thread-safety: a TfRecordReader is not thread-safe; the free functions
// are.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

#include "common/status.h"

namespace multislice::train {

// CRC-32C (Castagnoli, the polynomial 0x1EDC6F41 reflected), continuing
// from `crc` (0 to start).
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);
// TensorFlow's masking of a CRC stored next to the data it covers.
uint32_t MaskCrc32c(uint32_t crc);

class TfRecordReader {
 public:
  // InvalidArgument naming `path` if it cannot be opened.
  static Result<TfRecordReader> Open(const std::string& path);

  // The next record's data into *data; false at the end of the file (a
  // file may be empty). InvalidArgument, one sentence naming the file and
  // the record's byte offset, for a record cut short by the end of the file
  // or a CRC mismatch of its length or data.
  Result<bool> Next(std::string* data);

  // The byte offset of the record Next returned last.
  uint64_t record_offset() const { return record_offset_; }
  // Bytes consumed so far.
  uint64_t position() const { return position_; }
  const std::string& path() const { return path_; }

 private:
  TfRecordReader() = default;
  Status Fault(const std::string& what) const;

  std::string path_;
  std::ifstream in_;
  uint64_t file_size_ = 0;
  uint64_t position_ = 0;
  uint64_t record_offset_ = 0;
};

// The single value of the bytes feature `name` of a serialized Example.
// InvalidArgument with a reason to follow the file and offset: "is not a
// serialized tf.train.Example (...)", "has no feature 'text'", "feature
// 'text' is a float_list, not a bytes_list", "feature 'text' holds 2 values,
// expected 1".
Result<std::string> ExampleBytesFeature(std::string_view example,
                                        std::string_view name);

}  // namespace multislice::train
