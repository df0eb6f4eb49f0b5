// Tracing TorchScript modules (torch::jit::load).
#include <torchcap/error.h>
#include <torchcap/tracer.h>

#include "trace/trace_state.h"

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <unordered_map>

namespace torchcap {
namespace {

// "__torch__.torchvision.models.resnet.___torch_mangle_3.BasicBlock" ->
// "torchvision.models.resnet.BasicBlock": the Python class the module was
// scripted from.
std::string python_class_name(const c10::QualifiedName& name) {
  std::string out;
  for (const std::string& atom : name.atoms()) {
    if (atom == "__torch__" || atom.rfind("___torch_mangle_", 0) == 0) continue;
    if (!out.empty()) out += '.';
    out += atom;
  }
  return out;
}

std::string strip(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Note [Source locations of TorchScript nodes]
// A TorchScript module's graph executor runs an inlined graph; every JIT node
// knows where it came from: its own SourceRange, the call sites of the
// functions inlined around it, and the module instance of each inlined method
// (the name of the submodule attribute, or SELF for a method of the same
// module). LibTorch exposes, for the node executing on this thread, the
// source ranges (torch::jit::currentCallstack) and the module instances as
// "name(Class)::function" strings (torch::jit::currentModuleHierarchy), not
// the node itself. The ranges point into the code TorchScript serialized;
// findSourceRangeThatGenerated maps them back to the user's Python source.
// Several recorded operators share one JIT node and one JIT node runs once
// per module instance, so the derived metadata is cached by the callstack's
// identity (ranges and hierarchy): each distinct location is resolved once and
// its nodes share one StackTrace and one ModuleStack.
class TorchScriptLocator {
 public:
  explicit TorchScriptLocator(torch::jit::Module& module) {
    for (const auto& m : module.named_modules()) {
      class_of_path_.emplace(m.name, python_class_name(*m.value.type()->name()));
    }
  }

  void operator()(NodeMeta& meta) {
    std::vector<torch::jit::StackEntry> calls = torch::jit::currentCallstack();
    if (calls.empty()) return;  // an operator run outside the TorchScript interpreter
    std::vector<std::string> hierarchy = torch::jit::currentModuleHierarchy();
    std::string key;
    for (const torch::jit::StackEntry& e : calls) {
      const void* source = e.range.source().get();
      key.append(reinterpret_cast<const char*>(&source), sizeof(source));
      size_t span[2] = {e.range.start(), e.range.end()};
      key.append(reinterpret_cast<const char*>(span), sizeof(span));
      key += e.filename;
      key += '\n';
    }
    for (const std::string& h : hierarchy) key += h + '\n';

    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      it = cache_.emplace(std::move(key), Location{StackTrace::from_frames(frames_of(calls)),
                                                   modules_of(hierarchy)})
               .first;
    }
    meta.stack_trace = it->second.stack_trace;
    meta.module_stack = it->second.module_stack;
  }

 private:
  struct Location {
    StackTrace stack_trace;
    ModuleStack module_stack;
  };

  // Innermost first, as StackTrace keeps C++ frames.
  static std::vector<SourceFrame> frames_of(const std::vector<torch::jit::StackEntry>& calls) {
    std::vector<SourceFrame> frames;
    for (const torch::jit::StackEntry& e : calls) {
      c10::optional<torch::jit::SourceRange> original = e.range.findSourceRangeThatGenerated();
      const torch::jit::SourceRange& range = original ? *original : e.range;
      SourceFrame f;
      f.function = e.filename;  // StackEntry's "filename" is the function's name
      const auto& source = range.source();
      if (!source || source->filename().value_or("").empty()) continue;  // made by the compiler
      size_t line = source->lineno_for_offset(range.start());
      f.line = static_cast<int>(source->lineno_to_source_lineno(line));
      f.file = *source->filename();
      f.code = strip(source->get_line(line).str());
      frames.push_back(std::move(f));
    }
    return frames;
  }

  // currentModuleHierarchy: "TOP(Class)::forward", then one entry per
  // function called: "name(Class)::fn" for a method of submodule `name`,
  // "SELF(Class)::fn" for another method of the same module, "::fn" or
  // "CALL_FUNCTION::f(...)::fn" for a free function. The root module is the
  // first frame, path "".
  ModuleStack modules_of(const std::vector<std::string>& hierarchy) const {
    std::vector<ModuleFrame> frames;
    std::string path;
    for (size_t i = 0; i < hierarchy.size(); ++i) {
      const std::string& h = hierarchy[i];
      size_t paren = h.find('(');
      if (paren == std::string::npos || paren == 0) continue;  // a free function
      std::string name = h.substr(0, paren);
      if (name.find(':') != std::string::npos) continue;  // a free function
      if (i == 0) {
        name.clear();
      } else if (name == "SELF") {
        continue;
      } else if (name == "INSTANCE_NAME_UNKNOWN" || name == "UNKNOWN_INSTANCE") {
        break;  // the path below here cannot be named
      } else {
        path = path.empty() ? name : path + "." + name;
      }
      if (!frames.empty() && frames.back().path == path && i != 0) continue;
      auto cls = class_of_path_.find(path);
      frames.push_back(ModuleFrame{path, cls != class_of_path_.end() ? cls->second : ""});
    }
    return ModuleStack(std::move(frames));
  }

  std::unordered_map<std::string, std::string> class_of_path_;
  std::mutex mu_;
  std::unordered_map<std::string, Location> cache_;
};

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= s.size()) {
    size_t nl = s.find('\n', start);
    lines.push_back(s.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return lines;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// "~~~~~~ <--- HERE": TorchScript's mark under the range that failed.
bool is_highlight(const std::string& trimmed) {
  return !trimmed.empty() && trimmed[0] == '~' &&
         trimmed.find_first_not_of("~") == trimmed.find(" <--- HERE");
}

// Note [Errors from inside a TorchScript model]
// The TorchScript interpreter turns any exception raised under it (an
// operator's, the model's own `raise`, or the tracer's refusal) into one text:
// "The following operation failed...", a traceback of the serialized code,
// one of the user's original Python code (each frame a `File` line, a few
// lines of context and a `~~~ <--- HERE` mark), then "Class: message". That
// text is thousands of characters on several lines; users need the message
// and where in their model it happened. This keeps the message as the summary
// and, from the last traceback (the original code when TorchScript has it),
// each frame's `File` line and the line its mark points at. Returns nullopt
// for texts without a traceback.
std::optional<ModelError> model_error_from(const std::string& text) {
  std::vector<std::string> lines = split_lines(text);
  size_t begin = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (starts_with(lines[i], "Traceback of TorchScript")) begin = i + 1;
  }
  if (begin == lines.size()) return std::nullopt;
  // The message starts at "Class: text" after the last mark. Source lines of
  // the context can start at column 0 too (a module-level function's `def`),
  // so an unindented line alone does not end the traceback.
  size_t message_at = lines.size();
  size_t last_mark = begin;
  for (size_t i = begin; i < lines.size(); ++i) {
    if (is_highlight(strip(lines[i]))) last_mark = i + 1;
  }
  static const std::regex exception_line(R"(^[A-Za-z_][A-Za-z0-9_.]*: )");
  for (size_t i = last_mark; i < lines.size() && message_at == lines.size(); ++i) {
    if (std::regex_search(lines[i], exception_line)) message_at = i;
  }
  for (size_t i = begin; i < lines.size() && message_at == lines.size(); ++i) {
    if (!lines[i].empty() && lines[i][0] != ' ') message_at = i;  // no mark: the first unindented line
  }
  std::string traceback, message;
  std::string previous;  // the last source line seen in the current frame
  bool frame_has_code = false;
  for (size_t i = begin; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    std::string trimmed = strip(line);
    if (i >= message_at) {
      if (!trimmed.empty()) message += (message.empty() ? "" : " ") + trimmed;
    } else if (starts_with(trimmed, "File \"")) {
      traceback += "  " + trimmed + "\n";
      frame_has_code = false;
      previous.clear();
    } else if (is_highlight(trimmed)) {
      if (!frame_has_code && !previous.empty()) traceback += "    " + previous + "\n";
      frame_has_code = true;
    } else if (!trimmed.empty()) {
      previous = trimmed;
    }
  }
  if (starts_with(message, "RuntimeError: ")) message.erase(0, std::strlen("RuntimeError: "));
  if (message.empty()) message = "an error without a message";
  if (!traceback.empty() && traceback.back() == '\n') traceback.pop_back();
  return ModelError("the model failed: " + message, traceback);
}

}  // namespace

ModuleState ModuleState::of(torch::jit::Module& module) {
  ModuleState state;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) state.parameters.emplace_back(p.name, p.value);
  for (const auto& b : module.named_buffers(/*recurse=*/true)) state.buffers.emplace_back(b.name, b.value);
  return state;
}

