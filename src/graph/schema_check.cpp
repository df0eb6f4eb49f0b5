#include "graph/schema_check.h"

#include "graph/ivalue_conversion.h"

#include <ATen/core/function_schema.h>
#include <ATen/core/jit_type.h>
#include <c10/util/SmallVector.h>

#include <cctype>
#include <cstring>
#include <limits>
#include <unordered_set>

namespace torchcap {
namespace detail {

Produces produces(const Node& n) {
  switch (n.op()) {
    case OpCode::Placeholder:
    case OpCode::GetAttr:
      return Produces::Tensor;
    case OpCode::Output:
      return Produces::Nothing;
    case OpCode::CallFunction:
      break;
  }
  if (n.is_getitem()) return Produces::Tensor;
  if (n.is_size_computation()) return Produces::Scalar;
  const auto& returns = n.schema().returns();
  if (returns.empty()) return Produces::Nothing;
  if (returns.size() > 1) return Produces::Tuple;
  const c10::TypePtr& t = returns[0].real_type();
  if (t->kind() == c10::TypeKind::TensorType) return Produces::Tensor;
  if (t->kind() == c10::TypeKind::ListType &&
      t->expectRef<c10::ListType>().getElementType()->kind() == c10::TypeKind::TensorType) {
    return Produces::TensorList;
  }
  return Produces::Scalar;
}

namespace {

const char* describe(const Argument& a) {
  if (a.is_node()) {
    switch (produces(*a.to_node())) {
      case Produces::Tensor:
        return "a Tensor node";
      case Produces::TensorList:
        return "a Tensor[] node";
      case Produces::Tuple:
        return "a node with several outputs (use getitem)";
      case Produces::Scalar:
        return a.to_node()->is_operator() && a.to_node()->schema().returns()[0].real_type()->kind() ==
                                                   c10::TypeKind::ClassType
                   ? "an object node"
                   : "a scalar node";
      case Produces::Nothing:
        return "a node without a value";
    }
  }
  return a.kind_name();
}

// A node whose one result is a number (int, float, bool or Scalar).
bool is_number_node(const Node& n) {
  if (!n.is_operator() || n.schema().returns().size() != 1) return false;
  switch (n.schema().returns()[0].real_type()->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::NumberType:
      return true;
    default:
      return false;
  }
}

bool is_tensor_node(const Argument& a) {
  return a.is_node() && produces(*a.to_node()) == Produces::Tensor;
}

// Whether `a` is acceptable where the schema says `type`. A whole Tensor
// parameter may take a number (Note [Python numbers as tensors] in
// ivalue_conversion.cpp); an element of a Tensor[] may not.
bool fits(const c10::Type& type, const Argument& a, bool element = false) {
  using K = c10::TypeKind;
  switch (type.kind()) {
    case K::OptionalType:
      return a.is_none() || fits(*type.expectRef<c10::OptionalType>().getElementType(), a, element);
    case K::TensorType:
      return is_tensor_node(a) ||
             (!element && (a.is_int() || a.is_double() || a.is_bool() ||
                           (a.is_node() && a.to_node()->is_size_computation())));
    case K::IntType:
    case K::SymIntType:
      return a.is_int() || (a.is_node() && a.to_node()->is_size_computation());
    case K::FloatType:
      return a.is_double() || a.is_int();
    case K::BoolType:
      return a.is_bool();
    case K::NumberType:
      // A number node: a size computation, or a value read from a tensor
      // (Note [Guards of values the program read] in kernels/guards.cpp).
      return a.is_int() || a.is_double() || a.is_bool() ||
             (a.is_node() && (a.to_node()->is_size_computation() || is_number_node(*a.to_node())));
    case K::StringType:
      return a.is_string();
    case K::ScalarTypeType:
      return a.is_scalar_type();
    case K::LayoutType:
      return a.is_layout();
    case K::MemoryFormatType:
      return a.is_memory_format();
    case K::DeviceObjType:
      return a.is_device();
    case K::ListType: {
      const c10::Type& elem = *type.expectRef<c10::ListType>().getElementType();
      if (elem.kind() == K::TensorType && a.is_node()) {
        return produces(*a.to_node()) == Produces::TensorList;
      }
      if (!a.is_list()) return false;
      for (const Argument& e : a.to_list()) {
        if (!fits(elem, e, /*element=*/true)) return false;
      }
      return true;
    }
    case K::ClassType:  // an object an operator made: packed weights (Note [Convolutions with packed weights])
      return a.is_node() && a.to_node()->is_operator() && a.to_node()->schema().returns().size() == 1 &&
             *a.to_node()->schema().returns()[0].real_type() == type;
    default:
      return false;  // generators (other than none), streams, ...
  }
}

// Note [Integers kernels divide by]
// Checksums say that a file is intact, not that it is sane, and a process
// cannot catch a SIGFPE or a SIGSEGV. LibTorch 1.13's kernels check most of
// their arguments (negative sizes, dimensions out of range, sizes whose
// product overflows: an error, which the interpreter reports with the node),
// but some divide by an integer argument, or read a list argument's values,
// without checking it. Trying 0, -1, 2^32, 2^62 and short lists on every
// operator family that takes such arguments (issue 42) found:
// convolution_backward with groups 0, convolution with groups 2^62 (the
// weight's channels times groups wraps to 0), native_channel_shuffle,
// pixel_shuffle with upscale_factor 2^32 (its square wraps to 0),
// unfold_backward with step 0, the attention fast paths with 0 heads and
// mkldnn_max_pool2d with stride 0 die of SIGFPE; embedding_bag with mode 3,
// and _slow_conv2d_forward, thnn_conv2d, slow_conv3d and
// mkldnn_reorder_conv2d_weight with a window list shorter than their
// dimensions, of SIGSEGV or SIGFPE. So, by parameter name, in every schema
// (int, int?, int[], int[]?, SymInt alike):
//
// - Factors: groups, group, num_head, num_heads, upscale_factor,
//   downscale_factor, chunks, sections and step are between 1 and 2^31 - 1.
//   Kernels divide by them and by their products and squares, which the
//   bound keeps inside 64 bits.
// - Windows, in convolutions and pools (an operator with a kernel_size,
//   dilation or groups parameter, or "conv" or "pool" in its name):
//   kernel_size, stride and dilation are between 1 and 2^31 - 1, padding and
//   output_padding between 0 and 2^31 - 1. Elsewhere these names mean other
//   things: reflection_pad2d's padding may be negative (it crops), and
//   as_strided's stride is a tensor's layout.
// - Window lists of an operator named for its number of spatial dimensions N
//   (conv2d, max_pool3d_with_indices) hold 1 or N values, or none for a
//   pool's stride (which is then its kernel size); the operators of
//   kExactWindows, whose kernels read N values unchecked, exactly N; the
//   others' (convolution, convolution_backward), at least one (torchcap's
//   meta kernel for convolution divided by a missing stride).
// - embedding_bag's mode, in all its operators, is 0 (sum), 1 (mean) or 2 (max).
//
// Sizes are not on the list: every factory, view, pad and reshape tried
// refused a negative or overflowing size with an error, not a crash. What only
// the shapes of the inputs can check is Note [Kernels that trust their
// arguments], and the loader's shape check (Note [Checking a file's shapes]
// in serialize/shapes.cpp). The Python loader applies the same rule
// (python/torchcap/_load.py), and docs/FORMAT.md states it.

constexpr int64_t kMaxFactor = (int64_t{1} << 31) - 1;

struct IntRange {
  const char* name;
  int64_t lowest;
  bool windows_only;  // only in convolutions and pools
};
constexpr IntRange kIntRanges[] = {
    {"groups", 1, false},         {"group", 1, false},          {"num_head", 1, false},
    {"num_heads", 1, false},      {"upscale_factor", 1, false}, {"downscale_factor", 1, false},
    {"chunks", 1, false},         {"sections", 1, false},       {"step", 1, false},
    {"kernel_size", 1, true},     {"stride", 1, true},          {"dilation", 1, true},
    {"padding", 0, true},         {"output_padding", 0, true},
};

// Operators whose CPU kernels read N window values without checking how many
// there are (Note [Integers kernels divide by]).
struct ExactWindows {
  const char* op;
  size_t n;
};
constexpr ExactWindows kExactWindows[] = {
    {"aten::thnn_conv2d", 2},          {"aten::_slow_conv2d_forward", 2},
    {"aten::_slow_conv2d_backward", 2}, {"aten::slow_conv3d", 3},
    {"aten::slow_conv3d_forward", 3},   {"aten::mkldnn_reorder_conv2d_weight", 2},
    {"aten::mkldnn_reorder_conv3d_weight", 3},
};

const IntRange* int_range(const std::string& name) {
  for (const IntRange& r : kIntRanges) {
    if (name == r.name) return &r;
  }
  return nullptr;
}

bool is_window_operator(const c10::FunctionSchema& schema) {
  const std::string& name = schema.name();
  if (name.find("conv") != std::string::npos || name.find("pool") != std::string::npos) return true;
  for (const c10::Argument& p : schema.arguments()) {
    if (p.name() == "kernel_size" || p.name() == "dilation" || p.name() == "groups") return true;
  }
  return false;
}

// N of an operator named for its N spatial dimensions ("aten::conv2d",
// "aten::max_pool3d_with_indices_backward"), or 0.
size_t named_dimensions(const std::string& name) {
  for (size_t i = name.size(); i-- > 1;) {
    const char c = name[i];
    if (c >= '1' && c <= '3' && i + 1 < name.size() && name[i + 1] == 'd' &&
        (i + 2 == name.size() || name[i + 2] == '_') && std::isalpha(name[i - 1])) {
      return static_cast<size_t>(c - '0');
    }
  }
  return 0;
}

bool is_int_type(const c10::Type& t) {
  return t.kind() == c10::TypeKind::IntType || t.kind() == c10::TypeKind::SymIntType;
}

// The integers `a` holds for a parameter of type `declared` (int, int[] or
// optional of those, already known to fit): `list` says which; false if the
// parameter is of no such type or `a` is none.
bool integers_of(const c10::Type& declared, const Argument& a, c10::SmallVector<int64_t, 4>& out,
                 bool& list) {
  const c10::Type& t = unwrap_optional(declared);
  if (a.is_none()) return false;
  // A size computed at run time (a dynamic graph) is checked once known:
  // specialize() lints the graph it makes.
  bool computed = false;
  a.for_each_node([&](Node*) { computed = true; });
  if (computed) return false;
  if (is_int_type(t)) {
    out.assign(1, a.to_int());
    list = false;
    return true;
  }
  if (t.kind() != c10::TypeKind::ListType ||
      !is_int_type(*t.expectRef<c10::ListType>().getElementType())) {
    return false;
  }
  out.clear();
  for (const Argument& e : a.to_list()) out.push_back(e.to_int());
  list = true;
  return true;
}

std::string shown(const c10::SmallVector<int64_t, 4>& values, bool list) {
  if (!list) return std::to_string(values[0]);
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s + "]";
}

// Note [Integers kernels divide by]: empty, or the first argument out of range.
std::string check_integers(const std::string& op, const c10::FunctionSchema& schema,
                           const c10::SmallVector<const Argument*, 16>& given) {
  const auto& params = schema.arguments();
  c10::SmallVector<int64_t, 4> values;
  std::optional<bool> windows;  // whether a convolution or pool: found once needed
  for (size_t i = 0; i < params.size(); ++i) {
    bool list = false;
    if (given[i] == nullptr || !integers_of(*params[i].real_type(), *given[i], values, list)) {
      continue;
    }
    const std::string& name = params[i].name();
    auto what = [&] { return "argument '" + name + "' of " + op + " is " + shown(values, list); };
    if (name == "mode" && schema.name().find("embedding_bag") != std::string::npos) {
      for (int64_t v : values) {
        if (v < 0 || v > 2) return what() + "; it must be 0 (sum), 1 (mean) or 2 (max)";
      }
      continue;
    }
    const IntRange* range = int_range(name);
    if (range == nullptr) continue;
    if (range->windows_only) {
      if (!windows) windows = is_window_operator(schema);
      if (!*windows) continue;
    }
    for (int64_t v : values) {
      if (v < range->lowest || v > kMaxFactor) {
        return what() + (list ? "; each value must be" : "; it must be") + " between " +
               std::to_string(range->lowest) + " and " + std::to_string(kMaxFactor);
      }
    }
    if (!list || !range->windows_only) continue;
    // Window lists: how many values.
    size_t n = named_dimensions(schema.name());
    bool exact = false;
    for (const ExactWindows& e : kExactWindows) {
      if (schema.name() == e.op) {
        n = e.n;
        exact = true;
      }
    }
    const bool pool_stride =
        !exact && name == "stride" && schema.argumentIndexWithName("kernel_size");
    const size_t count = values.size();
    std::string allowed;
    if (n == 0) {
      if (count > 0) continue;
      allowed = "at least 1";
    } else {
      if (count == n || (!exact && count == 1) || (pool_stride && count == 0)) continue;
      allowed = exact ? "exactly " + std::to_string(n)
                      : (pool_stride ? "none, 1 or " : "1 or ") + std::to_string(n);
    }
    return "argument '" + name + "' of " + op + " has " + std::to_string(count) + " value" +
           (count == 1 ? "" : "s") + "; " + op + " takes " + allowed;
  }
  return "";
}

}  // namespace

std::string check_schema_arguments(const Node& n, const c10::FunctionSchema& schema) {
  const std::string& op = n.target();
  const auto& params = schema.arguments();
  size_t positional = 0;
  while (positional < params.size() && !params[positional].kwarg_only()) ++positional;

  if (n.args().size() > positional) {
    return op + " takes at most " + std::to_string(positional) + " positional argument(s), got " +
           std::to_string(n.args().size());
  }
  // Inline for the usual schema (a reader checks every node it makes, and
  // lint again): no allocation per node.
  c10::SmallVector<const Argument*, 16> given(params.size(), nullptr);
  for (size_t i = 0; i < n.args().size(); ++i) given[i] = &n.args()[i];
  for (const auto& kv : n.kwargs()) {
    auto idx = schema.argumentIndexWithName(kv.first);
    if (!idx) return op + " has no argument named '" + kv.first + "'";
    if (given[*idx] != nullptr) {
      return op + " got argument '" + kv.first + "' both positionally and by keyword";
    }
    given[*idx] = &kv.second;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const c10::Argument& p = params[i];
    if (given[i] == nullptr) {
      if (!p.default_value().has_value() && p.real_type()->kind() != c10::TypeKind::OptionalType) {
        return op + " is missing required argument '" + p.name() + "'";
      }
      continue;
    }
    if (!fits(*p.real_type(), *given[i])) {
      return "argument '" + p.name() + "' of " + op + " expects " + p.real_type()->str() +
             ", got " + describe(*given[i]);
    }
  }
  return check_integers(op, schema, given);
}

std::string check_size_computation(const Node& n) {
  if (!n.kwargs().empty() || n.args().size() != 2) {
    return n.target() + " takes two arguments and no keyword arguments";
  }
  if (n.target() == kSymSize) {
    if (!is_tensor_node(n.args()[0]) || !n.args()[1].is_int()) {
      return "sym_size takes (a Tensor node, a dimension), got (" + std::string(describe(n.args()[0])) +
             ", " + describe(n.args()[1]) + ")";
    }
    return "";
  }
  for (const Argument& a : n.args()) {
    if (!a.is_int() && !(a.is_node() && a.to_node()->is_size_computation())) {
      return n.target() + " takes integers or size computations, got " + describe(a);
    }
  }
  return "";
}

std::string check_getitem(const Node& n) {
  if (n.args().size() != 2 || !n.kwargs().empty() || !n.args()[0].is_node() ||
      !n.args()[1].is_int()) {
    return "getitem takes (node, index)";
  }
  const Node& src = *n.args()[0].to_node();
  Produces p = produces(src);
  if (p != Produces::Tuple && p != Produces::TensorList) {
    return "getitem reads %" + src.name() + ", which has a single value (" + describe(n.args()[0]) +
           ")";
  }
  int64_t index = n.args()[1].to_int();
  int64_t count = -1;
  if (p == Produces::Tuple) {
    count = static_cast<int64_t>(src.schema().returns().size());
  } else if (src.meta().val.kind == ValueKind::List) {
    count = static_cast<int64_t>(src.meta().val.tensors.size());
  }
  if (index < 0 || (count >= 0 && index >= count)) {
    return "getitem index " + std::to_string(index) + " is out of range for %" + src.name() +
           (count >= 0 ? ", which has " + std::to_string(count) + " values" : "");
  }
  return "";
}


// Note [Kernels that trust their arguments]
// Some arguments only the shapes of their inputs can check, and a few
// LibTorch 1.13 kernels do not check them (issue 42):
// - _reshape_alias(self, size, stride) makes the view it is given: one past
//   its input's memory reads outside it when used (SIGSEGV);
// - mkldnn_convolution reads as many padding, stride and dilation values as
//   its weight has spatial dimensions (SIGFPE, SIGSEGV with fewer);
// - _mkldnn_transpose(_) indexes the dimensions it is given (SIGSEGV);
// - native_channel_shuffle divides by channels / groups (SIGFPE when groups
//   exceed the channels, or for an empty batch);
// - unfold_backward writes where the unfold its arguments describe would have
//   read, whatever its gradient's shape (SIGSEGV);
// - _transform_bias_rescale_qkv reads its bias as long as its input's last
//   dimension, and dies on an empty batch (SIGSEGV);
// - the embedding_bag operators abort on 2-D indices with offsets, and in
//   mode max die of no bag at all (SIGSEGV).
// The loader checks these calls against the recorded metadata of their
// inputs, and refuses one whose input has none. The last four the
// structure-aware fuzzer found (fuzz/harness.h): this list samples a class
// (internal kernels that trust their inputs' shapes) that `make fuzz` and the
// smoke test of `make test` keep looking into. And operators on plain
// numbers (no tensor in, none out: aten::remainder.int divides by zero
// unchecked) are refused outright: graphs compute on tensors, the tracers
// never record them, and a graph could not use their results anyway.

namespace {

bool mentions_tensor(const c10::Type& t) {
  switch (t.kind()) {
    case c10::TypeKind::TensorType:
      return true;
    case c10::TypeKind::OptionalType:
      return mentions_tensor(*t.expectRef<c10::OptionalType>().getElementType());
    case c10::TypeKind::ListType:
      return mentions_tensor(*t.expectRef<c10::ListType>().getElementType());
    default:
      return false;
  }
}

std::string dims_str(c10::ArrayRef<int64_t> v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The highest element offset a tensor of these sizes and strides reaches
// (negative strides count nothing), or nullopt if it has no elements or
// the offset does not fit in 64 bits.
std::optional<int64_t> last_offset(c10::ArrayRef<int64_t> sizes, c10::ArrayRef<int64_t> strides) {
  int64_t last = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return std::nullopt;
    int64_t step = 0;
    if (strides[d] > 0 && (__builtin_mul_overflow(sizes[d] - 1, strides[d], &step) ||
                           __builtin_add_overflow(last, step, &last))) {
      return std::nullopt;
    }
  }
  return last;
}

// A call of one of the kernels the Note lists, as its check reads it. Its
// arguments fit the schema (check_schema_arguments passed).
class TrustingCall {
 public:
  // What input() throws when the file records no shape for the input.
  struct Unrecorded {
    std::string what;
  };

