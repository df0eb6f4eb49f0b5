// The calling convention: argument names and keyword arguments, from the
// trace through a file to a run bound by name.
#include <torchcap/call_convention.h>
#include <torchcap/error.h>
#include <torchcap/interpreter.h>
#include <torchcap/serialize.h>
#include <torchcap/tracer.h>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace torchcap {
namespace {

// (x, (a, b), {'scale': *, 'bias': *}): two positional arguments, the second
// a tuple, and two keyword arguments.
TreeSpec call_spec() {
  return TreeSpec::tuple(
      {TreeSpec::leaf(), TreeSpec::tuple({TreeSpec::leaf(), TreeSpec::leaf()}),
       TreeSpec::dict({c10::IValue("scale"), c10::IValue("bias")}, {TreeSpec::leaf(), TreeSpec::leaf()})});
}

CallConvention named_call() { return CallConvention{{"x", "pair"}, /*keywords=*/true}; }

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(CallConvention, DescribesTheCall) {
  CallConvention call = named_call();
  EXPECT_EQ(call.mismatch(call_spec()), "");
  EXPECT_EQ(call.str(call_spec()), "(x, pair, *, scale, bias)");
  EXPECT_EQ(call.keyword_names(call_spec()), (std::vector<std::string>{"scale", "bias"}));
  EXPECT_EQ(call.leaf_names(call_spec()),
            (std::vector<std::string>{"x", "pair_0", "pair_1", "scale", "bias"}));
  // Unknown names: the positional ones print as arg<i>; placeholders keep ph_<i>.
  CallConvention keywords_only{{}, true};
  EXPECT_EQ(keywords_only.str(call_spec()), "(arg0, arg1, *, scale, bias)");
  EXPECT_EQ(keywords_only.leaf_names(call_spec())[1], "ph_1_0");
  EXPECT_TRUE(CallConvention{}.leaf_names(call_spec()).empty());
}

TEST(CallConvention, MismatchesAreNamed) {
  EXPECT_NE(CallConvention({{"x"}, true}).mismatch(call_spec()).find("1 argument name(s) ('x') for the 2"),
            std::string::npos);
  EXPECT_NE(CallConvention({{"x", "x"}, true}).mismatch(call_spec()).find("'x' appears twice"),
            std::string::npos);
  EXPECT_NE(CallConvention({{"x", "a b"}, true}).mismatch(call_spec()).find("'a b' is not an identifier"),
            std::string::npos);
  // Without keywords the dict is a third positional argument, which has no name.
  EXPECT_NE(CallConvention({{"x", "pair"}, false}).mismatch(call_spec()).find("for the 3 positional"),
            std::string::npos);
  TreeSpec no_dict = TreeSpec::tuple({TreeSpec::leaf()});
  EXPECT_NE(CallConvention({{}, true}).mismatch(no_dict).find("does not end with a dict"), std::string::npos);
}

TEST(CallConvention, BindsByPositionAndName) {
  CallConvention call = named_call();
  at::Tensor x = at::ones({1}), s = at::ones({2}), b = at::ones({3});
  c10::IValue pair = c10::ivalue::Tuple::create({x, x});
  std::vector<c10::IValue> bound = call.bind(call_spec(), {x}, {{"bias", b}, {"pair", pair}, {"scale", s}});
  ASSERT_EQ(bound.size(), 3u);
  EXPECT_TRUE(bound[0].toTensor().is_same(x));
  EXPECT_TRUE(bound[1].isTuple());
  auto dict = bound[2].toGenericDict();
  // The keywords in the order the spec has them, whatever the call's order.
  EXPECT_EQ(dict.begin()->key().toStringRef(), "scale");
  EXPECT_TRUE(dict.at("bias").toTensor().is_same(b));
  // The whole flattens as the spec says.
  EXPECT_EQ(call_spec().flatten_like(c10::ivalue::Tuple::create(bound)).size(), 5u);

  EXPECT_NE(message_of([&] { call.bind(call_spec(), {x, pair}, {{"scale", s}}); })
                .find("missing keyword argument 'bias'; the program takes (x, pair, *, scale, bias)"),
            std::string::npos);
  EXPECT_NE(message_of([&] { call.bind(call_spec(), {x}, {{"scale", s}, {"bias", b}}); })
                .find("missing argument 'pair'"),
            std::string::npos);
  EXPECT_NE(message_of([&] { call.bind(call_spec(), {x, pair}, {{"x", x}, {"scale", s}, {"bias", b}}); })
                .find("argument 'x' is given twice"),
            std::string::npos);
  EXPECT_NE(message_of([&] { call.bind(call_spec(), {x, pair}, {{"scal", s}, {"bias", b}}); })
                .find("no argument 'scal'"),
            std::string::npos);
  EXPECT_NE(message_of([&] { call.bind(call_spec(), {x, pair, s}, {}); })
                .find("takes 2 positional argument(s) (x, pair, *, scale, bias), got 3"),
            std::string::npos);
}

// f(x, *, scale): traced with names, saved, loaded, run by name.
GraphModule traced_with_keywords() {
  TraceOptions options;
  options.call = CallConvention{{"x"}, true};
  c10::Dict<std::string, at::Tensor> kwargs;
  kwargs.insert("scale", at::full({3}, 2.0));
  return trace(
      [](std::vector<c10::IValue> in) -> c10::IValue {
        at::Tensor scale = in[1].toGenericDict().at("scale").toTensor();
        return in[0].toTensor() * scale + 1;
      },
      {at::ones({2, 3}), kwargs}, options);
}

TEST(CallConvention, NamesPlaceholdersAndTravelsInFiles) {
  GraphModule gm = traced_with_keywords();
  std::vector<Node*> placeholders = gm.graph().placeholders();
  ASSERT_EQ(placeholders.size(), 2u);
  EXPECT_EQ(placeholders[0]->name(), "x");
  EXPECT_EQ(placeholders[1]->name(), "scale");
  EXPECT_NE(gm.str().find("# call: forward(x, *, scale)"), std::string::npos) << gm.str();
  EXPECT_EQ(gm.clone().call, gm.call);

  std::string path = ::testing::TempDir() + "call_convention.tcg";
  save(gm, path);
  GraphModule loaded = load(path);
  std::remove(path.c_str());
  EXPECT_EQ(loaded.call, gm.call);

  Interpreter interp(loaded);
  at::Tensor x = at::randn({2, 3}), s = at::randn({3});
  at::Tensor y = interp.run({x}, {{"scale", s}}).toTensor();
  EXPECT_TRUE(at::allclose(y, x * s + 1));
  y = interp.run({}, {{"scale", s}, {"x", x}}).toTensor();
  EXPECT_TRUE(at::allclose(y, x * s + 1));
  EXPECT_NE(message_of([&] { interp.run({x}, {}); }).find("missing keyword argument 'scale'"),
            std::string::npos);
}

TEST(CallConvention, ATraceWhoseNamesDoNotFitIsRefused) {
  TraceOptions options;
  options.call = CallConvention{{"x", "y"}, false};
  try {
    trace([](std::vector<c10::IValue> in) -> c10::IValue { return in[0].toTensor() + 1; },
          {at::ones({2})}, options);
    FAIL() << "expected a TypeError";
  } catch (const TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("2 argument name(s) ('x', 'y') for the 1 positional"),
              std::string::npos)
        << e.what();
  }
}

TEST(CallConvention, LintRefusesAConventionThatDoesNotFit) {
  GraphModule gm = traced_with_keywords();
  gm.call.names = {"x", "extra"};
  EXPECT_THROW(gm.lint(), LintError);
}

}  // namespace
}  // namespace torchcap
