// Note [Guards of values the program read]
// A program that reads a value out of a tensor (`.item()`, `float(t)`, a
// tensor as a condition, at::equal) makes a plain number of it, and what it
// then does with the number (a branch, a size, an argument) is invisible to
// the tracer: the graph holds it as the trace saw it. Where that value
// depends on an input, the tracer refuses the read (Note [Data-dependent
// values] in graph/operator_facts.cpp), unless the program allows it
// (TraceOptions::allow_data_dependent_values, allow_data_dependent_values=True
// in Python). Then the value is baked in *and guarded*: the read stays in
// the graph, followed by
//
//   torchcap::guard_value(%read, traced_value, what)
//
// (for a read of memory itself, .tolist() or .numpy(), guard_values of the
// tensor and a copy of its traced values) which compares what the read gives on every run with the value traced
// and fails, naming the read and both values, when they differ: the graph
// would compute what the program computes on the traced value, not on this
// run's, which is never given as an answer. A read of a value no input can
// change (Note [Values no input can change] in trace/tracer.cpp) is a
// constant and needs no guard.
//
// The operator returns nothing, so dead-code elimination keeps it and the
// read it checks (Node::has_side_effects). It is registered wherever
// libtorchcap is loaded (the command, the C++ library, torchcap._C).
#include <torchcap/error.h>

#include <ATen/core/ivalue.h>
#include <ATen/ops/equal.h>
#include <c10/core/Scalar.h>
#include <torch/library.h>

#include <cmath>
#include <sstream>
#include <string>

namespace torchcap {
namespace detail {
namespace {

std::string scalar_str(const c10::Scalar& s) {
  std::ostringstream os;
  if (s.isBoolean()) {
    os << (s.toBool() ? "True" : "False");
  } else if (s.isIntegral(false)) {
    os << s.toLong();
  } else if (s.isFloatingPoint()) {
    os.precision(17);
    os << s.toDouble();
  } else {
    os << s.toComplexDouble();
  }
  return os.str();
}

// A tensor's values for a message: all of them when few, else its shape.
std::string values_str(const at::Tensor& t) {
  if (t.numel() > 16) return "a tensor of sizes " + c10::str(t.sizes());
  const at::Tensor flat = t.reshape({-1});
  std::string out;
  for (int64_t i = 0; i < flat.numel(); ++i) out += (i ? ", " : "") + scalar_str(flat[i].item());
  return t.dim() == 0 ? out : "[" + out + "]";
}

bool same_value(const c10::Scalar& a, const c10::Scalar& b) {
  if (a.isFloatingPoint() || b.isFloatingPoint()) {
    const double x = a.toDouble(), y = b.toDouble();
    return x == y || (std::isnan(x) && std::isnan(y));
  }
  if (a.isComplex() || b.isComplex()) return a.toComplexDouble() == b.toComplexDouble();
  if (a.isBoolean() || b.isBoolean()) return a.toBool() == b.toBool();
  return a.toLong() == b.toLong();
}

void guard_value(const c10::Scalar& value, const c10::Scalar& expected, c10::string_view what) {
  if (same_value(value, expected)) return;
  throw Error("the traced program read a value out of a tensor that was " + scalar_str(expected) +
              " when it was traced and is " + scalar_str(value) + " in this run; the graph holds what "
              "the program did with " + scalar_str(expected) + ", so it cannot compute this run's "
              "answer. Trace on inputs that give this value, or keep the computation in tensors "
              "(torch.where instead of a branch). Read by " + std::string(what));
}

// A tensor whose memory the program read directly (.tolist(), .numpy(), a
// data pointer), against its values when traced.
void guard_values(const at::Tensor& value, const at::Tensor& expected, c10::string_view what) {
  if (value.sizes() == expected.sizes() && value.scalar_type() == expected.scalar_type() &&
      at::equal(value, expected)) {
    return;
  }
  throw Error("the traced program read the values of a tensor directly, which were " +
              values_str(expected) + " when it was traced and are " + values_str(value) +
              " in this run; the graph holds what the program did with the traced ones, so it "
              "cannot compute this run's answer. Trace on inputs that give these values, or keep "
              "the computation in tensors. Read by " + std::string(what));
}

TORCH_LIBRARY_FRAGMENT(torchcap, m) {
  m.def("guard_value(Scalar value, Scalar expected, str what) -> ()", guard_value);
  m.def("guard_values(Tensor value, Tensor expected, str what) -> ()", guard_values);
}

}  // namespace
}  // namespace detail
}  // namespace torchcap
