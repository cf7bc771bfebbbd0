// `multislice data prepare`, `train` and `generate` end to end through the
// real binary: every input format, the malformed-record sentences (exit 2,
// nothing written), a tokenizer trained with --train_tokenizer and checked
// by Python's own sentencepiece, the trainer's dataset checks, and generate
// through a SentencePiece tokenizer and through bytes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"
#include "common/temp_dir.h"
#include "train/data.h"
#include "train/data_test_util.h"
#include "train/dataset.h"
#include "train/tfrecord_test_util.h"

namespace multislice::testing_util {
namespace {

namespace fs = std::filesystem;

constexpr char kPython[] = "/usr/bin/python3";  // Debian's, with its modules

struct Outcome {
  int code = -1;
  std::string out, err;
};

Outcome Multislice(const std::vector<std::string>& args, const std::string& dir,
                   const std::string& name, double seconds = 120) {
  Child c = Spawn(args, {}, dir, name);
  Outcome r;
  r.code = WaitExit(c, seconds);
  r.out = ReadFile(c.out);
  r.err = ReadFile(c.err);
  return r;
}

std::string TokensAsText(const std::string& path) {
  auto tokens = train::ReadTokenFile(path);
  EXPECT_TRUE(tokens.ok()) << tokens.status().message();
  return tokens.ok() ? std::string(tokens->begin(), tokens->end()) : "";
}

bool PythonHasSentencePiece() {
  return std::system((std::string(kPython) +
                      " -c 'import sentencepiece' >/dev/null 2>&1")
                         .c_str()) == 0;
}

class DataCommandTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const {
    return dir_.path() + "/" + name;
  }
  Outcome Prepare(std::vector<std::string> args, const std::string& name) {
    args.insert(args.begin(), {"data", "prepare"});
    return Multislice(args, dir_.path(), name);
  }
  // A failed prepare: exit 2 and one line on stderr, nothing at `output`.
  std::string ExpectRefused(const Outcome& r, const std::string& output) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(output)) << r.err;
    EXPECT_EQ(r.err.rfind("multislice data prepare: ", 0), 0u) << r.err;
    return r.err;
  }

  TempDir dir_{"multislice-data-test-"};
};

TEST_F(DataCommandTest, JsonLinesTextDirectoryAndTfRecord) {
  fs::create_directories(Path("in/sub"));
  WriteBytes(Path("in/a.jsonl"),
             "{\"body\": \"json doc\\n\"}\n{\"body\": \"second\"}\n");
  WriteBytes(Path("in/sub/b"), "text one\n%\ntext two\n");
  ASSERT_TRUE(WriteTfRecordWithPython(
      Path("in/c.tfrecord"),
      {{{"features", {{"body", {{"bytes", {"record \u00e9"}}}}}}}}));
  const Outcome r =
      Prepare({"--input", Path("in"), "--text_field", "body", "--output",
               Path("out"), "--validation_fraction", "0", "--json"},
              "prepare");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(LastJsonLine(r.out));
  EXPECT_EQ(j["files"], 3);
  EXPECT_EQ(j["documents"], 5);
  EXPECT_EQ(j["tokenizer"], "bytes");
  EXPECT_EQ(j["vocab_size"], 256);
  EXPECT_EQ(j["token_width_bytes"], 1);
  // In path order: a.jsonl, c.tfrecord, sub/b.
  EXPECT_EQ(TokensAsText(Path("out/train.bin")),
            "json doc\n%\nsecond\n%\nrecord \xc3\xa9\n%\ntext one\n%\ntext "
            "two\n%\n");
  EXPECT_EQ(j["train_tokens"], fs::file_size(Path("out/train.bin")) -
                                   train::kTokenFileHeaderBytes);
}

