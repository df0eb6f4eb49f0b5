// The file format: round trips of every argument kind, opcode, spec and
// attribute kind, the example zoo saved, loaded and re-run, the promises of
// save (atomic rename) and load (no copy, aligned, copy-on-write), and one test
// per verification failure with the exact message it gives.
#include <torchcap/error.h>
#include <torchcap/export.h>
#include <torchcap/interpreter.h>
#include <torchcap/printer.h>
#include <torchcap/serialize.h>
#include <torchcap/tracer.h>

#include "graph/schema_check.h"
#include "sample_graphs.h"
#include "serialize/reader.h"
#include "serialize/temp_files.h"
#include "serialize_fixtures.h"
#include "zoo.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <vector>

#include <csignal>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace torchcap {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::TcgFile;

// --- Helpers ------------------------------------------------------------------

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "torchcap_serialize_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Bitwise equality of two tensors: dtype, sizes, strides and bytes of every
// element (so NaNs and -0.0 count).
void expect_same_tensor(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  EXPECT_EQ(a.scalar_type(), b.scalar_type()) << what;
  EXPECT_EQ(a.sizes(), b.sizes()) << what;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return;
  at::Tensor x = a.resolve_conj().resolve_neg().contiguous();
  at::Tensor y = b.contiguous();
  ASSERT_EQ(x.nbytes(), y.nbytes()) << what;
  // An empty tensor may have no data pointer, which memcmp must not be given.
  if (x.nbytes() == 0) return;
  EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()), 0) << what << " differs";
}

// Everything a GraphModule holds, compared: the listing (names, targets,
// arguments, types, users), each node's arguments as values (bit-exact doubles
// and the alternative held), metadata, stack traces, attributes and specs.
void expect_same_module(const GraphModule& a, const GraphModule& b) {
  EXPECT_EQ(a.str(), b.str());
  EXPECT_EQ(format_graph(a.graph()), format_graph(b.graph()));
  ASSERT_EQ(a.graph().size(), b.graph().size());
  // b's arguments with each node replaced by a's node of the same name, so
  // that Argument's own (bit-exact) equality can compare them.
  auto in_a = [&](const Argument& x) {
    return x.map_nodes([&](Node* n) { return a.graph().find(n->name()); });
  };
  Node* nb = b.graph().first();
  for (const Node* na : a.graph()) {
    SCOPED_TRACE("node %" + na->name());
    EXPECT_EQ(na->name(), nb->name());
    EXPECT_EQ(na->op(), nb->op());
    EXPECT_EQ(na->target(), nb->target());
    ASSERT_EQ(na->args().size(), nb->args().size());
    for (size_t i = 0; i < na->args().size(); ++i) {
      EXPECT_EQ(format_argument(na->args()[i]), format_argument(nb->args()[i]));
      EXPECT_TRUE(na->args()[i] == in_a(nb->args()[i])) << "argument " << i;
    }
    ASSERT_EQ(na->kwargs().size(), nb->kwargs().size());
    for (size_t i = 0; i < na->kwargs().size(); ++i) {
      EXPECT_EQ(na->kwargs()[i].first, nb->kwargs()[i].first);
      EXPECT_TRUE(na->kwargs()[i].second == in_a(nb->kwargs()[i].second))
          << "kwarg " << na->kwargs()[i].first;
    }
    EXPECT_EQ(na->meta().val, nb->meta().val);
    EXPECT_EQ(na->meta().stack_trace.frames(), nb->meta().stack_trace.frames());
    EXPECT_EQ(na->meta().module_stack, nb->meta().module_stack);
    nb = nb->next();
  }
  ASSERT_EQ(a.attributes().size(), b.attributes().size());
  for (size_t i = 0; i < a.attributes().size(); ++i) {
    const Attribute& x = a.attributes()[i];
    const Attribute& y = b.attributes()[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.kind, y.kind) << x.name;
    expect_same_tensor(x.value, y.value, x.name);
  }
  EXPECT_TRUE(a.output_specs == b.output_specs);
  EXPECT_EQ(a.in_spec, b.in_spec) << a.in_spec.str() << " vs " << b.in_spec.str();
  EXPECT_EQ(a.out_spec, b.out_spec) << a.out_spec.str() << " vs " << b.out_spec.str();
}

GraphModule round_trip(const GraphModule& gm) {
  std::string bytes = save_to_string(gm);
  return load_from_buffer(bytes.data(), bytes.size());
}

// The message load_from_buffer gives for `bytes`, or "" if it loads.
std::string load_error(const std::string& bytes) {
  try {
    load_from_buffer(bytes.data(), bytes.size(), "f.tcg");
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

std::string with_json(const std::string& bytes, const std::function<void(Json&)>& edit) {
  TcgFile f = TcgFile::parse(bytes);
  Json doc = Json::parse(f.json);
  edit(doc);
  f.json = doc.dump();
  return f.bytes();
}

// Where the JSON section starts in files this version writes (1.1 and later).
constexpr uint64_t kJson = 72;

// The small valid file the damaged ones are made from.
std::string valid() { return save_to_string(testing::small_module()); }

// --- Round trips ----------------------------------------------------------------

TEST(SerializeRoundTrip, SampleModule) {
  GraphModule gm = testing::sample_module();
  at::manual_seed(0);
  gm.set_attribute("fc.weight", at::randn({5, 4}), AttributeKind::Parameter);
  gm.set_attribute("fc.bias", at::randn({5}), AttributeKind::Parameter);
  gm.lint();
  GraphModule loaded = round_trip(gm);
  loaded.lint();
  expect_same_module(gm, loaded);
  EXPECT_EQ(python_code(gm), python_code(loaded));
}

TEST(SerializeRoundTrip, EveryArgumentKind) {
  GraphModule gm = testing::every_argument_module();
  gm.lint();
  GraphModule loaded = round_trip(gm);
  expect_same_module(gm, loaded);
}

TEST(SerializeRoundTrip, DoublesAreBitExact) {
  // Random bit patterns, plus the awkward ones: each becomes a node argument.
  std::vector<double> values = {0.0, -0.0, 0.1, 1.0 / 3.0, 1e-308, 5e-324, -5e-324, 1e308,
                                std::numeric_limits<double>::max(),
                                std::numeric_limits<double>::lowest(),
                                std::numeric_limits<double>::infinity(),
                                -std::numeric_limits<double>::infinity(),
                                std::numeric_limits<double>::quiet_NaN(),
                                -std::numeric_limits<double>::quiet_NaN(),
                                std::numeric_limits<double>::signaling_NaN()};
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  for (int i = 0; i < 2000; ++i) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    double d;
    std::memcpy(&d, &state, sizeof d);
    values.push_back(d);
  }
  uint64_t payload_nan = 0x7ff000000000dead;
  double d;
  std::memcpy(&d, &payload_nan, sizeof d);
  values.push_back(d);

  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* last = x;
  for (double v : values) last = g.call_function("aten::add.Scalar", {last, v});
  g.output({last});
  gm.set_flat_specs();
  GraphModule loaded = round_trip(gm);
  std::vector<Node*> before = gm.graph().nodes(), after = loaded.graph().nodes();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 1; i + 1 < before.size(); ++i) {
    double a = before[i]->args()[1].to_double();
    ASSERT_TRUE(after[i]->args()[1].is_double());
    double b = after[i]->args()[1].to_double();
    EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "value " << i;
  }
}

TEST(SerializeRoundTrip, SpecsWithConstantsDictsAndNone) {
  GraphModule gm = testing::nested_spec_module();
  gm.lint();
  GraphModule loaded = round_trip(gm);
  expect_same_module(gm, loaded);
  EXPECT_EQ(loaded.in_spec.str(), gm.in_spec.str());
  EXPECT_EQ(loaded.out_spec.str(), gm.out_spec.str());
}

TEST(SerializeRoundTrip, AttributesOfEachKindAndDtype) {
  GraphModule gm = testing::attribute_zoo_module();
  gm.lint();
  GraphModule loaded = round_trip(gm);
  expect_same_module(gm, loaded);
  for (const Attribute& a : loaded.attributes()) {
    if (!a.value.defined()) continue;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.value.data_ptr()) % 64, 0u) << a.name;
  }
}

TEST(SerializeRoundTrip, StridesKeptForDenseAndBroadcastViews) {
  GraphModule gm = testing::attribute_zoo_module();
  GraphModule loaded = round_trip(gm);
  // Transposed and channels-last tensors keep their strides; broadcast views
  // keep their zero strides (and their small storage); a slice with gaps is
  // stored contiguous.
  EXPECT_EQ(loaded.attribute("layout.transposed").value.strides(),
            gm.attribute("layout.transposed").value.strides());
  EXPECT_EQ(loaded.attribute("layout.channels_last").value.strides(),
            gm.attribute("layout.channels_last").value.strides());
  EXPECT_EQ(loaded.attribute("layout.expanded").value.strides(),
            gm.attribute("layout.expanded").value.strides());
  EXPECT_TRUE(loaded.attribute("layout.sliced").value.is_contiguous());
  EXPECT_FALSE(gm.attribute("layout.sliced").value.is_contiguous());
}

TEST(SerializeRoundTrip, TiedAttributesStayTied) {
  GraphModule gm = testing::attribute_zoo_module();
  GraphModule loaded = round_trip(gm);
  EXPECT_EQ(loaded.attribute("tied.a").value.data_ptr(), loaded.attribute("tied.b").value.data_ptr());
  TcgFile f = TcgFile::parse(save_to_string(gm));
  Json doc = Json::parse(f.json);
  size_t defined = 0;
  for (const Json& a : doc["attributes"]) defined += a["tensor"].is_null() ? 0 : 1;
  EXPECT_EQ(doc["tensors"].size() + 1, defined);  // one table entry for the pair
}

TEST(SerializeRoundTrip, SavingTwiceGivesTheSameBytes) {
  GraphModule gm = testing::attribute_zoo_module();
  std::string first = save_to_string(gm);
  EXPECT_EQ(first, save_to_string(gm));
  GraphModule loaded = load_from_buffer(first.data(), first.size());
  EXPECT_EQ(first, save_to_string(loaded));
}

TEST(SerializeRoundTrip, SourceLinesAndModuleStacks) {
  GraphModule gm = testing::every_argument_module();
  std::string bytes = save_to_string(gm);
  GraphModule loaded = load_from_buffer(bytes.data(), bytes.size());
  expect_same_module(gm, loaded);
  const Node* relu = loaded.graph().find("relu");
  ASSERT_NE(relu, nullptr);
  EXPECT_EQ(relu->meta().stack_trace.frames().back().code, "return run(model, x)");
  EXPECT_EQ(relu->meta().module_stack.innermost_str(), "layer1.0 (BasicBlock)");
  // Loaded nodes of one stack share one list, as traced ones do.
  EXPECT_EQ(&relu->meta().module_stack.frames(),
            &loaded.graph().find("topk")->meta().module_stack.frames());
  // One table entry per distinct stack: equal lists are stored once.
  Json doc = Json::parse(TcgFile::parse(bytes).json);
  ASSERT_EQ(doc["module_stacks"].size(), 2u);
  EXPECT_EQ(doc["module_stacks"][1][1]["path"], "layer1.0");
  EXPECT_EQ(doc["nodes"][0]["meta"]["module_stack"], 0);
  // A module without stacks has no table.
  EXPECT_FALSE(Json::parse(TcgFile::parse(valid()).json).contains("module_stacks"));
}

TEST(SerializeRoundTrip, StackTracesOfATracedGraph) {
  GraphModule gm = trace(
      [](std::vector<c10::IValue> in) {
        at::Tensor x = in[0].toTensor();
        return c10::IValue(at::relu(x * 2));
      },
      {at::randn({3})});
  bool any = false;
  for (const Node* n : gm.graph()) any |= !n->meta().stack_trace.frames().empty();
  EXPECT_TRUE(any) << "the trace recorded no stack traces to round-trip";
  expect_same_module(gm, round_trip(gm));
}

