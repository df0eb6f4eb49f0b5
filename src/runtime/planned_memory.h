// The interpreter's planned mode (Note [Planned runs]): intermediate results
// written through out variants into slices of one arena. Internal.
#pragma once

#include <torchcap/memory_plan.h>

#include "passes/out_variants.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchcap {
namespace detail {

// Note [Planned runs]
// A planned interpreter holds a MemoryPlan. An operator node whose results
// are all planned, and whose out variant has a CPU kernel of its own (Note
// [Out variants that write in place]), runs through that out variant with
// its results' slices of the arena as the out arguments, so a run allocates
// nothing for it. Everything else runs as in an unplanned run.
//
// Arenas: each run needs an arena no other run is using at the same time.
// Arenas are kept in a pool and leased per run, so each thread running the
// interpreter ends up with one arena, made once (the block and a tensor over
// every slice) and reused by every later run. A slice tensor never leaves the
// run: planned values are neither outputs nor aliases of outputs.
//
// An out variant that does not leave its result where it was given (it
// resized its out argument: a result whose size depends on the data) is not
// used again: the operator falls back to allocating, for this run and after,
// and `fallbacks` says so. One that throws is retried as the operator itself;
// only if that succeeds is the out variant given up (fall_back). If the
// operator fails too, the run's inputs were at fault, not the out variant:
// the error is the run's, and later runs go on as before.
class PlannedMemory {
 public:
  explicit PlannedMemory(MemoryPlan plan);

  // What node `n` runs through: an index for call(), or -1 to run it as usual.
  int32_t add_call(const Node& n);

  struct Arena {
    at::Tensor block;
    std::vector<at::Tensor> slices;  // one per planned value
  };

  class Lease {
   public:
    Lease(const PlannedMemory& memory);
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Arena& arena() { return *arena_; }

   private:
    const PlannedMemory& memory_;
    std::unique_ptr<Arena> arena_;
  };

  // Whether call `k` still goes through its out variant.
  bool uses_out_variant(int32_t k) const { return !calls_[k].fallen_back.load(std::memory_order_relaxed); }
  // Appends the out arguments of call `k` and runs its out variant. Returns
  // false if the out variant threw, with `failure` saying why: the stack is
  // then in an unspecified state, and the caller runs the operator as usual,
  // then calls fall_back(k, ...) if that succeeds.
  bool call(int32_t k, Arena& arena, std::vector<c10::IValue>& stack, std::string& failure) const;
  // Call `k` allocates from now on, for the reason `why`.
  void fall_back(int32_t k, Arena& arena, const std::string& why) const;

  const MemoryPlan& plan() const { return plan_; }
  // The plan's operators, with the fallbacks found while running.
  std::vector<OperatorPlan> operators() const;

 private:
  struct Call {
    OutForm out;
    std::vector<int32_t> values;  // planned value per result
    size_t op_index;              // in plan_.operators
    mutable std::atomic<bool> fallen_back{false};
    mutable std::string reason;   // written once, under mutex_
    Call(OutForm o, std::vector<int32_t> v, size_t i) : out(std::move(o)), values(std::move(v)), op_index(i) {}
  };
  std::unique_ptr<Arena> make_arena() const;
  at::Tensor make_slice(const Arena& arena, int32_t value) const;
  // The slices of `c`'s results as made, whatever the out variant did to them.
  void restore_slices(const Call& c, Arena& arena) const;
  void fall_back(const Call& c, Arena& arena, const std::string& why) const;

  MemoryPlan plan_;
  std::deque<Call> calls_;
  // Built with the plan, for add_call: operators by node name, values by
  // "node/output".
  std::unordered_map<std::string, size_t> operator_index_;
  std::unordered_map<std::string, int32_t> value_index_;
  mutable std::mutex mutex_;  // the pool and fallback reasons
  mutable std::vector<std::unique_ptr<Arena>> pool_;
};

}  // namespace detail
}  // namespace torchcap
