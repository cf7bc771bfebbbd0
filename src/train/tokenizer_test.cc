// The tokenizers against independent references: our SentencePiece
// Encode/Decode against Python's own `sentencepiece` module (Debian's
// python3-sentencepiece) on the same model and texts, the byte tokenizer
// against the bytes themselves; training's determinism; the errors.
#include "train/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/temp_dir.h"
#include "train/data.h"
#include "train/data_test_util.h"

namespace multislice::train {
namespace {

using testing_util::ReadBytes;

namespace fs = std::filesystem;

// Lines of made-up prose: words of 1 to 3 syllables, with now and then a
// word from a list of accents, CJK, an emoji, digits, punctuation and
// indentation, all chosen by splitmix64.
class SyntheticLines : public TrainingLines {
 public:
  explicit SyntheticLines(int count) : count_(count) {}
  Result<bool> Next(std::string* line) override {
    if (emitted_ == count_) return false;
    static const char* const kSyllables[] = {
        "ka",  "to", "ren", "mi",  "sul", "po",  "da",  "vex", "lo", "tri",
        "an",  "es", "qu",  "bor", "fi",  "ny",  "gal", "ish", "om", "ur",
        "che", "wa", "zen", "ly",  "the", "ing", "er",  "st",  "pl", "ou"};
    static const char* const kSpecial[] = {
        "café", "naïve", "日本", "語",     "🙂",  "2024",      "42",
        "--",   "well,", "Mr.",  "O'Neil", "(yes)", "tab\there", "    ind"};
    line->clear();
    const uint64_t h = SplitMix64(uint64_t(emitted_));
    const int words = 3 + static_cast<int>(h % 9);
    for (int w = 0; w < words; ++w) {
      if (w > 0) line->push_back(' ');
      const uint64_t r = SplitMix64(h + uint64_t(w));
      if (r % 8 == 0) {
        *line += kSpecial[(r >> 8) % std::size(kSpecial)];
        continue;
      }
      for (uint64_t k = 0; k <= (r >> 16) % 3; ++k) {
        *line += kSyllables[(r >> (24 + 5 * k)) % std::size(kSyllables)];
      }
    }
    ++emitted_;
    return true;
  }