// Nothing in the writer or the reader recurses over the graph's length.
TEST(SerializeRoundTrip, GraphOf100000Nodes) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* last = g.placeholder("x");
  for (int i = 0; i < 100000; ++i) last = g.call_function("aten::relu", {last});
  g.output({last});
  gm.set_flat_specs();
  GraphModule loaded = round_trip(gm);
  EXPECT_EQ(loaded.graph().size(), gm.graph().size());
  EXPECT_EQ(loaded.graph().last()->prev()->name(), "relu_99999");
  // The JSON text, written in pieces of about a megabyte, is still the one
  // document nlohmann::json would dump, byte for byte.
  TcgFile f = TcgFile::parse(save_to_string(gm));
  ASSERT_GT(f.json.size(), size_t{4} << 20);
  EXPECT_EQ(f.json, nlohmann::ordered_json::parse(f.json).dump());
}

// Wide nodes: one value read by 50,000 nodes, and a cat of 50,000 values (each
// twice). Loading builds and lints them in linear time; the inputs of the cat
// are the distinct values, in order of first appearance.
TEST(SerializeRoundTrip, WideFanOutAndFanIn) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  ArgumentList values;
  for (int i = 0; i < 50000; ++i) values.push_back(g.call_function("aten::relu", {x}));
  ArgumentList twice = values;
  twice.insert(twice.end(), values.begin(), values.end());
  Node* cat = g.call_function("aten::cat", {Argument(twice)});
  g.output({cat});
  gm.set_flat_specs();
  ASSERT_EQ(cat->inputs().size(), 50000u);
  GraphModule loaded = round_trip(gm);
  Node* loaded_cat = loaded.graph().output_node()->prev();
  ASSERT_EQ(loaded_cat->inputs().size(), 50000u);
  EXPECT_EQ(loaded_cat->inputs()[17]->name(), "relu_17");
  EXPECT_EQ(loaded.graph().first()->users().size(), 50000u);
}

TEST(SerializeRoundTrip, EmptyGraph) {
  GraphModule gm;
  gm.graph().output({});
  gm.set_flat_specs();
  expect_same_module(gm, round_trip(gm));
}

// --- Reading in one pass ----------------------------------------------------------

// Note [Reading the usual file in one pass]: what the writer writes is read
// in one pass (not read again in the contract's order after a problem), into
// the module the reading in the contract's order makes.
TEST(LoadInOnePass, WhatTheWriterWritesIsReadInOnePass) {
  std::vector<GraphModule> modules;
  modules.push_back(testing::small_module());
  modules.push_back(testing::every_argument_module());
  for (const char* name : {"resnet18", "nested_io"}) {
    examples::Example e = examples::make(name);
    modules.push_back(examples::trace(e));
  }
  for (const GraphModule& gm : modules) {
    const std::string bytes = save_to_string(gm);
    std::optional<GraphModule> read = detail::read_in_text_order(bytes.data(), bytes.size());
    ASSERT_TRUE(read.has_value()) << gm.str();
    expect_same_module(gm, *read);
  }
}

// JSON the writer never writes (other key orders, white space, escapes,
// numbers with exponents) is still JSON: the reader reads it, in the
// contract's order where the text's order will not do, into the same module.
TEST(LoadInOnePass, OtherSpellingsOfTheSameJsonLoadTheSame) {
  GraphModule gm = testing::every_argument_module();
  const std::string bytes = save_to_string(gm);
  auto respelled = [&](const std::function<std::string(const Json&)>& spell) {
    TcgFile f = TcgFile::parse(bytes);
    f.json = spell(Json::parse(f.json));
    return f.bytes();
  };
  // Sorted keys, indented: read in the contract's order.
  std::string indented = respelled([](const Json& doc) { return doc.dump(2); });
  expect_same_module(gm, load_from_buffer(indented.data(), indented.size()));
  // "nodes" before "module_stacks": read in the contract's order.
  std::string reordered = respelled([](const Json& doc) {
    nlohmann::ordered_json out;
    out["nodes"] = doc["nodes"];
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (it.key() != "nodes") out[it.key()] = it.value();
    }
    return out.dump();
  });
  expect_same_module(gm, load_from_buffer(reordered.data(), reordered.size()));
  // Non-ASCII characters as \u escapes (surrogate pairs beyond U+FFFF), and
  // every slash as \/: the reading in one pass decodes them.
  std::string escaped = respelled([](const Json& doc) {
    std::string out = doc.dump(-1, ' ', true);  // non-ASCII as \u escapes
    std::string with_slashes;
    for (char c : out) with_slashes += c == '/' ? std::string("\\/") : std::string(1, c);
    return with_slashes;
  });
  expect_same_module(gm, load_from_buffer(escaped.data(), escaped.size()));
}

// --- The example zoo ------------------------------------------------------------

class ZooRoundTrip : public ::testing::TestWithParam<std::string> {};

// Every example: traced, saved to a file, loaded, printed and run. The loaded
// graph prints as the traced one and computes bit-identical results (the same
// kernels on the same weights and inputs).
TEST_P(ZooRoundTrip, LoadsPrintsAndRunsIdentically) {
  examples::Example e = examples::make(GetParam());
  GraphModule gm = examples::trace(e);
  TempDir dir;
  const std::string path = dir.file("model.tcg");
  save(gm, path);
  GraphModule loaded = load(path);
  expect_same_module(gm, loaded);

  std::vector<c10::IValue> inputs = e.make_inputs(1);
  c10::IValue expected = Interpreter(gm).run(inputs);
  c10::IValue actual = Interpreter(loaded).run(inputs);
  EXPECT_EQ(examples::max_abs_diff(actual, expected), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Examples, ZooRoundTrip, ::testing::ValuesIn(examples::names()),
                         [](const auto& info) { return info.param; });

class ExportedZooRoundTrip : public ::testing::TestWithParam<std::string> {};

// Exported (functionalized) examples carry a signature: outputs that update
// buffers or inputs. Both modules start from the same buffer values, so both
// runs give the same results and leave the same buffers.
TEST_P(ExportedZooRoundTrip, KeepsTheSignatureAndWritesTheSameBuffers) {
  examples::Example e = examples::make(GetParam());
  std::vector<c10::IValue> example = e.make_inputs(0);
  GraphModule gm = e.module ? export_program(*e.module, e.forward, example)
                            : export_program(e.forward, example);
  GraphModule loaded = round_trip(gm);
  expect_same_module(gm, loaded);

  std::vector<c10::IValue> inputs = e.make_inputs(1);
  c10::IValue expected = Interpreter(gm).run(inputs);
  c10::IValue actual = Interpreter(loaded).run(inputs);
  EXPECT_EQ(examples::max_abs_diff(actual, expected), 0.0);
  for (const OutputSpec& o : gm.output_specs) {
    if (o.kind != OutputKind::BufferMutation) continue;
    expect_same_tensor(loaded.attribute(o.target).value, gm.attribute(o.target).value, o.target);
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, ExportedZooRoundTrip, ::testing::ValuesIn(examples::names()),
                         [](const auto& info) { return info.param; });

TEST(SerializeRoundTrip, SignatureOfAHandBuiltModuleRunsItsWrites) {
  GraphModule gm = testing::signature_module();
  gm.lint();
  GraphModule loaded = round_trip(gm);
  expect_same_module(gm, loaded);
  at::Tensor x = at::ones({3});
  c10::IValue y = Interpreter(loaded).run({x});
  EXPECT_TRUE(at::equal(y.toTensor(), at::arange(3, at::kFloat)));
  EXPECT_TRUE(at::equal(loaded.attribute("stats.mean").value, at::arange(3, at::kFloat) + 1));
  EXPECT_TRUE(at::equal(x, at::full({3}, 2.0)));
}

TEST(SerializeRoundTrip, SignatureIsWrittenOnlyWhenThereAreMutations) {
  examples::Example e = examples::make("cnn_bn_train");
  GraphModule gm = export_program(*e.module, e.forward, e.make_inputs(0));
  ASSERT_FALSE(gm.output_specs.empty());
  Json doc = Json::parse(TcgFile::parse(save_to_string(gm)).json);
  ASSERT_TRUE(doc.contains("signature"));
  EXPECT_EQ(doc["signature"]["outputs"][0], Json({{"kind", "user"}, {"target", ""}}));
  EXPECT_EQ(doc["signature"]["outputs"][1],
            Json({{"kind", "buffer_mutation"}, {"target", "bn1.num_batches_tracked"}}));
  EXPECT_FALSE(Json::parse(TcgFile::parse(valid()).json).contains("signature"));
}

// --- save ---------------------------------------------------------------------

// Saves `gm` over a file holding "old contents" in a fresh directory, expects
// `message`, and checks the old file is as it was and nothing else was left.
void expect_save_fails_leaving_the_old_file(const GraphModule& gm, const char* message) {
  TempDir dir;
  const std::string path = dir.file("m.tcg");
  std::ofstream(path) << "old contents";
  try {
    save(gm, path);
    FAIL() << "saved; expected: " << message;
  } catch (const FormatError& e) {
    EXPECT_STREQ(e.what(), message);
  }
  std::ifstream in(path);
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(contents, "old contents");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 1);
}

TEST(Save, ReplacesTheTargetAndLeavesNoTemporaryFile) {
  TempDir dir;
  const std::string path = dir.file("m.tcg");
  std::ofstream(path) << "old contents";
  save(testing::attribute_zoo_module(), path);
  EXPECT_NO_THROW(load(path));
  std::vector<std::string> entries;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    entries.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(entries, std::vector<std::string>{"m.tcg"});
}

TEST(Save, AModuleThatCannotBeStoredLeavesTheOldFile) {
  GraphModule gm;
  gm.graph().output({gm.graph().get_attr("q")});
  gm.set_flat_specs();
  gm.set_attribute("q", at::quantize_per_tensor(at::ones({2}), 0.1, 0, at::kQInt8),
                   AttributeKind::Buffer);
  expect_save_fails_leaving_the_old_file(
      gm, "save: attribute 'q': tensors of dtype QInt8 cannot be stored");
}

TEST(Save, AttributesThatShareMemoryAreRefusedWhenTheGraphWritesOne) {
  // A buffer and views of it (Note [Attributes that share memory]): the
  // file would store them apart, and the loaded graph would read the old
  // value through the view after writing the buffer.
  at::Tensor counts = at::arange(6, at::kFloat);
  at::Tensor rows = counts.view({2, 3});
  ModuleState state;
  state.buffers = {{"counts", counts}, {"rows", rows}};
  GraphModule written = trace(state, [&](std::vector<c10::IValue>) {
    counts.view({6}).add_(1);  // through a view of the buffer, too
    return c10::IValue(rows.sum());
  }, {});
  expect_save_fails_leaving_the_old_file(
      written,
      "save: node %add_ writes attribute 'counts' in place, whose memory attribute 'rows' "
      "shares; the file stores each attribute's memory on its own, so the loaded graph would "
      "not see the write through 'rows'. Make one of them a tensor of its own (clone it) in "
      "the program");
  // Only read, they load with the values they had.
  GraphModule read = trace(state, [&](std::vector<c10::IValue>) {
    return c10::IValue(rows.sum() + counts.sum());
  }, {});
  GraphModule loaded = round_trip(read);
  EXPECT_TRUE(at::equal(Interpreter(loaded).run({}).toTensor(), rows.sum() + counts.sum()));
}

TEST(Save, IntoAMissingDirectoryFailsCleanly) {
  TempDir dir;
  const std::string path = dir.file("missing/m.tcg");
  try {
    save(testing::attribute_zoo_module(), path);
    FAIL() << "saved into a missing directory";
  } catch (const FormatError& e) {
    std::string what = e.what();
    EXPECT_EQ(what.rfind("save: cannot create '" + path + ".tmp-", 0), 0u) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
}

// Note [The depth of the written JSON]: a spec nested deeper than the
// format's JSON depth limit is refused on saving, not written for load to
// refuse.
TEST(Save, SpecsNestedTooDeepAreRefused) {
  GraphModule gm;
  Graph& g = gm.graph();
  g.output({g.placeholder("x")});
  gm.set_flat_specs();
  TreeSpec deep = TreeSpec::leaf();
  for (int i = 0; i < 32; ++i) deep = TreeSpec::tuple({deep});
  gm.in_spec = deep;  // its leaf 66 levels deep: the document, and 2 per tuple
  try {
    save_to_string(gm);
    FAIL() << "saved a spec nested deeper than the format allows";
  } catch (const FormatError& e) {
    EXPECT_STREQ(e.what(),
                 "save: the graph's argument lists or specs nest deeper than the format allows "
                 "(64 JSON levels)");
  }
  gm.in_spec = deep.children()[0];
  EXPECT_NO_THROW(save_to_string(gm));  // one tuple less: 64 levels, the most allowed
}

TEST(Save, NonUtf8StringArgumentIsRefused) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* y = g.placeholder("y");
  g.output({g.call_function("aten::div.Tensor_mode", {x, y}, {{"rounding_mode", "fl\xffor"}})});
  gm.set_flat_specs();
  try {
    save_to_string(gm);
    FAIL() << "saved a string that is not UTF-8";
  } catch (const FormatError& e) {
    EXPECT_STREQ(e.what(), "save: node %div: the string is not valid UTF-8");
  }
}

// Note [Writing the file in one pass]: a problem in a node is found while
// the nodes are written, here after megabytes of them; the file being written
// is removed and the old one left as it was.
TEST(Save, AProblemFoundWhileWritingLeavesTheOldFile) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  Node* last = x;
  for (int i = 0; i < 40000; ++i) last = g.call_function("aten::relu", {last});
  g.output({g.call_function("aten::div.Tensor_mode", {last, x}, {{"rounding_mode", "fl\xffor"}})});
  gm.set_flat_specs();
  expect_save_fails_leaving_the_old_file(gm, "save: node %div: the string is not valid UTF-8");
}

