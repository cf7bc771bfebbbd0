// Text as one single-quoted word for a POSIX shell, whatever it holds: the
// one quoting every script the project writes (a Slurm batch script, a job's
// command line, an ssh session's environment) uses.
#pragma once

#include <string>
#include <string_view>

namespace multislice {

// 'text', each ' written as '\'' (close, an escaped quote, reopen).
inline std::string ShellQuote(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace multislice
