// A small operator library for the tests of torchcap::load_library and
// --library: registers torchcap_test::scale_add(x, y, alpha) = x + alpha * y
// (CPU) when loaded, as torchvision's _C.so registers torchvision::nms.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

at::Tensor scale_add(const at::Tensor& x, const at::Tensor& y, double alpha) {
  return x + y * alpha;
}

}  // namespace

TORCH_LIBRARY(torchcap_test, m) {
  m.def("scale_add(Tensor x, Tensor y, float alpha) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchcap_test, CPU, m) {
  m.impl("scale_add", &scale_add);
}
