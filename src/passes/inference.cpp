// The helpers the inference passes share (inference.h).
#include "passes/inference.h"

#include "graph/hidden_writes.h"
#include "graph/operator_facts.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstring>

namespace torchcap::detail {

bool is_call_of(const Node* n, const char* name, const char* overload) {
  return n != nullptr && n->op() == OpCode::CallFunction && n->is_operator() && n->schema().name() == name &&
         n->schema().overload_name() == overload;
}

const Attribute* float_attribute_of(const GraphModule& gm, const Argument& a) {
  if (!a.is_node() || a.to_node()->op() != OpCode::GetAttr) return nullptr;
  const Attribute& attr = gm.attribute(a.to_node()->target());
  return at::isFloatingType(attr.value.scalar_type()) && !attr.value.is_meta() ? &attr : nullptr;
}

std::string fresh_attribute_name(const GraphModule& gm, const std::string& base) {
  std::string name = base;
  for (int i = 1; gm.has_attribute(name); ++i) name = base + "_" + std::to_string(i);
  return name;
}

void stop_requiring_grad(GraphModule& gm, const Argument& get_attr) {
  if (!get_attr.is_node() || get_attr.to_node()->op() != OpCode::GetAttr) return;
  const Attribute& a = gm.attribute(get_attr.to_node()->target());
  if (a.value.requires_grad()) gm.set_attribute(a.name, a.value.detach(), a.kind);
}

FusableClamp fusable_clamp(Node* n) {
  FusableClamp c;
  if (n->users().size() != 1) return c;
  Node* u = n->users()[0];
  if (is_call_of(u, "aten::relu") || is_call_of(u, "aten::relu_")) {
    c = {u, true, 0.0, Argument()};
  } else if ((is_call_of(u, "aten::hardtanh") || is_call_of(u, "aten::hardtanh_")) && u->kwargs().empty() &&
             u->args().size() == 3) {
    const Argument& lo = u->args()[1];
    const Argument& hi = u->args()[2];
    if ((lo.is_double() || lo.is_int()) && (hi.is_double() || hi.is_int())) c = {u, false, lo, hi};
  }
  return c;
}

bool writes_any_tensor(const Graph& g) {
  for (const Node* n : g) {
    for (const Argument* a : written_arguments(*n)) {
      if (a->is_node()) return true;  // a hidden write counts when it happens (batch norm in training)
    }
  }
  return false;
}

const Node* writes_an_attribute(const Graph& g) {
  for (const Node* n : g) {
    for (const Argument* a : written_arguments(*n)) {
      // Up the chain of views (and of in-place results, which are their
      // argument) to the tensor whose memory is written.
      const Node* root = a->is_node() ? a->to_node() : nullptr;
      while (root != nullptr && root->is_operator() && !root->facts().viewed_argument.empty()) {
        const OperatorFacts& f = root->facts();
        const int i = f.viewed_argument[0] >= 0 ? f.viewed_argument[0] : f.written_argument[0];
        if (i < 0) break;
        const auto at = static_cast<size_t>(i);
        root = at < root->args().size() && root->args()[at].is_node() ? root->args()[at].to_node() : nullptr;
      }
      if (root != nullptr && root->op() == OpCode::GetAttr) return n;
    }
  }
  return nullptr;
}

bool xnnpack_runs() {
  static const bool runs = [] {
    try {
      auto op = c10::Dispatcher::singleton().findSchemaOrThrow("prepacked::conv2d_clamp_prepack", "");
      std::vector<c10::IValue> stack{at::ones({1, 1, 1, 1}), c10::IValue(), std::vector<int64_t>{1, 1},
                                     std::vector<int64_t>{0, 0}, std::vector<int64_t>{1, 1}, int64_t{1},
                                     c10::IValue(), c10::IValue()};
      op.callBoxed(&stack);
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }();
  return runs;
}

}  // namespace torchcap::detail
