// write_updates_in_place (plan_passes.h).
#include "runtime/plan_passes.h"

#include <torchcap/passes.h>

#include "graph/operator_facts.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <vector>

namespace torchcap {
namespace detail {

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
// as a failing torch::optim step does. Only in a functional graph, where
// nothing else writes the attribute while the run lasts.
bool write_updates_in_place(InterpreterPlan& plan, const Graph& graph) {
  if (plan.autograd || !is_functional(graph)) return false;  // autograd: out variants
  bool changed = false;
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
    bool view = operator_facts(ins.op).returns_alias;
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
    InterpreterPlan::WriteBack& wb = plan.write_backs[w];
    if (wb.to_input || !wb.buffer.defined() || !wb.buffer.has_storage() ||
        !wb.buffer.is_non_overlapping_and_dense()) {
      continue;
    }
    const Slot& result = plan.outputs[plan.num_user_outputs + w];
    if (result.kind != Slot::Kind::Value || producer[result.index] < 0) continue;
    const size_t k = static_cast<size_t>(producer[result.index]);
    Instruction& ins = plan.instructions[k];
    if (ins.num_outputs != 1 || ins.explode || ins.planned >= 0 || ins.into.defined() ||
        !is_elementwise(ins.op)) {
      continue;
    }
    auto fits = [&](const std::optional<TensorMeta>& meta) {
      return meta && meta->dtype == wb.buffer.scalar_type() && meta->device == wb.buffer.device() &&
             c10::IntArrayRef(meta->sizes) == wb.buffer.sizes();
    };
    if (!fits(plan.node_infos[ins.node_info].result)) continue;
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
    std::optional<OutForm> form = out_form(ins.op);
    if (!form) continue;
    ins.into = target;
    ins.into_op = form->op;
    ins.into_extra = form->extra;
    wb.in_place = true;
    changed = true;

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
          !is_elementwise(first.op) || !fits(plan.node_infos[first.node_info].result)) {
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
      std::optional<OutForm> first_form = out_form(first.op);
      if (!first_form || !writes_in_place(*first_form)) continue;
      first.into = target;
      first.into_op = first_form->op;
      first.into_extra = first_form->extra;
      break;
    }
  }
  return changed;
}

}  // namespace detail
}  // namespace torchcap
