// `torchcap run --profile [--runs N] [--trace-json F]` (Interpreter::profile).
#include <torchcap/error.h>
#include <torchcap/interpreter.h>

#include "cli/commands.h"
#include "serialize/temp_files.h"

#include <iostream>

namespace torchcap::cli {

nlohmann::ordered_json profile_run(const Interpreter& interp, const std::vector<at::Tensor>& inputs,
                                   const ProfileRequest& request, bool as_json) {
  const Profile p = interp.profile_flat(inputs, request.runs);
  if (!request.trace_json.empty()) {
    const std::string trace = p.chrome_trace();
    detail::write_bytes_atomically(request.trace_json, trace.data(), trace.size(), [&](const std::string& what) {
      throw Error("--trace-json " + request.trace_json + ": " + what);
    });
  }
  if (!as_json) {
    std::cout << "\n" << p.table();
    if (!request.trace_json.empty()) std::cout << "saved the last run's trace to " << request.trace_json << "\n";
  }
  nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
  for (const Profile::Node& n : p.nodes) {
    nodes.push_back({{"node", n.name}, {"target", n.target}, {"source", n.source},
                     {"ms_per_run", n.seconds * 1e3 / p.runs}});
  }
  return {{"runs", p.runs}, {"ms_per_run", p.seconds * 1e3 / p.runs}, {"nodes", nodes}};
}

}  // namespace torchcap::cli
