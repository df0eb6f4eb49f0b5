// Metadata recorded on nodes: what value a node produced when it was traced
// ("val" in torch.fx) and where in the user's program it came from.
#pragma once

#include <torchcap/symbolic.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace torchcap {

// Sizes or strides: up to five dimensions inline, as LibTorch keeps them. A
// trace records both for every value it computes; a heap block for each was
// a large share of what recording a node costs.
using Dims = c10::SmallVector<int64_t, 5>;

// Dtype, shape, strides and device of a tensor, without its data.
struct TensorMeta {
  c10::ScalarType dtype = c10::ScalarType::Float;
  Dims sizes;
  Dims strides;
  c10::Device device = c10::Device(c10::kCPU);
  // In a dynamic graph (symbolic.h), the sizes and strides as expressions of
  // the symbols, when some depend on them; `sizes` and `strides` are then
  // those of the trace the graph was kept from. Null in static graphs.
  std::shared_ptr<const SymbolicShape> symbolic;

  static TensorMeta of(const at::Tensor& t);

  int64_t numel() const;
  bool is_contiguous() const;
  // "f32[2, 10]", "f32[s0, 10]"; strides are not shown.
  std::string str() const;

  friend bool operator==(const TensorMeta& a, const TensorMeta& b) {
    return a.dtype == b.dtype && a.sizes == b.sizes && a.strides == b.strides &&
           a.device == b.device &&
           (a.symbolic == b.symbolic ||
            (a.symbolic != nullptr && b.symbolic != nullptr && *a.symbolic == *b.symbolic));
  }
  friend bool operator!=(const TensorMeta& a, const TensorMeta& b) { return !(a == b); }
};

// Short dtype names as torch.fx and Inductor print them: f32, i64, b8, ...
const char* dtype_short_name(c10::ScalarType t);

// The shape of the value a node produces.
enum class ValueKind : uint8_t {
  Unknown,  // not recorded (hand-built nodes)
  Tensor,   // one tensor: tensors[0]
  Tuple,    // several outputs (topk, max.dim): tensors[i] is output i
  List,     // a Tensor[] (split, unbind): tensors[i] is element i
  None,     // nothing (ops that return ())
};

struct ValueMeta {
  ValueKind kind = ValueKind::Unknown;
  // One inline: most operators return one tensor, and a trace or a load
  // records a value for every node.
  c10::SmallVector<TensorMeta, 1> tensors;

  static ValueMeta tensor(TensorMeta m) {
    ValueMeta v;  // not {kind, {m}}: an initializer list would copy m
    v.kind = ValueKind::Tensor;
    v.tensors.push_back(std::move(m));
    return v;
  }

  bool known() const { return kind != ValueKind::Unknown; }
  // "f32[2, 3]", "(f32[2, 3], i64[2, 3])", "[f32[2], f32[2]]", "None", "" when unknown.
  std::string str() const;

  friend bool operator==(const ValueMeta& a, const ValueMeta& b) {
    return a.kind == b.kind && a.tensors == b.tensors;
  }
  friend bool operator!=(const ValueMeta& a, const ValueMeta& b) { return !(a == b); }
};

// One frame of a user's program: where a node was created.
struct SourceFrame {
  std::string file;      // source file, as recorded in the debug info
  int line = 0;          // 0 when unknown
  std::string function;  // demangled, may be empty
  // The source line itself, stripped, when the front end knows it (Python and
  // TorchScript programs); empty for C++ frames.
  std::string code;

  friend bool operator==(const SourceFrame& a, const SourceFrame& b) {
    return a.file == b.file && a.line == b.line && a.function == b.function && a.code == b.code;
  }
};

// Where a node was created. Capture is cheap (return addresses only); the
// frames are symbolized on the first call to `frames()` and cached. A stack
// trace may also hold frames that were never raw addresses (loaded from a
// file, or carried over from another graph). Copies share the same state.
class StackTrace {
 public:
  StackTrace() = default;

  // Captures the calling thread's stack, skipping `skip` innermost frames.
  static StackTrace capture(int skip = 0);
  // A stack trace made of already symbolized frames.
  static StackTrace from_frames(std::vector<SourceFrame> frames);

  bool empty() const;
  // The user's frames, innermost first: frames inside torchcap, LibTorch, the
  // C++ standard library and the C runtime are left out.
  const std::vector<SourceFrame>& frames() const;
  // Python-traceback style, innermost last, one `  File "f", line N, in fn`
  // per frame followed, when known, by `    code` (torch.fx's stack_trace text).
  std::string str() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// One module whose forward was running when a node was recorded (an entry of
// torch.fx's `nn_module_stack`).
struct ModuleFrame {
  std::string path;  // qualified name in the traced model: "layer1.0.conv1"
  std::string type;  // the module's class: "torch.nn.modules.conv.Conv2d"

  friend bool operator==(const ModuleFrame& a, const ModuleFrame& b) {
    return a.path == b.path && a.type == b.type;
  }
};

// The modules enclosing a node, outermost first. Copies share one immutable
// list, so consecutive nodes of one module cost a pointer each.
class ModuleStack {
 public:
  ModuleStack() = default;
  explicit ModuleStack(std::vector<ModuleFrame> frames);

  bool empty() const { return frames_ == nullptr || frames_->empty(); }
  const std::vector<ModuleFrame>& frames() const;
  // "layer1.0.conv1 (Conv2d)": the innermost module and its class's last name
  // component; empty when the stack is.
  std::string innermost_str() const;

  friend bool operator==(const ModuleStack& a, const ModuleStack& b) { return a.frames() == b.frames(); }
  friend bool operator!=(const ModuleStack& a, const ModuleStack& b) { return !(a == b); }

 private:
  std::shared_ptr<const std::vector<ModuleFrame>> frames_;
};

struct NodeMeta {
  ValueMeta val;
  StackTrace stack_trace;
  ModuleStack module_stack;
};

}  // namespace torchcap
