// The bridge between torchcap's C++ graphs and torch.fx, both ways: a
// torch.fx graph built from a C++ module (build_fx, for traced, exported and
// loaded modules alike), and a GraphModule of a torch.fx graph of aten
// operators (graph_module_of_fx, for torchcap.save of make_fx's graphs).
#include "python/fx_bridge.h"

#include "graph/operator_facts.h"
#include "graph/operator_name.h"
#include "python/python_source.h"
#include "trace/trace_state.h"
#include <torchcap/error.h>
#include <torchcap/export.h>
#include <torchcap/graph_module.h>
#include <torchcap/passes.h>
#include <torchcap/serialize.h>
#include <torchcap/tracer.h>
#include <torchcap/training.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <c10/util/flat_hash_map.h>
#include <pybind11/stl.h>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace torchcap::python {
namespace {
namespace py = pybind11;

// --- The torch.fx graph -------------------------------------------------------
// Note [Building the torch.fx graph directly]
// The graph could reach Python as a file that torchcap.load reads; but the
// loader checks everything a file may get wrong and cost, a node, as much
// that way as make_fx's whole trace. A trace is known to
// be well formed, so its nodes are made here, with the loader's conventions
// (node names, operator targets, "val" and "tensor_meta", the code generator
// the Python front end sets).
//
// Note [Creating torch.fx nodes directly]
// Graph.create_node costs more than recording the operator did: in Python, it
// makes the name unique with regular expressions and copies the arguments
// three times through map_arg to find the input nodes. Here a node is made
// as Graph.create_node and Node.__init__ make it, without running them: the
// same attributes in the same order with the same kinds of values (args a
// tuple with immutable_list for lists, kwargs an immutable_dict, the input
// nodes and each input's users in argument order), registered in the graph's
// namespace, linked at the graph's end, counted in its length. That this
// torch.fx makes nodes so is checked once per process against a node
// create_node made; if it does not, and for each name the namespace would
// change (not an identifier, a builtin's, taken, "x_01"), create_node makes
// the node.

// The torch.fx objects direct node creation needs, looked up once per process.
struct FxApi {
  py::object node_type;
  py::object immutable_list;
  py::object immutable_dict;
  py::object tensor_metadata;  // torch.fx.passes.shape_prop.TensorMetadata
  py::object builtins;         // builtins.__dict__
  py::object keywords;         // frozenset(keyword.kwlist)
  py::object custom_builtins;  // torch.fx.graph._custom_builtins
  bool direct = false;         // Note [Creating torch.fx nodes directly] holds
  // Node's attributes, in the order Node.__init__ sets them.
  std::vector<py::str> attrs;
  py::str users, prev, next, len, root, graph_namespace, used_names, obj_to_name, insert, prepend;

  static const FxApi& get() {
    // Never destroyed: Python objects must not be released after the
    // interpreter is gone.
    static const FxApi* api = new FxApi();
    return *api;
  }

 private:
  FxApi() {
    py::module_ fx = py::module_::import("torch.fx");
    py::module_ collections = py::module_::import("torch.fx.immutable_collections");
    node_type = fx.attr("Node");
    immutable_list = collections.attr("immutable_list");
    immutable_dict = collections.attr("immutable_dict");
    tensor_metadata = py::module_::import("torch.fx.passes.shape_prop").attr("TensorMetadata");
    builtins = py::module_::import("builtins").attr("__dict__");
    keywords = py::module_::import("builtins")
                   .attr("frozenset")(py::module_::import("keyword").attr("kwlist"));
    custom_builtins = py::module_::import("torch.fx.graph").attr("_custom_builtins");
    for (const char* a : {"graph", "name", "op", "target", "_input_nodes", "_args", "_kwargs",
                          "users", "type", "_prev", "_next", "_erased", "_repr_fn", "meta"}) {
      attrs.push_back(py::reinterpret_steal<py::str>(PyUnicode_InternFromString(a)));
    }
    users = py::str("users");
    prev = py::str("_prev");
    next = py::str("_next");
    len = py::str("_len");
    root = py::str("_root");
    graph_namespace = py::str("_graph_namespace");
    used_names = py::str("_used_names");
    obj_to_name = py::str("_obj_to_name");
    insert = py::str("_insert");
    prepend = py::str("prepend");
    direct = check_layout(fx);
  }