  TrustingCall(const Node& n, MetaOf meta_of)
      : n_(n), meta_of_(meta_of), given_(given_arguments(n)) {}

  const std::string& op() const { return n_.target(); }
  const std::string& param(size_t i) const { return n_.schema().arguments()[i].name(); }

  // The recorded metadata of tensor argument `i`; throws Unrecorded.
  const TensorMeta& input(size_t i) const {
    const Argument* a = given_[i];
    const TensorMeta* m = a != nullptr && a->is_node() ? meta_of_(*a->to_node()) : nullptr;
    if (m == nullptr) {
      throw Unrecorded{"argument '" + param(i) + "' of " + op() + " is " +
                       (a != nullptr && a->is_node() ? ref(i) : std::string("not a node")) +
                       ", whose shape the file does not record; the loader checks this "
                       "operator's arguments against it, as its kernel does not"};
    }
    return *m;
  }
  // "%x": the node argument `i` names.
  std::string ref(size_t i) const { return "%" + given_[i]->to_node()->name(); }
  // The integers of argument `i` (int or int[]), given or by default.
  std::vector<int64_t> ints(size_t i) const {
    std::vector<int64_t> v;
    if (const Argument* a = given_[i]) {
      if (a->is_int()) v.push_back(a->to_int());
      if (a->is_list()) {
        for (const Argument& e : a->to_list()) v.push_back(e.to_int());
      }
      return v;
    }
    const c10::IValue d = default_ivalue(n_.schema().arguments()[i]);
    if (d.isIntList()) v = d.toIntVector();
    if (d.isInt()) v.push_back(d.toInt());
    return v;
  }
  int64_t integer(size_t i) const { return ints(i).at(0); }
  // The bool argument `i`, given or by default.
  bool flag(size_t i) const {
    if (const Argument* a = given_[i]) return a->is_bool() && a->to_bool();
    const c10::IValue d = default_ivalue(n_.schema().arguments()[i]);
    return d.isBool() && d.toBool();
  }

