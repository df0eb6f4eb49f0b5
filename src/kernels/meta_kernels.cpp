#include "kernels/meta_kernels.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/result_type.h>
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

// (input, normalized_shape, weight, bias, eps), as LibTorch's CPU kernel: a
// contiguous output; mean and rstd of the input's dtype, shaped like the
// input with the normalized dimensions kept as 1.
void native_layer_norm_meta(const c10::OperatorHandle&, c10::DispatchKeySet, Stack* s) {
  auto a = take(s, 5);
  const at::Tensor& input = a[0].toTensor();
  const int64_t normalized = static_cast<int64_t>(a[1].toIntVector().size());
  TORCH_CHECK(normalized <= input.dim(), "native_layer_norm: normalized_shape has more dimensions "
                                         "than the input");
  std::vector<int64_t> stat_shape = input.sizes().vec();
  for (int64_t d = input.dim() - normalized; d < input.dim(); ++d) stat_shape[d] = 1;
  s->emplace_back(at::empty(input.sizes(), input.options()));
  s->emplace_back(at::empty(stat_shape, input.options()));
  s->emplace_back(at::empty(stat_shape, input.options()));
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
  // The CPU kernel's checks of how the operands fit (check_shape_forward).
  TORCH_CHECK(input.dim() >= 3 && weight.dim() == input.dim(), "convolution: expected a weight of ",
              input.dim(), " dimensions for an input of sizes ", input.sizes(), ", got weight of sizes ",
              weight.sizes());
  TORCH_CHECK(groups > 0, "non-positive groups is not supported");
  const int64_t channels = transposed ? weight.size(0) : weight.size(1) * groups;
  TORCH_CHECK(input.size(1) == channels, "Given groups=", groups, ", weight of size ", weight.sizes(),
              ", expected input", input.sizes(), " to have ", channels, " channels, but got ",
              input.size(1), " channels instead");
  TORCH_CHECK(transposed || weight.size(0) % groups == 0, "Given groups=", groups,
              ", expected weight to be divisible by ", groups, " at dimension 0, but got weight of size ",
              weight.sizes(), " instead");
  std::vector<int64_t> shape = {input.size(0), transposed ? weight.size(1) * groups : weight.size(0)};
  // No bias: none, or (a trace's stand-in for an undefined tensor) empty.
  if (!a[2].isNone() && a[2].toTensor().defined() && a[2].toTensor().numel() != 0) {
    const at::Tensor& bias = a[2].toTensor();
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == shape[1], "Given weight of size ", weight.sizes(),
                ", expected bias to be 1-dimensional with ", shape[1], " elements, but got bias of size ",
                bias.sizes(), " instead");
  }
  for (int64_t d = 0; d + 2 < input.dim(); ++d) {
    int64_t in = input.size(d + 2), k = weight.size(d + 2);
    int64_t st = pick(stride, d), pad = pick(padding, d), dil = pick(dilation, d);
    const int64_t out = transposed ? (in - 1) * st - 2 * pad + dil * (k - 1) + pick(output_padding, d) + 1
                                   : (in + 2 * pad - dil * (k - 1) - 1) / st + 1;
    TORCH_CHECK(out > 0 && in + 2 * pad >= dil * (k - 1) + 1, "Calculated output size is too small "
                "for input of sizes ", input.sizes(), " and weight of sizes ", weight.sizes());
    shape.push_back(out);
  }
  s->emplace_back(at::empty(shape, input.options().memory_format(input.suggest_memory_format())));
}

// (condition, self, other): the three broadcast together, self and other
// promoted; the CPU kernel's checks of the condition's dtype.
void where_self_meta(const c10::OperatorHandle&, c10::DispatchKeySet, Stack* s) {
  auto a = take(s, 3);
  const at::Tensor& condition = a[0].toTensor();
  const at::Tensor& self = a[1].toTensor();
  const at::Tensor& other = a[2].toTensor();
  TORCH_CHECK(condition.scalar_type() == c10::kBool || condition.scalar_type() == c10::kByte,
              "where expected condition to be a boolean tensor, but got a tensor with dtype ",
              condition.scalar_type());
  at::DimVector shape = at::infer_size_dimvector(condition.sizes(), self.sizes());
  shape = at::infer_size_dimvector(shape, other.sizes());
  s->emplace_back(at::empty(shape, self.options().dtype(at::result_type(self, other))));
}

