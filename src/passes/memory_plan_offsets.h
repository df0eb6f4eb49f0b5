// The offset algorithms of the memory planner, on bare lifetimes. Internal.
#pragma once

#include <cstdint>
#include <vector>

namespace torchcap {
namespace detail {

// A buffer to place: `size` bytes (already aligned) live from step `first` to
// step `last`, both included.
struct Lifetime {
  int64_t size = 0;
  int32_t first = 0;
  int32_t last = 0;
};

inline int64_t align_up(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

struct LowerBound {
  int64_t bytes = 0;  // most bytes live at one step
  int32_t step = 0;   // the first step where that is reached
};
LowerBound live_bytes_bound(const std::vector<Lifetime>& items, int32_t num_steps);

// ExecuTorch's greedy: buffers by decreasing size, each joins the first
// shared object none of whose members it meets in time; objects are laid out
// one after another, each as large as its largest member. Fills `offsets`
// (one per item) and returns the arena size.
int64_t greedy_shared_objects(const std::vector<Lifetime>& items, std::vector<int64_t>& offsets);

// Greedy by size for offset calculation: buffers by decreasing size, each put
// into the smallest gap left between the already placed buffers it meets in
// time (best fit), or above them all. Tries a few orders and keeps the
// smallest arena. Fills `offsets` and returns the arena size.
int64_t best_fit_offsets(const std::vector<Lifetime>& items, std::vector<int64_t>& offsets);

}  // namespace detail
}  // namespace torchcap
