// `torchcap optimize FILE -o OUT`: optimize_for_inference on a saved graph,
// checked against the graph as it was on random inputs of its recorded
// shapes, then saved.
#include <torchcap/error.h>
#include <torchcap/interpreter.h>
#include <torchcap/passes.h>
#include <torchcap/serialize.h>
#include <torchcap/summary.h>

#include "cli/cli_inputs.h"
#include "cli/commands.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

namespace torchcap::cli {

int cmd_optimize(const std::string& file, const std::string& output, bool as_json) {
  check_output_path(output);
  GraphModule gm = load(file);
  if (std::vector<const Attribute*> unbound = gm.unbound_attributes(); !unbound.empty()) {
    throw Error("'" + file + "' is weightless (" + unbound[0]->name +
                (unbound.size() > 1 ? ", ..." : "") +
                " have no values): optimizing folds and packs weights, so it needs them; bind them "
                "first (torchcap run --weights, or bind_weights in C++)");
  }
  const GraphModule before = gm.clone();
  const size_t nodes_before = gm.graph().size();
  auto t0 = Clock::now();
  const bool changed = optimize_for_inference(gm);
  const double optimize_ms = ms_since(t0);

  // The same random inputs through both; the optimized graph's first run
  // packs its weights.
  std::vector<at::Tensor> inputs = random_inputs_for(before);
  std::vector<at::Tensor> want = Interpreter(before).run_flat(inputs);
  std::vector<at::Tensor> got = Interpreter(gm).run_flat(inputs);
  double diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (at::isFloatingType(want[i].scalar_type()) && want[i].numel() > 0) {
      diff = std::max(diff, (got[i].to(at::kDouble) - want[i].to(at::kDouble)).abs().max().item<double>());
    }
  }
  save(gm, output);

  if (as_json) {
    nlohmann::ordered_json j = summary_json(gm);
    j["nodes_before"] = nodes_before;
    j["changed"] = changed;
    j["optimize_ms"] = optimize_ms;
    j["max_abs_diff"] = diff;
    j["file"] = output;
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::printf("optimized %s: %zu nodes -> %zu in %.1f ms%s\n", file.c_str(), nodes_before, gm.graph().size(),
              optimize_ms, changed ? "" : " (nothing to change)");
  std::printf("max |optimized - original| = %g\n", diff);
  std::printf("saved %s\n", output.c_str());
  return 0;
}

}  // namespace torchcap::cli
