// The interpreter: a plan built once from the graph, run from flat tables.
#include <torchcap/error.h>
#include <torchcap/evaluator.h>
#include <torchcap/passes.h>
#include <torchcap/interpreter.h>
#include <torchcap/printer.h>

#include "graph/operator_facts.h"
#include "graph/operator_name.h"
#include "graph/schema_check.h"
#include "runtime/planned_memory.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/jit_type.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
  int32_t planned = -1;  // a PlannedMemory call, Note [Planned runs]
  // Note [Updates written in place]: when defined, the result is written
  // into this attribute by `into_op` (the out variant), after `into_extra`.
  at::Tensor into;
  c10::OperatorHandle into_op;
  std::vector<c10::IValue> into_extra;
  // Note [Results written over a dying argument]: when set, the result may
  // be written by `op` (the out variant) into one of the arguments `args`
  // (indices into `args`), found at run time to be held by nothing else.
  struct Overwrite {
    std::vector<int32_t> args;
    c10::OperatorHandle op;
    std::vector<c10::IValue> extra;
    TensorMeta result;
  };
  std::shared_ptr<const Overwrite> overwrite;
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
  // Note [Inputs in the traced layout]
  bool dense = false;    // the recorded strides are dense and without overlap
  bool written = false;  // the graph writes the input (in place or written back)
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
    bool in_place = false;  // already written by the run (Note [Updates written in place])
    std::string target;
  };
  std::vector<WriteBack> write_backs;
  // Note [Concurrent runs that update buffers]
  bool updates_buffers = false;
  mutable std::mutex buffer_updates;
  std::vector<NodeInfo> node_infos;
  // Note [Runs with unbound weights]: the get_attr attributes that hold no
  // values, as "parameter 'fc.weight' (f32[4, 8])".
  std::vector<std::string> unbound;
  int32_t num_values = 0;
  size_t max_args = 0;
  TreeSpec in_spec;
  TreeSpec out_spec;
  std::unique_ptr<detail::PlannedMemory> memory;  // planned interpreters only
};

namespace {

// What a node evaluates to while the plan is built: where its value will be
// at run time. A multi-output node's values are `count` consecutive slots.
struct PlanValue {
  Slot::Kind kind = Slot::Kind::Constant;  // Constant: no value (returns nothing)
  int32_t index = -1;
  bool multi = false;  // several values from `index` on, read through getitem
};

// Note [Inputs in the traced layout]
// LibTorch takes some decisions by a tensor's strides while the program
// runs: a composite calls contiguous() (recorded as a clone) only when its
// argument is not contiguous, and a kernel after it may read raw memory in
// the layout it then expects (embedding_bag's indices). A graph keeps the
// decisions taken for the traced inputs' strides, so an input of other
// strides could be read wrongly, without an error. An input whose strides
// differ from the traced ones is therefore copied into the traced layout
// before the run, when that layout is dense (as every input traced as it
// came, contiguous or permuted, is). An input the graph writes cannot be a
// copy: one of other strides is refused, naming them.

// Whether sizes and strides lay the elements out densely, without overlap.
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

// Whether `t` has the recorded strides, in the dimensions where they matter
// (of size > 1).
bool has_layout(const at::Tensor& t, const TensorMeta& m) {
  c10::IntArrayRef strides = t.strides();
  for (size_t d = 0; d < m.sizes.size() && d < strides.size(); ++d) {
    if (m.sizes[d] > 1 && strides[d] != m.strides[d]) return false;
  }
  return true;
}

// Builds the plan by evaluating the graph symbolically: values are slots.
class PlanBuilder : public GraphEvaluator<PlanValue> {
 public:
  PlanBuilder(const GraphModule& gm, const InterpreterOptions& options)
      : GraphEvaluator(gm.graph()), gm_(gm), options_(options),
        plan_(std::make_unique<detail::InterpreterPlan>()) {}

