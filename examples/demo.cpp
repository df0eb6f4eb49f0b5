// `make demo`: trace the built-in ResNet-18 (a torch::nn model, random
// weights from a fixed seed), show what was captured, and check that running
// the graph gives what the model gives.
#include "zoo.h"

#include <torchcap/interpreter.h>
#include <torchcap/printer.h>
#include <torchcap/summary.h>

#include <chrono>
#include <iostream>
#include <sstream>

int main(int argc, char** argv) {
  using namespace torchcap;
  const std::string name = argc > 1 ? argv[1] : "resnet18";
  try {
    examples::Example model = examples::make(name);
    std::cout << "== tracing " << name << ": " << model.description << "\n";
    std::vector<c10::IValue> inputs = model.make_inputs(0);
    auto t0 = std::chrono::steady_clock::now();
    GraphModule gm = examples::trace(model, {}, inputs);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    gm.lint();
    std::cout << "traced in " << ms << " ms\n\n== summary\n" << format_summary(summarize(gm));

    std::cout << "\n== Python code (first lines)\n";
    std::istringstream code(python_code(gm));
    std::string line;
    for (int i = 0; i < 16 && std::getline(code, line); ++i) std::cout << line << "\n";
    std::cout << "    ...\n";

    std::cout << "\n== check: the graph on new inputs against the model\n";
    examples::Example reference = examples::make(name);
    std::vector<c10::IValue> fresh = reference.make_inputs(1);
    c10::IValue expected = reference.forward(fresh);
    c10::IValue actual = Interpreter(gm).run(fresh);
    double diff = examples::max_abs_diff(actual, expected);
    std::cout << "max |graph - eager| = " << diff << (diff <= 1e-5 ? "  (ok)" : "  (MISMATCH)") << "\n";
    return diff <= 1e-5 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "torchcap_demo: " << e.what() << "\n";
    return 1;
  }
}
