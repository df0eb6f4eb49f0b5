// torchcap: trace, show and run captured programs from the command line.
//
//   torchcap trace MODEL.pt --input 1x3x224x224 [-o OUT.tcg] [--export] [--no-check] [--meta] [--json]
//   torchcap trace --example resnet18 [-o OUT.tcg]
//   torchcap examples
//   torchcap show FILE.tcg [--summary|--graph|--code|--dot] [--svg OUT.svg] [--json]   (pictures: show.cpp)
//   torchcap run FILE.tcg [--input ...] [--weights FILE] [--json]
//   torchcap optimize FILE.tcg -o OUT.tcg [--json]   (optimize.cpp)
//   torchcap trace MODEL.pt --train --loss mse --input ... --target ... [--optimizer adam] -o STEP.tcg
//   torchcap run STEP.tcg --steps N --input ... [-o TRAINED.tcg]   (train.cpp)
// trace, show and run take --library PATH (repeatable): operator libraries
// to load first, such as torchvision's _C.so for torchvision::nms.
#include <torchcap/error.h>
#include <torchcap/export.h>
#include <torchcap/interpreter.h>
#include <torchcap/library.h>
#include <torchcap/passes.h>
#include <torchcap/printer.h>
#include <torchcap/serialize.h>
#include <torchcap/summary.h>
#include <torchcap/tracer.h>
#include <torchcap/training.h>

#include "cli/cli_inputs.h"
#include "cli/colour.h"
#include "cli/commands.h"
#include "cli/memory_view.h"
#include "graph/operator_name.h"
#include "serialize/format.h"
#include "serialize/temp_files.h"
#include "zoo.h"

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sys/stat.h>
#include <unistd.h>

namespace torchcap::cli {
namespace {

using json = nlohmann::ordered_json;

// One line: errors may carry several (the interpreter lists every mismatch).
std::string one_line_of(std::string s) {
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

// What `torchcap trace` was asked to do.
struct TraceCommand {
  std::string model;    // a TorchScript file, or
  std::string example;  // a built-in example
  std::vector<std::string> inputs;
  bool inference = false;
  std::string preserve;  // comma-separated operator names
  bool do_export = false;
  bool keep_dead = false;
  std::string passes = "dce";  // comma-separated pass and pipeline names (passes.h)
  bool optimize = false;       // then optimize_for_inference
  bool check = true;  // compare the graph with the model on the inputs
  bool meta = false;  // meta mode: shapes only, nothing computed, no check
  std::vector<std::string> dynamic;  // --dynamic INPUT:DIM[=NAME][[MIN:MAX]]
  std::string output;
  bool as_json = false;
};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// " (did you mean 'X'?)" for the candidate closest to `word` by edit
// distance, when it is close (at most a third of the word's letters, and at
// least one, differ); "" otherwise.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_distance = std::max<size_t>(1, word.size() / 3) + 1;
  for (const std::string& c : candidates) {
    size_t d = distance(word, c);
    // A swap of two letters ("tarce") counts as one change.
    for (size_t i = 0; i + 1 < word.size() && d > 1; ++i) {
      std::string swapped = word;
      std::swap(swapped[i], swapped[i + 1]);
      if (swapped == c) d = 1;
    }
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

// Says what `path` is when it is not a TorchScript file, before LibTorch's
// reader reports it in its own terms ("failed finding central directory").
void check_model_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw Error(path + ": no such file");
  if (S_ISDIR(st.st_mode)) throw Error(path + " is a directory, not a TorchScript file");
  char head[8] = {};
  std::ifstream in(path, std::ios::binary);
  if (!in.read(head, sizeof(head))) {
    throw Error(path + " is not a TorchScript file (too short to be one)");
  }
  if (std::memcmp(head, format::kMagic, sizeof(format::kMagic)) == 0) {
    throw Error(path + " is a torchcap graph, not a TorchScript model: use `torchcap show` or "
                       "`torchcap run` on it");
  }
  if (std::memcmp(head, "PK\3\4", 4) != 0) {
    throw Error(path + " is not a TorchScript file (torch.jit.save writes a zip archive)");
  }
  bool has_code = false, has_data = false;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    for (const std::string& record : reader.getAllRecords()) {
      has_code = has_code || starts_with(record, "code/") || record == "constants.pkl";
      has_data = has_data || record == "data.pkl";
    }
  } catch (const c10::Error& e) {
    throw Error(path + " is not a TorchScript file: " + e.what_without_backtrace());
  }
  if (!has_code && has_data) {
    throw Error(path + " was written by torch.save and holds data (a tensor, a state dict, ...), "
                       "not a program: save a scripted model with torch.jit.save "
                       "(torch.jit.script(model).save(path))");
  }
}

}  // namespace

void check_output_path(const std::string& path) {
  if (path.empty()) return;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw torchcap::Error("-o " + path + ": is a directory; give a file name");
  }
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw torchcap::Error("-o " + path + ": no such directory '" + dir + "'");
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    throw torchcap::Error("-o " + path + ": the directory '" + dir + "' is not writable");
  }
}

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

