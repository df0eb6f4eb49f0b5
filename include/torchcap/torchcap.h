// Everything torchcap offers, in one include.
#pragma once

#include <torchcap/argument.h>
#include <torchcap/error.h>
#include <torchcap/export.h>
#include <torchcap/graph.h>
#include <torchcap/graph_module.h>
#include <torchcap/interpreter.h>
#include <torchcap/library.h>
#include <torchcap/memory_plan.h>
#include <torchcap/meta.h>
#include <torchcap/module_state.h>
#include <torchcap/node.h>
#include <torchcap/passes.h>
#include <torchcap/printer.h>
#include <torchcap/serialize.h>
#include <torchcap/summary.h>
#include <torchcap/symbolic.h>
#include <torchcap/tracer.h>
#include <torchcap/training.h>
#include <torchcap/tree_spec.h>