// --- load: what a loaded module is made of --------------------------------------------

TEST(Load, TensorsAreViewsOfOneMappingNotCopies) {
  GraphModule gm = testing::attribute_zoo_module();
  TempDir dir;
  const std::string path = dir.file("m.tcg");
  save(gm, path);
  GraphModule loaded = load(path);
  TcgFile f = TcgFile::parse(save_to_string(gm));
  Json doc = Json::parse(f.json);
  // Two tensors sit as far apart in memory as in the file: both point into
  // one mapping of the whole file.
  const Json& tensors = doc["tensors"];
  ASSERT_GE(tensors.size(), 2u);
  auto address = [&](const std::string& name) {
    return reinterpret_cast<uintptr_t>(loaded.attribute(name).value.data_ptr());
  };
  std::string first = tensors[0]["name"], last = tensors[tensors.size() - 1]["name"];
  EXPECT_EQ(address(last) - address(first),
            tensors[tensors.size() - 1]["offset"].get<uint64_t>() - tensors[0]["offset"].get<uint64_t>());
  EXPECT_EQ((address(first) - f.data_offset - tensors[0]["offset"].get<uint64_t>()) % 4096, 0u)
      << "the file's first byte is not page-aligned in memory";
}

TEST(Load, WritesToLoadedTensorsDoNotReachTheFile) {
  GraphModule gm = testing::attribute_zoo_module();
  TempDir dir;
  const std::string path = dir.file("m.tcg");
  save(gm, path);
  {
    GraphModule loaded = load(path);
    loaded.attribute("dtypes.float32").value.fill_(42);
  }
  GraphModule again = load(path);
  expect_same_tensor(again.attribute("dtypes.float32").value, gm.attribute("dtypes.float32").value,
                     "dtypes.float32");
}

TEST(Load, TensorsOutliveTheModuleAndTheFile) {
  GraphModule gm = testing::attribute_zoo_module();
  TempDir dir;
  const std::string path = dir.file("m.tcg");
  save(gm, path);
  at::Tensor kept;
  {
    GraphModule loaded = load(path);
    kept = loaded.attribute("dtypes.float64").value;
  }
  fs::remove(path);
  expect_same_tensor(kept, gm.attribute("dtypes.float64").value, "dtypes.float64");
}

// --- load: files it refuses (most are rows of kRejectCases, at the end) ---------------

TEST(LoadRejects, MissingFile) {
  TempDir dir;
  const std::string path = dir.file("nope.tcg");
  try {
    load(path);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": cannot open: No such file or directory");
  }
}

TEST(LoadRejects, ADirectoryOrAFifo) {
  TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {dir.path(), fifo}) {
    try {
      load(path);  // a FIFO must not block waiting for a writer
      FAIL() << path;
    } catch (const FormatError& e) {
      EXPECT_EQ(std::string(e.what()), path + ": not a regular file");
    }
  }
}

TEST(LoadRejects, EmptyFile) {
  TempDir dir;
  const std::string path = dir.file("empty.tcg");
  std::ofstream(path).close();
  try {
    load(path);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": byte 0: not a torchcap graph file (the first 8 bytes are not the .tcg "
                     "magic)");
  }
}

TEST(LoadRejects, InvalidJson) {
  TcgFile f = TcgFile::parse(valid());
  f.json[10] = '}';
  EXPECT_EQ(load_error(f.bytes()),
            "f.tcg: byte 82: the JSON section is not valid JSON: parse error at line 1, column "
            "11: syntax error while parsing value - unexpected '}'; expected '[', '{', or a "
            "literal");
}

TEST(LoadRejects, UnknownKeyIsIgnoredInANewerMinorVersion) {
  std::string b = with_json(valid(), [](Json& d) {
    d["extra"] = 1;
    d["nodes"][0]["future"] = true;
  });
  TcgFile::put_header(b, 10, kFormatMinorVersion + 1, 2);
  EXPECT_EQ(load_error(b), "");
}

// Tensor table -------------------------------------------------------------------

// The byte where element `i` of top-level array `key` starts in `bytes`.
uint64_t element_byte(const std::string& bytes, const std::string& key, size_t i) {
  TcgFile f = TcgFile::parse(bytes);
  return testing::element_offset(f.json, key, i) + f.json_offset();
}

std::string at_tensor(const std::string& b, size_t i) {
  return "f.tcg: byte " + std::to_string(element_byte(b, "tensors", i)) + ": ";
}

// --- Checksums (version 1.1) ----------------------------------------------------
// Damage is a change made after the file was sealed: bit flips the structural
// checks cannot see, because the result is still a well-formed file.

TEST(LoadRejects, DamagedJsonThatIsStillValid) {
  // One digit of the add's alpha changes (0.5 to 0.7): valid JSON, a valid
  // graph, a different program. Only the checksum can tell.
  TcgFile f = TcgFile::parse(valid());
  size_t at = f.json.find("[\"alpha\",0.5]");
  ASSERT_NE(at, std::string::npos) << f.json;
  std::string b = f.bytes();
  b[kJson + at + 11] = '7';
  uint32_t computed = TcgFile::crc(b.substr(kJson, f.json.size()));
  char message[128];
  std::snprintf(message, sizeof message,
                "f.tcg: byte 72: the JSON section is damaged: its CRC-32 is 0x%08x, the header "
                "records 0x%08x",
                computed, static_cast<uint32_t>(TcgFile::get(b, 64, 4)));
  EXPECT_EQ(load_error(b), message);
  // Sealed again (a hostile file rather than a damaged one) it loads, as
  // the different program it now is.
  TcgFile::put(b, 64, computed, 4);
  TcgFile::seal_header(b);
  GraphModule gm = load_from_buffer(b.data(), b.size());
  EXPECT_NE(gm.graph().str().find("alpha=0.7"), std::string::npos) << gm.graph().str();
}

TEST(LoadRejects, DamagedTensorBytes) {
  std::string b = valid();
  TcgFile f = TcgFile::parse(b);
  Json w = Json::parse(f.json)["tensors"][0];
  uint64_t at = f.data_offset + w["offset"].get<uint64_t>() + 5;
  b[at] ^= 0x10;  // a bit of w[0][1]'s exponent
  char message[160];
  std::snprintf(message, sizeof message,
                "f.tcg: byte %llu: tensor 'w' (tensors[0]): its bytes are damaged: their CRC-32 "
                "is 0x%08x, the tensor table records 0x%08x",
                static_cast<unsigned long long>(at - 5),
                TcgFile::crc(b.substr(at - 5, w["length"].get<uint64_t>())),
                w["crc32"].get<uint32_t>());
  EXPECT_EQ(load_error(b), message);

  // With the checksums off the file loads, damage and all (serialize.h).
  LoadOptions unchecked;
  unchecked.verify_checksums = false;
  GraphModule gm = load_from_buffer(b.data(), b.size(), "f.tcg", unchecked);
  EXPECT_NE(gm.attribute("w").value[0][1].item<float>(), 1.0f);
}

TEST(LoadRejects, DamagedTensorBytesInAMappedFile) {
  TempDir dir;
  const std::string path = dir.file("model.tcg");
  save(testing::small_module(), path);
  std::string b = valid();
  TcgFile f = TcgFile::parse(b);
  uint64_t at = f.data_offset + Json::parse(f.json)["tensors"][1]["offset"].get<uint64_t>();
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(at));
    file.put('\0');  // mask[0]: 1 becomes 0, still a valid bool
  }
  try {
    load(path);
    FAIL() << "the damaged file loaded";
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()).substr(0, path.size() + 64),
              path + ": byte " + std::to_string(at) +
                  ": tensor 'mask' (tensors[1]): its bytes are damaged: ")
        << e.what();
  }
}

// A file of an earlier version made from one of 1.2: 1.1 has no source lines
// and module stacks, 1.0 no checksums either (and a 64-byte header).
std::string as_version(const std::string& bytes, uint16_t minor) {
  TcgFile f = TcgFile::parse(bytes);
  if (minor < 1) {
    Json doc = Json::parse(f.json);
    for (Json& t : doc["tensors"]) t.erase("crc32");
    f.json = doc.dump();
  }
  f.minor = minor;
  return f.bytes();
}
std::string as_version_10(const std::string& bytes) { return as_version(bytes, 0); }

TEST(LoadEarlierVersions, StillLoad) {
  GraphModule gm = testing::small_module();
  for (uint16_t minor : {0, 1}) {
    std::string b = as_version(save_to_string(gm), minor);
    ASSERT_EQ(TcgFile::get(b, 10, 2), minor);
    ASSERT_EQ(TcgFile::get(b, 12, 4), minor == 0 ? 64u : 72u);
    expect_same_module(gm, load_from_buffer(b.data(), b.size(), "f.tcg"));
  }
}

TEST(LoadVersion10, RejectsWhatOnlyLaterVersionsHave) {
  std::string b = as_version_10(valid());
  std::string with_crc = with_json(b, [](Json& d) { d["tensors"][0]["crc32"] = 0; });
  EXPECT_EQ(load_error(with_crc), at_tensor(with_crc, 0) +
                                      "tensors[0]: unknown key 'crc32' in a file of version 1.0 "
                                      "(version 1.1 added it)");
  TcgFile::put(b, 12, 72, 4);
  EXPECT_EQ(load_error(b), "f.tcg: byte 12: header size 72 is not 64, the header size of version 1.0");
}

// Attributes ---------------------------------------------------------------------

std::string at_attribute(const std::string& b, size_t i) {
  return "f.tcg: byte " + std::to_string(element_byte(b, "attributes", i)) + ": ";
}

// Nodes --------------------------------------------------------------------------

std::string at_node(const std::string& b, size_t i) {
  return "f.tcg: byte " + std::to_string(element_byte(b, "nodes", i)) + ": ";
}

// Node indices in small_module(): 0 x, 1 w, 2 mask, 3 add, 4 topk, 5 getitem, 6 where, 7 output.

// Integer literals beyond int64_t: nlohmann::json would read 2^63 .. 2^64-1
// as unsigned and anything larger, or below -2^63, as a double, so an int
// argument would come back as a float. Reported at the literal.
TEST(LoadRejects, IntegerOutOfRange) {
  for (const char* literal : {"9223372036854775808", "18446744073709551615",
                              "100000000000000000000", "-9223372036854775809"}) {
    TcgFile f = TcgFile::parse(valid());
    size_t at = f.json.find("{\"node\":\"add\"},2]");
    ASSERT_NE(at, std::string::npos);
    at += std::strlen("{\"node\":\"add\"},");
    f.json.replace(at, 1, literal);
    EXPECT_EQ(load_error(f.bytes()), "f.tcg: byte " + std::to_string(kJson + at) + ": integer " +
                                         literal + " does not fit in 64 signed bits");
  }
  // The edges themselves load.
  for (const char* literal : {"9223372036854775807", "-9223372036854775808", "-0", "00"}) {
    TcgFile f = TcgFile::parse(valid());
    size_t at = f.json.find("\"alpha\",0.5") + std::strlen("\"alpha\",");
    f.json.replace(at, 3, literal);
    std::string message = load_error(f.bytes());
    EXPECT_EQ(message.find("does not fit"), std::string::npos) << literal << ": " << message;
  }
}

