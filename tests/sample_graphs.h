// Hand-built graphs shared by the printer test and the Python code fixture.
#pragma once

#include <torchcap/graph_module.h>

#include <ATen/ops/zeros.h>

namespace torchcap::testing {

inline TensorMeta meta(c10::ScalarType t, std::vector<int64_t> sizes) {
  TensorMeta m;
  m.dtype = t;
  m.sizes = sizes;
  m.strides.assign(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;) m.strides[i - 1] = m.strides[i] * sizes[i];
  return m;
}

// A graph that uses every kind of argument and every opcode.
inline GraphModule sample_module() {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("ph_0");
  Node* idx = g.placeholder("ph_1");  // gathered from by index
  Node* w = g.get_attr("fc.weight");
  Node* b = g.get_attr("fc.bias");
  Node* t = g.call_function("aten::t", {w});
  Node* addmm = g.call_function("aten::addmm", {b, x, t});
  Node* top = g.call_function("aten::topk", {addmm, 3}, {{"largest", false}});
  Node* vals = g.getitem(top, 0);
  Node* ind = g.getitem(top, 1);
  Node* zeros = g.call_function(
      "aten::zeros", {Argument(ArgumentList{2, 3})},
      {{"dtype", c10::kFloat}, {"layout", c10::kStrided}, {"device", c10::Device(c10::kCPU)},
       {"pin_memory", false}});
  Node* add = g.call_function("aten::add.Tensor", {vals, zeros}, {{"alpha", 0.5}});
  Node* div = g.call_function("aten::div.Scalar_mode", {add, 1e-5}, {{"rounding_mode", "floor"}});
  Node* cat = g.call_function("aten::cat", {ArgumentList{add, div}, -1});
  Node* cont = g.call_function("aten::contiguous", {cat},
                               {{"memory_format", c10::MemoryFormat::Contiguous}});
  Node* gathered = g.call_function("aten::gather", {idx, 1, ind});
  Node* clamp = g.call_function("aten::clamp", {cont, Argument(), 1e20});
  g.output({clamp, gathered});
  gm.set_specs(TreeSpec::tuple({TreeSpec::leaf(), TreeSpec::leaf()}),
               TreeSpec::tuple({TreeSpec::leaf(),
                                TreeSpec::dict({c10::IValue("indices"), c10::IValue("none")},
                                               {TreeSpec::leaf(), TreeSpec::none()})}));

  gm.set_attribute("fc.weight", at::zeros({5, 4}), AttributeKind::Parameter);
  gm.set_attribute("fc.bias", at::zeros({5}), AttributeKind::Parameter);

  x->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 4}));
  idx->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 5}));
  w->meta().val = ValueMeta::tensor(meta(c10::kFloat, {5, 4}));
  b->meta().val = ValueMeta::tensor(meta(c10::kFloat, {5}));
  t->meta().val = ValueMeta::tensor(TensorMeta{c10::kFloat, {4, 5}, {1, 4}, c10::kCPU, nullptr});
  addmm->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 5}));
  top->meta().val =
      ValueMeta{ValueKind::Tuple, {meta(c10::kFloat, {2, 3}), meta(c10::kLong, {2, 3})}};
  vals->meta().val = ValueMeta::tensor(meta(c10::kFloat, {2, 3}));
  ind->meta().val = ValueMeta::tensor(meta(c10::kLong, {2, 3}));
  return gm;
}

}  // namespace torchcap::testing
