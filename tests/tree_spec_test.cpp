// Tree specs: flattening nested values and rebuilding them.
#include <torchcap/error.h>
#include <torchcap/tree_spec.h>

#include <ATen/Functions.h>
#include <ATen/core/Dict.h>
#include <gtest/gtest.h>

namespace torchcap {
namespace {

c10::IValue nested(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
  c10::Dict<std::string, at::Tensor> d;
  d.insert("k", c);
  c10::List<at::Tensor> l({b});
  return c10::ivalue::Tuple::create({a, c10::ivalue::Tuple::create({l, d}), c10::IValue(),
                                     c10::IValue(int64_t(3)), c10::IValue("mode")});
}

TEST(TreeSpec, FlattensAndRebuilds) {
  at::Tensor a = at::ones({1}), b = at::ones({2}), c = at::ones({3});
  auto [leaves, spec] = tree_flatten(nested(a, b, c));
  ASSERT_EQ(leaves.size(), 3u);
  EXPECT_TRUE(leaves[0].is_same(a));
  EXPECT_TRUE(leaves[1].is_same(b));
  EXPECT_TRUE(leaves[2].is_same(c));
  EXPECT_EQ(spec.num_leaves(), 3u);
  EXPECT_EQ(spec.str(), "(*, ([*], {'k': *}), None, 3, 'mode')");

  at::Tensor x = at::zeros({1}), y = at::zeros({2}), z = at::zeros({3});
  c10::IValue rebuilt = spec.unflatten({x, y, z});
  auto [again, spec2] = tree_flatten(rebuilt);
  EXPECT_EQ(spec2, spec);
  EXPECT_TRUE(again[1].is_same(y));
  EXPECT_TRUE(rebuilt.toTupleRef().elements()[1].toTupleRef().elements()[0].isTensorList());
}

TEST(TreeSpec, FlattenLikeChecksStructure) {
  at::Tensor a = at::ones({1});
  auto [leaves, spec] = tree_flatten(nested(a, a, a));
  EXPECT_EQ(spec.flatten_like(nested(a, a, a)).size(), 3u);

  auto message = [&spec = spec](const c10::IValue& v) -> std::string {
    try {
      spec.flatten_like(v);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message(c10::ivalue::Tuple::create({a})),
            "input: expected a tuple of 5, got a tuple of 1");
  c10::Dict<std::string, at::Tensor> wrong_key;
  wrong_key.insert("j", a);
  EXPECT_EQ(message(c10::ivalue::Tuple::create(
                {a, c10::ivalue::Tuple::create({c10::List<at::Tensor>({a}), wrong_key}),
                 c10::IValue(), c10::IValue(int64_t(3)), c10::IValue("mode")})),
            "input[1][1]: missing key 'k'");
  c10::Dict<std::string, at::Tensor> right;
  right.insert("k", a);
  EXPECT_EQ(message(c10::ivalue::Tuple::create(
                {a, c10::ivalue::Tuple::create({c10::List<at::Tensor>({a}), right}),
                 c10::IValue(), c10::IValue(int64_t(4)), c10::IValue("mode")})),
            "input[3]: expected int 3 (the value the graph was captured with; it is not an "
            "input), got int 4");
  EXPECT_EQ(message(c10::ivalue::Tuple::create(
                {c10::IValue(), c10::ivalue::Tuple::create({c10::List<at::Tensor>({a}), right}),
                 c10::IValue(), c10::IValue(int64_t(3)), c10::IValue("mode")})),
            "input[0]: expected a tensor, got None");
}

TEST(TreeSpec, RejectsUnsupportedValues) {
  c10::IValue device{c10::Device(c10::kCPU)};
  try {
    tree_flatten(c10::ivalue::Tuple::create({at::ones({1}), device}), "input");
    FAIL() << "expected a TypeError";
  } catch (const TypeError& e) {
    EXPECT_EQ(std::string(e.what()),
              "input[1]: unsupported value, a value of type Device; expected tensors, tuples, "
              "lists, dicts, None, or int/float/bool/str");
  }
}

TEST(TreeSpec, UnflattenChecksCount) {
  TreeSpec s = TreeSpec::tuple({TreeSpec::leaf(), TreeSpec::leaf()});
  EXPECT_THROW(s.unflatten({at::ones({1})}), InputError);
}

TEST(TreeSpec, IntKeyedDicts) {
  c10::Dict<int64_t, at::Tensor> d;
  d.insert(7, at::ones({1}));
  auto [leaves, spec] = tree_flatten(d);
  EXPECT_EQ(spec.str(), "{7: *}");
  c10::IValue back = spec.unflatten({at::zeros({1})});
  EXPECT_EQ(back.toGenericDict().begin()->key().toInt(), 7);
}

}  // namespace
}  // namespace torchcap