// Specs --------------------------------------------------------------------------

// Regression inputs found by the fuzzer (fuzz/load_fuzzer.cpp), rebuilt as
// text from the crashing files, each with the message it must give.

// A number too large for a double made nlohmann::json throw out_of_range,
// which is not a parse_error, and escaped the loader (crash-9b028953...).
TEST(LoadRejects, FuzzNumberOverflow) {
  TcgFile f = TcgFile::parse(valid());
  size_t at = f.json.find("0.5");
  ASSERT_NE(at, std::string::npos);
  f.json.replace(at, 3, "1e999");
  EXPECT_EQ(load_error(f.bytes()),
            "f.tcg: byte 72: the JSON section is not valid JSON: number overflow parsing '1e999'");
}

TEST(LoadVersion11, RejectsWhatOnlyLaterVersionsHave) {
  std::string b = as_version(valid(), 1);
  std::string stacks = with_json(b, [](Json& d) { d["module_stacks"] = Json::array(); });
  EXPECT_EQ(load_error(stacks), "f.tcg: byte 72: unknown key 'module_stacks' in a file of version "
                                "1.1 (version 1.2 added it)");
  std::string code = with_json(b, [](Json& d) {
    d["nodes"][3]["meta"] = {{"stack_trace", {{{"file", "a.py"}, {"line", 1}, {"function", "f"},
                                               {"code", "x"}}}}};
  });
  EXPECT_EQ(load_error(code), at_node(code, 3) +
                                  "node %add (nodes[3]): meta.stack_trace[0]: unknown key 'code' in "
                                  "a file of version 1.1 (version 1.2 added it)");
}

// Keys are strings like any other: escapes may spell "nodes".
TEST(Load, NodesUnderAnEscapedKeyStillLoad) {
  GraphModule gm = testing::small_module();
  TcgFile f = TcgFile::parse(save_to_string(gm));
  size_t at = f.json.find("\"nodes\":");
  ASSERT_NE(at, std::string::npos);
  f.json.replace(at, 8, "\"nod\\u0065s\":");
  std::string b = f.bytes();
  expect_same_module(gm, load_from_buffer(b.data(), b.size(), "f.tcg"));
}

// Arguments kernels trust, and shapes (issue 42) ----------------------------------
//
// Files made valid, then given an argument a kernel would crash on (or shapes
// that contradict each other), with every checksum recomputed: hostile files,
// not damaged ones. Note [Integers kernels divide by], Note [Kernels that
// trust their arguments] (src/graph/schema_check.cpp), Note [Checking a file's
// shapes] (src/serialize/shapes.cpp).

TensorMeta shape(std::vector<int64_t> sizes, c10::ScalarType dtype = c10::kFloat) {
  TensorMeta m{dtype, {}, {}, c10::Device(c10::kCPU), nullptr};
  m.sizes.assign(sizes.begin(), sizes.end());
  int64_t stride = 1;
  m.strides.resize(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    m.strides[d] = stride;
    stride *= std::max<int64_t>(sizes[d], 1);
  }
  return m;
}

// A module that calls `target` once, named %call, on placeholders %x0, %x1,
// ... of the given recorded shapes (nodes[0] ...; %call is nodes[inputs]),
// and returns its (first) tensor.
GraphModule one_call(const std::string& target, const std::vector<TensorMeta>& inputs,
                     const std::function<ArgumentList(const std::vector<Node*>&)>& args) {
  GraphModule gm;
  Graph& g = gm.graph();
  std::vector<Node*> in;
  for (size_t i = 0; i < inputs.size(); ++i) {
    in.push_back(g.placeholder("x" + std::to_string(i)));
    in.back()->meta().val = ValueMeta::tensor(inputs[i]);
  }
  Node* call = g.call_function(target, args(in), {}, "call");
  g.output({detail::produces(*call) == detail::Produces::Tensor ? call : g.getitem(call, 0, "first")});
  gm.set_flat_specs();
  return gm;
}

std::vector<at::Tensor> random_inputs(const GraphModule& gm) {
  std::vector<at::Tensor> out;
  for (const Node* n : gm.graph().placeholders()) {
    const TensorMeta& m = n->meta().val.tensors[0];
    out.push_back(at::randn(c10::IntArrayRef(m.sizes)).to(m.dtype));
  }
  return out;
}

TEST(LoadRejects, ConvolutionBackwardWithGroupsZeroByName) {
  // What a trace of a convolution's backward records: valid, it loads and runs.
  GraphModule gm = one_call("aten::convolution_backward",
                            {shape({2, 6, 6, 6}), shape({2, 3, 8, 8}), shape({6, 3, 3, 3})},
                            [](const std::vector<Node*>& x) {
                              return ArgumentList{x[0], x[1], x[2], ArgumentList{6}, ArgumentList{1, 1},
                                                  ArgumentList{0, 0}, ArgumentList{1, 1}, false,
                                                  ArgumentList{0, 0}, 1,
                                                  ArgumentList{true, true, true}};
                            });
  const std::string good = save_to_string(gm);
  GraphModule loaded = load_from_buffer(good.data(), good.size());
  EXPECT_EQ(Interpreter(loaded).run_flat(random_inputs(loaded))[0].sizes(), at::IntArrayRef({2, 3, 8, 8}));

  // groups=0, checksums valid: the kernel divides by it (SIGFPE).
  std::string b = with_json(good, [](Json& d) { d["nodes"][3]["args"][9] = 0; });
  EXPECT_EQ(load_error(b), at_node(b, 3) +
                               "node %call (nodes[3]): argument 'groups' of "
                               "aten::convolution_backward is 0; it must be between 1 and "
                               "2147483647");
  // Saving a graph the loader would refuse is refused too (lint).
  loaded.graph().find("call")->set_arg(9, Argument(0));
  try {
    save_to_string(loaded);
    ADD_FAILURE() << "saved";
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()),
              "save: the module does not pass lint: lint: node %call: argument 'groups' of "
              "aten::convolution_backward is 0; it must be between 1 and 2147483647");
  }
}

// Each: a valid call, the argument changed, the loader's message for it.
struct HostileArgument {
  const char* what;
  const char* target;
  std::vector<TensorMeta> inputs;
  std::function<ArgumentList(const std::vector<Node*>&)> args;
  size_t index;  // of the argument changed
  Json value;
  const char* message;  // after "node %call (nodes[N]): "
};

class HostileArguments : public ::testing::TestWithParam<HostileArgument> {};

TEST_P(HostileArguments, AreRefusedNamingTheNodeAndTheArgument) {
  const HostileArgument& c = GetParam();
  const std::string good = save_to_string(one_call(c.target, c.inputs, c.args));
  ASSERT_EQ(load_error(good), "") << "the valid call loads";
  const size_t call = c.inputs.size();
  std::string b = with_json(good, [&](Json& d) { d["nodes"][call]["args"][c.index] = c.value; });
  EXPECT_EQ(load_error(b), at_node(b, call) + "node %call (nodes[" + std::to_string(call) +
                               "]): " + c.message);
}

const HostileArgument kHostileArguments[] = {
    {"convolution_groups_that_overflow", "aten::convolution",
     {shape({2, 3, 8, 8}), shape({6, 3, 3, 3})},
     [](const std::vector<Node*>& x) {
       return ArgumentList{x[0], x[1], Argument(), ArgumentList{1, 1}, ArgumentList{0, 0},
                           ArgumentList{1, 1}, false, ArgumentList{0, 0}, 1};
     },
     8, int64_t{1} << 62,
     "argument 'groups' of aten::convolution is 4611686018427387904; it must be between 1 and "
     "2147483647"},
    {"pixel_shuffle_factor_whose_square_overflows", "aten::pixel_shuffle", {shape({1, 4, 2, 2})},
     [](const std::vector<Node*>& x) { return ArgumentList{x[0], 2}; }, 1, int64_t{1} << 32,
     "argument 'upscale_factor' of aten::pixel_shuffle is 4294967296; it must be between 1 and "
     "2147483647"},
    {"native_channel_shuffle_groups_zero", "aten::native_channel_shuffle", {shape({1, 4, 2, 2})},
     [](const std::vector<Node*>& x) { return ArgumentList{x[0], 2}; }, 1, 0,
     "argument 'groups' of aten::native_channel_shuffle is 0; it must be between 1 and "
     "2147483647"},
    {"unfold_backward_step_zero", "aten::unfold_backward", {shape({2, 3, 8, 4, 2})},
     [](const std::vector<Node*>& x) { return ArgumentList{x[0], ArgumentList{2, 3, 8, 8}, 3, 2, 2}; },
     4, 0, "argument 'step' of aten::unfold_backward is 0; it must be between 1 and 2147483647"},
    {"max_pool2d_stride_zero", "aten::max_pool2d", {shape({1, 3, 8, 8})},
     [](const std::vector<Node*>& x) {
       return ArgumentList{x[0], ArgumentList{2, 2}, ArgumentList{2, 2}};
     },
     2, Json::array({0, 0}),
     "argument 'stride' of aten::max_pool2d is [0, 0]; each value must be between 1 and "
     "2147483647"},
    {"max_pool2d_kernel_of_three_dimensions", "aten::max_pool2d", {shape({1, 3, 8, 8})},
     [](const std::vector<Node*>& x) { return ArgumentList{x[0], ArgumentList{2, 2}}; }, 1,
     Json::array({2, 2, 2}),
     "argument 'kernel_size' of aten::max_pool2d has 3 values; aten::max_pool2d takes 1 or 2"},
    {"slow_conv2d_without_a_kernel_size", "aten::_slow_conv2d_forward",
     {shape({1, 3, 8, 8}), shape({6, 3, 3, 3})},
     [](const std::vector<Node*>& x) {
       return ArgumentList{x[0], x[1], ArgumentList{3, 3}, Argument(), ArgumentList{1, 1},
                           ArgumentList{0, 0}};
     },
     2, Json::array(),
     "argument 'kernel_size' of aten::_slow_conv2d_forward has 0 values; "
     "aten::_slow_conv2d_forward takes exactly 2"},
    {"embedding_bag_mode_seven", "aten::embedding_bag",
     {shape({10, 3}), shape({2}, c10::kLong), shape({1}, c10::kLong)},
     [](const std::vector<Node*>& x) { return ArgumentList{x[0], x[1], x[2], false, 0}; }, 4, 7,
     "argument 'mode' of aten::embedding_bag is 7; it must be 0 (sum), 1 (mean) or 2 (max)"},
    {"reshape_alias_past_its_input", "aten::_reshape_alias", {shape({2, 3})},
     [](const std::vector<Node*>& x) { return ArgumentList{x[0], ArgumentList{6}, ArgumentList{1}}; },
     1, Json::array({int64_t{1} << 40}),
     "aten::_reshape_alias views %x0 (sizes [2, 3], strides [3, 1]) with sizes [1099511627776] "
     "and strides [1], which reach past its elements"},
    {"mkldnn_convolution_window_shorter_than_its_weight", "aten::mkldnn_convolution",
     {shape({1, 3, 8, 8}), shape({6, 3, 3, 3})},
     [](const std::vector<Node*>& x) {
       return ArgumentList{x[0], x[1], Argument(), ArgumentList{0, 0}, ArgumentList{1, 1},
                           ArgumentList{1, 1}, 1};
     },
     4, Json::array({1}),
     "argument 'stride' of aten::mkldnn_convolution has 1 value; its weight %x1 (sizes [6, 3, 3, "
     "3]) has 2 spatial dimensions"},
    // Found by the structure-aware fuzzer (fuzz/harness.h): each killed the
    // process although every integer was within the factors' range.
    {"native_channel_shuffle_groups_beyond_the_channels", "aten::native_channel_shuffle",
     {shape({1, 4, 2, 2})}, [](const std::vector<Node*>& x) { return ArgumentList{x[0], 2}; }, 1,
     16384,
     "argument 'groups' of aten::native_channel_shuffle is 16384; its kernel needs %x0 (sizes [1, "
     "4, 2, 2]) to have a batch and a positive multiple of it as channels"},
    {"unfold_backward_of_another_unfold", "aten::unfold_backward", {shape({2, 3, 8, 4, 2})},
     [](const std::vector<Node*>& x) { return ArgumentList{x[0], ArgumentList{2, 3, 8, 8}, 3, 2, 2}; },
     4, int64_t{1} << 20,
     "argument 'grad_in' of aten::unfold_backward is %x0 (sizes [2, 3, 8, 4, 2]), which is not the "
     "gradient of unfold(dimension 3, size 2, step 1048576) of sizes [2, 3, 8, 8]; its kernel "
     "writes where that unfold would have read"},
    {"convolution_without_a_stride", "aten::convolution", {shape({2, 3, 8, 8}), shape({6, 3, 3, 3})},
     [](const std::vector<Node*>& x) {
       return ArgumentList{x[0], x[1], Argument(), ArgumentList{1, 1}, ArgumentList{0, 0},
                           ArgumentList{1, 1}, false, ArgumentList{0, 0}, 1};
     },
     3, Json::array(),
     "argument 'stride' of aten::convolution has 0 values; aten::convolution takes at least 1"},
};

