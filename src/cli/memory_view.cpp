#include "cli/memory_view.h"

#include <torchcap/serialize.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>

namespace torchcap::cli {
namespace {

using json = nlohmann::ordered_json;

std::string printf_string(const char* format, double a, double b = 0) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, a, b);
  return buf;
}

// "1.5 MiB (1572864 B)"
std::string bytes_str(int64_t b) {
  std::string exact = std::to_string(b) + " B";
  if (b >= (1 << 20)) return printf_string("%.2f MiB", b / 1048576.0) + " (" + exact + ")";
  if (b >= 1024) return printf_string("%.1f KiB", b / 1024.0) + " (" + exact + ")";
  return exact;
}

std::string ratio_str(int64_t a, int64_t b) { return b > 0 ? printf_string("%.3f", double(a) / b) : "-"; }

std::string step_str(const MemoryPlan& plan, int32_t step) {
  std::string s = "step " + std::to_string(step);
  if (step >= 0 && static_cast<size_t>(step) < plan.step_nodes.size()) s += " (%" + plan.step_nodes[step] + ")";
  return s;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A colour per buffer from its name (FNV-1a), so pictures of one graph agree.
std::string colour_of(const std::string& name) {
  uint32_t h = 2166136261u;
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  return "hsl(" + std::to_string(h % 360) + ",60%," + std::to_string(55 + (h >> 9) % 20) + "%)";
}

}  // namespace

std::string format_memory_plan(const MemoryPlan& plan) {
  std::string s;
  s += "memory plan: " + std::to_string(plan.values.size()) + " buffers over " +
       std::to_string(plan.num_steps) + " steps, " + std::to_string(MemoryPlan::kAlignment) +
       "-byte aligned\n";
  auto row = [&](const char* what, int64_t bytes, const std::string& extra = {}) {
    char buf[48];
    std::snprintf(buf, sizeof(buf), "  %-22s", what);
    s += buf + bytes_str(bytes) + extra + "\n";
  };
  row("naive (no reuse)", plan.naive_bytes);
  row("greedy (ExecuTorch)", plan.greedy_bytes);
  row("best fit by size", plan.best_fit_bytes);
  row(("chosen: " + plan.algorithm).c_str(), plan.arena_bytes,
      ", " + ratio_str(plan.arena_bytes, plan.lower_bound_bytes) + " x lower bound");
  row("lower bound", plan.lower_bound_bytes, " live at " + step_str(plan, plan.peak_step));

  std::vector<const PlannedValue*> live = plan.live_at(plan.peak_step);
  s += "live at the peak, " + step_str(plan, plan.peak_step) + ":\n";
  for (const PlannedValue* v : live) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "  %10lld  %10lld B  steps %d..%d  %%%s %s\n",
                  static_cast<long long>(v->offset), static_cast<long long>(v->size), v->first,
                  v->last, v->label().c_str(), v->meta.str().c_str());
    s += buf;
  }
  if (!plan.unplanned.empty()) {
    s += "not planned: " + std::to_string(plan.unplanned.size()) + (plan.unplanned.size() == 1 ? " value\n" : " values\n");
    for (const UnplannedValue& u : plan.unplanned) {
      s += "  %" + u.node + (u.output == 0 ? "" : "[" + std::to_string(u.output) + "]") + ": " + u.reason + "\n";
    }
  }
  // Fallbacks grouped by operator: a ResNet has twenty convolutions.
  std::map<std::string, std::pair<size_t, std::string>> fallbacks;
  size_t with_out = 0;
  for (const OperatorPlan& op : plan.operators) {
    if (op.fallback.empty()) {
      ++with_out;
      continue;
    }
    auto& f = fallbacks[op.target];
    ++f.first;
    f.second = op.fallback;
  }
  s += "operators writing into the arena through an out variant: " + std::to_string(with_out) + " of " +
       std::to_string(plan.operators.size()) + " nodes\n";
  if (!fallbacks.empty()) {
    s += "operators without a usable out variant (they allocate):\n";
    for (const auto& [target, f] : fallbacks) {
      s += "  " + target + " (" + std::to_string(f.first) + (f.first == 1 ? " node" : " nodes") +
           "): " + f.second + "\n";
    }
  }
  return s;
}

