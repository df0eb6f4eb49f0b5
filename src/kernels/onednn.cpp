// torchcap's oneDNN operators: conv2d_prepack / conv2d_run (Note [torchcap's
// packed convolution]) and linear_prepack / linear_run (Note [torchcap's
// packed linear layer]), both in onednn.h.
#include "kernels/onednn.h"

#include <ATen/ATen.h>
#include <c10/util/irange.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <dnnl.hpp>

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchcap {
namespace detail {
namespace {

using dnnl::memory;
using Tag = dnnl::memory::format_tag;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Memory a thread reuses from one call to the next (a Winograd call's
// scratchpad is megabytes; allocated at each call, it would be paged in at
// each call). Calls on other threads have their own.
struct ThreadBuffers {
  at::Tensor src, dst, scratchpad;
};

void* grown(at::Tensor& buffer, size_t bytes) {
  if (bytes == 0) return nullptr;
  if (!buffer.defined() || buffer.nbytes() < bytes) buffer = at::empty({static_cast<int64_t>(bytes)}, at::kByte);
  return buffer.data_ptr();
}

dnnl::reorder reorder_of(const memory::desc& from, const memory::desc& to) {
  return dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), from, cpu_engine(), to));
}

memory::dims dims_of(c10::IntArrayRef sizes) { return memory::dims(sizes.begin(), sizes.end()); }

class PackedConv2d : public torch::CustomClassHolder {
 public:
  PackedConv2d(const at::Tensor& weight, const c10::optional<at::Tensor>& bias, const std::vector<int64_t>& stride,
               const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int64_t groups,
               const std::vector<int64_t>& input_size, const std::string& post_op,
               c10::optional<double> clamp_min, c10::optional<double> clamp_max);

  at::Tensor run(const at::Tensor& x, const c10::optional<at::Tensor>& residual) const;
  std::string algorithm() const { return blocked_ ? "winograd" : "direct"; }

 private:
  // The convolution with `algorithm` and src/dst in `layout`, or nothing
  // when oneDNN has no implementation of it here.
  c10::optional<dnnl::convolution_forward::primitive_desc> describe(dnnl::algorithm algorithm, Tag layout) const;

  // oneDNN memory objects for a call: the activations' (channels-last),
  // the blocked ones (Winograd), and the convolution's arguments, which
  // share them. Handles are set at each call.
  struct Memories {
    memory nhwc_src, nhwc_dst, nhwc_residual, src, dst;
    std::unordered_map<int, memory> args;
  };
  Memories memories() const;
  struct Cached {
    std::mutex mutex;
    Memories memories;
  };
  mutable Cached cached_;

  std::vector<int64_t> input_size_, output_size_;
  memory::dims weight_dims_, stride_, dilation_, padding_;
  bool add_ = false;
  dnnl::primitive_attr attr_;
  memory::desc weight_md_, bias_md_, nhwc_src_md_, nhwc_dst_md_;

  bool blocked_ = false;  // Winograd: src and dst in oneDNN's blocked layout, reordered in the call
  memory::desc src_md_, dst_md_, scratchpad_md_;
  dnnl::convolution_forward conv_;
  dnnl::reorder to_src_, to_dst_, from_dst_;
  memory weights_;
  at::Tensor bias_;  // contiguous, or undefined
};

void check_pair(const std::vector<int64_t>& v, const char* what) {
  TORCH_CHECK(v.size() == 2, "torchcap::conv2d_prepack: ", what, " must have 2 elements, got ", v.size());
}

PackedConv2d::PackedConv2d(const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                           const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                           const std::vector<int64_t>& dilation, int64_t groups,
                           const std::vector<int64_t>& input_size, const std::string& post_op,
                           c10::optional<double> clamp_min, c10::optional<double> clamp_max)
    : input_size_(input_size) {
  TORCH_CHECK(weight.dim() == 4 && weight.numel() > 0 && weight.scalar_type() == at::kFloat &&
                  weight.device().is_cpu(),
              "torchcap::conv2d_prepack: the weight must be a non-empty 4-D float32 CPU tensor, got sizes ",
              weight.sizes(), " ", weight.scalar_type(), " on ", weight.device());
  check_pair(stride, "stride");
  check_pair(padding, "padding");
  check_pair(dilation, "dilation");
  TORCH_CHECK(groups >= 1 && weight.size(0) % groups == 0, "torchcap::conv2d_prepack: groups must divide the ",
              weight.size(0), " output channels, got ", groups);
  TORCH_CHECK(input_size.size() == 4 && input_size[1] == weight.size(1) * groups &&
                  std::all_of(input_size.begin(), input_size.end(), [](int64_t s) { return s >= 1; }),
              "torchcap::conv2d_prepack: input_size must be [N, C, H, W] with C = ", weight.size(1) * groups,
              " for this weight and groups, got ", c10::IntArrayRef(input_size));
  const bool relu = post_op == "relu" || post_op == "add_relu";
  const bool clamp = post_op == "hardtanh";
  add_ = post_op == "add" || post_op == "add_relu";
  TORCH_CHECK(relu || add_ || clamp || post_op == "none", "torchcap::conv2d_prepack: post_op must be 'none', "
              "'relu', 'add', 'add_relu' or 'hardtanh', got '", post_op, "'");
  TORCH_CHECK(clamp == (clamp_min.has_value() && clamp_max.has_value()) && (clamp || !clamp_min && !clamp_max),
              "torchcap::conv2d_prepack: clamp_min and clamp_max are given with post_op 'hardtanh', and only then");
  TORCH_CHECK(!clamp || *clamp_min <= *clamp_max, "torchcap::conv2d_prepack: clamp_min ", *clamp_min,
              " is above clamp_max ", *clamp_max);
  const int64_t oc = weight.size(0);
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == oc && bias->scalar_type() == at::kFloat &&
                    bias->device().is_cpu(),
                "torchcap::conv2d_prepack: the bias must be a float32 CPU tensor of ", oc, " elements, got sizes ",
                bias->sizes(), " ", bias->scalar_type());
    bias_ = bias->detach().contiguous().clone();
  }
  output_size_ = {input_size[0], oc, 0, 0};
  for (const int d : {0, 1}) {
    const int64_t extent = dilation[d] * (weight.size(2 + d) - 1) + 1;
    const int64_t out = (input_size[2 + d] + 2 * padding[d] - extent) / stride[d] + 1;
    TORCH_CHECK(stride[d] >= 1 && dilation[d] >= 1 && padding[d] >= 0 && out >= 1,
                "torchcap::conv2d_prepack: no output for input_size ", c10::IntArrayRef(input_size),
                " with this kernel, stride, padding and dilation");
    output_size_[2 + d] = out;
  }
  stride_ = dims_of(stride);
  padding_ = dims_of(padding);
  dilation_ = {dilation[0] - 1, dilation[1] - 1};  // oneDNN counts the gaps
  if (groups == 1) {
    weight_dims_ = dims_of(weight.sizes());
  } else {
    weight_dims_ = {groups, oc / groups, weight.size(1), weight.size(2), weight.size(3)};
  }

  dnnl::post_ops ops;
  if (add_) ops.append_sum(1.0f);
  if (relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (clamp) {
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_clip, static_cast<float>(*clamp_min),
                       static_cast<float>(*clamp_max));
  }
  attr_.set_post_ops(ops);
  attr_.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // Note: thread buffers; calls may run concurrently
  weight_md_ = memory::desc(weight_dims_, memory::data_type::f32, Tag::any);
  if (bias_.defined()) bias_md_ = memory::desc({oc}, memory::data_type::f32, Tag::x);
  nhwc_src_md_ = memory::desc(dims_of(input_size_), memory::data_type::f32, Tag::nhwc);
  nhwc_dst_md_ = memory::desc(dims_of(output_size_), memory::data_type::f32, Tag::nhwc);

  c10::optional<dnnl::convolution_forward::primitive_desc> pd;
  // Below 32 channels Winograd's transforms cost more than they save
  // (measured: 3 to 64 channels at 224 x 224, 2.7 ms against the direct
  // algorithm's 1.1; 8 to 8, 15 us against 11; 32 to 32, 41 against 67).
  const bool winograd_shape = groups == 1 && weight.size(2) == 3 && weight.size(3) == 3 &&
                              std::min(weight.size(0), weight.size(1)) >= 32 &&
                              stride == std::vector<int64_t>{1, 1} && dilation == std::vector<int64_t>{1, 1};
  if (winograd_shape) pd = describe(dnnl::algorithm::convolution_winograd, Tag::any);
  blocked_ = pd.has_value();
  if (!pd) pd = describe(dnnl::algorithm::convolution_direct, Tag::nhwc);
  TORCH_CHECK(pd.has_value(), "torchcap::conv2d_prepack: oneDNN has no implementation of this convolution (weight ",
              weight.sizes(), ", input ", c10::IntArrayRef(input_size), ")");
  src_md_ = pd->src_desc();
  dst_md_ = pd->dst_desc();
  scratchpad_md_ = pd->scratchpad_desc();
  conv_ = dnnl::convolution_forward(*pd);
  if (blocked_) {
    to_src_ = reorder_of(nhwc_src_md_, src_md_);
    to_dst_ = reorder_of(nhwc_dst_md_, dst_md_);
    from_dst_ = reorder_of(dst_md_, nhwc_dst_md_);
  }

  // The weights, reordered once into the layout the kernel reads.
  const at::Tensor w = weight.detach().contiguous();
  const memory::desc plain(weight_dims_, memory::data_type::f32, groups == 1 ? Tag::oihw : Tag::goihw);
  memory user(plain, cpu_engine(), w.data_ptr());
  weights_ = memory(pd->weights_desc(), cpu_engine());
  dnnl::stream stream(cpu_engine());
  dnnl::reorder(user, weights_).execute(stream, user, weights_);
  stream.wait();
}

