// How a captured program is called: argument names and keyword arguments.
#include <torchcap/call_convention.h>
#include <torchcap/error.h>

#include <algorithm>
#include <optional>
#include <unordered_set>

namespace torchcap {

// Note [Calling convention]
// A program is called with positional and keyword arguments; in_spec holds
// their structure as one tuple: the positional arguments, then (when the
// call passed any by keyword) one dict of the keyword arguments. The spec
// alone cannot tell that dict from a positional dict argument, nor name
// anything, so a module saved and loaded again was called as
// forward(ph_0, arg1) where it had been forward(x, *, scale). The convention
// keeps what a caller needs: the positional arguments' names and whether the
// trailing dict is the keywords. It travels in files (docs/FORMAT.md,
// `call`), names the placeholders of a trace (leaf_names: `x`, `xs_0`,
// `scale`) so that listings and generated code read as the program does, and
// binds calls by name in C++ (bind) as Python binds them in the generated
// forward. Keyword arguments stay keyword-only: the program was traced with
// them passed by name, and the spec fixes which ones a call passes.

namespace {

bool is_name(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  });
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

// The leaves below `spec`, named from `prefix`: the prefix itself for a
// tensor, then `_<index>` per tuple or list element and `_<key>` per dict key.
void name_leaves(const TreeSpec& spec, const std::string& prefix, std::vector<std::string>& out) {
  switch (spec.kind()) {
    case TreeSpec::Kind::Leaf:
      out.push_back(prefix);
      return;
    case TreeSpec::Kind::Tuple:
    case TreeSpec::Kind::List:
      for (size_t i = 0; i < spec.children().size(); ++i) {
        name_leaves(spec.children()[i], prefix + "_" + std::to_string(i), out);
      }
      return;
    case TreeSpec::Kind::Dict:
      for (size_t i = 0; i < spec.children().size(); ++i) {
        const c10::IValue& k = spec.keys()[i];
        std::string key = k.isString() ? k.toStringRef() : std::to_string(k.toInt());
        name_leaves(spec.children()[i], prefix + "_" + key, out);
      }
      return;
    case TreeSpec::Kind::None:
    case TreeSpec::Kind::Constant:
      return;
  }
}

size_t num_top_level(const TreeSpec& in_spec) {
  return in_spec.kind() == TreeSpec::Kind::Tuple ? in_spec.children().size() : 1;
}

}  // namespace

std::string CallConvention::mismatch(const TreeSpec& in_spec) const {
  if (empty()) return "";
  if (in_spec.kind() != TreeSpec::Kind::Tuple) {
    return "the input spec " + in_spec.str() + " is not a tuple of arguments";
  }
  const auto& top = in_spec.children();
  if (keywords) {
    if (top.empty() || top.back().kind() != TreeSpec::Kind::Dict) {
      return "the call passes keyword arguments but the input spec " + in_spec.str() +
             " does not end with a dict of them";
    }
    for (const c10::IValue& k : top.back().keys()) {
      if (!k.isString()) {
        return "keyword argument names must be strings; the input spec's last dict has the key " +
               c10::str(k);
      }
    }
  }
  if (!names.empty()) {
    size_t positional = top.size() - (keywords ? 1 : 0);
    if (names.size() != positional) {
      return std::to_string(names.size()) + " argument name(s) (" + quoted_list(names) +
             ") for the " + std::to_string(positional) + " positional argument(s) of the input spec " +
             in_spec.str();
    }
    std::unordered_set<std::string> seen;
    for (const std::string& n : names) {
      if (!is_name(n)) return "argument name '" + n + "' is not an identifier";
      if (!seen.insert(n).second) return "argument name '" + n + "' appears twice";
    }
  }
  return "";
}

std::vector<std::string> CallConvention::keyword_names(const TreeSpec& in_spec) const {
  std::vector<std::string> out;
  if (!keywords || in_spec.children().empty()) return out;
  for (const c10::IValue& k : in_spec.children().back().keys()) out.push_back(k.toStringRef());
  return out;
}

std::string CallConvention::str(const TreeSpec& in_spec) const {
  size_t positional = num_top_level(in_spec) - (keywords ? 1 : 0);
  std::string out = "(";
  for (size_t i = 0; i < positional; ++i) {
    out += (i ? ", " : "") + (i < names.size() ? names[i] : "arg" + std::to_string(i));
  }
  std::vector<std::string> keys = keyword_names(in_spec);
  if (!keys.empty()) out += positional ? ", *" : "*";
  for (const std::string& k : keys) out += ", " + k;
  return out + ")";
}

std::vector<std::string> CallConvention::leaf_names(const TreeSpec& in_spec) const {
  std::vector<std::string> out;
  if (names.empty() && !keywords) return out;
  const auto& top = in_spec.children();
  size_t positional = top.size() - (keywords ? 1 : 0);
  for (size_t i = 0; i < positional; ++i) {
    name_leaves(top[i], i < names.size() ? names[i] : "ph_" + std::to_string(i), out);
  }
  if (keywords) {
    const TreeSpec& dict = top.back();
    for (size_t i = 0; i < dict.children().size(); ++i) {
      name_leaves(dict.children()[i], dict.keys()[i].toStringRef(), out);
    }
  }
  return out;
}

std::vector<c10::IValue> CallConvention::bind(const TreeSpec& in_spec, std::vector<c10::IValue> args,
                                              NamedValues kwargs) const {
  const size_t positional = num_top_level(in_spec) - (keywords ? 1 : 0);
  std::vector<std::string> keys = keyword_names(in_spec);
  auto param_list = [&] { return str(in_spec); };
  if (args.size() > positional) {
    throw InputError("the program takes " + std::to_string(positional) +
                     " positional argument(s) " + param_list() + ", got " + std::to_string(args.size()));
  }
  std::vector<std::optional<c10::IValue>> slots(positional);
  for (size_t i = 0; i < args.size(); ++i) slots[i] = std::move(args[i]);
  std::vector<std::optional<c10::IValue>> keyword_slots(keys.size());
  for (auto& [name, value] : kwargs) {
    auto k = std::find(keys.begin(), keys.end(), name);
    if (k != keys.end()) {
      auto& slot = keyword_slots[k - keys.begin()];
      if (slot) throw InputError("keyword argument '" + name + "' is given twice");
      slot = std::move(value);
      continue;
    }
    auto p = std::find(names.begin(), names.end(), name);
    if (p == names.end()) {
      throw InputError("the program has no argument '" + name + "'; it takes " + param_list());
    }
    auto& slot = slots[p - names.begin()];
    if (slot) throw InputError("argument '" + name + "' is given twice (by position and by name)");
    slot = std::move(value);
  }
  std::vector<c10::IValue> out;
  out.reserve(positional + (keywords ? 1 : 0));
  for (size_t i = 0; i < positional; ++i) {
    if (!slots[i]) {
      throw InputError("missing argument " +
                       (i < names.size() ? "'" + names[i] + "'" : std::to_string(i)) +
                       "; the program takes " + param_list());
    }
    out.push_back(std::move(*slots[i]));
  }
  if (keywords) {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!keyword_slots[i]) {
        throw InputError("missing keyword argument '" + keys[i] + "'; the program takes " +
                         param_list());
      }
      dict.insert(keys[i], std::move(*keyword_slots[i]));
    }
    out.emplace_back(std::move(dict));
  }
  return out;
}

}  // namespace torchcap