TEST_F(DataCommandTest, MalformedJsonLinesIsOneSentenceAndExit2) {
  WriteBytes(Path("ok.txt"), "fine\n");
  WriteBytes(Path("bad.jsonl"),
             "{\"text\": \"a\"}\n{\"text\": \"b\"}\n{oops\n");
  const std::string e =
      ExpectRefused(Prepare({"--input", Path("ok.txt"), "--input",
                             Path("bad.jsonl"), "--output", Path("out/ds")},
                            "bad-json"),
                    Path("out"));
  EXPECT_EQ(e.rfind("multislice data prepare: " + Path("bad.jsonl") +
                        ", line 3: bad JSON (column 2",
                    0),
            0u)
      << e;
  WriteBytes(Path("bad.jsonl"), "{\"text\": \"a\"}\n{\"title\": \"b\"}\n");
  EXPECT_EQ(ExpectRefused(
                Prepare({"--input", Path("bad.jsonl"), "--output", Path("out")},
                        "no-field"),
                Path("out")),
            "multislice data prepare: " + Path("bad.jsonl") +
                ", line 2: no \"text\" field (the text field; choose another "
                "with --text_field)\n");
}

TEST_F(DataCommandTest, MalformedTfRecordIsOneSentenceAndExit2) {
  ASSERT_TRUE(WriteTfRecordWithPython(Path("c.tfrecord"),
                                      {TextRecord("one"), TextRecord("two")}));
  std::string bytes = ReadFile(Path("c.tfrecord"));
  const size_t second = bytes.size() / 2;
  bytes[second + 13] ^= 0x20;
  WriteBytes(Path("c.tfrecord"), bytes);
  EXPECT_EQ(
      ExpectRefused(
          Prepare({"--input", Path("c.tfrecord"), "--output", Path("out")},
                  "crc"),
          Path("out"))
          .rfind("multislice data prepare: " + Path("c.tfrecord") +
                     ": the record at byte offset " + std::to_string(second) +
                     " has a CRC mismatch in its data",
                 0),
      0u);
  WriteBytes(Path("c.tfrecord"), bytes.substr(0, second + 7));
  EXPECT_EQ(
      ExpectRefused(
          Prepare({"--input", Path("c.tfrecord"), "--output", Path("out")},
                  "truncated"),
          Path("out")),
      "multislice data prepare: " + Path("c.tfrecord") +
          ": the record at byte offset " + std::to_string(second) +
          " is truncated: 7 bytes are left, fewer than the 12 of a record's "
          "length and its CRC\n");
}

TEST_F(DataCommandTest, BadFlagsAreOneSentence) {
  WriteBytes(Path("t.txt"), "text\n");
  EXPECT_EQ(ExpectRefused(Prepare({"--input", Path("t.txt"), "--output",
                                   Path("o"), "--tokenizer", Path("none"),
                                   "--train_tokenizer", "500"},
                                  "both"),
                          Path("o")),
            "multislice data prepare: --tokenizer and --train_tokenizer: give "
            "one of them (a model to use, or a vocabulary size to train one), "
            "not both\n");
  EXPECT_EQ(ExpectRefused(Prepare({"--input", Path("t.txt"), "--output",
                                   Path("o"), "--tokenizer", Path("none")},
                                  "missing-model"),
                          Path("o")),
            "multislice data prepare: --tokenizer: " + Path("none") +
                ": cannot read the SentencePiece model (No such file or "
                "directory)\n");
  EXPECT_EQ(ExpectRefused(Prepare({"--input", Path("t.txt"), "--output",
                                   Path("o"), "--train_tokenizer", "100"},
                                  "small"),
                          Path("o")),
            "multislice data prepare: --train_tokenizer: vocabulary size 100 "
            "is below 260 (the 256 byte pieces, unk, bos, eos and the "
            "corpus's characters)\n");
  const Outcome bool_flag = Prepare(
      {"--input", Path("t.txt"), "--output", Path("o"), "--add_bos=maybe"},
      "bool");
  EXPECT_EQ(bool_flag.code, 2);
  EXPECT_NE(bool_flag.err.find("--add_bos: 'maybe' is not true or false"),
            std::string::npos)
      << bool_flag.err;
}