c10::optional<dnnl::convolution_forward::primitive_desc> PackedConv2d::describe(dnnl::algorithm algorithm,
                                                                               Tag layout) const {
  try {
    const memory::desc src(dims_of(input_size_), memory::data_type::f32, layout);
    const memory::desc dst(dims_of(output_size_), memory::data_type::f32, layout);
    dnnl::convolution_forward::desc d =
        bias_.defined() ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, algorithm, src,
                                                          weight_md_, bias_md_, dst, stride_, dilation_, padding_,
                                                          padding_)
                        : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, algorithm, src,
                                                          weight_md_, dst, stride_, dilation_, padding_, padding_);
    return dnnl::convolution_forward::primitive_desc(d, attr_, cpu_engine());
  } catch (const dnnl::error&) {
    return c10::nullopt;  // unimplemented here (an ISA without Winograd, a shape it does not take)
  }
}

at::Tensor PackedConv2d::run(const at::Tensor& x, const c10::optional<at::Tensor>& residual) const {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.sizes().equals(input_size_),
              "torchcap::conv2d_run: the convolution was packed for a float32 CPU input of sizes ",
              c10::IntArrayRef(input_size_), ", got ", x.scalar_type(), " ", x.sizes(), " on ", x.device());
  const bool has_residual = residual.has_value() && residual->defined();
  TORCH_CHECK(has_residual == add_, "torchcap::conv2d_run: ",
              add_ ? "the convolution was packed with post_op 'add'; give the tensor to add"
                   : "a residual was given to a convolution packed without post_op 'add'");
  if (add_) {
    TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->device().is_cpu() &&
                    residual->sizes().equals(output_size_),
                "torchcap::conv2d_run: the residual must be a float32 CPU tensor of the result's sizes ",
                c10::IntArrayRef(output_size_), ", got ", residual->scalar_type(), " ", residual->sizes());
  }
  static thread_local ThreadBuffers buffers;
  static thread_local dnnl::stream stream(cpu_engine());
  const at::Tensor in = x.contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor out = at::empty(output_size_, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  // The convolution's memory objects, pointed at this call's memory: its
  // own when no other thread is running it (as the linear layer's), else
  // made for this call.
  std::unique_lock<std::mutex> own(cached_.mutex, std::try_to_lock);
  Memories fresh;
  Memories& m = own.owns_lock() ? cached_.memories : fresh;
  if (m.args.empty()) m = memories();
  m.nhwc_src.set_data_handle(in.data_ptr());
  m.nhwc_dst.set_data_handle(out.data_ptr());
  if (scratchpad_md_.get_size() > 0) {
    m.args.at(DNNL_ARG_SCRATCHPAD).set_data_handle(grown(buffers.scratchpad, scratchpad_md_.get_size()));
  }
  if (!blocked_) {
    if (add_) out.copy_(*residual);
    conv_.execute(stream, m.args);
  } else {
    m.src.set_data_handle(grown(buffers.src, src_md_.get_size()));
    m.dst.set_data_handle(grown(buffers.dst, dst_md_.get_size()));
    to_src_.execute(stream, m.nhwc_src, m.src);
    at::Tensor r;
    if (add_) {
      r = residual->contiguous(at::MemoryFormat::ChannelsLast);
      m.nhwc_residual.set_data_handle(r.data_ptr());
      to_dst_.execute(stream, m.nhwc_residual, m.dst);
    }
    conv_.execute(stream, m.args);
    from_dst_.execute(stream, m.dst, m.nhwc_dst);
  }
  stream.wait();
  return out;
}

