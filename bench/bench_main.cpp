// torchcap_bench: every benchmark, printed as `name: value unit` lines.
//
//   torchcap_bench [trace|run|train|all] [case]
//
// `case` keeps only the training benchmarks whose name (case/optimizer)
// contains it: "mlp200", "mlp200/adam", "resnet18".
#include <cstring>
#include <iostream>
#include <string>

namespace torchcap::bench {
void trace_benchmarks();
void interpreter_benchmarks();
void training_benchmarks(const std::string& only);
}  // namespace torchcap::bench

int main(int argc, char** argv) {
  std::string which = argc > 1 ? argv[1] : "all";
  if (which != "all" && which != "trace" && which != "run" && which != "train") {
    std::cerr << "usage: torchcap_bench [trace|run|train|all] [case]\n";
    return 2;
  }
  if (which == "all" || which == "trace") torchcap::bench::trace_benchmarks();
  if (which == "all" || which == "run") torchcap::bench::interpreter_benchmarks();
  if (which == "all" || which == "train") torchcap::bench::training_benchmarks(argc > 2 ? argv[2] : "");
  return 0;
}
