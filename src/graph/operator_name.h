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

// "aten::add" -> "aten".
std::string operator_namespace(const c10::OperatorName& name);

// "aten::add" -> "add": the readable stem a node calling the operator is named by.
std::string operator_stem(const c10::OperatorName& name);

}  // namespace detail
}  // namespace torchcap
