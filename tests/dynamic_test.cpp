// Dynamic shapes: size expressions, traces aligned into one graph, and that
// graph run at other sizes (Note [Dynamic shapes by aligned traces] in
// src/trace/dynamic.cpp).
#include <torchcap/torchcap.h>

#include "transformers.h"
#include "zoo.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace torchcap {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

size_t count_target(const GraphModule& gm, const std::string& target) {
  size_t n = 0;
  for (const Node* node : gm.graph()) n += node->target() == target ? 1 : 0;
  return n;
}

TEST(SizeExpr, PrintsParsesAndEvaluates) {
  using Term = SizeExpr::Term;
  SizeExpr e = SizeExpr::of_terms({Term{-1, {}}, Term{2, {0}}, Term{1, {1, 0}}});
  EXPECT_EQ(e.str(), "s0*s1 + 2*s0 - 1");
  EXPECT_EQ(SizeExpr::parse(e.str()), e);
  const std::vector<int64_t> at = {3, 5};
  EXPECT_EQ(e.evaluate(at), 15 + 6 - 1);
  EXPECT_EQ(SizeExpr::constant(7).str(), "7");
  EXPECT_EQ(SizeExpr::symbol(1).str(), "s1");
  EXPECT_EQ(SizeExpr::of_terms({Term{-4, {0}}, Term{10, {}}}).str(), "-4*s0 + 10");
  EXPECT_EQ(SizeExpr::parse("-4*s0 + 10").evaluate(at), -2);
  EXPECT_EQ(SizeExpr::of_terms({Term{1, {0}}, Term{-1, {0}}}).str(), "0");
  EXPECT_NE(error_of([] { SizeExpr::parse("2*x"); }).find("expected a symbol"), std::string::npos);
  EXPECT_NE(error_of([] { SizeExpr::parse("s0 + 2*s0"); }).find("canonical"), std::string::npos);
  const std::vector<int64_t> big = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_NE(error_of([&] { e.evaluate(big); }).find("overflows"), std::string::npos);
}

// A function whose view takes a size computed from the batch.
TEST(DynamicTrace, SizesBecomeSizeComputations) {
  auto fn = [](std::vector<c10::IValue> in) -> c10::IValue {
    at::Tensor x = in[0].toTensor();
    return (x.view({x.size(0) * 2, -1}) + 1).sum(1);
  };
  TraceOptions options;
  options.dynamic = {{0, 0, "batch", 2, 64}};
  GraphModule gm = trace(fn, {torch::randn({3, 4})}, options);
  ASSERT_EQ(gm.symbols.size(), 1u);
  EXPECT_EQ(gm.symbols[0].label, "batch");
  EXPECT_EQ(count_target(gm, kSymSize), 1u);
  EXPECT_EQ(count_target(gm, "mul"), 1u);
  const std::string listing = gm.str();
  EXPECT_NE(listing.find("f32[s0, 4]"), std::string::npos) << listing;
  EXPECT_NE(listing.find("f32[2*s0, 2]"), std::string::npos) << listing;
  EXPECT_NE(listing.find("# s0 (batch) in [2, 64]: input 0 dim 0"), std::string::npos) << listing;
  Interpreter interp(gm);
  for (int64_t b : {2, 5, 9, 64}) {
    at::Tensor x = torch::randn({b, 4});
    EXPECT_TRUE(interp.run({x}).toTensor().equal(fn({x}).toTensor())) << "batch " << b;
  }
  // Shape propagation on the dynamic graph gives back the traced expressions.
  GraphModule propagated = gm.clone();
  for (Node* n : propagated.graph()) {
    if (n->op() != OpCode::Placeholder) n->meta().val = ValueMeta{};
  }
  EXPECT_TRUE(propagate_shapes(propagated));
  EXPECT_EQ(propagated.str(), gm.str());
  EXPECT_FALSE(propagate_shapes(propagated));

  // Specialized, the graph is a static one with the sizes as constants.
  const std::vector<int64_t> seven = {7};
  GraphModule fixed = specialize(gm, seven);
  EXPECT_FALSE(fixed.is_dynamic());
  EXPECT_EQ(count_target(fixed, kSymSize), 0u);
  EXPECT_NE(fixed.str().find("f32[14, 2]"), std::string::npos) << fixed.str();
}