// torch::jit::load, with LibTorch's message on operators no loaded library
// defines turned into what to do about it.
torch::jit::Module load_torchscript(const std::string& path) {
  check_model_file(path);
  // Note [Operator libraries found by their namespace] (library.h): a
  // scripted torchvision model's operators, where the package is installed.
  load_library_of_namespace("torchvision");
  try {
    return torch::jit::load(path);
  } catch (const std::exception& e) {
    // c10::Error, or the TorchScript compiler's ErrorReport
    auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::string what = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
    const std::string unknown = "Unknown builtin op: ";
    size_t at = what.find(unknown);
    if (at != std::string::npos) {
      size_t begin = at + unknown.size();
      size_t end = what.find_first_of(".\n ", begin);
      std::string op = what.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
      std::string ns = detail::operator_namespace(c10::OperatorName{op, ""});
      std::string hint = ns == "torchvision"
                             ? " (torchvision's is the _C*.so file inside its Python package; "
                               "torchcap loads it from " + library_location_of_namespace(ns) +
                                   " when Debian's python3-torchvision is installed)"
                             : "";
      throw Error(path + " calls the operator " + op + ", which no loaded library defines: load the "
                  "library of the '" + ns + "' operators with --library PATH" + hint);
    }
    throw Error("cannot load TorchScript file '" + path + "': " + one_line_of(what));
  }
}

// The forward's parameters, without `self`.
std::vector<c10::Argument> forward_parameters(torch::jit::Module& m) {
  const auto& arguments = m.get_method("forward").function().getSchema().arguments();
  return std::vector<c10::Argument>(arguments.begin() + 1, arguments.end());
}

// The --input values by the forward's declared parameter types. Trailing
// parameters with defaults may be left out: TorchScript fills them in.
std::vector<c10::IValue> forward_inputs(torch::jit::Module& m, const std::string& name,
                                        const std::vector<std::string>& specs, bool shapes_only) {
  std::vector<c10::Argument> params = forward_parameters(m);
  size_t required = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].default_value()) required = i + 1;
  }
  auto signature = [&] {
    std::string out;
    for (const c10::Argument& p : params) out += (out.empty() ? "" : ", ") + describe_parameter(p);
    return "forward(" + out + ")";
  };
  if (specs.size() < required || specs.size() > params.size()) {
    std::string count = required == params.size()
                            ? std::to_string(required)
                            : std::to_string(required) + " to " + std::to_string(params.size());
    throw Error("the forward of '" + name + "' takes " + count + " input(s), got " +
                std::to_string(specs.size()) + " --input: " + signature());
  }
  std::vector<c10::IValue> values;
  for (size_t i = 0; i < specs.size(); ++i) {
    values.push_back(parse_argument(specs[i], params[i], shapes_only));
  }
  return values;
}

