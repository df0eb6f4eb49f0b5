// What the commands of src/cli share: loading TorchScript files and reading
// their forward's inputs (defined in main.cpp), progress on a terminal, the
// training commands (train.cpp) and show's pictures (show.cpp).
#pragma once

#include <torchcap/printer.h>

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <unistd.h>

namespace CLI {
class App;
}
namespace torch::jit {
struct Module;
}

namespace torchcap {
class GraphModule;
class Interpreter;
}
namespace at {
class Tensor;
}

namespace torchcap::cli {

using Clock = std::chrono::steady_clock;

// Milliseconds since `t0`, for the commands' timings.
inline double ms_since(Clock::time_point t0) {
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

// torch::jit::load of `path`, after checking that it is a TorchScript file;
// operators no loaded library defines are reported with what to do.
torch::jit::Module load_torchscript(const std::string& path);
// The forward's parameters, without `self`.
std::vector<c10::Argument> forward_parameters(torch::jit::Module& m);
// The --input values by the forward's declared parameter types (cli_inputs.h);
// with `shapes_only` (--meta), shapes give meta tensors.
std::vector<c10::IValue> forward_inputs(torch::jit::Module& m, const std::string& name,
                                        const std::vector<std::string>& specs,
                                        bool shapes_only = false);

// `-o PATH`, checked before any work: its directory must exist and be
// writable, and PATH must not be a directory (main.cpp).
void check_output_path(const std::string& path);

// `run --profile`: where the time of `runs` runs goes, as a table, and
// with `trace_json` a Chrome trace of the last (profile.cpp).
struct ProfileRequest {
  bool on = false;
  int runs = 10;
  std::string trace_json;
};
// Returns the profile's JSON form (for run --json), after printing the
// table unless `as_json`.
nlohmann::ordered_json profile_run(const Interpreter& interp, const std::vector<at::Tensor>& inputs,
                                   const ProfileRequest& request, bool as_json);

// `torchcap optimize FILE -o OUT` (optimize.cpp).
int cmd_optimize(const std::string& file, const std::string& output, bool as_json);

// The node counts and operator histogram of `gm` that `--json` prints.
nlohmann::ordered_json summary_json(const GraphModule& gm);

// `torchcap trace --train`: the training step of a TorchScript model.
struct TrainCommand {
  bool train = false;
  std::string loss;  // "cross-entropy", "mse" or "model"
  std::vector<std::string> targets;
  std::string optimizer = "sgd";  // "sgd", "adam", "adamw" or "none"
  double lr = -1;                 // the optimizer's default when not given
  double momentum = 0;
  double dampening = 0;
  double weight_decay = -1;  // the optimizer's default when not given
  bool nesterov = false;
  std::vector<double> betas;
  double eps = 1e-8;
  bool amsgrad = false;
};

// Adds --train and the loss, target and optimizer options to `trace`.
void add_train_options(CLI::App& trace, TrainCommand& cmd);
// Whether any of those options was given (they need --train).
bool train_options_given(const CLI::App& trace);
// Captures, checks against eager training with torch::optim (unless
// !check) and saves the step.
// `trace` is the parsed command: options of other optimizers are refused.
int cmd_trace_train(const std::string& model, const std::vector<std::string>& inputs,
                    const TrainCommand& cmd, const std::string& output, bool check, bool as_json,
                    const CLI::App& trace);

// `torchcap run --steps N`: N training steps of a saved step on `inputs`
// or on the batches of `data` (Note [Batches of run --steps]); the loss of
// each step, and with `output` the trained step saved.
int cmd_run_steps(const std::string& file, const std::vector<std::string>& inputs,
                  const std::string& data, int64_t steps, const std::string& output, bool as_json);

// `torchcap show FILE --svg OUT.svg` and `--dot` (show.cpp).
struct PictureRequest {
  std::string svg;  // render the picture there
  bool dot = false;  // print its Graphviz source
  DotOptions options;  // --all-nodes, --depth, --budget
  double timeout = 0;  // --timeout: seconds Graphviz may take; 0: no limit
};
// Adds --all-nodes, --depth, --budget and --timeout to `show`.
void add_picture_options(CLI::App& show, PictureRequest& request);
// Refuses those options where they would do nothing (without --svg or
// --dot, or with --memory).
void check_picture_options(const CLI::App& show, const PictureRequest& request, bool memory);
// Renders --svg (complete or not at all, with progress on a terminal) and
// prints --dot's source. "rendered OUT.svg in T: what was drawn" goes to
// stdout, or to stderr when stdout carries --dot's source or another view
// (`other_output`).
void show_picture(const GraphModule& gm, const PictureRequest& request, bool other_output);

}  // namespace torchcap::cli