 private:
  const Node& n_;
  MetaOf meta_of_;
  std::vector<const Argument*> given_;
};

std::string check_reshape_alias(const TrustingCall& c) {
  const TensorMeta& self = c.input(0);
  const std::vector<int64_t> sizes = c.ints(1), strides = c.ints(2);
  const std::string view = c.op() + " views " + c.ref(0) + " (sizes " + dims_str(self.sizes) +
                           ", strides " + dims_str(self.strides) + ") with sizes " +
                           dims_str(sizes) + " and strides " + dims_str(strides);
  if (sizes.size() != strides.size()) return view + ": one stride per size is needed";
  uint64_t numel = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0 || strides[d] < 0) return view + ": they cannot be negative";
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(sizes[d]), &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return view + ": more elements than 64 bits count";
    }
  }
  if (numel == 0) return "";
  const std::optional<int64_t> reach = last_offset(sizes, strides);
  const std::optional<int64_t> within = last_offset(self.sizes, self.strides);
  if (!reach || !within || *reach > *within) return view + ", which reach past its elements";
  return "";
}

// (self, weight, bias, padding, stride, dilation, groups)
std::string check_mkldnn_convolution(const TrustingCall& c) {
  const TensorMeta& weight = c.input(1);
  if (weight.sizes.size() < 3) {
    return "argument 'weight' of " + c.op() + " is " + c.ref(1) + ", of sizes " +
           dims_str(weight.sizes) + "; a convolution's weight has at least 3 dimensions";
  }
  const size_t spatial = weight.sizes.size() - 2;
  for (size_t i : {3, 4, 5}) {
    const size_t count = c.ints(i).size();
    if (count != spatial) {
      return "argument '" + c.param(i) + "' of " + c.op() + " has " + std::to_string(count) +
             " value" + (count == 1 ? "" : "s") + "; its weight " + c.ref(1) + " (sizes " +
             dims_str(weight.sizes) + ") has " + std::to_string(spatial) + " spatial dimensions";
    }
  }
  return "";
}

