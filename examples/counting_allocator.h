// Counting what goes through LibTorch's CPU allocator, for the tests and
// benchmarks that measure allocations per run.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstddef>

namespace torchcap::examples {

// Counts the CPU allocator's allocations while installed (one at a time).
class CountingAllocator final : public c10::Allocator {
 public:
  CountingAllocator() : inner_(c10::GetCPUAllocator()) { c10::SetCPUAllocator(this, kPriority); }
  ~CountingAllocator() override { c10::SetCPUAllocator(inner_, kPriority); }
  c10::DataPtr allocate(size_t n) const override {
    ++count_;
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  size_t count() const { return count_; }

 private:
  static constexpr uint8_t kPriority = 200;
  c10::Allocator* inner_;
  mutable std::atomic<size_t> count_{0};
};

}  // namespace torchcap::examples