// --train_tokenizer, then Python's sentencepiece decodes the token file's
// documents back to the training documents.
TEST_F(DataCommandTest, TrainTokenizerEndToEnd) {
  const std::vector<std::string> docs = ProseDocuments(800);
  WriteBytes(Path("prose.jsonl"), JsonLinesOf(docs));
  const Outcome r = Prepare(
      {"--input", Path("prose.jsonl"), "--train_tokenizer", "400",
       "--validation_fraction", "0.1", "--output", Path("ds"), "--json"},
      "train-tokenizer");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(LastJsonLine(r.out));
  EXPECT_EQ(j["tokenizer"], "sentencepiece");
  EXPECT_EQ(j["vocab_size"], 400);
  EXPECT_EQ(j["token_width_bytes"], 2);
  EXPECT_EQ(j["tokenizer_model"], Path("ds/tokenizer.model"));
  ASSERT_TRUE(fs::exists(Path("ds/tokenizer.model")));
  if (!PythonHasSentencePiece()) {
    GTEST_SKIP() << "python3's sentencepiece module (Debian's "
                    "python3-sentencepiece) is not installed";
  }
  // Python reads the token file itself (data.h's layout) and decodes each
  // [bos] ... [eos] span.
  WriteBytes(Path("decode.py"),
             "import json, struct, sys\n"
             "import sentencepiece as spm\n"
             "sp = spm.SentencePieceProcessor(model_file=sys.argv[1])\n"
             "raw = open(sys.argv[2], 'rb').read()\n"
             "assert raw[:8] == b'MSTOKENS'\n"
             "version, vocab, width, _, count = struct.unpack('<IIIIQ', "
             "raw[8:32])\n"
             "assert (version, vocab, width) == (2, 400, 2)\n"
             "ids = struct.unpack('<%dH' % count, raw[40:])\n"
             "docs, doc = [], []\n"
             "for i in ids:\n"
             "    if i == sp.bos_id(): doc = []\n"
             "    elif i == sp.eos_id(): docs.append(sp.decode(doc))\n"
             "    else: doc.append(i)\n"
             "json.dump(docs, open(sys.argv[3], 'w'))\n");
  ASSERT_EQ(std::system((std::string(kPython) + " " + Path("decode.py") + " " +
                         Path("ds/tokenizer.model") + " " +
                         Path("ds/train.bin") + " " + Path("docs.json"))
                            .c_str()),
            0);
  const auto decoded = nlohmann::json::parse(ReadFile(Path("docs.json")));
  std::vector<std::string> train_docs;
  for (size_t i = 0; i < docs.size(); ++i) {
    const uint64_t h = train::SplitMix64(0 ^ train::SplitMix64(uint64_t(i)));
    if (static_cast<double>(h >> 11) * 0x1.0p-53 >= 0.1) {
      train_docs.push_back(docs[i]);
    }
  }
  EXPECT_EQ(decoded.get<std::vector<std::string>>(), train_docs);
}

// ---------------------------------------------------------------------------
// train and generate through the tokenizer

class TokenizedTrainingTest : public DataCommandTest {
 protected:
  void SetUp() override {
    WriteBytes(Path("prose.jsonl"), JsonLinesOf(ProseDocuments(1500)));
    ASSERT_EQ(Prepare({"--input", Path("prose.jsonl"), "--train_tokenizer",
                       "400", "--output", Path("ds")},
                      "prepare")
                  .code,
              0);
    std::ofstream(Path("tiny.yml"))
        << "emb_dim: 32\nnum_heads: 2\nnum_decoder_layers: 1\nmlp_dim: 64\n"
           "max_target_length: 32\ndtype: f32\nwarmup_steps: 1\n"
           "eval_interval: 1000\nper_device_batch_size: 4\n";
  }
  Outcome Train(std::vector<std::string> keys, const std::string& name) {
    std::vector<std::string> args = {
        "train",   Path("tiny.yml"), "base_output_directory=" + Path("runs"),
        "steps=3", "--num_slices",   "1",
        "--json"};
    args.insert(args.end(), keys.begin(), keys.end());
    return Multislice(args, dir_.path(), name, 240);
  }
};