  std::unique_ptr<detail::InterpreterPlan> build() {
    gm_.lint();
    views_for_copies_ = !options_.plan_memory && is_functional(gm_.graph());
    if (options_.plan_memory) {
      plan_->memory = std::make_unique<detail::PlannedMemory>(plan_memory(gm_.graph()));
    }
    plan_->in_spec = gm_.in_spec;
    plan_->out_spec = gm_.out_spec;
    for (const PlanValue& v : run()) plan_->outputs.push_back(slot_of(v, nullptr));
    plan_->num_user_outputs = gm_.num_user_outputs();
    for (size_t i = plan_->num_user_outputs; i < gm_.output_specs.size(); ++i) {
      const OutputSpec& spec = gm_.output_specs[i];
      detail::InterpreterPlan::WriteBack wb{false, -1, {}, false, spec.target};
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
    std::vector<bool> written = detail::written_inputs(gm_);
    for (size_t k = 0; k < written.size() && k < plan_->inputs.size(); ++k) {
      plan_->inputs[k].written = written[k];
    }
    plan_->num_values = next_value_;
    if (is_functional(gm_.graph())) write_updates_in_place(*plan_);
    compute_frees(*plan_);
    plan_overwrites(*plan_);
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
    if (views_for_copies_) {
      if (const c10::OperatorHandle* view = view_for_copy(n)) ins.op = *view;
    }
    ins.args.reserve(args.size());
    for (const BoundArgument& a : args) ins.args.push_back(slot_of(a, n));
    if (!options_.plan_memory) tensor_form_of_scalar_operator(n, ins);
    if (std::optional<PlanValue> folded = fold_view(n, ins)) return *folded;
    PlanValue result;
    switch (detail::produces(n)) {
      case detail::Produces::Tensor:
      case detail::Produces::Scalar:
        ins.out = next_value_++;
        ins.num_outputs = 1;
        result = {Slot::Kind::Value, ins.out, false};
        break;
      case detail::Produces::Tuple:
        ins.out = next_value_;
        ins.num_outputs = static_cast<int32_t>(n.schema().returns().size());
        next_value_ += ins.num_outputs;
        result = {Slot::Kind::Value, ins.out, true};
        break;
      case detail::Produces::TensorList:
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
      case detail::Produces::Nothing:
        break;
    }
    if (plan_->memory) ins.planned = plan_->memory->add_call(n);
    results_.push_back(n.meta().val.kind == ValueKind::Tensor && n.meta().val.tensors.size() == 1
                           ? std::optional<TensorMeta>(n.meta().val.tensors[0])
                           : std::nullopt);
    ins.node_info = static_cast<int32_t>(plan_->node_infos.size());
    plan_->node_infos.push_back(NodeInfo{format_node(n), n.meta().stack_trace});
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

  // Note [Views for copies in functional graphs]
  // Export replaces views by `*_copy` operators (t_copy, view_copy, ...) so
  // that the graph has no aliasing. When the graph is functional nothing
  // writes a value while the run lasts (attributes and inputs are written
  // back only after it), so a view computes the same values as the copy,
  // without the copy: the unplanned interpreter runs the view instead, and a
  // view of attributes is then folded once (fold_view). A training step's
  // backward transposes its weights and gradients several times per layer;
  // eager autograd runs those as views, and the BLAS calls then take the
  // same transposed operands as eager ones. A node whose value is an output
  // keeps its copy, so no output aliases an attribute, an input or another
  // output. Planned runs keep the copies: the memory plan's lifetimes
  // assume that no value aliases another.
  const c10::OperatorHandle* view_for_copy(const Node& n) {
    static const std::pair<const char*, const char*> kViewOfCopy[] = {
        {"aten::t_copy", "aten::t"},
        {"aten::transpose_copy.int", "aten::transpose.int"},
        {"aten::permute_copy", "aten::permute"},
        {"aten::view_copy", "aten::view"},
        {"aten::expand_copy", "aten::expand"},
        {"aten::unsqueeze_copy", "aten::unsqueeze"},
        {"aten::squeeze_copy", "aten::squeeze"},
        {"aten::squeeze_copy.dim", "aten::squeeze.dim"},
        {"aten::slice_copy.Tensor", "aten::slice.Tensor"},
        {"aten::select_copy.int", "aten::select.int"},
        {"aten::alias_copy", "aten::alias"},
    };
    for (const Node* user : n.users()) {
      if (user->op() == OpCode::Output) return nullptr;
    }
    for (const auto& [copy, view] : kViewOfCopy) {
      if (n.target() != copy) continue;
      auto it = view_ops_.find(view);
      if (it == view_ops_.end()) {
        c10::optional<c10::OperatorHandle> handle =
            c10::Dispatcher::singleton().findSchema(detail::parse_operator_name(view));
        std::optional<c10::OperatorHandle> found;
        if (handle) found = *handle;
        it = view_ops_.emplace(std::string(view), std::move(found)).first;
      }
      return it->second ? &*it->second : nullptr;
    }
    return nullptr;
  }

  // Note [Scalar operators as Tensor operators]
  // LibTorch 1.13's kernels of `add.Scalar`, `sub.Scalar`, `mul.Scalar` and
  // `div.Scalar` wrap the Scalar in a 0-dim tensor marked as a wrapped
  // number and call the `.Tensor` overload. With a constant Scalar the
  // interpreter makes that tensor once, here, and calls the `.Tensor`
  // overload itself: the same kernel on the same operands, without a tensor
  // made per call, and with an out variant of its own (the `.Scalar` ones
  // are composites that compute into a new tensor and copy it). A floating
  // Scalar with a float32 or float64 result is made in the result's dtype:
  // type promotion takes a wrapped number's floating dtype for the default
  // one whichever it is, and TensorIterator converts the operand to the
  // result's dtype before computing, which it then need not do per call.
  // (Kernels of float16 and bfloat16 read the operand as it was before
  // that conversion, so for them it stays float64.)
  // Not for a planned interpreter, whose plan calls the node's own out
  // variant.
  void tensor_form_of_scalar_operator(const Node& n, Instruction& ins) {
    static const char* const kScalarOperators[] = {"add", "sub", "mul", "div"};
    const c10::FunctionSchema& schema = ins.op.schema();
    if (schema.overload_name() != "Scalar" || ins.args.size() < 2 ||
        ins.args[1].kind != Slot::Kind::Constant || !ins.args[1].constant.isScalar()) {
      return;
    }
    const std::string& name = schema.name();
    bool known = false;
    for (const char* op : kScalarOperators) known = known || name == std::string("aten::") + op;
    if (!known) return;
    auto it = tensor_ops_.find(name);
    if (it == tensor_ops_.end()) {
      c10::optional<c10::OperatorHandle> handle = c10::Dispatcher::singleton().findSchema({name, "Tensor"});
      std::optional<c10::OperatorHandle> found;
      if (handle) found = *handle;
      it = tensor_ops_.emplace(name, std::move(found)).first;
    }
    if (!it->second) return;
    const c10::Scalar scalar = ins.args[1].constant.toScalar();
    const ValueMeta& result = n.meta().val;
    // Made without the dispatcher: an interpreter built while a trace
    // records would otherwise record it.
    at::Tensor wrapped =
        scalar.isFloatingPoint() && result.kind == ValueKind::Tensor && result.tensors.size() == 1 &&
                (result.tensors[0].dtype == at::kFloat || result.tensors[0].dtype == at::kDouble)
            ? at::detail::scalar_tensor_static(scalar, result.tensors[0].dtype, at::kCPU)
            : c10::scalar_to_tensor(scalar);
    wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
    ins.op = *it->second;
    ins.args[1].constant = std::move(wrapped);
  }

  // A view of attributes only (`t(weight)`) is computed once, here: it
  // aliases the attribute's memory, so it stays right even when the graph
  // updates the attribute in place.
  std::optional<PlanValue> fold_view(const Node& n, const Instruction& ins) {
    const c10::FunctionSchema& schema = ins.op.schema();
    if (schema.returns().size() != 1 || detail::produces(n) != detail::Produces::Tensor) return std::nullopt;
    const detail::OperatorFacts& facts = detail::operator_facts(ins.op);
    if (facts.viewed_argument[0] < 0 || facts.writes_declared) return std::nullopt;
    bool reads_attribute = false;
    for (const Slot& s : ins.args) {
      if (s.kind == Slot::Kind::Attribute) {
        reads_attribute = true;
      } else if (s.kind != Slot::Kind::Constant) {
        return std::nullopt;
      }
    }
    if (!reads_attribute) return std::nullopt;
    std::vector<c10::IValue> stack;
    for (const Slot& s : ins.args) {
      stack.push_back(s.kind == Slot::Kind::Attribute ? c10::IValue(plan_->attributes[s.index])
                                                      : s.constant);
    }
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ins.op.callBoxed(&stack);
    plan_->attributes.push_back(stack.at(0).toTensor());
    return PlanValue{Slot::Kind::Attribute, static_cast<int32_t>(plan_->attributes.size() - 1), false};
  }

  // Note [Updates written in place]
  // A training step's graph ends each parameter's and each optimizer
  // state's update with one elementwise operator (`add(p, step, alpha=-lr)`)
  // whose result the run then copies into the attribute: torch::optim writes
  // in place, the graph allocates and copies. When nothing after that
  // operator reads the attribute's old value, the operator runs as its out
  // variant with the attribute as `out`, and the write-back copy goes. The
  // operator must be elementwise (its out variant may then alias an input
  // that is the attribute itself: each element is read before it is
  // written), its recorded result must have the attribute's sizes and dtype,
  // and no other argument, later instruction or output may read the
  // attribute's storage (a view of it folded at plan time included). The
  // out variant runs the functional operator's kernel, so the values are the
  // same bits. Unlike the copy after the run, the write happens during it:
  // a run that fails later leaves the attributes it already wrote updated,
  // as a failing torch::optim step does.
  static bool elementwise(const c10::OperatorHandle& op) {
    static const char* const kElementwise[] = {
        "aten::add.Tensor", "aten::add.Scalar", "aten::sub.Tensor", "aten::sub.Scalar",
        "aten::mul.Tensor", "aten::mul.Scalar", "aten::div.Tensor", "aten::div.Scalar",
        "aten::addcmul",    "aten::addcdiv",    "aten::where.self", "aten::maximum",
        "aten::max.other",  "aten::clamp_min",  "aten::lerp.Scalar", "aten::neg",
        "aten::sqrt",       "aten::rsub.Tensor", "aten::relu",       "aten::threshold_backward",
        "aten::sigmoid",    "aten::tanh",       "aten::sigmoid_backward", "aten::tanh_backward",
    };
    const c10::FunctionSchema& schema = op.schema();
    std::string name = schema.overload_name().empty() ? schema.name()
                                                      : schema.name() + "." + schema.overload_name();
    for (const char* e : kElementwise) {
      if (name == e) return true;
    }
    return false;
  }

  // Whether an out variant computes into its out argument: one with a CPU
  // kernel of its own, not a composite that computes into a new tensor and
  // copies (Note [Out variants that write in place], memory_plan.cpp).
  static bool writes_in_place(const detail::OutForm& form) {
    return form.op.hasKernelForDispatchKey(c10::DispatchKey::CPU);
  }

  void write_updates_in_place(detail::InterpreterPlan& plan) const {
    // The attribute storages each value may share: views (the interpreter
    // runs `*_copy` as views) pass on their arguments'.
    std::vector<int32_t> producer(plan.num_values, -1);
    std::vector<std::vector<const c10::StorageImpl*>> shares(plan.num_values);
    auto storages_of = [&](const Slot& s, std::vector<const c10::StorageImpl*>& out, auto&& self) -> void {
      if (s.kind == Slot::Kind::Attribute) {
        const at::Tensor& t = plan.attributes[s.index];
        if (t.defined() && t.has_storage()) out.push_back(t.storage().unsafeGetStorageImpl());
      } else if (s.kind == Slot::Kind::Value) {
        out.insert(out.end(), shares[s.index].begin(), shares[s.index].end());
      }
      for (const Slot& e : s.elements) self(e, out, self);
    };
    for (size_t k = 0; k < plan.instructions.size(); ++k) {
      const Instruction& ins = plan.instructions[k];
      bool view = detail::operator_facts(ins.op).returns_alias;
      for (int32_t o = ins.out; o >= 0 && o < ins.out + ins.num_outputs; ++o) {
        producer[o] = static_cast<int32_t>(k);
        if (view) {
          for (const Slot& a : ins.args) storages_of(a, shares[o], storages_of);
        }
      }
    }
    auto reads = [&](const Slot& s, const c10::StorageImpl* storage) {
      std::vector<const c10::StorageImpl*> found;
      storages_of(s, found, storages_of);
      return std::find(found.begin(), found.end(), storage) != found.end();
    };
    // Who reads each attribute storage, found in one walk (a step graph
    // has an update per parameter and optimizer state: asking every later
    // instruction for each of them took seconds on large graphs): the last
    // instruction, and the outputs, by index.
    std::unordered_map<const c10::StorageImpl*, size_t> last_read;
    std::unordered_map<const c10::StorageImpl*, std::vector<size_t>> output_reads;
    std::vector<const c10::StorageImpl*> found;
    for (size_t j = 0; j < plan.instructions.size(); ++j) {
      found.clear();
      for (const Slot& a : plan.instructions[j].args) storages_of(a, found, storages_of);
      for (const c10::StorageImpl* st : found) last_read[st] = j;
    }
    for (size_t o = 0; o < plan.outputs.size(); ++o) {
      found.clear();
      storages_of(plan.outputs[o], found, storages_of);
      for (const c10::StorageImpl* st : found) output_reads[st].push_back(o);
    }
    std::unordered_map<int32_t, size_t> outputs_of_value;
    for (const Slot& o : plan.outputs) {
      if (o.kind == Slot::Kind::Value) ++outputs_of_value[o.index];
    }
    // How often each value is read, by instructions and outputs.
    std::vector<size_t> reads_of(plan.num_values, 0);
    auto count_reads = [&](const Slot& s, auto&& self) -> void {
      if (s.kind == Slot::Kind::Value) ++reads_of[s.index];
      for (const Slot& e : s.elements) self(e, self);
    };
    for (const Instruction& i : plan.instructions) {
      for (const Slot& a : i.args) count_reads(a, count_reads);
    }
    for (const Slot& o : plan.outputs) count_reads(o, count_reads);

    for (size_t w = 0; w < plan.write_backs.size(); ++w) {
      detail::InterpreterPlan::WriteBack& wb = plan.write_backs[w];
      if (wb.to_input || !wb.buffer.defined() || !wb.buffer.has_storage() ||
          !wb.buffer.is_non_overlapping_and_dense()) {
        continue;
      }
      const Slot& result = plan.outputs[plan.num_user_outputs + w];
      if (result.kind != Slot::Kind::Value || producer[result.index] < 0) continue;
      const size_t k = static_cast<size_t>(producer[result.index]);
      Instruction& ins = plan.instructions[k];
      if (ins.num_outputs != 1 || ins.explode || ins.planned >= 0 || ins.into.defined() ||
          !elementwise(ins.op)) {
        continue;
      }
      auto fits = [&](const std::optional<TensorMeta>& meta) {
        return meta && meta->dtype == wb.buffer.scalar_type() && meta->device == wb.buffer.device() &&
               c10::IntArrayRef(meta->sizes) == wb.buffer.sizes();
      };
      if (!fits(results_[k])) continue;
      const at::Tensor& target = wb.buffer;
      const c10::StorageImpl* storage = target.storage().unsafeGetStorageImpl();
      bool safe = true;
      for (const Slot& a : ins.args) {
        // The attribute itself, element for element, is fine; a view of it is not.
        bool itself = a.kind == Slot::Kind::Attribute && plan.attributes[a.index].is_same(target);
        if (!itself && reads(a, storage)) safe = false;
      }
      if (auto it = last_read.find(storage); it != last_read.end() && it->second > k) safe = false;
      if (auto it = output_reads.find(storage); it != output_reads.end()) {
        for (size_t o : it->second) safe = safe && o == plan.num_user_outputs + w;
      }
      // No other output returns the result itself.
      safe = safe && outputs_of_value[result.index] == 1;
      for (size_t v = 0; safe && v < plan.write_backs.size(); ++v) {
        const auto& other = plan.write_backs[v];
        safe = v == w || other.to_input || !other.buffer.defined() || !other.buffer.is_alias_of(target);
      }
      if (!safe) continue;
      std::optional<detail::OutForm> form = detail::out_form(ins.op);
      if (!form) continue;
      ins.into = target;
      ins.into_op = form->op;
      ins.into_extra = form->extra;
      wb.in_place = true;

      // The step before it, when it is an elementwise operator of the
      // attribute itself whose result only the update reads (`mul(buf,
      // momentum)` before `add(that, grad)`), and nothing after it reads
      // the attribute's old value, writes into the attribute as well: the
      // update then runs in place from its first operator, as torch::optim's
      // mul_ and add_ do, and the value between them needs no tensor.
      for (const Slot& a : ins.args) {
        if (a.kind != Slot::Kind::Value || producer[a.index] < 0 || reads_of[a.index] != 1 ||
            outputs_of_value.count(a.index) != 0) {
          continue;
        }
        const size_t q = static_cast<size_t>(producer[a.index]);
        Instruction& first = plan.instructions[q];
        if (first.num_outputs != 1 || first.explode || first.planned >= 0 || first.into.defined() ||
            !elementwise(first.op) || !fits(results_[q])) {
          continue;
        }
        bool reads_itself = false, reads_a_view = false;
        for (const Slot& b : first.args) {
          bool itself = b.kind == Slot::Kind::Attribute && plan.attributes[b.index].is_same(target);
          reads_itself = reads_itself || itself;
          reads_a_view = reads_a_view || (!itself && reads(b, storage));
        }
        if (!reads_itself || reads_a_view) continue;
        if (auto it = last_read.find(storage); it != last_read.end() && it->second > q) continue;
        std::optional<detail::OutForm> first_form = detail::out_form(first.op);
        if (!first_form || !writes_in_place(*first_form)) continue;
        first.into = target;
        first.into_op = first_form->op;
        first.into_extra = first_form->extra;
        break;
      }
    }
  }

  // Note [Results written over a dying argument]
  // Most intermediate results are the size of an argument that dies where
  // they are made: relu of a batch norm's output, relu's backward of the
  // incoming gradient, each step of an optimizer's update. Written through
  // the out variant into that argument's buffer, such a result needs no
  // allocation: for a large tensor that is memory the system maps afresh
  // (page faults) at every run once the heap has shrunk, for a small one a
  // malloc and a free. Only elementwise operators (each element is read
  // before it is written, as in their in-place forms), only arguments whose
  // last use this is, and only when at run time the argument's tensor and
  // storage are held by nothing else (not a view of an input, an attribute
  // or a value still live) and it has the result's recorded sizes, strides
  // and dtype, so that the result is laid out as the operator lays it out.
  // The out variant runs the functional operator's kernel: the same bits.
  void plan_overwrites(detail::InterpreterPlan& plan) const {
    for (size_t k = 0; k < plan.instructions.size(); ++k) {
      Instruction& ins = plan.instructions[k];
      if (ins.num_outputs != 1 || ins.explode || ins.planned >= 0 || ins.into.defined() ||
          !results_[k] || !elementwise(ins.op)) {
        continue;
      }
      std::vector<int32_t> candidates;
      for (size_t a = 0; a < ins.args.size(); ++a) {
        const Slot& s = ins.args[a];
        if (s.kind != Slot::Kind::Value ||
            std::find(ins.frees.begin(), ins.frees.end(), s.index) == ins.frees.end()) {
          continue;
        }
        size_t uses = 0;
        for (const Slot& other : ins.args) {
          uses += other.kind == Slot::Kind::Value && other.index == s.index ? 1 : 0;
        }
        if (uses == 1) candidates.push_back(static_cast<int32_t>(a));
      }
      if (candidates.empty()) continue;
      std::optional<detail::OutForm> form = detail::out_form(ins.op);
      if (!form || !writes_in_place(*form)) continue;
      ins.overwrite = std::make_shared<const Instruction::Overwrite>(
          Instruction::Overwrite{std::move(candidates), form->op, form->extra, *results_[k]});
    }
  }

  // Note [Freeing values after their last use]
  // One reverse walk: the first time a value is seen (from the end), that
  // instruction is its last use, so the value is released right after it.
  // Values never read are released right after they are produced. Values the
  // output returns are never released.
  static void compute_frees(detail::InterpreterPlan& plan) {
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
  InterpreterOptions options_;
  std::unique_ptr<detail::InterpreterPlan> plan_;
  int32_t next_value_ = 0;
  bool views_for_copies_ = false;  // Note [Views for copies in functional graphs]
  std::map<std::string, std::optional<c10::OperatorHandle>> view_ops_;
  std::map<std::string, std::optional<c10::OperatorHandle>> tensor_ops_;  // "aten::add" -> add.Tensor
  std::vector<std::optional<TensorMeta>> results_;  // per instruction: its one tensor result
};

// Note [Results written over a dying argument]: whether the run may write
// the result, laid out as `result`, into the argument `v`.
bool can_overwrite(const c10::IValue& v, const TensorMeta& result) {
  if (!v.isTensor()) return false;
  const at::Tensor& t = v.toTensor();
  return t.defined() && t.use_count() == 1 && t.has_storage() && t.storage().use_count() == 1 &&
         t.scalar_type() == result.dtype && t.device() == result.device &&
         t.sizes() == c10::IntArrayRef(result.sizes) && t.strides() == c10::IntArrayRef(result.strides) &&
         t.is_non_overlapping_and_dense() && !t.is_conj() && !t.is_neg();
}

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
    // A placeholder recorded on the meta device (a model traced on meta
    // tensors, then bound to weights) takes an input on any device, and a
    // meta input (a run that only computes shapes) goes anywhere.
    const bool device_ok = t.device() == m.device || m.device.is_meta() || t.is_meta();
    if (t.scalar_type() != m.dtype || !device_ok || t.sizes() != c10::IntArrayRef(m.sizes)) {
      problems += "\n  " + where + "expected " + m.str() + ", got " + describe_input(t);
    }
  }
  if (!problems.empty()) throw InputError("inputs do not match the graph:" + problems);
}

bool all_meta(const std::vector<at::Tensor>& inputs) {
  if (inputs.empty()) return false;
  for (const at::Tensor& t : inputs) {
    if (!t.defined() || !t.is_meta()) return false;
  }
  return true;
}

// Note [Runs with unbound weights]: the weights of a weightless module (a
// model traced on the meta device, or a file saved from one) are meta
// tensors. Run on real inputs, their operators would fail deep inside a
// kernel or, worse, return meta tensors that look like results; the run is
// refused first, naming them. A run on meta inputs only computes shapes,
// which a meta weight serves, and is allowed.
void check_bound(const detail::InterpreterPlan& plan, const std::vector<at::Tensor>& inputs) {
  if (plan.unbound.empty() || all_meta(inputs)) return;
  constexpr size_t kShown = 5;
  std::string names;
  for (size_t i = 0; i < plan.unbound.size() && i < kShown; ++i) {
    names += (i ? ", " : "") + plan.unbound[i];
  }
  if (plan.unbound.size() > kShown) {
    names += " and " + std::to_string(plan.unbound.size() - kShown) + " more";
  }
  throw WeightError("the module's weights are not bound: " + std::to_string(plan.unbound.size()) +
                    " attribute(s) hold no values (the module was traced on the meta device or "
                    "loaded from a weightless file): " + names +
                    ". Bind them first: torchcap::load(path, {.weights = ...}) or "
                    "GraphModule::bind_weights");
}

// Never a meta tensor as the result of a run on real inputs: an operator
// whose device was recorded as meta (a factory called with a meta tensor's
// options while tracing) would otherwise pass one off as a result.
void check_no_meta_outputs(const std::vector<at::Tensor>& inputs,
                           const std::vector<at::Tensor>& outputs) {
  for (const at::Tensor& t : inputs) {
    if (t.defined() && t.is_meta()) return;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined() && outputs[i].is_meta()) {
      throw RuntimeError("output " + std::to_string(i) + " of the run is a meta tensor, which "
                         "has no values, though no input is: the graph makes it on the meta "
                         "device (an operator recorded with device='meta' while the model was "
                         "traced on meta tensors). Trace the model on inputs that are "
                         "not meta tensors");
    }
  }
}

}  // namespace

