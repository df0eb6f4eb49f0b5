// UTF-8 checks for strings going into the JSON section, which must be valid
// UTF-8 (RFC 8259); the reader's parser rejects anything else.
#pragma once

#include <string>

namespace torchcap::format {

// Well-formed UTF-8 by RFC 3629: no overlong forms, no surrogates, at most U+10FFFF.
bool is_valid_utf8(const std::string& s);
// `s` with every byte that is not part of a well-formed sequence replaced by U+FFFD.
std::string utf8_or_replace(const std::string& s);

}  // namespace torchcap::format