TEST_F(TokenizedTrainingTest, GenerateEncodesAndDecodesThroughTheTokenizer) {
  const Outcome trained = Train(
      {"run_name=sp", "dataset_path=" + Path("ds"), "vocab_size=400"}, "train");
  ASSERT_EQ(trained.code, 0) << trained.err;
  const Outcome g = Multislice({"generate", Path("runs/sp"), "--prompt",
                                "kato ren", "--max_new_tokens", "12", "--json"},
                               dir_.path(), "generate");
  ASSERT_EQ(g.code, 0) << g.err;
  const auto j = nlohmann::json::parse(LastJsonLine(g.out));
  EXPECT_EQ(j["tokenizer"], Path("ds/tokenizer.model"));
  const auto prompt_ids = j["prompt_token_ids"].get<std::vector<int>>();
  const auto ids = j["token_ids"].get<std::vector<int>>();
  ASSERT_FALSE(prompt_ids.empty());
  EXPECT_EQ(prompt_ids[0], 1);  // bos: the documents began with it
  EXPECT_LE(ids.size(), 12u);
  for (int id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 400);
    EXPECT_NE(id, 2);  // eos ends the generation, it is not output
  }
  const Outcome text = Multislice({"generate", Path("runs/sp"), "--prompt",
                                   "kato ren", "--max_new_tokens", "12"},
                                  dir_.path(), "generate-text");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_EQ(text.out, j["generated"].get<std::string>() + "\n");
  if (!PythonHasSentencePiece()) {
    GTEST_SKIP() << "python3's sentencepiece module (Debian's "
                    "python3-sentencepiece) is not installed";
  }
  // Python's sentencepiece: the prompt's encoding, and the generated text
  // as what decoding prompt + output adds to the prompt's text.
  WriteBytes(Path("check.py"),
             "import json, sys\n"
             "import sentencepiece as spm\n"
             "sp = spm.SentencePieceProcessor(model_file=sys.argv[1])\n"
             "j = json.load(open(sys.argv[2]))\n"
             "p, g = j['prompt_token_ids'], j['token_ids']\n"
             "assert p == [sp.bos_id()] + sp.encode(j['prompt']), p\n"
             "whole, head = sp.decode(p + g), sp.decode(p)\n"
             "assert whole.startswith(head)\n"
             "assert whole[len(head):] == j['generated'], (whole, head)\n");
  WriteBytes(Path("out.json"), LastJsonLine(g.out));
  EXPECT_EQ(std::system((std::string(kPython) + " " + Path("check.py") + " " +
                         Path("ds/tokenizer.model") + " " + Path("out.json"))
                            .c_str()),
            0);
}

TEST_F(TokenizedTrainingTest, TrainRefusesDatasetsTheModelCannotTake) {
  const Outcome small =
      Train({"run_name=a", "dataset_path=" + Path("ds")}, "a");
  EXPECT_EQ(small.code, 2);
  EXPECT_EQ(small.err, "multislice train: dataset_path: '" + Path("ds") +
                           "' has a vocabulary of 400 tokens (train.bin) but "
                           "vocab_size is 256: the model's embedding must "
                           "hold every token id; set vocab_size=400 or "
                           "more\n");
  // Another model than the dataset's.
  WriteBytes(Path("other.jsonl"), JsonLinesOf(ProseDocuments(300)));
  ASSERT_EQ(Prepare({"--input", Path("other.jsonl"), "--train_tokenizer", "300",
                     "--output", Path("other")},
                    "other")
                .code,
            0);
  const Outcome other =
      Train({"run_name=b", "dataset_path=" + Path("ds"), "vocab_size=400",
             "tokenizer_path=" + Path("other/tokenizer.model")},
            "b");
  EXPECT_EQ(other.code, 2);
  EXPECT_NE(other.err.find("was tokenized with another SentencePiece model"),
            std::string::npos)
      << other.err;
  EXPECT_FALSE(fs::exists(Path("runs/b")));
}

