// The safetensors writer and reader against the format's definition: the
// writer's bytes against a file laid out here by hand, a hand-laid file with
// BF16, F16 and F32 tensors read back to known values, a round trip, and
// every hostile header the reader refuses, each with its sentence.
#include "train/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "common/temp_dir.h"

namespace multislice::train {
namespace {

// The 8 length bytes (little-endian) and the header, as the format defines.
std::string LengthPrefix(uint64_t n) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i)
    bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes;
}

std::string Laid(const std::string& header, const std::string& data) {
  return LengthPrefix(header.size()) + header + data;
}

// Little-endian bytes of 16- and 32-bit patterns.
std::string U16(std::initializer_list<uint16_t> values) {
  std::string out;
  for (uint16_t v : values) {
    out += static_cast<char>(v & 0xff);
    out += static_cast<char>(v >> 8);
  }
  return out;
}

std::string F32(std::initializer_list<float> values) {
  std::string out;
  for (float f : values) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int i = 0; i < 4; ++i) out += static_cast<char>((u >> (8 * i)) & 0xff);
  }
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& bytes, const std::string& name = "f") {
    const std::string path = dir_.path() + "/" + name + ".safetensors";
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  // Opens a file of these bytes; expects the refusal to name the file and
  // hold every one of `phrases`.
  void ExpectRefused(const std::string& bytes,
                     const std::vector<std::string>& phrases) {
    const std::string path = Write(bytes, "hostile");
    auto r = SafetensorsReader::Open(path);
    ASSERT_FALSE(r.ok()) << "accepted: " << bytes.substr(8);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    const std::string m = r.status().message();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    for (const std::string& p : phrases) {
      EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
    }
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }

  TempDir dir_{"multislice-safetensors-"};
};

TEST_F(SafetensorsTest, WriterLaysOutTheBytesOfTheDefinition) {
  const std::string path = dir_.path() + "/w.safetensors";
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"x",
                                 {2},
                                 [](float* o) {
                                   o[0] = 1.0f;
                                   o[1] = -2.0f;
                                 }},
                                {"s", {}, [](float* o) { o[0] = 0.5f; }}},
                               {{{"format", "pt"}}, {}})
                  .ok());
  // Compact JSON, __metadata__ first, tensors in order from 0, padded with
  // spaces so that 8 + N is a multiple of 8.
  std::string header =
      R"({"__metadata__":{"format":"pt"},"x":{"dtype":"F32","shape":[2],)"
      R"("data_offsets":[0,8]},"s":{"dtype":"F32","shape":[],)"
      R"("data_offsets":[8,12]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  EXPECT_EQ(ReadAll(path), Laid(header, F32({1.0f, -2.0f, 0.5f})));
  EXPECT_FALSE(
      std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST_F(SafetensorsTest, ReadsAHandLaidFileOfEveryDtype) {
  // Unpadded and in no particular key order: both are valid.
  const std::string header =
      R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
      R"("__metadata__":{"format":"pt","note":"by hand"},)"
      R"("h":{"dtype":"F16","shape":[5],"data_offsets":[4,14]},)"
      R"("f":{"dtype":"F32","shape":[1,2],"data_offsets":[14,22]}})";
  const std::string data = U16({0x3f80, 0xc000}) +  // bf16 1, -2
                           U16({0x3c00, 0x0001, 0xfc00, 0x7bff, 0xb800}) +
                           F32({0.5f, 3.25f});
  auto r = SafetensorsReader::Open(Write(Laid(header, data)));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->metadata().at("note"), "by hand");
  ASSERT_EQ(r->tensors().size(), 3u);
  EXPECT_EQ(r->tensors()[0].name, "b");  // data order
  EXPECT_EQ(r->tensors()[2].name, "f");
  EXPECT_EQ(r->Find("f")->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r->Find("missing"), nullptr);
  float b[2], h[5], f[2];
  ASSERT_TRUE(r->ReadF32(*r->Find("b"), b).ok());
  ASSERT_TRUE(r->ReadF32(*r->Find("h"), h).ok());
  ASSERT_TRUE(r->ReadF32(*r->Find("f"), f).ok());
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -2.0f);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], std::ldexp(1.0f, -24));  // the smallest subnormal
  EXPECT_EQ(h[2], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(h[3], 65504.0f);  // the largest half
  EXPECT_EQ(h[4], -0.5f);
  EXPECT_EQ(f[0], 0.5f);
  EXPECT_EQ(f[1], 3.25f);
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
}