namespace {

Program load_program(const TraceCommand& cmd, Progress& progress) {
  Program p;
  if (!cmd.example.empty()) {
    p.name = cmd.example;
    const std::vector<std::string>& known = examples::names();
    if (std::find(known.begin(), known.end(), cmd.example) == known.end()) {
      std::string list;
      for (const std::string& n : known) list += (list.empty() ? "" : ", ") + n;
      throw Error("no example named '" + cmd.example + "'" + did_you_mean(cmd.example, known) +
                  "; known examples: " + list);
    }
    p.example = std::make_unique<examples::Example>(examples::make(cmd.example));
    if (cmd.inputs.empty()) {
      p.inputs = p.example->make_inputs(0);
    } else {
      for (const std::string& s : cmd.inputs) p.inputs.push_back(parse_input(s, cmd.meta));
      size_t expected = p.example->make_inputs(0).size();
      if (p.inputs.size() != expected) {
        throw Error("example '" + cmd.example + "' takes " + std::to_string(expected) +
                    " input(s), got " + std::to_string(p.inputs.size()) + " --input");
      }
    }
    return p;
  }
  p.name = cmd.model;
  progress.step("loading " + cmd.model);
  p.script = std::make_shared<torch::jit::Module>(load_torchscript(cmd.model));
  p.script->eval();
  if (cmd.inputs.empty() && !forward_parameters(*p.script).empty()) {
    throw Error("give the inputs of '" + cmd.model + "' with --input, e.g. --input 1x3x224x224");
  }
  p.inputs = forward_inputs(*p.script, cmd.model, cmd.inputs, cmd.meta);
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

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

GraphModule trace_program(Program& p, const TraceCommand& cmd, const TraceOptions& options) {
  std::vector<c10::IValue> inputs = clone_all(p.inputs);
  if (p.script) {
    return cmd.do_export ? export_program(*p.script, inputs, options) : trace(*p.script, inputs, options);
  }
  if (cmd.do_export) {
    return p.example->module ? export_program(*p.example->module, p.example->forward, inputs, options)
                             : export_program(p.example->forward, inputs, options);
  }
  return examples::trace(*p.example, options, inputs);
}

int cmd_trace(const TraceCommand& cmd) {
  if (cmd.model.empty() == cmd.example.empty()) {
    throw Error("trace takes a TorchScript file or --example NAME (one of them)");
  }
  check_output_path(cmd.output);
  Progress progress;
  Program p = load_program(cmd, progress);

  TraceOptions options;
  options.inference_mode = cmd.inference;
  options.meta = cmd.meta;
  if (!cmd.preserve.empty()) options.preserve = split_commas(cmd.preserve);
  for (const std::string& d : cmd.dynamic) options.dynamic.push_back(parse_dynamic(d));

  progress.step(std::string(cmd.do_export ? "exporting " : "tracing ") + p.name);
  auto t0 = Clock::now();
  GraphModule gm = trace_program(p, cmd, options);
  double trace_ms = ms_since(t0);
  // By default what the program computed and never used (the empty tensors
  // a BatchNorm decomposition makes for statistics eval mode does not keep,
  // say) goes, as in export; --keep-dead shows the trace as recorded.
  if (!cmd.keep_dead) passes_by_name(split_commas(cmd.passes)).run(gm);
  if (cmd.optimize) {
    progress.step("optimizing for inference");
    optimize_for_inference(gm);
  }
  gm.lint();

  std::optional<double> diff;
  if (cmd.check) {
    progress.step("checking: running " + p.name + " eagerly");
    c10::IValue expected = run_eager(p, clone_all(p.inputs));
    progress.step("checking: running the graph");
    c10::IValue actual = Interpreter(gm).run(clone_all(p.inputs));
    diff = examples::max_abs_diff(actual, expected);
  }

  if (!cmd.output.empty()) {
    progress.step("saving " + cmd.output);
    save(gm, cmd.output);
  }
  progress.done();

  if (cmd.as_json) {
    json j = summary_json(gm);
    j["trace_ms"] = trace_ms;
    j["max_abs_diff"] = diff ? json(*diff) : json(nullptr);
    if (!cmd.output.empty()) j["file"] = cmd.output;
    std::cout << j.dump() << "\n";
  } else {
    GraphSummary s = summarize(gm);
    std::printf("%s %s: %zu nodes (%zu placeholder, %zu get_attr, %zu call_function, %zu output) in %.1f ms\n",
                cmd.do_export ? "exported" : "traced", p.name.c_str(), s.nodes, s.placeholders,
                s.get_attrs, s.call_functions, s.outputs, trace_ms);
    if (diff) {
      std::printf("max |graph - eager| = %g\n", *diff);
    } else {
      std::printf("not checked against the model (%s)\n",
                  cmd.meta ? "--meta: nothing was computed" : "--no-check");
    }
    if (!cmd.output.empty()) std::printf("saved %s\n", cmd.output.c_str());
  }
  return 0;
}

int cmd_show(const std::string& file, bool graph, bool code, const PictureRequest& picture, bool as_json) {
  GraphModule gm = load(file);
  if (!picture.svg.empty() || picture.dot) {
    show_picture(gm, picture, graph || code || as_json);  // show.cpp
    if (!graph && !code && !as_json) return 0;
  }
  if (graph) {
    std::cout << gm.str(/*with_source=*/true);
  } else if (code) {
    std::cout << python_code(gm);
  } else if (as_json) {
    GraphSummary s = summarize(gm);
    json j = summary_json(gm);
    for (const auto& [kind, entry] : s.attributes) {
      j[std::string(attribute_kind_name(kind)) + "s"] = {{"count", entry.first}, {"bytes", entry.second}};
    }
    j["weightless"] = {{"count", s.weightless}, {"bytes", s.weightless_bytes}};
    j["inputs"] = s.input_types;
    if (!s.call.empty()) j["call"] = s.call;
    j["symbols"] = s.symbols;
    j["output_types"] = s.output_types;
    if (is_training_step(gm)) {
      json roles = json::array();
      TrainingSignature sig = training_signature(gm);
      for (size_t i = 0; i < sig.outputs.size(); ++i) {
        const StepOutput& o = sig.outputs[i];
        json r{{"output", i}, {"role", step_role_name(o.role)}};
        if (o.role != StepRole::Loss) r["target"] = o.target;
        if (!o.parameter.empty()) r["parameter"] = o.parameter;
        if (!o.state.empty()) r["state"] = o.state;
        roles.push_back(std::move(r));
      }
      j["training_step"] = roles;
    }
    std::cout << j.dump() << "\n";
  } else {
    std::cout << with_headings(format_summary(summarize(gm)));
    // A training step's outputs by role (Note [Roles of a training step's
    // outputs]): which one is the loss, and what each of the others
    // updates or is the gradient of.
    if (is_training_step(gm)) {
      std::cout << "training step, outputs by role:\n";
      std::string lines = training_signature(gm).str();
      for (size_t at = 0; at < lines.size();) {
        size_t end = lines.find('\n', at);
        std::cout << "  " << lines.substr(at, end - at) << "\n";
        at = end == std::string::npos ? lines.size() : end + 1;
      }
    }
  }
  return 0;
}

void save_outputs(const std::vector<at::Tensor>& outputs, const std::string& path) {
  c10::IValue value = outputs.size() == 1 ? c10::IValue(outputs[0])
                                          : c10::IValue(c10::ivalue::Tuple::create(as_ivalues(outputs)));
  std::vector<char> bytes = torch::jit::pickle_save(value);
  // Note [Temporary files and interrupts]: complete, or not there at all.
  detail::write_bytes_atomically(path, bytes.data(), bytes.size(), [&path](const std::string& what) {
    throw Error("cannot write outputs to '" + path + "': " + what);
  });
}

// `run --weights FILE`: the named tensors of a .tcg file (its stored
// attributes), of a TorchScript file (its parameters and buffers), or of a
// torch.save'd dict of tensors by name.
NamedTensors load_weights(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw Error("--weights " + path + ": no such file");
  char head[8] = {};
  std::ifstream(path, std::ios::binary).read(head, sizeof(head));
  NamedTensors out;
  if (std::memcmp(head, format::kMagic, sizeof(format::kMagic)) == 0) {
    GraphModule stored = load(path);
    for (const Attribute& a : stored.attributes()) {
      if (a.value.defined() && !a.value.is_meta()) out.emplace(a.name, a.value);
    }
    return out;
  }
  bool script = false;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    for (const std::string& record : reader.getAllRecords()) {
      script = script || starts_with(record, "code/");
    }
  } catch (const c10::Error&) {
    throw Error("--weights " + path + ": not a .tcg file, a TorchScript file or a file written "
                "by torch.save");
  }
  if (script) {
    torch::jit::Module m = load_torchscript(path);
    for (const auto& p : m.named_parameters(/*recurse=*/true)) out.emplace(p.name, p.value);
    for (const auto& b : m.named_buffers(/*recurse=*/true)) out.emplace(b.name, b.value);
    return out;
  }
  c10::IValue v;
  try {
    v = load_value_file(path);
  } catch (const Error&) {
    // LibTorch 1.13's unpickler builds no OrderedDict (what state_dict()
    // returns), nor a dict of one entry (the SETITEM opcode).
    const bool ordered = holds_ordered_dict(path);
    throw Error("--weights " + path + (ordered ? " holds an OrderedDict (a state dict), which "
                                                 "LibTorch cannot read"
                                               : " holds what LibTorch cannot read (it reads "
                                                 "plain dicts of two or more tensors)") +
                ": save a plain dict of tensors instead, torch.save(dict(model.state_dict()), "
                "path), or give a TorchScript or .tcg file");
  }
  if (!v.isGenericDict()) {
    throw Error("--weights " + path + " holds " + kind_of(v) + ", not a dict of tensors by name");
  }
  for (const auto& entry : v.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      throw Error("--weights " + path + ": the dict maps names to tensors; it has " +
                  kind_of(entry.key()) + " -> " + kind_of(entry.value()));
    }
    out.emplace(entry.key().toStringRef(), entry.value().toTensor());
  }
  return out;
}