PackedConv2d::Memories PackedConv2d::memories() const {
  Memories m;
  m.nhwc_src = memory(nhwc_src_md_, cpu_engine(), nullptr);
  m.nhwc_dst = memory(nhwc_dst_md_, cpu_engine(), nullptr);
  m.nhwc_residual = memory(nhwc_dst_md_, cpu_engine(), nullptr);
  m.args.emplace(DNNL_ARG_WEIGHTS, weights_);
  if (bias_.defined()) m.args.emplace(DNNL_ARG_BIAS, memory(bias_md_, cpu_engine(), bias_.data_ptr()));
  if (scratchpad_md_.get_size() > 0) m.args.emplace(DNNL_ARG_SCRATCHPAD, memory(scratchpad_md_, cpu_engine(), nullptr));
  if (blocked_) {
    m.src = memory(src_md_, cpu_engine(), nullptr);
    m.dst = memory(dst_md_, cpu_engine(), nullptr);
    m.args.emplace(DNNL_ARG_SRC, m.src);
    m.args.emplace(DNNL_ARG_DST, m.dst);
  } else {
    m.args.emplace(DNNL_ARG_SRC, m.nhwc_src);
    m.args.emplace(DNNL_ARG_DST, m.nhwc_dst);
  }
  return m;
}

