// Note [Convolutions with packed weights]
// LibTorch's CPU convolution (aten::convolution) reorders its weight into
// oneDNN's blocked layout at every call, and on an NCHW input it reorders
// the activations too. TorchScript's optimize_for_inference avoids both by
// converting whole regions to opaque oneDNN tensors, whose layout neither a
// file nor torch.fx can hold. This pass keeps every value a plain strided
// tensor and calls convolutions whose weights are packed once:
//
//   %w = torchcap::conv2d_prepack(%weight, %bias, stride, padding, dilation,
//                                 groups, input_size, "add_relu")
//   %y = torchcap::conv2d_run(%x, %w, %shortcut)
//
// (Note [torchcap's packed convolution] in kernels/onednn.h: oneDNN,
// by Winograd's algorithm where it wins.) The packing reads attributes only,
// so the interpreter computes it once (Note [Views of attributes, computed
// once] in runtime/plan_passes/fold_views.cpp). What follows the
// convolution is fused into it when the convolution's result has no other
// reader: a relu ("relu"), a hardtanh of constant bounds ("hardtanh", a
// ReLU6); or an add of another tensor of its sizes, alpha
// 1, then perhaps a relu ("add", "add_relu": a residual block's tail). An
// in-place add_ is fused only when it writes over the convolution's result;
// over the other operand, that tensor's later readers would see the sum.
// The fused call goes where the add was, since the shortcut may be computed
// after the convolution. Because the packed convolution is fastest on
// channels-last activations (and keeps them so: its result, relu, add and
// the pools stay channels-last), the input of each that is not channels-last
// is made so by a clone. The file stays portable: the weights are saved
// unpacked, and torch.fx runs the same two operators (packing at every call).
//
// Which kernel: measured per operator on ResNet-18 and MobileNetV2 against
// LibTorch's packed oneDNN convolution (mkldnn_prepacked::conv2d_run, the
// direct algorithm only, relu the only fusion, and its weights reordered
// again at each call), XNNPACK's (prepacked::conv2d_clamp_*, which fuses a
// clamp) and aten::convolution on channels-last inputs: torchcap's was as
// fast or faster everywhere. Winograd takes ResNet-18's 3x3 convolutions of
// stride 1 in 0.45 to 0.75 of the direct algorithm's time; with the ReLU6
// fused as oneDNN's clip, MobileNetV2's 3x3 convolutions take 1.0 to 1.25 ms
// against XNNPACK's 1.6 to 2.0, its 1x1 ones 3.3 against 4.2
// (docs/benchmarks.md has the figures).
//
// What is rewritten: aten::convolution, not transposed, of a 4-D float32 CPU
// input, whose weight (and bias, if any) are float32 attributes with values,
// with stride, padding and dilation of two ints; in a static graph (packing
// takes the input's sizes) that writes no attribute. Strides of the values
// after a rewritten convolution change (channels-last), so the pass runs the
// new graph once on zeros of the inputs' recorded sizes and records what
// every node gives; a graph whose sizes then differ from the recorded ones
// (sizes that depend on values) or that cannot run so is left as it was.
#include "passes/inference.h"

#include <torchcap/error.h>
#include <torchcap/evaluator.h>