INSTANTIATE_TEST_SUITE_P(IssueFortyTwo, HostileArguments, ::testing::ValuesIn(kHostileArguments),
                         [](const ::testing::TestParamInfo<HostileArgument>& info) {
                           return std::string(info.param.what);
                         });

TEST(LoadRejects, TrustingKernelsOnShapesTheyDoNotSurvive) {
  // Found by the structure-aware fuzzer: a batch of 0 (SIGFPE, SIGSEGV), and
  // embedding_bag in mode max without a bag (SIGSEGV).
  GraphModule shuffle = one_call("aten::native_channel_shuffle", {shape({1, 4, 2, 2})},
                                 [](const std::vector<Node*>& x) { return ArgumentList{x[0], 2}; });
  GraphModule rescale = one_call("aten::_transform_bias_rescale_qkv", {shape({1, 3, 12}), shape({12})},
                                 [](const std::vector<Node*>& x) { return ArgumentList{x[0], x[1], 2}; });
  auto empty_batch = [](const GraphModule& gm) {
    return with_json(save_to_string(gm), [](Json& d) {
      d["nodes"][0]["meta"]["val"]["tensors"][0]["sizes"][0] = 0;
    });
  };
  std::string b = empty_batch(shuffle);
  EXPECT_EQ(load_error(b), at_node(b, 1) +
                               "node %call (nodes[1]): argument 'groups' of "
                               "aten::native_channel_shuffle is 2; its kernel needs %x0 (sizes [0, "
                               "4, 2, 2]) to have a batch and a positive multiple of it as channels");
  b = empty_batch(rescale);
  EXPECT_EQ(load_error(b), at_node(b, 2) +
                               "node %call (nodes[2]): arguments 'qkv' and 'qkv_bias' of "
                               "aten::_transform_bias_rescale_qkv are %x0 (sizes [0, 3, 12]) and %x1 "
                               "(sizes [12]); its kernel takes [batch of at least 1, tokens, 3 * "
                               "embedding] and [3 * embedding]");
  GraphModule bag = one_call("aten::embedding_bag",
                             {shape({10, 3}), shape({4}, c10::kLong), shape({1}, c10::kLong)},
                             [](const std::vector<Node*>& x) {
                               return ArgumentList{x[0], x[1], x[2], false, 2};
                             });
  b = with_json(save_to_string(bag), [](Json& d) {
    d["nodes"][2]["meta"]["val"]["tensors"][0]["sizes"][0] = 0;
  });
  EXPECT_EQ(load_error(b), at_node(b, 3) +
                               "node %call (nodes[3]): arguments 'indices' and 'offsets' of "
                               "aten::embedding_bag are %x1 (sizes [4]) and %x2 (sizes [0]); its "
                               "kernel takes 1-D indices and offsets, and in mode 2 (max) at least "
                               "one bag");
}

TEST(Load, NegativePaddingOfAPadIsNoWindow) {
  // reflection_pad2d crops with negative padding; the window rule is for
  // convolutions and pools.
  GraphModule gm = one_call("aten::reflection_pad2d", {shape({1, 2, 5, 5})},
                            [](const std::vector<Node*>& x) {
                              return ArgumentList{x[0], ArgumentList{-1, -1, -1, -1}};
                            });
  GraphModule loaded = round_trip(gm);
  EXPECT_EQ(Interpreter(loaded).run_flat(random_inputs(loaded))[0].sizes(), at::IntArrayRef({1, 2, 3, 3}));
}

// The shapes a file records must be those its kernels compute.
GraphModule recorded_mm() {
  GraphModule gm = one_call("aten::mm", {shape({2, 3}), shape({3, 4})},
                            [](const std::vector<Node*>& x) { return ArgumentList{x[0], x[1]}; });
  gm.graph().find("call")->meta().val = ValueMeta::tensor(shape({2, 4}));
  return gm;
}

TEST(LoadRejects, WriteOfAnotherShapeIntoABuffer) {
  // An exported program: y = x * mean, mean <- mean + x, and the sum of x.
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  x->meta().val = ValueMeta::tensor(shape({3}));
  Node* mean = g.get_attr("stats.mean");
  Node* y = g.call_function("aten::mul.Tensor", {x, mean}, {}, "y");
  Node* updated = g.call_function("aten::add.Tensor", {mean, x}, {}, "updated");
  Node* total = g.call_function("aten::sum", {x}, {}, "total");
  g.output({y, total, updated});
  gm.in_spec = TreeSpec::tuple({TreeSpec::leaf()});
  gm.out_spec = TreeSpec::tuple({TreeSpec::leaf(), TreeSpec::leaf()});
  gm.output_specs = {OutputSpec{OutputKind::User, ""}, OutputSpec{OutputKind::User, ""},
                     OutputSpec{OutputKind::BufferMutation, "stats.mean"}};
  gm.set_attribute("stats.mean", at::arange(3, at::kFloat), AttributeKind::Buffer);
  const std::string good = save_to_string(gm);
  ASSERT_EQ(load_error(good), "");
  // The write takes the sum: the interpreter's copy into the buffer failed
  // with LibTorch's own message (found by the structure-aware fuzzer).
  std::string b = with_json(good, [](Json& d) {
    std::swap(d["nodes"][5]["args"][0][1], d["nodes"][5]["args"][0][2]);
  });
  EXPECT_EQ(load_error(b), at_node(b, 5) +
                               "node %output (nodes[5]): output 2 writes %total (f32[] on the "
                               "recorded shapes) into buffer 'stats.mean' (f32[3])");
}

TEST(Load, ANodeThatRecordsNothingIsNotHeldToItsKernel) {
  // every_argument_module's clone to channels_last of a 2-D tensor fails when
  // run; the file records nothing for it, so it does not contradict itself.
  std::string b = with_json(save_to_string(recorded_mm()), [](Json& d) {
    d["nodes"][1]["meta"]["val"]["tensors"][0]["sizes"] = Json::array({5, 4});
    d["nodes"][2].erase("meta");
  });
  EXPECT_EQ(load_error(b), "");
}

// Weightless tensors (version 1.3) ----------------------------------------------

at::Tensor meta_tensor(std::vector<int64_t> sizes, std::vector<int64_t> strides,
                       c10::ScalarType dtype = at::kFloat) {
  return at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype).device(at::kMeta));
}

