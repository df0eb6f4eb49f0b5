// The fuzzers' property and structure-aware mutator (harness.h).
#include "harness.h"

#include <torchcap/error.h>
#include <torchcap/interpreter.h>
#include <torchcap/serialize.h>

#include "serialize/format.h"
#include "serialize_fixtures.h"

#include <ATen/ATen.h>
#include <c10/util/Logging.h>
#include <nlohmann/json.hpp>

#include <iterator>
#include <limits>

namespace torchcap::fuzz {
namespace {

using Json = nlohmann::ordered_json;
using Rng = std::mt19937_64;

// Larger inputs or recorded values than this are not run, nor graphs with an
// integer argument beyond kMaxIntegerToRun: the fuzzers look for crashes, not
// for the machine's memory and time (a convolution padded by 2^22 ran for
// half a minute). What the loader refuses of such integers is checked all the
// same; a run is checked for everything else.
constexpr int64_t kMaxElementsToRun = int64_t{1} << 22;
constexpr int64_t kMaxIntegerToRun = int64_t{1} << 16;

bool small_tensor(const TensorMeta& m) {
  int64_t numel = 1;
  for (int64_t size : m.sizes) {
    if (size < 0 || __builtin_mul_overflow(numel, size, &numel)) return false;
  }
  return numel <= kMaxElementsToRun;
}

bool small_integers(const Argument& a) {
  if (a.is_int()) return a.to_int() >= -kMaxIntegerToRun && a.to_int() <= kMaxIntegerToRun;
  if (!a.is_list()) return true;
  for (const Argument& e : a.to_list()) {
    if (!small_integers(e)) return false;
  }
  return true;
}

// --- The property --------------------------------------------------------------

// Inputs of each placeholder's recorded dtype and shape, or false if one has
// none or the graph is too large to run here: random floats, zeros elsewhere
// (indices and offsets of 0 are valid ones).
bool recorded_inputs(const GraphModule& gm, std::vector<at::Tensor>& out) {
  for (const Node* n : gm.graph()) {
    for (const TensorMeta& m : n->meta().val.tensors) {
      if (!small_tensor(m)) return false;
    }
    for (const Argument& a : n->args()) {
      if (!small_integers(a)) return false;
    }
    for (const auto& kv : n->kwargs()) {
      if (!small_integers(kv.second)) return false;
    }
    if (n->op() != OpCode::Placeholder) continue;
    const ValueMeta& v = n->meta().val;
    if (v.kind != ValueKind::Tensor) return false;
    const TensorMeta& m = v.tensors[0];
    const auto options = at::TensorOptions().dtype(m.dtype);
    out.push_back(at::isFloatingType(m.dtype) ? at::randn(c10::IntArrayRef(m.sizes), options)
                                              : at::zeros(c10::IntArrayRef(m.sizes), options));
  }
  return true;
}

// Findings of the fuzzers that are not the loader's and not fixed yet, each
// by a part of its message: a run that ends in one counts as Known, not as a
// finding. Reviewed; remove an entry when its fix lands.
struct KnownFinding {
  const char* message;
  const char* what;
};
constexpr KnownFinding kKnownFindings[] = {
    // Note [Scalar operators as Tensor operators] in
    // src/runtime/plan_passes/scalar_operators.cpp: the interpreter converts a float Scalar argument (mul.Scalar(x, 1e300)) to
    // a tensor of the result's dtype when it builds its plan, and c10's
    // std::runtime_error escapes the constructor without the node. Eager
    // gives inf.
    {"value cannot be converted to type float without overflow",
     "an unplanned Interpreter's Scalar beyond float32, converted at plan time"},
};

bool is_known(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string what = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  for (const KnownFinding& k : kKnownFindings) {
    if (what.find(k.message) != std::string::npos) return true;
  }
  return false;
}

// --- Mutations (Note [Mutating a file's graph]) ------------------------------

const int64_t kInterestingIntegers[] = {0,
                                        1,
                                        -1,
                                        2,
                                        3,
                                        -2,
                                        7,
                                        64,
                                        int64_t{1} << 16,
                                        (int64_t{1} << 31) - 1,
                                        int64_t{1} << 31,
                                        int64_t{1} << 32,
                                        int64_t{1} << 40,
                                        int64_t{1} << 62,
                                        std::numeric_limits<int64_t>::max(),
                                        std::numeric_limits<int64_t>::min()};

template <typename T, size_t N>
const T& pick(const T (&options)[N], Rng& rng) {
  return options[rng() % N];
}

int64_t mutate_integer(int64_t v, Rng& rng) {
  const auto u = static_cast<uint64_t>(v);  // wrapping arithmetic
  switch (rng() % 6) {
    case 0:
      return static_cast<int64_t>(u + 1);
    case 1:
      return static_cast<int64_t>(u - 1);
    case 2:
      return static_cast<int64_t>(0 - u);
    case 3:
      return static_cast<int64_t>(u << (1 + rng() % 40));
    default:
      return pick(kInterestingIntegers, rng);
  }
}

// Every value in a node's arguments: each argument, each list element.
void collect(Json& v, std::vector<Json*>& out) {
  out.push_back(&v);
  if (v.is_array()) {
    for (Json& e : v) collect(e, out);
  }
}

void mutate_value(Json& v, const std::vector<std::string>& earlier, Rng& rng) {
  // Whatever it is, now and then: a reference to another node, or none.
  if (rng() % 8 == 0 && !earlier.empty()) {
    v = Json{{format::tag(format::ArgumentTag::Node), earlier[rng() % earlier.size()]}};
    return;
  }
  if (v.is_number_integer()) {
    v = mutate_integer(v.get<int64_t>(), rng);
  } else if (v.is_boolean()) {
    v = !v.get<bool>();
  } else if (v.is_number_float()) {
    const double options[] = {0.0, -1.0, 1e300, 0.5, -0.0};
    if (rng() % 3 == 0) {
      v = Json{{format::tag(format::ArgumentTag::Float), rng() % 2 ? "nan" : "-inf"}};
    } else {
      v = pick(options, rng);
    }
  } else if (v.is_null()) {
    v = pick(kInterestingIntegers, rng);
  } else if (v.is_string()) {
    const char* options[] = {"", "floor", "trunc", "none", "tanh", "mean", "same", "valid"};
    v = pick(options, rng);
  } else if (v.is_array()) {
    switch (rng() % 5) {
      case 0:
        if (!v.empty()) v.erase(v.size() - 1);
        break;
      case 1:
        v.push_back(v.empty() ? Json(pick(kInterestingIntegers, rng)) : Json(v[rng() % v.size()]));
        break;
      case 2:
        v = Json::array();
        break;
      case 3:
        if (!v.empty()) v.erase(rng() % v.size());
        break;
      default:
        v.push_back(pick(kInterestingIntegers, rng));
        break;
    }
  } else if (v.is_object() && v.size() == 1) {
    const std::string key = v.begin().key();
    if (key == format::tag(format::ArgumentTag::Node)) {
      if (!earlier.empty()) v[key] = earlier[rng() % earlier.size()];
    } else if (key == format::tag(format::ArgumentTag::Dtype)) {
      v[key] = format::kDtypes[rng() % std::size(format::kDtypes)].name;
    } else if (key == format::tag(format::ArgumentTag::Layout)) {
      v[key] = format::kLayouts[rng() % std::size(format::kLayouts)].name;
    } else if (key == format::tag(format::ArgumentTag::MemoryFormat)) {
      v[key] = format::kMemoryFormats[rng() % std::size(format::kMemoryFormats)].name;
    } else if (key == format::tag(format::ArgumentTag::Device)) {
      const char* devices[] = {"cpu", "meta", "cuda:0", "cpu:1"};
      v[key] = pick(devices, rng);
    } else {
      v = pick(kInterestingIntegers, rng);
    }
  }
}

// A node's recorded value: a size, a dtype, or all of it, changed.
void mutate_meta(Json& node, Rng& rng) {
  auto meta = node.find("meta");
  if (meta == node.end() || !meta->contains("val")) return;
  Json& val = (*meta)["val"];
  if (rng() % 6 == 0) {
    meta->erase("val");
    return;
  }
  Json& tensors = val["tensors"];
  if (!tensors.is_array() || tensors.empty()) return;
  Json& t = tensors[rng() % tensors.size()];
  if (rng() % 3 == 0) {
    t["dtype"] = format::kDtypes[rng() % std::size(format::kDtypes)].name;
    return;
  }
  Json& sizes = t["sizes"];
  if (!sizes.is_array() || sizes.empty()) return;
  Json& size = sizes[rng() % sizes.size()];
  const int64_t options[] = {0, 1, 2, 3, 5, 8, 64, int64_t{1} << 31, int64_t{1} << 40};
  size = rng() % 2 ? pick(options, rng) : mutate_integer(size.get<int64_t>(), rng);
}

// One change somewhere in `nodes`: mostly to one of the values of all their
// arguments, picked alike (so a convolution's dozen arguments are picked
// more often than an addition's two), else to a node's recorded value.
void mutate_graph(Json& nodes, Rng& rng) {
  if (rng() % 5 == 0) {
    Json& node = nodes[rng() % nodes.size()];
    if (node.is_object()) mutate_meta(node, rng);
    return;
  }
  std::vector<Json*> values;
  std::vector<size_t> owner;  // the node of each value
  for (size_t i = 0; i < nodes.size(); ++i) {
    Json& node = nodes[i];
    if (!node.is_object()) continue;
    if (auto args = node.find("args"); args != node.end() && args->is_array()) {
      for (Json& a : *args) collect(a, values);
    }
    if (auto kwargs = node.find("kwargs"); kwargs != node.end() && kwargs->is_array()) {
      for (Json& pair : *kwargs) {
        if (pair.is_array() && pair.size() == 2) collect(pair[1], values);
      }
    }
    owner.resize(values.size(), i);
  }
  if (values.empty()) return;
  const size_t k = rng() % values.size();
  std::vector<std::string> earlier;  // names a reference in this node may take
  for (size_t i = 0; i < owner[k]; ++i) {
    if (nodes[i].is_object() && nodes[i].contains("name") && nodes[i]["name"].is_string()) {
      earlier.push_back(nodes[i]["name"].get<std::string>());
    }
  }
  mutate_value(*values[k], earlier, rng);
}

}  // namespace

Outcome check_input(const uint8_t* data, size_t size, bool run) {
  try {
    load_from_buffer(data, size, "fuzz");
  } catch (const FormatError&) {
  }
  // Mutated bytes fail their checksums at once: with them off, every check
  // behind them is reached.
  GraphModule gm;
  LoadOptions unchecked;
  unchecked.verify_checksums = false;
  try {
    gm = load_from_buffer(data, size, "fuzz", unchecked);
  } catch (const FormatError&) {
    return Outcome::Refused;
  }
  const std::string printed = gm.str();
  std::string again;
  try {
    again = save_to_string(gm);
  } catch (const FormatError& e) {
    throw Finding("a module the loader accepted cannot be saved: " + std::string(e.what()));
  }
  try {
    GraphModule reloaded = load_from_buffer(again.data(), again.size());
    if (reloaded.str() != printed) {
      throw Finding("the module prints differently after a round trip:\n" + printed);
    }
  } catch (const FormatError& e) {
    throw Finding("a saved module does not load: " + std::string(e.what()));
  }
  std::vector<at::Tensor> inputs;
  try {
    if (!run || !recorded_inputs(gm, inputs)) return Outcome::Loaded;
  } catch (const c10::Error&) {
    return Outcome::Loaded;  // no such tensor can be made here (a quantized dtype)
  }
  try {
    Interpreter(gm).run_flat(inputs);
  } catch (const Error&) {
    return Outcome::RunFailed;
  } catch (const std::exception& e) {
    if (!is_known(e)) throw;
    return Outcome::Known;
  }
  return Outcome::Ran;
}

void skip_libtorch_backtraces() {
  c10::SetStackTraceFetcher([] { return std::string("(backtrace not fetched)"); });
}

bool mutate_structure(std::string& file, Rng& rng) {
  testing::TcgFile f;
  try {
    f = testing::TcgFile::parse(file);
  } catch (const std::exception&) {
    return false;
  }
  Json doc = Json::parse(f.json, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("nodes") || !doc["nodes"].is_array() ||
      doc["nodes"].empty()) {
    return false;
  }
  try {
    const int changes = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < changes; ++k) mutate_graph(doc["nodes"], rng);
  } catch (const Json::exception&) {
    return false;  // a node of another shape than the writer's (a byte mutant's)
  }
  f.json = doc.dump();
  file = f.bytes();
  return true;
}

}  // namespace torchcap::fuzz
