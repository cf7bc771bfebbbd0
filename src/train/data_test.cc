// Token files of every version and width, and the iterator over them,
// checked against a reader written here from the format in data.h (a plain
// loop over the file's bytes), not against data.cc's own reader.
#include "train/data.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/temp_dir.h"
#include "train/data_test_util.h"

namespace multislice::train {
namespace {

using testing_util::ReadBytes;
using testing_util::WriteBytes;

namespace fs = std::filesystem;

std::vector<uint8_t> Bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

uint64_t LittleEndian(const std::string& bytes, size_t offset, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; ++i) {
    v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[offset + i]))
         << (8 * i);
  }
  return v;
}

// The reference reader: the header fields and tokens of a token file,
// decoded by hand from data.h's layout.
struct PlainFile {
  uint32_t version = 0, vocab = 0, width = 0;
  uint64_t count = 0, checksum = 0;
  std::vector<int64_t> tokens;
};
PlainFile ReadPlain(const std::string& path) {
  const std::string bytes = ReadBytes(path);
  PlainFile f;
  EXPECT_GE(bytes.size(), 40u);
  if (bytes.size() < 40) return f;
  EXPECT_EQ(bytes.substr(0, 8), "MSTOKENS");
  f.version = static_cast<uint32_t>(LittleEndian(bytes, 8, 4));
  f.vocab = static_cast<uint32_t>(LittleEndian(bytes, 12, 4));
  f.width = static_cast<uint32_t>(LittleEndian(bytes, 16, 4));
  EXPECT_EQ(LittleEndian(bytes, 20, 4), 0u);
  f.count = LittleEndian(bytes, 24, 8);
  f.checksum = LittleEndian(bytes, 32, 8);
  for (size_t off = 40; off + f.width <= bytes.size(); off += f.width) {
    f.tokens.push_back(static_cast<int64_t>(LittleEndian(bytes, off, f.width)));
  }
  return f;
}

// Builds a file's bytes by hand: a header of the given fields and the
// tokens at `width` bytes each.
std::string HandMadeFile(uint32_t version, uint32_t vocab, uint32_t width,
                         const std::vector<uint32_t>& tokens) {
  std::string payload;
  for (uint32_t t : tokens) {
    for (uint32_t b = 0; b < width; ++b) payload.push_back(char(t >> (8 * b)));
  }
  std::string out = "MSTOKENS";
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(char(v >> (8 * i)));
  };
  put(version, 4);
  put(vocab, 4);
  put(width, 4);
  put(0, 4);
  put(tokens.size(), 8);
  put(Fnv1a64(payload.data(), payload.size()), 8);
  return out + payload;
}

// The widths the writer picks and a vocabulary of each.
struct WidthCase {
  uint32_t vocab;
  uint32_t width;
};
const WidthCase kWidths[] = {{256, 1}, {50257, 2}, {100000, 4}};

// Token i of a pattern file over `vocab`: spread over the whole vocabulary
// (the top ids too), and distinct for nearby positions.
int32_t PatternToken(int64_t i, uint32_t vocab) {
  return static_cast<int32_t>(SplitMix64(static_cast<uint64_t>(i)) % vocab);
}

std::string WritePatternFile(const TempDir& dir, int64_t count,
                             uint32_t vocab = 251) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) tokens[i] = PatternToken(i, vocab);
  const std::string path =
      dir.path() + "/pattern" + std::to_string(vocab) + ".bin";
  Status s = WriteTokenFile(path, tokens, vocab == 251 ? 256 : vocab);
  EXPECT_TRUE(s.ok()) << s.message();
  return path;
}

TEST(TokenFile, WidthFollowsTheVocabulary) {
  EXPECT_EQ(TokenWidthFor(1), 1u);
  EXPECT_EQ(TokenWidthFor(256), 1u);
  EXPECT_EQ(TokenWidthFor(257), 2u);
  EXPECT_EQ(TokenWidthFor(65536), 2u);
  EXPECT_EQ(TokenWidthFor(65537), 4u);
  EXPECT_EQ(TokenWidthFor(kMaxTokenVocabSize), 4u);
}

