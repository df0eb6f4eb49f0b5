#include "kernels/functional.h"

#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/clamp_min.h>
#include <ATen/ops/pow.h>

#include <algorithm>

namespace torchcap {
namespace detail {

std::vector<at::Tensor> functional_native_batch_norm(std::vector<c10::IValue>& s) {
  auto optional_tensor = [](const c10::IValue& v) {
    return v.isNone() ? c10::optional<at::Tensor>() : c10::optional<at::Tensor>(v.toTensor());
  };
  const at::Tensor input = s.at(0).toTensor();
  const at::Tensor running_mean = s.at(3).toTensor();
  const at::Tensor running_var = s.at(4).toTensor();
  const double momentum = s.at(6).toDouble();
  const double eps = s.at(7).toDouble();
  auto [out, save_mean, save_invstd] = at::native_batch_norm(
      input, optional_tensor(s[1]), optional_tensor(s[2]), c10::nullopt, c10::nullopt, true, momentum, eps);
  // Note [Running variance from save_invstd]
  // save_invstd is 1 / sqrt(var + eps) of the batch's biased variance, so the
  // variance comes back as invstd^-2 - eps: a few operators on C values
  // instead of a second pass over the activations (at::var). The result is
  // within a float rounding of LibTorch's own update, which works from the
  // kernel's sum of squares in double, as at::var's was. A channel with no
  // variance can come back a rounding below zero; it is clamped to zero.
  const double n = static_cast<double>(input.numel() / input.size(1));
  at::Tensor biased_var = save_invstd.pow(-2).sub(eps).clamp_min(0);
  at::Tensor new_mean = save_mean.mul(momentum).add(running_mean.mul(1 - momentum));
  at::Tensor new_var = biased_var.mul(momentum * n / std::max(n - 1, 1.0)).add(running_var.mul(1 - momentum));
  s = {out, save_mean, save_invstd};
  return {new_mean, new_var};
}

}  // namespace detail
}  // namespace torchcap
