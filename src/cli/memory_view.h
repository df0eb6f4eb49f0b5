// `torchcap show FILE --memory`: a graph's memory plan as text, JSON or an
// SVG picture of the arena (time across, offset down, one rectangle per
// buffer).
#pragma once

#include <torchcap/memory_plan.h>

#include <nlohmann/json.hpp>

#include <string>

namespace torchcap::cli {

// Several lines: the figures of each algorithm, the peak step and what is live
// there, values left unplanned, operators that fall back to allocating.
std::string format_memory_plan(const MemoryPlan& plan);

nlohmann::ordered_json memory_plan_json(const MemoryPlan& plan);

// A standalone SVG document; deterministic for a given plan.
std::string memory_plan_svg(const MemoryPlan& plan);

// Loads `file`, plans it and prints the plan (text, or JSON with `as_json`);
// with `svg` non-empty also writes the picture there. Returns the exit code.
int show_memory(const std::string& file, const std::string& svg, bool as_json);

}  // namespace torchcap::cli