// The message load_from_buffer gives with `options`, or "" if it loads.
std::string load_error(const std::string& bytes, const LoadOptions& options) {
  try {
    load_from_buffer(bytes.data(), bytes.size(), "f.tcg", options);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Weightless, FilesWithoutThemAreWrittenAsVersion12) {
  EXPECT_EQ(TcgFile::get(valid(), 10, 2), 2u);
  EXPECT_EQ(TcgFile::get(save_to_string(testing::attribute_zoo_module()), 10, 2), 2u);
}

TEST(Weightless, MetaTensorsAreSavedWithoutBytes) {
  std::string b = save_to_string(testing::weightless_module());
  EXPECT_EQ(TcgFile::get(b, 10, 2), 3u);
  TcgFile f = TcgFile::parse(b);
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(f.json);
  EXPECT_EQ(doc["tensors"][0].dump(),
            R"({"name":"w","dtype":"float32","sizes":[2,3],"strides":[3,1],"weightless":true})");
  EXPECT_TRUE(doc["tensors"][1].contains("offset"));  // b: stored
  EXPECT_EQ(f.data.size(), 12u);                     // b's 12 bytes, nothing for w
}

TEST(Weightless, LoadWithoutWeightsGivesMetaTensors) {
  GraphModule gm = round_trip(testing::weightless_module());
  const at::Tensor& w = gm.attribute("w").value;
  EXPECT_TRUE(w.is_meta());
  EXPECT_EQ(w.scalar_type(), at::kFloat);
  EXPECT_EQ(w.sizes(), c10::IntArrayRef({2, 3}));
  EXPECT_EQ(w.strides(), c10::IntArrayRef({3, 1}));
  ASSERT_TRUE(gm.has_unbound_weights());
  ASSERT_EQ(gm.unbound_attributes().size(), 1u);
  EXPECT_EQ(gm.unbound_attributes()[0]->name, "w");
  EXPECT_FALSE(gm.attribute("b").value.is_meta());
  // Shown, printed and saved again as it was.
  EXPECT_EQ(save_to_string(gm), save_to_string(testing::weightless_module()));
}

TEST(Weightless, LoadWithWeightsRunsLikeTheStoredModule) {
  GraphModule full = testing::weightless_module_bound();
  std::string b = save_to_string(testing::weightless_module());
  LoadOptions options;
  options.weights = {{"w", full.attribute("w").value}};
  GraphModule gm = load_from_buffer(b.data(), b.size(), "f.tcg", options);
  EXPECT_FALSE(gm.has_unbound_weights());
  EXPECT_EQ(gm.attribute("w").value.data_ptr(), full.attribute("w").value.data_ptr());  // not copied
  at::Tensor x = at::randn({2, 3});
  EXPECT_TRUE(at::equal(Interpreter(gm).run_flat({x})[0], Interpreter(full).run_flat({x})[0]));
}

TEST(Weightless, StridesAndTiesAreKept) {
  GraphModule gm = testing::weightless_module();
  // w is the transpose of a contiguous [3, 2] tensor, tied under a second name.
  at::Tensor w = meta_tensor({2, 3}, {1, 2});
  gm.set_attribute("w", w, AttributeKind::Parameter);
  gm.set_attribute("w2", w, AttributeKind::Parameter);
  std::string b = save_to_string(gm);
  Json doc = Json::parse(TcgFile::parse(b).json);
  EXPECT_EQ(doc["tensors"].size(), 2u);  // w, b
  GraphModule loaded = load_from_buffer(b.data(), b.size());
  EXPECT_EQ(loaded.attribute("w").value.strides(), c10::IntArrayRef({1, 2}));
  EXPECT_EQ(loaded.attribute("w").value.unsafeGetTensorImpl(),
            loaded.attribute("w2").value.unsafeGetTensorImpl());
  // Bound by its second name; a contiguous weight is copied into the
  // recorded strides, and both names get it.
  at::Tensor given = at::arange(6, at::kFloat).reshape({2, 3});
  LoadOptions options;
  options.weights = {{"w2", given}};
  GraphModule bound = load_from_buffer(b.data(), b.size(), "f.tcg", options);
  const at::Tensor& v = bound.attribute("w").value;
  EXPECT_EQ(v.strides(), c10::IntArrayRef({1, 2}));
  EXPECT_TRUE(at::equal(v, given));
  EXPECT_EQ(v.unsafeGetTensorImpl(), bound.attribute("w2").value.unsafeGetTensorImpl());
}

TEST(Weightless, WeightErrorsNameEveryProblem) {
  std::string b = save_to_string(testing::weightless_module());
  auto with = [](NamedTensors w, bool strict = true) {
    LoadOptions o;
    o.weights = std::move(w);
    o.strict_weights = strict;
    return o;
  };
  EXPECT_EQ(load_error(b, with({{"b", at::ones({3})}})),
            "f.tcg: the weights do not fit the module's attributes:\n"
            "  missing: parameter 'w' (f32[2, 3])");
  EXPECT_EQ(load_error(b, with({{"w", at::zeros({3, 2})}})),
            "f.tcg: the weights do not fit the module's attributes:\n"
            "  weight 'w' (parameter): expected f32[2, 3], got f32[3, 2]");
  EXPECT_EQ(load_error(b, with({{"w", at::zeros({2, 3}, at::kDouble)}})),
            "f.tcg: the weights do not fit the module's attributes:\n"
            "  weight 'w' (parameter): expected f32[2, 3], got f64[2, 3]");
  EXPECT_EQ(load_error(b, with({{"w", meta_tensor({2, 3}, {3, 1})}})),
            "f.tcg: the weights do not fit the module's attributes:\n"
            "  weight 'w' (parameter): the tensor is on the meta device: it has no values to "
            "bind");
  EXPECT_EQ(load_error(b, with({{"w", at::zeros({2, 3})}, {"fc.bias", at::zeros({3})}})),
            "f.tcg: the weights do not fit the module's attributes:\n"
            "  extra: weight 'fc.bias' is not an attribute of the module "
            "(LoadOptions::strict_weights = false ignores such weights)");
  EXPECT_EQ(load_error(b, with({{"w", at::zeros({2, 3})}, {"fc.bias", at::zeros({3})}}, false)),
            "");
  // All at once, in one message.
  std::string all = load_error(b, with({{"b", at::ones({2})}, {"extra", at::ones({1})}}));
  EXPECT_NE(all.find("missing: parameter 'w'"), std::string::npos) << all;
  EXPECT_NE(all.find("weight 'b' (buffer): expected f32[3], got f32[2]"), std::string::npos) << all;
  EXPECT_NE(all.find("extra: weight 'extra'"), std::string::npos) << all;
  // A WeightError, not a FormatError: the file is fine.
  LoadOptions missing = with({{"b", at::ones({3})}});
  EXPECT_THROW(load_from_buffer(b.data(), b.size(), "f.tcg", missing), WeightError);
}

TEST(Weightless, WeightsReplaceStoredAttributes) {
  std::string b = valid();
  LoadOptions o;
  at::Tensor w = at::full({2, 3}, 7.0);
  o.weights = {{"w", w}};
  GraphModule gm = load_from_buffer(b.data(), b.size(), "f.tcg", o);
  EXPECT_EQ(gm.attribute("w").value.data_ptr(), w.data_ptr());
}

TEST(Weightless, RunningUnboundWeightsIsRefused) {
  GraphModule gm = round_trip(testing::weightless_module());
  Interpreter interp(gm);  // building the plan is fine
  try {
    interp.run_flat({at::randn({2, 3})});
    FAIL() << "ran with unbound weights";
  } catch (const WeightError& e) {
    EXPECT_EQ(std::string(e.what()),
              "the module's weights are not bound: 1 attribute(s) hold no values (the module was "
              "traced on the meta device or loaded from a weightless file): parameter 'w' "
              "(f32[2, 3]). Bind them first: torchcap::load(path, {.weights = ...}) or "
              "GraphModule::bind_weights");
  }
  // On meta inputs the run only computes shapes, which meta weights serve
  // (when every attribute is one: LibTorch mixes no meta and CPU tensors).
  gm.set_attribute("b", meta_tensor({3}, {1}), AttributeKind::Buffer);
  at::Tensor out = Interpreter(gm).run_flat({meta_tensor({2, 3}, {3, 1})})[0];
  EXPECT_TRUE(out.is_meta());
  EXPECT_EQ(out.sizes(), c10::IntArrayRef({2, 2}));
}

// Note [Writing the nodes as text] in writer.cpp: the nodes, written straight
// as text, are byte for byte what nlohmann::json would dump, also for strings
// that need escapes or are beyond ASCII, and for floats of every kind.
// The names in `dir`, sorted.
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Note [Temporary files and interrupts]: a process interrupted while it
// writes a file leaves neither the file nor its temporary one, and still
// dies of the signal; one that finishes leaves the file alone.
TEST(Save, AnInterruptedWriteLeavesNoTemporaryFile) {
  for (int sig : {SIGINT, SIGTERM}) {
    TempDir dir;
    const std::string path = dir.path() + "/out.bin";
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      detail::remove_temporary_files_on_signals();
      detail::write_atomically(path, [sig](int fd, const std::string&) {
        if (::write(fd, "half", 4) != 4) ::_exit(3);
        std::raise(sig);  // interrupted halfway
        ::_exit(4);       // not reached: the signal ends the process
      }, [](const std::string&) { ::_exit(5); });
      ::_exit(6);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status);
    EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{}) << sig;
  }
  TempDir dir;
  const std::string path = dir.path() + "/out.bin";
  detail::write_bytes_atomically(path, "whole", 5, [](const std::string& what) { throw Error(what); });
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"out.bin"});
  EXPECT_EQ(fs::file_size(path), 5u);
  // An error while writing removes the temporary file, and the target is untouched.
  EXPECT_THROW(detail::write_atomically(path, [](int, const std::string&) { throw Error("no"); },
                                        [](const std::string& what) { throw Error(what); }),
               Error);
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"out.bin"});
  EXPECT_EQ(fs::file_size(path), 5u);
}

TEST(Save, NodesAreTheTextNlohmannJsonWouldDump) {
  GraphModule gm;
  Graph& g = gm.graph();
  Node* x = g.placeholder("x");
  x->meta().val = ValueMeta::tensor(TensorMeta{c10::kFloat, {2, 3}, {3, 1}, c10::Device(c10::kCPU), nullptr});
  Node* prev = x;
  for (double d : {0.1, 1e300, -0.0, 2.0, 5e-324, std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity(), std::nan("")}) {
    prev = g.call_function("aten::add.Scalar", {prev, d});
    prev->meta().stack_trace = StackTrace::from_frames(
        {SourceFrame{"dir/\"quoted\"\\file\t\xc3\xa9.py", 7, "f\x01n", "y = x\x7f + \"\xe2\x82\xac\""}});
  }
  Node* div = g.call_function("aten::div.Tensor_mode", {prev, x},
                              {{"rounding_mode", std::string("tr\"u\\n\nc\xc3\xa9")}});
  g.output({div});
  gm.set_flat_specs();
  TcgFile f = TcgFile::parse(save_to_string(gm));
  const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(f.json);
  EXPECT_EQ(doc.dump(), f.json);
  EXPECT_NE(f.json.find(R"({"float":"-inf"})"), std::string::npos);
  EXPECT_NE(f.json.find(R"("tr\"u\\n\nc)"), std::string::npos);
}


// Note [One table of rejected files]: each row makes a damaged file from a
// valid one and gives the loader's whole message for it; cases that need more
// than that (a missing file, a FIFO, a file that loads) are tests of their own.
struct Rejected {
  std::string bytes;
  std::string message;
};

struct RejectCase {
  const char* name;
  Rejected (*make)();
};