// (self, dim0, dim1)
std::string check_mkldnn_transpose(const TrustingCall& c) {
  const auto rank = static_cast<int64_t>(c.input(0).sizes.size());
  for (size_t i : {1, 2}) {
    const int64_t d = c.integer(i);
    if (d < -rank || d >= rank) {
      return "argument '" + c.param(i) + "' of " + c.op() + " is " + std::to_string(d) + "; " +
             c.ref(0) + " has " + std::to_string(rank) + " dimensions";
    }
  }
  return "";
}

// (self, groups)
std::string check_channel_shuffle(const TrustingCall& c) {
  const TensorMeta& self = c.input(0);
  const int64_t groups = c.integer(1);
  if (self.sizes.size() < 2 || self.sizes[0] == 0 || self.sizes[1] == 0 ||
      self.sizes[1] % groups != 0) {
    return "argument 'groups' of " + c.op() + " is " + std::to_string(groups) +
           "; its kernel needs " + c.ref(0) + " (sizes " + dims_str(self.sizes) +
           ") to have a batch and a positive multiple of it as channels";
  }
  return "";
}

// (grad_in, input_sizes, dim, size, step): the gradient of unfold(input, dim,
// size, step) for an input of sizes input_sizes; the kernel writes where
// that unfold would have read.
std::string check_unfold_backward(const TrustingCall& c) {
  const TensorMeta& grad = c.input(0);
  const std::vector<int64_t> input_sizes = c.ints(1);
  const int64_t dim = c.integer(2), size = c.integer(3), step = c.integer(4);
  const auto rank = static_cast<int64_t>(input_sizes.size());
  std::vector<int64_t> expected;  // what unfold gives (a 0-dim input unfolds as [1])
  if (dim >= -std::max<int64_t>(rank, 1) && dim < std::max<int64_t>(rank, 1) && size >= 0) {
    const int64_t d = rank == 0 ? 0 : (dim + rank) % rank;
    expected = rank == 0 ? std::vector<int64_t>{1} : input_sizes;
    const int64_t length = expected[d];
    expected[d] = length >= size ? (length - size) / step + 1 : -1;
    expected.push_back(size);
    if (rank == 0) expected.erase(expected.begin());
  }
  if (expected.empty() || c10::IntArrayRef(expected) != c10::IntArrayRef(grad.sizes)) {
    return "argument 'grad_in' of " + c.op() + " is " + c.ref(0) + " (sizes " +
           dims_str(grad.sizes) + "), which is not the gradient of unfold(dimension " +
           std::to_string(dim) + ", size " + std::to_string(size) + ", step " +
           std::to_string(step) + ") of sizes " + dims_str(input_sizes) +
           "; its kernel writes where that unfold would have read";
  }
  return "";
}