TEST(TokenFile, RoundTripEveryWidth) {
  for (const WidthCase& w : kWidths) {
    TempDir dir;
    const std::string path = dir.path() + "/t.bin";
    std::vector<int32_t> tokens = {0, 1, static_cast<int32_t>(w.vocab - 1)};
    for (int i = 0; i < 1000; ++i) tokens.push_back(PatternToken(i, w.vocab));
    ASSERT_TRUE(WriteTokenFile(path, tokens, w.vocab).ok());
    const PlainFile plain = ReadPlain(path);
    EXPECT_EQ(plain.version, 2u);
    EXPECT_EQ(plain.vocab, w.vocab);
    EXPECT_EQ(plain.width, w.width);
    EXPECT_EQ(plain.count, tokens.size());
    EXPECT_EQ(fs::file_size(path), 40 + tokens.size() * w.width);
    ASSERT_EQ(plain.tokens.size(), tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      ASSERT_EQ(plain.tokens[i], tokens[i]) << "width " << w.width;
    }
    const std::string bytes = ReadBytes(path);
    EXPECT_EQ(plain.checksum, Fnv1a64(bytes.data() + 40, bytes.size() - 40));
    auto header = ReadTokenFileHeader(path);
    ASSERT_TRUE(header.ok()) << header.status().message();
    EXPECT_EQ(header->token_width_bytes, w.width);
    EXPECT_EQ(header->vocab_size, w.vocab);
    auto read = ReadTokenFile(path);
    ASSERT_TRUE(read.ok()) << read.status().message();
    EXPECT_EQ(*read, tokens);
    // Nothing but the file is left in the directory.
    EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()),
                            fs::directory_iterator()),
              1);
  }
}