Interpreter::Interpreter(const GraphModule& gm, const InterpreterOptions& options)
    : plan_(PlanBuilder(gm, options).build()) {}
Interpreter::~Interpreter() = default;
Interpreter::Interpreter(Interpreter&&) noexcept = default;
Interpreter& Interpreter::operator=(Interpreter&&) noexcept = default;

size_t Interpreter::num_inputs() const { return plan_->inputs.size(); }
size_t Interpreter::num_outputs() const { return plan_->num_user_outputs; }

std::vector<std::string> Interpreter::updated_in_place() const {
  std::vector<std::string> names;
  for (const auto& wb : plan_->write_backs) {
    if (wb.in_place) names.push_back(wb.target);
  }
  return names;
}

const MemoryPlan* Interpreter::memory_plan() const {
  return plan_->memory ? &plan_->memory->plan() : nullptr;
}

std::vector<OperatorPlan> Interpreter::planned_operators() const {
  return plan_->memory ? plan_->memory->operators() : std::vector<OperatorPlan>{};
}

namespace {

// Note [Writing back like the program would]
// An exported graph returns the new values of the buffers and inputs the
// program wrote; a run writes them back. The write is the program's in-place
// write, so it goes through the full dispatcher, autograd included: it bumps
// the tensor's version counter (a tensor saved for backward then refuses to
// be used, as in eager), and grad mode refuses it on a leaf that requires
// grad, as eager does. That refusal is checked before anything runs, so a
// refused run changes nothing.
// The inputs in the traced layout (Note [Inputs in the traced layout]): the
// given ones when all have it; else copies of those that do not. Empty when
// all have it.
std::vector<at::Tensor> in_traced_layout(const detail::InterpreterPlan& plan,
                                         const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> laid_out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputCheck& c = plan.inputs[i];
    const at::Tensor& t = inputs[i];
    if (!c.has_meta || !c.dense || t.is_meta() || has_layout(t, c.meta)) continue;
    if (c.written) {
      throw InputError("input " + std::to_string(i) + " (" + c.name + ") is written by the graph and "
                       "must have the strides it was traced with, " + c10::str(c10::IntArrayRef(c.meta.strides)) +
                       "; got " + c10::str(t.strides()) + ". Pass it in that layout (contiguous())");
    }
    if (laid_out.empty()) laid_out = inputs;
    laid_out[i] = at::empty_strided(c.meta.sizes, c.meta.strides, t.options()).copy_(t);
  }
  return laid_out;
}

