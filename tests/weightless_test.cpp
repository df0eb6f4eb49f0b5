// Weightless graphs: a torch::nn model on the meta device traced, saved
// without its weights, loaded with weights bound, and run like the eager
// model with those weights; the errors of binding and of running unbound.
// (serialize_test covers the file format's side: version, table entries and
// damaged files.)
#include <torchcap/error.h>
#include <torchcap/interpreter.h>
#include <torchcap/serialize.h>
#include <torchcap/tracer.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

namespace torchcap {
namespace {

namespace fs = std::filesystem;

class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_((fs::temp_directory_path() / ("torchcap_weightless_" + std::to_string(::getpid()) +
                                            "_" + name))
                  .string()) {}
  ~TempFile() { fs::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

at::Tensor on_meta(std::vector<int64_t> sizes) {
  return torch::empty(sizes, torch::TensorOptions().device(torch::kMeta));
}

// Linear + GELU + scale and shift + Linear + log_softmax, operators whose
// meta kernels LibTorch has (its layer_norm decomposes into batch_norm, which
// has none in 1.13), with its tensors made on `device`. (LibTorch 1.13 cannot move a built
// module to the meta device: Module::to(torch::kMeta) fails in set_data with
// "incompatible tensor type". A model meant for the meta device makes its
// tensors there.)
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(torch::Device device) {
    torch::manual_seed(0);
    auto make = [&](const char* name, std::vector<int64_t> sizes) {
      at::Tensor t = device.is_meta() ? on_meta(sizes) : torch::randn(sizes) * 0.2;
      return register_parameter(name, t);
    };
    fc1_weight = make("fc1_weight", {64, 16});
    fc1_bias = make("fc1_bias", {64});
    norm_weight = make("norm_weight", {64});
    norm_bias = make("norm_bias", {64});
    fc2_weight = make("fc2_weight", {8, 64});
    fc2_bias = make("fc2_bias", {8});
  }
  torch::Tensor forward(torch::Tensor x) {
    namespace F = torch::nn::functional;
    x = torch::gelu(F::linear(x, fc1_weight, fc1_bias));
    x = x * norm_weight + norm_bias;
    return torch::log_softmax(F::linear(x, fc2_weight, fc2_bias), -1);
  }
  torch::Tensor fc1_weight, fc1_bias, norm_weight, norm_bias, fc2_weight, fc2_bias;
};
TORCH_MODULE(Mlp);

// A stack of square Linear layers built on the meta device, as a model too
// large for the machine would be: `layers` weights of width x width and
// their biases, never allocated.
struct WideStackImpl : torch::nn::Module {
  WideStackImpl(int64_t layers, int64_t width) {
    for (int64_t i = 0; i < layers; ++i) {
      weights.push_back(register_parameter("weight" + std::to_string(i), on_meta({width, width})));
      biases.push_back(register_parameter("bias" + std::to_string(i), on_meta({width})));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < weights.size(); ++i) {
      x = torch::gelu(torch::nn::functional::linear(x, weights[i], biases[i]));
    }
    return x;
  }
  std::vector<torch::Tensor> weights, biases;
};
TORCH_MODULE(WideStack);

// Traces a holder whose forward takes one tensor.
template <typename Holder>
GraphModule trace_one(Holder& model, const at::Tensor& x) {
  return trace(
      *model, [&](std::vector<c10::IValue> in) { return c10::IValue(model->forward(in[0].toTensor())); },
      {x});
}

TEST(Weightless, AModelOnMetaTracesSavesSmallAndRunsLikeEagerOnceBound) {
  Mlp eager(torch::kCPU);
  Mlp model(torch::kMeta);
  for (const auto& p : model->parameters()) ASSERT_TRUE(p.is_meta());

  GraphModule gm = trace_one(model, on_meta({4, 16}));
  EXPECT_TRUE(gm.has_unbound_weights());
  EXPECT_EQ(gm.unbound_attributes().size(), 6u);

  TempFile file("mlp.tcg");
  save(gm, file.path());
  // The graph and its stack traces; no weight bytes at all.
  EXPECT_LT(fs::file_size(file.path()), 32u << 10);

  // Bound to the eager model's weights, it computes what the eager model does.
  GraphModule bound =
      load(file.path(), {.weights = named_tensors(ModuleState::of(*eager))});
  EXPECT_FALSE(bound.has_unbound_weights());
  at::Tensor x = torch::randn({4, 16});
  at::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    expected = eager(x);
  }
  at::Tensor actual = Interpreter(bound).run_flat({x})[0];
  EXPECT_FALSE(actual.is_meta());
  EXPECT_TRUE(torch::allclose(actual, expected, 1e-5, 1e-6))
      << (actual - expected).abs().max().item<double>();

