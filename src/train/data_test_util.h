// Test support shared by the data tests (train/ and cli/): whole-file text
// I/O and made-up prose documents for tokenizer training.
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "train/data.h"

namespace multislice::testing_util {

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// `count` documents of made-up words (one to three of 20 syllables, chosen
// by splitmix64 from `seed`), 12 words in two lines each: text a
// SentencePiece model of a few hundred pieces can learn in well under a
// second.
inline std::vector<std::string> ProseDocuments(int count, uint64_t seed = 77) {
  static const char* const kSyllables[] = {
      "ka", "to", "ren", "mi", "sul", "po", "da", "vex", "lo", "tri",
      "an", "es", "qu", "bor", "fi", "ny", "gal", "ish", "om", "ur"};
  std::vector<std::string> docs;
  for (int d = 0; d < count; ++d) {
    std::string doc;
    const uint64_t h = train::SplitMix64(uint64_t(d) + seed);
    for (int w = 0; w < 12; ++w) {
      const uint64_t r = train::SplitMix64(h + uint64_t(w));
      for (uint64_t k = 0; k <= r % 3; ++k) {
        doc += kSyllables[(r >> (8 + 5 * k)) % std::size(kSyllables)];
      }
      doc += w % 6 == 5 ? ".\n" : " ";
    }
    docs.push_back(doc);
  }
  return docs;
}

// The documents as JSON Lines, each text under `field`.
inline std::string JsonLinesOf(const std::vector<std::string>& docs,
                               const std::string& field = "text") {
  std::string out;
  for (const std::string& d : docs) {
    out += nlohmann::json{{field, d}}.dump() + "\n";
  }
  return out;
}

}  // namespace multislice::testing_util
