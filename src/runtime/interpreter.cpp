// The interpreter: a plan built once from the graph, run from flat tables.
#include <torchcap/error.h>
#include <torchcap/interpreter.h>
#include <torchcap/printer.h>

#include "graph/schema_check.h"
#include "runtime/ivalues.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/jit_type.h>

#include <unordered_map>

namespace torchcap {
namespace {

// Where an operator argument comes from at run time.
struct Slot {
  enum class Kind : uint8_t {
    Constant,       // `constant`, converted to the schema's type at plan time
    Value,          // values[index]: an intermediate result
    Input,          // inputs[index]
    Attribute,      // attributes[index]
    TensorList,     // a Tensor[] gathered from `elements`
    OptionalTensorList,  // a Tensor?[] gathered from `elements` (Constant = none)
  };
  Kind kind = Kind::Constant;
  int32_t index = -1;
  c10::IValue constant;
  std::vector<Slot> elements;
};

// One call_function node of the graph.
struct Instruction {
  c10::OperatorHandle op;
  std::vector<Slot> args;  // the schema's full arity: defaults already filled
  // Results go to values[out], values[out+1], ... (one per return, or one per
  // element of a Tensor[] return when `explode` is set).
  int32_t out = -1;
  int32_t num_outputs = 0;
  bool explode = false;
  std::vector<int32_t> frees;  // values released after this instruction
  int32_t node_info = -1;
};

// What an error needs to say about a node.
struct NodeInfo {
  std::string line;  // as printed: %addmm_1 : ... = aten::addmm(...)
  StackTrace stack_trace;
};

struct InputCheck {
  std::string name;
  bool has_meta = false;
  TensorMeta meta;
};

// Note [Run frames]
// A run's state is its value table and its operator stack. They belong to
// the call (one GraphModule runs on several threads at once), but allocating
// them on every run would be bookkeeping on the hot path. Each thread keeps
// one frame and reuses its capacity from run to run, whatever the graph; a
// run that starts while the thread's frame is taken (an operator that runs
// another graph) gets a fresh one. A frame is emptied when its run ends,
// normally or by an exception, so it holds no tensor between runs.
struct Frame {
  std::vector<c10::IValue> values;
  std::vector<c10::IValue> stack;
  bool busy = false;
};

class FrameLease {
 public:
  FrameLease(size_t num_values, size_t stack_size) {
    static thread_local Frame cached;
    frame_ = cached.busy ? &own_ : &cached;
    frame_->busy = true;
    frame_->values.resize(num_values);
    frame_->stack.reserve(stack_size);
  }
  ~FrameLease() {
    frame_->values.clear();
    frame_->stack.clear();
    frame_->busy = false;
  }
  FrameLease(const FrameLease&) = delete;
  FrameLease& operator=(const FrameLease&) = delete;

  std::vector<c10::IValue>& values() { return frame_->values; }
  std::vector<c10::IValue>& stack() { return frame_->stack; }

 private:
  Frame own_;
  Frame* frame_;
};

}  // namespace

struct detail::InterpreterPlan {
  std::vector<Instruction> instructions;
  std::vector<at::Tensor> attributes;
  std::vector<InputCheck> inputs;
  std::vector<Slot> outputs;  // Value, Input or Attribute slots; user outputs first
  size_t num_user_outputs = 0;
  // For each output after the user outputs: where its value is written back.
  struct WriteBack {
    bool to_input;       // else to an attribute
    int32_t input;       // placeholder index
    at::Tensor buffer;   // the attribute's tensor
  };
  std::vector<WriteBack> write_backs;
  std::vector<NodeInfo> node_infos;
  int32_t num_values = 0;
  size_t max_args = 0;
  TreeSpec in_spec;
  TreeSpec out_spec;
};

namespace {

using detail::constant_ivalue;
using detail::unwrap_optional;

class PlanBuilder {
 public:
  explicit PlanBuilder(const GraphModule& gm) : gm_(gm) {}

