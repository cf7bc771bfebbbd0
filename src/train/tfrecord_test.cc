// The TFRecord reader and the Example parser against files written by an
// independent Python writer (tfrecord_test_util.h) and CRC32C's published
// check values; every malformed record is one sentence with the file and
// the byte offset.
#include "train/tfrecord.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/temp_dir.h"
#include "train/data_test_util.h"
#include "train/tfrecord_test_util.h"

namespace multislice::train {
namespace {

using testing_util::ReadBytes;
using testing_util::WriteBytes;

using testing_util::TextRecord;
using testing_util::WriteTfRecordWithPython;

// Every record's data of `path`, or the first error.
Result<std::vector<std::string>> ReadAll(const std::string& path) {
  ASSIGN_OR_RETURN(TfRecordReader reader, TfRecordReader::Open(path));
  std::vector<std::string> records;
  std::string data;
  for (;;) {
    ASSIGN_OR_RETURN(bool more, reader.Next(&data));
    if (!more) return records;
    records.push_back(data);
  }
}

TEST(Crc32c, PublishedCheckValues) {
  // The CRC catalogue's check value and RFC 3720's test vectors.
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62a8ab43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(Crc32c(ascending.data(), 32), 0x46dd794eu);
  // Continuing from a prefix is the CRC of the whole.
  EXPECT_EQ(Crc32c("6789", 4, Crc32c("12345", 5)), 0xe3069283u);
}

TEST(TfRecordReader, ReadsWhatPythonWrote) {
  TempDir dir;
  const std::string path = dir.path() + "/corpus.tfrecord";
  const std::string long_text(70000, 'x');  // a length varint of 3 bytes
  std::vector<nlohmann::json> records = {
      TextRecord("first document\nwith two lines\n"),
      {{"features",
        {{"id", {{"int64", {7, 300}}}},
         {"text", {{"bytes", {"caf\u00e9 \u65e5\u672c \U0001f642"}}}},
         {"score", {{"float", {0.5}}}}}}},
      TextRecord(long_text),
      TextRecord("", "text"),
  };
  ASSERT_TRUE(WriteTfRecordWithPython(path, records));
  auto read = ReadAll(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  ASSERT_EQ(read->size(), 4u);
  const char* expected[] = {"first document\nwith two lines\n",
                            "caf\u00e9 \u65e5\u672c \U0001f642",
                            long_text.c_str(), ""};
  for (size_t i = 0; i < 4; ++i) {
    auto text = ExampleBytesFeature((*read)[i], "text");
    ASSERT_TRUE(text.ok()) << text.status().message();
    EXPECT_EQ(*text, expected[i]) << "record " << i;
  }
  auto id = ExampleBytesFeature((*read)[1], "id");
  EXPECT_EQ(id.status().message(),
            "feature 'id' is an int64_list, not a bytes_list");
  EXPECT_EQ(ExampleBytesFeature((*read)[1], "score").status().message(),
            "feature 'score' is a float_list, not a bytes_list");
  EXPECT_EQ(ExampleBytesFeature((*read)[0], "body").status().message(),
            "has no feature 'body'");
}

TEST(TfRecordReader, OffsetsAndAnEmptyFile) {
  TempDir dir;
  const std::string path = dir.path() + "/two.tfrecord";
  ASSERT_TRUE(WriteTfRecordWithPython(
      path, {{{"raw", "0102"}}, {{"raw", "aabbccdd"}}}));
  auto reader = TfRecordReader::Open(path);
  ASSERT_TRUE(reader.ok());
  std::string data;
  ASSERT_TRUE(*reader->Next(&data));
  EXPECT_EQ(data, "\x01\x02");
  EXPECT_EQ(reader->record_offset(), 0u);
  ASSERT_TRUE(*reader->Next(&data));
  EXPECT_EQ(data, "\xaa\xbb\xcc\xdd");
  EXPECT_EQ(reader->record_offset(), 18u);  // 12 + 2 + 4
  EXPECT_FALSE(*reader->Next(&data));
  EXPECT_EQ(reader->position(), 18u + 20u);

  WriteBytes(dir.path() + "/empty.tfrecord", "");
  auto empty = ReadAll(dir.path() + "/empty.tfrecord");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

class MalformedTfRecord : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() + "/c.tfrecord";
    // Two records of 10 and 5 bytes: the second starts at byte 26.
    ASSERT_TRUE(WriteTfRecordWithPython(
        path_, {{{"raw", "00112233445566778899"}}, {{"raw", "0a0b0c0d0e"}}}));
    bytes_ = ReadBytes(path_);
    ASSERT_EQ(bytes_.size(), 26u + 21u);
  }
  std::string Error(const std::string& bytes) {
    WriteBytes(path_, bytes);
    auto read = ReadAll(path_);
    EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument);
    return read.status().message();
  }

