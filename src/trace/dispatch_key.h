// Note [The tracer's dispatch key]
//
// The tracer needs one dispatch key that (1) marks wrapper tensors, so every
// operator on them reaches the tracer, and (2) can be put in the thread-local
// *included* set while a trace is active, so operators on plain tensors
// (`weight.t()`, `torch::ones(...)`) reach it too.
//
// LibTorch 1.13 has no key reserved for this. Backend keys cannot serve: a
// DispatchKeySet subtraction never removes backend bits, and excluding a
// backend key such as PrivateUse1 removes the whole Dense functionality, so
// plain CPU tensors would find no kernel while the tracer is excluded. A
// functionality key that nothing else uses in 1.13 works: `Fake` (reserved for
// torchdistx's out-of-core fake tensors). It sits below autograd and
// ADInplaceOrView, between Python and Functionalize, where __torch_dispatch__
// lives upstream: autograd has already run (and CompositeImplicitAutograd ops
// have decomposed, unless autograd keys are excluded, as in inference mode),
// and Functionalize, if active, runs below the tracer.
//
// This is the only place the choice is made.
#pragma once

#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>

namespace torchcap {
namespace detail {

constexpr c10::DispatchKey kTracerKey = c10::DispatchKey::Fake;

}  // namespace detail
}  // namespace torchcap
