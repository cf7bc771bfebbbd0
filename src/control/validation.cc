// Checks of ids, path segments, paging parameters and raw JSON text (see
// validation.h).
#include "control/validation.h"

#include <algorithm>
#include <cstdio>

namespace multislice::control {
namespace {

// The length of the well-formed UTF-8 sequence at text[i] (1..4), storing
// its code point in *code_point; 0 when the bytes there are ill-formed
// (Unicode 15, table 3-7).
size_t Utf8SequenceAt(std::string_view text, size_t i, uint32_t* code_point) {
  const auto byte = [&](size_t k) {
    return static_cast<unsigned char>(text[i + k]);
  };
  const unsigned char lead = byte(0);
  if (lead < 0x80) {
    *code_point = lead;
    return 1;
  }
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(1) < low || byte(1) > high) return 0;
  uint32_t cp = lead & (0xFF >> (length + 1));
  for (size_t k = 1; k < length; ++k) {
    if (k > 1 && (byte(k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(k) & 0x3F);
  }
  *code_point = cp;
  return length;
}

// Characters a message shows escaped although they are well-formed: C1
// controls and the bidirectional formatting characters, which could make a
// message read differently from what it holds.
bool ShownEscaped(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200E || cp == 0x200F;
}

std::string Hex(uint32_t value, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%0*X", digits, value);
  return buf;
}

bool IsLowerAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

// Whether `value` is 1..kMaxIdLength characters of `middle`, starting with
// a character accepted by `first` and ending with a lowercase letter or a
// digit.
template <typename First, typename Middle>
bool MatchesLabel(std::string_view value, First first, Middle middle) {
  if (value.empty() || value.size() > kMaxIdLength) return false;
  if (!first(value.front()) || !IsLowerAlnum(value.back())) return false;
  for (char c : value) {
    if (!middle(c)) return false;
  }
  return true;
}

Status Refuse(std::string_view field, std::string_view value,
              std::string_view expected) {
  return InvalidArgument(std::string(field) + ": " + QuoteForMessage(value) +
                         " " + std::string(expected));
}

constexpr char kResourceIdRule[] =
    "does not match ^[a-z]([-a-z0-9]*[a-z0-9])?$ (a lowercase letter, then "
    "lowercase letters, digits or hyphens, not ending in a hyphen; at most "
    "63 characters)";

// A decimal number of at most max_digits digits, nothing else.
bool ParseDecimal(std::string_view text, size_t max_digits, int64_t* value) {
  if (text.empty() || text.size() > max_digits) return false;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *value = v;
  return true;
}

}  // namespace

bool IsValidUtf8(std::string_view text, size_t* bad_offset) {
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const size_t length = Utf8SequenceAt(text, i, &cp);
    if (length == 0) {
      if (bad_offset != nullptr) *bad_offset = i;
      return false;
    }
    i += length;
  }
  return true;
}

std::string QuoteForMessage(std::string_view value, size_t max_chars) {
  std::string out = "'";
  size_t chars = 0;
  for (size_t i = 0; i < value.size(); ++chars) {
    if (chars == max_chars) {
      out += "...";
      break;
    }
    uint32_t cp = 0;
    const size_t length = Utf8SequenceAt(value, i, &cp);
    if (length == 0) {  // an ill-formed byte: shown, skipped alone
      out += "\\x" + Hex(static_cast<unsigned char>(value[i]), 2);
      ++i;
      continue;
    }
    if (cp == '\'' || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp < 0x20 || cp == 0x7F) {
      out += "\\x" + Hex(cp, 2);
    } else if (ShownEscaped(cp)) {
      out += "\\u" + Hex(cp, 4);
    } else {
      out.append(value.substr(i, length));
    }
    i += length;
  }
  return out + "'";
}

bool IsResourceId(std::string_view value) {
  return MatchesLabel(
      value, [](char c) { return c >= 'a' && c <= 'z'; },
      [](char c) { return IsLowerAlnum(c) || c == '-'; });
}

Status ValidateResourceId(std::string_view field, std::string_view value) {
  if (value.empty())
    return InvalidArgument(std::string(field) + ": is required");
  if (IsResourceId(value)) return OkStatus();
  return Refuse(field, value, kResourceIdRule);
}

Status ValidateOperationId(std::string_view field, std::string_view value) {
  return ValidateResourceId(field, value);
}

Status ValidateProjectId(std::string_view field, std::string_view value) {
  const bool ok = MatchesLabel(value, IsLowerAlnum, [](char c) {
    return IsLowerAlnum(c) || c == '-' || c == '.' || c == ':';
  });
  if (ok) return OkStatus();
  return Refuse(field, value,
                "is not a project id: expected lowercase letters, digits, "
                "'-', '.' or ':', starting and ending with a letter or digit, "
                "at most 63 characters");
}

Status ValidateZone(std::string_view field, std::string_view value,
                    bool allow_wildcard) {
  if (allow_wildcard && value == "-") return OkStatus();
  const bool ok = MatchesLabel(
      value, IsLowerAlnum, [](char c) { return IsLowerAlnum(c) || c == '-'; });
  if (ok) return OkStatus();
  return Refuse(field, value,
                std::string("is not a zone such as 'us-central2-b': expected "
                            "lowercase letters, digits and '-', starting and "
                            "ending with a letter or digit, at most 63 "
                            "characters") +
                    (allow_wildcard ? ", or '-' for every zone" : ""));
}

Status ValidateIciDomain(std::string_view field, std::string_view value) {
  if (value.empty()) return OkStatus();
  const bool ok = MatchesLabel(
      value, IsLowerAlnum, [](char c) { return IsLowerAlnum(c) || c == '-'; });
  if (ok) return OkStatus();
  return Refuse(field, value,
                "is not an ICI domain name such as 'pod0': expected lowercase "
                "letters, digits and '-', starting and ending with a letter "
                "or digit, at most 63 characters (or nothing: no domain)");
}

Status ValidateParent(std::string_view project, std::string_view zone,
                      bool allow_wildcard) {
  RETURN_IF_ERROR(ValidateProjectId("project", project));
  return ValidateZone("location", zone, allow_wildcard);
}

Status ValidateQueuedResourceName(std::string_view project,
                                  std::string_view zone, std::string_view id) {
  RETURN_IF_ERROR(ValidateParent(project, zone, /*allow_wildcard=*/false));
  return ValidateResourceId("queued_resource", id);
}

Status ValidateOperationName(std::string_view project, std::string_view zone,
                             std::string_view id) {
  RETURN_IF_ERROR(ValidateParent(project, zone, /*allow_wildcard=*/false));
  return ValidateOperationId("operation", id);
}

Result<bool> ParseBoolParam(std::string_view field, std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (lower.empty() || lower == "false" || lower == "0") return false;
  if (lower == "true" || lower == "1") return true;
  return InvalidArgument("Invalid value at '" + std::string(field) +
                         "' (TYPE_BOOL), " + QuoteForMessage(text) +
                         ": expected true or false");
}

Result<int> ParsePageSize(std::string_view text) {
  int64_t value = 0;
  if (!ParseDecimal(text, 4, &value) || value > kMaxPageSize) {
    return Refuse(
        "page_size", text,
        "is not an integer from 0 to " + std::to_string(kMaxPageSize));
  }
  return value == 0 ? kDefaultPageSize : static_cast<int>(value);
}

Result<int64_t> ParsePageToken(std::string_view text) {
  if (text.empty()) return int64_t{0};
  int64_t value = 0;
  if (!ParseDecimal(text, 18, &value)) {
    return Refuse("page_token", text,
                  "is not a page token from a previous list (pass the "
                  "nextPageToken of the last answer, or none for the first "
                  "page)");
  }
  return value;
}

std::string FormatPageToken(int64_t after_seq) {
  return std::to_string(after_seq);
}

std::string TextPosition(std::string_view text, size_t offset) {
  if (offset > text.size()) offset = text.size();
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return "line " + std::to_string(line) + ", column " +
         std::to_string(offset - line_start + 1);
}

Status CheckJsonText(std::string_view text, int max_depth) {
  size_t bad = 0;
  if (!IsValidUtf8(text, &bad)) {
    return InvalidArgument("malformed JSON at " + TextPosition(text, bad) +
                           ": invalid UTF-8 (byte \\x" +
                           Hex(static_cast<unsigned char>(text[bad]), 2) +
                           "); JSON text must be UTF-8");
  }
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\0') {  // the parser would stop there and ignore the rest
      return InvalidArgument("malformed JSON at " + TextPosition(text, i) +
                             ": a NUL byte");
    }
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return InvalidArgument("malformed JSON at " + TextPosition(text, i) +
                               ": arrays and objects are nested more than " +
                               std::to_string(max_depth) + " deep");
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return OkStatus();
}

}  // namespace multislice::control