  std::unique_ptr<detail::InterpreterPlan> build() {
    gm_.lint();
    auto plan = std::make_unique<detail::InterpreterPlan>();
    plan->in_spec = gm_.in_spec;
    plan->out_spec = gm_.out_spec;
    for (const Node* n : gm_.graph()) {
      switch (n->op()) {
        case OpCode::Placeholder: {
          where_[n] = {Slot::Kind::Input, static_cast<int32_t>(plan->inputs.size())};
          InputCheck check;
          check.name = n->name();
          if (n->meta().val.kind == ValueKind::Tensor && !n->meta().val.tensors.empty()) {
            check.has_meta = true;
            check.meta = n->meta().val.tensors[0];
          }
          plan->inputs.push_back(std::move(check));
          break;
        }
        case OpCode::GetAttr:
          where_[n] = {Slot::Kind::Attribute, static_cast<int32_t>(plan->attributes.size())};
          plan->attributes.push_back(gm_.attribute(n->target()).value);
          break;
        case OpCode::CallFunction:
          if (n->is_getitem()) {
            getitem(*n);
          } else {
            call(*plan, *n);
          }
          break;
        case OpCode::Output:
          for (const Argument& a : n->args()[0].to_list()) plan->outputs.push_back(slot_of(a.to_node()));
          break;
      }
    }
    plan->num_user_outputs = gm_.num_user_outputs();
    for (size_t i = plan->num_user_outputs; i < gm_.output_specs.size(); ++i) {
      const OutputSpec& spec = gm_.output_specs[i];
      detail::InterpreterPlan::WriteBack wb{false, -1, {}};
      if (spec.kind == OutputKind::InputMutation) {
        wb.to_input = true;
        for (size_t k = 0; k < plan->inputs.size(); ++k) {
          if (plan->inputs[k].name == spec.target) wb.input = static_cast<int32_t>(k);
        }
      } else {
        wb.buffer = gm_.attribute(spec.target).value;
      }
      plan->write_backs.push_back(std::move(wb));
    }
    plan->num_values = next_value_;
    compute_frees(*plan);
    for (const Instruction& i : plan->instructions) plan->max_args = std::max(plan->max_args, i.args.size());
    return plan;
  }

 private:
  struct Where {
    Slot::Kind kind;
    int32_t index;
  };

  Slot slot_of(const Node* n) {
    auto it = where_.find(n);
    if (it == where_.end()) {
      throw Error("interpreter: %" + n->name() + " has no value (a multi-output node used "
                  "without getitem, or a node that returns nothing)");
    }
    Slot s;
    s.kind = it->second.kind;
    s.index = it->second.index;
    return s;
  }

  Slot argument_slot(const Argument& a, const c10::Type& declared) {
    if (a.is_node()) return slot_of(a.to_node());
    const c10::Type& type = unwrap_optional(declared);
    if (a.is_list() && type.kind() == c10::TypeKind::ListType) {
      bool has_nodes = false;
      a.for_each_node([&](Node*) { has_nodes = true; });
      if (has_nodes) {
        const c10::Type& elem = *type.expectRef<c10::ListType>().getElementType();
        Slot s;
        s.kind = elem.kind() == c10::TypeKind::OptionalType ? Slot::Kind::OptionalTensorList
                                                            : Slot::Kind::TensorList;
        for (const Argument& e : a.to_list()) s.elements.push_back(argument_slot(e, elem));
        return s;
      }
    }
    Slot s;
    s.constant = constant_ivalue(a, declared);
    return s;
  }

  // A view of attributes only (`t(weight)`) is computed once, here: it
  // aliases the attribute's memory, so it stays right even when the graph
  // updates the attribute in place.
  bool fold_view(detail::InterpreterPlan& plan, const Node& n, const Instruction& ins) {
    const c10::FunctionSchema& schema = n.schema();
    if (schema.returns().size() != 1 || detail::produces(n) != detail::Produces::Tensor) return false;
    const c10::AliasInfo* ret = schema.returns()[0].alias_info();
    if (ret == nullptr || ret->isWrite()) return false;
    for (const c10::Argument& a : schema.arguments()) {
      if (a.alias_info() != nullptr && a.alias_info()->isWrite()) return false;
    }
    bool reads_attribute = false;
    for (const Slot& s : ins.args) {
      if (s.kind == Slot::Kind::Attribute) {
        reads_attribute = true;
      } else if (s.kind != Slot::Kind::Constant) {
        return false;
      }
    }
    if (!reads_attribute) return false;
    std::vector<c10::IValue> stack;
    for (const Slot& s : ins.args) {
      stack.push_back(s.kind == Slot::Kind::Attribute ? c10::IValue(plan.attributes[s.index])
                                                      : s.constant);
    }
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ins.op.callBoxed(&stack);
    where_[&n] = {Slot::Kind::Attribute, static_cast<int32_t>(plan.attributes.size())};
    plan.attributes.push_back(stack.at(0).toTensor());
    return true;
  }

