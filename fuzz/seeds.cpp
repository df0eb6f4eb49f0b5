// The fuzzers' seeds (harness.h): valid files, made when asked for.
#include "harness.h"

#include <torchcap/serialize.h>
#include <torchcap/tracer.h>
#include <torchcap/training.h>

#include "serialize_fixtures.h"
#include "zoo.h"

#include <ATen/ATen.h>

namespace torchcap::fuzz {
namespace {

// The operators Note [Integers kernels divide by] is about, each with valid
// arguments, traced: what a mutation turns into the files that crashed.
c10::IValue kernels_program(std::vector<c10::IValue> in) {
  const at::Tensor x = in[0].toTensor();    // 1 x 4 x 8 x 8
  const at::Tensor w = in[1].toTensor();    // 4 x 2 x 3 x 3: two groups
  const at::Tensor idx = in[2].toTensor();  // int64 [4], values in [0, 10)
  at::Tensor y = at::conv2d(x, w, {}, {1, 1}, {1, 1}, {1, 1}, 2);
  y = at::max_pool2d(y, {2, 2}, {2, 2});  // 1 x 4 x 4 x 4
  y = y + at::avg_pool2d(y, {3, 3}, {1, 1}, {1, 1});
  at::Tensor s = at::pixel_unshuffle(at::pixel_shuffle(y, 2), 2);
  s = at::channel_shuffle(s, 2);
  s = at::conv_transpose2d(s, w, {}, {2, 2}, {1, 1}, {1, 1}, 1);
  s = at::adaptive_avg_pool2d(s, {4, 4});  // 1 x 2 x 4 x 4
  at::Tensor cols = at::im2col(s, {2, 2}, {1, 1}, {0, 0}, {1, 1});
  at::Tensor up = at::group_norm(at::upsample_nearest2d(s, {8, 8}), 2);
  at::Tensor unfolded = up.unfold(3, 2, 2).reshape({2, -1});
  at::Tensor bag = std::get<0>(at::embedding_bag(w.reshape({-1, 2}).narrow(0, 0, 10), idx,
                                                 at::zeros({1}, at::kLong), false, 1));
  at::Tensor made =
      at::arange(0, 8, 2, x.options()) + at::full({4}, 0.5, x.options()) + x.new_zeros({4});
  at::Tensor rep = made.repeat({2}).expand({3, 8}).slice(1, 0, 8, 3);
  std::vector<at::Tensor> parts = at::split_with_sizes(cols, {1, 7}, 1);
  at::Tensor chunked = at::chunk(up, 2, 1)[1].select(1, 0).tril(1);
  return c10::ivalue::Tuple::create(
      {y, cols.sum(), unfolded, bag, rep, parts[1], chunked, at::roll(made, {1}, {0}).flip({0})});
}

GraphModule kernels_module() {
  at::manual_seed(11);
  return trace(kernels_program, {at::randn({1, 4, 8, 8}), at::randn({4, 2, 3, 3}),
                                 at::tensor({0, 3, 9, 4}, at::kLong)});
}

TensorMeta contiguous(c10::ScalarType dtype, std::vector<int64_t> sizes) {
  TensorMeta m{dtype, {}, {}, c10::Device(c10::kCPU), nullptr};
  m.sizes.assign(sizes.begin(), sizes.end());
  m.strides.resize(sizes.size());
  int64_t stride = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    m.strides[d] = stride;
    stride *= std::max<int64_t>(sizes[d], 1);
  }
  return m;
}

// One call of `target` on placeholders of the given recorded shapes (the
// arguments name them as x[i]), returning its first tensor. Small graphs whose
// every integer a mutation reaches often: the operators that crashed.
GraphModule one_call(const char* target, const std::vector<TensorMeta>& inputs,
                     const std::function<ArgumentList(const std::vector<Node*>&)>& args) {
  GraphModule gm;
  Graph& g = gm.graph();
  std::vector<Node*> x;
  for (size_t i = 0; i < inputs.size(); ++i) {
    x.push_back(g.placeholder("x" + std::to_string(i)));
    x.back()->meta().val = ValueMeta::tensor(inputs[i]);
  }
  Node* call = g.call_function(target, args(x), {}, "call");
  const auto& returns = call->schema().returns();
  const bool one = returns.size() == 1 && returns[0].type()->kind() == c10::TypeKind::TensorType;
  g.output({one ? call : g.getitem(call, 0, "first")});
  gm.set_flat_specs();
  return gm;
}

std::vector<std::pair<std::string, GraphModule>> one_calls() {
  using A = ArgumentList;
  using X = const std::vector<Node*>&;
  const auto f32 = c10::kFloat;
  const auto i64 = c10::kLong;
  std::vector<std::pair<std::string, GraphModule>> out;
  out.emplace_back("convolution_backward",
                   one_call("aten::convolution_backward",
                            {contiguous(f32, {1, 4, 4, 4}), contiguous(f32, {1, 2, 6, 6}),
                             contiguous(f32, {4, 1, 3, 3})},
                            [](X x) {
                              return A{x[0],
                                       x[1],
                                       x[2],
                                       A{4},
                                       A{1, 1},
                                       A{0, 0},
                                       A{1, 1},
                                       false,
                                       A{0, 0},
                                       2,
                                       A{true, true, true}};
                            }));
  out.emplace_back(
      "convolution",
      one_call("aten::convolution", {contiguous(f32, {1, 2, 6, 6}), contiguous(f32, {4, 1, 3, 3})},
               [](X x) {
                 return A{x[0], x[1], Argument(), A{1, 1}, A{1, 1}, A{1, 1}, false, A{0, 0}, 2};
               }));
  out.emplace_back("native_channel_shuffle", one_call("aten::native_channel_shuffle",
                                                      {contiguous(f32, {1, 4, 2, 2})}, [](X x) {
                                                        return A{x[0], 2};
                                                      }));
  out.emplace_back("pixel_shuffle",
                   one_call("aten::pixel_shuffle", {contiguous(f32, {1, 4, 2, 2})}, [](X x) {
                     return A{x[0], 2};
                   }));
  out.emplace_back("unfold_backward",
                   one_call("aten::unfold_backward", {contiguous(f32, {2, 3, 4, 2})}, [](X x) {
                     return A{x[0], A{2, 3, 8}, 2, 2, 2};
                   }));
  out.emplace_back("multi_head_attention",
                   one_call("aten::_native_multi_head_attention",
                            {contiguous(f32, {1, 3, 4}), contiguous(f32, {12, 4}),
                             contiguous(f32, {12}), contiguous(f32, {4, 4}), contiguous(f32, {4})},
                            [](X x) { return A{x[0], x[0], x[0], 4, 2, x[1], x[2], x[3], x[4]}; }));
  out.emplace_back("transform_bias_rescale_qkv",
                   one_call("aten::_transform_bias_rescale_qkv",
                            {contiguous(f32, {1, 3, 12}), contiguous(f32, {12})}, [](X x) {
                              return A{x[0], x[1], 2};
                            }));
  out.emplace_back(
      "embedding_bag",
      one_call("aten::embedding_bag",
               {contiguous(f32, {10, 3}), contiguous(i64, {4}), contiguous(i64, {2})}, [](X x) {
                 return A{x[0], x[1], x[2], false, 1};
               }));
  out.emplace_back(
      "slow_conv2d_forward",
      one_call("aten::_slow_conv2d_forward",
               {contiguous(f32, {1, 2, 5, 5}), contiguous(f32, {3, 2, 3, 3})}, [](X x) {
                 return A{x[0], x[1], A{3, 3}, Argument(), A{1, 1}, A{1, 1}};
               }));
  out.emplace_back(
      "mkldnn_convolution",
      one_call("aten::mkldnn_convolution",
               {contiguous(f32, {1, 2, 5, 5}), contiguous(f32, {3, 2, 3, 3})}, [](X x) {
                 return A{x[0], x[1], Argument(), A{1, 1}, A{1, 1}, A{1, 1}, 1};
               }));
  out.emplace_back("reshape_alias",
                   one_call("aten::_reshape_alias", {contiguous(f32, {2, 3})}, [](X x) {
                     return A{x[0], A{3, 2}, A{2, 1}};
                   }));
  out.emplace_back("avg_pool2d",
                   one_call("aten::avg_pool2d", {contiguous(f32, {1, 2, 6, 6})}, [](X x) {
                     return A{x[0], A{3, 3}, A{2, 2}, A{1, 1}, false, true, 2};
                   }));
  return out;
}

// A training step: backward operators (convolution_backward, pooling's).
GraphModule training_step() {
  examples::Example e = examples::make("cnn_bn_train");
  std::vector<c10::IValue> inputs = e.make_inputs(0);
  at::Tensor out = e.forward(inputs).toTensor();
  return export_training(*e.module, e.forward, losses::mse(), inputs, {at::zeros_like(out)});
}

}  // namespace

std::vector<Seed> seed_files() {
  namespace t = torchcap::testing;
  std::vector<Seed> out;
  auto add = [&](const std::string& name, const GraphModule& gm) {
    out.push_back(Seed{name, save_to_string(gm)});
  };
  add("small", t::small_module());
  add("arguments", t::every_argument_module());
  add("nested", t::nested_spec_module());
  add("attributes", t::attribute_zoo_module());
  add("signature", t::signature_module());
  add("weightless", t::weightless_module());
  for (const char* name : {"cnn_bn_eval", "cnn_bn_train", "factories", "inplace_ops", "lstm", "mlp",
                           "multi_output", "nested_io", "tied_weights", "transformer_encoder"}) {
    examples::Example e = examples::make(name);
    add(std::string("zoo_") + name, examples::trace(e));
  }
  add("training_step", training_step());
  add("kernels", kernels_module());
  for (const auto& [name, gm] : one_calls()) add("call_" + name, gm);
  return out;
}

}  // namespace torchcap::fuzz
