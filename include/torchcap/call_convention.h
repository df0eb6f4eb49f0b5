// How a captured program is called: the names of its arguments and which of
// them the call passed by keyword, beyond the structure in_spec gives them.
#pragma once

#include <torchcap/tree_spec.h>

#include <ATen/core/ivalue.h>

#include <string>
#include <utility>
#include <vector>

namespace torchcap {

// Arguments passed by name, in the order given.
using NamedValues = std::vector<std::pair<std::string, c10::IValue>>;

// The program's parameters as its capture saw them (Note [Calling
// convention] in src/graph/call_convention.cpp). Front ends that know the
// program's signature set it (Python's trace); a C++ function's arguments
// have no names, and then `names` is empty.
struct CallConvention {
  // One per positional argument, the top-level elements of in_spec (the
  // keyword dict excepted): Python identifiers, no two alike. Empty: unknown.
  std::vector<std::string> names;
  // The last top-level element of in_spec is a dict (string keys) of the
  // arguments the call passed by keyword; a call passes them by keyword too.
  bool keywords = false;

  bool empty() const { return names.empty() && !keywords; }
  friend bool operator==(const CallConvention& a, const CallConvention& b) {
    return a.names == b.names && a.keywords == b.keywords;
  }

  // What keeps this convention from describing `in_spec`, or "" when it
  // does: in_spec is a tuple of one element per name (when names are known)
  // and, with keywords, a last element that is a dict of string keys. Lint
  // and the loaders report it in their own errors.
  std::string mismatch(const TreeSpec& in_spec) const;

  // The names of the keyword arguments (the keys of in_spec's keyword dict).
  std::vector<std::string> keyword_names(const TreeSpec& in_spec) const;

  // "(x, y, *, scale, bias)"; unknown names as arg0, arg1...
  std::string str(const TreeSpec& in_spec) const;

  // A name for each leaf of in_spec (each placeholder), from the argument
  // names: `x` for a tensor argument x, `xs_0`, `xs_1` for a tuple of two,
  // `batch_image` for a dict's key `image`, `scale` for a keyword. Names
  // that are not valid node names are left to the graph to make valid.
  // Empty when no names are known.
  std::vector<std::string> leaf_names(const TreeSpec& in_spec) const;

  // The program's arguments (Interpreter::run's inputs: one per top-level
  // element of in_spec) from a call by position and by name: positional
  // values first, in order, then named ones. A name may be a keyword
  // argument's or, when names are known, a positional argument's. Throws
  // InputError naming the argument that is missing, unknown, or given twice.
  std::vector<c10::IValue> bind(const TreeSpec& in_spec, std::vector<c10::IValue> args,
                                NamedValues kwargs) const;
};

}  // namespace torchcap