const RejectCase kRejectCases[] = {
    {"WrongMagic",
     [] {
       std::string b = valid();
       b[1] = 'X';
       return Rejected{b,
                       "f.tcg: byte 0: not a torchcap graph file (the first 8 bytes are not the .tcg magic)"};
     }},
    {"TruncatedHeader",
     [] {
       return Rejected{valid().substr(0, 20),
                       "f.tcg: byte 20: the file ends after 20 bytes, inside the 64-byte header"};
     }},
    {"TruncatedHeaderOfVersion11",
     [] {
       return Rejected{valid().substr(0, 70),
                       "f.tcg: byte 70: the file ends after 70 bytes, inside the 72-byte header of version 1.2"};
     }},
    {"NewerMajorVersion",
     [] {
       std::string b = valid();
       TcgFile::put_header(b, 8, 2, 2);
       return Rejected{b,
                       "f.tcg: byte 8: format version 2.2 is not supported; this torchcap reads version 1.x"};
     }},
    {"HeaderSizeOutOfRange",
     [] {
       std::string b = valid();
       TcgFile::put_header(b, 12, 32, 4);
       return Rejected{b,
                       "f.tcg: byte 12: header size 32 is not 72, the header size of version 1.2"};
     }},
    {"TruncatedFile",
     [] {
       std::string b = valid();
       std::string cut = b.substr(0, b.size() - 3);
       return Rejected{cut,
                       "f.tcg: byte 16: the header gives the file size as " +
                                 std::to_string(b.size()) + " bytes but the file has " +
                                 std::to_string(cut.size()) + " (truncated)"};
     }},
    {"TrailingBytes",
     [] {
       std::string b = valid();
       return Rejected{b + "xx",
                       "f.tcg: byte 16: the header gives the file size as " +
                                      std::to_string(b.size()) + " bytes but the file has " +
                                      std::to_string(b.size() + 2) + " (trailing bytes)"};
     }},
    {"WrongAlignment",
     [] {
       std::string b = valid();
       TcgFile::put_header(b, 56, 16, 4);
       return Rejected{b,
                       "f.tcg: byte 56: alignment 16 is not 64"};
     }},
    {"UnknownFlags",
     [] {
       std::string b = valid();
       TcgFile::put_header(b, 60, 4, 4);
       return Rejected{b,
                       "f.tcg: byte 60: unknown flags 0x4 for version 1.2"};
     }},
    {"JsonOffsetInsideTheHeader",
     [] {
       std::string b = valid();
       TcgFile::put_header(b, 24, 8, 8);
       return Rejected{b,
                       "f.tcg: byte 24: the JSON section's offset 8 is not between the end of the header "
            "and the end of the file"};
     }},
    {"JsonSizePastTheEnd",
     [] {
       std::string b = valid();
       TcgFile::put_header(b, 32, uint64_t{1} << 62, 8);
       return Rejected{b,
                       "f.tcg: byte 32: the JSON section [72, +4611686018427387904) extends "
                           "past the end of the file at " +
                               std::to_string(b.size())};
     }},
    {"UnalignedDataSection",
     [] {
       std::string b = valid();
       TcgFile f = TcgFile::parse(b);
       TcgFile::put_header(b, 40, f.data_offset + 8, 8);
       return Rejected{b,
                       "f.tcg: byte 40: the data section's offset " +
                               std::to_string(f.data_offset + 8) +
                               " is not a multiple of 64 between the end of the JSON section at " +
                               std::to_string(kJson + f.json.size()) + " and the end of the file"};
     }},
    {"DataSizePastTheEnd",
     [] {
       std::string b = valid();
       TcgFile f = TcgFile::parse(b);
       TcgFile::put_header(b, 48, f.data.size() + 64, 8);
       return Rejected{b,
                       "f.tcg: byte 48: the data section [" + std::to_string(f.data_offset) +
                               ", +" + std::to_string(f.data.size() + 64) +
                               ") extends past the end of the file at " +
                               std::to_string(b.size())};
     }},
    {"JsonNestedTooDeep",
     [] {
       TcgFile f = TcgFile::parse(valid());
       f.json = "{\"nodes\": " + std::string(70, '[') + std::string(70, ']') + "}";
       return Rejected{f.bytes(),
                       "f.tcg: byte 145: the JSON nests deeper than 64 levels"};
     }},
    {"JsonNotAnObject",
     [] {
       TcgFile f = TcgFile::parse(valid());
       f.json = "[1, 2]";
       return Rejected{f.bytes(),
                       "f.tcg: byte 72: the JSON section must hold an object, not an array"};
     }},
    {"MissingSection",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d.erase("nodes"); });
       return Rejected{b,
                       "f.tcg: byte 72: the JSON section has no 'nodes'"};
     }},
    {"UnknownTopLevelKey",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["extra"] = 1; });
       return Rejected{b,
                       "f.tcg: byte 72: unknown key 'extra'"};
     }},
    {"SignatureThatIsNotAnObject",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["signature"] = 3; });
       uint64_t at = TcgFile::parse(b).json.find("\"signature\"") + kJson + 12;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(at) + ": 'signature': expected an object, got an integer"};
     }},
    {"SignatureWithAnUnknownKey",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["signature"] = {{"inputs", Json::array()}}; });
       uint64_t at = TcgFile::parse(b).json.find("\"signature\"") + kJson + 12;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(at) + ": 'signature': unknown key 'inputs'"};
     }},
    {"UnknownOutputKind",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["signature"] = {{"outputs", {{{"kind", "gradient"}, {"target", ""}}}}};
       });
       uint64_t at = TcgFile::parse(b).json.find("\"signature\"") + kJson + 12;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(at) +
                               ": 'signature': outputs[0].kind: unknown output kind 'gradient'"};
     }},
    {"MutationOfAnAttributeThatIsNoBuffer",
     [] {
       // Two outputs: the user's, and a write to a buffer the module does not have.
       std::string b = with_json(valid(), [](Json& d) {
         d["nodes"][7]["args"][0].push_back({{"node", "where"}});
         d["signature"] = {{"outputs",
                            {{{"kind", "user"}, {"target", ""}},
                             {{"kind", "buffer_mutation"}, {"target", "running_mean"}}}}};
       });
       uint64_t nodes = TcgFile::parse(b).json.find("\"nodes\"") + kJson + 8;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(nodes) +
                               ": lint: output 1 (buffer mutation of 'running_mean') names no "
                               "parameter or buffer"};
     }},
    {"UnknownDtype",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][0]["dtype"] = "float31"; });
       return Rejected{b,
                       at_tensor(b, 0) + "tensor 'w' (tensors[0]): dtype: unknown dtype 'float31'"};
     }},
    {"QuantizedDtypeInTheTable",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][0]["dtype"] = "qint8"; });
       return Rejected{b,
                       at_tensor(b, 0) +
                               "tensor 'w' (tensors[0]): dtype: tensors of dtype qint8 cannot be "
                               "stored in the data section"};
     }},
    {"LengthInconsistentWithShape",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][0]["sizes"] = {2, 4}; });
       return Rejected{b,
                       at_tensor(b, 0) +
                               "tensor 'w' (tensors[0]): length: byte length 24 does not match "
                               "dtype float32, sizes [2, 4] and strides [3, 1], which span 28 bytes"};
     }},
    {"LengthInconsistentWithStrides",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][0]["strides"] = {1, 1}; });
       return Rejected{b,
                       at_tensor(b, 0) +
                               "tensor 'w' (tensors[0]): length: byte length 24 does not match "
                               "dtype float32, sizes [2, 3] and strides [1, 1], which span 16 bytes"};
     }},
    {"StridesForTheWrongNumberOfDimensions",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][0]["strides"] = {1}; });
       return Rejected{b,
                       at_tensor(b, 0) + "tensor 'w' (tensors[0]): strides: 1 strides for 2 dimensions"};
     }},
    {"NegativeSize",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][0]["sizes"] = {-2, 3}; });
       return Rejected{b,
                       at_tensor(b, 0) +
                               "tensor 'w' (tensors[0]): sizes[0]: expected a non-negative "
                               "integer, got -2"};
     }},
    {"SizesThatOverflow",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["tensors"][0]["sizes"] = {int64_t{1} << 40, int64_t{1} << 40};
         d["tensors"][0]["strides"] = {int64_t{1} << 40, 1};
       });
       return Rejected{b,
                       at_tensor(b, 0) +
                "tensor 'w' (tensors[0]): sizes [1099511627776, 1099511627776] with strides "
                "[1099511627776, 1] span more bytes than 64 bits can count"};
     }},
    {"TooManyDimensions",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["tensors"][0]["sizes"] = std::vector<int64_t>(65, 1);
       });
       return Rejected{b,
                       at_tensor(b, 0) +
                               "tensor 'w' (tensors[0]): sizes: 65 dimensions; the format allows "
                               "at most 64"};
     }},
    {"UnalignedTensorOffset",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][1]["offset"] = 8; });
       return Rejected{b,
                       at_tensor(b, 1) +
                               "tensor 'mask' (tensors[1]): offset: offset 8 is not a multiple of 64"};
     }},
    {"TensorPastTheDataSection",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][1]["offset"] = 640; });
       TcgFile f = TcgFile::parse(b);
       return Rejected{b,
                       at_tensor(b, 1) +
                               "tensor 'mask' (tensors[1]): bytes [640, 643) of the data section "
                               "extend past its end at " +
                               std::to_string(f.data.size())};
     }},
    {"OverlappingTensors",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][1]["offset"] = 0; });
       return Rejected{b,
                       at_tensor(b, 1) +
                               "tensor 'mask' (tensors[1]): its bytes overlap those of tensor 'w'"};
     }},
    {"DuplicateTensorName",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][1]["name"] = "w"; });
       return Rejected{b,
                       at_tensor(b, 1) + "tensor 'w' (tensors[1]): name: a second tensor has this name"};
     }},
    {"BoolThatIsNeitherZeroNorOne",
     [] {
       TcgFile f = TcgFile::parse(valid());
       f.data[Json::parse(f.json)["tensors"][1]["offset"].get<uint64_t>() + 2] = 7;
       std::string b = f.bytes();  // with the checksum of the bytes as they are now
       f = TcgFile::parse(b);
       uint64_t at = f.data_offset + Json::parse(f.json)["tensors"][1]["offset"].get<uint64_t>() + 2;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(at) +
                               ": tensor 'mask' (tensors[1]): bool byte 7 is neither 0 nor 1"};
     }},
    {"DamagedHeader",
     [] {
       std::string b = valid();
       uint32_t recorded = static_cast<uint32_t>(TcgFile::get(b, 68, 4));
       b[60] ^= 0x01;  // the flags: caught by the checksum before the flags check
       char computed[9];
       std::snprintf(computed, sizeof computed, "%08x",
                     TcgFile::crc(b.substr(0, 68)));  // the header is 72 bytes: no more to cover
       char expected[9];
       std::snprintf(expected, sizeof expected, "%08x", recorded);
       return Rejected{b,
                       std::string("f.tcg: byte 68: the header is damaged: its CRC-32 is 0x") +
                               computed + ", the header records 0x" + expected};
     }},
    {"MissingTensorChecksum",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][0].erase("crc32"); });
       return Rejected{b,
                       at_tensor(b, 0) + "tensor 'w' (tensors[0]): missing 'crc32'"};
     }},
    {"TensorChecksumBeyond32Bits",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][0]["crc32"] = uint64_t{1} << 32; });
       return Rejected{b,
                       at_tensor(b, 0) +
                               "tensor 'w' (tensors[0]): crc32: CRC-32 4294967296 does not fit "
                               "in 32 bits"};
     }},
    {"MissingTensorField",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["tensors"][0].erase("strides"); });
       return Rejected{b,
                       at_tensor(b, 0) + "tensor 'w' (tensors[0]): missing 'strides'"};
     }},
    {"AttributeTensorIndexOutOfRange",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["attributes"][0]["tensor"] = 9; });
       return Rejected{b,
                       at_attribute(b, 0) +
                               "attribute 'w' (attributes[0]): tensor: tensor index 9 is not in "
                               "the tensor table of 2"};
     }},
    {"DuplicateAttributeName",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["attributes"][1]["name"] = "w"; });
       return Rejected{b,
                       at_attribute(b, 1) +
                               "attribute 'w' (attributes[1]): name: a second attribute has this "
                               "name"};
     }},
    {"UnknownAttributeKind",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["attributes"][0]["kind"] = "weight"; });
       return Rejected{b,
                       at_attribute(b, 0) +
                               "attribute 'w' (attributes[0]): kind: unknown attribute kind "
                               "'weight'"};
     }},
    {"AttributeNameWithAnEmptyPart",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["attributes"][0]["name"] = "a..b"; });
       return Rejected{b,
                       at_attribute(b, 0) +
                               "attribute 'a..b' (attributes[0]): name: the name is not a dotted "
                               "path of non-empty parts"};
     }},
    {"GetAttrOfAMissingAttribute",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["attributes"].erase(1); });
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(TcgFile::parse(b).json.find("\"nodes\"") + kJson + 8) +
                ": lint: get_attr %mask reads attribute 'mask', which the GraphModule does not "
                "have"};
     }},
    {"UnknownOperator",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][3]["target"] = "aten::frobnicate"; });
       return Rejected{b,
                       at_node(b, 3) +
                               "node %add (nodes[3]): call_function: no operator "
                               "aten::frobnicate is registered"};
     }},
    {"UnknownOverload",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][3]["target"] = "aten::add.Nope"; });
       return Rejected{b,
                       at_node(b, 3) +
                               "node %add (nodes[3]): call_function: no operator aten::add.Nope "
                               "is registered"};
     }},
    {"TargetThatIsNotAQualifiedName",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][3]["target"] = "addmm"; });
       return Rejected{b,
                       at_node(b, 3) +
                               "node %add (nodes[3]): 'addmm' is not a qualified operator name; "
                               "expected namespace::name[.overload], e.g. aten::add.Tensor"};
     }},
    {"SizeComputationInAnOlderVersion",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][3]["target"] = "add"; });
       return Rejected{b, at_node(b, 3) + "node %add (nodes[3]): target: size computations ('add') "
                                          "came in version 1.4; this file is version 1.2"};
     }},
    {"ArgumentsThatDoNotFitTheSchema",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][3]["args"][1] = "two"; });
       return Rejected{b,
                       at_node(b, 3) +
                               "node %add (nodes[3]): argument 'other' of aten::add.Tensor "
                               "expects Tensor, got str"};
     }},
    {"UnknownKeywordArgument",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["nodes"][3]["kwargs"] = Json::array({Json::array({"beta", 2})});
       });
       return Rejected{b,
                       at_node(b, 3) + "node %add (nodes[3]): aten::add.Tensor has no argument named 'beta'"};
     }},
    {"DuplicateNodeName",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][3]["name"] = "w"; });
       return Rejected{b,
                       at_node(b, 3) + "node %w (nodes[3]): name: duplicate or invalid node name 'w'"};
     }},
    {"InvalidNodeName",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][3]["name"] = "not valid"; });
       return Rejected{b,
                       at_node(b, 3) +
                               "node %not valid (nodes[3]): name: duplicate or invalid node name "
                               "'not valid'"};
     }},
    {"ReservedNodeName",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][3]["name"] = "self"; });
       return Rejected{b,
                       at_node(b, 3) + "node %self (nodes[3]): name: duplicate or invalid node name 'self'"};
     }},
    {"ReferenceToALaterNode",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][3]["args"][0] = {{"node", "where"}}; });
       return Rejected{b,
                       at_node(b, 3) +
                               "node %add (nodes[3]): args[0].node: %where is not a node defined "
                               "before this one"};
     }},
    {"UnknownOpcode",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][3]["op"] = "call_module"; });
       return Rejected{b,
                       at_node(b, 3) + "node %add (nodes[3]): op: unknown opcode 'call_module'"};
     }},
    {"NodeAfterTheOutput",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         Json extra = d["nodes"][3];
         extra["name"] = "late";
         d["nodes"].push_back(extra);
       });
       return Rejected{b,
                       at_node(b, 8) + "node %late (nodes[8]): the node comes after the output node"};
     }},
    {"NoOutput",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"].erase(7); });
       uint64_t nodes = TcgFile::parse(b).json.find("\"nodes\"") + kJson + 8;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(nodes) + ": 'nodes': the graph has no output node"};
     }},
    {"PlaceholderAfterAnotherNode",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         Json ph = d["nodes"][0];
         d["nodes"].erase(0);
         d["nodes"].insert(d["nodes"].begin() + 2, ph);
       });
       uint64_t nodes = TcgFile::parse(b).json.find("\"nodes\"") + kJson + 8;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(nodes) +
                               ": lint: placeholder %x comes after non-placeholder nodes"};
     }},
    {"GetItemWithBadArguments",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][5]["args"][1] = "zero"; });
       return Rejected{b,
                       at_node(b, 5) + "node %getitem (nodes[5]): args: getitem takes (node, index)"};
     }},
    {"GetItemOutOfRange",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][5]["args"][1] = 2; });
       return Rejected{b,
                       at_node(b, 5) +
                               "node %getitem (nodes[5]): getitem index 2 is out of range for "
                               "%topk, which has 2 values"};
     }},
    {"UnknownArgumentKind",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][4]["args"][1] = {{"complex", "1j"}}; });
       return Rejected{b,
                       at_node(b, 4) + "node %topk (nodes[4]): args[1]: unknown argument kind 'complex'"};
     }},
    {"TypedArgumentWithTwoKeys",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["nodes"][4]["args"][1] = {{"float", "inf"}, {"node", "x"}};
       });
       return Rejected{b,
                       at_node(b, 4) +
                               "node %topk (nodes[4]): args[1]: a typed argument is an object "
                               "with exactly one key"};
     }},
    {"FloatStringThatIsNotNonFinite",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][3]["kwargs"][0][1] = {{"float", "1.5"}}; });
       return Rejected{b,
                       at_node(b, 3) +
                               "node %add (nodes[3]): kwargs[0][1].float: '1.5' is not inf, -inf, "
                               "nan or the 0x bits of a NaN"};
     }},
    {"FiniteBitsWrittenAsString",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["nodes"][3]["kwargs"][0][1] = {{"float", "0x3ff0000000000000"}};
       });
       return Rejected{b,
                       at_node(b, 3) +
                               "node %add (nodes[3]): kwargs[0][1].float: '0x3ff0000000000000' is "
                               "not inf, -inf, nan or the 0x bits of a NaN"};
     }},
    {"BadDevice",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["nodes"][0]["meta"]["val"]["tensors"][0]["device"] = "gpu:x";
       });
       return Rejected{b,
                       at_node(b, 0) +
                               "node %x (nodes[0]): meta.val.tensors[0].device: 'gpu:x' is not "
                               "a device"};
     }},
    {"ValueMetaWithTheWrongTensorCount",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["nodes"][0]["meta"]["val"]["tensors"] = Json::array(); });
       return Rejected{b,
                       at_node(b, 0) +
                               "node %x (nodes[0]): meta.val.tensors: a value of kind 'tensor' "
                               "has 1 tensor(s), not 0"};
     }},
    {"StackFrameWithANegativeLine",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["nodes"][3]["meta"]["stack_trace"] =
             Json::array({{{"file", "a.cpp"}, {"line", -1}, {"function", "f"}}});
       });
       return Rejected{b,
                       at_node(b, 3) +
                               "node %add (nodes[3]): meta.stack_trace[0].line: expected a "
                               "non-negative integer, got -1"};
     }},
    {"StackFrameLineBeyondInt",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["nodes"][3]["meta"]["stack_trace"] =
             Json::array({{{"file", "a.cpp"}, {"line", int64_t{1} << 31}, {"function", "f"}}});
       });
       return Rejected{b,
                       at_node(b, 3) +
                               "node %add (nodes[3]): meta.stack_trace[0].line: line number too "
                               "large"};
     }},
    {"OutputReturningANonTensor",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["nodes"][7]["args"][0][0] = {{"node", "topk"}};
       });
       uint64_t nodes = TcgFile::parse(b).json.find("\"nodes\"") + kJson + 8;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(nodes) +
                               ": lint: output %output returns node %topk; results must be "
                               "Tensor nodes or none"};
     }},
    {"UnknownSpecKind",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["in_spec"]["children"][0]["kind"] = "set"; });
       uint64_t at = TcgFile::parse(b).json.find("\"in_spec\"") + kJson + 10;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(at) + ": 'in_spec': children[0].kind: unknown spec kind 'set'"};
     }},
    {"DictSpecWithMixedKeys",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["out_spec"] = {{"kind", "dict"},
                          {"keys", {"a", 1}},
                          {"children", {{{"kind", "leaf"}}, {{"kind", "none"}}}}};
       });
       uint64_t at = TcgFile::parse(b).json.find("\"out_spec\"") + kJson + 11;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(at) +
                               ": 'out_spec': keys[1]: dict keys are all strings or all integers"};
     }},
    {"DictSpecWithADuplicateKey",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["out_spec"] = {{"kind", "dict"},
                          {"keys", {"a", "a"}},
                          {"children", {{{"kind", "leaf"}}, {{"kind", "none"}}}}};
       });
       uint64_t at = TcgFile::parse(b).json.find("\"out_spec\"") + kJson + 11;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(at) + ": 'out_spec': keys[1]: the key appears twice"};
     }},
    {"SpecThatDoesNotMatchThePlaceholders",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["in_spec"] = {{"kind", "tuple"}, {"children", Json::array()}};
       });
       uint64_t nodes = TcgFile::parse(b).json.find("\"nodes\"") + kJson + 8;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(nodes) +
                               ": lint: the graph has 1 placeholders but the input spec () has 0 "
                               "tensors"};
     }},
    // nlohmann::json stops at a NUL byte as if the text ended there: a JSON size
    // damaged to reach over the padding into the data loaded, the rest ignored.
    // Found by running the Python loader over the fuzzer's corpus and comparing.
    {"FuzzNulByteInTheJson",
     [] {
       TcgFile f = TcgFile::parse(valid());
       const size_t end = f.json.size();
       f.json += std::string(3, '\0') + "\x80?garbage";
       return Rejected{f.bytes(),
                       "f.tcg: byte " + std::to_string(kJson + end) + ": the JSON section contains a NUL byte"};
     }},
    {"ModuleStackOutOfRange",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["module_stacks"] = {{{{"path", "a"}, {"type", "A"}}}};
         d["nodes"][3]["meta"] = {{"module_stack", 1}};
       });
       return Rejected{b,
                       at_node(b, 3) +
                               "node %add (nodes[3]): meta.module_stack: module stack 1 is not in "
                               "the module stack table of 1"};
     }},
    {"ModuleFrameWithoutAType",
     [] {
       std::string b = with_json(valid(), [](Json& d) {
         d["module_stacks"] = {{{{"path", "a"}, {"type", "A"}}, {{"path", "a.b"}}}};
       });
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(element_byte(b, "module_stacks", 0)) +
                               ": module_stacks[0]: [1]: missing 'type'"};
     }},
    {"TrustingKernelWhoseInputHasNoRecordedShape",
     [] {
       GraphModule gm = one_call("aten::_reshape_alias", {shape({2, 3})}, [](const std::vector<Node*>& x) {
         return ArgumentList{x[0], ArgumentList{3, 2}, ArgumentList{2, 1}};
       });
       std::string b = with_json(save_to_string(gm), [](Json& d) { d["nodes"][0].erase("meta"); });
       return Rejected{b,
                       at_node(b, 1) +
                               "node %call (nodes[1]): argument 'self' of aten::_reshape_alias is "
                               "%x0, whose shape the file does not record; the loader checks this "
                               "operator's arguments against it, as its kernel does not"};
     }},
    {"InputShapesAKernelRefuses",
     [] {
       std::string b = with_json(save_to_string(recorded_mm()), [](Json& d) {
         d["nodes"][1]["meta"]["val"]["tensors"][0]["sizes"] = Json::array({5, 4});
       });
       return Rejected{b,
                       at_node(b, 2) +
                               "node %call (nodes[2]): aten::mm fails on the recorded shapes: "
                               "mat1 and mat2 shapes cannot be multiplied (2x3 and 5x4)"};
     }},
    {"RecordedShapeThatIsNotTheKernels",
     [] {
       std::string b = with_json(save_to_string(recorded_mm()), [](Json& d) {
         d["nodes"][2]["meta"]["val"]["tensors"][0]["sizes"] = Json::array({2, 5});
       });
       return Rejected{b,
                       at_node(b, 2) +
                               "node %call (nodes[2]): aten::mm gives f32[2, 4] on the recorded "
                               "shapes, but the file records f32[2, 5]"};
     }},
    {"RecordedDtypeThatIsNotTheKernels",
     [] {
       std::string b = with_json(save_to_string(recorded_mm()), [](Json& d) {
         d["nodes"][2]["meta"]["val"]["tensors"][0]["dtype"] = "float64";
       });
       return Rejected{b,
                       at_node(b, 2) +
                               "node %call (nodes[2]): aten::mm gives f32[2, 4] on the recorded "
                               "shapes, but the file records f64[2, 4]"};
     }},
    {"WeightlessThatIsNotTrue",
     [] {
       std::string b = save_to_string(testing::weightless_module());
       std::string f = with_json(b, [](Json& d) { d["tensors"][0]["weightless"] = false; });
       return Rejected{f,
                       at_tensor(f, 0) + "tensor 'w' (tensors[0]): weightless: expected true, "
                                             "got false"};
     }},
    {"WeightlessTensorWithBytes",
     [] {
       std::string b = save_to_string(testing::weightless_module());
       std::string f = with_json(b, [](Json& d) { d["tensors"][0]["offset"] = 0; });
       return Rejected{f,
                       at_tensor(f, 0) + "tensor 'w' (tensors[0]): offset: a weightless tensor "
                                             "has no bytes in the file, so no 'offset'"};
     }},
    {"WeightlessTensorOfAQuantizedDtype",
     [] {
       std::string b = save_to_string(testing::weightless_module());
       std::string f = with_json(b, [](Json& d) { d["tensors"][0]["dtype"] = "qint8"; });
       return Rejected{f,
                       at_tensor(f, 0) + "tensor 'w' (tensors[0]): dtype: tensors of dtype "
                                             "qint8 cannot be stored in the data section"};
     }},
    {"WeightlessSizesThatOverflow",
     [] {
       std::string b = save_to_string(testing::weightless_module());
       std::string f = with_json(b, [](Json& d) {
         d["tensors"][0]["sizes"] = {int64_t{1} << 40, int64_t{1} << 40};
         d["tensors"][0]["strides"] = {int64_t{1} << 40, 1};
       });
       return Rejected{f,
                       at_tensor(f, 0) +
                               "tensor 'w' (tensors[0]): sizes [1099511627776, 1099511627776] with "
                               "strides [1099511627776, 1] span more bytes than 64 bits can count"};
     }},
    {"WeightlessTensorInAFileOfVersion12",
     [] {
       std::string b = save_to_string(testing::weightless_module());
       TcgFile::put_header(b, 10, 2, 2);
       return Rejected{b,
                       at_tensor(b, 0) +
                               "tensors[0]: unknown key 'weightless' in a file of version 1.2 "
                               "(version 1.3 added it)"};
     }},
    {"CallInAFileOfVersion12",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["call"] = {{"names", {"x"}}, {"keywords", false}}; });
       return Rejected{b,
                       "f.tcg: byte 72: unknown key 'call' in a file of version 1.2 (version 1.5 added it)"};
     }},
    {"CallNamesThatDoNotFitTheInputSpec",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["call"] = {{"names", {"x", "y"}}, {"keywords", false}}; });
       TcgFile::put_header(b, 10, 5, 2);
       uint64_t at = TcgFile::parse(b).json.find("\"call\"") + kJson + 7;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(at) +
                               ": 'call': 2 argument name(s) ('x', 'y') for the 1 positional argument(s) "
                               "of the input spec (*,)"};
     }},
    {"CallWithKeywordsAndNoDictOfThem",
     [] {
       std::string b = with_json(valid(), [](Json& d) { d["call"] = {{"names", Json::array()}, {"keywords", true}}; });
       TcgFile::put_header(b, 10, 5, 2);
       uint64_t at = TcgFile::parse(b).json.find("\"call\"") + kJson + 7;
       return Rejected{b,
                       "f.tcg: byte " + std::to_string(at) +
                               ": 'call': the call passes keyword arguments but the input spec (*,) "
                               "does not end with a dict of them"};
     }},
};

class RejectedFiles : public ::testing::TestWithParam<RejectCase> {};

TEST_P(RejectedFiles, LoadNamesTheProblemAndWhereItIs) {
  Rejected r = GetParam().make();
  EXPECT_EQ(load_error(r.bytes), r.message);
}

INSTANTIATE_TEST_SUITE_P(Load, RejectedFiles, ::testing::ValuesIn(kRejectCases),
                         [](const ::testing::TestParamInfo<RejectCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace torchcap
