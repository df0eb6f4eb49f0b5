// Note [Colour on a terminal]
// The command marks what a reader scans for: "error:" in bold red on
// stderr, and in `show`'s summary the heading of each line (the words before
// its first colon) in bold. Only on a terminal: output piped or redirected
// is plain text, as are terminals that ask for none, by NO_COLOR (any
// non-empty value, https://no-color.org) or TERM=dumb.
#pragma once

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <unistd.h>

namespace torchcap::cli {

inline bool colour_on(int fd) {
  const char* no_colour = std::getenv("NO_COLOR");
  if (no_colour != nullptr && *no_colour != '\0') return false;
  const char* term = std::getenv("TERM");
  if (term != nullptr && std::strcmp(term, "dumb") == 0) return false;
  return ::isatty(fd) == 1;
}

// "torchcap: error: ", "error:" in bold red on a terminal.
inline std::string error_prefix() {
  return colour_on(STDERR_FILENO) ? "torchcap: \033[1;31merror:\033[0m " : "torchcap: error: ";
}

// `text` with each line's heading (up to and with its first colon, for a
// line that starts with a letter) in bold, on a terminal.
inline std::string with_headings(const std::string& text) {
  if (!colour_on(STDOUT_FILENO)) return text;
  std::string out;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    end = end == std::string::npos ? text.size() : end + 1;
    const std::string line = text.substr(at, end - at);
    const size_t colon = line.find(':');
    if (colon != std::string::npos && std::isalpha(static_cast<unsigned char>(line[0]))) {
      out += "\033[1m" + line.substr(0, colon + 1) + "\033[0m" + line.substr(colon + 1);
    } else {
      out += line;
    }
    at = end;
  }
  return out;
}

}  // namespace torchcap::cli