TEST(TokenFile, StreamingWriterMatchesWholeWriteAndStagesUntilCommit) {
  TempDir dir;
  const uint32_t vocab = 50257;
  std::vector<int32_t> tokens;
  // Over the writer's 1 MiB buffer, so that it flushes in between.
  for (int i = 0; i < 700'000; ++i) tokens.push_back(PatternToken(i, vocab));
  ASSERT_TRUE(WriteTokenFile(dir.path() + "/whole.bin", tokens, vocab).ok());
  auto writer = TokenFileWriter::Create(dir.path() + "/streamed.bin", vocab);
  ASSERT_TRUE(writer.ok());
  for (size_t i = 0; i < tokens.size(); i += 777) {
    const size_t n = std::min<size_t>(777, tokens.size() - i);
    ASSERT_TRUE(writer->Append(tokens.data() + i, n).ok());
  }
  EXPECT_FALSE(fs::exists(dir.path() + "/streamed.bin"));
  ASSERT_TRUE(writer->Finish().ok());
  EXPECT_FALSE(fs::exists(dir.path() + "/streamed.bin"));
  ASSERT_TRUE(writer->Commit().ok());
  EXPECT_EQ(ReadBytes(dir.path() + "/streamed.bin"),
            ReadBytes(dir.path() + "/whole.bin"));
}

TEST(TokenFile, UncommittedWriterLeavesNothing) {
  TempDir dir;
  {
    auto writer = TokenFileWriter::Create(dir.path() + "/t.bin", 256);
    ASSERT_TRUE(writer.ok());
    const int32_t tokens[] = {1, 2, 3};
    ASSERT_TRUE(writer->Append(tokens, 3).ok());
    const int32_t outside[] = {256};
    Status s = writer->Append(outside, 1);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), dir.path() +
                               "/t.bin: token 256 is outside the vocabulary "
                               "of 256");
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(TokenFile, ByteTokensRoundTrip) {
  TempDir dir;
  const std::string path = dir.path() + "/t.bin";
  std::vector<uint8_t> bytes = Bytes("hello, world\n");
  bytes.push_back(0);
  bytes.push_back(255);
  ASSERT_TRUE(WriteTokenFile(path, bytes).ok());
  auto read = ReadTokenFile(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(*read, std::vector<int32_t>(bytes.begin(), bytes.end()));
  EXPECT_EQ(ReadPlain(path).width, 1u);
}

TEST(TokenFile, Version1FilesStayReadable) {
  TempDir dir;
  const std::string path = dir.path() + "/v1.bin";
  const std::string text = "%\nold bytes\n";
  WriteBytes(path, HandMadeFile(1, 256, 1, {text.begin(), text.end()}));
  auto header = ReadTokenFileHeader(path);
  ASSERT_TRUE(header.ok()) << header.status().message();
  EXPECT_EQ(header->format_version, 1u);
  auto read = ReadTokenFile(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(*read, std::vector<int32_t>(text.begin(), text.end()));
  DataIteratorOptions o;
  o.token_file = path;
  o.seq_len = 4;
  auto it = DataIterator::Create(o);
  ASSERT_TRUE(it.ok()) << it.status().message();
  const Batch b = it->At(3);
  for (int t = 0; t < 4; ++t) EXPECT_EQ(b.inputs[t], text[b.starts[0] + t]);
}

TEST(TokenFile, EmptyRoundTrip) {
  TempDir dir;
  const std::string path = dir.path() + "/empty.bin";
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint8_t>{}).ok());
  auto read = ReadTokenFile(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_TRUE(read->empty());
}

TEST(TokenFile, Fnv1aKnownValues) {
  EXPECT_EQ(Fnv1a64("", 0), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a64("a", 1), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a64("foobar", 6), 0x85944171f73967e8ULL);
}

class CorruptTokenFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() + "/train.bin";
    ASSERT_TRUE(WriteTokenFile(path_, Bytes("some tokens to corrupt\n")).ok());
    bytes_ = ReadBytes(path_);
  }
  Status Reread(const std::string& bytes) {
    WriteBytes(path_, bytes);
    return ReadTokenFile(path_).status();
  }
  void ExpectError(const Status& s, const std::string& fragment) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_EQ(s.message().rfind(path_ + ": ", 0), 0u) << s.message();
    EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
  }

  TempDir dir_;
  std::string path_;
  std::string bytes_;
};

TEST_F(CorruptTokenFile, FlippedPayloadByte) {
  std::string bytes = bytes_;
  bytes[kTokenFileHeaderBytes + 5] ^= 0x01;
  Status s = Reread(bytes);
  EXPECT_EQ(s.message(),
            path_ + ": checksum mismatch (file is corrupt or truncated)");
}

TEST_F(CorruptTokenFile, FlippedPayloadByteOfWideTokens) {
  std::vector<int32_t> tokens = {70000, 5, 99999};
  ASSERT_TRUE(WriteTokenFile(path_, tokens, 100000).ok());
  std::string bytes = ReadBytes(path_);
  bytes[kTokenFileHeaderBytes + 9] ^= 0x10;
  ExpectError(Reread(bytes), "checksum mismatch");
}

TEST_F(CorruptTokenFile, TruncatedPayload) {
  Status s = Reread(bytes_.substr(0, bytes_.size() - 3));
  ExpectError(s, "corrupt or truncated");
  // The header alone also sees it.
  ExpectError(ReadTokenFileHeader(path_).status(), "declares 23 tokens");
}

TEST_F(CorruptTokenFile, WrongSizeForTheWidth) {
  // 3 two-byte tokens declared, 5 payload bytes present.
  std::string bytes = HandMadeFile(2, 1000, 2, {1, 2, 3});
  ExpectError(Reread(bytes.substr(0, bytes.size() - 1)),
              "payload is 5 bytes but the header declares 3 tokens of 2 "
              "bytes");
}