#include "graph/operator_facts.h"
#include "kernels/onednn.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/strides.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace torchcap::detail {
namespace {



bool is_int_pair(const Argument& a) {
  if (!a.is_list() || a.to_list().size() != 2) return false;
  for (const Argument& e : a.to_list()) {
    if (!e.is_int()) return false;
  }
  return true;
}

bool is_float_cpu(const Attribute* a) {
  return a != nullptr && a->value.scalar_type() == at::kFloat && a->value.device().is_cpu();
}

// A convolution this pass rewrites (the Note says which).
bool packable(const GraphModule& gm, const Node* conv) {
  if (!is_call_of(conv, "aten::convolution") || conv->args().size() != 9 || !conv->kwargs().empty()) return false;
  const ArgumentList& c = conv->args();
  if (!c[0].is_node() || !c[6].is_bool() || c[6].to_bool() || !c[8].is_int()) return false;
  if (!is_int_pair(c[3]) || !is_int_pair(c[4]) || !is_int_pair(c[5])) return false;
  const Attribute* weight = float_attribute_of(gm, c[1]);
  if (!is_float_cpu(weight) || weight->value.dim() != 4) return false;
  if (!c[2].is_none() && !is_float_cpu(float_attribute_of(gm, c[2]))) return false;
  const ValueMeta& in = c[0].to_node()->meta().val;
  return in.kind == ValueKind::Tensor && in.tensors[0].dtype == at::kFloat && in.tensors[0].sizes.size() == 4 &&
         in.tensors[0].device.is_cpu();
}

// The add a convolution's result goes to, when oneDNN can do it as the
// convolution writes its result: `conv`'s only reader is an add of alpha 1
// (`add_` only when it writes over the convolution's result, not over the
// other operand) of a float32 tensor of the result's sizes.
struct ResidualAdd {
  Node* node = nullptr;
  Argument residual;
};

ResidualAdd residual_add(Node* conv) {
  if (conv->users().size() != 1) return {};
  Node* add = conv->users()[0];
  const bool in_place = is_call_of(add, "aten::add_", "Tensor");
  if (!in_place && !is_call_of(add, "aten::add", "Tensor")) return {};
  const ArgumentList& a = add->args();
  if (!add->kwargs().empty() || a.size() < 2 || a.size() > 3 || !a[0].is_node() || !a[1].is_node()) return {};
  if (a.size() == 3 && !((a[2].is_int() && a[2].to_int() == 1) || (a[2].is_double() && a[2].to_double() == 1.0))) {
    return {};
  }
  if (a[0].to_node() == a[1].to_node() || (in_place && a[0].to_node() != conv)) return {};
  const Argument& other = a[0].to_node() == conv ? a[1] : a[0];
  const ValueMeta& r = other.to_node()->meta().val;
  const ValueMeta& y = conv->meta().val;
  if (r.kind != ValueKind::Tensor || y.kind != ValueKind::Tensor) return {};
  const TensorMeta& rt = r.tensors[0];
  if (rt.dtype != at::kFloat || !rt.device.is_cpu() || rt.sizes != y.tensors[0].sizes) return {};
  return {add, other};
}

// Whether `n` reads its arguments' strides, not only their values: a view
// (`view` of a channels-last tensor fails where the trace's contiguous one
// did not), or an operator given strides to read memory by (`as_strided`,
// `_reshape_alias`: they would silently read other elements).
bool reads_strides(const Node& n) {
  if (!n.is_operator()) return false;
  if (n.facts().returns_view) return true;
  const std::string& t = n.target();
  for (const char* name : {"as_strided", "_reshape_alias", "_unsafe_view", "view_copy"}) {
    if (t.find(name) != std::string::npos) return true;
  }
  return false;
}

// Runs the rewritten graph once for real and records each node's value.
// Makes the input of each packed convolution that is not channels-last so;
// and where a node that reads strides would get a channels-last tensor the
// trace had contiguous, makes it contiguous again. Remembers both (they
// become clones in the graph afterwards).
class Recorder : public Evaluator {
 public:
  Recorder(const GraphModule& gm, std::unordered_map<const Node*, TensorMeta> traced)
      : Evaluator(gm), traced_(std::move(traced)) {}
  std::unordered_set<const Node*> needs_channels_last;
  std::vector<std::pair<Node*, Node*>> needs_contiguous;  // (reader, the input it reads)
  std::vector<std::pair<const Node*, ValueMeta>> metas;

