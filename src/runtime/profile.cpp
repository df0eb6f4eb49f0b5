// Interpreter::profile and what it prints (interpreter.h): the interpreter
// times each instruction when asked (detail::InstructionTimes, one clock
// read per instruction, nothing when not asked).
#include <torchcap/error.h>
#include <torchcap/interpreter.h>

#include "runtime/plan.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

namespace torchcap {
namespace {

std::string source_of(const StackTrace& trace) {
  const std::vector<SourceFrame>& frames = trace.frames();
  if (frames.empty() || frames[0].file.empty()) return "";
  std::string file = frames[0].file;
  if (size_t slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
  return frames[0].line > 0 ? file + ":" + std::to_string(frames[0].line) : file;
}

std::string format(const char* fmt, double a, double b = 0, double c = 0) {
  char buf[128];
  std::snprintf(buf, sizeof buf, fmt, a, b, c);
  return buf;
}

}  // namespace

Profile Interpreter::profile(const std::vector<c10::IValue>& inputs, int runs) const {
  return profile_flat(flatten_inputs(inputs), runs);
}

Profile Interpreter::profile_flat(const std::vector<at::Tensor>& flat, int runs) const {
  if (runs < 1) throw Error("profile: runs must be at least 1, got " + std::to_string(runs));
  RunStats stats;
  detail::run_plan(*plan_, flat, stats);  // the first run's work is not the graph's
  detail::InstructionTimes times;
  for (int r = 0; r < runs; ++r) detail::run_plan(*plan_, flat, stats, &times);
  Profile p;
  p.runs = runs;
  p.last_run = times.last_run;
  const detail::InterpreterPlan& plan = *times.plan;
  for (size_t k = 0; k < plan.instructions.size(); ++k) {
    const detail::NodeInfo& info = plan.node_infos[plan.instructions[k].node_info];
    Profile::Node n;
    n.name = info.name;
    n.target = info.target;
    n.source = source_of(info.stack_trace);
    n.seconds = times.seconds[k];
    n.last_start = times.last_start[k];
    n.last_seconds = (k + 1 < plan.instructions.size() ? times.last_start[k + 1] : times.last_run) -
                     times.last_start[k];
    p.seconds += n.seconds;
    p.nodes.push_back(std::move(n));
  }
  return p;
}

std::string Profile::table(size_t slowest) const {
  struct Total {
    int64_t nodes = 0;
    double seconds = 0;
  };
  std::map<std::string, Total> by_operator;
  for (const Node& n : nodes) {
    Total& t = by_operator[n.target];
    ++t.nodes;
    t.seconds += n.seconds;
  }
  std::vector<std::pair<std::string, Total>> rows(by_operator.begin(), by_operator.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  size_t width = 8;
  for (const auto& [op, t] : rows) width = std::max(width, op.size());
  auto pad = [](std::string s, size_t w) { return s.size() < w ? s + std::string(w - s.size(), ' ') : s; };
  const double per_run = runs > 0 ? 1e3 / runs : 0;
  std::string out = std::to_string(runs) + (runs == 1 ? " run, " : " runs, ") +
                    format("%.3f ms a run in the graph's nodes\n", seconds * per_run);
  out += pad("operator", width) + "   calls   total ms/run   mean us   share\n";
  for (const auto& [op, t] : rows) {
    const int64_t calls = t.nodes * runs;
    out += pad(op, width) + format(" %7.0f", static_cast<double>(calls)) +
           format("   %12.3f   %7.1f", t.seconds * per_run, calls > 0 ? t.seconds / calls * 1e6 : 0) +
           format("  %5.1f%%\n", seconds > 0 ? 100 * t.seconds / seconds : 0);
  }
  std::vector<const Node*> order;
  for (const Node& n : nodes) order.push_back(&n);
  std::stable_sort(order.begin(), order.end(), [](const Node* a, const Node* b) { return a->seconds > b->seconds; });
  order.resize(std::min(order.size(), slowest));
  if (!order.empty()) out += "slowest nodes (ms/run):\n";
  for (const Node* n : order) {
    out += format("  %8.3f  ", n->seconds * per_run) + "%" + n->name + " (" + n->target + ")" +
           (n->source.empty() ? "" : "  " + n->source) + "\n";
  }
  return out;
}

std::string Profile::chrome_trace() const {
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  for (const Node& n : nodes) {
    nlohmann::ordered_json e = {{"name", n.name}, {"cat", n.target}, {"ph", "X"},
                                {"ts", n.last_start * 1e6}, {"dur", n.last_seconds * 1e6},
                                {"pid", 0}, {"tid", 0}};
    e["args"] = {{"target", n.target}};
    if (!n.source.empty()) e["args"]["source"] = n.source;
    events.push_back(std::move(e));
  }
  return nlohmann::ordered_json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace torchcap
