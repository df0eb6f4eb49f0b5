#include "graph/operator_facts.h"

#include <torchcap/graph_module.h>
#include <torchcap/node.h>

#include "graph/data_dependence.h"
#include "graph/hidden_writes.h"
#include "graph/ivalue_conversion.h"

#include <ATen/core/enum_tag.h>
#include <ATen/core/jit_type.h>
#include <ATen/core/op_registration/op_registration.h>

#include <map>
#include <mutex>
#include <unordered_map>

namespace torchcap {
namespace detail {
namespace {

bool is_write(const c10::AliasInfo* info) {
  if (info == nullptr) return false;
  if (info->isWrite()) return true;
  for (const c10::AliasInfo& c : info->containedTypes()) {
    if (is_write(&c)) return true;
  }
  return false;
}

std::vector<c10::Symbol> alias_sets(const c10::Argument& a) {
  std::vector<c10::Symbol> sets;
  std::vector<const c10::AliasInfo*> work;
  if (a.alias_info() != nullptr) work.push_back(a.alias_info());
  while (!work.empty()) {
    const c10::AliasInfo* info = work.back();
    work.pop_back();
    for (const c10::Symbol& s : info->beforeSets()) {
      if (s != c10::AliasInfo::wildcardSet()) sets.push_back(s);
    }
    for (const c10::AliasInfo& contained : info->containedTypes()) work.push_back(&contained);
  }
  return sets;
}

// Index of the argument that return `r` writes and returns (same alias set,
// written), or -1.
int written_argument_of(const c10::FunctionSchema& schema, const c10::Argument& r) {
  if (!r.alias_info() || !r.alias_info()->isWrite()) return -1;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* a = args[i].alias_info();
    if (a != nullptr && a->isWrite() && a->beforeSets() == r.alias_info()->beforeSets()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

// Index of the argument that return `r` is a view of (it shares an alias set
// without writing), or -1.
int viewed_argument_of(const c10::FunctionSchema& schema, const c10::Argument& r) {
  if (!r.alias_info() || r.alias_info()->isWrite()) return -1;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* a = args[i].alias_info();
    if (a != nullptr && a->beforeSets() == r.alias_info()->beforeSets()) return static_cast<int>(i);
  }
  return -1;
}

bool is_tensor_type(const c10::Type& t) {
  const c10::Type& u = unwrap_optional(t);
  if (u.kind() == c10::TypeKind::TensorType) return true;
  return u.kind() == c10::TypeKind::ListType &&
         is_tensor_type(*u.expectRef<c10::ListType>().getElementType());
}

bool is_number_type(const c10::Type& t) {
  using K = c10::TypeKind;
  const c10::Type& u = unwrap_optional(t);
  switch (u.kind()) {
    case K::IntType:
    case K::SymIntType:
    case K::FloatType:
    case K::BoolType:
    case K::NumberType:
    case K::ComplexType:
      return true;
    case K::ListType:
      return is_number_type(*u.expectRef<c10::ListType>().getElementType());
    default:
      return false;
  }
}

// Note [Data-dependent values]
// An operator that hands a value computed from tensor data back to the
// program as a plain C++ value (`.item()`, `at::equal`, `allclose`, a tensor
// used as a condition) lets the program branch on it: the graph would bake
// that value, and the branch taken, in. Which operators do is read from their
// registration, not from a list of names: results that are no tensor, of an
// operator LibTorch tags `data_dependent_output`; for operators of other
// libraries, which carry no such tags, any number result (metadata such as
// dtypes, devices or packed parameters is not a number). ATen's untagged
// number results are metadata: sizes, strides, dims, flags.
bool returns_data(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  if (schema.returns().empty()) return false;
  for (const c10::Argument& r : schema.returns()) {
    if (is_tensor_type(*r.real_type())) return false;
  }
  if (op.hasTag(at::Tag::data_dependent_output)) return true;
  if (operator_namespace(schema.operator_name()) == "aten") return false;
  for (const c10::Argument& r : schema.returns()) {
    if (is_number_type(*r.real_type())) return true;
  }
  return false;
}

// Overload names by operator name, read once from the dispatcher.
const std::map<std::string, std::vector<std::string>>& overloads_by_name() {
  static const std::map<std::string, std::vector<std::string>> table = [] {
    std::map<std::string, std::vector<std::string>> t;
    for (const c10::OperatorName& n : c10::Dispatcher::singleton().getAllOpNames()) {
      t[n.name].push_back(n.overload_name);
    }
    return t;
  }();
  return table;
}

bool writes(const c10::Argument& a) { return a.alias_info() != nullptr && a.alias_info()->isWrite(); }

// Whether `out` is `functional` plus one written Tensor per return.
bool is_out_form_of(const c10::FunctionSchema& out, const c10::FunctionSchema& functional) {
  const auto& fa = functional.arguments();
  const auto& oa = out.arguments();
  size_t n = functional.returns().size();
  if (oa.size() != fa.size() + n || out.returns().size() != n) return false;
  for (size_t i = 0; i < fa.size(); ++i) {
    if (oa[i].name() != fa[i].name() || *oa[i].type() != *fa[i].type() || writes(oa[i])) return false;
  }
  for (size_t i = fa.size(); i < oa.size(); ++i) {
    if (!writes(oa[i]) || oa[i].type()->kind() != c10::TypeKind::TensorType) return false;
  }
  return true;
}

std::optional<c10::OperatorHandle> out_variant_of(const c10::FunctionSchema& schema) {
  if (schema.returns().empty()) return std::nullopt;
  for (const c10::Argument& r : schema.returns()) {
    if (r.alias_info() != nullptr || r.type()->kind() != c10::TypeKind::TensorType) return std::nullopt;
  }
  for (const c10::Argument& a : schema.arguments()) {
    if (writes(a)) return std::nullopt;
  }
  const auto& table = overloads_by_name();
  auto it = table.find(schema.name());
  if (it == table.end()) return std::nullopt;
  for (const std::string& overload : it->second) {
    if (overload == schema.overload_name()) continue;
    auto handle = c10::Dispatcher::singleton().findOp({schema.name(), overload});
    if (handle && handle->hasSchema() && is_out_form_of(handle->schema(), schema)) return *handle;
  }
  return std::nullopt;
}

OperatorFacts derive(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  OperatorFacts f;
  f.identity = &operator_identity(schema.operator_name());
  for (const c10::Argument& p : schema.arguments()) {
    f.writes.push_back(is_write(p.alias_info()));
    f.writes_elements.push_back(f.writes.back() && !p.alias_info()->isWrite());
    f.aliased.push_back(p.alias_info() != nullptr);
    f.argument_sets.push_back(alias_sets(p));
    f.writes_declared = f.writes_declared || f.writes.back();
    f.any_alias = f.any_alias || f.aliased.back();
  }
  for (const c10::Argument& r : schema.returns()) {
    f.written_argument.push_back(written_argument_of(schema, r));
    f.viewed_argument.push_back(viewed_argument_of(schema, r));
    f.return_sets.push_back(alias_sets(r));
    f.returns_written = f.returns_written || f.written_argument.back() >= 0;
    f.returns_view = f.returns_view || f.viewed_argument.back() >= 0;
    f.returns_alias = f.returns_alias || r.alias_info() != nullptr;
  }
  f.any_alias = f.any_alias || f.returns_alias;
  f.hidden = hidden_writes(schema.operator_name());
  f.mutable_schema = schema.is_mutable();
  f.returns_nothing = schema.returns().empty();
  f.returns_data = returns_data(op);
  f.maybe_data_dependent_shape = may_have_data_dependent_shape(schema);
  while (f.positional < schema.arguments().size() && !schema.arguments()[f.positional].kwarg_only()) {
    ++f.positional;
  }
  f.out_variant = out_variant_of(schema);
  f.is_equal = schema.name() == "aten::equal";
  f.is_reshape_alias = schema.name() == "aten::_reshape_alias" && schema.overload_name().empty();
  return f;
}

// Note [Operator facts kept until deregistered]
// Facts are kept by schema: a registration's schema lives as long as the
// registration. An operator deregistered and defined again (a library
// unloaded, a test's torch::Library going out of scope) may get a schema at
// the same address, so the dispatcher's listener retires the facts of every
// operator that goes away: looked up no more, but never freed, so a node or
// a trace that still points at them (a graph of an operator since
// deregistered, which lint reports) reads valid memory. Operators are
// registered a bounded number of times in a process.
class FactsCache : public c10::OpRegistrationListener {
 public:
  static FactsCache& get() {
    static FactsCache* cache = [] {
      auto owned = std::make_unique<FactsCache>();
      FactsCache* raw = owned.get();
      // Note [Registrations for the life of the process] in dispatch.cpp.
      static auto* handle = new c10::RegistrationHandleRAII(
          c10::Dispatcher::singleton().addRegistrationListener(std::move(owned)));
      (void)handle;
      return raw;
    }();
    return *cache;
  }

  const OperatorFacts& lookup(const c10::OperatorHandle& op) {
    const c10::FunctionSchema* key = &op.schema();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = facts_.find(key);
      if (it != facts_.end()) return *it->second;
    }
    auto facts = std::make_unique<const OperatorFacts>(derive(op));
    std::lock_guard<std::mutex> lock(mu_);
    return *facts_.emplace(key, std::move(facts)).first->second;
  }

  void onOperatorRegistered(const c10::OperatorHandle&) override {}

  void onOperatorDeregistered(const c10::OperatorHandle& op) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = facts_.begin(); it != facts_.end();) {
      if (it->second->identity->name == op.operator_name()) {
        retired_.push_back(std::move(it->second));
        it = facts_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  std::mutex mu_;
  std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<const OperatorFacts>> facts_;
  std::vector<std::unique_ptr<const OperatorFacts>> retired_;
};

}  // namespace

const OperatorFacts& operator_facts(const c10::OperatorHandle& op) {
  return FactsCache::get().lookup(op);
}

const Node* memory_root(const Node* n, bool through_views) {
  while (n->is_operator() && !n->is_getitem() && !n->schema().returns().empty()) {
    const OperatorFacts& f = facts_of(*n);
    int k = f.written_argument[0];
    if (k < 0 && through_views) k = f.viewed_argument[0];
    if (k < 0) break;
    const Argument* given = static_cast<size_t>(k) < n->args().size()
                                ? &n->args()[k]
                                : n->kwarg(n->schema().arguments()[k].name());
    if (given == nullptr || !given->is_node()) break;
    n = given->to_node();
  }
  return n;
}

std::vector<bool> written_inputs(const GraphModule& gm) {
  std::unordered_map<const Node*, size_t> input_of;
  std::vector<bool> written;
  for (const Node* n : gm.graph()) {
    if (n->op() != OpCode::Placeholder) continue;
    input_of[n] = written.size();
    written.push_back(false);
  }
  for (const Node* n : gm.graph()) {
    if (!n->is_operator()) continue;
    for (const Argument* a : written_arguments(*n)) {
      a->for_each_node([&](Node* m) {
        auto it = input_of.find(memory_root(m, /*through_views=*/true));
        if (it != input_of.end()) written[it->second] = true;
      });
    }
  }
  for (const OutputSpec& spec : gm.output_specs) {
    if (spec.kind != OutputKind::InputMutation) continue;
    for (const auto& [node, k] : input_of) {
      if (node->name() == spec.target) written[k] = true;
    }
  }
  return written;
}

}  // namespace detail
}  // namespace torchcap
