// _C.read_graph: the graph of a `.tcg` file, read by the C++ one-pass reader
// (Note [Reading the usual file in one pass] in src/serialize/reader.cpp),
// as compact tuples that torchcap/_load.py turns into torch.fx nodes
// (Note [The graph read in C++] there). Python's json would take longer to
// parse the nodes than all of this takes.
#include "python/load_bindings.h"

#include "serialize/format.h"
#include "serialize/reader.h"

#include <torchcap/graph_module.h>

#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchcap::python {
namespace {

namespace py = pybind11;

class Tuples {
 public:
  // (name, op, target, args, kwargs or None, val index or -1, stack trace
  // text or None, module stack or None) for each node of `g`, in order.
  py::list nodes(const Graph& g) {
    py::list out;
    int64_t i = 0;
    for (const Node* n : g.nodes()) {
      index_.emplace(n, i++);
      py::tuple args(n->args().size());
      for (size_t k = 0; k < n->args().size(); ++k) args[k] = argument(n->args()[k]);
      py::object kwargs = py::none();
      if (!n->kwargs().empty()) {
        py::list pairs;
        for (const auto& [key, value] : n->kwargs()) pairs.append(py::make_tuple(key, argument(value)));
        kwargs = pairs;
      }
      const NodeMeta& m = n->meta();
      out.append(py::make_tuple(py::str(n->name()), op_names_[static_cast<int>(n->op())],
                                target(n->target()), args, kwargs, val_index(m.val),
                                stack_text(m.stack_trace), module_stack(m.module_stack)));
    }
    return out;
  }

  // The distinct values' metadata the nodes' val indices refer to: (kind,
  // ((dtype name, sizes, strides), ...)).
  const py::list& vals() const { return vals_; }

 private:
  // Strings many nodes share are made once.
  py::object target(const std::string& t) {
    auto it = targets_.find(t);
    if (it == targets_.end()) it = targets_.emplace(t, py::str(t)).first;
    return it->second;
  }

  // A node is (index,); a dtype, layout, memory format or device (tag,
  // name) with the format's names (Note [Wire tokens]); lists are lists.
  py::object argument(const Argument& a) {
    switch (a.storage().index()) {
      case 0: return py::none();
      case 1: {
        // One tuple per node, however many nodes use it.
        const size_t i = static_cast<size_t>(index_.at(a.to_node()));
        if (refs_.size() <= i) refs_.resize(i + 1);
        if (!refs_[i]) refs_[i] = py::make_tuple(i);
        return refs_[i];
      }
      case 2: return py::int_(a.to_int());
      case 3: return py::float_(a.to_double());
      case 4: return py::bool_(a.to_bool());
      case 5: return py::str(a.to_string());
      case 6: return py::make_tuple("dtype", format::dtype_name(a.to_scalar_type()));
      case 7: return py::make_tuple("layout", format::token_name(format::kLayouts, a.to_layout()));
      case 8: return py::make_tuple("device", a.to_device().str());
      case 9:
        return py::make_tuple("memory_format",
                              format::token_name(format::kMemoryFormats, a.to_memory_format()));
      default: {
        py::list l;
        for (const Argument& e : a.to_list()) l.append(argument(e));
        return l;
      }
    }
  }

  py::object val_index(const ValueMeta& v) {
    if (!v.known()) return py::int_(-1);
    std::string key = std::to_string(static_cast<int>(v.kind));
    for (const TensorMeta& t : v.tensors) {
      key += '|' + std::to_string(static_cast<int>(t.dtype));
      for (int64_t s : t.sizes) key += ',' + std::to_string(s);
      key += ';';
      for (int64_t s : t.strides) key += ',' + std::to_string(s);
    }
    auto [it, fresh] = vals_by_key_.emplace(std::move(key), py::len(vals_));
    if (fresh) {
      py::tuple tensors(v.tensors.size());
      for (size_t i = 0; i < v.tensors.size(); ++i) {
        const TensorMeta& t = v.tensors[i];
        tensors[i] = py::make_tuple(format::dtype_name(t.dtype), py::tuple(py::cast(c10::IntArrayRef(t.sizes).vec())),
                                    py::tuple(py::cast(c10::IntArrayRef(t.strides).vec())));
      }
      vals_.append(py::make_tuple(format::token_name(format::kValueKinds, v.kind), tensors));
    }
    return py::int_(it->second);
  }

  // torch.fx's stack_trace text, as the Python loader writes it: the frames
  // innermost last, one `  File "f", line N, in fn` each, then its code.
  py::object stack_text(const StackTrace& s) {
    const std::vector<SourceFrame>& frames = s.frames();
    if (frames.empty()) return py::none();
    auto it = stacks_.find(&frames);
    if (it != stacks_.end()) return it->second;
    std::string text;
    for (auto f = frames.rbegin(); f != frames.rend(); ++f) {
      text += "  File \"" + f->file + "\", line " + std::to_string(f->line) + ", in " + f->function +
              "\n";
      if (!f->code.empty()) text += "    " + f->code + "\n";
    }
    return stacks_.emplace(&frames, py::str(text)).first->second;
  }

  // ((path, (path, type)), ...), outermost first: what torch.fx's
  // nn_module_stack dict is made from.
  py::object module_stack(const ModuleStack& s) {
    if (s.empty()) return py::none();
    const std::vector<ModuleFrame>& frames = s.frames();
    auto it = module_stacks_.find(&frames);
    if (it != module_stacks_.end()) return it->second;
    py::tuple out(frames.size());
    for (size_t i = 0; i < frames.size(); ++i) {
      py::str path(frames[i].path);
      out[i] = py::make_tuple(path, py::make_tuple(path, py::str(frames[i].type)));
    }
    return module_stacks_.emplace(&frames, out).first->second;
  }

  // In the order of OpCode's enumerators.
  const py::str op_names_[4] = {py::str("placeholder"), py::str("get_attr"),
                                py::str("call_function"), py::str("output")};
  std::unordered_map<std::string, py::object> targets_;
  std::vector<py::object> refs_;
  std::unordered_map<const Node*, int64_t> index_;
  std::unordered_map<std::string, size_t> vals_by_key_;
  py::list vals_;
  std::unordered_map<const void*, py::object> stacks_, module_stacks_;
};

// None if the file cannot be read in one pass (torchcap/_load.py then reads
// it itself and names what is wrong); else (nodes_begin, nodes_end, nodes,
// vals): where the "nodes" array is in the JSON section, and Tuples' lists.
py::object read_graph(const std::string& path) {
  std::optional<detail::OnePassRead> read;
  {
    py::gil_scoped_release no_gil;
    read = detail::read_in_one_pass(path);
  }
  if (!read) return py::none();
  Tuples tuples;
  py::list nodes = tuples.nodes(read->module.graph());
  return py::make_tuple(read->nodes_begin, read->nodes_end, nodes, tuples.vals());
}

}  // namespace

void register_load_bindings(py::module_& m) {
  m.def("read_graph", &read_graph, py::arg("path"),
        "The graph of a .tcg file as tuples, for torchcap.load; None if it must be read in Python");
}

}  // namespace torchcap::python