class PackedLinear : public torch::CustomClassHolder {
 public:
  PackedLinear(const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
               const std::vector<int64_t>& input_size, const std::string& post_op)
      : input_size_(input_size) {
    TORCH_CHECK(weight.dim() == 2 && weight.numel() > 0 && weight.scalar_type() == at::kFloat &&
                    weight.device().is_cpu(),
                "torchcap::linear_prepack: the weight must be a non-empty 2-D float32 CPU tensor, got sizes ",
                weight.sizes(), " ", weight.scalar_type(), " on ", weight.device());
    const int64_t n = weight.size(0);
    const int64_t k = weight.size(1);
    TORCH_CHECK(input_size.size() == 2 && input_size[0] >= 1 && input_size[1] == k,
                "torchcap::linear_prepack: input_size must be [M, ", k, "] for this weight, got ",
                c10::IntArrayRef(input_size));
    TORCH_CHECK(post_op == "none" || post_op == "relu",
                "torchcap::linear_prepack: post_op must be 'none' or 'relu', got '", post_op, "'");
    if (bias.has_value() && bias->defined()) {
      TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == at::kFloat &&
                      bias->device().is_cpu(),
                  "torchcap::linear_prepack: the bias must be a float32 CPU tensor of ", n,
                  " elements, got sizes ", bias->sizes(), " ", bias->scalar_type());
      bias_ = bias->detach().contiguous().clone();
      bias_md_ = memory::desc({n}, memory::data_type::f32, Tag::x);
    }
    output_size_ = {input_size[0], n};
    src_md_ = memory::desc(dims_of(input_size_), memory::data_type::f32, Tag::nc);
    dst_md_ = memory::desc(dims_of(output_size_), memory::data_type::f32, Tag::nc);
    const memory::desc any_weight({n, k}, memory::data_type::f32, Tag::any);
    dnnl::primitive_attr attr;
    if (post_op == "relu") {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(ops);
    }
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const auto d = bias_.defined()
                       ? dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_inference, src_md_, any_weight,
                                                           bias_md_, dst_md_)
                       : dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_inference, src_md_, any_weight,
                                                           dst_md_);
    const dnnl::inner_product_forward::primitive_desc pd(d, attr, cpu_engine());
    scratchpad_md_ = pd.scratchpad_desc();
    product_ = dnnl::inner_product_forward(pd);
    const at::Tensor w = weight.detach().contiguous();
    memory user(memory::desc({n, k}, memory::data_type::f32, Tag::oi), cpu_engine(), w.data_ptr());
    weights_ = memory(pd.weights_desc(), cpu_engine());
    dnnl::stream stream(cpu_engine());
    dnnl::reorder(user, weights_).execute(stream, user, weights_);
    stream.wait();
  }

  at::Tensor run(const at::Tensor& x) const {
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.sizes().equals(input_size_),
                "torchcap::linear_run: the layer was packed for a float32 CPU input of sizes ",
                c10::IntArrayRef(input_size_), ", got ", x.scalar_type(), " ", x.sizes(), " on ", x.device());
    static thread_local ThreadBuffers buffers;
    static thread_local dnnl::stream stream(cpu_engine());
    const at::Tensor in = x.contiguous();
    at::Tensor out = at::empty(output_size_, x.options());
    void* scratchpad = grown(buffers.scratchpad, scratchpad_md_.get_size());
    // A small layer's call costs about what its arithmetic does: the call
    // reuses the layer's memory objects and argument map, pointed at this
    // call's tensors, when no other thread is running it; else makes its own.
    std::unique_lock<std::mutex> own(cached_.mutex, std::try_to_lock);
    if (own.owns_lock()) {
      if (cached_.args.empty()) cached_.args = arguments(in, out, scratchpad);
      cached_.args.at(DNNL_ARG_SRC).set_data_handle(in.data_ptr());
      cached_.args.at(DNNL_ARG_DST).set_data_handle(out.data_ptr());
      if (scratchpad != nullptr) cached_.args.at(DNNL_ARG_SCRATCHPAD).set_data_handle(scratchpad);
      product_.execute(stream, cached_.args);
    } else {
      product_.execute(stream, arguments(in, out, scratchpad));
    }
    stream.wait();
    return out;
  }

 private:
  std::unordered_map<int, memory> arguments(const at::Tensor& in, const at::Tensor& out, void* scratchpad) const {
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src_md_, cpu_engine(), in.data_ptr())},
                                         {DNNL_ARG_WEIGHTS, weights_},
                                         {DNNL_ARG_DST, memory(dst_md_, cpu_engine(), out.data_ptr())}};
    if (bias_.defined()) args.emplace(DNNL_ARG_BIAS, memory(bias_md_, cpu_engine(), bias_.data_ptr()));
    if (scratchpad != nullptr) args.emplace(DNNL_ARG_SCRATCHPAD, memory(scratchpad_md_, cpu_engine(), scratchpad));
    return args;
  }

  struct Cached {
    std::mutex mutex;
    std::unordered_map<int, memory> args;
  };
  mutable Cached cached_;
  std::vector<int64_t> input_size_, output_size_;
  memory::desc src_md_, dst_md_, bias_md_, scratchpad_md_;
  dnnl::inner_product_forward product_;
  memory weights_;
  at::Tensor bias_;
};

