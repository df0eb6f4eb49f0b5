// Counting what goes through LibTorch's CPU allocator, for the tests and
// benchmarks that measure allocations per run and the memory they hold.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <unordered_map>

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

// Tracks the bytes that LibTorch's CPU allocator holds for what was allocated
// while one is installed (one at a time): the allocations made and the peak of
// those bytes since the last take(). The bookkeeping is the process's and
// never destroyed, so memory allocated while one was installed may be freed
// after it is gone.
class LiveBytesAllocator final : public c10::Allocator {
 public:
  struct Usage {
    size_t allocations = 0;
    size_t peak_bytes = 0;  // over the bytes held when counting started
  };

  LiveBytesAllocator() : inner_(c10::GetCPUAllocator()) {
    state().inner_deleter = inner_->raw_deleter();
    take();
    c10::SetCPUAllocator(this, kPriority);
  }
  ~LiveBytesAllocator() override { c10::SetCPUAllocator(inner_, kPriority); }

  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr d = inner_->allocate(n);
    void* data = d.get();
    if (data == nullptr) return d;  // nothing held (n == 0)
    // The inner allocator's context is its data pointer (LibTorch's CPU
    // allocators'), freed by its raw deleter.
    if (d.get_context() != data || d.get_deleter() != state().inner_deleter) return d;
    c10::Device device = d.device();
    d.release_context();
    State& s = state();
    std::lock_guard<std::mutex> guard(s.mutex);
    s.sizes[data] = n;
    s.live += n;
    s.peak = std::max(s.peak, s.live);
    ++s.allocations;
    return c10::DataPtr(data, data, &release, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  // What was allocated since the last take() (or since this was installed).
  Usage take() {
    State& s = state();
    std::lock_guard<std::mutex> guard(s.mutex);
    Usage u{s.allocations, s.peak - s.start};
    s.allocations = 0;
    s.start = s.peak = s.live;
    return u;
  }

 private:
  struct State {
    std::mutex mutex;
    std::unordered_map<void*, size_t> sizes;
    size_t live = 0, peak = 0, start = 0, allocations = 0;
    c10::DeleterFnPtr inner_deleter = nullptr;
  };
  static State& state() {
    static State* s = new State();
    return *s;
  }
  static void release(void* data) {
    State& s = state();
    {
      std::lock_guard<std::mutex> guard(s.mutex);
      auto it = s.sizes.find(data);
      if (it != s.sizes.end()) {
        s.live -= it->second;
        s.sizes.erase(it);
      }
    }
    s.inner_deleter(data);
  }

  static constexpr uint8_t kPriority = 200;
  c10::Allocator* inner_;
};

}  // namespace torchcap::examples