int cmd_run(const std::string& file, const std::vector<std::string>& input_specs,
            const std::string& weights, const std::string& output, bool as_json, const ProfileRequest& profile) {
  check_output_path(profile.trace_json);
  check_output_path(output);
  LoadOptions options;
  if (!weights.empty()) {
    options.weights = load_weights(weights);
    // A checkpoint may hold more than the graph reads.
    options.strict_weights = false;
  }
  GraphModule gm = load(file, options);
  if (!options.weights.empty()) {
    // Weights that name none of the graph's attributes would leave it as the
    // file has it, without a word.
    bool any = false;
    for (const auto& [name, t] : options.weights) any = any || gm.has_attribute(name);
    if (!any) {
      std::string example = gm.attributes().empty() ? std::string("none") : "'" + gm.attributes()[0].name + "'";
      throw Error("--weights " + weights + ": none of its " + std::to_string(options.weights.size()) +
                  " tensors ('" + options.weights.begin()->first + "', ...) names an attribute of '" +
                  file + "' (they are named like " + example + "); nothing would change");
    }
  }
  if (std::vector<const Attribute*> unbound = gm.unbound_attributes(); !unbound.empty()) {
    throw Error("'" + file + "' is weightless: " + std::to_string(unbound.size()) +
                " of its tensors (" + unbound[0]->name + (unbound.size() > 1 ? ", ..." : "") +
                ") have no values in the file; give them with --weights FILE (a .tcg file, a "
                "TorchScript file, or a torch.save'd dict of tensors by name)");
  }
  Interpreter interp(gm);
  std::vector<at::Tensor> inputs;
  if (input_specs.empty()) {
    inputs = random_inputs_for(gm);
  } else {
    inputs = run_inputs_for(gm, input_specs);
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
  json j = {{"outputs", outs}, {"checksum", checksum}, {"time_ms", ms}};
  if (!as_json) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::printf("output %zu: %s\n", i, TensorMeta::of(outputs[i]).str().c_str());
    }
    std::printf("checksum: %.6g\ntime: %.2f ms\n", checksum, ms);
  }
  if (profile.on) j["profile"] = profile_run(interp, inputs, profile, as_json);
  if (as_json) std::cout << j.dump() << "\n";
  return 0;
}

