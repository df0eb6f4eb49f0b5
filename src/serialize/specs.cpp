#include "serialize/specs.h"

#include <set>
#include <string>

namespace torchcap::detail {
namespace {

using format::Field;
using format::Object;

c10::IValue constant(const Field& f) {
  if (f.is_boolean()) return c10::IValue(f.boolean());
  if (f.is_integer()) return c10::IValue(f.integer());
  if (f.is_string()) return c10::IValue(std::string(f.string()));
  if (f.is_number()) return c10::IValue(f.float_value());
  if (f.is_object()) {
    Object o = f.indexed_object();
    std::optional<Field> value = o.find("float");
    if (!value) f.fail("missing 'float'");
    if (o.size() != 1) f.fail("a float constant is {\"float\": ...}");
    const double d = value->float_value_as(f);
    o.close();
    return c10::IValue(d);
  }
  f.fail(std::string("a constant is an int, float, bool or string, not ") + f.type_name());
}

}  // namespace

// As deep as the JSON, which the cursor bounds. A spec's keys depend on
// its kind, so its object is looked over before it is read.
TreeSpec read_tree_spec(const Field& f) {
  Object o = f.indexed_object();
  using K = TreeSpec::Kind;
  const K kind = o.get("kind").token(format::kSpecKinds, "spec kind");
  switch (kind) {
    case K::Leaf:
    case K::None:
      o.check_keys(format::spec_keys(kind));
      o.close();
      return kind == K::Leaf ? TreeSpec::leaf() : TreeSpec::none();
    case K::Constant: {
      o.check_keys(format::spec_keys(kind));
      c10::IValue value = constant(o.get("value"));
      o.close();
      return TreeSpec::constant(std::move(value));
    }
    case K::Tuple:
    case K::List:
    case K::Dict:
      break;
  }
  std::vector<TreeSpec> specs;
  o.get("children").elements([&](const Field& child) { specs.push_back(read_tree_spec(child)); });
  o.check_keys(format::spec_keys(kind));
  if (kind != K::Dict) {
    o.close();
    return kind == K::Tuple ? TreeSpec::tuple(std::move(specs)) : TreeSpec::list(std::move(specs));
  }
  // One key type per dict, as LibTorch's dicts have; no key twice.
  Field keys = o.get("keys");
  std::vector<c10::IValue> ivalues;
  std::set<std::string> strings;
  std::set<int64_t> ints;
  bool strings_first = false, ints_first = false;
  keys.elements(
      [&](size_t n) {
        if (n != specs.size()) {
          keys.fail(std::to_string(n) + " keys for " + std::to_string(specs.size()) +
                    " children");
        }
      },
      [&](const Field& key) {
        if (key.index() == 0) {
          strings_first = key.is_string();
          ints_first = key.is_integer();
        }
        bool fresh;
        if (key.is_string() && strings_first) {
          std::string s(key.string());
          fresh = strings.insert(s).second;
          ivalues.emplace_back(std::move(s));
        } else if (key.is_integer() && ints_first) {
          int64_t value = key.integer();
          fresh = ints.insert(value).second;
          ivalues.emplace_back(value);
        } else {
          key.fail("dict keys are all strings or all integers");
        }
        if (!fresh) key.fail("the key appears twice");
      });
  o.close();
  return TreeSpec::dict(std::move(ivalues), std::move(specs));
}

// What each output value is for. Whether targets exist and outputs are in
// order is GraphModule::lint's to check, at the end.
std::vector<OutputSpec> read_signature(const Field& sig) {
  Object o = sig.object();
  o.check_keys(format::keys::kSignature);
  std::vector<OutputSpec> out;
  if (std::optional<Field> outputs = o.find("outputs")) {
    outputs->elements([&](const Field& f) {
      Object output = f.object();
      output.check_keys(format::keys::kOutput);
      OutputKind k = output.get("kind").token(format::kOutputKinds, "output kind");
      std::string target(output.get("target").string());
      output.close();
      out.push_back(OutputSpec{k, std::move(target)});
    });
  }
  o.close();
  return out;
}

// Whether the convention fits in_spec is GraphModule::lint's to check.
CallConvention read_call(const Field& f) {
  Object o = f.object();
  o.check_keys(format::keys::kCall);
  CallConvention call;
  o.get("names").elements([&](const Field& name) { call.names.emplace_back(name.string()); });
  call.keywords = o.get("keywords").boolean();
  o.close();
  return call;
}

// Note [Dynamic graphs in files] (format.h). Whether the dimensions exist
// and expressions use only these symbols is GraphModule::lint's to check.
std::vector<Symbol> read_symbols(const Field& f) {
  std::vector<Symbol> out;
  f.elements([&](const Field& element) {
    Object o = element.object();
    o.check_keys(format::keys::kSymbol);
    Symbol s;
    s.label.assign(o.get("label").string());
    s.min = o.get("min").non_negative();
    Field max = o.get("max");
    if (max.is_null()) {
      max.null();
    } else {
      s.max = max.non_negative();
    }
    o.get("dims").elements([&](const Field& dim) {
      std::vector<int64_t> pair;
      dim.elements([&](const Field& x) { pair.push_back(x.non_negative()); });
      if (pair.size() != 2) dim.fail("a dimension is [input, dim]");
      s.dims.push_back(InputDim{static_cast<size_t>(pair[0]), pair[1]});
    });
    o.close();
    out.push_back(std::move(s));
  });
  return out;
}

}  // namespace torchcap::detail