TEST(DynamicTrace, CallsOutsideTheRangeOrInconsistentAreRefused) {
  auto fn = [](std::vector<c10::IValue> in) -> c10::IValue {
    return in[0].toTensor() + in[1].toTensor();
  };
  TraceOptions options;
  options.dynamic = {{0, 0, "batch", 2, 16}, {1, 0, "batch", 2, 16}};
  GraphModule gm = trace(fn, {torch::randn({3, 4}), torch::randn({3, 4})}, options);
  ASSERT_EQ(gm.symbols.size(), 1u);
  EXPECT_EQ(gm.symbols[0].dims.size(), 2u);
  Interpreter interp(gm);
  at::Tensor big = torch::randn({17, 4});
  at::Tensor big_copy = big.clone();
  std::string e = error_of([&] { interp.run({big, big}); });
  EXPECT_NE(e.find("input 0 (ph_0): dimension 0 is 17, outside the range [2, 16] of s0 (batch)"),
            std::string::npos)
      << e;
  EXPECT_TRUE(big.equal(big_copy));  // inputs keep their values
  e = error_of([&] { interp.run({torch::randn({4, 4}), torch::randn({5, 4})}); });
  EXPECT_NE(e.find("input 1 (ph_1): dimension 0 is 5, but it is s0 (batch), which another input's "
                   "dimension makes 4"),
            std::string::npos)
      << e;
  e = error_of([&] { interp.run({torch::randn({4, 3}), torch::randn({4, 3})}); });
  EXPECT_NE(e.find("expected f32[s0, 4], got f32[4, 3]"), std::string::npos) << e;
  EXPECT_TRUE(interp.run({torch::ones({6, 4}), torch::ones({6, 4})}).toTensor().equal(torch::full({6, 4}, 2.0)));
}

TEST(DynamicTrace, BranchesOnASizeFailNamingTheNode) {
  auto fn = [](std::vector<c10::IValue> in) -> c10::IValue {
    at::Tensor x = in[0].toTensor();
    return x.size(0) % 2 == 0 ? x.relu() : x.sigmoid();
  };
  TraceOptions options;
  options.dynamic = {{0, 0, "batch"}};
  std::string e = error_of([&] { trace(fn, {torch::randn({2, 3})}, options); });
  EXPECT_NE(e.find("the program records a different graph at batch=3 than at batch=2"), std::string::npos) << e;
  EXPECT_NE(e.find("aten::relu"), std::string::npos) << e;
}