 protected:
  c10::IValue call_operator(const Node& n, const std::vector<BoundArgument>& args) override {
    const bool strides = reads_strides(n);
    std::vector<c10::IValue> stack = make_stack(args, [&](const Node* in) {
      const c10::IValue& v = value_of(in);
      if (!strides || !v.isTensor()) return v;
      auto traced = traced_.find(in);
      const at::Tensor& t = v.toTensor();
      if (traced == traced_.end() || !t.defined() || t.strides().equals(traced->second.strides)) return v;
      if (!traced->second.is_contiguous()) {
        throw torchcap::Error("the trace had strides here that a clone cannot give back");  // the pass gives up
      }
      needs_contiguous.emplace_back(const_cast<Node*>(&n), const_cast<Node*>(in));
      return c10::IValue(t.contiguous());
    });
    if (n.target() == kConv2dRun) {
      const at::Tensor& x = stack.at(0).toTensor();
      if (!x.is_contiguous(at::MemoryFormat::ChannelsLast)) {
        stack[0] = x.contiguous(at::MemoryFormat::ChannelsLast);
        needs_channels_last.insert(&n);
      }
    }
    run_kernel(n, stack);
    return pack_results(std::move(stack));
  }
  void visited(const Node& n, const c10::IValue& v) override {
    // What is not made of tensors (a packed weight, a scalar) keeps its
    // recorded metadata.
    ValueMeta m;
    if (n.is_operator()) {
      const bool several = n.schema().returns().size() > 1;
      m = result_meta(n.schema(), several ? c10::ArrayRef<c10::IValue>(v.toTupleRef().elements())
                                          : c10::ArrayRef<c10::IValue>(v));
    } else if (n.is_getitem() && v.isTensor() && v.toTensor().defined()) {
      m = ValueMeta::tensor(TensorMeta::of(v.toTensor()));
    }
    if (m.kind != ValueKind::Unknown) metas.emplace_back(&n, std::move(m));
  }


 private:
  std::unordered_map<const Node*, TensorMeta> traced_;
};

bool same_sizes(const ValueMeta& a, const ValueMeta& b) {
  if (a.kind != b.kind || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    if (a.tensors[i].sizes != b.tensors[i].sizes || a.tensors[i].dtype != b.tensors[i].dtype) return false;
  }
  return true;
}

}  // namespace

