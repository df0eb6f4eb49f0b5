// torchcap: trace, show and run captured programs from the command line.
//
//   torchcap trace MODEL.pt --input 1x3x224x224 [-o OUT.tcg] [--export] [--json]
//   torchcap trace --example resnet18 [-o OUT.tcg]
//   torchcap examples
//   torchcap show FILE.tcg [--summary|--graph|--code|--dot] [--svg OUT.svg] [--json]
//   torchcap run FILE.tcg [--input ...] [--json]
#include <torchcap/error.h>
#include <torchcap/export.h>
#include <torchcap/interpreter.h>
#include <torchcap/passes.h>
#include <torchcap/printer.h>
#include <torchcap/serialize.h>
#include <torchcap/summary.h>
#include <torchcap/tracer.h>

#include "cli/cli_inputs.h"
#include "cli/memory_view.h"
#include "zoo.h"

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace torchcap::cli {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Progress for long steps, on stderr, only when stderr is a terminal: piped
// output stays clean.
class Progress {
 public:
  Progress() : tty_(::isatty(STDERR_FILENO) == 1) {}
  ~Progress() { done(); }
  void step(const std::string& what) {
    if (!tty_) return;
    std::fprintf(stderr, "\r\033[K%s...", what.c_str());
    std::fflush(stderr);
    shown_ = true;
  }
  void done() {
    if (tty_ && shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }

 private:
  bool tty_;
  bool shown_ = false;
};

json summary_json(const GraphModule& gm) {
  GraphSummary s = summarize(gm);
  json j;
  j["nodes"] = s.nodes;
  j["placeholders"] = s.placeholders;
  j["get_attr"] = s.get_attrs;
  j["call_function"] = s.call_functions;
  j["outputs"] = s.outputs;
  j["ops"] = json::object();
  for (const auto& [op, count] : s.ops) j["ops"][op] = count;
  return j;
}

std::vector<c10::IValue> as_ivalues(const std::vector<at::Tensor>& ts) {
  return std::vector<c10::IValue>(ts.begin(), ts.end());
}

// The model and its inputs, for `trace`.
struct Program {
  std::string name;
  std::shared_ptr<torch::jit::Module> script;
  std::unique_ptr<examples::Example> example;
  std::vector<c10::IValue> inputs;
};

size_t forward_arity(const torch::jit::Module& m) {
  const auto& schema = m.get_method("forward").function().getSchema();
  return schema.arguments().size() - 1;  // self
}

Program load_program(const std::string& model, const std::string& example,
                     const std::vector<std::string>& input_specs, Progress& progress) {
  Program p;
  if (!example.empty()) {
    p.name = example;
    p.example = std::make_unique<examples::Example>(examples::make(example));
    if (input_specs.empty()) {
      p.inputs = p.example->make_inputs(0);
    } else {
      for (const std::string& s : input_specs) p.inputs.push_back(parse_input(s));
      size_t expected = p.example->make_inputs(0).size();
      if (p.inputs.size() != expected) {
        throw Error("example '" + example + "' takes " + std::to_string(expected) +
                    " input(s), got " + std::to_string(p.inputs.size()) + " --input");
      }
    }
    return p;
  }
  p.name = model;
  progress.step("loading " + model);
  try {
    p.script = std::make_shared<torch::jit::Module>(torch::jit::load(model));
  } catch (const c10::Error& e) {
    throw Error("cannot load TorchScript file '" + model + "': " + e.what_without_backtrace());
  }
  p.script->eval();
  if (input_specs.empty()) {
    throw Error("give the inputs of '" + model + "' with --input, e.g. --input 1x3x224x224");
  }
  for (const std::string& s : input_specs) p.inputs.push_back(parse_input(s));
  size_t arity = forward_arity(*p.script);
  if (p.inputs.size() != arity) {
    throw Error("the forward of '" + model + "' takes " + std::to_string(arity) + " input(s), got " +
                std::to_string(p.inputs.size()) + " --input");
  }
  return p;
}

// What the program computes, run eagerly on `inputs`.
c10::IValue run_eager(Program& p, const std::vector<c10::IValue>& inputs) {
  at::NoGradGuard no_grad;
  if (p.script) return p.script->forward(inputs);
  examples::Example fresh = examples::make(p.name);  // untouched by the trace
  return fresh.forward(inputs);
}

std::vector<c10::IValue> clone_all(const std::vector<c10::IValue>& in) {
  std::vector<c10::IValue> out;
  for (const c10::IValue& v : in) {
    auto [leaves, spec] = tree_flatten(v);
    std::vector<c10::IValue> copies;
    for (const at::Tensor& t : leaves) copies.emplace_back(t.clone());
    out.push_back(spec.unflatten(copies));
  }
  return out;
}

int cmd_trace(const std::string& model, const std::string& example,
              const std::vector<std::string>& input_specs, bool inference,
              const std::string& preserve, bool do_export, bool keep_dead, const std::string& output,
              bool as_json) {
  if (model.empty() == example.empty()) {
    throw Error("trace takes a TorchScript file or --example NAME (one of them)");
  }
  Progress progress;
  Program p = load_program(model, example, input_specs, progress);

  TraceOptions options;
  options.inference_mode = inference;
  if (!preserve.empty()) {
    std::vector<std::string> ops;
    size_t start = 0;
    while (start <= preserve.size()) {
      size_t comma = preserve.find(',', start);
      std::string op = preserve.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!op.empty()) ops.push_back(op);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    options.preserve = ops;
  }

  progress.step(std::string(do_export ? "exporting " : "tracing ") + p.name);
  std::vector<c10::IValue> trace_inputs = clone_all(p.inputs);
  auto t0 = Clock::now();
  GraphModule gm;
  if (p.script) {
    gm = do_export ? export_program(*p.script, trace_inputs, options) : trace(*p.script, trace_inputs, options);
  } else if (do_export) {
    gm = p.example->module ? export_program(*p.example->module, p.example->forward, trace_inputs, options)
                           : export_program(p.example->forward, trace_inputs, options);
  } else {
    gm = examples::trace(*p.example, options, trace_inputs);
  }
  double trace_ms = ms_since(t0);
  // What the program computed and never used (the empty tensors a BatchNorm
  // decomposition makes for statistics eval mode does not keep, say) goes, as
  // in export; --keep-dead shows the trace as recorded.
  if (!keep_dead) eliminate_dead_code(gm.graph());
  gm.lint();

  progress.step("checking the graph against the model");
  c10::IValue expected = run_eager(p, clone_all(p.inputs));
  c10::IValue actual = Interpreter(gm).run(clone_all(p.inputs));
  double diff = examples::max_abs_diff(actual, expected);

  if (!output.empty()) {
    progress.step("saving " + output);
    save(gm, output);
  }
  progress.done();

  if (as_json) {
    json j = summary_json(gm);
    j["trace_ms"] = trace_ms;
    j["max_abs_diff"] = diff;
    if (!output.empty()) j["file"] = output;
    std::cout << j.dump() << "\n";
  } else {
    GraphSummary s = summarize(gm);
    std::printf("%s %s: %zu nodes (%zu placeholder, %zu get_attr, %zu call_function, %zu output) in %.1f ms\n",
                do_export ? "exported" : "traced", p.name.c_str(), s.nodes, s.placeholders, s.get_attrs,
                s.call_functions, s.outputs, trace_ms);
    std::printf("max |graph - eager| = %g\n", diff);
    if (!output.empty()) std::printf("saved %s\n", output.c_str());
  }
  return 0;
}

void render_svg(const std::string& dot_source, const std::string& svg_path) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) throw Error("cannot start Graphviz: no pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[0], STDIN_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  std::string out_flag = "-o" + svg_path;
  std::vector<char*> argv = {const_cast<char*>("dot"), const_cast<char*>("-Tsvg"),
                             out_flag.data(), nullptr};
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, "dot", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[0]);
  if (rc != 0) {
    ::close(pipe_fds[1]);
    throw Error("cannot run Graphviz's dot to render '" + svg_path + "' (is graphviz installed?)");
  }
  const char* data = dot_source.data();
  size_t left = dot_source.size();
  while (left > 0) {
    ssize_t n = ::write(pipe_fds[1], data, left);
    if (n <= 0) break;
    data += n;
    left -= static_cast<size_t>(n);
  }
  ::close(pipe_fds[1]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw Error("Graphviz's dot failed to render '" + svg_path + "'");
  }
}

