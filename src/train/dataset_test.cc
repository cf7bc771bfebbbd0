// PrepareDataset end to end on every input format (text files, directories,
// JSON Lines, TFRecord written by an independent Python writer), both
// tokenizers, a trained tokenizer, the malformed-record sentences, and that
// a failure leaves nothing behind; dataset.json of both versions.
#include "train/dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/temp_dir.h"
#include "train/data.h"
#include "train/data_test_util.h"
#include "train/tfrecord_test_util.h"

namespace multislice::train {
namespace {

using testing_util::JsonLinesOf;
using testing_util::ProseDocuments;
using testing_util::ReadBytes;
using testing_util::WriteBytes;

namespace fs = std::filesystem;
using testing_util::TextRecord;
using testing_util::WriteTfRecordWithPython;

std::string TokensAsText(const std::string& path) {
  auto tokens = ReadTokenFile(path);
  EXPECT_TRUE(tokens.ok()) << tokens.status().message();
  if (!tokens.ok()) return "";
  return std::string(tokens->begin(), tokens->end());
}

PrepareOptions Options(std::vector<std::string> inputs, std::string output,
                       double fraction = 0.0, uint64_t seed = 7) {
  PrepareOptions o;
  o.inputs = std::move(inputs);
  o.output_dir = std::move(output);
  o.validation_fraction = fraction;
  o.seed = seed;
  return o;
}

// The directory's entries, recursively, as relative paths.
std::set<std::string> Listing(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    names.insert(fs::relative(e.path(), dir).string());
  }
  return names;
}

// The split rule of dataset.h, written out: is document i validation?
bool ReferenceIsValidation(uint64_t seed, int64_t i, double fraction) {
  const uint64_t h = SplitMix64(seed ^ SplitMix64(uint64_t(i)));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < fraction;
}

// ---------------------------------------------------------------------------
// Byte-level, text inputs (the format before SentencePiece)

TEST(PrepareDataset, SplitsOnPercentLines) {
  TempDir dir;
  const std::string input = dir.path() + "/in";
  fs::create_directories(input + "/off");
  WriteBytes(input + "/quotes", "one\nline\n%\ntwo\n%\n\n%\nthree");
  WriteBytes(input + "/quotes.dat", std::string("\0\0\x01binary", 9));
  WriteBytes(input + "/off/rude", "hidden\n");
  WriteBytes(input + "/blob", std::string("a\0b", 3));
  WriteBytes(input + "/bad-utf8", "caf\xe9\n");
  WriteBytes(input + "/surrogate", "\xed\xa0\x80\n");  // not UTF-8
  WriteBytes(input + "/overlong", "\xe0\x80\xaf\n");   // not UTF-8
  fs::create_symlink("quotes", input + "/quotes.u8");
  WriteBytes(dir.path() + "/essay.txt", "a whole file\n%not a separator\n");

  PrepareStats stats;
  const std::string out = dir.path() + "/out";
  Status s =
      PrepareDataset(Options({input, dir.path() + "/essay.txt"}, out), &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(stats.files, 2);
  EXPECT_EQ(stats.skipped_files, 4);  // blob, bad-utf8, surrogate, overlong
  EXPECT_EQ(stats.documents, 4);
  EXPECT_EQ(stats.train_documents, 4);
  EXPECT_EQ(stats.val_documents, 0);
  const std::string expected =
      "one\nline\n%\ntwo\n%\nthree\n%\na whole file\n%not a separator\n%\n";
  EXPECT_EQ(TokensAsText(out + "/train.bin"), expected);
  EXPECT_EQ(stats.train_tokens, static_cast<int64_t>(expected.size()));
  EXPECT_EQ(TokensAsText(out + "/val.bin"), "");
  EXPECT_EQ(Listing(out),
            (std::set<std::string>{"train.bin", "val.bin", "dataset.json"}));

  auto meta = nlohmann::json::parse(ReadBytes(out + "/dataset.json"));
  EXPECT_EQ(meta["format_version"], 2);
  EXPECT_EQ(meta["tokenizer"]["type"], "bytes");
  EXPECT_EQ(meta["tokenizer"]["add_bos"], false);
  EXPECT_EQ(meta["vocab_size"], 256);
  EXPECT_EQ(meta["token_width_bytes"], 1);
  EXPECT_EQ(meta["documents"], 4);
  EXPECT_EQ(meta["train"]["tokens"], stats.train_tokens);
  EXPECT_EQ(meta["sources"].size(), 2u);
  EXPECT_EQ(meta["sources"][0]["format"], "text");
  auto info = ReadDatasetInfo(out);
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_TRUE(info->byte_level());
  EXPECT_EQ(info->vocab_size, 256u);
}

// Many one-line documents: "doc <i>".
std::string ManyDocuments(int count) {
  std::string text;
  for (int i = 0; i < count; ++i) {
    text += "doc " + std::to_string(i) + "\n%\n";
  }
  return text;
}

std::set<std::string> DocumentsIn(const std::string& text) {
  std::set<std::string> docs;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n%\n", pos);
    docs.insert(text.substr(pos, end - pos));
    pos = end + 3;
  }
  return docs;
}

TEST(PrepareDataset, ValidationSplitIsDeterministicAndDisjoint) {
  TempDir dir;
  const std::string input = dir.path() + "/docs";
  WriteBytes(input, ManyDocuments(2000));
  PrepareStats a, b, c;
  const std::string pa = dir.path() + "/a", pb = dir.path() + "/b",
                    pc = dir.path() + "/c";
  ASSERT_TRUE(PrepareDataset(Options({input}, pa, 0.1, 42), &a).ok());
  ASSERT_TRUE(PrepareDataset(Options({input}, pb, 0.1, 42), &b).ok());
  ASSERT_TRUE(PrepareDataset(Options({input}, pc, 0.1, 43), &c).ok());
  EXPECT_EQ(a.documents, 2000);
  EXPECT_EQ(a.train_documents + a.val_documents, 2000);
  EXPECT_GT(a.val_documents, 140);  // ~200 expected
  EXPECT_LT(a.val_documents, 260);
  EXPECT_EQ(ReadBytes(pa + "/val.bin"), ReadBytes(pb + "/val.bin"));
  EXPECT_EQ(ReadBytes(pa + "/train.bin"), ReadBytes(pb + "/train.bin"));
  EXPECT_NE(ReadBytes(pa + "/val.bin"), ReadBytes(pc + "/val.bin"));

  const std::set<std::string> train_docs =
      DocumentsIn(TokensAsText(pa + "/train.bin"));
  const std::set<std::string> val_docs =
      DocumentsIn(TokensAsText(pa + "/val.bin"));
  EXPECT_EQ(static_cast<int64_t>(train_docs.size()), a.train_documents);
  EXPECT_EQ(static_cast<int64_t>(val_docs.size()), a.val_documents);
  for (const std::string& d : val_docs) EXPECT_EQ(train_docs.count(d), 0u);
  // Document i is where the rule written out here puts it.
  for (int i = 0; i < 2000; ++i) {
    const std::string doc = "doc " + std::to_string(i);
    EXPECT_EQ(val_docs.count(doc), ReferenceIsValidation(42, i, 0.1) ? 1u : 0u)
        << doc;
  }
  EXPECT_EQ(a.train_tokens + a.val_tokens,
            static_cast<int64_t>(ManyDocuments(2000).size()));
}

TEST(PrepareDataset, BadOptionsAndInputs) {
  TempDir dir;
  const std::string out = dir.path() + "/o";
  auto error = [&](PrepareOptions o) {
    Status s = PrepareDataset(o, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(fs::exists(out)) << s.message();
    return s.message();
  };
  EXPECT_EQ(error(Options({dir.path() + "/missing"}, out)),
            "--input: '" + dir.path() + "/missing' does not exist");
  WriteBytes(dir.path() + "/t", "text\n");
  EXPECT_EQ(error(Options({dir.path() + "/t"}, out, 1.0)),
            "--validation_fraction: 1.000000 is not in [0, 1)");
  WriteBytes(dir.path() + "/bin", std::string("\0\0", 2));
  EXPECT_EQ(error(Options({dir.path() + "/bin"}, out)),
            "--input: '" + dir.path() +
                "/bin' is not a text file (it holds NUL bytes or invalid "
                "UTF-8)");
  WriteBytes(dir.path() + "/blank", "\n%\n  \n");
  EXPECT_NE(error(Options({dir.path() + "/blank"}, out))
                .find("no training documents"),
            std::string::npos);
  PrepareOptions both = Options({dir.path() + "/t"}, out);
  both.tokenizer_path = dir.path() + "/m.model";
  both.train_tokenizer_vocab = 1000;
  EXPECT_NE(error(both).find("not both"), std::string::npos);
  PrepareOptions bad_model = Options({dir.path() + "/t"}, out);
  bad_model.tokenizer_path = dir.path() + "/t";
  EXPECT_EQ(error(bad_model),
            "--tokenizer: " + dir.path() +
                "/t is not a SentencePiece model (it does not parse as a "
                "ModelProto with pieces)");
  PrepareOptions no_field = Options({dir.path() + "/t"}, out);
  no_field.text_field = "";
  EXPECT_EQ(error(no_field), "--text_field: expected a field name, got ''");
}

TEST(PrepareDataset, FortunesCorpus) {
  if (!fs::is_directory(kDefaultCorpus)) {
    GTEST_SKIP() << kDefaultCorpus << " is not installed";
  }
  TempDir dir;
  PrepareStats stats;
  int progress_calls = 0;
  uint64_t last_bytes = 0;
  PrepareOptions o = Options({kDefaultCorpus}, dir.path(), 0.05, 0);
  o.progress = [&](const PrepareProgress& p) {
    ++progress_calls;
    EXPECT_GE(p.bytes_read, last_bytes);
    EXPECT_LE(p.bytes_read, p.total_bytes);
    last_bytes = p.bytes_read;
  };
  Status s = PrepareDataset(o, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_GT(stats.train_tokens, 1'000'000);
  EXPECT_GT(stats.val_tokens, 0);
  EXPECT_GT(stats.documents, 1000);
  EXPECT_GT(progress_calls, stats.documents);
  auto train = ReadTokenFile(dir.path() + "/train.bin");
  ASSERT_TRUE(train.ok()) << train.status().message();
  EXPECT_EQ(static_cast<int64_t>(train->size()), stats.train_tokens);
  std::printf(
      "fortunes: %d files (%d skipped), %lld documents (train %lld, val "
      "%lld), train %lld tokens, val %lld tokens\n",
      stats.files, stats.skipped_files, static_cast<long long>(stats.documents),
      static_cast<long long>(stats.train_documents),
      static_cast<long long>(stats.val_documents),
      static_cast<long long>(stats.train_tokens),
      static_cast<long long>(stats.val_tokens));
}

// ---------------------------------------------------------------------------
// JSON Lines, TFRecord, directories of them

TEST(PrepareDataset, JsonLines) {
  TempDir dir;
  const std::string input = dir.path() + "/corpus.jsonl";
  WriteBytes(input,
             "{\"text\": \"first\\nsecond line\", \"id\": 1}\n"
             "\n"
             "{\"id\": 2, \"text\": \"caf\\u00e9 \\ud83d\\ude42\"}\n"
             "   \n"
             "{\"text\": \"   \"}\n"
             "{\"text\": \"ends in newline\\n\"}");  // no final newline
  PrepareStats stats;
  ASSERT_TRUE(
      PrepareDataset(Options({input}, dir.path() + "/out"), &stats).ok());
  EXPECT_EQ(stats.documents, 3);  // the blank one dropped
  EXPECT_EQ(TokensAsText(dir.path() + "/out/train.bin"),
            "first\nsecond line\n%\ncaf\xc3\xa9 \xf0\x9f\x99\x82\n%\nends in "
            "newline\n%\n");
  auto meta =
      nlohmann::json::parse(ReadBytes(dir.path() + "/out/dataset.json"));
  EXPECT_EQ(meta["sources"][0]["format"], "jsonl");
  EXPECT_EQ(meta["text_field"], "text");
  EXPECT_EQ(stats.bytes_read, static_cast<int64_t>(fs::file_size(input)));

  // Another field name, and .json read as JSON Lines too.
  WriteBytes(dir.path() + "/c.json", JsonLinesOf({"alpha", "beta"}, "body"));
  PrepareOptions body = Options({dir.path() + "/c.json"}, dir.path() + "/b");
  body.text_field = "body";
  ASSERT_TRUE(PrepareDataset(body, nullptr).ok());
  EXPECT_EQ(TokensAsText(dir.path() + "/b/train.bin"), "alpha\n%\nbeta\n%\n");
}

TEST(PrepareDataset, TfRecordFromAnIndependentWriter) {
  TempDir dir;
  const std::string input = dir.path() + "/corpus.tfrecord";
  ASSERT_TRUE(WriteTfRecordWithPython(
      input, {TextRecord("a fortune\n"),
              {{"features",
                {{"id", {{"int64", {3}}}},
                 {"text", {{"bytes", {"caf\u00e9\nline"}}}}}}},
              TextRecord(" \n")}));
  PrepareStats stats;
  ASSERT_TRUE(
      PrepareDataset(Options({input}, dir.path() + "/out"), &stats).ok());
  EXPECT_EQ(stats.documents, 2);
  EXPECT_EQ(TokensAsText(dir.path() + "/out/train.bin"),
            "a fortune\n%\ncaf\xc3\xa9\nline\n%\n");
  auto meta =
      nlohmann::json::parse(ReadBytes(dir.path() + "/out/dataset.json"));
  EXPECT_EQ(meta["sources"][0]["format"], "tfrecord");
  EXPECT_EQ(meta["sources"][0]["documents"], 2);
}

TEST(PrepareDataset, DirectoryOfMixedFormatsInPathOrder) {
  TempDir dir;
  const std::string in = dir.path() + "/in";
  fs::create_directories(in + "/sub");
  WriteBytes(in + "/a.txt", "text one\n%\ntext two\n");
  WriteBytes(in + "/b.jsonl", JsonLinesOf({"json one", "json two"}));
  ASSERT_TRUE(
      WriteTfRecordWithPython(in + "/c.tfrecords", {TextRecord("record one")}));
  WriteBytes(in + "/sub/d", "nested\n");
  PrepareStats stats;
  ASSERT_TRUE(PrepareDataset(Options({in}, dir.path() + "/out"), &stats).ok());
  EXPECT_EQ(stats.files, 4);
  EXPECT_EQ(TokensAsText(dir.path() + "/out/train.bin"),
            "text one\n%\ntext two\n%\njson one\n%\njson two\n%\nrecord "
            "one\n%\nnested\n%\n");
}

// ---------------------------------------------------------------------------
// Malformed records: one sentence with the file and line or offset, and
// nothing written.

class MalformedRecords : public ::testing::Test {
 protected:
  // Prepares `input` into a fresh directory and into one holding an older
  // dataset; returns the error, checking that neither changed.
  std::string Error(const std::string& input, const std::string& field = "") {
    const std::string fresh = dir_.path() + "/fresh/out";
    PrepareOptions o = Options({good_, input}, fresh);
    if (!field.empty()) o.text_field = field;
    Status s = PrepareDataset(o, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(fs::exists(dir_.path() + "/fresh")) << s.message();
    o.output_dir = old_;
    EXPECT_EQ(PrepareDataset(o, nullptr).message(), s.message());
    EXPECT_EQ(Listing(old_), old_listing_);
    EXPECT_EQ(ReadBytes(old_ + "/train.bin"), old_train_);
    return s.message();
  }
  void SetUp() override {
    good_ = dir_.path() + "/good.txt";
    WriteBytes(good_, "a good document\n");
    old_ = dir_.path() + "/old";
    ASSERT_TRUE(PrepareDataset(Options({good_}, old_), nullptr).ok());
    old_listing_ = Listing(old_);
    old_train_ = ReadBytes(old_ + "/train.bin");
  }

  TempDir dir_;
  std::string good_, old_, old_train_;
  std::set<std::string> old_listing_;
};

TEST_F(MalformedRecords, JsonLines) {
  const std::string p = dir_.path() + "/c.jsonl";
  WriteBytes(p, "{\"text\": \"ok\"}\n\n{\"text\": \"unterminated}\n");
  EXPECT_EQ(Error(p).rfind(p + ", line 3: bad JSON (column ", 0), 0u)
      << Error(p);
  WriteBytes(p, "{\"text\": \"ok\"}\n[1, 2]\n");
  EXPECT_EQ(Error(p), p + ", line 2: expected a JSON object with a \"text\" "
                          "string, got array");
  WriteBytes(p, "{\"body\": \"ok\"}\n");
  EXPECT_EQ(Error(p), p + ", line 1: no \"text\" field (the text field; "
                          "choose another with --text_field)");
  EXPECT_EQ(Error(p, "title"), p + ", line 1: no \"title\" field (the text "
                                   "field; choose another with --text_field)");
  WriteBytes(p, "{\"text\": 42}\n");
  EXPECT_EQ(Error(p), p + ", line 1: field \"text\" is number, not a string");
  WriteBytes(p, "{\"text\": \"caf\xe9\"}\n");
  EXPECT_EQ(Error(p).rfind(p + ", line 1: bad JSON (", 0), 0u) << Error(p);
}

TEST_F(MalformedRecords, TfRecord) {
  const std::string p = dir_.path() + "/c.tfrecord";
  ASSERT_TRUE(
      WriteTfRecordWithPython(p, {TextRecord("first"), TextRecord("second")}));
  const std::string bytes = ReadBytes(p);
  const size_t second = bytes.size() / 2;  // two records of the same size
  std::string corrupt = bytes;
  corrupt[second + 14] ^= 0x01;
  WriteBytes(p, corrupt);
  EXPECT_EQ(Error(p).rfind(p + ": the record at byte offset " +
                               std::to_string(second) +
                               " has a CRC mismatch in its data",
                           0),
            0u)
      << Error(p);
  WriteBytes(p, bytes.substr(0, bytes.size() - 3));
  EXPECT_EQ(Error(p).rfind(p + ": the record at byte offset " +
                               std::to_string(second) + " is truncated",
                           0),
            0u)
      << Error(p);
  ASSERT_TRUE(WriteTfRecordWithPython(
      p, {TextRecord("ok"), TextRecord("other", "body")}));
  // The first record: 16 bytes of framing and an 18-byte Example.
  EXPECT_EQ(Error(p), p + ": the record at byte offset 34 has no feature "
                          "'text'");
  ASSERT_TRUE(WriteTfRecordWithPython(
      p, {{{"features", {{"text", {{"bytes_hex", {"ff00"}}}}}}}}));
  EXPECT_EQ(Error(p), p + ": the record at byte offset 0 feature 'text' is "
                          "not UTF-8 text (it holds NUL bytes or invalid "
                          "UTF-8)");
  ASSERT_TRUE(WriteTfRecordWithPython(p, {{{"raw", "0a05"}}}));
  EXPECT_EQ(Error(p), p + ": the record at byte offset 0 is not a serialized "
                          "tf.train.Example (a length of 5 bytes past the "
                          "end of its message)");
}

// ---------------------------------------------------------------------------
// SentencePiece

class SentencePieceDataset : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("multislice-dataset-test-");
    docs_ = new std::vector<std::string>(ProseDocuments(3000));
    WriteBytes(dir_->path() + "/prose.jsonl", JsonLinesOf(*docs_));
    // The model every test here tokenizes with: trained once.
    PrepareOptions o = Options({dir_->path() + "/prose.jsonl"},
                               dir_->path() + "/trained", 0.1, 5);
    o.train_tokenizer_vocab = 400;
    Status s = PrepareDataset(o, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete docs_;
  }
  static std::string Model() {
    return dir_->path() + "/trained/" + kDatasetTokenizerFile;
  }

  inline static TempDir* dir_ = nullptr;
  inline static std::vector<std::string>* docs_ = nullptr;
  TempDir out_;
};

TEST_F(SentencePieceDataset, TokenizesEachDocumentWithBosAndEos) {
  auto sp = SentencePieceTokenizer::Load(Model());
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  PrepareOptions o =
      Options({dir_->path() + "/prose.jsonl"}, out_.path() + "/d", 0.1, 5);
  o.tokenizer_path = Model();
  PrepareStats stats;
  ASSERT_TRUE(PrepareDataset(o, &stats).ok());
  // The reference: each document through the tokenizer, [1] ids [2], split
  // by the rule written out here.
  std::vector<int32_t> train, val;
  for (size_t i = 0; i < docs_->size(); ++i) {
    std::vector<int32_t>& out =
        ReferenceIsValidation(5, int64_t(i), 0.1) ? val : train;
    out.push_back(1);
    auto ids = (*sp)->Encode((*docs_)[i]);
    out.insert(out.end(), ids->begin(), ids->end());
    out.push_back(2);
  }
  EXPECT_EQ(*ReadTokenFile(out_.path() + "/d/train.bin"), train);
  EXPECT_EQ(*ReadTokenFile(out_.path() + "/d/val.bin"), val);
  auto header = ReadTokenFileHeader(out_.path() + "/d/train.bin");
  EXPECT_EQ(header->vocab_size, 400u);
  EXPECT_EQ(header->token_width_bytes, 2u);
  EXPECT_EQ(stats.token_width_bytes, 2u);

  // The copy of the model, its checksum, and dataset.json's tokenizer.
  EXPECT_EQ(ReadBytes(out_.path() + "/d/tokenizer.model"), ReadBytes(Model()));
  auto meta = nlohmann::json::parse(ReadBytes(out_.path() + "/d/dataset.json"));
  const nlohmann::json& t = meta["tokenizer"];
  EXPECT_EQ(t["type"], "sentencepiece");
  EXPECT_EQ(t["model"], "tokenizer.model");
  EXPECT_EQ(t["checksum"], TokenizerChecksum(ReadBytes(Model())));
  EXPECT_EQ(t["checksum"].get<std::string>().size(), 8u + 16u);
  EXPECT_EQ(t["vocab_size"], 400);
  EXPECT_EQ(t["bos_id"], 1);
  EXPECT_EQ(t["eos_id"], 2);
  EXPECT_EQ(t["add_bos"], true);
  EXPECT_EQ(t["add_eos"], true);
  EXPECT_EQ(t["source"], Model());
  EXPECT_EQ(meta["vocab_size"], 400);
  auto info = ReadDatasetInfo(out_.path() + "/d");
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_FALSE(info->byte_level());
  EXPECT_EQ(info->tokenizer_checksum, t["checksum"]);
  auto loaded = LoadDatasetTokenizer(*info);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ((*loaded)->vocab_size(), 400);
}

TEST_F(SentencePieceDataset, WithoutBosAndEos) {
  auto sp = SentencePieceTokenizer::Load(Model());
  ASSERT_TRUE(sp.ok());
  WriteBytes(out_.path() + "/two.txt", "kato ren.\n%\nmi sul\n");
  PrepareOptions o = Options({out_.path() + "/two.txt"}, out_.path() + "/d");
  o.tokenizer_path = Model();
  o.add_bos = false;
  o.add_eos = false;
  ASSERT_TRUE(PrepareDataset(o, nullptr).ok());
  std::vector<int32_t> expected = *(*sp)->Encode("kato ren.\n");
  const std::vector<int32_t> second = *(*sp)->Encode("mi sul\n");
  expected.insert(expected.end(), second.begin(), second.end());
  EXPECT_EQ(*ReadTokenFile(out_.path() + "/d/train.bin"), expected);
  auto info = ReadDatasetInfo(out_.path() + "/d");
  EXPECT_FALSE(info->add_bos);
  EXPECT_FALSE(info->add_eos);
}

TEST_F(SentencePieceDataset, TrainingIsDeterministicAndSeesOnlyTheTrainSplit) {
  // Validation documents (by the rule) get a letter no training document
  // has: a model trained on the training split alone has no piece for it,
  // so it comes out as its two UTF-8 bytes (byte fallback).
  std::vector<std::string> docs = ProseDocuments(600);
  for (size_t i = 0; i < docs.size(); ++i) {
    if (ReferenceIsValidation(3, int64_t(i), 0.2)) docs[i] += "\u0416\n";
  }
  WriteBytes(out_.path() + "/c.jsonl", JsonLinesOf(docs));
  PrepareOptions o =
      Options({out_.path() + "/c.jsonl"}, out_.path() + "/a", 0.2, 3);
  o.train_tokenizer_vocab = 350;
  PrepareStats stats;
  ASSERT_TRUE(PrepareDataset(o, &stats).ok());
  EXPECT_GT(stats.val_documents, 60);
  o.output_dir = out_.path() + "/b";
  ASSERT_TRUE(PrepareDataset(o, nullptr).ok());
  for (const char* f : {"tokenizer.model", "train.bin", "val.bin"}) {
    EXPECT_EQ(ReadBytes(out_.path() + "/a/" + f),
              ReadBytes(out_.path() + "/b/" + f))
        << f;
  }
  auto sp = SentencePieceTokenizer::Load(out_.path() + "/a/tokenizer.model");
  ASSERT_TRUE(sp.ok());
  EXPECT_EQ((*sp)->vocab_size(), 350);
  auto letters = (*sp)->Encode("\u0416\u0416\u0416");
  EXPECT_GE(letters->size(), 6u);
  auto seen = (*sp)->Encode("kakaka");
  EXPECT_LE(seen->size(), 3u);
  auto meta = nlohmann::json::parse(ReadBytes(out_.path() + "/a/dataset.json"));
  EXPECT_EQ(meta["tokenizer"]["source"], "trained");
}

TEST_F(SentencePieceDataset, BytesDatasetOverASentencePieceOneDropsTheModel) {
  PrepareOptions o =
      Options({dir_->path() + "/prose.jsonl"}, out_.path() + "/d", 0.1, 5);
  o.tokenizer_path = Model();
  ASSERT_TRUE(PrepareDataset(o, nullptr).ok());
  o.tokenizer_path = "";
  ASSERT_TRUE(PrepareDataset(o, nullptr).ok());
  EXPECT_EQ(Listing(out_.path() + "/d"),
            (std::set<std::string>{"train.bin", "val.bin", "dataset.json"}));
}

TEST_F(SentencePieceDataset, ReplacedModelCopyIsRefused) {
  PrepareOptions o =
      Options({dir_->path() + "/prose.jsonl"}, out_.path() + "/d", 0.1, 5);
  o.tokenizer_path = Model();
  ASSERT_TRUE(PrepareDataset(o, nullptr).ok());
  // dataset.json records another model's checksum than the copy's.
  auto info = ReadDatasetInfo(out_.path() + "/d");
  ASSERT_TRUE(info.ok());
  info->tokenizer_checksum = "fnv1a64:0123456789abcdef";
  auto loaded = LoadDatasetTokenizer(*info);
  EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(loaded.status().message(),
            out_.path() + "/d/tokenizer.model: checksum " +
                TokenizerChecksum(ReadBytes(Model())) +
                " differs from the fnv1a64:0123456789abcdef that "
                "dataset.json records (the model was replaced or is "
                "corrupt)");
}

TEST(DatasetInfo, Version1StaysReadable) {
  TempDir dir;
  WriteBytes(dir.path() + "/dataset.json",
             R"({"format_version": 1, "tokenizer": "bytes", "vocab_size": 256,
                "token_file_format_version": 1, "documents": 3})");
  auto info = ReadDatasetInfo(dir.path());
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_EQ(info->format_version, 1);
  EXPECT_TRUE(info->byte_level());
  EXPECT_EQ(info->vocab_size, 256u);
  EXPECT_FALSE(info->add_bos);
  EXPECT_EQ(info->tokenizer_model_path(), "");
  auto t = LoadDatasetTokenizer(*info);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->type(), "bytes");

  WriteBytes(dir.path() + "/dataset.json", R"({"format_version": 3})");
  EXPECT_EQ(ReadDatasetInfo(dir.path()).status().message(),
            dir.path() +
                "/dataset.json: format_version 3 is not supported (this "
                "build reads 1 and 2)");
  WriteBytes(dir.path() + "/dataset.json",
             R"({"format_version": 2, "tokenizer": {"type": "bytes"}})");
  EXPECT_EQ(ReadDatasetInfo(dir.path()).status().message(),
            dir.path() +
                "/dataset.json: field 'vocab_size' is missing or has the "
                "wrong type");
  EXPECT_EQ(ReadDatasetInfo(dir.path() + "/none").status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace multislice::train