  // Loaded without weights, it refuses to run, naming them.
  GraphModule unbound = load(file.path());
  try {
    Interpreter(unbound).run_flat({x});
    FAIL() << "an unbound module ran";
  } catch (const WeightError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("6 attribute(s) hold no values"), std::string::npos) << what;
    EXPECT_NE(what.find("parameter 'fc1_weight' (f32[64, 16])"), std::string::npos) << what;
  }
}

TEST(Weightless, BindingAfterTheTraceWithoutAFile) {
  Mlp eager(torch::kCPU);
  Mlp model(torch::kMeta);
  GraphModule gm = trace_one(model, on_meta({2, 16}));
  EXPECT_THROW(Interpreter(gm).run_flat({torch::randn({2, 16})}), WeightError);
  gm.bind_weights(named_tensors(ModuleState::of(*eager)));
  at::Tensor x = torch::randn({2, 16});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(Interpreter(gm).run_flat({x})[0], eager(x), 1e-5, 1e-6));
}

TEST(Weightless, SparseWeightsAreAWeightErrorNamingThem) {
  Mlp eager(torch::kCPU);
  Mlp model(torch::kMeta);
  GraphModule gm = trace_one(model, on_meta({2, 16}));
  auto weights = named_tensors(ModuleState::of(*eager));
  std::string sparse_name = weights.begin()->first;
  weights[sparse_name] = weights[sparse_name].to_sparse();
  try {
    gm.bind_weights(weights);
    FAIL() << "expected a WeightError";
  } catch (const WeightError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("'" + sparse_name + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("got a Sparse tensor; pass the dense one (to_dense())"), std::string::npos)
        << message;
  }
}

TEST(Weightless, ALargeModelBuiltOnMetaSavesInKilobytes) {
  // 24 layers of 4096 x 4096: 403 M parameters, 1.6 GB of float32 if real.
  WideStack model(24, 4096);
  GraphModule gm = trace_one(model, on_meta({1, 4096}));
  ASSERT_EQ(gm.unbound_attributes().size(), 48u);
  TempFile file("wide.tcg");
  save(gm, file.path());
  // About 0.8 KB per node, most of it the C++ stack trace of each.
  const uintmax_t size = fs::file_size(file.path());
  EXPECT_LT(size, 256u << 10) << size << " bytes";
  TraceOptions no_stacks;
  no_stacks.record_stack_traces = false;
  GraphModule bare = trace(
      *model, [&](std::vector<c10::IValue> in) { return c10::IValue(model->forward(in[0].toTensor())); },
      {on_meta({1, 4096})}, no_stacks);
  EXPECT_LT(save_to_string(bare).size(), 64u << 10);

  // Binding checks every weight against what was recorded.
  NamedTensors weights;
  for (int64_t i = 0; i < 24; ++i) {
    weights["weight" + std::to_string(i)] = torch::zeros({1, 1});
    weights["bias" + std::to_string(i)] = torch::zeros({4096});
  }
  weights.erase("bias23");
  weights["head.weight"] = torch::zeros({1});
  try {
    load(file.path(), {.weights = weights});
    FAIL() << "bound weights of the wrong shape";
  } catch (const WeightError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("weight 'weight0' (parameter): expected f32[4096, 4096], got "
                        "f32[1, 1]"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("missing: parameter 'bias23' (f32[4096])"), std::string::npos)
        << what;
    EXPECT_NE(what.find("\n  ... and 6 more"), std::string::npos) << what;  // 26 problems, 20 shown
  }
}

}  // namespace
}  // namespace torchcap