TraceResult trace_with_outputs(torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
                               const TraceOptions& options) {
  auto forward = [&module](std::vector<c10::IValue> args) {
    // Unoptimised execution: no fusion groups or specialisations, so the
    // operators that reach the tracer are the ones the module's code calls.
    torch::jit::GraphOptimizerEnabledGuard no_optimization(false);
    try {
      return module.forward(std::move(args));
    } catch (const Error&) {
      throw;
    } catch (const c10::Error& e) {
      if (auto error = model_error_from(e.what_without_backtrace())) throw *error;
      throw;
    } catch (const std::exception& e) {
      if (auto error = model_error_from(e.what())) throw *error;
      throw;
    }
  };
  TraceOptions with_locations = options;
  if (!with_locations.locate_source) {
    auto locator = std::make_shared<TorchScriptLocator>(module);
    with_locations.locate_source = [locator](NodeMeta& meta) { (*locator)(meta); };
  }
  if (with_locations.call.empty()) {
    // forward's parameters name the inputs (Note [Calling convention]).
    const auto& parameters = module.get_method("forward").function().getSchema().arguments();
    for (size_t i = 1; i < parameters.size() && i <= inputs.size(); ++i) {
      with_locations.call.names.push_back(parameters[i].name());
    }
  }
  return detail::run_trace(forward, inputs, with_locations, ModuleState::of(module));
}

GraphModule trace(torch::jit::Module& module, const std::vector<c10::IValue>& inputs,
                  const TraceOptions& options) {
  return trace_with_outputs(module, inputs, options).module;
}

}  // namespace torchcap