TEST_F(CorruptTokenFile, TruncatedHeader) {
  ExpectError(Reread(bytes_.substr(0, 10)), "shorter than the 40-byte");
  ExpectError(Reread(""), "file is 0 bytes");
}

TEST_F(CorruptTokenFile, WrongMagic) {
  std::string bytes = bytes_;
  bytes[0] = 'X';
  ExpectError(Reread(bytes), "not a token file");
}

TEST_F(CorruptTokenFile, UnknownVersion) {
  std::string bytes = bytes_;
  bytes[8] = 3;
  Status s = Reread(bytes);
  ExpectError(s, "format version 3 is not supported");
  EXPECT_NE(s.message().find("versions 1 and 2"), std::string::npos);
}

TEST_F(CorruptTokenFile, WidthsEachVersionRefuses) {
  ExpectError(Reread(HandMadeFile(2, 256, 3, {1})),
              "token width 3 bytes is not supported by format version 2 "
              "(expected 1, 2 or 4)");
  ExpectError(Reread(HandMadeFile(1, 256, 2, {1})),
              "token width 2 bytes is not supported by format version 1 "
              "(expected 1)");
  ExpectError(Reread(HandMadeFile(2, 300, 1, {1})),
              "vocabulary size 300 does not fit 1-byte tokens");
  ExpectError(Reread(HandMadeFile(2, 65537, 2, {1})),
              "vocabulary size 65537 does not fit 2-byte tokens");
  ExpectError(Reread(HandMadeFile(2, 0x80000000u, 4, {1})),
              "vocabulary size 2147483648 does not fit 4-byte tokens");
  ExpectError(Reread(HandMadeFile(2, 0, 2, {})), "vocabulary size 0");
}

TEST_F(CorruptTokenFile, TokenOutsideTheVocabulary) {
  // A consistent file (right checksum) whose third token is the vocabulary
  // size: the reader and the iterator both refuse it.
  std::vector<uint32_t> tokens(40, 7);
  tokens[2] = 1000;
  WriteBytes(path_, HandMadeFile(2, 1000, 2, tokens));
  ExpectError(ReadTokenFile(path_).status(),
              "token 1000 at index 2 is outside the vocabulary of 1000");
  DataIteratorOptions o;
  o.token_file = path_;
  o.seq_len = 4;
  ExpectError(DataIterator::Create(o).status(),
              "token 1000 at index 2 is outside the vocabulary of 1000");
}

TEST_F(CorruptTokenFile, ExtraBytes) {
  ExpectError(Reread(bytes_ + "x"), "corrupt or truncated");
}