TEST(DynamicTrace, SizesItCannotExpressFail) {
  auto fn = [](std::vector<c10::IValue> in) -> c10::IValue {
    at::Tensor x = in[0].toTensor();
    return x.narrow(0, 0, std::min<int64_t>(x.size(0), 4)) * 2;
  };
  TraceOptions options;
  options.dynamic = {{0, 0, "batch"}};
  std::string e = error_of([&] { trace(fn, {torch::randn({2, 3})}, options); });
  EXPECT_NE(e.find("cannot express"), std::string::npos) << e;
  EXPECT_NE(e.find("aten::slice"), std::string::npos) << e;

  // A size the program reads from a tensor's values is refused as any
  // data-dependent value is.
  auto from_values = [](std::vector<c10::IValue> in) -> c10::IValue {
    at::Tensor x = in[0].toTensor();
    return x.narrow(0, 0, x.new_full({}, 2).item<int64_t>());
  };
  e = error_of([&] { trace(from_values, {torch::randn({3, 3})}, options); });
  EXPECT_NE(e.find("item"), std::string::npos) << e;

  // A float computed from a size differs between the traces.
  auto scaled = [](std::vector<c10::IValue> in) -> c10::IValue {
    at::Tensor x = in[0].toTensor();
    return x / std::sqrt(static_cast<double>(x.size(0)));
  };
  e = error_of([&] { trace(scaled, {torch::randn({3, 3})}, options); });
  EXPECT_NE(e.find("at %div (aten::div.Scalar), the program gives the number 1.73205 at batch=3 and "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("a float computed from a dynamic size outside tensor operators"), std::string::npos) << e;

  // A reshape that only works for even sizes fails at an odd one.
  auto pairs = [](std::vector<c10::IValue> in) -> c10::IValue {
    return in[0].toTensor().view({-1, 2, 3});
  };
  e = error_of([&] { trace(pairs, {torch::randn({4, 3})}, options); });
  EXPECT_NE(e.find("tracing at batch=3 (the example is traced at batch=4) failed: shape '[-1, 2, 3]' is "
                   "invalid"),
            std::string::npos)
      << e;
}

// Asked to take size 1, a graph traced at 2 and more is checked there: a
// program that squeezes the batch away at 1 takes another path.
TEST(DynamicTrace, SizeOneIsCheckedWhenAskedFor) {
  auto fn = [](std::vector<c10::IValue> in) -> c10::IValue { return in[0].toTensor().squeeze() * 2; };
  TraceOptions options;
  options.dynamic = {{0, 0, "batch", 1, 8}};
  std::string e = error_of([&] { trace(fn, {torch::randn({2, 3})}, options); });
  EXPECT_NE(e.find("at batch=1 %squeeze (aten::squeeze) would compute f32[3] where the sizes traced at "
                   "2 and more give f32[1, 3]"),
            std::string::npos)
      << e;
  options.dynamic = {{0, 0, "batch", 2, 8}};
  EXPECT_TRUE(trace(fn, {torch::randn({2, 3})}, options).is_dynamic());
}

// A file whose expressions are damaged is refused naming the field.
TEST(DynamicTrace, DamagedSymbolicFilesAreRefused) {
  auto fn = [](std::vector<c10::IValue> in) -> c10::IValue {
    at::Tensor x = in[0].toTensor();
    return x.view({x.size(0) * 2, -1});
  };
  TraceOptions options;
  options.dynamic = {{0, 0, "batch"}};
  std::string bytes = save_to_string(trace(fn, {torch::randn({2, 4})}, options));
  auto damaged = [&](const std::string& from, const std::string& to) {
    std::string copy = bytes;
    size_t at = copy.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    copy.replace(at, from.size(), to);
    LoadOptions no_checksums;
    no_checksums.verify_checksums = false;
    return error_of([&] { load_from_buffer(copy.data(), copy.size(), "f.tcg", no_checksums); });
  };
  EXPECT_NE(damaged("\"2*s0\"", "\"2*x0\"").find("expected a symbol"), std::string::npos);
  EXPECT_NE(damaged("\"2*s0\"", "\"2*s7\"").find("uses a symbol the module has not"), std::string::npos);
  EXPECT_NE(damaged("\"dims\":[[0,0]]", "\"dims\":[[0,5]]").find("no such recorded dimension"),
            std::string::npos);
  EXPECT_NE(damaged("\"target\":\"mul\"", "\"target\":\"pow\"").find("pow"), std::string::npos);
}

TEST(DynamicTrace, BadDynamicDimensionsAreRefused) {
  auto fn = [](std::vector<c10::IValue> in) -> c10::IValue { return in[0].toTensor() * 2; };
  TraceOptions options;
  options.dynamic = {{1, 0, "batch"}};
  EXPECT_NE(error_of([&] { trace(fn, {torch::randn({2, 3})}, options); }).find("1 input tensor"),
            std::string::npos);
  options.dynamic = {{0, 2, "batch"}};
  EXPECT_NE(error_of([&] { trace(fn, {torch::randn({2, 3})}, options); }).find("2 dimension"),
            std::string::npos);
  options.dynamic = {{0, 0, "batch", 2, 3}};
  EXPECT_NE(error_of([&] { trace(fn, {torch::randn({2, 3})}, options); }).find("fewer than 4 sizes"),
            std::string::npos);
}

// ResNet-18 traced once at batch 2 runs at other batch sizes.
TEST(DynamicTrace, ResNet18TakesAnyBatch) {
  examples::Example e = examples::make("resnet18");
  TraceOptions options;
  options.dynamic = {{0, 0, "batch"}};
  GraphModule gm = examples::trace(e, options, {torch::randn({2, 3, 32, 32})});
  EXPECT_NE(gm.str().find("f32[s0, 512, 1, 1]"), std::string::npos);
  Interpreter interp(gm);
  torch::NoGradGuard no_grad;
  for (int64_t b : {3, 4, 7, 9}) {
    at::Tensor x = torch::randn({b, 3, 32, 32});
    c10::IValue expected = e.forward({x});
    EXPECT_LT(examples::max_abs_diff(interp.run({x}), expected), 1e-4) << "batch " << b;
  }
}

// A training step with a dynamic batch: Adam steps at three batch sizes,
// equal to torch::optim's on a copy of the model.
TEST(DynamicTrace, TrainingStepTakesAnyBatch) {
  torch::manual_seed(5);
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  torch::nn::Sequential eager(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      eager->parameters()[i].copy_(model->parameters()[i]);
    }
  }
  TrainingOptions options;
  options.optimizer = Adam{.lr = 0.05};
  options.trace.dynamic = {{0, 0, "batch"}, {1, 0, "batch"}};
  GraphModule step = export_training(model, losses::mse(), {at::randn({2, 4})}, {at::randn({2, 2})}, options);
  ASSERT_TRUE(step.is_dynamic());
  torch::optim::Adam optimizer(eager->parameters(), torch::optim::AdamOptions(0.05));
  Interpreter interp(step);
  for (int64_t b : {3, 5, 7}) {
    at::Tensor x = at::randn({b, 4}), y = at::randn({b, 2});
    c10::IValue out = interp.run({x, y});
    optimizer.zero_grad();
    at::Tensor loss = torch::mse_loss(eager->forward(x), y);
    loss.backward();
    optimizer.step();
    EXPECT_TRUE(at::allclose(out.toGenericDict().at("loss").toTensor(), loss.detach())) << b;
  }
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    EXPECT_TRUE(at::allclose(step.attribute(model->named_parameters()[i].key()).value, eager->parameters()[i],
                             1e-5, 1e-6))
        << model->named_parameters()[i].key();
  }
}