  // Whether create_node makes nodes as Note [Creating torch.fx nodes
  // directly] describes.
  bool check_layout(const py::module_& fx) const {
    try {
      py::object g = fx.attr("Graph")();
      py::object a = g.attr("create_node")("placeholder", "a", py::arg("name") = "a");
      py::object b = g.attr("create_node")(
          "call_function", py::module_::import("operator").attr("getitem"),
          py::make_tuple(a, py::list(py::make_tuple(a, 1))), py::dict(), py::arg("name") = "b");
      py::list keys(b.attr("__dict__").attr("keys")());
      if (keys.size() != attrs.size()) return false;
      for (size_t i = 0; i < attrs.size(); ++i) {
        if (!py::object(keys[i]).equal(attrs[i])) return false;
      }
      py::object ns = g.attr(graph_namespace);
      py::object names = ns.attr(obj_to_name), inputs = b.attr("_input_nodes");
      py::object length = g.attr(len), root_node = g.attr(root);
      py::object last = root_node.attr(prev), after = b.attr(next);
      py::object inserts = g.attr(insert), prepends = root_node.attr(prepend);
      py::object second = py::tuple(b.attr("_args"))[1];
      return py::type::handle_of(b.attr("_kwargs")).is(immutable_dict) &&
             py::type::handle_of(second).is(immutable_list) && py::len(inputs) == 1 &&
             inputs.contains(a) && a.attr("users").contains(b) &&
             py::isinstance<py::dict>(ns.attr(used_names)) && py::isinstance<py::dict>(names) &&
             py::object(names[b]).equal(py::str("b")) && length.equal(py::int_(2)) &&
             last.is(b) && after.is(root_node) && inserts.equal(prepends);
    } catch (const py::error_already_set&) {
      return false;
    }
  }
};

class FxBuilder {
 public:
  // `direct`: make nodes as Note [Creating torch.fx nodes directly] says
  // where it holds (false: always with create_node, which tests compare).
  FxBuilder(py::object graph, bool direct)
      : api_(FxApi::get()),
        graph_(std::move(graph)),
        create_node_(graph_.attr("create_node")),
        getitem_(py::module_::import("operator").attr("getitem")),
        ops_(py::module_::import("torch").attr("ops")) {
    // Direct creation only in a graph as new: empty, appending at its end.
    py::object length = graph_.attr(api_.len), inserts = graph_.attr(api_.insert),
               prepends = graph_.attr(api_.root).attr(api_.prepend);
    direct_ = direct && api_.direct && length.equal(py::int_(0)) && inserts.equal(prepends);
    if (direct_) {
      root_ = graph_.attr(api_.root);
      last_ = root_;
      py::object ns = graph_.attr(api_.graph_namespace);
      used_names_ = ns.attr(api_.used_names);
      obj_to_name_ = ns.attr(api_.obj_to_name);
    }
  }

  // Adds the nodes of `g`; returns {name: fx node} of its placeholders.
  py::dict build(const Graph& g) {
    py::dict placeholders;
    static const py::str placeholder_op("placeholder"), get_attr_op("get_attr"),
        call_function_op("call_function");
    for (const Node* n : g.nodes()) {
      py::object node;
      py::str name(n->name());
      switch (n->op()) {
        case OpCode::Placeholder:
          node = make_node(placeholder_op, name, name, py::tuple(), py::dict());
          placeholders[name] = node;
          break;
        case OpCode::GetAttr:
          node = make_node(get_attr_op, py::str(n->target()), name, py::tuple(), py::dict());
          break;
        case OpCode::CallFunction: {
          py::tuple args(n->args().size());
          for (size_t i = 0; i < n->args().size(); ++i) {
            PyTuple_SET_ITEM(args.ptr(), i, argument(n->args()[i]).release().ptr());
          }
          py::dict kwargs;
          for (const auto& [k, v] : n->kwargs()) kwargs[py::str(k)] = argument(v);
          node = make_node(call_function_op,
                           n->is_getitem()             ? getitem_
                           : n->is_size_computation() ? size_target(n->target())
                                                      : op(n->target()),
                           name, std::move(args), std::move(kwargs));
          break;
        }
        case OpCode::Output:
          flush_length();
          node = graph_.attr("output")(plain(argument(n->args().at(0))));
          last_ = node;
          break;
      }
      env_.emplace(n, node);
      set_meta(n->meta(), node.attr("meta"));
    }
    flush_length();
    return placeholders;
  }

