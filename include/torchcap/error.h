// Errors torchcap reports to its users.
//
// Two tiers (see docs/STYLE.md 7): a user mistake throws one of these, with a message
// that names the operation, the node or input involved, and what to do; a broken
// internal invariant is an internal assert (TORCH_INTERNAL_ASSERT) instead.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace torchcap {

// Base of every error torchcap throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A graph broke one of the invariants `Graph::lint` checks.
class LintError : public Error {
 public:
  using Error::Error;
};

// A program could not be traced (unsupported input, mutated input, ...).
class TraceError : public Error {
 public:
  using Error::Error;
};

// An error raised while a TorchScript model's code ran under the tracer (an
// operator failed, the model raised, or the tracer refused what the model did).
// what() is the one-line summary, then the model's Python frames where
// TorchScript knows them, one "  File ..., line N, in fn" line and its source
// line per frame, innermost last (a Python traceback's order).
class ModelError : public TraceError {
 public:
  ModelError(std::string summary, std::string traceback)
      : TraceError(traceback.empty() ? summary : summary + "\n" + traceback),
        summary_(std::move(summary)),
        traceback_(std::move(traceback)) {}

  const std::string& summary() const { return summary_; }
  // Empty when TorchScript recorded no Python source for the model.
  const std::string& traceback() const { return traceback_; }

 private:
  std::string summary_;
  std::string traceback_;
};

// A value of the wrong kind where another was required (e.g. a traced function
// that returns a string).
class TypeError : public Error {
 public:
  using Error::Error;
};

// Inputs given to a graph do not match what it was captured with.
class InputError : public Error {
 public:
  using Error::Error;
};

// Weights given to a module do not fit its attributes (a missing, extra,
// mis-shaped or mis-typed weight), or a module with weightless attributes
// (graph_module.h) was run before they were bound. The message names every
// weight involved and what was expected.
class WeightError : public Error {
 public:
  using Error::Error;
};

// A graph failed while running; the message names the node.
class RuntimeError : public Error {
 public:
  using Error::Error;
};

// A file could not be read or written; the message names the problem and the
// byte offset where it was found.
class FormatError : public Error {
 public:
  using Error::Error;
};

}  // namespace torchcap
