#include "kernels/meta_kernels.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <vector>

namespace torchcap {
namespace detail {
namespace {

using Stack = std::vector<c10::IValue>;

// The last `n` arguments, popped.
std::vector<c10::IValue> take(Stack* s, size_t n) {
  std::vector<c10::IValue> args(s->end() - n, s->end());
  s->erase(s->end() - n, s->end());
  return args;
}

at::Tensor like(const at::Tensor& t) { return at::empty_like(t, t.suggest_memory_format()); }

void relu_meta(const c10::OperatorHandle&, c10::DispatchKeySet, Stack* s) {
  auto a = take(s, 1);
  s->emplace_back(like(a[0].toTensor()));
}

// (input, weight, bias, running_mean, running_var, training, momentum, eps)
void native_batch_norm_meta(const c10::OperatorHandle&, c10::DispatchKeySet, Stack* s) {
  auto a = take(s, 8);
  const at::Tensor& input = a[0].toTensor();
  TORCH_CHECK(input.dim() >= 2, "native_batch_norm: input must have at least 2 dimensions");
  int64_t saved = a[5].toBool() ? input.size(1) : 0;  // eval keeps no batch statistics
  s->emplace_back(like(input));
  s->emplace_back(at::empty({saved}, input.options()));
  s->emplace_back(at::empty({saved}, input.options()));
}

// (self, dim: int[1]?, correction: int?, keepdim: bool)
void var_correction_meta(const c10::OperatorHandle&, c10::DispatchKeySet, Stack* s) {
  auto a = take(s, 4);
  const at::Tensor& self = a[0].toTensor();
  const bool keepdim = a[3].toBool();
  std::vector<bool> reduced(self.dim(), a[1].isNone());
  if (!a[1].isNone()) {
    for (int64_t d : a[1].toIntVector()) reduced[c10::maybe_wrap_dim(d, self.dim())] = true;
    if (a[1].toIntVector().empty()) reduced.assign(self.dim(), true);
  }
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (!reduced[d]) {
      shape.push_back(self.size(d));
    } else if (keepdim) {
      shape.push_back(1);
    }
  }
  s->emplace_back(at::empty(shape, self.options().dtype(c10::toRealValueType(self.scalar_type()))));
}

// (self, dim, index)
void index_select_meta(const c10::OperatorHandle&, c10::DispatchKeySet, Stack* s) {
  auto a = take(s, 3);
  const at::Tensor& self = a[0].toTensor();
  const at::Tensor& index = a[2].toTensor();
  std::vector<int64_t> shape = self.sizes().vec();
  if (!shape.empty()) shape[c10::maybe_wrap_dim(a[1].toInt(), self.dim())] = index.numel();
  s->emplace_back(at::empty(shape, self.options()));
}

// (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
void convolution_meta(const c10::OperatorHandle&, c10::DispatchKeySet, Stack* s) {
  auto a = take(s, 9);
  const at::Tensor& input = a[0].toTensor();
  const at::Tensor& weight = a[1].toTensor();
  auto stride = a[3].toIntVector();
  auto padding = a[4].toIntVector();
  auto dilation = a[5].toIntVector();
  const bool transposed = a[6].toBool();
  auto output_padding = a[7].toIntVector();
  const int64_t groups = a[8].toInt();
  auto pick = [](const std::vector<int64_t>& v, int64_t i) {
    return v.empty() ? 0 : v[std::min<int64_t>(i, static_cast<int64_t>(v.size()) - 1)];
  };
  std::vector<int64_t> shape = {input.size(0), transposed ? weight.size(1) * groups : weight.size(0)};
  for (int64_t d = 0; d + 2 < input.dim(); ++d) {
    int64_t in = input.size(d + 2), k = weight.size(d + 2);
    int64_t st = pick(stride, d), pad = pick(padding, d), dil = pick(dilation, d);
    shape.push_back(transposed ? (in - 1) * st - 2 * pad + dil * (k - 1) + pick(output_padding, d) + 1
                               : (in + 2 * pad - dil * (k - 1) - 1) / st + 1);
  }
  s->emplace_back(at::empty(shape, input.options().memory_format(input.suggest_memory_format())));
}

}  // namespace

template <void (*Kernel)(const c10::OperatorHandle&, c10::DispatchKeySet, Stack*)>
void register_meta(const c10::OperatorName& name, std::vector<c10::RegistrationHandleRAII>& handles) {
  auto& d = c10::Dispatcher::singleton();
  auto op = d.findSchema(name);
  if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::Meta)) return;  // LibTorch has one
  handles.push_back(d.registerImpl(name, c10::DispatchKey::Meta,
                                   c10::KernelFunction::makeFromBoxedFunction<Kernel>(),
                                   c10::nullopt, nullptr, "torchcap meta kernel"));
}

void ensure_meta_kernels() {
  // Note [Registrations for the life of the process] (src/trace/dispatch.cpp)
  static auto* const handles = new std::vector<c10::RegistrationHandleRAII>();
  static std::once_flag once;
  std::call_once(once, [] {
    register_meta<&relu_meta>({"aten::relu", ""}, *handles);
    register_meta<&native_batch_norm_meta>({"aten::native_batch_norm", ""}, *handles);
    register_meta<&var_correction_meta>({"aten::var", "correction"}, *handles);
    register_meta<&index_select_meta>({"aten::index_select", ""}, *handles);
    register_meta<&convolution_meta>({"aten::convolution", ""}, *handles);
  });
}

}  // namespace detail
}  // namespace torchcap