  py::object node(const Node* n) const { return env_.at(n); }

 private:
  // A node as graph.create_node(op, target, args, kwargs, name=name) makes it
  // (Note [Creating torch.fx nodes directly]). `args` and `kwargs` hold lists
  // as immutable_list already.
  py::object make_node(const py::str& op, py::object target, const py::str& name, py::tuple args,
                       py::dict kwargs) {
    if (!direct_ || !plain_name(name)) {
      flush_length();
      py::object node = create_node_(op, target, plain(args), plain(kwargs),
                                     py::arg("name") = name);
      last_ = node;
      return node;
    }
    py::object node = py::reinterpret_steal<py::object>(
        PyBaseObject_Type.tp_new(reinterpret_cast<PyTypeObject*>(api_.node_type.ptr()),
                                 empty_tuple().ptr(), nullptr));
    if (!node) throw py::error_already_set();
    py::dict inputs;
    collect_inputs(args, inputs);
    collect_inputs(kwargs, inputs);
    py::object frozen_kwargs = api_.immutable_dict();
    if (PyDict_Update(frozen_kwargs.ptr(), kwargs.ptr()) != 0) throw py::error_already_set();
    const py::object values[] = {graph_, name, op, std::move(target), inputs, std::move(args),
                                 std::move(frozen_kwargs), py::dict(), py::none(), last_, root_,
                                 py::bool_(false), py::none(), py::dict()};
    for (size_t i = 0; i < api_.attrs.size(); ++i) {
      if (PyObject_SetAttr(node.ptr(), api_.attrs[i].ptr(), values[i].ptr()) != 0) {
        throw py::error_already_set();
      }
    }
    for (auto [input, _] : inputs) {
      py::object users = input.attr(api_.users);
      if (PyDict_SetDefault(users.ptr(), node.ptr(), Py_None) == nullptr) {
        throw py::error_already_set();
      }
    }
    // The namespace as create_name and associate_name_with_obj leave it.
    PyDict_SetItem(used_names_.ptr(), name.ptr(), zero().ptr());
    PyDict_SetItem(obj_to_name_.ptr(), node.ptr(), name.ptr());
    // Linked as root.prepend(node) links it.
    last_.attr(api_.next) = node;
    root_.attr(api_.prev) = node;
    last_ = node;
    ++pending_length_;
    return node;
  }