// (qkv, qkv_bias, num_heads): the attention fast path's.
std::string check_rescale_qkv(const TrustingCall& c) {
  const TensorMeta& qkv = c.input(0);
  const TensorMeta& bias = c.input(1);
  if (qkv.sizes.size() != 3 || qkv.sizes[0] == 0 || bias.sizes.size() != 1 ||
      bias.sizes[0] != qkv.sizes[2]) {
    return "arguments 'qkv' and 'qkv_bias' of " + c.op() + " are " + c.ref(0) + " (sizes " +
           dims_str(qkv.sizes) + ") and " + c.ref(1) + " (sizes " + dims_str(bias.sizes) +
           "); its kernel takes [batch of at least 1, tokens, 3 * embedding] and [3 * embedding]";
  }
  return "";
}

// (weight, indices, offsets, scale_grad_by_freq, mode, sparse,
//  per_sample_weights, include_last_offset, ...): every embedding_bag
// operator's. 2-D indices (with offsets) abort; in mode max, no bag at all
// is a SIGSEGV.
std::string check_embedding_bag(const TrustingCall& c) {
  const TensorMeta& indices = c.input(1);
  const TensorMeta& offsets = c.input(2);
  const int64_t bags = offsets.sizes.empty() ? 0 : offsets.sizes[0] - (c.flag(7) ? 1 : 0);
  if (indices.sizes.size() != 1 || offsets.sizes.size() != 1 || (c.integer(4) == 2 && bags < 1)) {
    return "arguments 'indices' and 'offsets' of " + c.op() + " are " + c.ref(1) + " (sizes " +
           dims_str(indices.sizes) + ") and " + c.ref(2) + " (sizes " + dims_str(offsets.sizes) +
           "); its kernel takes 1-D indices and offsets, and in mode 2 (max) at least one bag";
  }
  return "";
}