c10::intrusive_ptr<PackedLinear> linear_prepack(const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                                std::vector<int64_t> input_size, std::string post_op) {
  return c10::make_intrusive<PackedLinear>(weight, bias, input_size, post_op);
}

at::Tensor linear_run(const at::Tensor& x, const c10::intrusive_ptr<PackedLinear>& packed) {
  return packed->run(x);
}

c10::intrusive_ptr<PackedConv2d> conv2d_prepack(const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                                std::vector<int64_t> stride, std::vector<int64_t> padding,
                                                std::vector<int64_t> dilation, int64_t groups,
                                                std::vector<int64_t> input_size, std::string post_op,
                                                c10::optional<double> clamp_min, c10::optional<double> clamp_max) {
  return c10::make_intrusive<PackedConv2d>(weight, bias, stride, padding, dilation, groups, input_size, post_op,
                                           clamp_min, clamp_max);
}

at::Tensor conv2d_run(const at::Tensor& x, const c10::intrusive_ptr<PackedConv2d>& packed,
                      const c10::optional<at::Tensor>& residual) {
  return packed->run(x, residual);
}

TORCH_LIBRARY(torchcap, m) {
  m.class_<PackedConv2d>("Conv2dPacked").def("algorithm", &PackedConv2d::algorithm);
  m.def("conv2d_prepack(Tensor weight, Tensor? bias, int[2] stride, int[2] padding, int[2] dilation, int groups, "
        "int[4] input_size, str post_op, float? clamp_min=None, float? clamp_max=None) "
        "-> __torch__.torch.classes.torchcap.Conv2dPacked",
        conv2d_prepack);
  m.def("conv2d_run(Tensor input, __torch__.torch.classes.torchcap.Conv2dPacked packed, Tensor? residual=None) "
        "-> Tensor",
        conv2d_run);
  m.class_<PackedLinear>("LinearPacked");
  m.def("linear_prepack(Tensor weight, Tensor? bias, int[2] input_size, str post_op) "
        "-> __torch__.torch.classes.torchcap.LinearPacked",
        linear_prepack);
  m.def("linear_run(Tensor input, __torch__.torch.classes.torchcap.LinearPacked packed) -> Tensor", linear_run);
}

}  // namespace

bool onednn_winograd_available(int channels) {
  try {
    const memory::desc any({1, channels, 8, 8}, memory::data_type::f32, Tag::any);
    const memory::desc weight({channels, channels, 3, 3}, memory::data_type::f32, Tag::any);
    const dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_winograd,
                                            any, weight, any, {1, 1}, {1, 1}, {1, 1});
    dnnl::convolution_forward::primitive_desc(d, cpu_engine());
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

std::string onednn_conv_algorithm(const c10::IValue& packed) {
  TORCH_CHECK(packed.isCustomClass(), "not a packed convolution: ", packed.tagKind());
  return packed.toCustomClass<PackedConv2d>()->algorithm();
}

}  // namespace detail
}  // namespace torchcap
