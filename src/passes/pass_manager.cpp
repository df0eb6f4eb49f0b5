#include <torchcap/passes.h>

#include "passes/inference.h"

#include <algorithm>

namespace torchcap {

PassManager& PassManager::add(std::string name, PassFn pass) {
  names_.push_back(std::move(name));
  passes_.push_back(std::move(pass));
  return *this;
}

PassManager& PassManager::add(std::string name, bool (*pass)(Graph&)) {
  return add(std::move(name), [pass](GraphModule& gm) { return pass(gm.graph()); });
}

bool PassManager::run(GraphModule& gm) const {
  std::vector<std::string> ran;
  auto fail = [&](const std::string& name, const std::string& what) {
    std::string before;
    for (const std::string& r : ran) before += (before.empty() ? "" : ", ") + r;
    throw PassError("pass '" + name + "' failed" +
                    (before.empty() ? " (it ran first)" : " after " + before) + ": " + what);
  };
  bool any = false;
  const size_t rounds = fixpoint_ ? max_rounds_ : 1;
  for (size_t round = 0; round < rounds; ++round) {
    bool changed = false;
    for (size_t i = 0; i < passes_.size(); ++i) {
      const std::string& name = names_[i];
      try {
        changed = passes_[i](gm) || changed;
      } catch (const std::exception& e) {
        fail(name, e.what());
      }
      if (lint_) {
        try {
          gm.lint();
        } catch (const std::exception& e) {
          fail(name, std::string("the graph it left does not lint: ") + e.what());
        }
      }
      ran.push_back(fixpoint_ ? name + " (round " + std::to_string(round + 1) + ")" : name);
    }
    any = any || changed;
    if (!changed) break;
  }
  return any;
}

}  // namespace torchcap

namespace torchcap {

const std::vector<NamedPass>& named_passes() {
  static const std::vector<NamedPass> passes = {
      {"dce", "remove what is computed and never used (eliminate_dead_code)",
       [](GraphModule& gm) { return eliminate_dead_code(gm.graph()); }},
      {"cse", "compute each repeated pure call once (eliminate_common_subexpressions)",
       [](GraphModule& gm) { return eliminate_common_subexpressions(gm.graph()); }},
      {"shapes", "recompute every node's dtype, shape and strides on meta tensors "
                 "(propagate_shapes)",
       [](GraphModule& gm) { return propagate_shapes(gm); }},
      {"fold_bn", "fold eval-mode batch norms into the convolutions before them "
                  "(inference graphs; weights rounded once)",
       [](GraphModule& gm) { return detail::fold_batch_norms(gm); }},
      {"fold_constants", "compute once what is computed from attributes alone (inference graphs)",
       [](GraphModule& gm) { return detail::fold_constants(gm); }},
      {"no_ops", "remove detach, alias, and clones, views and dropouts that give back their input "
                 "(graphs that write no tensor)",
       [](GraphModule& gm) { return detail::remove_no_ops(gm); }},
      {"prepack", "run 2-D convolutions by oneDNN or XNNPACK and large linear layers by XNNPACK, with "
                  "weights packed once and a following relu or hardtanh fused, on channels-last "
                  "activations (inference graphs)",
       [](GraphModule& gm) {
         const bool convolutions = detail::prepack_convolutions(gm);
         return detail::prepack_linears(gm) || convolutions;
       }},
  };
  return passes;
}

const std::vector<NamedPipeline>& named_pipelines() {
  static const std::vector<NamedPipeline> pipelines = {
      {"cleanup", "cse, then dce, until neither changes the graph", {"cse", "dce"}},
      {"optimize", "for inference (optimize_for_inference): fold_bn, fold_constants, no_ops, cse, dce, prepack",
       {"fold_bn", "fold_constants", "no_ops", "cse", "dce", "prepack"}},
  };
  return pipelines;
}

namespace {

std::string known_names() {
  std::string out;
  for (const NamedPass& p : named_passes()) out += (out.empty() ? "" : ", ") + p.name;
  for (const NamedPipeline& p : named_pipelines()) out += ", " + p.name + " (pipeline)";
  return out;
}

const NamedPass* find_pass(const std::string& name) {
  for (const NamedPass& p : named_passes()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

}  // namespace

PassManager passes_by_name(const std::vector<std::string>& names) {
  PassManager pm;
  for (const std::string& name : names) {
    if (const NamedPass* p = find_pass(name)) {
      pm.add(p->name, p->run);
      continue;
    }
    auto pipeline = std::find_if(named_pipelines().begin(), named_pipelines().end(),
                                 [&](const NamedPipeline& p) { return p.name == name; });
    if (pipeline == named_pipelines().end()) {
      throw Error("unknown pass '" + name + "'; the passes are: " + known_names());
    }
    PassManager inner;
    for (const std::string& step : pipeline->passes) inner.add(step, find_pass(step)->run);
    inner.until_fixpoint();
    pm.add(pipeline->name, [inner](GraphModule& gm) { return inner.run(gm); });
  }
  return pm;
}

}  // namespace torchcap