int cmd_examples() {
  for (const std::string& name : examples::names()) {
    std::printf("%-20s %s\n", name.c_str(), examples::describe(name).c_str());
  }
  return 0;
}

const char* const kCommands[] = {"trace", "show", "run", "optimize", "examples"};


// CLI11 says "A subcommand is required" of a word it does not know.
void check_command(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return;
  for (const char* c : kCommands) {
    if (std::strcmp(argv[1], c) == 0) return;
  }
  std::string commands;
  for (const char* c : kCommands) commands += std::string(commands.empty() ? "" : ", ") + c;
  throw CLI::ValidationError("unknown command '" + std::string(argv[1]) + "'" +
                             did_you_mean(argv[1], {std::begin(kCommands), std::end(kCommands)}) +
                             " (commands: " + commands + ")");
}

// An option given an empty value ("-o ''") would silently do nothing.
void check_not_empty(const CLI::App* cmd, const std::string& option, const std::string& value) {
  if (cmd->parsed() && cmd->count(option) > 0 && value.empty()) {
    throw Error(cmd->get_name() + " " + option + ": the file name is empty");
  }
}

int main_impl(int argc, char** argv) {
  // An interrupted -o leaves no temporary file (Note [Temporary files and
  // interrupts] in src/serialize/temp_files.cpp).
  detail::remove_temporary_files_on_signals();
  CLI::App app{"torchcap: capture LibTorch programs as graphs", "torchcap"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "torchcap " TORCHCAP_VERSION);  // torchcap.__version__

  TraceCommand trace_args;
  std::string output, file;
  std::vector<std::string> inputs, libraries;
  bool no_check = false, as_json = false;
  bool show_graph = false, show_code = false, show_summary = false;
  PictureRequest picture;
  bool show_memory_plan = false;
  uint64_t seed = 0;
  const char* library_help = "load an operator library first (repeatable), e.g. torchvision's _C.so";

  CLI::App* trace_cmd = app.add_subcommand("trace", "trace a TorchScript file or a built-in example");
  trace_cmd->add_option("model", trace_args.model, "a TorchScript file (torch.jit.save)");
  trace_cmd->add_option("--example", trace_args.example, "a built-in example (see `torchcap examples`)");
  trace_cmd->add_option("--input", trace_args.inputs,
                        "an argument of forward, by its type: a shape like 1x3x224x224[:float32] "
                        "(random) or a torch.save'd file for tensors; none; 3, 0.5, true; 1,2 for lists");
  trace_cmd->add_flag("--inference", trace_args.inference, "trace under inference mode (keeps --preserve ops whole)");
  trace_cmd->add_option("--preserve", trace_args.preserve, "operators kept whole, e.g. aten::linear,aten::layer_norm");
  trace_cmd->add_flag("--export", trace_args.do_export, "functionalize: no mutation, no views; writes become outputs");
  auto* keep_dead_flag = trace_cmd->add_flag(
      "--keep-dead", trace_args.keep_dead,
      "keep what the program computed and never used (removed by default): run no pass");
  std::string passes_help = "passes run on the graph, in order (default dce):";
  for (const NamedPass& p : named_passes()) passes_help += "\n  " + p.name + ": " + p.summary;
  for (const NamedPipeline& p : named_pipelines()) passes_help += "\n  " + p.name + ": " + p.summary;
  trace_cmd->add_option("--passes", trace_args.passes, passes_help)
      ->excludes(keep_dead_flag)
      ->check([](const std::string& list) {
        try {
          passes_by_name(split_commas(list));
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
  trace_cmd->add_flag("--optimize", trace_args.optimize,
                      "then optimize the graph for inference (the optimize pipeline; eval-mode models)")
      ->excludes(keep_dead_flag);
  trace_cmd->add_flag("--no-check", no_check, "do not run the model and the graph to compare them");
  trace_cmd->add_flag("--meta", trace_args.meta,
                      "meta mode: compute shapes only, run no kernel and no check (inputs may be shapes)");
  trace_cmd->add_option("--dynamic", trace_args.dynamic,
                        "a dimension the graph takes at any size: INPUT:DIM[=NAME][[MIN:MAX]], e.g. "
                        "0:0=batch[1:64] (repeat for more; one NAME is one size)");
  trace_cmd->add_option("-o,--output", trace_args.output, "save the graph to this .tcg file");
  trace_cmd->add_option("--library", libraries, library_help);
  trace_cmd->add_flag("--json", trace_args.as_json, "print one JSON object");
  trace_cmd->add_option("--seed", seed, "seed for random inputs (default 0)");

  TrainCommand train_args;
  add_train_options(*trace_cmd, train_args);

  app.add_subcommand("examples", "list the built-in examples");

  CLI::App* show_cmd = app.add_subcommand("show", "show a saved graph");
  show_cmd->add_option("file", file, "a .tcg file")->required();
  auto* summary_flag = show_cmd->add_flag("--summary", show_summary, "nodes, operators, parameters, inputs and outputs (default)");
  auto* graph_flag = show_cmd->add_flag("--graph", show_graph, "the FX-style graph, with each node's source");
  auto* code_flag = show_cmd->add_flag("--code", show_code, "Python code for torch.fx");
  auto* dot_flag = show_cmd->add_flag("--dot", picture.dot, "Graphviz source (what --svg draws)");
  summary_flag->excludes(graph_flag)->excludes(code_flag)->excludes(dot_flag);
  graph_flag->excludes(code_flag)->excludes(dot_flag);
  code_flag->excludes(dot_flag);
  show_cmd->add_option("--svg", picture.svg, "render the graph to this SVG file with Graphviz, grouped by module");
  add_picture_options(*show_cmd, picture);
  show_cmd->add_option("--library", libraries, library_help);
  // --json is the summary's (or, with --memory, the plan's) form: with
  // --graph, --code or --dot it would be ignored without a word.
  show_cmd->add_flag("--json", as_json, "print the summary as one JSON object")
      ->excludes(graph_flag)->excludes(code_flag)->excludes(dot_flag);
  show_cmd->add_flag("--memory", show_memory_plan, "the memory plan (with --svg: draw the arena, with --json: as JSON)")
      ->excludes(summary_flag)->excludes(graph_flag)->excludes(code_flag)->excludes(dot_flag);

  CLI::App* optimize_cmd =
      app.add_subcommand("optimize", "optimize a saved inference graph (docs/optimize.md) and save it");
  optimize_cmd->add_option("file", file, "a .tcg file")->required();
  std::string optimized;
  optimize_cmd->add_option("-o,--output", optimized, "the .tcg file to write")->required();
  optimize_cmd->add_option("--library", libraries, library_help);
  optimize_cmd->add_flag("--json", as_json, "print one JSON object");

  CLI::App* run_cmd = app.add_subcommand("run", "run a saved graph");
  run_cmd->add_option("file", file, "a .tcg file")->required();
  run_cmd->add_option("--input", inputs, "an input (shape or file); random from the recorded shapes if none");
  std::string weights;
  run_cmd->add_option("--weights", weights,
                      "tensors by name for the graph's attributes (needed by a weightless file): a "
                      ".tcg file, a TorchScript file, or a torch.save'd dict of tensors");
  run_cmd->add_option("-o,--output", output, "save the outputs (torch.load reads them)");
  run_cmd->add_option("--library", libraries, library_help);
  run_cmd->add_flag("--json", as_json, "print one JSON object");
  ProfileRequest profile;
  auto* profile_flag = run_cmd->add_flag("--profile", profile.on, "time each node over --runs runs: per-operator "
                                         "totals and the slowest nodes with their source lines");
  auto* trace_json = run_cmd->add_option("--trace-json", profile.trace_json,
                                         "profile, and write the last run as a Chrome trace "
                                         "(chrome://tracing, Perfetto); implies --profile");
  auto* runs = run_cmd->add_option("--runs", profile.runs, "runs to profile (default 10)")
                   ->check(CLI::Range(1, 1000000));
  run_cmd->add_option("--seed", seed, "seed for random inputs (default 0)");
  int64_t steps = 0;
  run_cmd->add_option("--steps", steps, "run a training step (trace --train) N times, printing each "
                      "step's loss; -o then saves the trained step. Its --input are the model's "
                      "inputs then its targets, the same batch every step, or batches cycled step "
                      "by step: an --input file holding a stack of batches (one more leading "
                      "dimension), or --data");
  std::string data;
  run_cmd->add_option("--data", data,
                      "with --steps: a torch.save'd list of batches, each a tuple of the step's "
                      "inputs (the model's inputs, then its targets); step i takes batch i, "
                      "cycling");

  try {
    check_command(argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::string hint;
    const std::string unexpected = "The following argument was not expected: ";
    if (std::string what = e.what(); what.rfind(unexpected, 0) == 0 && argc >= 2) {
      // An unknown flag: the closest of its command's options.
      std::vector<std::string> flags;
      for (const CLI::App* cmd : app.get_subcommands({})) {
        if (cmd->get_name() != argv[1]) continue;
        for (const CLI::Option* o : cmd->get_options()) {
          for (const std::string& name : o->get_lnames()) flags.push_back("--" + name);
        }
      }
      hint = did_you_mean(what.substr(unexpected.size()), flags);
    }
    std::cerr << error_prefix() << one_line_of(e.what()) << hint << " (see torchcap --help)\n";
    return 2;
  }
  check_not_empty(trace_cmd, "-o", trace_args.output);
  check_not_empty(run_cmd, "-o", output);
  check_not_empty(optimize_cmd, "-o", optimized);
  check_not_empty(run_cmd, "--weights", weights);
  check_not_empty(run_cmd, "--data", data);
  if (run_cmd->parsed() && !data.empty() && run_cmd->count("--steps") == 0) {
    throw Error("--data needs --steps: it holds batches for training steps");
  }
  check_not_empty(show_cmd, "--svg", picture.svg);
  if (show_cmd->parsed()) check_picture_options(*show_cmd, picture, show_memory_plan);
  for (const std::string& library : libraries) load_library(library);
  at::manual_seed(seed);
  if (trace_cmd->parsed() && (train_args.train || train_options_given(*trace_cmd))) {
    if (!train_args.train) throw Error("--loss, --target and the optimizer's options need --train");
    if (!trace_args.example.empty()) throw Error("--train takes a TorchScript file, not --example");
    if (trace_args.inference) throw Error("--train and --inference exclude each other: training needs autograd");
    if (trace_args.meta) throw Error("--train and --meta exclude each other: a training step is captured by running it");
    return cmd_trace_train(trace_args.model, trace_args.inputs, train_args, trace_args.output,
                           !no_check, trace_args.as_json, *trace_cmd);
  }
  if (trace_cmd->parsed()) {
    trace_args.check = !no_check && !trace_args.meta;
    return cmd_trace(trace_args);
  }
  if (optimize_cmd->parsed()) return cmd_optimize(file, optimized, as_json);
  if (show_cmd->parsed() && show_memory_plan) return show_memory(file, picture.svg, as_json);
  if (show_cmd->parsed()) return cmd_show(file, show_graph, show_code, picture, as_json);
  if (run_cmd->parsed() && run_cmd->count("--steps") > 0 && !weights.empty()) {
    throw Error("--weights does not apply to --steps: a training step starts from the parameters "
                "and optimizer state its file holds");
  }
  if (run_cmd->parsed() && runs->count() > 0 && !profile_flag->count() && !trace_json->count()) {
    throw Error("--runs needs --profile or --trace-json");
  }
  if (run_cmd->parsed() && !profile.trace_json.empty()) profile.on = true;  // implied
  if (run_cmd->parsed() && profile.on && run_cmd->count("--steps") > 0) {
    throw Error(std::string(run_cmd->count("--profile") > 0 ? "--profile" : "--trace-json") +
                " runs a graph; a training step's runs (--steps) would train it");
  }
  if (run_cmd->parsed() && run_cmd->count("--steps") > 0) return cmd_run_steps(file, inputs, data, steps, output, as_json);
  if (run_cmd->parsed()) return cmd_run(file, inputs, weights, output, as_json, profile);
  return cmd_examples();
}

}  // namespace
}  // namespace torchcap::cli

int main(int argc, char** argv) {
  using torchcap::cli::error_prefix;
  using torchcap::cli::one_line_of;
  try {
    return torchcap::cli::main_impl(argc, argv);
  } catch (const torchcap::ModelError& e) {
    // The summary, then the model's frames, as Python prints a traceback.
    std::cerr << error_prefix() << one_line_of(e.summary()) << "\n";
    if (!e.traceback().empty()) std::cerr << e.traceback() << "\n";
  } catch (const c10::Error& e) {
    std::cerr << error_prefix() << one_line_of(e.what_without_backtrace()) << "\n";
  } catch (const std::exception& e) {
    std::cerr << error_prefix() << one_line_of(e.what()) << "\n";
  }
  return 1;
}