int cmd_show(const std::string& file, bool graph, bool code, bool dot, const std::string& svg,
             bool as_json) {
  GraphModule gm = load(file);
  if (!svg.empty()) {
    Progress progress;
    progress.step("rendering " + svg);
    render_svg(graphviz_dot(gm.graph()), svg);
    progress.done();
    if (!graph && !code && !dot && !as_json) {
      std::printf("rendered %s\n", svg.c_str());
      return 0;
    }
  }
  if (graph) {
    std::cout << gm.str(/*with_source=*/true);
  } else if (code) {
    std::cout << python_code(gm);
  } else if (dot) {
    std::cout << graphviz_dot(gm.graph());
  } else if (as_json) {
    GraphSummary s = summarize(gm);
    json j = summary_json(gm);
    for (const auto& [kind, entry] : s.attributes) {
      j[std::string(attribute_kind_name(kind)) + "s"] = {{"count", entry.first}, {"bytes", entry.second}};
    }
    j["inputs"] = s.input_types;
    j["output_types"] = s.output_types;
    std::cout << j.dump() << "\n";
  } else {
    std::cout << format_summary(summarize(gm));
  }
  return 0;
}

void save_outputs(const std::vector<at::Tensor>& outputs, const std::string& path) {
  c10::IValue value = outputs.size() == 1 ? c10::IValue(outputs[0])
                                          : c10::IValue(c10::ivalue::Tuple::create(as_ivalues(outputs)));
  std::vector<char> bytes = torch::jit::pickle_save(value);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw Error("cannot write outputs to '" + path + "'");
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok) throw Error("cannot write outputs to '" + path + "'");
}

