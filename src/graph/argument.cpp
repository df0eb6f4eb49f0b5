#include <torchcap/argument.h>

#include <cstring>

namespace torchcap {

const char* Argument::kind_name() const {
  static constexpr const char* kNames[] = {"none",   "node",       "int",    "float",
                                           "bool",   "str",        "dtype",  "layout",
                                           "device", "memory_format", "list"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == std::variant_size_v<Storage>);
  return kNames[value_.index()];
}

bool operator==(const Argument& a, const Argument& b) {
  if (a.value_.index() != b.value_.index()) return false;
  if (a.is_double()) {
    // Bitwise, so that NaN equals itself and -0.0 differs from 0.0: two nodes
    // with equal arguments must compute the same thing.
    double x = a.to_double(), y = b.to_double();
    return std::memcmp(&x, &y, sizeof(double)) == 0;
  }
  return a.value_ == b.value_;
}

}  // namespace torchcap
