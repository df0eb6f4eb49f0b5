// The pass manager.
#include <torchcap/error.h>
#include <torchcap/passes.h>
#include <torchcap/tracer.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace torchcap {
namespace {

GraphModule small_module() {
  return trace([](std::vector<c10::IValue> in) {
    at::Tensor x = in[0].toTensor();
    at::Tensor unused = at::cos(x);
    return c10::IValue(at::sin(x) + at::sin(x));
  }, {at::randn({3})});
}

TEST(PassManager, RunsPassesInOrderAndReportsChange) {
  GraphModule gm = small_module();
  std::vector<std::string> order;
  PassManager pm;
  pm.add("cse", eliminate_common_subexpressions)
      .add("record", [&](GraphModule&) {
        order.push_back("record");
        return false;
      })
      .add("dce", eliminate_dead_code);
  EXPECT_TRUE(pm.run(gm));
  EXPECT_EQ(order, std::vector<std::string>{"record"});
  EXPECT_EQ(gm.graph().size(), 4u);  // ph_0, sin, add, output
  EXPECT_FALSE(pm.run(gm));
}

TEST(PassManager, RunsToAFixpoint) {
  GraphModule gm = small_module();
  int calls = 0;
  PassManager pm;
  pm.add("count", [&](GraphModule&) { return ++calls < 3; }).until_fixpoint(10);
  EXPECT_TRUE(pm.run(gm));
  EXPECT_EQ(calls, 3);
}

TEST(PassManager, AFailingPassIsNamedWithThePassesBeforeIt) {
  GraphModule gm = small_module();
  PassManager pm;
  pm.add("cse", eliminate_common_subexpressions)
      .add("dce", eliminate_dead_code)
      .add("explode", [](GraphModule&) -> bool { throw std::runtime_error("out of ideas"); });
  try {
    pm.run(gm);
    FAIL();
  } catch (const PassError& e) {
    EXPECT_EQ(std::string(e.what()), "pass 'explode' failed after cse, dce: out of ideas");
  }
}

TEST(PassManager, AFirstPassFailingSaysSo) {
  GraphModule gm = small_module();
  PassManager pm;
  pm.add("explode", [](GraphModule&) -> bool { throw std::runtime_error("no"); });
  try {
    pm.run(gm);
    FAIL();
  } catch (const PassError& e) {
    EXPECT_EQ(std::string(e.what()), "pass 'explode' failed (it ran first): no");
  }
}

TEST(PassManager, LintsAfterEachPassWhenAsked) {
  GraphModule gm = small_module();
  PassManager pm;
  pm.add("dce", eliminate_dead_code)
      .add("break_order", [](GraphModule& m) {
        Graph& g = m.graph();
        Node* sin = g.find("sin");
        g.move_before(g.find("add"), sin);  // a use before its definition
        return true;
      })
      .lint_after_each_pass(true);
  try {
    pm.run(gm);
    FAIL();
  } catch (const PassError& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("pass 'break_order' failed after dce: the graph it left does not lint: lint: ", 0), 0u)
        << m;
  }
}

TEST(PassManager, FixpointRoundsAreNamed) {
  GraphModule gm = small_module();
  int calls = 0;
  PassManager pm;
  pm.add("grow", [&](GraphModule&) {
      if (++calls == 2) throw std::runtime_error("second round");
      return true;
    })
      .until_fixpoint(5);
  try {
    pm.run(gm);
    FAIL();
  } catch (const PassError& e) {
    EXPECT_EQ(std::string(e.what()), "pass 'grow' failed after grow (round 1): second round");
  }
}

// --- Passes by name ---------------------------------------------------------------

TEST(PassesByName, RunTheNamedPassesInOrder) {
  GraphModule gm = small_module();  // ph_0, cos, sin, sin_1, add, output
  PassManager pm = passes_by_name({"cse"});
  EXPECT_EQ(pm.names(), std::vector<std::string>{"cse"});
  EXPECT_TRUE(pm.run(gm));
  EXPECT_EQ(gm.graph().size(), 6u);  // cse leaves the duplicate sin without users
  EXPECT_TRUE(passes_by_name({"dce"}).run(gm));
  EXPECT_EQ(gm.graph().size(), 4u);  // ph_0, sin, add, output
}

TEST(PassesByName, APipelineRunsItsPassesToAFixpoint) {
  GraphModule gm = small_module();
  PassManager pm = passes_by_name({"cleanup"});
  EXPECT_EQ(pm.names(), std::vector<std::string>{"cleanup"});
  EXPECT_TRUE(pm.run(gm));
  EXPECT_EQ(gm.graph().size(), 4u);
  EXPECT_FALSE(pm.run(gm));
}

TEST(PassesByName, EveryPipelineNamesRegisteredPasses) {
  for (const NamedPipeline& p : named_pipelines()) {
    for (const std::string& step : p.passes) {
      EXPECT_NO_THROW(passes_by_name({step})) << p.name << ": " << step;
    }
  }
}

TEST(PassesByName, AnUnknownNameIsRefusedWithTheNamesThereAre) {
  try {
    passes_by_name({"dce", "fold"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "unknown pass 'fold'; the passes are: dce, cse, shapes, fold_bn, fold_constants, no_ops, "
              "prepack, cleanup (pipeline), optimize (pipeline)");
  }
}

}  // namespace
}  // namespace torchcap
