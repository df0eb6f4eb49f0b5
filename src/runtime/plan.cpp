// Building the interpreter's plan (plan.h): one evaluation of the graph in
// which values are table slots.
#include "runtime/plan.h"

#include <torchcap/error.h>
#include <torchcap/evaluator.h>
#include <torchcap/passes.h>
#include <torchcap/printer.h>

#include "graph/operator_facts.h"
#include "graph/schema_check.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace torchcap {
namespace detail {
namespace {

// What a node evaluates to while the plan is built: where its value will be
// at run time. A multi-output node's values are `count` consecutive slots.
struct PlanValue {
  Slot::Kind kind = Slot::Kind::Constant;  // Constant: no value (returns nothing)
  int32_t index = -1;
  bool multi = false;  // several values from `index` on, read through getitem
};

// Whether sizes and strides lay the elements out densely, without overlap
// (Note [Inputs in the traced layout] in interpreter.cpp).
bool is_dense_layout(const TensorMeta& m) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims of size > 1
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) return true;
    if (m.sizes[d] != 1) dims.emplace_back(m.strides[d], m.sizes[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

class PlanBuilder : public GraphEvaluator<PlanValue> {
 public:
  PlanBuilder(const GraphModule& gm, const InterpreterOptions& options)
      : GraphEvaluator(gm.graph()), gm_(gm), options_(options),
        plan_(std::make_unique<InterpreterPlan>()) {}

  std::unique_ptr<InterpreterPlan> build() {
    gm_.lint();
    if (options_.plan_memory && options_.autograd) {
      throw Error("InterpreterOptions: plan_memory and autograd do not go together: a planned run "
                  "writes results into its arena, where autograd cannot follow them");
    }
    plan_->autograd = options_.autograd;
    if (options_.plan_memory) {
      plan_->memory = std::make_unique<PlannedMemory>(plan_memory(gm_.graph()));
    }
    plan_->in_spec = gm_.in_spec;
    plan_->call = gm_.call;
    plan_->out_spec = gm_.out_spec;
    for (const PlanValue& v : run()) plan_->outputs.push_back(slot_of(v, nullptr));
    plan_->num_user_outputs = gm_.num_user_outputs();
    for (size_t i = plan_->num_user_outputs; i < gm_.output_specs.size(); ++i) {
      const OutputSpec& spec = gm_.output_specs[i];
      InterpreterPlan::WriteBack wb{false, -1, {}, false, spec.target};
      if (spec.kind == OutputKind::InputMutation) {
        wb.to_input = true;
        for (size_t k = 0; k < plan_->inputs.size(); ++k) {
          if (plan_->inputs[k].name == spec.target) wb.input = static_cast<int32_t>(k);
        }
      } else {
        wb.buffer = gm_.attribute(spec.target).value;
        plan_->updates_buffers = true;
      }
      plan_->write_backs.push_back(std::move(wb));
    }
    std::vector<bool> written = written_inputs(gm_);
    for (size_t k = 0; k < written.size() && k < plan_->inputs.size(); ++k) {
      plan_->inputs[k].written = written[k];
    }
    plan_->num_values = next_value_;
    for (const Instruction& i : plan_->instructions) plan_->max_args = std::max(plan_->max_args, i.args.size());
    return std::move(plan_);
  }

 protected:
  bool release_values() const override { return false; }

  PlanValue placeholder(const Node& n, size_t index) override {
    InputCheck check;
    check.name = n.name();
    if (n.meta().val.kind == ValueKind::Tensor && !n.meta().val.tensors.empty()) {
      check.has_meta = true;
      check.meta = n.meta().val.tensors[0];
      check.dense = is_dense_layout(check.meta);
    }
    plan_->inputs.push_back(std::move(check));
    return {Slot::Kind::Input, static_cast<int32_t>(index), false};
  }

  PlanValue get_attr(const Node& n) override {
    const Attribute& a = gm_.attribute(n.target());
    if (a.value.defined() && a.value.is_meta()) {
      TensorMeta m = TensorMeta::of(a.value);
      m.device = c10::Device(c10::kCPU);
      plan_->unbound.push_back(std::string(attribute_kind_name(a.kind)) + " '" + a.name + "' (" +
                               m.str() + ")");
    }
    plan_->attributes.push_back(a.value);
    return {Slot::Kind::Attribute, static_cast<int32_t>(plan_->attributes.size() - 1), false};
  }

  PlanValue getitem(const Node& n, const PlanValue& source, int64_t index) override {
    if (!source.multi) {
      throw Error("interpreter: getitem %" + n.name() + " of a node without several outputs");
    }
    return {Slot::Kind::Value, source.index + static_cast<int32_t>(index), false};
  }

  PlanValue call_operator(const Node& n, const std::vector<BoundArgument>& args) override {
    Instruction ins{n.op_handle(), {}, -1, 0, false, {}, -1, -1, {}, n.op_handle(), {}, nullptr};
    ins.args.reserve(args.size());
    for (const BoundArgument& a : args) ins.args.push_back(slot_of(a, n));
    PlanValue result;
    switch (produces(n)) {
      case Produces::Tensor:
      case Produces::Scalar:
        ins.out = next_value_++;
        ins.num_outputs = 1;
        result = {Slot::Kind::Value, ins.out, false};
        break;
      case Produces::Tuple:
        ins.out = next_value_;
        ins.num_outputs = static_cast<int32_t>(n.schema().returns().size());
        next_value_ += ins.num_outputs;
        result = {Slot::Kind::Value, ins.out, true};
        break;
      case Produces::TensorList:
        if (n.meta().val.kind != ValueKind::List) {
          throw Error("interpreter: %" + n.name() + " returns a Tensor[] of unrecorded length; "
                      "trace the graph or set its metadata");
        }
        ins.out = next_value_;
        ins.num_outputs = static_cast<int32_t>(n.meta().val.tensors.size());
        ins.explode = true;
        next_value_ += ins.num_outputs;
        result = {Slot::Kind::Value, ins.out, true};
        break;
      case Produces::Nothing:
        break;
    }
    if (plan_->memory) ins.planned = plan_->memory->add_call(n);
    const ValueMeta& val = n.meta().val;
    ins.node_info = static_cast<int32_t>(plan_->node_infos.size());
    plan_->node_infos.push_back(NodeInfo{
        format_node(n), n.name(), n.target(), n.meta().stack_trace,
        val.kind == ValueKind::Tensor && val.tensors.size() == 1 ? std::optional<TensorMeta>(val.tensors[0])
                                                                 : std::nullopt});
    plan_->instructions.push_back(std::move(ins));
    return result;
  }

 private:
  Slot slot_of(const PlanValue& v, const Node* n) const {
    if (v.kind == Slot::Kind::Constant || v.multi) {
      throw Error("interpreter: %" + (n == nullptr ? std::string("a value") : n->name()) +
                  " has no single value (a multi-output node used without getitem, or a node "
                  "that returns nothing)");
    }
    Slot s;
    s.kind = v.kind;
    s.index = v.index;
    return s;
  }

  Slot slot_of(const BoundArgument& a, const Node& user) const {
    Slot s;
    switch (a.kind) {
      case BoundArgument::Kind::Constant:
        s.constant = a.constant;
        break;
      case BoundArgument::Kind::Node:
        return slot_of(value_of(a.node), a.node);
      case BoundArgument::Kind::TensorList:
      case BoundArgument::Kind::OptionalTensorList:
        s.kind = a.kind == BoundArgument::Kind::TensorList ? Slot::Kind::TensorList
                                                           : Slot::Kind::OptionalTensorList;
        for (const Node* e : a.elements) {
          s.elements.push_back(e == nullptr ? Slot{} : slot_of(value_of(e), e));
        }
        break;
    }
    return s;
  }

  const GraphModule& gm_;
  InterpreterOptions options_;
  std::unique_ptr<InterpreterPlan> plan_;
  int32_t next_value_ = 0;
};

}  // namespace

std::unique_ptr<InterpreterPlan> build_plan(const GraphModule& gm, const InterpreterOptions& options) {
  return PlanBuilder(gm, options).build();
}

}  // namespace detail
}  // namespace torchcap
