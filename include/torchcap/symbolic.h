// Dynamic sizes: symbols that stand for input dimensions, and the integer
// expressions of them that a dynamic graph's sizes are.
//
// A graph traced with dynamic dimensions (TraceOptions::dynamic) keeps one
// Symbol per distinct dynamic dimension, printed `s0`, `s1`, ... Its nodes'
// tensor metadata hold, besides the sizes and strides seen while tracing,
// their expressions in the symbols (`s0`, `4*s0`, `s0*s1 + 1`), and the
// integers its operators take that depend on a dynamic size are computed by
// size nodes (`sym_size`, `mul`, `add`, ... in node.h) instead of being
// constants. Note [Dynamic shapes by aligned traces] in src/trace/dynamic.cpp
// tells how such a graph is made.
#pragma once

#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace torchcap {

// No upper bound on a symbol.
inline constexpr int64_t kNoMaxSize = std::numeric_limits<int64_t>::max();

// A dimension of a graph input: placeholder `input` (counted from 0, in the
// order of the placeholders), dimension `dim`.
struct InputDim {
  size_t input = 0;
  int64_t dim = 0;

  friend bool operator==(const InputDim& a, const InputDim& b) {
    return a.input == b.input && a.dim == b.dim;
  }
};

// A dynamic size: every input dimension in `dims` has it, and a call is
// refused unless it is in [min, max].
struct Symbol {
  std::string label;  // the user's name for it ("batch"); "s<i>" when none was given
  int64_t min = 0;
  int64_t max = kNoMaxSize;
  std::vector<InputDim> dims;  // never empty

  friend bool operator==(const Symbol& a, const Symbol& b) {
    return a.label == b.label && a.min == b.min && a.max == b.max && a.dims == b.dims;
  }
};

// "s0", "s1": how symbol `i` prints.
std::string symbol_name(size_t i);

// An integer polynomial in the symbols, kept as a sum of terms with nonzero
// coefficients, in a canonical order (so equal expressions compare equal).
class SizeExpr {
 public:
  struct Term {
    int64_t coefficient = 0;
    // The symbols multiplied, sorted, repeated for powers: {0, 0, 1} is s0*s0*s1.
    c10::SmallVector<uint8_t, 2> symbols;

    friend bool operator==(const Term& a, const Term& b) {
      return a.coefficient == b.coefficient && a.symbols == b.symbols;
    }
  };

  SizeExpr() = default;  // 0
  static SizeExpr constant(int64_t v);
  static SizeExpr symbol(size_t i);
  // From terms in any order; like terms are combined and zero terms dropped.
  static SizeExpr of_terms(std::vector<Term> terms);
  // Parses what str() prints; throws Error naming `text` otherwise.
  static SizeExpr parse(const std::string& text);

  const std::vector<Term>& terms() const { return terms_; }
  bool is_constant() const;
  // The constant term (0 if none).
  int64_t constant_term() const;
  // The highest symbol index used, plus one (0 for a constant).
  size_t num_symbols_used() const;

  // The value at `values` (one per symbol). Throws Error on overflow, or if
  // a symbol it uses has no value.
  int64_t evaluate(c10::ArrayRef<int64_t> values) const;

  // "4*s0", "s0*s1 + 2*s0 - 1", "7".
  std::string str() const;

  friend bool operator==(const SizeExpr& a, const SizeExpr& b) { return a.terms_ == b.terms_; }
  friend bool operator!=(const SizeExpr& a, const SizeExpr& b) { return !(a == b); }

 private:
  std::vector<Term> terms_;
};

// The sizes and strides of a tensor in a dynamic graph, one expression per
// dimension (see TensorMeta::symbolic).
struct SymbolicShape {
  std::vector<SizeExpr> sizes;
  std::vector<SizeExpr> strides;

  friend bool operator==(const SymbolicShape& a, const SymbolicShape& b) {
    return a.sizes == b.sizes && a.strides == b.strides;
  }
};

}  // namespace torchcap