// (self, shifts, dims): like LibTorch's CPU kernel, a contiguous result.
void roll_meta(const c10::OperatorHandle&, c10::DispatchKeySet, Stack* s) {
  auto a = take(s, 3);
  const at::Tensor& self = a[0].toTensor();
  s->emplace_back(at::empty(self.sizes(), self.options()));
}

// (query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
//  proj_bias, mask, need_weights, average_attn_weights, mask_type):
// nn.MultiheadAttention's inference fast path. Query, key and value are
// N x T x E (batch first); the weights are N x heads x T x S, averaged
// over the heads when asked, and not computed (undefined) when not needed.
void native_multi_head_attention_meta(const c10::OperatorHandle&, c10::DispatchKeySet, Stack* s) {
  auto a = take(s, 13);
  const at::Tensor& query = a[0].toTensor();
  const at::Tensor& key = a[1].toTensor();
  const int64_t heads = a[4].toInt();
  const at::Tensor& proj_weight = a[7].toTensor();
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3,
              "_native_multi_head_attention: expected 3-D query and key");
  const int64_t n = query.size(0), t = query.size(1), src = key.size(1);
  s->emplace_back(at::empty({n, t, proj_weight.size(0)}, query.options()));
  if (!a[10].toBool()) {
    s->emplace_back(at::Tensor());
  } else if (a[11].toBool()) {
    s->emplace_back(at::empty({n, t, src}, query.options()));
  } else {
    s->emplace_back(at::empty({n, heads, t, src}, query.options()));
  }
}

// (src, embed_dim, num_heads, ...18 more): nn.TransformerEncoderLayer's
// inference fast path; the result is shaped like src.
void transformer_encoder_layer_fwd_meta(const c10::OperatorHandle&, c10::DispatchKeySet, Stack* s) {
  auto a = take(s, 20);
  const at::Tensor& src = a[0].toTensor();
  s->emplace_back(at::empty(src.sizes(), src.options()));
}

}  // namespace

class IgnoreWarnings : public c10::WarningHandler {
 public:
  void process(const c10::SourceLocation&, const std::string&, const bool) override {}
};

// Whether a kernel already registered for the meta key is kept.
enum class Existing { Keep, Replace };

// Note [Meta kernels that must match the CPU kernel]
// A meta-mode trace records the metadata the meta kernels give, which must
// be what the CPU kernels give in a real trace. In a Python process, torch
// registers Python meta kernels (decompositions) at import for many
// operators, replacing LibTorch's; for native_batch_norm and
// native_layer_norm their auxiliary results (saved statistics) differ from
// the CPU kernel's. torchcap's kernels for these replace whatever is
// registered (LibTorch's warning about replacing a kernel is not shown).
template <void (*Kernel)(const c10::OperatorHandle&, c10::DispatchKeySet, Stack*)>
void register_meta(const c10::OperatorName& name, std::vector<c10::RegistrationHandleRAII>& handles,
                   Existing existing = Existing::Keep) {
  auto& d = c10::Dispatcher::singleton();
  auto op = d.findSchema(name);
  if (!op) return;
  if (op->hasKernelForDispatchKey(c10::DispatchKey::Meta) && existing == Existing::Keep) return;
  IgnoreWarnings ignore;
  c10::Warning::WarningHandlerGuard quiet(&ignore);
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
    // Note [Meta kernels that must match the CPU kernel]
    register_meta<&native_batch_norm_meta>({"aten::native_batch_norm", ""}, *handles,
                                           Existing::Replace);
    register_meta<&native_layer_norm_meta>({"aten::native_layer_norm", ""}, *handles,
                                           Existing::Replace);
    register_meta<&var_correction_meta>({"aten::var", "correction"}, *handles);
    register_meta<&index_select_meta>({"aten::index_select", ""}, *handles);
    register_meta<&convolution_meta>({"aten::convolution", ""}, *handles);
    register_meta<&roll_meta>({"aten::roll", ""}, *handles);
    register_meta<&where_self_meta>({"aten::where", "self"}, *handles);
    register_meta<&native_multi_head_attention_meta>({"aten::_native_multi_head_attention", ""},
                                                     *handles);
    register_meta<&transformer_encoder_layer_fwd_meta>({"aten::_transformer_encoder_layer_fwd", ""},
                                                       *handles);
  });
}

}  // namespace detail
}  // namespace torchcap
