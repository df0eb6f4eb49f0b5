// The interpreter: a plan built once from the graph (plan.h), made faster by
// the plan passes (plan_passes.h), run from flat tables.
#include <torchcap/error.h>
#include <torchcap/interpreter.h>
#include <torchcap/passes.h>

#include "runtime/plan.h"
#include "runtime/plan_passes.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>

#include <algorithm>
#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <optional>

namespace torchcap {
namespace {

using detail::InputCheck;
using detail::Instruction;
using detail::NodeInfo;
using detail::Slot;

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


// Whether `t` has the recorded strides, in the dimensions where they matter
// (of size > 1).
bool has_layout(const at::Tensor& t, const TensorMeta& m) {
  c10::IntArrayRef strides = t.strides();
  for (size_t d = 0; d < m.sizes.size() && d < strides.size(); ++d) {
    if (m.sizes[d] > 1 && strides[d] != m.strides[d]) return false;
  }
  return true;
}

// Note [Results written over a dying argument] (plan_passes/overwrites.cpp):
// whether the run may write the result, laid out as `result`, into the
// argument `v`.
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


// Runs the instructions below autograd; returns the user outputs, then the
// values to write back.
std::vector<at::Tensor> execute(const detail::InterpreterPlan& plan, const std::vector<at::Tensor>& inputs,
                                RunStats& stats, detail::InstructionTimes* times) {
  // Note [The interpreter runs below autograd]
  // A graph is an inference program: it was recorded without autograd and
  // runs without it, skipping the autograd and view-tracking dispatch layers
  // (as autograd's own kernels do) rather than paying for them under no-grad.
  // Results carry no autograd history, like results computed under
  // NoGradGuard, and are ordinary (not inference) tensors. Unless the plan
  // records autograd (InterpreterOptions::autograd): then its operators run
  // as the program's did, and the passes that would escape autograd did not
  // run on it.
  std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
  if (!plan.autograd) below_autograd.emplace();

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
  using Clock = std::chrono::steady_clock;
  Clock::time_point run_start, start;
  if (times != nullptr) {
    times->plan = &plan;
    times->seconds.resize(plan.instructions.size());
    times->last_start.resize(plan.instructions.size());
    run_start = Clock::now();
  }
  for (const Instruction& ins : plan.instructions) {
    if (times != nullptr) start = Clock::now();
    for (const Slot& s : ins.args) stack.push_back(fetch(s, fetch));
    // Note [Results written over a dying argument] (plan_passes/overwrites.cpp):
    // the arguments are on the stack and die here, so the value table lets go
    // of them first.
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
      // LibTorch's errors carry the C++ backtrace of where they were raised,
      // which says nothing to a user of the graph.
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      throw RuntimeError("while executing " + info.line +
                         (trace.empty() ? std::string() : "\ncaptured at:\n" + trace) + "\n" +
                         (c10_error != nullptr ? c10_error->what_without_backtrace() : e.what()));
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
    if (times != nullptr) {  // Interpreter::profile: the instruction, its frees included
      const size_t k = static_cast<size_t>(&ins - plan.instructions.data());
      const Clock::time_point end = Clock::now();
      times->seconds[k] += std::chrono::duration<double>(end - start).count();
      times->last_start[k] = std::chrono::duration<double>(start - run_start).count();
      times->last_run = std::chrono::duration<double>(end - run_start).count();
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

// The interpreter's plan: built, then improved by the plan passes in their
// order (kPlanPasses, plan_passes.h).
std::unique_ptr<detail::InterpreterPlan> static_plan_for(const GraphModule& gm,
                                                         const InterpreterOptions& options) {
  std::unique_ptr<detail::InterpreterPlan> plan = detail::build_plan(gm, options);
  for (const detail::PlanPass& pass : detail::kPlanPasses) pass.run(*plan, gm.graph());
  return plan;
}

}  // namespace

// Note [Dynamic graphs run specialized]
// A dynamic graph (symbolic.h) runs as the static graph of its call's sizes:
// a run reads the symbols' values from its inputs (symbol_values, which
// checks every input against the expressions and ranges), and runs the plan
// of specialize(gm, values), made on the first run at those sizes and kept.
// So everything a static plan does (its passes, the memory plan, sized for
// those sizes) holds at every size, and a run at sizes met before costs the
// look-up only. Plans are kept for the kMaxPlans sizes run last.
struct detail::DynamicPlans {
  static constexpr size_t kMaxPlans = 8;

  GraphModule gm;
  InterpreterOptions options;
  std::mutex mutex;
  // Most recently run first.
  std::list<std::pair<std::vector<int64_t>, std::shared_ptr<const InterpreterPlan>>> plans;
  // The plan at the traced sizes, made when the interpreter is: it says
  // what the graph's plans say whatever the sizes (write-backs, updates).
  std::shared_ptr<const InterpreterPlan> first;

  std::shared_ptr<const InterpreterPlan> plan_at(const std::vector<int64_t>& values) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (auto it = plans.begin(); it != plans.end(); ++it) {
        if (it->first == values) {
          plans.splice(plans.begin(), plans, it);
          return plans.front().second;
        }
      }
    }
    std::shared_ptr<const InterpreterPlan> plan = static_plan_for(specialize(gm, values), options);
    std::lock_guard<std::mutex> lock(mutex);
    plans.emplace_front(values, plan);
    if (plans.size() > kMaxPlans) plans.pop_back();
    return plan;
  }
};

namespace {

std::unique_ptr<detail::InterpreterPlan> plan_for(const GraphModule& gm, const InterpreterOptions& options) {
  if (!gm.is_dynamic()) return static_plan_for(gm, options);
  gm.lint();
  auto plan = std::make_unique<detail::InterpreterPlan>();
  plan->in_spec = gm.in_spec;
  plan->call = gm.call;
  plan->out_spec = gm.out_spec;
  plan->num_user_outputs = gm.num_user_outputs();
  for (const Node* n : gm.graph().placeholders()) {
    detail::InputCheck check;
    check.name = n->name();
    plan->inputs.push_back(std::move(check));
  }
  plan->dynamic = std::make_shared<detail::DynamicPlans>();
  detail::DynamicPlans& dynamic = *plan->dynamic;
  dynamic.gm = gm.clone();
  dynamic.options = options;
  dynamic.first = dynamic.plan_at(traced_symbol_values(gm));
  return plan;
}

}  // namespace

std::vector<at::Tensor> detail::run_plan(const InterpreterPlan& plan, const std::vector<at::Tensor>& inputs,
                                         RunStats& stats, InstructionTimes* times) {
  if (plan.dynamic) {
    return run_plan(*plan.dynamic->plan_at(symbol_values(plan.dynamic->gm, inputs)), inputs, stats, times);
  }
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
  std::vector<at::Tensor> out = execute(plan, laid_out.empty() ? inputs : laid_out, stats, times);
  check_no_meta_outputs(inputs, out);
  // Writes the program made, which the exported graph returns as values
  // (export.h): applied now, so a run has the program's effect (Note
  // [Writing back like the program would]).
  for (size_t i = 0; i < plan.write_backs.size(); ++i) {
    const auto& wb = plan.write_backs[i];
    at::Tensor target = wb.to_input ? inputs[wb.input] : wb.buffer;
    if (wb.in_place) {
      // Written during the run, below autograd (Note [Updates written in
      // place] in plan_passes/updates_in_place.cpp): the version bump copy_
      // would have made.
      target.unsafeGetTensorImpl()->bump_version();
    } else {
      target.copy_(out[plan.num_user_outputs + i]);
    }
  }
  out.resize(plan.num_user_outputs);
  return out;
}

Interpreter::Interpreter(const GraphModule& gm, const InterpreterOptions& options)
    : plan_(plan_for(gm, options)) {}
Interpreter::~Interpreter() = default;
Interpreter::Interpreter(Interpreter&&) noexcept = default;
Interpreter& Interpreter::operator=(Interpreter&&) noexcept = default;

size_t Interpreter::num_inputs() const { return plan_->inputs.size(); }
size_t Interpreter::num_outputs() const { return plan_->num_user_outputs; }

std::vector<std::string> Interpreter::updated_in_place() const {
  std::vector<std::string> names;
  const detail::InterpreterPlan& plan = plan_->dynamic ? *plan_->dynamic->first : *plan_;
  for (const auto& wb : plan.write_backs) {
    if (wb.in_place) names.push_back(wb.target);
  }
  return names;
}

const MemoryPlan* Interpreter::memory_plan() const {
  const detail::InterpreterPlan& plan = plan_->dynamic ? *plan_->dynamic->first : *plan_;
  return plan.memory ? &plan.memory->plan() : nullptr;
}

std::vector<OperatorPlan> Interpreter::planned_operators() const {
  const detail::InterpreterPlan& plan = plan_->dynamic ? *plan_->dynamic->first : *plan_;
  return plan.memory ? plan.memory->operators() : std::vector<OperatorPlan>{};
}

std::vector<at::Tensor> Interpreter::run_flat(const std::vector<at::Tensor>& inputs) const {
  RunStats stats;
  return detail::run_plan(*plan_, inputs, stats);
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

c10::IValue Interpreter::run(std::vector<c10::IValue> args, NamedValues kwargs) const {
  return run(plan_->call.bind(plan_->in_spec, std::move(args), std::move(kwargs)));
}

Interpreter::Result Interpreter::run_with_stats(const std::vector<c10::IValue>& inputs) const {
  Result result;
  std::vector<at::Tensor> outs = detail::run_plan(*plan_, flatten_inputs(inputs), result.stats);
  result.outputs = plan_->out_spec.unflatten(std::vector<c10::IValue>(outs.begin(), outs.end()));
  return result;
}

}  // namespace torchcap