TEST_F(SafetensorsTest, RoundTripKeepsNamesShapesAndBits) {
  std::vector<float> big(3 * 1000);
  for (size_t i = 0; i < big.size(); ++i) {
    big[i] = std::sin(static_cast<float>(i)) * 1e3f;
  }
  big[7] = -0.0f;
  big[8] = std::numeric_limits<float>::denorm_min();
  const std::string path = dir_.path() + "/rt.safetensors";
  uint64_t last_written = 0, total = 0;
  SafetensorsWriteOptions options;
  options.metadata = {{"format", "pt"}, {"step", "12"}};
  options.progress = [&](uint64_t w, uint64_t t) {
    EXPECT_GE(w, last_written);
    last_written = w;
    total = t;
  };
  auto copy = [&](float* out) { std::copy(big.begin(), big.end(), out); };
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"model.w", {3, 1000}, copy},
                                {"empty", {0, 4}, nullptr},
                                {"one", {1}, [](float* o) { o[0] = 7; }}},
                               options)
                  .ok());
  EXPECT_EQ(last_written, total);
  EXPECT_EQ(std::filesystem::file_size(path), total);
  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->metadata(), options.metadata);
  ASSERT_EQ(r->tensors().size(), 3u);
  const SafetensorsTensor* w = r->Find("model.w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, "F32");
  EXPECT_EQ(w->shape, (std::vector<int64_t>{3, 1000}));
  std::vector<float> back(big.size());
  ASSERT_TRUE(r->ReadF32(*w, back.data()).ok());
  EXPECT_EQ(std::memcmp(back.data(), big.data(), big.size() * 4), 0);
  EXPECT_EQ(r->Find("empty")->elements(), 0);
  // 8 + N is a multiple of 8, and the header is padded with spaces.
  const std::string bytes = ReadAll(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
}

TEST_F(SafetensorsTest, WriterRefusesNamesItCannotWrite) {
  const std::string path = dir_.path() + "/bad.safetensors";
  auto s = WriteSafetensors(path, {{"a", {1}, nullptr}, {"a", {1}, nullptr}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'a'"), std::string::npos) << s.message();
  EXPECT_EQ(WriteSafetensors(path, {{"__metadata__", {1}, nullptr}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensors(path, {{"neg", {-1}, nullptr}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(path));
  // An unwritable place: nothing is left behind.
  const std::string missing = dir_.path() + "/no/such/dir/m.safetensors";
  auto io = WriteSafetensors(missing, {{"a", {1}, nullptr}});
  EXPECT_EQ(io.code(), StatusCode::kInternal);
  EXPECT_NE(io.message().find(missing), std::string::npos) << io.message();
}

constexpr char kTensorA[] =
    R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

TEST_F(SafetensorsTest, RefusesShortFilesAndBadHeaderLengths) {
  ExpectRefused("abc", {"3 bytes", "8-byte header length"});
  ExpectRefused(LengthPrefix(uint64_t{1} << 40) + "{}",
                {"header length 1099511627776", "exceeds the limit"});
  ExpectRefused(LengthPrefix(64) + "{}",
                {"header length 64", "past the end of the file"});
}

TEST_F(SafetensorsTest, RefusesHeadersThatAreNotTheFormatsJson) {
  ExpectRefused(Laid("{\"a\":", ""), {"not valid JSON"});
  ExpectRefused(Laid("[1,2]", ""), {"not a JSON object"});
  ExpectRefused(Laid(R"({"a":{"dtype":[[[[1]]]]}})", ""), {"nests deeper"});
  ExpectRefused(
      Laid(std::string("{") + kTensorA + "," + kTensorA + "}", F32({1, 2})),
      {"names tensor 'a' twice"});
  ExpectRefused(Laid(R"({"a":{"dtype":"F32","shape":[2],"dtype":"I64",)"
                     R"("data_offsets":[0,8]}})",
                     F32({1, 2})),
                {"gives 'dtype' twice in the entry of 'a'"});
  ExpectRefused(Laid(R"({"a":{"dtype":"F32","shape":[2]}})", ""),
                {"tensor 'a'", "dtype, shape and data_offsets"});
  ExpectRefused(Laid(R"({"__metadata__":{"k":1}})", ""),
                {"__metadata__ is not an object of strings"});
}

TEST_F(SafetensorsTest, RefusesDtypesItDoesNotReadNamingThem) {
  ExpectRefused(
      Laid(R"({"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
           std::string(8, '\0')),
      {"tensor 'i'", "dtype I64", "only F32, BF16 and F16"});
  ExpectRefused(
      Laid(R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
           std::string(8, '\0')),
      {"tensor 'd'", "dtype F64"});
}

TEST_F(SafetensorsTest, RefusesShapesThatDisagreeWithTheirBytes) {
  ExpectRefused(
      Laid(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
           F32({1, 2})),
      {"tensor 'a'", "shape [3] of F32 is 12 bytes", "hold 8"});
  ExpectRefused(
      Laid(R"({"a":{"dtype":"BF16","shape":[-2],"data_offsets":[0,4]}})",
           F32({1})),
      {"tensor 'a'", "not an array of sizes"});
  ExpectRefused(Laid(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                     R"("data_offsets":[0,8]}})",
                     F32({1, 2})),
                {"tensor 'a'", "more elements than fit in 64 bits"});
}

TEST_F(SafetensorsTest, RefusesOffsetsOutOfRangeReversedOverlappingOrGapped) {
  // Truncated: the header promises 8 bytes, the file holds 4.
  ExpectRefused(
      Laid(std::string("{") + kTensorA + "}", F32({1})),
      {"tensor 'a'", "[0, 8)", "past the end of the data", "truncated"});
  ExpectRefused(
      Laid(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})",
           F32({1, 2})),
      {"tensor 'a'", "[8,0]", "end before they begin"});
  ExpectRefused(
      Laid(std::string("{") + kTensorA +
               R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           F32({1, 2, 3})),
      {"tensor 'b'", "overlaps tensor 'a'"});
  ExpectRefused(
      Laid(std::string("{") + kTensorA +
               R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
           F32({1, 2, 3, 4})),
      {"bytes [8, 12)", "before tensor 'b'", "belong to no tensor"});
  ExpectRefused(Laid(std::string("{") + kTensorA + "}", F32({1, 2, 3})),
                {"12 bytes", "tensors end at byte 8"});
  ExpectRefused(
      Laid(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,"8"]}})",
           F32({1, 2})),
      {"tensor 'a'", "not a pair of byte offsets"});
}

TEST_F(SafetensorsTest, AFileThatShrinksAfterOpenIsRefusedOnRead) {
  const std::string path =
      Write(Laid(std::string("{") + kTensorA + "}", F32({1, 2})));
  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  float out[2];
  const Status s = r->ReadF32(*r->Find("a"), out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ends inside tensor 'a'"), std::string::npos)
      << s.message();
}

TEST_F(SafetensorsTest, AMissingFileIsOneSentence) {
  auto r = SafetensorsReader::Open(dir_.path() + "/none.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("none.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace multislice::train