  // Whether the graph's namespace would keep `name` as it is (torch.fx's
  // _Namespace.create_name with no object).
  bool plain_name(const py::str& name) const {
    Py_ssize_t size = 0;
    const char* s = PyUnicode_AsUTF8AndSize(name.ptr(), &size);
    if (s == nullptr) throw py::error_already_set();
    if (size == 0 || (s[0] >= '0' && s[0] <= '9')) return false;
    Py_ssize_t underscore = -1;
    for (Py_ssize_t i = 0; i < size; ++i) {
      char c = s[i];
      bool digit = c >= '0' && c <= '9';
      if (!digit && !(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') && c != '_') return false;
      if (c == '_') underscore = i;
    }
    // "x_07" becomes "x_7": a numeric suffix is rewritten without leading zeros.
    if (underscore >= 0 && size - underscore > 2 && s[underscore + 1] == '0') {
      bool numeric = true;
      for (Py_ssize_t i = underscore + 1; i < size; ++i) numeric = numeric && s[i] >= '0' && s[i] <= '9';
      if (numeric) return false;
    }
    return !contains(used_names_, name) && !contains(api_.keywords, name) &&
           !contains(api_.builtins, name) && !contains(api_.custom_builtins, name);
  }

  static bool contains(const py::object& container, const py::str& key) {
    int found = PySequence_Contains(container.ptr(), key.ptr());
    if (found < 0) throw py::error_already_set();
    return found == 1;
  }

  // The distinct nodes among `value`'s arguments, in order, into `inputs`.
  void collect_inputs(py::handle value, py::dict& inputs) const {
    PyObject* p = value.ptr();
    if (PyTuple_Check(p) || PyList_Check(p)) {
      for (py::handle e : value) collect_inputs(e, inputs);
    } else if (PyDict_Check(p)) {
      for (auto [k, v] : py::reinterpret_borrow<py::dict>(value)) collect_inputs(v, inputs);
    } else if (Py_TYPE(p) == reinterpret_cast<PyTypeObject*>(api_.node_type.ptr()) ||
               PyObject_IsInstance(p, api_.node_type.ptr()) == 1) {
      if (PyDict_SetDefault(inputs.ptr(), p, Py_None) == nullptr) throw py::error_already_set();
    }
  }

  // `value` with immutable_lists as plain lists, as create_node takes them
  // (Node.__init__ makes immutable_lists of them again).
  py::object plain(py::handle value) const {
    PyObject* p = value.ptr();
    if (PyList_Check(p)) {
      py::list l;
      for (py::handle e : value) l.append(plain(e));
      return l;
    }
    if (PyTuple_Check(p)) {
      py::tuple t(PyTuple_GET_SIZE(p));
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(p); ++i) {
        PyTuple_SET_ITEM(t.ptr(), i, plain(PyTuple_GET_ITEM(p, i)).release().ptr());
      }
      return t;
    }
    if (PyDict_Check(p)) {
      py::dict d;
      for (auto [k, v] : py::reinterpret_borrow<py::dict>(value)) d[k] = plain(v);
      return d;
    }
    return py::reinterpret_borrow<py::object>(value);
  }

  void flush_length() {
    if (pending_length_ == 0) return;
    py::int_ length = graph_.attr(api_.len);
    graph_.attr(api_.len) = py::int_(length.cast<Py_ssize_t>() + pending_length_);
    pending_length_ = 0;
  }

  static const py::tuple& empty_tuple() {
    static const py::tuple* t = new py::tuple();
    return *t;
  }

  static const py::int_& zero() {
    static const py::int_* z = new py::int_(0);
    return *z;
  }

  py::object op(const std::string& target) {
    auto it = ops_by_name_.find(target);
    if (it != ops_by_name_.end()) return it->second;
    c10::OperatorName parsed = torchcap::detail::parse_operator_name(target);
    std::string overload = parsed.overload_name.empty() ? "default" : parsed.overload_name;
    py::object fn = ops_.attr(torchcap::detail::operator_namespace(parsed).c_str())
                        .attr(torchcap::detail::operator_stem(parsed).c_str())
                        .attr(overload.c_str());
    return ops_by_name_.emplace(target, fn).first->second;
  }

  py::object argument(const Argument& a) {
    switch (a.storage().index()) {
      case 0: return py::none();
      case 1: return env_.at(a.to_node());
      case 2: return py::int_(a.to_int());
      case 3: return py::float_(a.to_double());
      case 4: return py::bool_(a.to_bool());
      case 5: return py::str(a.to_string());
      case 6:
        return py::reinterpret_borrow<py::object>(
            reinterpret_cast<PyObject*>(torch::getTHPDtype(a.to_scalar_type())));
      case 7:
        return py::reinterpret_borrow<py::object>(
            reinterpret_cast<PyObject*>(torch::getTHPLayout(a.to_layout())));
      case 8: return py::reinterpret_steal<py::object>(THPDevice_New(a.to_device()));
      case 9:  // a new reference, as torch's own pybind11 caster takes it
        return py::reinterpret_steal<py::object>(
            torch::utils::getTHPMemoryFormat(a.to_memory_format()));
      default: {
        // As Node.__init__ stores lists (map_arg makes immutable_lists).
        py::object l = api_.immutable_list();
        for (const Argument& e : a.to_list()) {
          if (PyList_Append(l.ptr(), argument(e).ptr()) != 0) throw py::error_already_set();
        }
        return l;
      }
    }
  }

  // torchcap.load's _tensor_metadata(dtype, sizes, strides): a TensorMetadata
  // with no grad, no memory format, not quantized. Nodes of the same dtype,
  // sizes and strides share one, as an immutable value (a tuple) may: fewer
  // objects to make, and for Python's collector to walk afterwards.
  py::object tensor_meta(const TensorMeta& t) {
    auto key = std::make_tuple(t.dtype, std::vector<int64_t>(t.sizes.begin(), t.sizes.end()),
                               std::vector<int64_t>(t.strides.begin(), t.strides.end()));
    auto known = tensor_metas_.find(key);
    if (known != tensor_metas_.end()) return known->second;
    py::object made = make_tensor_meta(t);
    tensor_metas_.emplace(std::move(key), made);
    return made;
  }

  py::object make_tensor_meta(const TensorMeta& t) {
    py::object shape = py::reinterpret_steal<py::object>(
        THPSize_NewFromSizes(static_cast<int>(t.sizes.size()), t.sizes.data()));
    if (!shape) throw py::error_already_set();
    py::tuple stride(t.strides.size());
    for (size_t i = 0; i < t.strides.size(); ++i) {
      PyTuple_SET_ITEM(stride.ptr(), i, PyLong_FromLongLong(t.strides[i]));
    }
    py::handle dtype(reinterpret_cast<PyObject*>(torch::getTHPDtype(t.dtype)));
    PyObject* fields[] = {shape.ptr(), dtype.ptr(), Py_False, stride.ptr(), Py_None, Py_False,
                          nullptr};
    py::dict qparams;
    fields[6] = qparams.ptr();
    // A NamedTuple: a tuple of its own class, as tuple.__new__(cls, fields) makes it.
    auto* cls = reinterpret_cast<PyTypeObject*>(api_.tensor_metadata.ptr());
    py::object meta = py::reinterpret_steal<py::object>(cls->tp_alloc(cls, 7));
    if (!meta) throw py::error_already_set();
    for (int i = 0; i < 7; ++i) {
      Py_INCREF(fields[i]);
      PyTuple_SET_ITEM(meta.ptr(), i, fields[i]);
    }
    return meta;
  }

  void set_meta(const NodeMeta& m, py::object meta) {
    static const py::str val_key("val"), tensor_meta_key("tensor_meta"),
        stack_trace_key("stack_trace"), module_stack_key("nn_module_stack");
    switch (m.val.kind) {
      case ValueKind::Tensor: {
        py::object v = tensor_meta(m.val.tensors.at(0));
        meta[val_key] = v;
        meta[tensor_meta_key] = v;
        break;
      }
      case ValueKind::Tuple:
      case ValueKind::List: {
        py::list l;
        for (const TensorMeta& t : m.val.tensors) l.append(tensor_meta(t));
        py::object v = m.val.kind == ValueKind::Tuple ? py::object(py::tuple(l)) : py::object(l);
        meta[val_key] = v;
        meta[tensor_meta_key] = v;
        break;
      }
      default:
        break;
    }
    if (!m.stack_trace.empty()) {
      const void* key = &m.stack_trace.frames();
      auto it = stack_texts_.find(key);
      if (it == stack_texts_.end()) it = stack_texts_.emplace(key, py::str(m.stack_trace.str())).first;
      meta[stack_trace_key] = it->second;
    }
    if (!m.module_stack.empty()) {
      // Nodes of one module call share the stack's strings, each its own dict.
      const void* key = &m.module_stack.frames();
      auto it = module_stacks_.find(key);
      if (it == module_stacks_.end()) {
        py::dict modules;
        for (const ModuleFrame& f : m.module_stack.frames()) {
          py::str path(f.path);
          modules[path] = py::make_tuple(path, f.type);
        }
        it = module_stacks_.emplace(key, std::move(modules)).first;
      }
      meta[module_stack_key] = py::reinterpret_steal<py::object>(PyDict_Copy(it->second.ptr()));
    }
  }

  const FxApi& api_;
  py::object graph_;
  py::object create_node_;
  // A size computation's target, as torch.fx's symbolic traces have it:
  // torch.ops.aten.sym_size, operator.add, ...
  py::object size_target(const std::string& target) {
    if (target == kSymSize) return ops_.attr("aten").attr("sym_size");
    return py::module_::import("operator").attr(target.c_str());
  }
  py::object getitem_;
  py::object ops_;
  bool direct_ = false;
  py::object root_;
  py::object last_;  // the graph's last node (its root while empty)
  py::object used_names_;
  py::object obj_to_name_;
  Py_ssize_t pending_length_ = 0;  // nodes made directly, not yet in graph._len
  std::unordered_map<const Node*, py::object> env_;
  std::unordered_map<std::string, py::object> ops_by_name_;
  std::unordered_map<const void*, py::object> stack_texts_;
  std::map<std::tuple<c10::ScalarType, std::vector<int64_t>, std::vector<int64_t>>, py::object> tensor_metas_;
  std::unordered_map<const void*, py::object> module_stacks_;
};

py::object spec_object(const TreeSpec& s, const py::object& spec_class) {
  static const char* kinds[] = {"leaf", "none", "constant", "tuple", "list", "dict"};
  const char* kind = kinds[static_cast<int>(s.kind())];
  py::list children;
  for (const TreeSpec& c : s.children()) children.append(spec_object(c, spec_class));
  py::list keys;
  for (const c10::IValue& k : s.keys()) keys.append(torch::jit::toPyObject(k));
  py::object value = s.kind() == TreeSpec::Kind::Constant ? torch::jit::toPyObject(s.constant_value())
                                                          : py::none();
  return spec_class(kind, children, keys, value);
}

// Fills `graph` (an empty torch.fx.Graph) with the nodes of `gm`; returns the
// in and out specs as `spec_class(kind, children, keys, value)` objects, the
// (kind, target) of each mutation output, and the placeholders by name.
}  // namespace

py::tuple fx_specs(const GraphModule& gm, py::object spec_class) {
  py::list mutations;
  for (const OutputSpec& o : gm.output_specs) {
    if (o.kind == OutputKind::BufferMutation) mutations.append(py::make_tuple("buffer_mutation", o.target));
    if (o.kind == OutputKind::InputMutation) mutations.append(py::make_tuple("input_mutation", o.target));
  }
  return py::make_tuple(spec_object(gm.in_spec, spec_class), spec_object(gm.out_spec, spec_class),
                        mutations);
}

py::tuple build_fx(const GraphModule& gm, py::object graph, py::object spec_class, bool direct) {
  FxBuilder builder(std::move(graph), direct);
  py::dict placeholders = builder.build(gm.graph());
  py::tuple specs = fx_specs(gm, std::move(spec_class));
  return py::make_tuple(specs[0], specs[1], specs[2], placeholders);
}

namespace {

// --- A torch.fx graph of aten operators, as a GraphModule (for saving) -----

class FxReader {
 public:
  FxReader() : node_class_(py::module_::import("torch.fx").attr("Node")) {}