  void call(detail::InterpreterPlan& plan, const Node& n) {
    Instruction ins{n.op_handle(), {}, -1, 0, false, {}, -1};
    const c10::FunctionSchema& schema = n.schema();
    const auto& params = schema.arguments();
    std::vector<const Argument*> given = detail::given_arguments(n);
    for (size_t i = 0; i < params.size(); ++i) {
      if (given[i] != nullptr) {
        ins.args.push_back(argument_slot(*given[i], *params[i].real_type()));
      } else {
        Slot s;  // a default, or none for an optional without one
        if (params[i].default_value()) s.constant = *params[i].default_value();
        ins.args.push_back(std::move(s));
      }
    }
    if (fold_view(plan, n, ins)) return;
    const ValueMeta& val = n.meta().val;
    switch (detail::produces(n)) {
      case detail::Produces::Tensor:
      case detail::Produces::Scalar:
        ins.out = next_value_++;
        ins.num_outputs = 1;
        where_[&n] = {Slot::Kind::Value, ins.out};
        break;
      case detail::Produces::Tuple:
        ins.out = next_value_;
        ins.num_outputs = static_cast<int32_t>(schema.returns().size());
        next_value_ += ins.num_outputs;
        multi_[&n] = ins.out;
        break;
      case detail::Produces::TensorList:
        if (val.kind != ValueKind::List) {
          throw Error("interpreter: %" + n.name() + " returns a Tensor[] of unrecorded length; "
                      "trace the graph or set its metadata");
        }
        ins.out = next_value_;
        ins.num_outputs = static_cast<int32_t>(val.tensors.size());
        ins.explode = true;
        next_value_ += ins.num_outputs;
        multi_[&n] = ins.out;
        break;
      case detail::Produces::Nothing:
        break;
    }
    ins.node_info = static_cast<int32_t>(plan.node_infos.size());
    plan.node_infos.push_back(NodeInfo{format_node(n), n.meta().stack_trace});
    plan.instructions.push_back(std::move(ins));
  }

  // getitem needs no instruction: it names one of its source's value slots.
  void getitem(const Node& n) {
    const Node* src = n.args()[0].to_node();
    auto it = multi_.find(src);
    if (it == multi_.end()) throw Error("interpreter: getitem %" + n.name() + " of a node without outputs");
    int64_t index = n.args()[1].to_int();
    where_[&n] = {Slot::Kind::Value, static_cast<int32_t>(it->second + index)};
  }

  // Note [Freeing values after their last use]
  // One reverse walk: the first time a value is seen (from the end), that
  // instruction is its last use, so the value is released right after it.
  // Values never read are released right after they are produced. Values the
  // output returns are never released.
  void compute_frees(detail::InterpreterPlan& plan) {
    std::vector<bool> seen(plan.num_values, false);
    for (const Slot& s : plan.outputs) {
      if (s.kind == Slot::Kind::Value) seen[s.index] = true;
    }
    auto visit = [&](const Slot& s, Instruction& ins, auto&& self) -> void {
      if (s.kind == Slot::Kind::Value && !seen[s.index]) {
        seen[s.index] = true;
        ins.frees.push_back(s.index);
      }
      for (const Slot& e : s.elements) self(e, ins, self);
    };
    for (size_t k = plan.instructions.size(); k-- > 0;) {
      Instruction& ins = plan.instructions[k];
      for (const Slot& s : ins.args) visit(s, ins, visit);
      for (int32_t o = ins.out; o >= 0 && o < ins.out + ins.num_outputs; ++o) {
        if (!seen[o]) {
          seen[o] = true;
          ins.frees.push_back(o);  // produced, never read
        }
      }
    }
  }

  const GraphModule& gm_;
  std::unordered_map<const Node*, Where> where_;
  std::unordered_map<const Node*, int32_t> multi_;
  int32_t next_value_ = 0;
};

std::string describe_input(const at::Tensor& t) { return TensorMeta::of(t).str(); }

void check_inputs(const detail::InterpreterPlan& plan, const std::vector<at::Tensor>& inputs) {
  if (inputs.size() != plan.inputs.size()) {
    throw InputError("expected " + std::to_string(plan.inputs.size()) + " input tensor(s), got " +
                     std::to_string(inputs.size()));
  }
  std::string problems;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputCheck& c = plan.inputs[i];
    const at::Tensor& t = inputs[i];
    std::string where = "input " + std::to_string(i) + " (" + c.name + "): ";
    if (!t.defined()) {
      problems += "\n  " + where + "expected a tensor, got an undefined tensor";
      continue;
    }
    if (!c.has_meta) continue;
    const TensorMeta& m = c.meta;
    if (t.scalar_type() != m.dtype || t.device() != m.device || t.sizes() != c10::IntArrayRef(m.sizes)) {
      problems += "\n  " + where + "expected " + m.str() + ", got " + describe_input(t);
    }
  }
  if (!problems.empty()) throw InputError("inputs do not match the graph:" + problems);
}

}  // namespace

Interpreter::Interpreter(const GraphModule& gm) : plan_(PlanBuilder(gm).build()) {}
Interpreter::~Interpreter() = default;
Interpreter::Interpreter(Interpreter&&) noexcept = default;
Interpreter& Interpreter::operator=(Interpreter&&) noexcept = default;

size_t Interpreter::num_inputs() const { return plan_->inputs.size(); }
size_t Interpreter::num_outputs() const { return plan_->num_user_outputs; }

