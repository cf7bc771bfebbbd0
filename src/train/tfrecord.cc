// TFRecord framing, CRC32C and the tf.train.Example wire format: see
// tfrecord.h.
#include "train/tfrecord.h"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "train/little_endian.h"

namespace multislice::train {
namespace {

constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

std::string Hex(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

// Reads protobuf wire format from a message's bytes. Errors are reasons
// ("a truncated varint"), completed by the caller.
class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : in_(bytes) {}
  bool done() const { return pos_ >= in_.size(); }

  Result<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= in_.size()) return InvalidArgument("a truncated varint");
      const auto byte = static_cast<uint8_t>(in_[pos_++]);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return v;
    }
    return InvalidArgument("a varint longer than 10 bytes");
  }

  // The next field's number and wire type.
  Status Tag(uint64_t* number, int* wire_type) {
    ASSIGN_OR_RETURN(uint64_t tag, Varint());
    *number = tag >> 3;
    *wire_type = static_cast<int>(tag & 7);
    if (*number == 0) return InvalidArgument("a field number 0");
    return OkStatus();
  }

  Result<std::string_view> LengthDelimited() {
    ASSIGN_OR_RETURN(uint64_t length, Varint());
    if (length > in_.size() - pos_) {
      return InvalidArgument("a length of " + std::to_string(length) +
                             " bytes past the end of its message");
    }
    std::string_view value = in_.substr(pos_, length);
    pos_ += length;
    return value;
  }

  // Skips a field of `wire_type` whose tag was read.
  Status Skip(int wire_type) {
    switch (wire_type) {
      case 0:
        return Varint().status();
      case 1:
        return Advance(8);
      case 2:
        return LengthDelimited().status();
      case 5:
        return Advance(4);
      default:
        return InvalidArgument("wire type " + std::to_string(wire_type) +
                               " (groups or invalid), which Example does not "
                               "use");
    }
  }

 private:
  Status Advance(size_t n) {
    if (n > in_.size() - pos_) {
      return InvalidArgument("a fixed-width field past the end of its message");
    }
    pos_ += n;
    return OkStatus();
  }

  std::string_view in_;
  size_t pos_ = 0;
};

// Calls visit(number, bytes) for each length-delimited field of `message`
// in order, skipping fields of other wire types; stops at visit's error.
template <typename Visit>
Status ForEachLengthDelimited(std::string_view message, Visit visit) {
  WireReader r(message);
  while (!r.done()) {
    uint64_t number;
    int type;
    RETURN_IF_ERROR(r.Tag(&number, &type));
    if (type != 2) {
      RETURN_IF_ERROR(r.Skip(type));
      continue;
    }
    ASSIGN_OR_RETURN(std::string_view bytes, r.LengthDelimited());
    RETURN_IF_ERROR(visit(number, bytes));
  }
  return OkStatus();
}

// A Feature as protobuf's merge leaves it: the last oneof field's name, and
// for a bytes_list its values.
struct FeatureValue {
  std::string kind;  // "bytes_list", "float_list", "int64_list" or ""
  std::vector<std::string_view> values;
};

Status MergeFeature(std::string_view bytes, FeatureValue* feature) {
  static const char* const kKinds[] = {"bytes_list", "float_list",
                                       "int64_list"};
  return ForEachLengthDelimited(bytes, [&](uint64_t number,
                                           std::string_view list) {
    if (number < 1 || number > 3) return OkStatus();
    const std::string kind = kKinds[number - 1];
    if (kind != feature->kind) *feature = FeatureValue{kind, {}};
    if (number != 1) return OkStatus();
    // BytesList: repeated bytes value = 1.
    return ForEachLengthDelimited(list, [&](uint64_t n, std::string_view v) {
      if (n == 1) feature->values.push_back(v);
      return OkStatus();
    });
  });
}

// One map entry of Features: if its key is `name`, *found becomes its
// value (a later entry with the same key replaces an earlier one).
Status ReadFeatureEntry(std::string_view bytes, std::string_view name,
                        std::optional<FeatureValue>* found) {
  std::string_view key;
  std::vector<std::string_view> value_parts;
  RETURN_IF_ERROR(
      ForEachLengthDelimited(bytes, [&](uint64_t number, std::string_view v) {
        if (number == 1) key = v;
        if (number == 2) value_parts.push_back(v);
        return OkStatus();
      }));
  if (key != name) return OkStatus();
  FeatureValue value;
  for (std::string_view part : value_parts) {
    RETURN_IF_ERROR(MergeFeature(part, &value));
  }
  *found = std::move(value);
  return OkStatus();
}