  // `nodes`: (op, name, target, args, kwargs, tensor meta or None) per node,
  // with operator targets as qualified names ("aten::add.Tensor") or
  // "getitem", and the output's results flattened into one list.
  // `tensor meta`: (dtype, sizes, strides). `attributes`: (name, kind, tensor).
  GraphModule read(const py::list& nodes, const py::list& attributes) {
    GraphModule gm;
    Graph& g = gm.graph();
    for (py::handle entry : nodes) {
      auto t = entry.cast<py::tuple>();
      auto op = t[0].cast<std::string>();
      name_ = t[1].cast<std::string>();
      auto target = t[2].cast<std::string>();
      Node* n = nullptr;
      if (op == "placeholder") {
        n = g.placeholder(name_, name_);
      } else if (op == "get_attr") {
        n = g.get_attr(target, name_);
      } else if (op == "call_function") {
        ArgumentList args = arguments(t[3], "args");
        Kwargs kwargs;
        for (auto [k, v] : t[4].cast<py::dict>()) {
          kwargs.emplace_back(k.cast<std::string>(), argument(v, k.cast<std::string>()));
        }
        if (is_size_target(target)) {
          n = g.size_computation(target, std::move(args), name_);
        } else if (target == kGetItem) {
          if (args.size() != 2 || !args[0].is_node() || !args[1].is_int()) {
            throw Error("node %" + name_ + ": getitem takes (node, index)");
          }
          n = g.getitem(args[0].to_node(), args[1].to_int(), name_);
        } else {
          n = g.call_function(target, std::move(args), std::move(kwargs), name_);
        }
      } else if (op == "output") {
        n = g.output(arguments(t[3], "results"));
      } else {
        throw Error("node %" + name_ + ": torchcap cannot store '" + op +
                    "' nodes; only placeholder, get_attr, call_function and output");
      }
      if (!t[5].is_none()) {
        auto m = t[5].cast<py::tuple>();
        TensorMeta tm;
        tm.dtype = reinterpret_cast<THPDtype*>(m[0].ptr())->scalar_type;
        tm.sizes = m[1].cast<std::vector<int64_t>>();
        tm.strides = m[2].cast<std::vector<int64_t>>();
        n->meta().val = ValueMeta::tensor(std::move(tm));
      }
      nodes_.emplace(name_, n);
    }
    for (py::handle entry : attributes) {
      auto a = entry.cast<py::tuple>();
      auto kind = a[1].cast<std::string>();
      gm.set_attribute(a[0].cast<std::string>(), THPVariable_Unpack(a[2].ptr()),
                       kind == "parameter" ? AttributeKind::Parameter
                       : kind == "buffer"  ? AttributeKind::Buffer
                                           : AttributeKind::Constant);
    }
    gm.set_flat_specs();
    gm.lint();
    return gm;
  }