TEST_F(TokenizedTrainingTest, TokenizerPathPreparesTheDefaultCorpus) {
  if (!fs::is_directory(train::kDefaultCorpus)) {
    GTEST_SKIP() << train::kDefaultCorpus << " is not installed";
  }
  const std::string model = Path("ds/tokenizer.model");
  const Outcome r =
      Train({"run_name=c", "vocab_size=400", "tokenizer_path=" + model}, "c");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string expected = train::DefaultDatasetDirectory(
      Path("runs"), train::TokenizerChecksum(ReadFile(model)));
  EXPECT_EQ(fs::path(expected).filename().string().size(),
            std::string("fortunes-").size() + 12);
  auto info = train::ReadDatasetInfo(expected);
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_EQ(info->vocab_size, 400u);
  EXPECT_EQ(info->tokenizer_checksum,
            train::TokenizerChecksum(ReadFile(model)));
  const Outcome g = Multislice(
      {"generate", Path("runs/c"), "--max_new_tokens", "3", "--json"},
      dir_.path(), "generate");
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(nlohmann::json::parse(LastJsonLine(g.out))["tokenizer"],
            expected + "/tokenizer.model");
}

TEST_F(DataCommandTest, ByteLevelGenerateIsTheBytes) {
  std::string corpus;
  for (int i = 0; i < 2000; ++i) corpus += "abc " + std::to_string(i) + "\n%\n";
  WriteBytes(Path("t.txt"), corpus);
  const Outcome p =
      Prepare({"--input", Path("t.txt"), "--output", Path("ds")}, "p");
  ASSERT_EQ(p.code, 0) << p.err;
  std::ofstream(Path("tiny.yml"))
      << "emb_dim: 32\nnum_heads: 2\nnum_decoder_layers: 1\nmlp_dim: 64\n"
         "max_target_length: 32\ndtype: f32\neval_interval: 1000\n"
         "per_device_batch_size: 4\n";
  const Outcome trained = Multislice(
      {"train", Path("tiny.yml"), "base_output_directory=" + Path("runs"),
       "run_name=b", "steps=2", "dataset_path=" + Path("ds"), "--num_slices",
       "1", "--json"},
      dir_.path(), "train", 240);
  ASSERT_EQ(trained.code, 0) << trained.err;
  const Outcome g = Multislice({"generate", Path("runs/b"), "--prompt", "xy",
                                "--max_new_tokens", "9", "--json"},
                               dir_.path(), "generate");
  ASSERT_EQ(g.code, 0) << g.err;
  const auto j = nlohmann::json::parse(LastJsonLine(g.out));
  EXPECT_EQ(j["tokenizer"], "bytes");
  EXPECT_EQ(j["prompt_token_ids"], (std::vector<int>{'x', 'y'}));
  const auto ids = j["token_ids"].get<std::vector<int>>();
  ASSERT_EQ(ids.size(), 9u);
  for (int id : ids) EXPECT_LT(id, 256);
  // Printed as they are: the same sample (same seed) without --json is the
  // bytes of those ids.
  const Outcome text = Multislice(
      {"generate", Path("runs/b"), "--prompt", "xy", "--max_new_tokens", "9"},
      dir_.path(), "generate-text");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_EQ(text.out, std::string(ids.begin(), ids.end()) + "\n");
}

}  // namespace
}  // namespace multislice::testing_util