// Walks Example.features (field 1, merged if repeated) and its map.
Status FindFeature(std::string_view example, std::string_view name,
                   std::optional<FeatureValue>* found) {
  return ForEachLengthDelimited(
      example, [&](uint64_t number, std::string_view features) {
        if (number != 1) return OkStatus();
        return ForEachLengthDelimited(
            features, [&](uint64_t n, std::string_view entry) {
              return n == 1 ? ReadFeatureEntry(entry, name, found) : OkStatus();
            });
      });
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) {
    crc = kCrc32cTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  }
  return ~crc;
}

uint32_t MaskCrc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

Result<TfRecordReader> TfRecordReader::Open(const std::string& path) {
  TfRecordReader reader;
  reader.path_ = path;
  reader.in_.open(path, std::ios::binary);
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!reader.in_ || ec) {
    return InvalidArgument(path + ": cannot open the TFRecord file (" +
                           std::strerror(errno) + ")");
  }
  reader.file_size_ = static_cast<uint64_t>(size);
  return reader;
}

Status TfRecordReader::Fault(const std::string& what) const {
  return InvalidArgument(path_ + ": the record at byte offset " +
                         std::to_string(record_offset_) + " " + what);
}

Result<bool> TfRecordReader::Next(std::string* data) {
  record_offset_ = position_;
  if (position_ == file_size_) return false;
  const uint64_t left = file_size_ - position_;
  uint8_t head[12];
  if (left < sizeof(head) ||
      !in_.read(reinterpret_cast<char*>(head), sizeof(head))) {
    return Fault("is truncated: " + std::to_string(left) +
                 " bytes are left, fewer than the 12 of a record's length "
                 "and its CRC");
  }
  const uint32_t length_crc = MaskCrc32c(Crc32c(head, 8));
  if (length_crc != GetLittleEndian32(head + 8)) {
    return Fault("has a CRC mismatch in its length (stored " +
                 Hex(GetLittleEndian32(head + 8)) + ", computed " +
                 Hex(length_crc) +
                 "): the file is corrupt or not a TFRecord file");
  }
  const uint64_t length = GetLittleEndian64(head);
  if (left < 16 || length > left - 16) {
    return Fault("is truncated: its " + std::to_string(length) +
                 " bytes of data and their CRC run past the end of the file (" +
                 std::to_string(left - 12) + " bytes left)");
  }
  data->resize(length);
  uint8_t tail[4];
  if (!in_.read(data->data(), static_cast<std::streamsize>(length)) ||
      !in_.read(reinterpret_cast<char*>(tail), sizeof(tail))) {
    return Fault("cannot be read (" + std::string(std::strerror(errno)) + ")");
  }
  const uint32_t data_crc = MaskCrc32c(Crc32c(data->data(), data->size()));
  if (data_crc != GetLittleEndian32(tail)) {
    return Fault("has a CRC mismatch in its data (stored " +
                 Hex(GetLittleEndian32(tail)) + ", computed " + Hex(data_crc) +
                 "): the file is corrupt");
  }
  position_ += 16 + length;
  return true;
}

Result<std::string> ExampleBytesFeature(std::string_view example,
                                        std::string_view name) {
  std::optional<FeatureValue> found;
  if (Status s = FindFeature(example, name, &found); !s.ok()) {
    return InvalidArgument("is not a serialized tf.train.Example (" +
                           s.message() + ")");
  }
  const std::string quoted = "'" + std::string(name) + "'";
  if (!found) return InvalidArgument("has no feature " + quoted);
  if (found->kind != "bytes_list") {
    return InvalidArgument("feature " + quoted + " is " +
                           (found->kind.empty() ? std::string("empty (no list)")
                            : found->kind[0] == 'i' ? "an " + found->kind
                                                    : "a " + found->kind) +
                           ", not a bytes_list");
  }
  if (found->values.size() != 1) {
    return InvalidArgument("feature " + quoted + " holds " +
                           std::to_string(found->values.size()) +
                           " values, expected 1");
  }
  return std::string(found->values[0]);
}

}  // namespace multislice::train
