// Shape and dtype propagation on meta tensors.
#include <torchcap/error.h>
#include <torchcap/export.h>
#include <torchcap/passes.h>

#include "zoo.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace torchcap {
namespace {

class ShapePropagationZoo : public ::testing::TestWithParam<std::string> {};

void expect_reproduces(GraphModule& gm, const std::string& what) {
  std::vector<ValueMeta> traced;
  for (const Node* n : gm.graph()) traced.push_back(n->meta().val);
  // Forget everything but the inputs' metadata, then recompute.
  for (Node* n : gm.graph()) {
    if (n->op() != OpCode::Placeholder) n->meta().val = ValueMeta{};
  }
  EXPECT_TRUE(propagate_shapes(gm));
  size_t i = 0;
  for (const Node* n : gm.graph()) {
    const ValueMeta& before = traced[i++];
    if (n->op() == OpCode::Output) continue;
    EXPECT_EQ(n->meta().val, before) << what << ": %" << n->name() << " (" << n->target()
                                     << ") traced " << before.str() << " propagated "
                                     << n->meta().val.str();
  }
  EXPECT_FALSE(propagate_shapes(gm));  // a second run changes nothing
}

TEST_P(ShapePropagationZoo, ReproducesTheTracedMetadata) {
  examples::Example e = examples::make(GetParam());
  GraphModule gm = examples::trace(e);
  expect_reproduces(gm, GetParam());
}

TEST_P(ShapePropagationZoo, ReproducesTheExportedMetadata) {
  examples::Example e = examples::make(GetParam());
  std::vector<c10::IValue> in = e.make_inputs(0);
  GraphModule gm = e.module ? export_program(*e.module, e.forward, in) : export_program(e.forward, in);
  expect_reproduces(gm, GetParam() + " (exported)");
}

INSTANTIATE_TEST_SUITE_P(Examples, ShapePropagationZoo, ::testing::ValuesIn(examples::names()),
                         [](const auto& info) { return info.param; });

TEST(ShapePropagation, FollowsNewInputShapes) {
  GraphModule gm = trace([](std::vector<c10::IValue> in) {
    return c10::IValue(at::matmul(in[0].toTensor(), in[1].toTensor()).sum(0));
  }, {at::randn({2, 3}), at::randn({3, 4})});
  Node* ph0 = gm.graph().find("ph_0");
  ph0->meta().val = ValueMeta::tensor(TensorMeta{c10::kFloat, {7, 3}, {3, 1}, c10::kCPU, nullptr});
  EXPECT_TRUE(propagate_shapes(gm));
  const Node* out = gm.graph().output_node()->args()[0].to_list()[0].to_node();
  EXPECT_EQ(out->meta().val.str(), "f32[4]");
  EXPECT_EQ(gm.graph().find("mm")->meta().val.str(), "f32[7, 4]");
}

TEST(ShapePropagation, NeedsPlaceholderMetadata) {
  GraphModule gm;
  Node* x = gm.graph().placeholder("x");
  gm.graph().output({gm.graph().call_function("aten::relu", {x})});
  gm.set_flat_specs();
  try {
    propagate_shapes(gm);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "propagate_shapes: placeholder %x has no recorded dtype and shape to start from");
  }
}

}  // namespace
}  // namespace torchcap
