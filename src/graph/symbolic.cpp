// Integer polynomials in the symbols of a dynamic graph (symbolic.h).
#include <torchcap/error.h>
#include <torchcap/symbolic.h>

#include <algorithm>
#include <cctype>

namespace torchcap {

std::string symbol_name(size_t i) { return "s" + std::to_string(i); }

SizeExpr SizeExpr::constant(int64_t v) { return of_terms({Term{v, {}}}); }

SizeExpr SizeExpr::symbol(size_t i) {
  if (i > 255) throw Error("a dynamic graph has at most 256 symbols");
  return of_terms({Term{1, {static_cast<uint8_t>(i)}}});
}

SizeExpr SizeExpr::of_terms(std::vector<Term> terms) {
  for (Term& t : terms) std::sort(t.symbols.begin(), t.symbols.end());
  // Highest degree first, then by symbols: "s0*s1 + 2*s0 + 1".
  auto before = [](const Term& a, const Term& b) {
    if (a.symbols.size() != b.symbols.size()) return a.symbols.size() > b.symbols.size();
    return std::lexicographical_compare(a.symbols.begin(), a.symbols.end(), b.symbols.begin(),
                                        b.symbols.end());
  };
  std::stable_sort(terms.begin(), terms.end(), before);
  SizeExpr e;
  for (Term& t : terms) {
    if (!e.terms_.empty() && e.terms_.back().symbols == t.symbols) {
      if (__builtin_add_overflow(e.terms_.back().coefficient, t.coefficient,
                                 &e.terms_.back().coefficient)) {
        throw Error("size expression: a coefficient overflows 64 bits");
      }
    } else {
      e.terms_.push_back(std::move(t));
    }
  }
  e.terms_.erase(std::remove_if(e.terms_.begin(), e.terms_.end(),
                                [](const Term& t) { return t.coefficient == 0; }),
                 e.terms_.end());
  return e;
}

bool SizeExpr::is_constant() const {
  return terms_.empty() || (terms_.size() == 1 && terms_[0].symbols.empty());
}

int64_t SizeExpr::constant_term() const {
  return !terms_.empty() && terms_.back().symbols.empty() ? terms_.back().coefficient : 0;
}

size_t SizeExpr::num_symbols_used() const {
  size_t n = 0;
  for (const Term& t : terms_) {
    for (uint8_t s : t.symbols) n = std::max<size_t>(n, s + 1u);
  }
  return n;
}

int64_t SizeExpr::evaluate(c10::ArrayRef<int64_t> values) const {
  int64_t total = 0;
  for (const Term& t : terms_) {
    int64_t v = t.coefficient;
    for (uint8_t s : t.symbols) {
      if (s >= values.size()) {
        throw Error("size expression " + str() + " uses " + symbol_name(s) + ", which has no value");
      }
      if (__builtin_mul_overflow(v, values[s], &v)) {
        throw Error("size expression " + str() + " overflows 64 bits");
      }
    }
    if (__builtin_add_overflow(total, v, &total)) {
      throw Error("size expression " + str() + " overflows 64 bits");
    }
  }
  return total;
}

std::string SizeExpr::str() const {
  if (terms_.empty()) return "0";
  std::string out;
  for (size_t i = 0; i < terms_.size(); ++i) {
    const Term& t = terms_[i];
    // The most negative coefficient has no positive counterpart: print it as is.
    bool negative = t.coefficient < 0 && t.coefficient != std::numeric_limits<int64_t>::min();
    uint64_t magnitude = negative ? static_cast<uint64_t>(-t.coefficient)
                                  : static_cast<uint64_t>(t.coefficient);
    if (i == 0) {
      out += negative ? "-" : "";
    } else {
      out += negative ? " - " : " + ";
    }
    std::string factors;
    for (uint8_t s : t.symbols) factors += (factors.empty() ? "" : "*") + symbol_name(s);
    if (factors.empty()) {
      out += negative || i > 0 ? std::to_string(magnitude) : std::to_string(t.coefficient);
    } else if (magnitude == 1 && (negative || t.coefficient == 1)) {
      out += factors;
    } else {
      out += (negative || i > 0 ? std::to_string(magnitude) : std::to_string(t.coefficient)) + "*" +
             factors;
    }
  }
  return out;
}

SizeExpr SizeExpr::parse(const std::string& text) {
  auto fail = [&text](const std::string& why) -> SizeExpr {
    throw Error("size expression '" + text + "': " + why);
  };
  std::vector<Term> terms;
  size_t i = 0;
  auto skip_spaces = [&] {
    while (i < text.size() && text[i] == ' ') ++i;
  };
  auto read_number = [&](uint64_t& out) {
    size_t start = i;
    out = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (__builtin_mul_overflow(out, uint64_t{10}, &out) ||
          __builtin_add_overflow(out, static_cast<uint64_t>(text[i] - '0'), &out)) {
        return false;
      }
      ++i;
    }
    return i > start;
  };
  skip_spaces();
  bool negative = false;
  if (i < text.size() && text[i] == '-') {
    negative = true;
    ++i;
  }
  for (;;) {
    skip_spaces();
    Term t;
    uint64_t coefficient = 1;
    bool has_number = false;
    // A term: [number] [* s<i>]..., or s<i> [* s<j>]...
    if (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (!read_number(coefficient)) return fail("a number out of range");
      has_number = true;
    }
    bool expect_factor = !has_number;
    for (;;) {
      if (has_number || !expect_factor) {
        if (i < text.size() && text[i] == '*') {
          ++i;
        } else {
          break;
        }
      }
      has_number = false;
      expect_factor = false;
      if (i >= text.size() || text[i] != 's') return fail("expected a symbol s<i> at " + std::to_string(i));
      ++i;
      uint64_t index = 0;
      if (!read_number(index) || index > 255) return fail("a symbol's number must be 0 to 255");
      t.symbols.push_back(static_cast<uint8_t>(index));
    }
    if (coefficient > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + (negative ? 1 : 0)) {
      return fail("a coefficient out of range");
    }
    t.coefficient = negative ? static_cast<int64_t>(0 - coefficient) : static_cast<int64_t>(coefficient);
    terms.push_back(std::move(t));
    skip_spaces();
    if (i == text.size()) break;
    if (text[i] != '+' && text[i] != '-') return fail("expected + or - at " + std::to_string(i));
    negative = text[i] == '-';
    ++i;
  }
  SizeExpr e = of_terms(std::move(terms));
  if (e.str() != text) return fail("not in canonical form (" + e.str() + ")");
  return e;
}

}  // namespace torchcap
