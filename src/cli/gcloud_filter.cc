// gcloud's --filter (see gcloud_format.h): the expression's tokens, its
// parser (NOT over AND over OR, parentheses) and each term's predicate.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <regex>

#include "cli/gcloud_format.h"
#include "cli/gcloud_keys.h"

namespace multislice::cli {

using gcloud_keys::Cell;
using gcloud_keys::Key;
using gcloud_keys::Lower;
using gcloud_keys::Member;
using gcloud_keys::ParseKey;
using gcloud_keys::Resolve;
using gcloud_keys::Trim;
using gcloud_keys::Unquote;
using nlohmann::json;

namespace {

using Predicate = std::function<bool(const json&)>;

bool Glob(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

void Leaves(const json& v, std::vector<std::string>& out) {
  if (v.is_object() || v.is_array()) {
    for (const json& item : v) Leaves(item, out);
  } else if (!v.is_null()) {
    out.push_back(Cell(v, ","));
  }
}

// `:` and bare words: case-insensitive substring, or glob with '*'.
bool Has(const std::string& value, const std::string& pattern) {
  const std::string v = Lower(value), p = Lower(pattern);
  if (p.find('*') == std::string::npos) return v.find(p) != std::string::npos;
  return Glob(p, v);
}

bool Equals(const std::string& value, const std::string& expected) {
  const std::string base = value.substr(value.rfind('/') + 1);
  if (expected.find('*') != std::string::npos) {
    return Glob(expected, value) || Glob(expected, base);
  }
  return value == expected || base == expected;
}

bool Compare(const std::string& value, const std::string& op,
             const std::string& expected) {
  char* end_v = nullptr;
  char* end_e = nullptr;
  const double v = std::strtod(value.c_str(), &end_v);
  const double e = std::strtod(expected.c_str(), &end_e);
  const bool numeric =
      !value.empty() && !expected.empty() && *end_v == 0 && *end_e == 0;
  const int c = numeric ? (v < e   ? -1
                           : v > e ? 1
                                   : 0)
                        : value.compare(expected);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

Status FilterError(const std::string& term, const std::string& why) {
  return InvalidArgument("--filter: '" + term + "' " + why);
}

// The first operator of `term` outside quotes: its offset and text
// (npos and "" for a bare word).
std::pair<size_t, std::string> FindOperator(const std::string& term) {
  static const char* kOps[] = {"!=", "!~", "<=", ">=", "=", "~", ":", "<", ">"};
  char quote = 0;
  for (size_t i = 0; i < term.size(); ++i) {
    if (quote) {
      if (term[i] == quote) quote = 0;
      continue;
    }
    if (term[i] == '"' || term[i] == '\'') {
      quote = term[i];
      continue;
    }
    for (const char* op : kOps) {
      if (term.compare(i, std::strlen(op), op) == 0) return {i, op};
    }
  }
  return {std::string::npos, ""};
}

Result<Predicate> TermPredicate(const std::string& term,
                                const KeyAliases& aliases,
                                std::set<std::string>& keys) {
  const auto [at, op] = FindOperator(term);
  if (op.empty()) {  // a bare word: any value of the resource
    const std::string word = Unquote(term);
    return Predicate([word](const json& r) {
      std::vector<std::string> leaves;
      Leaves(r, leaves);
      return std::any_of(leaves.begin(), leaves.end(),
                         [&](const std::string& v) { return Has(v, word); });
    });
  }
  const std::string key_text = term.substr(0, at);
  const std::string value = Unquote(term.substr(at + op.size()));
  Result<Key> key = ParseKey(key_text, aliases);
  if (key_text.empty() || !key.ok()) {
    return FilterError(term,
                       "does not start with a key such as name or "
                       "state.state");
  }
  if (value.empty()) {
    return FilterError(term, "has no value after '" + op + "'");
  }
  keys.insert(Trim(key_text));
  std::optional<std::regex> regex;
  if (op == "~" || op == "!~") {
    try {
      regex.emplace(value);
    } catch (const std::regex_error&) {
      return FilterError(
          term, "has '" + value + "', which is not a regular expression");
    }
  }
  return Predicate([key = *key, op, value, regex](const json& r) {
    const json v = Resolve(r, key);
    std::vector<std::string> leaves;
    Leaves(v, leaves);
    auto any = [&](const std::function<bool(const std::string&)>& f) {
      return std::any_of(leaves.begin(), leaves.end(), f);
    };
    if (op == "=") return any([&](auto& s) { return Equals(s, value); });
    if (op == "!=") return !any([&](auto& s) { return Equals(s, value); });
    if (op == "~")
      return any([&](auto& s) { return std::regex_search(s, *regex); });
    if (op == "!~")
      return !any([&](auto& s) { return std::regex_search(s, *regex); });
    if (op == ":") {
      if (value == "*") return any([](auto& s) { return !s.empty(); });
      return any([&](auto& s) { return Has(s, value); });
    }
    return any([&](auto& s) { return Compare(s, op, value); });
  });
}

// Words and parentheses; a parenthesis right after a name (a transform's
// call) and quoted text stay inside the word.
Result<std::vector<std::string>> Tokens(std::string_view text) {
  std::vector<std::string> tokens;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (std::isspace((unsigned char)c)) {
      ++i;
    } else if (c == '(' || c == ')') {
      tokens.emplace_back(1, c);
      ++i;
    } else {
      std::string word;
      int depth = 0;
      while (i < text.size()) {
        const char d = text[i];
        if (d == '"' || d == '\'') {
          const size_t end = text.find(d, i + 1);
          if (end == std::string_view::npos) {
            return InvalidArgument("--filter: '" + std::string(text) +
                                   "' has an unclosed quote");
          }
          word += text.substr(i, end - i + 1);
          i = end + 1;
          continue;
        }
        if (std::isspace((unsigned char)d)) break;
        if (d == '(' && !word.empty() &&
            std::isalpha((unsigned char)word.back())) {
          ++depth;
        } else if (d == '(') {
          break;
        } else if (d == ')' && depth == 0) {
          break;
        } else if (d == ')') {
          --depth;
        }
        word += d;
        ++i;
      }
      tokens.push_back(word);
    }
  }
  return tokens;
}

class FilterParser {
 public:
  FilterParser(std::vector<std::string> tokens, const KeyAliases& aliases,
               std::string text)
      : tokens_(std::move(tokens)), aliases_(aliases), text_(std::move(text)) {}

  Result<Predicate> Parse(std::set<std::string>& keys) {
    keys_ = &keys;
    ASSIGN_OR_RETURN(Predicate p, Or());
    if (at_ < tokens_.size()) {
      return FilterError(text_, "has an unexpected '" + tokens_[at_] + "'");
    }
    return p;
  }

 private:
  bool Peek(const char* word) const {
    return at_ < tokens_.size() && tokens_[at_] == word;
  }

  Result<Predicate> Or() {
    ASSIGN_OR_RETURN(Predicate left, And());
    while (Peek("OR")) {
      ++at_;
      ASSIGN_OR_RETURN(Predicate right, And());
      left = [l = left, r = right](const json& x) { return l(x) || r(x); };
    }
    return left;
  }

  Result<Predicate> And() {
    ASSIGN_OR_RETURN(Predicate left, Unary());
    while (at_ < tokens_.size() && !Peek("OR") && !Peek(")")) {
      if (Peek("AND")) ++at_;
      ASSIGN_OR_RETURN(Predicate right, Unary());
      left = [l = left, r = right](const json& x) { return l(x) && r(x); };
    }
    return left;
  }

  Result<Predicate> Unary() {
    if (at_ >= tokens_.size()) {
      return FilterError(text_, "ends where a term was expected");
    }
    std::string token = tokens_[at_];
    if (token == "NOT" || (token.size() > 1 && token[0] == '-')) {
      if (token == "NOT") {
        ++at_;
      } else {
        tokens_[at_] = token.substr(1);
      }
      ASSIGN_OR_RETURN(Predicate p, Unary());
      return Predicate([p](const json& x) { return !p(x); });
    }
    ++at_;
    if (token == "(") {
      ASSIGN_OR_RETURN(Predicate p, Or());
      if (!Peek(")")) return FilterError(text_, "has an unclosed '('");
      ++at_;
      return p;
    }
    if (token == ")" || token == "AND" || token == "OR") {
      return FilterError(text_,
                         "has '" + token + "' where a term was expected");
    }
    return TermPredicate(token, aliases_, *keys_);
  }

  std::vector<std::string> tokens_;
  const KeyAliases& aliases_;
  std::string text_;
  size_t at_ = 0;
  std::set<std::string>* keys_ = nullptr;
};

}  // namespace

Result<ResourceFilter> ParseFilter(std::string_view text,
                                   const KeyAliases& aliases) {
  ResourceFilter filter;
  if (Trim(text).empty()) {
    filter.matches = [](const json&) { return true; };
    return filter;
  }
  ASSIGN_OR_RETURN(std::vector<std::string> tokens, Tokens(text));
  FilterParser parser(std::move(tokens), aliases, std::string(text));
  ASSIGN_OR_RETURN(filter.matches, parser.Parse(filter.keys));
  return filter;
}

Status CheckFilterKeys(const ResourceFilter& filter, const json& resources,
                       const KeyAliases& aliases,
                       const std::set<std::string>& known) {
  if (resources.empty()) return OkStatus();
  for (const std::string& key : filter.keys) {
    const std::string first = key.substr(0, key.find_first_of(".["));
    if (aliases.count(key) || aliases.count(first) || known.count(first)) {
      continue;
    }
    const bool present =
        std::any_of(resources.begin(), resources.end(), [&](const json& r) {
          return r.is_object() && Member(r, first) != nullptr;
        });
    if (present) continue;
    std::set<std::string> names(known);
    for (const auto& [alias, target] : aliases) names.insert(alias);
    for (const json& r : resources) {
      for (auto it = r.begin(); r.is_object() && it != r.end(); ++it) {
        names.insert(it.key());
      }
    }
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    return InvalidArgument("--filter: unknown key '" + first +
                           "': expected one of " + list);
  }
  return OkStatus();
}

}  // namespace multislice::cli
