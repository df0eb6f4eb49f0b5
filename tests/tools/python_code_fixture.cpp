// Writes what tests/python/test_python_code.py checks: the Python code of the
// sample GraphModule, its attributes and inputs, and the outputs of the same
// ops run eagerly in C++. Tensors travel as pickles (torch.load reads them).
// Beside them, for NAME in odd_names (attribute names that are not Python
// identifiers) and custom_op (a custom operator, registered here):
// NAME.py, NAME.attributes.pt, NAME.inputs.pt and NAME.expected.pt, the
// interpreter's results.
//
//   python_code_fixture OUT_DIR
#include <torchcap/printer.h>

#include <torchcap/interpreter.h>

#include "sample_graphs.h"
#include "serialize_fixtures.h"

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

void write_case(const std::string& dir, const std::string& name, const torchcap::GraphModule& gm,
                const at::Tensor& input) {
  std::ofstream(dir + "/" + name + ".py") << torchcap::python_code(gm);
  c10::Dict<std::string, at::Tensor> attributes;
  for (const torchcap::Attribute& a : gm.attributes()) attributes.insert(a.name, a.value);
  write_file(dir + "/" + name + ".attributes.pt", torch::jit::pickle_save(attributes));
  write_file(dir + "/" + name + ".inputs.pt",
             torch::jit::pickle_save(c10::ivalue::Tuple::create({input})));
  write_file(dir + "/" + name + ".expected.pt",
             torch::jit::pickle_save(torchcap::Interpreter(gm).run_flat({input})[0]));
}

at::Tensor scale(const at::Tensor& x, double s) { return x * s; }

}  // namespace

TORCH_LIBRARY(torchcap_fixture, m) { m.def("scale(Tensor x, float s) -> Tensor", &scale); }

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: python_code_fixture OUT_DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  at::manual_seed(0);
  at::Tensor x = at::randn({2, 4});
  at::Tensor src = at::randn({2, 5});
  at::Tensor weight = at::randn({5, 4});
  at::Tensor bias = at::randn({5});

  // The sample graph's ops, eagerly.
  at::Tensor addmm = at::addmm(bias, x, weight.t());
  auto [vals, ind] = at::topk(addmm, 3, -1, /*largest=*/false);
  at::Tensor add = at::add(vals, at::zeros({2, 3}), 0.5);
  at::Tensor div = at::div(add, 1e-5, "floor");
  at::Tensor clamp = at::clamp(at::cat({add, div}, -1).contiguous(), c10::nullopt, 1e20);
  at::Tensor gathered = at::gather(src, 1, ind);

  c10::Dict<std::string, at::Tensor> attributes;
  attributes.insert("fc.weight", weight);
  attributes.insert("fc.bias", bias);
  c10::impl::GenericDict second(c10::StringType::get(), c10::AnyType::get());
  second.insert("indices", gathered);
  second.insert("none", c10::IValue());

  std::ofstream(dir + "/code.py") << torchcap::python_code(torchcap::testing::sample_module());
  write_file(dir + "/attributes.pt", torch::jit::pickle_save(attributes));
  write_file(dir + "/inputs.pt", torch::jit::pickle_save(c10::ivalue::Tuple::create({x, src})));
  write_file(dir + "/expected.pt",
             torch::jit::pickle_save(c10::ivalue::Tuple::create({clamp, second})));
  write_case(dir, "odd_names", torchcap::testing::odd_names_module(), at::randn({3}));
  write_case(dir, "custom_op", torchcap::testing::custom_operator_module(), at::randn({4}));
  return 0;
}