void check_write_targets(const detail::InterpreterPlan& plan, const std::vector<at::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return;
  for (const auto& wb : plan.write_backs) {
    const at::Tensor& target = wb.to_input ? inputs[wb.input] : wb.buffer;
    if (!target.requires_grad() || !target.is_leaf()) continue;
    std::string what = wb.to_input ? "input " + std::to_string(wb.input) + " (" +
                                         plan.inputs[wb.input].name + ")"
                                   : "a parameter";
    throw InputError("this graph writes to " + what +
                     ", a leaf tensor that requires grad, and grad mode is on: the program's own "
                     "in-place write would be refused too (\"a leaf Variable that requires grad "
                     "is being used in an in-place operation\"). Run it under torch::NoGradGuard, "
                     "or pass a tensor that does not require grad");
  }
}

}  // namespace

// Runs the instructions below autograd; returns the user outputs, then the
// values to write back.
std::vector<at::Tensor> Interpreter::execute(const std::vector<at::Tensor>& inputs,
                                             RunStats& stats) const {
  const detail::InterpreterPlan& plan = *plan_;
  // Note [The interpreter runs below autograd]
  // A graph is an inference program: it was recorded without autograd and
  // runs without it, skipping the autograd and view-tracking dispatch layers
  // (as autograd's own kernels do) rather than paying for them under no-grad.
  // Results carry no autograd history, like results computed under
  // NoGradGuard, and are ordinary (not inference) tensors.
  at::AutoDispatchBelowADInplaceOrView below_autograd;

  // Note [Planned runs]: declared before the frame, so the frame's values
  // (which may hold the arena's slices) are dropped before the arena is.
  std::optional<detail::PlannedMemory::Lease> arena;
  if (plan.memory) arena.emplace(*plan.memory);
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

  size_t overwritten = 0;
  for (const Instruction& ins : plan.instructions) {
    for (const Slot& s : ins.args) stack.push_back(fetch(s, fetch));
    // Note [Results written over a dying argument]: the arguments are on the
    // stack and die here, so the value table lets go of them first.
    int32_t overwrite = -1;
    if (ins.overwrite) {
      for (int32_t a : ins.overwrite->args) values[ins.args[a].index] = c10::IValue();
      for (int32_t a : ins.overwrite->args) {
        if (can_overwrite(stack[a], ins.overwrite->result)) {
          overwrite = a;
          break;
        }
      }
    }
    try {
      if (overwrite >= 0) {
        for (const c10::IValue& e : ins.overwrite->extra) stack.push_back(e);
        c10::IValue out = stack[overwrite];
        stack.push_back(std::move(out));
        ins.overwrite->op.callBoxed(&stack);
        ++overwritten;
      } else if (ins.into.defined()) {
        for (const c10::IValue& e : ins.into_extra) stack.push_back(e);
        stack.emplace_back(ins.into);
        ins.into_op.callBoxed(&stack);
      } else if (ins.planned >= 0 && plan.memory->uses_out_variant(ins.planned)) {
        std::string failure;
        if (!plan.memory->call(ins.planned, arena->arena(), stack, failure)) {
          stack.clear();
          for (const Slot& s : ins.args) stack.push_back(fetch(s, fetch));
          ins.op.callBoxed(&stack);
          // The operator works where its out variant did not: give that up
          // (Note [Planned runs]). Had it thrown, nothing would change.
          plan.memory->fall_back(ins.planned, arena->arena(), failure);
        }
      } else {
        ins.op.callBoxed(&stack);
      }
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
  out.reserve(plan.outputs.size());
  for (const Slot& s : plan.outputs) out.push_back(fetch(s, fetch).toTensor());
  stats.nodes_executed = plan.instructions.size();
  stats.peak_live_values = peak;
  stats.results_over_arguments = overwritten;
  return out;
}

std::vector<at::Tensor> Interpreter::run_checked(const std::vector<at::Tensor>& inputs,
                                                 RunStats& stats) const {
  const detail::InterpreterPlan& plan = *plan_;
  check_inputs(plan, inputs);
  check_bound(plan, inputs);
  // Note [Concurrent runs that update buffers]
  // Runs that write buffers back read them first: two at once would both
  // read the old value and one update would be lost. They are serialized,
  // so each run sees the updates of the runs before it, as successive calls
  // of the program would. Other runs go in parallel.
  std::unique_lock<std::mutex> buffers(plan.buffer_updates, std::defer_lock);
  if (plan.updates_buffers) buffers.lock();
  check_write_targets(plan, inputs);
  std::vector<at::Tensor> laid_out = in_traced_layout(plan, inputs);
  std::vector<at::Tensor> out = execute(laid_out.empty() ? inputs : laid_out, stats);
  check_no_meta_outputs(inputs, out);
  // Writes the program made, which the exported graph returns as values
  // (export.h): applied now, so a run has the program's effect (Note
  // [Writing back like the program would]).
  for (size_t i = 0; i < plan.write_backs.size(); ++i) {
    const auto& wb = plan.write_backs[i];
    at::Tensor target = wb.to_input ? inputs[wb.input] : wb.buffer;
    if (wb.in_place) {
      // Written during the run, below autograd (Note [Updates written in
      // place]): the version bump copy_ would have made.
      target.unsafeGetTensorImpl()->bump_version();
    } else {
      target.copy_(out[plan.num_user_outputs + i]);
    }
  }
  out.resize(plan.num_user_outputs);
  return out;
}

std::vector<at::Tensor> Interpreter::run_flat(const std::vector<at::Tensor>& inputs) const {
  RunStats stats;
  return run_checked(inputs, stats);
}

std::vector<at::Tensor> Interpreter::flatten_inputs(const std::vector<c10::IValue>& inputs) const {
  std::vector<c10::IValue> leaves =
      plan_->in_spec.flatten_like(c10::ivalue::Tuple::create(inputs), "input");
  std::vector<at::Tensor> tensors;
  tensors.reserve(leaves.size());
  for (const c10::IValue& v : leaves) tensors.push_back(v.toTensor());
  return tensors;
}

c10::IValue Interpreter::run(const std::vector<c10::IValue>& inputs) const {
  return run_with_stats(inputs).outputs;
}

Interpreter::Result Interpreter::run_with_stats(const std::vector<c10::IValue>& inputs) const {
  Result result;
  std::vector<at::Tensor> outs = run_checked(flatten_inputs(inputs), result.stats);
  result.outputs = plan_->out_spec.unflatten(std::vector<c10::IValue>(outs.begin(), outs.end()));
  return result;
}

}  // namespace torchcap
