#include "graph/operator_name.h"

#include <torchcap/error.h>

#include <memory>
#include <mutex>
#include <unordered_map>

namespace torchcap {
namespace detail {

c10::OperatorName parse_operator_name(const std::string& qualified) {
  size_t ns = qualified.find("::");
  if (ns == std::string::npos || ns == 0 || ns + 2 >= qualified.size()) {
    throw Error("'" + qualified +
                "' is not a qualified operator name; expected namespace::name[.overload], "
                "e.g. aten::add.Tensor");
  }
  size_t dot = qualified.find('.', ns + 2);
  if (dot == std::string::npos) return {qualified, ""};
  return {qualified.substr(0, dot), qualified.substr(dot + 1)};
}

std::string qualified_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

const OperatorIdentity& operator_identity(const c10::OperatorName& name) {
  // Bounded by the operators a process calls, a few thousand at most, so
  // records are never dropped; a deregistered operator's record stays
  // for the nodes that still name it. Never destroyed either: graphs that
  // outlive static destruction (a Python interpreter finalizing at exit)
  // still read their targets.
  static std::mutex& mutex = *new std::mutex;
  static auto& known =
      *new std::unordered_map<c10::OperatorName, std::unique_ptr<const OperatorIdentity>>;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(name);
  if (it == known.end()) {
    auto made = std::make_unique<const OperatorIdentity>(
        OperatorIdentity{name, qualified_name(name), operator_stem(name)});
    it = known.emplace(name, std::move(made)).first;
  }
  return *it->second;
}

std::string operator_namespace(const c10::OperatorName& name) {
  size_t ns = name.name.find("::");
  return ns == std::string::npos ? std::string() : name.name.substr(0, ns);
}

std::string operator_stem(const c10::OperatorName& name) {
  size_t ns = name.name.find("::");
  return ns == std::string::npos ? name.name : name.name.substr(ns + 2);
}

}  // namespace detail
}  // namespace torchcap
