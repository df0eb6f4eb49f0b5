// torchcap._C: the C++ tracer for Python programs.
//
// _C.trace calls torchcap::trace (or export_program) with a TracedFunction
// that calls the Python callable: the traced tensors cross into Python as
// ordinary torch.Tensors and come back with the result. The GIL is released
// while the tracer runs and taken again only to run Python (the callable,
// and locate_source for each node's Python stack trace), so other Python
// threads run, and trace, meanwhile.
//
// The Python front end (torchcap/_trace.py) turns the returned GraphModule
// into a torch.fx.GraphModule (build_fx, Note [Building the torch.fx graph
// directly]) whose attributes are the traced tensors themselves.
#include "graph/operator_facts.h"
#include "graph/operator_name.h"
#include "python/fx_bridge.h"
#include "python/load_bindings.h"
#include "python/runner.h"
#include "python/python_source.h"
#include "serialize/shapes.h"
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
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <c10/util/flat_hash_map.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace torchcap::python {
namespace {

// torchcap.Error and torchcap.TraceError (torchcap/_errors.py).
py::object error_class(const char* name) {
  return py::module_::import("torchcap._errors").attr(name);
}

[[noreturn]] void throw_trace_error(const std::string& message) {
  PyErr_SetString(error_class("TraceError").ptr(), message.c_str());
  throw py::error_already_set();
}

std::string type_name(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__qualname__")).cast<std::string>();
}

// A Python argument or result as an IValue: tensors, None, bool, int, float,
// str, and tuples (named ones too), lists and dicts (str or int keys) of them.
c10::IValue to_ivalue(py::handle obj, const std::string& path) {
  PyObject* p = obj.ptr();
  if (THPVariable_Check(p)) return THPVariable_Unpack(p);
  if (obj.is_none()) return c10::IValue();
  if (PyBool_Check(p)) return c10::IValue(p == Py_True);
  if (PyLong_Check(p)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
    if (overflow != 0) throw_trace_error(path + ": the int " + py::str(obj).cast<std::string>() +
                                         " does not fit in 64 bits");
    return c10::IValue(static_cast<int64_t>(v));
  }
  if (PyFloat_Check(p)) return c10::IValue(PyFloat_AS_DOUBLE(p));
  if (PyUnicode_Check(p)) return c10::IValue(obj.cast<std::string>());
  if (PyTuple_Check(p)) {
    auto t = py::reinterpret_borrow<py::tuple>(obj);
    std::vector<c10::IValue> elements;
    elements.reserve(t.size());
    for (size_t i = 0; i < t.size(); ++i) {
      elements.push_back(to_ivalue(t[i], path + "[" + std::to_string(i) + "]"));
    }
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  if (PyList_Check(p)) {
    auto l = py::reinterpret_borrow<py::list>(obj);
    c10::impl::GenericList list(c10::AnyType::get());
    list.reserve(l.size());
    for (size_t i = 0; i < l.size(); ++i) {
      list.push_back(to_ivalue(l[i], path + "[" + std::to_string(i) + "]"));
    }
    return list;
  }
  if (PyDict_Check(p)) {
    auto d = py::reinterpret_borrow<py::dict>(obj);
    std::optional<c10::impl::GenericDict> dict;
    for (auto [k, v] : d) {
      bool str_key = PyUnicode_Check(k.ptr());
      bool int_key = PyLong_Check(k.ptr()) && !PyBool_Check(k.ptr());
      std::string key_text = py::repr(k).cast<std::string>();
      if (!str_key && !int_key) {
        throw_trace_error(path + ": dict keys must be str or int, got the " + type_name(k) + " " +
                          key_text);
      }
      if (!dict) {
        c10::TypePtr key_type = str_key ? c10::TypePtr(c10::StringType::get())
                                        : c10::TypePtr(c10::IntType::get());
        dict.emplace(key_type, c10::AnyType::get());
      }
      if (str_key != (dict->keyType()->kind() == c10::TypeKind::StringType)) {
        throw_trace_error(path + ": dict keys must be all str or all int, got " + key_text);
      }
      dict->insert(to_ivalue(k, path), to_ivalue(v, path + "[" + key_text + "]"));
    }
    if (!dict) dict.emplace(c10::TypePtr(c10::StringType::get()), c10::AnyType::get());
    return *dict;
  }
  throw_trace_error(path + ": torchcap cannot trace a value of type " + type_name(obj) +
                    "; arguments and results are tensors, None, bool, int, float, str, and "
                    "tuples, lists and dicts of them");
}

// The state of a traced module: its parameters and buffers by qualified name,
// as (name, tensor) pairs from named_parameters() and named_buffers(); the
// names are moved out of the lists.
ModuleState module_state(std::vector<std::pair<std::string, py::object>>& parameters,
                         std::vector<std::pair<std::string, py::object>>& buffers) {
  ModuleState state;
  for (auto [pairs, out, kind] : {std::make_tuple(&parameters, &state.parameters, "parameter"),
                                  std::make_tuple(&buffers, &state.buffers, "buffer")}) {
    out->reserve(pairs->size());
    for (auto& [name, t] : *pairs) {
      // Registering checks this; a module's dict written directly does not.
      if (!THPVariable_Check(t.ptr())) {
        throw_trace_error(std::string("the module's ") + kind + " '" + name + "' is a " +
                          type_name(t) + ", not a tensor");
      }
      out->emplace_back(std::move(name), THPVariable_Unpack(t.ptr()));
    }
  }
  return state;
}

// A module's own `field` (`_parameters`, `_modules`, ...): its __dict__'s
// entry, read without running Python; a null object if it has none there.
py::object own_field(py::handle m, const char* field) {
  py::object dict = py::reinterpret_steal<py::object>(PyObject_GenericGetDict(m.ptr(), nullptr));
  if (!dict || !PyDict_Check(dict.ptr())) {
    PyErr_Clear();
    return py::object();
  }
  return py::reinterpret_borrow<py::object>(PyDict_GetItemString(dict.ptr(), field));
}

// Note [Walking a module in C++]
// torchcap._trace._module_contents: the parameters, buffers and (with
// `with_modules`) the (module, qualified path, class name) entries of `root`
// and its submodules, in one walk, as named_modules(), named_parameters() and
// named_buffers() list them: depth first, each module once, each tensor once
// under its first name, None skipped. The same walk in Python took several
// times as long, more right after a collection.
// Returns None if a module's class lists them its own way (`plain(cls)` is
// false; the caller asks it through its methods). `class_name(cls)` names a
// class; both are asked once per class.
py::object module_contents(py::handle root, bool with_modules, py::handle plain,
                           py::handle class_name) {
  py::list parameters, buffers, modules;
  ska::flat_hash_set<PyObject*> seen_modules, seen_parameters, seen_buffers;
  ska::flat_hash_map<PyObject*, py::object> names;  // by class; None: not plain
  // (path, module), the modules held: a mapping's items() runs Python, which
  // could take a module from its parent.
  std::vector<std::pair<py::object, py::object>> stack{
      {py::str(""), py::reinterpret_borrow<py::object>(root)}};
  std::vector<std::pair<py::object, py::object>> children;
  // Calls f(name, value) for each entry of a module's `field` container, in
  // its order; false if an entry is not a (str, value) pair, which the
  // class's own methods must list. Plain dicts and OrderedDicts are read
  // directly (an OrderedDict's keys in its order, their values from the
  // dict underneath, which is where OrderedDict keeps them); other mappings
  // through items().
  static PyObject* const ordered_dict =
      py::object(py::module_::import("collections").attr("OrderedDict")).release().ptr();
  auto for_each = [](py::handle m, const char* field, auto&& f) {
    py::object d = own_field(m, field);
    if (!d) d = m.attr(field);
    if (PyDict_CheckExact(d.ptr())) {
      Py_ssize_t pos = 0;
      PyObject *key, *value;
      while (PyDict_Next(d.ptr(), &pos, &key, &value)) {
        if (!PyUnicode_Check(key)) return false;
        f(py::handle(key), py::handle(value));
      }
      return true;
    }
    if (Py_TYPE(d.ptr()) == reinterpret_cast<PyTypeObject*>(ordered_dict)) {
      for (py::handle key : d) {
        PyObject* value = PyDict_GetItemWithError(d.ptr(), key.ptr());
        if (value == nullptr && PyErr_Occurred()) throw py::error_already_set();
        if (value == nullptr || !PyUnicode_Check(key.ptr())) return false;
        f(key, py::handle(value));
      }
      return true;
    }
    py::object items = d.attr("items")();
    for (py::handle entry : items) {
      if (!PyTuple_Check(entry.ptr()) || PyTuple_GET_SIZE(entry.ptr()) != 2 ||
          !PyUnicode_Check(PyTuple_GET_ITEM(entry.ptr(), 0))) {
        return false;
      }
      f(py::handle(PyTuple_GET_ITEM(entry.ptr(), 0)), py::handle(PyTuple_GET_ITEM(entry.ptr(), 1)));
    }
    return true;
  };
  while (!stack.empty()) {
    auto [path, m] = std::move(stack.back());
    stack.pop_back();
    if (!seen_modules.insert(m.ptr()).second) continue;
    PyObject* cls = reinterpret_cast<PyObject*>(Py_TYPE(m.ptr()));
    auto known = names.find(cls);
    if (known == names.end()) {
      py::handle c(cls);
      py::object name = plain(c).cast<bool>() ? py::object(class_name(c)) : py::none();
      known = names.emplace(cls, std::move(name)).first;
    }
    if (known->second.is_none()) return py::none();
    if (with_modules) modules.append(py::make_tuple(m, path, known->second));
    py::object prefix = PyUnicode_GET_LENGTH(path.ptr()) == 0 ? path : path + py::str(".");
    for (auto [field, out, seen] : {std::make_tuple("_parameters", &parameters, &seen_parameters),
                                    std::make_tuple("_buffers", &buffers, &seen_buffers)}) {
      bool listed = for_each(m, field, [&, out = out, seen = seen](py::handle name, py::handle t) {
        if (!t.is_none() && seen->insert(t.ptr()).second) out->append(py::make_tuple(prefix + name, t));
      });
      if (!listed) return py::none();
    }
    children.clear();
    bool listed = for_each(m, "_modules", [&](py::handle name, py::handle c) {
      if (!c.is_none()) children.emplace_back(prefix + name, py::reinterpret_borrow<py::object>(c));
    });
    if (!listed) return py::none();
    stack.insert(stack.end(), std::make_move_iterator(children.rbegin()),
                 std::make_move_iterator(children.rend()));
  }
  return py::make_tuple(parameters, buffers, modules);
}

// TraceOptions::dynamic from Python: (input, dim, name, min, max), max None
// for none.
using DynamicDims = std::vector<std::tuple<size_t, int64_t, std::string, int64_t, std::optional<int64_t>>>;

std::vector<DynamicDim> dynamic_dims(const DynamicDims& given) {
  std::vector<DynamicDim> out;
  for (const auto& [input, dim, name, min, max] : given) {
    out.push_back(DynamicDim{input, dim, name, min, max.value_or(kNoMaxSize)});
  }
  return out;
}

struct TraceRequest {
  py::object fn;
  std::vector<std::pair<std::string, py::object>> parameters;
  std::vector<std::pair<std::string, py::object>> buffers;
  py::tuple args;
  py::dict kwargs;
  bool export_program = false;
  bool inference = false;
  std::optional<std::vector<std::string>> preserve;
  bool allow_input_mutation = false;
  bool allow_data_dependent_values = false;
  bool record_stack_traces = true;
  bool meta = false;
  std::vector<std::string> internal_dirs;
  // (module, qualified path, class) of the modules that appear on module
  // stacks (PythonSource::set_modules).
  py::list modules;
  bool refuse_out_into_inputs = false;  // TraceOptions::refuse_out_into_inputs
  DynamicDims dynamic;
  // The positional arguments' names (TraceOptions::call), or none.
  std::vector<std::string> argument_names;
};

std::unique_ptr<GraphModule> run(TraceRequest& r) {
  ModuleState state = module_state(r.parameters, r.buffers);
  std::vector<c10::IValue> inputs;
  for (size_t i = 0; i < r.args.size(); ++i) {
    inputs.push_back(to_ivalue(r.args[i], "args[" + std::to_string(i) + "]"));
  }
  // Keyword arguments travel as one trailing dict input.
  const bool has_kwargs = !r.kwargs.empty();
  if (has_kwargs) inputs.push_back(to_ivalue(r.kwargs, "kwargs"));

  PyFrameObject* caller = PyThreadState_GetFrame(PyThreadState_Get());
  PythonSource source(r.internal_dirs, py::reinterpret_steal<py::object>(
                                           reinterpret_cast<PyObject*>(caller)));
  source.set_modules(std::move(r.modules));
  PythonSource::Scope scope(&source);

  TraceOptions options;
  options.inference_mode = r.inference;
  options.preserve = r.preserve;
  options.allow_input_mutation = r.allow_input_mutation;
  options.allow_data_dependent_values = r.allow_data_dependent_values;
  options.record_stack_traces = r.record_stack_traces;
  options.meta = r.meta;
  options.refuse_out_into_inputs = r.refuse_out_into_inputs;
  options.dynamic = dynamic_dims(r.dynamic);
  options.call.names = std::move(r.argument_names);
  options.call.keywords = has_kwargs;
  if (r.record_stack_traces) {
    options.locate_source = [&source](NodeMeta& meta) { source.locate(meta); };
  }

  TracedFunction fn = [&r, has_kwargs](std::vector<c10::IValue> in) -> c10::IValue {
    py::gil_scoped_acquire gil;
    size_t positional = in.size() - (has_kwargs ? 1 : 0);
    py::tuple args(positional);
    for (size_t i = 0; i < positional; ++i) args[i] = torch::jit::toPyObject(std::move(in[i]));
    py::object out;
    if (has_kwargs) {
      out = r.fn(*args, **torch::jit::toPyObject(std::move(in.back())));
    } else {
      out = r.fn(*args);
    }
    return to_ivalue(out, "output");
  };

  py::gil_scoped_release no_gil;
  GraphModule gm = r.export_program ? export_program(state, fn, inputs, options)
                                    : trace(state, fn, inputs, options);
  return std::make_unique<GraphModule>(std::move(gm));
}

// --- Training steps -------------------------------------------------------------

// torchcap.export_training's optimizer: ("none" | "sgd" | "adam" | "adamw",
// its hyperparameters by torch.optim's names).
Optimizer optimizer_of(const std::string& kind, const py::dict& o) {
  auto number = [&](const char* key, double fallback) {
    return o.contains(key) ? o[key].cast<double>() : fallback;
  };
  auto flag = [&](const char* key) { return o.contains(key) && o[key].cast<bool>(); };
  if (kind == "none") return GradientsOnly{};
  if (kind == "sgd") {
    return SGD{number("lr", 0.01), number("momentum", 0), number("dampening", 0),
               number("weight_decay", 0), flag("nesterov")};
  }
  std::pair<double, double> betas{0.9, 0.999};
  if (o.contains("betas")) betas = o["betas"].cast<std::pair<double, double>>();
  if (kind == "adam") {
    return Adam{number("lr", 1e-3), betas.first, betas.second, number("eps", 1e-8),
                number("weight_decay", 0), flag("amsgrad")};
  }
  if (kind == "adamw") {
    return AdamW{number("lr", 1e-3), betas.first, betas.second, number("eps", 1e-8),
                 number("weight_decay", 1e-2), flag("amsgrad")};
  }
  throw Error("torchcap.export_training: unknown optimizer kind '" + kind + "'");
}

struct TrainingRequest {
  py::object forward;  // module(*args)
  py::object loss;     // loss_fn(outputs, *targets)
  std::vector<std::pair<std::string, py::object>> parameters;
  std::vector<std::pair<std::string, py::object>> buffers;
  py::tuple args;
  py::tuple targets;
  std::string optimizer;
  py::dict optimizer_options;
  bool record_stack_traces = true;
  std::vector<std::string> internal_dirs;
  py::list modules;  // as TraceRequest's
  DynamicDims dynamic;  // over (*args, *targets)
};

std::unique_ptr<GraphModule> run_training(TrainingRequest& r) {
  ModuleState state = module_state(r.parameters, r.buffers);
  std::vector<c10::IValue> inputs, targets;
  for (size_t i = 0; i < r.args.size(); ++i) {
    inputs.push_back(to_ivalue(r.args[i], "args[" + std::to_string(i) + "]"));
  }
  for (size_t i = 0; i < r.targets.size(); ++i) {
    targets.push_back(to_ivalue(r.targets[i], "targets[" + std::to_string(i) + "]"));
  }
  TrainingOptions options;
  options.optimizer = optimizer_of(r.optimizer, r.optimizer_options);

  PyFrameObject* caller = PyThreadState_GetFrame(PyThreadState_Get());
  PythonSource source(r.internal_dirs, py::reinterpret_steal<py::object>(
                                           reinterpret_cast<PyObject*>(caller)));
  source.set_modules(std::move(r.modules));
  PythonSource::Scope scope(&source);
  options.trace.record_stack_traces = r.record_stack_traces;
  options.trace.dynamic = dynamic_dims(r.dynamic);
  if (r.record_stack_traces) {
    options.trace.locate_source = [&source](NodeMeta& meta) { source.locate(meta); };
  }

  TracedFunction forward = [&r](std::vector<c10::IValue> in) -> c10::IValue {
    py::gil_scoped_acquire gil;
    py::tuple args(in.size());
    for (size_t i = 0; i < in.size(); ++i) args[i] = torch::jit::toPyObject(std::move(in[i]));
    return to_ivalue(r.forward(*args), "output");
  };
  LossFunction loss = [&r](const c10::IValue& outputs, const std::vector<c10::IValue>& targets) {
    py::gil_scoped_acquire gil;
    py::tuple args(targets.size() + 1);
    args[0] = torch::jit::toPyObject(outputs);
    for (size_t i = 0; i < targets.size(); ++i) args[i + 1] = torch::jit::toPyObject(targets[i]);
    py::object value = r.loss(*args);
    if (!THPVariable_Check(value.ptr())) {
      throw_trace_error("torchcap.export_training: loss_fn must return a tensor (the loss); it "
                        "returned a " + type_name(value));
    }
    return THPVariable_Unpack(value.ptr());
  };

  py::gil_scoped_release no_gil;
  GraphModule gm = export_training(state, forward, loss, inputs, targets, options);
  return std::make_unique<GraphModule>(std::move(gm));
}

// [(role, target, parameter, state)] per output (training.h).
py::list signature_of(const GraphModule& gm) {
  py::list out;
  for (const StepOutput& o : training_signature(gm).outputs) {
    out.append(py::make_tuple(step_role_name(o.role), o.target, o.parameter, o.state));
  }
  return out;
}

py::list attributes(const GraphModule& gm) {
  py::list out;
  for (const Attribute& a : gm.attributes()) {
    out.append(py::make_tuple(a.name, attribute_kind_name(a.kind),
                              py::reinterpret_steal<py::object>(THPVariable_Wrap(a.value))));
  }
  return out;
}

// Note [The traced module's attributes]
// _attach_attributes (Note [Attributes attached on first use] in _bridge.py)
// puts the trace's attributes into the torch.fx module where
// torch.fx's constructor would: each in the plain module of its dotted prefix
// ("layer1.0.conv1" for "layer1.0.conv1.weight"), made once by
// `new_module()` and entered in its parent's `_modules`; a parameter that is
// an nn.Parameter in `_parameters`, everything else in `_buffers`. The
// module has no submodules yet. Done in Python, this was a large part of a
// trace's overhead, right after the program ran.
// Returns the (name, kind) of each attribute.
py::list attach_attributes(const GraphModule& gm, py::handle target, py::handle new_module) {
  static PyObject* const parameter_class =
      py::object(py::module_::import("torch.nn").attr("Parameter")).release().ptr();
  // A module's own container `field`.
  auto container = [](PyObject* m, const char* field) {
    py::object c = own_field(m, field);
    if (!c) {
      throw std::runtime_error(std::string("torchcap: a module of the traced torch.fx module has "
                                           "no '") + field + "'");
    }
    return c;
  };
  auto set_item = [](PyObject* mapping, std::string_view key, PyObject* value) {
    // PyObject_SetItem: an OrderedDict keeps its order only when set through it.
    py::str k(key.data(), key.size());
    if (PyObject_SetItem(mapping, k.ptr(), value) != 0) throw py::error_already_set();
  };
  // The module of each dotted prefix made so far; each is held by its parent.
  ska::flat_hash_map<std::string_view, PyObject*> owners;
  py::list listed;
  for (const Attribute& a : gm.attributes()) {
    std::string_view name = a.name;
    size_t dot = name.rfind('.');
    PyObject* owner = target.ptr();
    if (dot != std::string_view::npos) {
      std::string_view path = name.substr(0, dot);
      auto known = owners.find(path);
      if (known != owners.end()) {
        owner = known->second;
      } else {
        for (size_t start = 0;;) {
          size_t end = std::min(path.find('.', start), path.size());
          std::string_view prefix = path.substr(0, end);
          auto made = owners.find(prefix);
          if (made == owners.end()) {
            py::object child = new_module();
            set_item(container(owner, "_modules").ptr(), path.substr(start, end - start),
                     child.ptr());
            made = owners.emplace(prefix, child.ptr()).first;
          }
          owner = made->second;
          if (end == path.size()) break;
          start = end + 1;
        }
      }
    }
    py::object tensor = py::reinterpret_steal<py::object>(THPVariable_Wrap(a.value));
    int is_parameter = a.kind == AttributeKind::Parameter
                           ? PyObject_IsInstance(tensor.ptr(), parameter_class)
                           : 0;
    if (is_parameter < 0) throw py::error_already_set();
    set_item(container(owner, is_parameter ? "_parameters" : "_buffers").ptr(),
             name.substr(dot == std::string_view::npos ? 0 : dot + 1), tensor.ptr());
    listed.append(py::make_tuple(a.name, attribute_kind_name(a.kind)));
  }
  return listed;
}

// Whether an attribute is a meta tensor (a weightless graph).
bool has_meta_attributes(const GraphModule& gm) {
  const auto& attributes = gm.attributes();
  return std::any_of(attributes.begin(), attributes.end(),
                     [](const Attribute& a) { return a.value.is_meta(); });
}

// `gm` with the given attribute values: the torch.fx module's current
// tensors, which may have been replaced since the trace.
using NamedPyTensors = std::vector<std::pair<std::string, py::object>>;
GraphModule with_attributes(const GraphModule& gm, const NamedPyTensors& tensors) {
  GraphModule copy = gm.clone();
  for (const auto& [name, t] : tensors) {
    const Attribute& a = gm.attribute(name);
    copy.set_attribute(name, THPVariable_Unpack(t.ptr()), a.kind);
  }
  return copy;
}

void save_with(const GraphModule& gm, const std::string& path, const NamedPyTensors& tensors) {
  GraphModule copy = with_attributes(gm, tensors);
  py::gil_scoped_release no_gil;
  save(copy, path);
}

// Note [A pickled C++ graph]
// A torch.fx module made by torchcap.trace holds its C++ graph, which
// pickle and torch.save must carry with it. It travels as the bytes of a
// .tcg file whose attributes are metadata only (Note [Weightless tensors]):
// the torch.fx module pickles the tensors themselves. Unpickled, the graph's
// attributes are meta tensors, bound to the unpickled torch.fx module's
// tensors when the module is made again (_unpickle_traced in _trace.py).
py::bytes pickled_graph(const GraphModule& gm) {
  GraphModule weightless = gm.clone();
  for (const Attribute& a : gm.attributes()) {
    const at::Tensor& t = a.value;
    weightless.set_attribute(
        a.name, at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta)), a.kind);
  }
  std::string bytes;
  {
    py::gil_scoped_release no_gil;
    bytes = save_to_string(weightless);
  }
  return py::bytes(bytes);
}

GraphModule unpickled_graph(const py::bytes& pickled) {
  std::string_view bytes = pickled;
  py::gil_scoped_release no_gil;
  return load_from_buffer(bytes.data(), bytes.size(), "a pickled torchcap graph");
}

// Note [Kernels written in Python] (src/serialize/shapes.h): the message of
// an error a meta kernel written in Python raised, with Python's error
// indicator cleared (persist() fetches it, under the GIL).
bool read_python_error(std::exception& e, torchcap::detail::KernelError& out) {
  if (auto* error = dynamic_cast<python_error*>(&e)) {
    error->persist();
    py::gil_scoped_acquire gil;
    out.message = error->what();
    out.not_implemented =
        error->type != nullptr && PyErr_GivenExceptionMatches(error->type, PyExc_NotImplementedError);
    return true;
  }
  if (auto* error = dynamic_cast<py::error_already_set*>(&e)) {
    py::gil_scoped_acquire gil;
    out.message = error->what();
    out.not_implemented = error->matches(PyExc_NotImplementedError);
    return true;
  }
  return false;
}

}  // namespace
}  // namespace torchcap::python

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  using namespace torchcap;
  using namespace torchcap::python;
  m.doc() = "torchcap's C++ tracer, for Python programs (use the functions of torchcap)";

  // torchcap::Error subclasses become torchcap's Python exceptions of the
  // same names (torchcap/_errors.py), with the C++ message. A TypeError (a
  // traced program's result of the wrong kind) is a TraceError there; a
  // RuntimeError (a graph that failed while running) is a torchcap.Error.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const torchcap::TraceError& e) {
      PyErr_SetString(error_class("TraceError").ptr(), e.what());
    } catch (const torchcap::TypeError& e) {
      PyErr_SetString(error_class("TraceError").ptr(), e.what());
    } catch (const torchcap::InputError& e) {
      PyErr_SetString(error_class("InputError").ptr(), e.what());
    } catch (const torchcap::FormatError& e) {
      PyErr_SetString(error_class("FormatError").ptr(), e.what());
    } catch (const torchcap::WeightError& e) {
      PyErr_SetString(error_class("WeightError").ptr(), e.what());
    } catch (const torchcap::LintError& e) {
      PyErr_SetString(error_class("LintError").ptr(), e.what());
    } catch (const torchcap::PassError& e) {
      PyErr_SetString(error_class("PassError").ptr(), e.what());
    } catch (const torchcap::Error& e) {
      PyErr_SetString(error_class("Error").ptr(), e.what());
    }
  });
  // Note [Kernels written in Python] (src/serialize/shapes.h)
  torchcap::detail::set_python_error_reader(&read_python_error);

  py::class_<GraphModule> graph_module(m, "GraphModule");
  graph_module
      .def("build_fx", &build_fx, py::arg("graph"), py::arg("spec_class"), py::arg("direct") = true)
      .def("attributes", &attributes)
      .def("attach_attributes", &attach_attributes, py::arg("module"), py::arg("new_module"))
      .def("has_meta_attributes", &has_meta_attributes)
      .def("save", &save_with)
      .def("with_attributes", &with_attributes)
      .def("num_nodes", [](const GraphModule& gm) { return gm.graph().size(); })
      .def("__str__", [](const GraphModule& gm) { return gm.str(); })
      .def("code_with_source", [](const GraphModule& gm) { return gm.str(true); })
      .def("training_signature", &signature_of)
      .def("written_inputs", &torchcap::detail::written_inputs)
      // A copy made faster for inference (optimize_for_inference, passes.h).
      .def("optimized_for_inference",
           [](const GraphModule& gm) {
             GraphModule copy = gm.clone();
             optimize_for_inference(copy);
             return copy;
           })
      // A copy with the named passes run on it (passes_by_name: the names
      // the command's --passes takes).
      .def("with_passes",
           [](const GraphModule& gm, const std::vector<std::string>& names) {
             PassManager pm = passes_by_name(names);
             GraphModule copy = gm.clone();
             pm.run(copy);  // with the GIL: "shapes" may reach meta kernels written in Python
             return copy;
           })
      // The C++ module is immutable once made: copies of a torch.fx module share it.
      .def("__copy__", [](py::object self) { return self; })
      .def("__deepcopy__", [](py::object self, py::object) { return self; })
      .def(py::pickle(&pickled_graph, &unpickled_graph));

  register_load_bindings(m, graph_module);
  register_runner_bindings(m, graph_module);
  // Note [Errors raised inside operators] in src/trace/trace_state.h.
  m.def("operator_error_kind", &torchcap::detail::take_operator_error_kind, py::arg("message"));
  m.def("save_fx", [](const py::list& nodes, const py::list& attributes, const std::string& path) {
    GraphModule gm = graph_module_of_fx(nodes, attributes);
    py::gil_scoped_release no_gil;
    save(gm, path);
  });

  m.def("module_contents", &module_contents, py::arg("root"), py::arg("with_modules"),
        py::arg("plain"), py::arg("class_name"));

  m.def(
      "trace",
      [](py::object fn, std::vector<std::pair<std::string, py::object>> parameters,
         std::vector<std::pair<std::string, py::object>> buffers, py::tuple args, py::dict kwargs,
         bool export_program, bool inference, std::optional<std::vector<std::string>> preserve,
         bool allow_input_mutation, bool allow_data_dependent_values, bool record_stack_traces,
         std::vector<std::string> internal_dirs,
         py::list modules, bool meta, bool refuse_out_into_inputs,
         DynamicDims dynamic, std::vector<std::string> argument_names) {
        TraceRequest r{std::move(fn),          std::move(parameters),
                       std::move(buffers),     std::move(args),
                       std::move(kwargs),      export_program,
                       inference,              std::move(preserve),
                       allow_input_mutation,   allow_data_dependent_values,
                       record_stack_traces,    meta,
                       std::move(internal_dirs), std::move(modules),
                       refuse_out_into_inputs, std::move(dynamic),
                       std::move(argument_names)};
        return run(r);
      },
      py::arg("fn"), py::arg("parameters"), py::arg("buffers"), py::arg("args"), py::arg("kwargs"),
      py::arg("export_program"), py::arg("inference"), py::arg("preserve"),
      py::arg("allow_input_mutation"), py::arg("allow_data_dependent_values"),
      py::arg("record_stack_traces"), py::arg("internal_dirs"), py::arg("modules") = py::list(),
      py::arg("meta") = false, py::arg("refuse_out_into_inputs") = false,
      py::arg("dynamic") = DynamicDims(),
      py::arg("argument_names") = std::vector<std::string>());

  m.def(
      "export_training",
      [](py::object forward, py::object loss, std::vector<std::pair<std::string, py::object>> parameters,
         std::vector<std::pair<std::string, py::object>> buffers, py::tuple args, py::tuple targets,
         std::string optimizer, py::dict optimizer_options, bool record_stack_traces,
         std::vector<std::string> internal_dirs,
         py::list modules, DynamicDims dynamic) {
        TrainingRequest r{std::move(forward),        std::move(loss),
                          std::move(parameters),     std::move(buffers),
                          std::move(args),           std::move(targets),
                          std::move(optimizer),      std::move(optimizer_options),
                          record_stack_traces,       std::move(internal_dirs),
                          std::move(modules),        std::move(dynamic)};
        return run_training(r);
      },
      py::arg("forward"), py::arg("loss"), py::arg("parameters"), py::arg("buffers"),
      py::arg("args"), py::arg("targets"), py::arg("optimizer"), py::arg("optimizer_options"),
      py::arg("record_stack_traces"), py::arg("internal_dirs"), py::arg("modules") = py::list(),
      py::arg("dynamic") = DynamicDims());
}