struct TrustingKernel {
  const char* op;
  std::string (*check)(const TrustingCall&);
};
constexpr TrustingKernel kTrustingKernels[] = {
    {"aten::_reshape_alias", check_reshape_alias},
    {"aten::mkldnn_convolution", check_mkldnn_convolution},
    {"aten::_mkldnn_transpose", check_mkldnn_transpose},
    {"aten::_mkldnn_transpose_", check_mkldnn_transpose},
    {"aten::native_channel_shuffle", check_channel_shuffle},
    {"aten::unfold_backward", check_unfold_backward},
    {"aten::_transform_bias_rescale_qkv", check_rescale_qkv},
    {"aten::embedding_bag", check_embedding_bag},
    {"aten::_embedding_bag", check_embedding_bag},
    {"aten::_embedding_bag_forward_only", check_embedding_bag},
};

}  // namespace

std::string check_trusting_kernels(const Node& n, MetaOf meta_of) {
  if (!n.is_operator()) return "";
  // Sizes computed at run time are checked in the graph specialize() makes.
  for (const Node* in : n.inputs()) {
    if (in->is_size_computation()) return "";
  }
  const c10::FunctionSchema& schema = n.schema();
  // torchcap's own check of a number read from a tensor (Note [Guards of
  // values the program read] in kernels/guards.cpp) divides by nothing.
  bool tensors = schema.name() == "torchcap::guard_value";
  for (const c10::Argument& a : schema.arguments()) {
    tensors = tensors || mentions_tensor(*a.real_type());
  }
  for (const c10::Argument& r : schema.returns()) {
    tensors = tensors || mentions_tensor(*r.real_type());
  }
  if (!tensors) {
    return n.target() +
           " computes on plain numbers, not tensors; graphs do not record such operators";
  }
  for (const TrustingKernel& k : kTrustingKernels) {
    if (schema.name() != k.op) continue;
    try {
      return k.check(TrustingCall(n, meta_of));
    } catch (const TrustingCall::Unrecorded& e) {
      return e.what;
    }
  }
  return "";
}

}  // namespace detail
}  // namespace torchcap