TEST(TokenFile, MissingIsNotFound) {
  EXPECT_EQ(ReadTokenFile("/nonexistent/dir/x.bin").status().code(),
            StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------

// Host `host` of `hosts`, each with 4 rows of the global batch.
DataIteratorOptions Options(const std::string& path, int host, int hosts) {
  DataIteratorOptions o;
  o.token_file = path;
  o.global_rows = 4 * hosts;
  o.row_begin = 4 * host;
  o.rows = 4;
  o.seq_len = 16;
  o.seed = 1234;
  return o;
}

bool SameBatch(const Batch& a, const Batch& b) {
  return a.step == b.step && a.inputs == b.inputs && a.targets == b.targets &&
         a.starts == b.starts;
}

TEST(DataIterator, WindowsAreFileTokensAndTargetsShiftByOne) {
  TempDir dir;
  const std::string path = WritePatternFile(dir, 5000);
  auto it = DataIterator::Create(Options(path, 0, 1));
  ASSERT_TRUE(it.ok()) << it.status().message();
  for (int64_t step = 0; step < 20; ++step) {
    Batch b = it->At(step);
    ASSERT_EQ(b.inputs.size(), 4u * 16u);
    for (int r = 0; r < b.rows; ++r) {
      const int64_t start = b.starts[r];
      ASSERT_GE(start, 0);
      ASSERT_LE(start + 16, 4999);
      for (int t = 0; t < 16; ++t) {
        EXPECT_EQ(b.inputs[r * 16 + t], PatternToken(start + t, 251));
        EXPECT_EQ(b.targets[r * 16 + t], PatternToken(start + t + 1, 251));
        if (t + 1 < 16) {
          EXPECT_EQ(b.targets[r * 16 + t], b.inputs[r * 16 + t + 1]);
        }
      }
    }
  }
}

TEST(DataIterator, SameSeedAndStepGiveSameBatch) {
  TempDir dir;
  const std::string path = WritePatternFile(dir, 5000);
  auto a = DataIterator::Create(Options(path, 1, 2));
  auto b = DataIterator::Create(Options(path, 1, 2));
  DataIteratorOptions other_seed = Options(path, 1, 2);
  other_seed.seed = 99;
  auto c = DataIterator::Create(other_seed);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE(SameBatch(a->At(7), b->At(7)));
  EXPECT_FALSE(SameBatch(a->At(7), a->At(8)));
  EXPECT_NE(a->At(7).starts, c->At(7).starts);
}

TEST(DataIterator, HostsReadOnlyTheirOwnShards) {
  TempDir dir;
  const int64_t total = 10007;
  const std::string path = WritePatternFile(dir, total);
  const int hosts = 3;
  const int64_t G = 4 * hosts;
  int64_t covered = 0;
  for (int host = 0; host < hosts; ++host) {
    auto it = DataIterator::Create(Options(path, host, hosts));
    ASSERT_TRUE(it.ok()) << it.status().message();
    EXPECT_EQ(it->shard_begin(), total * 4 * host / G);
    EXPECT_EQ(it->shard_tokens(),
              total * 4 * (host + 1) / G - total * 4 * host / G);
    covered += it->shard_tokens();
    for (int r = 0; r < 4; ++r) {
      const int64_t g = 4 * host + r;
      const int64_t begin = total * g / G, end = total * (g + 1) / G;
      int64_t lowest = end, highest = begin;
      for (int64_t step = 0; step < 300; ++step) {
        const int64_t start = it->At(step).starts[r];
        ASSERT_GE(start, begin);
        ASSERT_LE(start + 16, end - 1);  // the last target is inside
        lowest = std::min(lowest, start);
        highest = std::max(highest, start);
      }
      // 300 draws spread over the whole row shard.
      EXPECT_LT(lowest - begin, (end - begin) / 10);
      EXPECT_GT(highest - begin, (end - begin) * 9 / 10 - 16);
    }
  }
  EXPECT_EQ(covered, total);
}

TEST(DataIterator, BatchesDoNotDependOnHowRowsAreSpreadOverHosts) {
  TempDir dir;
  const std::string path = WritePatternFile(dir, 20011);
  DataIteratorOptions whole = Options(path, 0, 1);
  whole.global_rows = whole.rows = 8;
  auto one = DataIterator::Create(whole);
  ASSERT_TRUE(one.ok());
  for (int64_t step : {0, 5, 99}) {
    const Batch all = one->At(step);
    std::vector<int32_t> joined;
    for (int host = 0; host < 2; ++host) {
      auto part = DataIterator::Create(Options(path, host, 2));
      ASSERT_TRUE(part.ok());
      const Batch b = part->At(step);
      joined.insert(joined.end(), b.inputs.begin(), b.inputs.end());
    }
    EXPECT_EQ(joined, all.inputs) << "step " << step;
  }
}

TEST(DataIterator, AtMatchesNextAndRestoreContinues) {
  TempDir dir;
  const std::string path = WritePatternFile(dir, 5000);
  auto it = DataIterator::Create(Options(path, 0, 2));
  ASSERT_TRUE(it.ok());
  std::vector<Batch> seen;
  for (int s = 0; s < 10; ++s) {
    auto b = it->Next();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->step, s);
    EXPECT_TRUE(SameBatch(*b, it->At(s)));
    seen.push_back(*b);
  }
  EXPECT_EQ(it->state().step, 10);

  // Checkpoint at step 4 through JSON, then a fresh iterator continues.
  auto fresh = DataIterator::Create(Options(path, 0, 2));
  ASSERT_TRUE(fresh.ok());
  IteratorState saved = fresh->state();
  saved.step = 4;
  auto parsed = IteratorStateFromJson(
      nlohmann::json::parse(IteratorStateToJson(saved).dump()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->step, 4);
  EXPECT_EQ(parsed->seed, 1234u);
  ASSERT_TRUE(fresh->Restore(*parsed).ok());
  for (int s = 4; s < 10; ++s) {
    auto b = fresh->Next();
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(SameBatch(*b, seen[s])) << "step " << s;
  }
}

TEST(DataIterator, RestoreRejectsMismatches) {
  TempDir dir;
  const std::string path = WritePatternFile(dir, 5000);
  auto it = DataIterator::Create(Options(path, 0, 2));
  ASSERT_TRUE(it.ok());
  IteratorState s = it->state();
  s.format_version = 1;
  Status r = it->Restore(s);
  EXPECT_EQ(r.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.message().find("format_version 1"), std::string::npos);
  EXPECT_NE(r.message().find("reads 2"), std::string::npos);

  s = it->state();
  s.global_rows = 4;
  r = it->Restore(s);
  EXPECT_EQ(r.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.message().find("global_rows 4"), std::string::npos);
  EXPECT_NE(r.message().find("batch of 8 rows"), std::string::npos);

  // Another row range of the same global batch is a resharded run: allowed.
  s = it->state();
  s.row_begin = 0;
  s.rows = 8;
  s.step = 3;
  EXPECT_TRUE(it->Restore(s).ok());
  EXPECT_EQ(it->state().step, 3);

  s = it->state();
  s.seed = 1;
  EXPECT_EQ(it->Restore(s).code(), StatusCode::kInvalidArgument);

  auto bad = IteratorStateFromJson(nlohmann::json{{"step", "x"}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(DataIterator, BadOptions) {
  TempDir dir;
  const std::string path = WritePatternFile(dir, 100);
  EXPECT_EQ(DataIterator::Create(Options(path, 2, 2)).status().code(),
            StatusCode::kInvalidArgument);
  // 100 tokens over 2 hosts of 4 rows is 12 per row, fewer than 17.
  auto small = DataIterator::Create(Options(path, 0, 2));
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("fewer than seq_len + 1 = 17"),
            std::string::npos);
  EXPECT_EQ(
      DataIterator::Create(Options(dir.path() + "/none", 0, 1)).status().code(),
      StatusCode::kNotFound);
}

// The window start of global row g at step s, from data.h's rule written
// out here: g*N/G plus the splitmix64 mix of (seed, s, g) mapped onto the
// row shard's valid starts.
int64_t ReferenceStart(uint64_t seed, int64_t step, int64_t g, int64_t G,
                       int64_t N, int seq_len) {
  const int64_t begin = N * g / G, end = N * (g + 1) / G;
  const uint64_t key = SplitMix64(SplitMix64(seed) ^ uint64_t(step));
  const uint64_t h = SplitMix64(key ^ uint64_t(g));
  const auto valid = static_cast<uint64_t>(end - begin - seq_len);
  return begin + static_cast<int64_t>(
                     (static_cast<unsigned __int128>(h) * valid) >> 64);
}

TEST(DataIteratorWidths, BatchesMatchAPlainLoopOverTheFile) {
  const int64_t total = 9001;
  for (const WidthCase& w : kWidths) {
    TempDir dir;
    const std::string path = WritePatternFile(dir, total, w.vocab);
    const PlainFile plain = ReadPlain(path);
    ASSERT_EQ(plain.width, w.width);
    ASSERT_EQ(plain.tokens.size(), static_cast<size_t>(total));
    for (int host = 0; host < 2; ++host) {
      auto it = DataIterator::Create(Options(path, host, 2));
      ASSERT_TRUE(it.ok()) << it.status().message();
      EXPECT_EQ(it->vocab_size(), w.vocab);
      for (int64_t step = 0; step < 25; ++step) {
        const Batch b = it->At(step);
        for (int r = 0; r < 4; ++r) {
          const int64_t g = 4 * host + r;
          const int64_t start = ReferenceStart(1234, step, g, 8, total, 16);
          ASSERT_EQ(b.starts[r], start) << "width " << w.width;
          for (int t = 0; t < 16; ++t) {
            ASSERT_EQ(b.inputs[r * 16 + t], plain.tokens[start + t]);
            ASSERT_EQ(b.targets[r * 16 + t], plain.tokens[start + t + 1]);
          }
        }
      }
    }
  }
}

TEST(DataIteratorWidths, SameBatchesOnEveryMeshAndAfterRestore) {
  for (const WidthCase& w : kWidths) {
    TempDir dir;
    const std::string path = WritePatternFile(dir, 20011, w.vocab);
    // The global batch of 8 rows on 1, 2 and 4 hosts.
    for (int64_t step : {0, 3, 77}) {
      std::vector<std::vector<int32_t>> joined(3);
      for (int split = 0; split < 3; ++split) {
        const int hosts = 1 << split, rows = 8 / hosts;
        for (int host = 0; host < hosts; ++host) {
          DataIteratorOptions o = Options(path, 0, 1);
          o.global_rows = 8;
          o.rows = rows;
          o.row_begin = rows * host;
          auto it = DataIterator::Create(o);
          ASSERT_TRUE(it.ok()) << it.status().message();
          const Batch b = it->At(step);
          joined[split].insert(joined[split].end(), b.inputs.begin(),
                               b.inputs.end());
        }
      }
      EXPECT_EQ(joined[0], joined[1]) << "width " << w.width;
      EXPECT_EQ(joined[0], joined[2]) << "width " << w.width;
    }
    // A state saved after 6 steps on 2 hosts, restored on 1: the next
    // batch's rows of host 1 are the same.
    auto two = DataIterator::Create(Options(path, 1, 2));
    ASSERT_TRUE(two.ok());
    for (int s = 0; s < 6; ++s) ASSERT_TRUE(two->Next().ok());
    const IteratorState saved = two->state();
    auto expected = two->Next();
    DataIteratorOptions whole = Options(path, 0, 1);
    whole.global_rows = whole.rows = 8;
    auto one = DataIterator::Create(whole);
    ASSERT_TRUE(one.ok());
    auto parsed = IteratorStateFromJson(IteratorStateToJson(saved));
    ASSERT_TRUE(parsed.ok());
    ASSERT_TRUE(one->Restore(*parsed).ok());
    auto next = one->Next();
    ASSERT_TRUE(next.ok() && expected.ok());
    EXPECT_EQ(next->step, 6);
    EXPECT_EQ(
        std::vector<int32_t>(next->inputs.begin() + 4 * 16, next->inputs.end()),
        expected->inputs)
        << "width " << w.width;
  }
}

TEST(DataIteratorWidths, WindowStartsDoNotDependOnTheWidth) {
  TempDir dir;
  std::vector<std::vector<int64_t>> starts;
  for (const WidthCase& w : kWidths) {
    auto it = DataIterator::Create(
        Options(WritePatternFile(dir, 5000, w.vocab), 0, 1));
    ASSERT_TRUE(it.ok());
    starts.push_back(it->At(11).starts);
  }
  EXPECT_EQ(starts[0], starts[1]);
  EXPECT_EQ(starts[0], starts[2]);
}

}  // namespace
}  // namespace multislice::train