// A GPT-style decoder: the causal mask and learned positions are sliced by
// the sequence length; batch and length are both dynamic.
TEST(DynamicTrace, DecoderTakesAnyBatchAndLength) {
  examples::DecoderOptions o{.layers = 2, .width = 32, .heads = 4, .vocab = 50, .context = 16};
  auto decoder = std::make_shared<examples::Decoder>(o);
  auto forward = [decoder](std::vector<c10::IValue> in) -> c10::IValue {
    return decoder->forward(in[0].toTensor());
  };
  TraceOptions options;
  options.dynamic = {{0, 0, "batch", 1, 8}, {0, 1, "seq", 1, 16}};
  at::Tensor tokens = torch::randint(0, 50, {2, 5});
  GraphModule gm = trace(*decoder, forward, {tokens}, options);
  ASSERT_EQ(gm.symbols.size(), 2u);
  Interpreter interp(gm);
  torch::NoGradGuard no_grad;
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 7}, {3, 3}, {4, 11}, {8, 16}}) {
    at::Tensor x = torch::randint(0, 50, {b, t});
    EXPECT_LT(examples::max_abs_diff(interp.run({x}), forward({x})), 1e-5) << b << "x" << t;
  }
  std::string e = error_of([&] { interp.run({torch::randint(0, 50, {2, 17})}); });
  EXPECT_NE(e.find("outside the range [1, 16] of s1 (seq)"), std::string::npos) << e;

  // After the cleanup passes (CSE merges repeated size computations), under
  // the memory planner (a plan per size), and traced in meta mode: the same.
  GraphModule cleaned = gm.clone();
  passes_by_name({"cleanup"}).run(cleaned);
  GraphModule propagated = gm.clone();
  propagate_shapes(propagated);  // symbolic: sizes as traced
  EXPECT_EQ(propagated.str(), gm.str());
  EXPECT_LE(cleaned.graph().size(), gm.graph().size());
  InterpreterOptions planned;
  planned.plan_memory = true;
  Interpreter run_planned(gm, planned);
  TraceOptions meta = options;
  meta.meta = true;
  GraphModule from_meta = trace(*decoder, forward, {tokens}, meta);
  EXPECT_EQ(from_meta.str(), gm.str());
  Interpreter run_cleaned(cleaned);
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{2, 3}, {5, 10}, {2, 3}}) {
    at::Tensor x = torch::randint(0, 50, {b, t});
    c10::IValue expected = forward({x});
    EXPECT_LT(examples::max_abs_diff(run_cleaned.run({x}), expected), 1e-5) << b << "x" << t;
    EXPECT_LT(examples::max_abs_diff(run_planned.run({x}), expected), 1e-5) << b << "x" << t;
  }

  // Saved and loaded (format 1.4), the same.
  std::string bytes = save_to_string(gm);
  EXPECT_EQ(static_cast<unsigned char>(bytes[10]), 4);  // minor version
  GraphModule loaded = load_from_buffer(bytes.data(), bytes.size());
  ASSERT_TRUE(loaded.is_dynamic());
  EXPECT_EQ(loaded.symbols, gm.symbols);
  EXPECT_EQ(loaded.str(), gm.str());
  Interpreter run_loaded(loaded);
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{2, 13}, {6, 2}}) {
    at::Tensor x = torch::randint(0, 50, {b, t});
    EXPECT_LT(examples::max_abs_diff(run_loaded.run({x}), forward({x})), 1e-5) << b << "x" << t;
  }

  // Exported, the same.
  GraphModule exported = export_program(*decoder, forward, {tokens}, options);
  EXPECT_TRUE(exported.is_dynamic());
  Interpreter run_exported(exported);
  for (auto [b, t] : std::vector<std::pair<int64_t, int64_t>>{{2, 9}, {5, 4}}) {
    at::Tensor x = torch::randint(0, 50, {b, t});
    EXPECT_LT(examples::max_abs_diff(run_exported.run({x}), forward({x})), 1e-5) << b << "x" << t;
  }
}

}  // namespace
}  // namespace torchcap
