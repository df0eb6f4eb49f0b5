// Operator names as node targets spell them: "namespace::name[.overload]".
// The one place they are parsed and printed. Internal.
#pragma once

#include <ATen/core/operator_name.h>

#include <string>

namespace torchcap {
namespace detail {

// "aten::add.Tensor" -> {"aten::add", "Tensor"}; "aten::addmm" -> {"aten::addmm", ""}.
// Throws Error if `qualified` has no namespace.
c10::OperatorName parse_operator_name(const std::string& qualified);

// The reverse: "aten::add.Tensor", or "aten::addmm" without an overload.
std::string qualified_name(const c10::OperatorName& name);

// An operator's name in the forms graphs use, made once per process: nodes
// that call the operator point at it instead of holding copies (a trace made
// two or three strings per node for these, kept as long as the graph).
struct OperatorIdentity {
  c10::OperatorName name;
  std::string qualified;  // qualified_name(name)
  std::string stem;       // operator_stem(name)
};

// The one record for `name`: equal names give the same object, which lives
// until the process ends. Thread-safe.
const OperatorIdentity& operator_identity(const c10::OperatorName& name);

// "aten::add" -> "aten".
std::string operator_namespace(const c10::OperatorName& name);

// "aten::add" -> "add": the readable stem a node calling the operator is named by.
std::string operator_stem(const c10::OperatorName& name);

}  // namespace detail
}  // namespace torchcap
