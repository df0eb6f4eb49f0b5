// Offset algorithms and the verifier of memory plans.
#include "passes/memory_plan_offsets.h"

#include <torchcap/memory_plan.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

namespace torchcap {
namespace detail {
namespace {

bool meet(const Lifetime& a, const Lifetime& b) { return a.first <= b.last && b.first <= a.last; }

std::vector<size_t> order_by(const std::vector<Lifetime>& items,
                             const std::function<bool(const Lifetime&, const Lifetime&)>& before) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return before(items[a], items[b]); });
  return order;
}

bool larger_first(const Lifetime& a, const Lifetime& b) {
  if (a.size != b.size) return a.size > b.size;
  return a.first < b.first;
}

int64_t best_fit_in_order(const std::vector<Lifetime>& items, const std::vector<size_t>& order,
                          std::vector<int64_t>& offsets) {
  offsets.assign(items.size(), 0);
  std::vector<size_t> placed;  // by offset
  int64_t arena = 0;
  for (size_t i : order) {
    const Lifetime& item = items[i];
    if (item.size == 0) continue;
    int64_t end = 0;  // the highest byte below the gap being looked at
    int64_t best = -1;
    int64_t best_gap = std::numeric_limits<int64_t>::max();
    for (size_t p : placed) {
      if (!meet(item, items[p])) continue;
      int64_t gap = offsets[p] - end;
      if (gap >= item.size && gap < best_gap) {
        best = end;
        best_gap = gap;
      }
      end = std::max(end, offsets[p] + items[p].size);
    }
    offsets[i] = best >= 0 ? best : end;
    arena = std::max(arena, offsets[i] + item.size);
    auto at = std::upper_bound(placed.begin(), placed.end(), offsets[i],
                               [&](int64_t off, size_t p) { return off < offsets[p]; });
    placed.insert(at, i);
  }
  return arena;
}

}  // namespace

LowerBound live_bytes_bound(const std::vector<Lifetime>& items, int32_t num_steps) {
  // Bytes coming alive at each step minus bytes dead after the step before.
  std::vector<int64_t> delta(static_cast<size_t>(num_steps) + 1, 0);
  for (const Lifetime& l : items) {
    delta[l.first] += l.size;
    delta[l.last + 1] -= l.size;
  }
  LowerBound bound;
  int64_t live = 0;
  for (int32_t s = 0; s < num_steps; ++s) {
    live += delta[s];
    if (live > bound.bytes) bound = {live, s};
  }
  return bound;
}

int64_t greedy_shared_objects(const std::vector<Lifetime>& items, std::vector<int64_t>& offsets) {
  struct SharedObject {
    int64_t size = 0;
    std::vector<size_t> members;
  };
  std::vector<SharedObject> objects;
  std::vector<size_t> object_of(items.size(), 0);
  for (size_t i : order_by(items, larger_first)) {
    size_t chosen = objects.size();
    for (size_t o = 0; o < objects.size() && chosen == objects.size(); ++o) {
      bool free = std::none_of(objects[o].members.begin(), objects[o].members.end(),
                               [&](size_t m) { return meet(items[m], items[i]); });
      if (free) chosen = o;
    }
    if (chosen == objects.size()) objects.emplace_back();
    objects[chosen].members.push_back(i);
    objects[chosen].size = std::max(objects[chosen].size, items[i].size);
    object_of[i] = chosen;
  }
  std::vector<int64_t> object_offset(objects.size(), 0);
  int64_t arena = 0;
  for (size_t o = 0; o < objects.size(); ++o) {
    object_offset[o] = arena;
    arena += objects[o].size;
  }
  offsets.assign(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) offsets[i] = object_offset[object_of[i]];
  return arena;
}

int64_t best_fit_offsets(const std::vector<Lifetime>& items, std::vector<int64_t>& offsets) {
  // Size first is the published order; ties and two other orders sometimes
  // pack tighter, and trying them costs little next to running the graph.
  const std::vector<std::function<bool(const Lifetime&, const Lifetime&)>> orders = {
      larger_first,
      [](const Lifetime& a, const Lifetime& b) {
        if (a.size != b.size) return a.size > b.size;
        return a.last - a.first > b.last - b.first;
      },
      [](const Lifetime& a, const Lifetime& b) {
        int64_t area_a = a.size * (a.last - a.first + 1), area_b = b.size * (b.last - b.first + 1);
        if (area_a != area_b) return area_a > area_b;
        return a.first < b.first;
      },
  };
  int64_t best = -1;
  std::vector<int64_t> trial;
  for (const auto& before : orders) {
    int64_t arena = best_fit_in_order(items, order_by(items, before), trial);
    if (best < 0 || arena < best) {
      best = arena;
      offsets = trial;
    }
  }
  if (best < 0) offsets.clear();
  return std::max<int64_t>(best, 0);
}

}  // namespace detail

namespace {

std::string describe(const PlannedValue& v) {
  return "%" + v.label() + " (bytes " + std::to_string(v.offset) + ".." +
         std::to_string(v.offset + v.size) + ", steps " + std::to_string(v.first) + ".." +
         std::to_string(v.last) + ")";
}

}  // namespace

void verify_memory_plan(const MemoryPlan& plan) {
  std::vector<const PlannedValue*> by_first;
  for (const PlannedValue& v : plan.values) {
    if (v.size < 0 || v.offset < 0 || v.first > v.last) {
      throw MemoryPlanError("memory plan: " + describe(v) + " has a negative size or offset or ends before it starts");
    }
    if (v.offset % MemoryPlan::kAlignment != 0) {
      throw MemoryPlanError("memory plan: " + describe(v) + " is not aligned to " +
                            std::to_string(MemoryPlan::kAlignment) + " bytes");
    }
    if (v.offset + v.size > plan.arena_bytes) {
      throw MemoryPlanError("memory plan: " + describe(v) + " ends beyond the arena of " +
                            std::to_string(plan.arena_bytes) + " bytes");
    }
    if (v.size > 0) by_first.push_back(&v);
  }
  // Sweep in order of first step: only values still live can clash.
  std::sort(by_first.begin(), by_first.end(),
            [](const PlannedValue* a, const PlannedValue* b) { return a->first < b->first; });
  std::vector<const PlannedValue*> live;
  for (const PlannedValue* v : by_first) {
    live.erase(std::remove_if(live.begin(), live.end(),
                              [&](const PlannedValue* u) { return u->last < v->first; }),
               live.end());
    for (const PlannedValue* u : live) {
      int64_t lo = std::max(u->offset, v->offset);
      int64_t hi = std::min(u->offset + u->size, v->offset + v->size);
      if (lo < hi) {
        throw MemoryPlanError("memory plan: " + describe(*u) + " and " + describe(*v) +
                              " are live at the same step and share bytes " + std::to_string(lo) +
                              ".." + std::to_string(hi));
      }
    }
    live.push_back(v);
  }
}

}  // namespace torchcap
