// What torchcap keeps for the life of the process stays reachable, so leak
// checkers (LeakSanitizer, valgrind) report nothing for it: the dispatcher
// registrations made by the first trace (the tracer's kernels) and by the
// first shape propagation (meta kernels LibTorch lacks), and the stack-trace
// symbolizer, made by the first stack trace read.
//
// In the normal build these tests run the inputs only. Built with
// AddressSanitizer (`make sanitize`), each also runs a leak check right after
// its input, so a leak is reported under the test that caused it rather than
// once at exit.
#include <torchcap/interpreter.h>
#include <torchcap/passes.h>
#include <torchcap/tracer.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#if defined(__SANITIZE_ADDRESS__)  // GCC
#define TORCHCAP_LEAK_CHECKS 1
#elif defined(__has_feature)  // Clang
#if __has_feature(address_sanitizer)
#define TORCHCAP_LEAK_CHECKS 1
#endif
#endif
#ifdef TORCHCAP_LEAK_CHECKS
#include <sanitizer/lsan_interface.h>
#endif

namespace torchcap {
namespace {

using IValues = std::vector<c10::IValue>;

// Non-zero if LeakSanitizer finds unreachable memory now (it prints what).
int leak_check() {
#ifdef TORCHCAP_LEAK_CHECKS
  return __lsan_do_recoverable_leak_check();
#else
  return 0;
#endif
}

GraphModule trace_sin() {
  return trace([](IValues in) { return c10::IValue(in[0].toTensor().sin()); }, {at::ones({2})});
}

// Found by `make sanitize`: the first trace registered the tracer's kernels
// and dropped the only pointer to their registration handles, so the handles
// and every dispatcher entry they own were reported as leaked at exit.
TEST(Leaks, FirstTraceKeepsItsRegistrationsReachable) {
  GraphModule gm = trace_sin();
  EXPECT_EQ(leak_check(), 0);
}

// Found by `make sanitize` too, the same way: the first shape propagation
// registers meta kernels for operators LibTorch 1.13 has none for (relu
// here) and dropped the pointer to their handles.
TEST(Leaks, FirstShapePropagationKeepsItsRegistrationsReachable) {
  GraphModule gm = trace([](IValues in) { return c10::IValue(in[0].toTensor().relu()); },
                         {at::ones({2})});
  propagate_shapes(gm);
  EXPECT_EQ(leak_check(), 0);
}

TEST(Leaks, SymbolizerStaysReachable) {
  GraphModule gm = trace_sin();
  for (const Node* n : gm.graph()) (void)n->meta().stack_trace.frames();
  EXPECT_EQ(leak_check(), 0);
}

TEST(Leaks, InterpreterRunFreesEverything) {
  GraphModule gm = trace_sin();
  Interpreter(gm).run({at::ones({2})});
  EXPECT_EQ(leak_check(), 0);
}

}  // namespace
}  // namespace torchcap