std::vector<at::Tensor> Interpreter::run_flat(const std::vector<at::Tensor>& inputs,
                                              RunStats* stats) const {
  const detail::InterpreterPlan& plan = *plan_;
  check_inputs(plan, inputs);
  // Note [The interpreter runs below autograd]
  // A graph is an inference program: it was recorded without autograd and
  // runs without it, skipping the autograd and view-tracking dispatch layers
  // (as autograd's own kernels do) rather than paying for them under no-grad.
  // Results carry no autograd history, like results computed under
  // NoGradGuard, and are ordinary (not inference) tensors.
  at::AutoDispatchBelowADInplaceOrView below_autograd;

  FrameLease frame(plan.num_values, plan.max_args + 4);  // Note [Run frames]
  std::vector<c10::IValue>& values = frame.values();
  std::vector<c10::IValue>& stack = frame.stack();
  size_t live = 0, peak = 0;

  auto fetch = [&](const Slot& s, auto&& self) -> c10::IValue {
    switch (s.kind) {
      case Slot::Kind::Constant:
        return s.constant;
      case Slot::Kind::Value:
        return values[s.index];
      case Slot::Kind::Input:
        return inputs[s.index];
      case Slot::Kind::Attribute:
        return plan.attributes[s.index];
      case Slot::Kind::TensorList: {
        c10::List<at::Tensor> l;
        l.reserve(s.elements.size());
        for (const Slot& e : s.elements) l.push_back(self(e, self).toTensor());
        return l;
      }
      case Slot::Kind::OptionalTensorList: {
        c10::List<c10::optional<at::Tensor>> l;
        l.reserve(s.elements.size());
        for (const Slot& e : s.elements) {
          c10::IValue v = self(e, self);
          l.push_back(v.isNone() ? c10::optional<at::Tensor>() : v.toTensor());
        }
        return l;
      }
    }
    return c10::IValue();
  };

  for (const Instruction& ins : plan.instructions) {
    for (const Slot& s : ins.args) stack.push_back(fetch(s, fetch));
    try {
      ins.op.callBoxed(&stack);
    } catch (const std::exception& e) {
      const NodeInfo& info = plan.node_infos[ins.node_info];
      std::string trace = info.stack_trace.str();
      throw RuntimeError("while executing " + info.line +
                         (trace.empty() ? std::string() : "\ncaptured at:\n" + trace) +
                         "\n" + e.what());
    }
    if (ins.explode) {
      c10::List<at::Tensor> list = stack.at(0).toTensorList();
      if (static_cast<int32_t>(list.size()) != ins.num_outputs) {
        throw RuntimeError("while executing " + plan.node_infos[ins.node_info].line + "\nit returned " +
                           std::to_string(list.size()) + " tensors, the graph expects " +
                           std::to_string(ins.num_outputs));
      }
      for (int32_t i = 0; i < ins.num_outputs; ++i) values[ins.out + i] = list.get(i);
    } else {
      for (int32_t i = 0; i < ins.num_outputs; ++i) values[ins.out + i] = std::move(stack[i]);
    }
    stack.clear();
    live += ins.num_outputs;
    peak = std::max(peak, live);
    for (int32_t f : ins.frees) {
      values[f] = c10::IValue();
      --live;
    }
  }

  std::vector<at::Tensor> out;
  out.reserve(plan.num_user_outputs);
  for (size_t i = 0; i < plan.num_user_outputs; ++i) out.push_back(fetch(plan.outputs[i], fetch).toTensor());
  // Writes the program made, which the exported graph returns as values
  // (export.h): applied now, so a run has the program's effect.
  for (size_t i = 0; i < plan.write_backs.size(); ++i) {
    const auto& wb = plan.write_backs[i];
    at::Tensor value = fetch(plan.outputs[plan.num_user_outputs + i], fetch).toTensor();
    at::Tensor target = wb.to_input ? inputs[wb.input] : wb.buffer;
    target.copy_(value);
  }
  if (stats != nullptr) {
    stats->nodes_executed = plan.instructions.size();
    stats->peak_live_values = peak;
  }
  return out;
}

c10::IValue Interpreter::run(const std::vector<c10::IValue>& inputs, RunStats* stats) const {
  const detail::InterpreterPlan& plan = *plan_;
  std::vector<c10::IValue> leaves =
      plan.in_spec.flatten_like(c10::ivalue::Tuple::create(inputs), "input");
  std::vector<at::Tensor> tensors;
  tensors.reserve(leaves.size());
  for (const c10::IValue& v : leaves) tensors.push_back(v.toTensor());
  std::vector<at::Tensor> outs = run_flat(tensors, stats);
  std::vector<c10::IValue> out_values(outs.begin(), outs.end());
  return plan.out_spec.unflatten(out_values);
}

}  // namespace torchcap
