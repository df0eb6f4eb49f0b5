// torchcap._C's bridge to torch.fx (fx_bridge.cpp).
#pragma once

#include <torchcap/graph_module.h>

#include <pybind11/pybind11.h>

namespace torchcap::python {

// Fills `graph` (an empty torch.fx.Graph) with the nodes of `gm`; returns the
// in and out specs as `spec_class(kind, children, keys, value)` objects, the
// (kind, target) of each mutation output, and the placeholders by name.
// `direct`: Note [Creating torch.fx nodes directly] where it holds.
pybind11::tuple build_fx(const GraphModule& gm, pybind11::object graph, pybind11::object spec_class,
                         bool direct);

// (in spec, out spec, mutations) as build_fx returns them, without a graph.
pybind11::tuple fx_specs(const GraphModule& gm, pybind11::object spec_class);

// The GraphModule of a torch.fx graph given as node tuples (see FxReader).
GraphModule graph_module_of_fx(const pybind11::list& nodes, const pybind11::list& attributes);

}  // namespace torchcap::python
