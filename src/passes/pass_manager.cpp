#include <torchcap/passes.h>

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