 private:
  int count_, emitted_ = 0;
};

Result<std::string> Train(int vocab, int lines, int64_t sample = 1'000'000,
                          uint32_t seed = 0) {
  SyntheticLines source(lines);
  SentencePieceTrainingOptions options;
  options.vocab_size = vocab;
  options.input_sentence_size = sample;
  options.seed = seed;
  return TrainSentencePiece(options, source);
}

// Texts to encode: seen and unseen characters (byte fallback), newlines,
// leading, repeated and trailing spaces, control characters, empty.
const std::vector<std::string> kTexts = {
    "the quick brown fox jumps over the lazy dog",
    "  leading spaces and   runs   of them  ",
    "line one\nline two\n\n\tindented\n",
    "café naïve 日本語 🙂 2024-12-01",
    "unseen: Ωμέγα, ñandú, ßtraße, 한국어, \x01\x7f",
    "",
    "%\nQ: what?\nA: 42.\n%\n",
};

// Debian's interpreter, where python3-sentencepiece installs the module
// (not whatever python3 comes first on PATH).
constexpr char kPython[] = "/usr/bin/python3";

bool PythonHasSentencePiece() {
  return std::system((std::string(kPython) +
                      " -c 'import sentencepiece' >/dev/null 2>&1")
                         .c_str()) == 0;
}

// Runs Python's sentencepiece on `model` for `texts` and `id_lists`:
// {"encoded": [[ids]...], "decoded": [text...], "vocab", "bos", "eos",
// "pad", "unk"}.
nlohmann::json PythonReference(const TempDir& dir, const std::string& model,
                               const std::vector<std::string>& texts,
                               const std::vector<std::vector<int32_t>>& ids) {
  const std::string in = dir.path() + "/in.json";
  const std::string out = dir.path() + "/out.json";
  const std::string script = dir.path() + "/reference.py";
  std::ofstream(in) << nlohmann::json{{"texts", texts}, {"ids", ids}}.dump();
  std::ofstream(script)
      << "import json, sys\n"
         "import sentencepiece as spm\n"
         "sp = spm.SentencePieceProcessor(model_file=sys.argv[1])\n"
         "job = json.load(open(sys.argv[2], encoding='utf-8'))\n"
         "json.dump({'encoded': [sp.encode(t) for t in job['texts']],\n"
         "           'decoded': [sp.decode(i) for i in job['ids']],\n"
         "           'vocab': sp.get_piece_size(), 'bos': sp.bos_id(),\n"
         "           'eos': sp.eos_id(), 'pad': sp.pad_id(),\n"
         "           'unk': sp.unk_id()},\n"
         "          open(sys.argv[3], 'w', encoding='utf-8'))\n";
  const std::string command =
      std::string(kPython) + " " + script + " " + model + " " + in + " " + out;
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return nlohmann::json::parse(ReadBytes(out));
}

TEST(SentencePieceTokenizer, MatchesPythonsSentencePiece) {
  if (!PythonHasSentencePiece()) {
    GTEST_SKIP() << "python3's sentencepiece module (Debian's "
                    "python3-sentencepiece) is not installed";
  }
  TempDir dir;
  auto model = Train(600, 4000);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const std::string path = dir.path() + "/m.model";
  std::ofstream(path, std::ios::binary) << *model;
  auto sp = SentencePieceTokenizer::Load(path);
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  EXPECT_EQ((*sp)->vocab_size(), 600);

  std::vector<std::vector<int32_t>> ours;
  for (const std::string& text : kTexts) {
    auto ids = (*sp)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    ours.push_back(*ids);
  }
  // Decoding: our encodings, and id lists with control ids and arbitrary
  // pieces (bytes of a broken UTF-8 sequence among them).
  std::vector<std::vector<int32_t>> to_decode = ours;
  to_decode.push_back({1, 100, 200, 2, 300, 599, 0});
  std::vector<int32_t> spread;
  for (int i = 0; i < 80; ++i) spread.push_back((i * 37) % 600);
  to_decode.push_back(spread);

  const nlohmann::json ref = PythonReference(dir, path, kTexts, to_decode);
  ASSERT_EQ(ref["encoded"].size(), kTexts.size());
  for (size_t i = 0; i < kTexts.size(); ++i) {
    EXPECT_EQ(ours[i], ref["encoded"][i].get<std::vector<int32_t>>())
        << "text " << i;
  }
  for (size_t i = 0; i < to_decode.size(); ++i) {
    auto text = (*sp)->Decode(to_decode[i]);
    ASSERT_TRUE(text.ok()) << text.status().message();
    EXPECT_EQ(*text, ref["decoded"][i].get<std::string>()) << "ids " << i;
  }
  EXPECT_EQ((*sp)->vocab_size(), ref["vocab"]);
  EXPECT_EQ((*sp)->bos_id(), ref["bos"]);
  EXPECT_EQ((*sp)->eos_id(), ref["eos"]);
  EXPECT_EQ((*sp)->pad_id(), ref["pad"]);
  EXPECT_EQ((*sp)->unk_id(), ref["unk"]);
}

TEST(SentencePieceTokenizer, TextRoundTripsExactly) {
  // Byte fallback and the identity normalizer: every text comes back as
  // it went in, newlines, spaces and unseen characters included.
  auto model = Train(600, 4000);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto sp = SentencePieceTokenizer::FromSerialized(*model, "model");
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  EXPECT_EQ((*sp)->unk_id(), 0);
  EXPECT_EQ((*sp)->bos_id(), 1);
  EXPECT_EQ((*sp)->eos_id(), 2);
  EXPECT_EQ((*sp)->pad_id(), -1);
  for (const std::string& text : kTexts) {
    auto ids = (*sp)->Encode(text);
    ASSERT_TRUE(ids.ok());
    for (int32_t id : *ids) EXPECT_NE(id, (*sp)->unk_id()) << text;
    auto back = (*sp)->Decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
  // Pieces are longer than bytes on text like the training text.
  SyntheticLines lines(1);
  std::string line;
  ASSERT_TRUE(*lines.Next(&line));
  auto ids = (*sp)->Encode(line);
  EXPECT_LT(ids->size(), line.size() / 2) << line;
}

TEST(SentencePieceTraining, IsDeterministic) {
  auto a = Train(500, 3000);
  auto b = Train(500, 3000);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().message();
  EXPECT_EQ(*a, *b);
  // Sampled: 3000 lines down to 1000, the same sample for the same seed.
  auto c = Train(500, 3000, 1000, 7);
  auto d = Train(500, 3000, 1000, 7);
  ASSERT_TRUE(c.ok() && d.ok()) << c.status().message();
  EXPECT_EQ(*c, *d);
  EXPECT_NE(*a, *c);  // the sample is not the whole corpus
}

TEST(SentencePieceTraining, RefusesVocabulariesThatDoNotFit) {
  auto small = Train(100, 100);
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(small.status().message(),
            "--train_tokenizer: vocabulary size 100 is below 260 (the 256 "
            "byte pieces, unk, bos, eos and the corpus's characters)");
  // 50 short lines cannot fill 5000 pieces.
  auto large = Train(5000, 50);
  EXPECT_EQ(large.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(large.status().message().rfind(
                "--train_tokenizer: SentencePiece cannot train a 5000-piece "
                "model on this corpus: ",
                0),
            0u)
      << large.status().message();
}

TEST(SentencePieceTraining, PassesTheLinesErrorOn) {
  class Failing : public TrainingLines {
   public:
    Result<bool> Next(std::string* line) override {
      if (++calls_ > 10) return InvalidArgument("corpus.jsonl, line 11: bad");
      *line = "some words here";
      return true;
    }
    int calls_ = 0;
  } lines;
  SentencePieceTrainingOptions options;
  options.vocab_size = 300;
  auto model = TrainSentencePiece(options, lines);
  EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(), "corpus.jsonl, line 11: bad");
}

TEST(SentencePieceTokenizer, BadModelFilesAreOneSentence) {
  TempDir dir;
  auto missing = SentencePieceTokenizer::Load(dir.path() + "/none.model");
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message(),
            dir.path() +
                "/none.model: cannot read the SentencePiece model (No such "
                "file or directory)");
  const std::string garbage = dir.path() + "/garbage.model";
  std::ofstream(garbage) << "this is not a protobuf \xff\xff\xff";
  auto bad = SentencePieceTokenizer::Load(garbage);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            garbage +
                " is not a SentencePiece model (it does not parse as a "
                "ModelProto with pieces)");
  const std::string empty = dir.path() + "/empty.model";
  std::ofstream{empty};
  EXPECT_EQ(SentencePieceTokenizer::Load(empty).status().message(),
            empty + " is empty, not a SentencePiece model");
  auto directory = SentencePieceTokenizer::Load(dir.path());
  EXPECT_EQ(directory.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(directory.status().message().rfind(dir.path(), 0), 0u);
}

TEST(SentencePieceTokenizer, DecodeRefusesIdsOutsideTheVocabulary) {
  auto model = Train(400, 2000);
  ASSERT_TRUE(model.ok());
  auto sp = SentencePieceTokenizer::FromSerialized(*model, "m");
  ASSERT_TRUE(sp.ok());
  auto bad = (*sp)->Decode({5, 400});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "token id 400 at position 1 is outside the tokenizer's "
            "vocabulary [0, 400)");
}

TEST(ByteTokenizer, IsTheBytes) {
  auto bytes = MakeByteTokenizer();
  EXPECT_EQ(bytes->type(), "bytes");
  EXPECT_EQ(bytes->vocab_size(), 256);
  EXPECT_EQ(bytes->bos_id(), -1);
  EXPECT_EQ(bytes->eos_id(), -1);
  const std::string text = "caf\xc3\xa9\n\x01\xff";
  auto ids = bytes->Encode(text);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    EXPECT_EQ((*ids)[i], static_cast<unsigned char>(text[i]));
  }
  EXPECT_EQ(*bytes->Decode(*ids), text);
  EXPECT_EQ(bytes->Decode({65, 256}).status().message(),
            "token id 256 at position 1 is outside the tokenizer's "
            "vocabulary [0, 256)");
}

}  // namespace
}  // namespace multislice::train