bool prepack_convolutions(GraphModule& gm) {
  if (gm.is_dynamic() || writes_an_attribute(gm.graph())) return false;
  std::vector<Node*> convs;
  for (Node* n : gm.graph()) {
    if (packable(gm, n)) convs.push_back(n);
  }
  if (convs.empty()) return false;

  // The placeholders' zeros, for the run that records the new strides.
  std::vector<c10::IValue> zeros;
  for (const Node* p : gm.graph().placeholders()) {
    const ValueMeta& v = p->meta().val;
    if (v.kind != ValueKind::Tensor) return false;
    const TensorMeta& t = v.tensors[0];
    zeros.emplace_back(at::zeros_like(at::empty_strided(t.sizes, t.strides, at::device(t.device).dtype(t.dtype))));
  }

  GraphModule work = gm.clone();
  Graph& g = work.graph();
  std::vector<Node*> work_convs;
  for (Node* n : g) {
    if (packable(work, n)) work_convs.push_back(n);
  }
  for (Node* conv : work_convs) {
    const ArgumentList c = conv->args();
    // oneDNN fuses a relu or a hardtanh, or an add then a relu.
    const FusableClamp fused = fusable_clamp(conv);
    Node* relu = fused.relu ? fused.node : nullptr;
    Node* clip = fused.node != nullptr && !fused.relu ? fused.node : nullptr;  // a hardtanh (ReLU6)
    ResidualAdd add;
    if (fused.node == nullptr) {
      add = residual_add(conv);
      if (add.node != nullptr && fusable_clamp(add.node).relu) relu = add.node->users()[0];
    }
    stop_requiring_grad(work, c[1]);
    stop_requiring_grad(work, c[2]);
    // The residual may be computed after the convolution: the fused call
    // goes where the add was.
    auto here = g.inserting_before(add.node != nullptr ? add.node : conv);
    ArgumentList input_size;
    for (int64_t s : c[0].to_node()->meta().val.tensors[0].sizes) input_size.emplace_back(s);
    const char* post_op = add.node != nullptr ? (relu != nullptr ? "add_relu" : "add")
                          : clip != nullptr   ? "hardtanh"
                          : relu != nullptr   ? "relu"
                                              : "none";
    ArgumentList pack_args{c[1], c[2], c[3], c[4], c[5], c[8], Argument(std::move(input_size)), post_op};
    if (clip != nullptr) {
      for (const Argument& bound : {fused.lo, fused.hi}) {
        pack_args.emplace_back(bound.is_int() ? static_cast<double>(bound.to_int()) : bound.to_double());
      }
    }
    Node* pack = g.call_function(kConv2dPrepack, std::move(pack_args));
    ArgumentList run_args{c[0], pack};
    if (add.node != nullptr) run_args.push_back(add.residual);
    Node* run = g.call_function(kConv2dRun, std::move(run_args));
    // The last of the fused nodes: its readers read the fused call now.
    Node* activation = clip != nullptr ? clip : relu;
    Node* last = activation != nullptr ? activation : add.node != nullptr ? add.node : conv;
    run->meta() = last->meta();
    pack->meta().stack_trace = conv->meta().stack_trace;
    pack->meta().module_stack = conv->meta().module_stack;
    last->replace_all_uses_with(run);
    for (Node* n : {activation, add.node, conv}) {
      if (n != nullptr) g.erase(n);
    }
  }

  // What the trace recorded of each tensor, before the run below rewrites it.
  std::unordered_map<const Node*, TensorMeta> traced;
  for (const Node* n : g) {
    if (n->meta().val.kind == ValueKind::Tensor) traced.emplace(n, n->meta().val.tensors[0]);
  }
  Recorder recorder(work, std::move(traced));
  try {
    c10::NoGradGuard no_grad;
    recorder.run(std::move(zeros));
  } catch (const std::exception&) {
    return false;  // the Note: left as it was
  }
  for (auto& [node, meta] : recorder.metas) {
    Node* n = const_cast<Node*>(node);
    if (n->meta().val.kind != ValueKind::Unknown && !same_sizes(n->meta().val, meta)) return false;
    n->meta().val = std::move(meta);
  }
  for (Node* n : g) {
    if (recorder.needs_channels_last.count(n) == 0) continue;
    Node* x = n->args()[0].to_node();
    auto here = g.inserting_before(n);
    Node* clone = g.call_function("aten::clone", {x}, {{"memory_format", at::MemoryFormat::ChannelsLast}});
    TensorMeta m = x->meta().val.tensors[0];
    const std::vector<int64_t> strides = c10::get_channels_last_strides_2d(m.sizes);
    m.strides.assign(strides.begin(), strides.end());
    clone->meta().val = ValueMeta::tensor(std::move(m));
    clone->meta().stack_trace = n->meta().stack_trace;
    n->set_arg(0, clone);
  }
  for (auto [reader, input] : recorder.needs_contiguous) {
    auto here = g.inserting_before(reader);
    Node* clone = g.call_function("aten::clone", {input}, {{"memory_format", at::MemoryFormat::Contiguous}});
    TensorMeta m = input->meta().val.tensors[0];
    const c10::DimVector strides = c10::contiguous_strides(m.sizes);
    m.strides.assign(strides.begin(), strides.end());
    clone->meta().val = ValueMeta::tensor(std::move(m));
    clone->meta().stack_trace = reader->meta().stack_trace;
    reader->replace_input_with(input, clone);
  }
  gm = std::move(work);
  return true;
}

}  // namespace torchcap::detail
