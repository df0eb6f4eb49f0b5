// The tracer: the example zoo end to end, immutability, the parameter cache,
// the preserve policy, stack traces, threads, and bad input.
#include <torchcap/error.h>
#include <torchcap/interpreter.h>
#include <torchcap/printer.h>
#include <torchcap/tracer.h>
#include <torchcap/tracing_tensor.h>

#include "golden.h"
#include "zoo.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

namespace torchcap {
namespace {

using IValues = std::vector<c10::IValue>;

size_t count_target(const GraphModule& gm, const std::string& target) {
  size_t n = 0;
  for (const Node* node : gm.graph()) n += node->target() == target ? 1 : 0;
  return n;
}

std::string trace_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const TraceError& e) {
    return e.what();
  } catch (const TypeError& e) {
    return std::string("TypeError: ") + e.what();
  }
  return "";
}

// --- The zoo --------------------------------------------------------------

class Zoo : public ::testing::TestWithParam<std::string> {};

TEST_P(Zoo, TracesLintsAndReRunsLikeEager) {
  const std::string name = GetParam();
  examples::Example traced = examples::make(name);
  examples::Example eager = examples::make(name);  // same weights, untouched by the trace

  c10::IValue trace_outputs;
  GraphModule gm = examples::trace(traced, {}, {}, &trace_outputs);
  gm.lint();
  // What the trace computed is what the program computes.
  EXPECT_LE(examples::max_abs_diff(trace_outputs, eager.forward(eager.make_inputs(0))), 1e-5);

  // The graph on fresh inputs, against the program on the same inputs.
  examples::Example fresh = examples::make(name);
  IValues inputs = fresh.make_inputs(1);
  c10::IValue expected = fresh.forward(inputs);
  Interpreter interp(gm);
  c10::IValue actual = interp.run(inputs);
  EXPECT_LE(examples::max_abs_diff(actual, expected), 1e-5) << name;

  // Buffers written by the program (BatchNorm in train mode) end as they do
  // after running the program: the graph started from the values before the
  // trace.
  for (const auto& [buffer, value] : examples::named_buffers(fresh)) {
    if (!gm.has_attribute(buffer)) continue;  // never read by the graph
    EXPECT_TRUE(at::allclose(gm.attribute(buffer).value, value, 1e-5, 1e-6)) << buffer;
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, Zoo, ::testing::ValuesIn(examples::names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace torchcap
