// The graph listing and the Python code, against golden text.
#include <torchcap/graph_module.h>
#include <torchcap/printer.h>

#include "golden.h"
#include "graph/python_literals.h"
#include "sample_graphs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace torchcap {
namespace {

using testing::meta;
using testing::sample_module;


TEST(Printer, GraphListing) {
  GraphModule gm = sample_module();
  gm.lint();
  testing::expect_golden("printer_graph.txt", gm.graph().str());
}

TEST(Printer, NodeLine) {
  Graph g;
  Node* bias = g.placeholder("bias");
  Node* x = g.placeholder("x");
  Node* t = g.placeholder("t");
  Node* addmm = g.call_function("aten::addmm", {bias, x, t});
  addmm->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 10}));
  g.output({addmm});
  EXPECT_EQ(format_node(*addmm), "%addmm : f32[2, 10] [users=1] = aten::addmm(%bias, %x, %t)");
  EXPECT_EQ(format_node(*g.output_node()), "return (%addmm,)");
  EXPECT_EQ(format_node(*x), "%x : [users=1] = placeholder[target=x]");
}

TEST(Printer, PythonCode) {
  GraphModule gm = sample_module();
  testing::expect_golden("printer_python_code.py", python_code(gm));
}

TEST(Printer, PythonCodeUnpacksNestedInputs) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* a = g.placeholder("ph_0");
  Node* b = g.placeholder("ph_1");
  Node* c = g.placeholder("ph_2");
  Node* s = g.call_function("aten::add.Tensor", {a, b});
  Node* attr = g.get_attr("layer1.0.conv.weight");
  Node* s2 = g.call_function("aten::add.Tensor", {s, c});
  Node* s3 = g.call_function("aten::add.Tensor", {s2, attr});
  g.output({s3});
  // forward(x, (y, {'k': z}), 3, None)
  gm.set_specs(
      TreeSpec::tuple(
          {TreeSpec::leaf(),
           TreeSpec::tuple({TreeSpec::leaf(), TreeSpec::dict({c10::IValue("k")}, {TreeSpec::leaf()})}),
           TreeSpec::constant(3), TreeSpec::none()}),
      TreeSpec::leaf());
  testing::expect_golden("printer_python_nested.py", python_code(gm));
}

TEST(Printer, PythonFloatRepr) {
  EXPECT_EQ(detail::python_float_repr(1.0), "1.0");
  EXPECT_EQ(detail::python_float_repr(0.1), "0.1");
  EXPECT_EQ(detail::python_float_repr(-2.5), "-2.5");
  EXPECT_EQ(detail::python_float_repr(1e-5), "1e-05");
  EXPECT_EQ(detail::python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(detail::python_float_repr(123456789.0), "123456789.0");
  EXPECT_EQ(detail::python_float_repr(1e16), "1e+16");
  EXPECT_EQ(detail::python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(detail::python_float_repr(1.5e300), "1.5e+300");
  EXPECT_EQ(detail::python_float_repr(3.14159), "3.14159");
  EXPECT_EQ(detail::python_float_repr(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(detail::python_float_repr(0.0), "0.0");
  EXPECT_EQ(detail::python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(detail::python_float_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(detail::python_float_repr(std::nan("")), "nan");
  EXPECT_EQ(detail::python_float_repr(5e-324), "5e-324");
}

TEST(Printer, ArgumentLiterals) {
  EXPECT_EQ(format_argument(Argument()), "None");
  EXPECT_EQ(format_argument(Argument(true)), "True");
  EXPECT_EQ(format_argument(Argument("it's")), "'it\\'s'");
  EXPECT_EQ(format_argument(Argument(c10::kLong)), "torch.int64");
  EXPECT_EQ(format_argument(Argument(c10::kBool)), "torch.bool");
  EXPECT_EQ(format_argument(Argument(c10::MemoryFormat::ChannelsLast)), "torch.channels_last");
  EXPECT_EQ(format_argument(Argument(c10::Device(c10::kCUDA, 1))),
            "device(type='cuda', index=1)");
  EXPECT_EQ(format_argument(Argument(ArgumentList{1, ArgumentList{}, 2.0})), "[1, [], 2.0]");
}

TEST(Printer, IsDeterministic) {
  EXPECT_EQ(sample_module().graph().str(), sample_module().graph().str());
  EXPECT_EQ(python_code(sample_module()), python_code(sample_module()));
}

}  // namespace
}  // namespace torchcap