 private:
  ArgumentList arguments(py::handle seq, const std::string& what) {
    Argument a = argument(seq, what);
    return a.to_list();
  }

  Argument argument(py::handle obj, const std::string& what) {
    PyObject* p = obj.ptr();
    if (obj.is_none()) return Argument();
    if (py::isinstance(obj, node_class_)) {
      auto it = nodes_.find(obj.attr("name").cast<std::string>());
      if (it == nodes_.end()) throw Error("node %" + name_ + ": " + what + " names a later node");
      return Argument(it->second);
    }
    if (PyBool_Check(p)) return Argument(p == Py_True);
    if (PyLong_Check(p)) return Argument(obj.cast<int64_t>());
    if (PyFloat_Check(p)) return Argument(PyFloat_AS_DOUBLE(p));
    if (PyUnicode_Check(p)) return Argument(obj.cast<std::string>());
    if (THPDtype_Check(p)) return Argument(reinterpret_cast<THPDtype*>(p)->scalar_type);
    if (THPLayout_Check(p)) return Argument(reinterpret_cast<THPLayout*>(p)->layout);
    if (THPDevice_Check(p)) return Argument(reinterpret_cast<THPDevice*>(p)->device);
    if (THPMemoryFormat_Check(p)) return Argument(reinterpret_cast<THPMemoryFormat*>(p)->memory_format);
    if (PyList_Check(p) || PyTuple_Check(p)) {
      ArgumentList l;
      size_t i = 0;
      for (py::handle e : obj) l.push_back(argument(e, what + "[" + std::to_string(i++) + "]"));
      return Argument(std::move(l));
    }
    throw Error("node %" + name_ + ": " + what + " is a " +
                py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>() +
                ", which torchcap cannot store");
  }

  py::object node_class_;
  std::string name_;
  std::unordered_map<std::string, Node*> nodes_;
};

}  // namespace

GraphModule graph_module_of_fx(const py::list& nodes, const py::list& attributes) {
  return FxReader().read(nodes, attributes);
}

}  // namespace torchcap::python