int cmd_run(const std::string& file, const std::vector<std::string>& input_specs,
            const std::string& output, bool as_json) {
  GraphModule gm = load(file);
  Interpreter interp(gm);
  std::vector<at::Tensor> inputs;
  if (input_specs.empty()) {
    inputs = random_inputs_for(gm);
  } else {
    for (const std::string& s : input_specs) inputs.push_back(parse_input(s));
    if (inputs.size() != interp.num_inputs()) {
      throw Error("'" + file + "' takes " + std::to_string(interp.num_inputs()) + " input(s), got " +
                  std::to_string(inputs.size()) + " --input");
    }
  }
  auto t0 = Clock::now();
  std::vector<at::Tensor> outputs = interp.run_flat(inputs);
  double ms = ms_since(t0);
  if (!output.empty()) save_outputs(outputs, output);
  double checksum = 0;
  json outs = json::array();
  for (const at::Tensor& t : outputs) {
    checksum += t.numel() == 0 ? 0.0 : t.to(at::kDouble).sum().item<double>();
    outs.push_back({{"shape", t.sizes().vec()}, {"dtype", dtype_name(t.scalar_type())}});
  }
  if (as_json) {
    std::cout << json{{"outputs", outs}, {"checksum", checksum}, {"time_ms", ms}}.dump() << "\n";
  } else {
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::printf("output %zu: %s\n", i, TensorMeta::of(outputs[i]).str().c_str());
    }
    std::printf("checksum: %.6g\ntime: %.2f ms\n", checksum, ms);
  }
  return 0;
}

int cmd_examples() {
  for (const std::string& name : examples::names()) {
    std::printf("%-20s %s\n", name.c_str(), examples::describe(name).c_str());
  }
  return 0;
}

