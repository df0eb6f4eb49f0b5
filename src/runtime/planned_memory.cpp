// Note [Planned runs] (planned_memory.h).
#include "runtime/planned_memory.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

namespace torchcap {
namespace detail {

PlannedMemory::PlannedMemory(MemoryPlan plan) : plan_(std::move(plan)) {
  for (size_t i = 0; i < plan_.operators.size(); ++i) operator_index_[plan_.operators[i].node] = i;
  for (size_t i = 0; i < plan_.values.size(); ++i) {
    value_index_[plan_.values[i].node + "/" + std::to_string(plan_.values[i].output)] = static_cast<int32_t>(i);
  }
}

int32_t PlannedMemory::add_call(const Node& n) {
  auto op = operator_index_.find(n.name());
  if (op == operator_index_.end() || plan_.operators[op->second].out_variant.empty()) return -1;
  std::optional<OutForm> out = out_form(n.op_handle());
  if (!out) return -1;
  std::vector<int32_t> values;
  for (size_t r = 0; r < n.schema().returns().size(); ++r) {
    auto v = value_index_.find(n.name() + "/" + std::to_string(r));
    if (v == value_index_.end()) return -1;
    values.push_back(v->second);
  }
  calls_.emplace_back(std::move(*out), std::move(values), op->second);
  return static_cast<int32_t>(calls_.size() - 1);
}

at::Tensor PlannedMemory::make_slice(const Arena& arena, int32_t value) const {
  const PlannedValue& v = plan_.values[value];
  // No deleter: the block owns the bytes, and the storage cannot grow.
  return at::from_blob(static_cast<uint8_t*>(arena.block.data_ptr()) + v.offset, v.meta.sizes,
                       v.meta.strides, at::TensorOptions().dtype(v.meta.dtype).device(v.meta.device));
}

std::unique_ptr<PlannedMemory::Arena> PlannedMemory::make_arena() const {
  auto arena = std::make_unique<Arena>();
  // LibTorch's CPU allocator aligns to 64 bytes, the plan's alignment.
  arena->block = at::empty({std::max<int64_t>(plan_.arena_bytes, 1)}, at::TensorOptions().dtype(at::kByte));
  arena->slices.reserve(plan_.values.size());
  for (size_t i = 0; i < plan_.values.size(); ++i) arena->slices.push_back(make_slice(*arena, static_cast<int32_t>(i)));
  return arena;
}

PlannedMemory::Lease::Lease(const PlannedMemory& memory) : memory_(memory) {
  {
    std::lock_guard<std::mutex> lock(memory.mutex_);
    if (!memory.pool_.empty()) {
      arena_ = std::move(memory.pool_.back());
      memory.pool_.pop_back();
    }
  }
  if (!arena_) arena_ = memory.make_arena();
}

PlannedMemory::Lease::~Lease() {
  std::lock_guard<std::mutex> lock(memory_.mutex_);
  memory_.pool_.push_back(std::move(arena_));
}

void PlannedMemory::restore_slices(const Call& c, Arena& arena) const {
  for (int32_t v : c.values) arena.slices[v] = make_slice(arena, v);
}

void PlannedMemory::fall_back(const Call& c, Arena& arena, const std::string& why) const {
  restore_slices(c, arena);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!c.fallen_back.load()) c.reason = why;
  c.fallen_back.store(true);
}

void PlannedMemory::fall_back(int32_t k, Arena& arena, const std::string& why) const {
  fall_back(calls_[k], arena, why);
}

bool PlannedMemory::call(int32_t k, Arena& arena, std::vector<c10::IValue>& stack,
                         std::string& failure) const {
  const Call& c = calls_[k];
  for (const c10::IValue& e : c.out.extra) stack.push_back(e);
  for (int32_t v : c.values) stack.emplace_back(arena.slices[v]);
  try {
    c.out.op.callBoxed(&stack);
  } catch (const std::exception& e) {
    // Not given up yet: the caller tries the operator itself first.
    restore_slices(c, arena);
    std::string what = e.what();
    failure = "its out variant failed: " + what.substr(0, what.find('\n'));
    return false;
  }
  for (size_t i = 0; i < c.values.size(); ++i) {
    const at::Tensor& slice = arena.slices[c.values[i]];
    const TensorMeta& m = plan_.values[c.values[i]].meta;
    if (!stack[i].isTensor() || !stack[i].toTensor().is_same(slice) ||
        slice.sizes() != c10::IntArrayRef(m.sizes) || slice.strides() != c10::IntArrayRef(m.strides)) {
      // The results are right (an out variant returns what it computed),
      // but not where the plan put them: from now on, allocate.
      fall_back(c, arena, "its out variant resized its result (a size that depends on the data?)");
      return true;
    }
  }
  return true;
}

std::vector<OperatorPlan> PlannedMemory::operators() const {
  std::vector<OperatorPlan> ops = plan_.operators;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Call& c : calls_) {
    if (c.fallen_back.load()) ops[c.op_index].fallback = c.reason;
  }
  return ops;
}

}  // namespace detail
}  // namespace torchcap