  TempDir dir_;
  std::string path_, bytes_;
};

TEST_F(MalformedTfRecord, DataCrcMismatch) {
  std::string bytes = bytes_;
  bytes[26 + 12 + 2] ^= 0x40;  // a data byte of the second record
  const std::string e = Error(bytes);
  EXPECT_EQ(e.rfind(path_ + ": the record at byte offset 26 has a CRC mismatch "
                            "in its data (stored 0x",
                    0),
            0u)
      << e;
  EXPECT_NE(e.find("the file is corrupt"), std::string::npos) << e;
}

TEST_F(MalformedTfRecord, LengthCrcMismatch) {
  std::string bytes = bytes_;
  bytes[0] = 11;  // the first record's length
  EXPECT_EQ(
      Error(bytes).rfind(path_ + ": the record at byte offset 0 has a CRC "
                                 "mismatch in its length",
                         0),
      0u);
}

TEST_F(MalformedTfRecord, Truncated) {
  // Inside the second record's data.
  EXPECT_EQ(Error(bytes_.substr(0, 26 + 14)),
            path_ +
                ": the record at byte offset 26 is truncated: its 5 bytes of "
                "data and their CRC run past the end of the file (2 bytes "
                "left)");
  // Inside its header.
  EXPECT_EQ(Error(bytes_.substr(0, 26 + 5)),
            path_ +
                ": the record at byte offset 26 is truncated: 5 bytes are "
                "left, fewer than the 12 of a record's length and its CRC");
  // Only the final CRC missing.
  EXPECT_NE(Error(bytes_.substr(0, bytes_.size() - 1)).find("byte offset 26"),
            std::string::npos);
}

TEST(ExampleBytesFeature, WireFormatFaults) {
  // A bytes feature with two values, encoded by hand: Example{features{
  // feature{key "text" value{bytes_list{value "a" value "b"}}}}}.
  const std::string two = std::string("\x0a\x12") + "\x0a\x10" +
                          "\x0a\x04"
                          "text" +
                          "\x12\x08" + "\x0a\x06" +
                          "\x0a\x01"
                          "a" +
                          "\x0a\x01"
                          "b";
  ASSERT_EQ(two.size(), 20u);
  auto values = ExampleBytesFeature(two, "text");
  EXPECT_EQ(values.status().message(),
            "feature 'text' holds 2 values, expected 1");
  // A length past the end, a truncated varint, a group.
  EXPECT_EQ(ExampleBytesFeature("\x0a\x05\x0a", "text").status().message(),
            "is not a serialized tf.train.Example (a length of 5 bytes past "
            "the end of its message)");
  EXPECT_EQ(ExampleBytesFeature("\x08\xff", "text").status().message(),
            "is not a serialized tf.train.Example (a truncated varint)");
  EXPECT_NE(ExampleBytesFeature("\x0b", "text")
                .status()
                .message()
                .find("wire type 3"),
            std::string::npos);
  // Unknown fields are skipped; an empty message has no features.
  EXPECT_EQ(ExampleBytesFeature(std::string("\x10\x05", 2), "text")
                .status()
                .message(),
            "has no feature 'text'");
}

}  // namespace
}  // namespace multislice::train