// An error raised inside a TorchScript model carries two tracebacks; one
// line keeps the error and the innermost place in the model's source.
std::string model_error(const std::string& s) {
  const std::string marker = "Traceback of TorchScript";
  if (s.find(marker) == std::string::npos) return s;
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    lines.push_back(s.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  std::string error, where;
  for (const std::string& l : lines) {
    if (l.find_first_not_of(" ") == std::string::npos) continue;
    size_t first = l.find_first_not_of(" ");
    if (l.compare(first, 5, "File ") == 0) where = l.substr(first);
    error = l.substr(first);
  }
  return "the model failed" + (where.empty() ? std::string() : " at " + where) + ": " + error;
}

// One line: errors may carry several (the interpreter lists every mismatch).
std::string one_line(std::string s) {
  s = model_error(s);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n') {
      out += (!out.empty() && out.back() == ':') ? " " : "; ";
      while (i + 1 < s.size() && s[i + 1] == ' ') ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"torchcap: capture LibTorch programs as graphs", "torchcap"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "torchcap 0.1.0");

  std::string model, example, output, preserve, svg, file;
  std::vector<std::string> inputs;
  bool inference = false, do_export = false, keep_dead = false, as_json = false;
  bool show_graph = false, show_code = false, show_dot = false, show_summary = false;
  bool show_memory_plan = false;
  uint64_t seed = 0;

  CLI::App* trace_cmd = app.add_subcommand("trace", "trace a TorchScript file or a built-in example");
  trace_cmd->add_option("model", model, "a TorchScript file (torch.jit.save)");
  trace_cmd->add_option("--example", example, "a built-in example (see `torchcap examples`)");
  trace_cmd->add_option("--input", inputs, "an input: a shape like 1x3x224x224[:float32] (random) or a torch.save'd tensor file");
  trace_cmd->add_flag("--inference", inference, "trace under inference mode (keeps --preserve ops whole)");
  trace_cmd->add_option("--preserve", preserve, "operators kept whole, e.g. aten::linear,aten::layer_norm");
  trace_cmd->add_flag("--export", do_export, "functionalize: no mutation, no views; writes become outputs");
  trace_cmd->add_flag("--keep-dead", keep_dead, "keep what the program computed and never used (removed by default)");
  trace_cmd->add_option("-o,--output", output, "save the graph to this .tcg file");
  trace_cmd->add_flag("--json", as_json, "print one JSON object");
  trace_cmd->add_option("--seed", seed, "seed for random inputs (default 0)");

  app.add_subcommand("examples", "list the built-in examples");

  CLI::App* show_cmd = app.add_subcommand("show", "show a saved graph");
  show_cmd->add_option("file", file, "a .tcg file")->required();
  auto* summary_flag = show_cmd->add_flag("--summary", show_summary, "nodes, operators, parameters, inputs and outputs (default)");
  auto* graph_flag = show_cmd->add_flag("--graph", show_graph, "the FX-style graph");
  auto* code_flag = show_cmd->add_flag("--code", show_code, "Python code for torch.fx");
  auto* dot_flag = show_cmd->add_flag("--dot", show_dot, "Graphviz source");
  summary_flag->excludes(graph_flag)->excludes(code_flag)->excludes(dot_flag);
  graph_flag->excludes(code_flag)->excludes(dot_flag);
  code_flag->excludes(dot_flag);
  show_cmd->add_option("--svg", svg, "render the graph to this SVG file with Graphviz");
  show_cmd->add_flag("--json", as_json, "print the summary as one JSON object");
  show_cmd->add_flag("--memory", show_memory_plan, "the memory plan (with --svg: draw the arena, with --json: as JSON)")
      ->excludes(summary_flag)->excludes(graph_flag)->excludes(code_flag)->excludes(dot_flag);

  CLI::App* run_cmd = app.add_subcommand("run", "run a saved graph");
  run_cmd->add_option("file", file, "a .tcg file")->required();
  run_cmd->add_option("--input", inputs, "an input (shape or file); random from the recorded shapes if none");
  run_cmd->add_option("-o,--output", output, "save the outputs (torch.load reads them)");
  run_cmd->add_flag("--json", as_json, "print one JSON object");
  run_cmd->add_option("--seed", seed, "seed for random inputs (default 0)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::cerr << "torchcap: error: " << one_line(e.what()) << " (see torchcap --help)\n";
    return 2;
  }
  at::manual_seed(seed);
  if (trace_cmd->parsed()) {
    return cmd_trace(model, example, inputs, inference, preserve, do_export, keep_dead, output, as_json);
  }
  if (show_cmd->parsed() && show_memory_plan) return show_memory(file, svg, as_json);
  if (show_cmd->parsed()) return cmd_show(file, show_graph, show_code, show_dot, svg, as_json);
  if (run_cmd->parsed()) return cmd_run(file, inputs, output, as_json);
  return cmd_examples();
}

}  // namespace
}  // namespace torchcap::cli

int main(int argc, char** argv) {
  using torchcap::cli::one_line;
  try {
    return torchcap::cli::main_impl(argc, argv);
  } catch (const c10::Error& e) {
    std::cerr << "torchcap: error: " << one_line(e.what_without_backtrace()) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "torchcap: error: " << one_line(e.what()) << "\n";
  }
  return 1;
}