json memory_plan_json(const MemoryPlan& plan) {
  json j;
  j["alignment"] = MemoryPlan::kAlignment;
  j["arena_bytes"] = plan.arena_bytes;
  j["algorithm"] = plan.algorithm;
  j["naive_bytes"] = plan.naive_bytes;
  j["greedy_bytes"] = plan.greedy_bytes;
  j["best_fit_bytes"] = plan.best_fit_bytes;
  j["lower_bound_bytes"] = plan.lower_bound_bytes;
  j["peak_step"] = plan.peak_step;
  j["peak_node"] = plan.peak_step < static_cast<int32_t>(plan.step_nodes.size())
                       ? json(plan.step_nodes[plan.peak_step])
                       : json();
  json live = json::array();
  for (const PlannedValue* v : plan.live_at(plan.peak_step)) live.push_back(v->label());
  j["live_at_peak"] = live;
  json values = json::array();
  for (const PlannedValue& v : plan.values) {
    values.push_back({{"node", v.node},
                      {"output", v.output},
                      {"type", v.meta.str()},
                      {"size", v.size},
                      {"offset", v.offset},
                      {"first", v.first},
                      {"last", v.last},
                      {"aliases", v.aliases}});
  }
  j["values"] = values;
  json unplanned = json::array();
  for (const UnplannedValue& u : plan.unplanned) {
    unplanned.push_back({{"node", u.node}, {"output", u.output}, {"reason", u.reason}});
  }
  j["unplanned"] = unplanned;
  json ops = json::array();
  for (const OperatorPlan& op : plan.operators) {
    ops.push_back({{"node", op.node},
                   {"target", op.target},
                   {"out_variant", op.out_variant.empty() ? json() : json(op.out_variant)},
                   {"fallback", op.fallback.empty() ? json() : json(op.fallback)}});
  }
  j["operators"] = ops;
  return j;
}

std::string memory_plan_svg(const MemoryPlan& plan) {
  const double left = 90, top = 40, width = 720, height = 400;
  const double steps = std::max(plan.num_steps, 1);
  const double bytes = static_cast<double>(std::max<int64_t>(plan.arena_bytes, 1));
  auto x = [&](double step) { return printf_string("%.1f", left + step / steps * width); };
  auto y = [&](double offset) { return printf_string("%.1f", top + offset / bytes * height); };
  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + printf_string("%.0f", left + width + 20) +
       "\" height=\"" + printf_string("%.0f", top + height + 50) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<title>memory plan: " + std::to_string(plan.values.size()) + " buffers, arena " +
       std::to_string(plan.arena_bytes) + " B</title>\n";
  s += "<text x=\"" + printf_string("%.0f", left) + "\" y=\"20\">arena " + xml_escape(bytes_str(plan.arena_bytes)) +
       " (" + plan.algorithm + "), lower bound " + xml_escape(bytes_str(plan.lower_bound_bytes)) + "</text>\n";
  s += "<rect x=\"" + x(0) + "\" y=\"" + y(0) + "\" width=\"" + printf_string("%.1f", width) +
       "\" height=\"" + printf_string("%.1f", height) + "\" fill=\"#f4f4f4\" stroke=\"#999\"/>\n";
  for (const PlannedValue& v : plan.values) {
    if (v.size == 0) continue;
    s += "<rect x=\"" + x(v.first) + "\" y=\"" + y(v.offset) + "\" width=\"" +
         printf_string("%.1f", (v.last + 1 - v.first) / steps * width) + "\" height=\"" +
         printf_string("%.1f", std::max(v.size / bytes * height, 0.5)) + "\" fill=\"" + colour_of(v.label()) +
         "\" stroke=\"#333\" stroke-width=\"0.5\"><title>%" + xml_escape(v.label()) + " " +
         xml_escape(v.meta.str()) + ", " + std::to_string(v.size) + " B at " + std::to_string(v.offset) +
         ", steps " + std::to_string(v.first) + ".." + std::to_string(v.last) + "</title></rect>\n";
  }
  std::string peak = x(plan.peak_step + 0.5);
  s += "<line x1=\"" + peak + "\" y1=\"" + y(0) + "\" x2=\"" + peak + "\" y2=\"" + y(bytes) +
       "\" stroke=\"#c00\" stroke-dasharray=\"4 3\"><title>peak: " + xml_escape(step_str(plan, plan.peak_step)) +
       "</title></line>\n";
  s += "<text x=\"" + printf_string("%.0f", left + width / 2) + "\" y=\"" + printf_string("%.0f", top + height + 20) +
       "\" text-anchor=\"middle\">step (0.." + std::to_string(plan.num_steps - 1) + ")</text>\n";
  s += "<text x=\"" + printf_string("%.0f", left - 8) + "\" y=\"" + y(0) + "\" text-anchor=\"end\" dy=\"10\">0</text>\n";
  s += "<text x=\"" + printf_string("%.0f", left - 8) + "\" y=\"" + y(bytes) + "\" text-anchor=\"end\">" +
       std::to_string(plan.arena_bytes) + "</text>\n";
  s += "<text x=\"20\" y=\"" + printf_string("%.0f", top + height / 2) + "\" transform=\"rotate(-90 20 " +
       printf_string("%.0f", top + height / 2) + ")\" text-anchor=\"middle\">offset (bytes)</text>\n";
  s += "</svg>\n";
  return s;
}

int show_memory(const std::string& file, const std::string& svg, bool as_json) {
  GraphModule gm = load(file);
  MemoryPlan plan = plan_memory(gm.graph());
  if (!svg.empty()) {
    std::ofstream out(svg, std::ios::binary);
    out << memory_plan_svg(plan);
    if (!out) throw Error("cannot write the memory picture to '" + svg + "'");
  }
  if (as_json) {
    std::cout << memory_plan_json(plan).dump() << "\n";
  } else {
    std::cout << format_memory_plan(plan);
    if (!svg.empty()) std::cout << "drew the arena to " << svg << "\n";
  }
  return 0;
}

}  // namespace torchcap::cli
