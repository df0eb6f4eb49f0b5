// Writes what tests/python/test_load.py checks: `.tcg` files saved in C++ and,
// beside them, the inputs and the eager C++ results they must reproduce in
// Python. Tensors travel as pickles (torch.load reads them).
//
//   load_fixture OUT_DIR
//
// OUT_DIR/examples.txt      the example names, one a line; for each NAME:
//   NAME.tcg                the example traced and saved
//   NAME.inputs.pt          its inputs (a tuple)
//   NAME.expected.pt        what the program returns eagerly on them
// OUT_DIR/attributes.tcg, attributes.pt   a module with attributes of every
//                                         kind and dtype; their values by name
// OUT_DIR/arguments.tcg     every argument kind (not runnable: CUDA devices)
// OUT_DIR/nested.tcg        nested specs with constants, dicts and none
// OUT_DIR/small.tcg         the small module the damaged-file tests start from
// OUT_DIR/exported_bn.tcg   cnn_bn_train exported: its running stats are outputs
//   exported_bn.inputs.pt, .expected.pt, .buffers.pt (the eager module's
//   buffers after the run, by name)
// OUT_DIR/exported_input.tcg  a program that writes into its input, exported
//   exported_input.inputs.pt, .expected.pt, .input_after.pt
// OUT_DIR/odd_names.tcg     attributes named as torch.nn allows but Python
//   identifiers do not (odd_names_module); odd_names.inputs.pt, .expected.pt
// OUT_DIR/weightless.tcg    weightless_module: `w` saved without its bytes
//   (version 1.3); weightless.weights.pt ({"w": its values}), .inputs.pt,
//   .expected.pt
// OUT_DIR/custom_op.tcg     a call of the custom operator torchcap_fixture::scale
//   (registered here; Python registers its own); custom_op.inputs.pt, .expected.pt
#include <torchcap/export.h>
#include <torchcap/interpreter.h>
#include <torchcap/serialize.h>

#include "serialize_fixtures.h"
#include "zoo.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/library.h>

#include <fstream>
#include <iostream>

namespace {

void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

c10::IValue writes_its_input(std::vector<c10::IValue> in) {
  at::Tensor x = in[0].toTensor();
  x.mul_(2);
  x.view({-1}).add_(1);
  return c10::IValue(x.sum(0));
}

// The eager results of a traced program's graph, run by the interpreter, with
// its inputs, beside `NAME.tcg`.
void save_with_run(const torchcap::GraphModule& gm, const std::string& dir,
                   const std::string& name, std::vector<at::Tensor> inputs) {
  torchcap::save(gm, dir + "/" + name + ".tcg");
  std::vector<c10::IValue> args(inputs.begin(), inputs.end());
  write_file(dir + "/" + name + ".inputs.pt",
             torch::jit::pickle_save(c10::ivalue::Tuple::create(args)));
  write_file(dir + "/" + name + ".expected.pt",
             torch::jit::pickle_save(torchcap::Interpreter(gm).run_flat(inputs)[0]));
}

at::Tensor scale(const at::Tensor& x, double s) { return x * s; }

}  // namespace

TORCH_LIBRARY(torchcap_fixture, m) { m.def("scale(Tensor x, float s) -> Tensor", &scale); }

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: load_fixture OUT_DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  namespace examples = torchcap::examples;

  std::ofstream names(dir + "/examples.txt");
  for (const std::string& name : examples::names()) {
    examples::Example traced = examples::make(name);
    torchcap::save(examples::trace(traced), dir + "/" + name + ".tcg");
    // Fresh weights and inputs for the eager run: tracing a model in train
    // mode updates its buffers.
    examples::Example eager = examples::make(name);
    std::vector<c10::IValue> inputs = eager.make_inputs(1);
    write_file(dir + "/" + name + ".inputs.pt",
               torch::jit::pickle_save(c10::ivalue::Tuple::create(inputs)));
    write_file(dir + "/" + name + ".expected.pt", torch::jit::pickle_save(eager.forward(inputs)));
    names << name << "\n";
  }

  torchcap::GraphModule attributes = torchcap::testing::attribute_zoo_module();
  torchcap::save(attributes, dir + "/attributes.tcg");
  c10::impl::GenericDict values(c10::StringType::get(), c10::TensorType::get());
  for (const torchcap::Attribute& a : attributes.attributes()) {
    // The pickler has no complex32; Python checks that one by its bytes.
    if (!a.value.defined() || a.value.scalar_type() == at::kComplexHalf) continue;
    values.insert(a.name, a.value.resolve_conj().contiguous());
  }
  write_file(dir + "/attributes.pt", torch::jit::pickle_save(values));

  torchcap::save(torchcap::testing::every_argument_module(), dir + "/arguments.tcg");
  torchcap::save(torchcap::testing::nested_spec_module(), dir + "/nested.tcg");
  torchcap::save(torchcap::testing::small_module(), dir + "/small.tcg");

  {
    examples::Example e = examples::make("cnn_bn_train");
    torchcap::save(torchcap::export_program(*e.module, e.forward, e.make_inputs(0)),
                   dir + "/exported_bn.tcg");
    examples::Example eager = examples::make("cnn_bn_train");
    std::vector<c10::IValue> inputs = eager.make_inputs(1);
    write_file(dir + "/exported_bn.inputs.pt",
               torch::jit::pickle_save(c10::ivalue::Tuple::create(inputs)));
    write_file(dir + "/exported_bn.expected.pt", torch::jit::pickle_save(eager.forward(inputs)));
    c10::impl::GenericDict buffers(c10::StringType::get(), c10::TensorType::get());
    for (const auto& [name, value] : examples::named_buffers(eager)) buffers.insert(name, value);
    write_file(dir + "/exported_bn.buffers.pt", torch::jit::pickle_save(buffers));
  }
  {
    at::manual_seed(5);
    torchcap::save(torchcap::export_program(writes_its_input, {at::randn({3, 2})}),
                   dir + "/exported_input.tcg");
    at::Tensor x = at::randn({3, 2});
    write_file(dir + "/exported_input.inputs.pt",
               torch::jit::pickle_save(c10::ivalue::Tuple::create({x.clone()})));
    c10::IValue expected = writes_its_input({x});
    write_file(dir + "/exported_input.expected.pt", torch::jit::pickle_save(expected));
    write_file(dir + "/exported_input.input_after.pt", torch::jit::pickle_save(x));
  }
  {
    torchcap::GraphModule full = torchcap::testing::weightless_module_bound();
    torchcap::save(torchcap::testing::weightless_module(), dir + "/weightless.tcg");
    c10::impl::GenericDict weights(c10::StringType::get(), c10::TensorType::get());
    weights.insert("w", full.attribute("w").value);
    write_file(dir + "/weightless.weights.pt", torch::jit::pickle_save(weights));
    at::manual_seed(7);
    at::Tensor x = at::randn({2, 3});
    write_file(dir + "/weightless.inputs.pt",
               torch::jit::pickle_save(c10::ivalue::Tuple::create({x})));
    write_file(dir + "/weightless.expected.pt",
               torch::jit::pickle_save(torchcap::Interpreter(full).run_flat({x})[0]));
  }
  at::manual_seed(11);
  save_with_run(torchcap::testing::odd_names_module(), dir, "odd_names", {at::randn({3})});
  save_with_run(torchcap::testing::custom_operator_module(), dir, "custom_op", {at::randn({4})});
  return 0;
}
