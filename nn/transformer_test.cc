#include "nn/transformer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "nn/test_util.h"
#include "tensor/gradcheck.h"
#include "tensor/runtime/devices.h"
#include "tensor/testing.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class TransformerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetCpuDeviceCount(2);
    manual_seed(0);
  }
};

Tensor Randn64(const Shape& shape) { return randn(shape, TensorOptions().dtype(kFloat64)); }

std::vector<std::string> Names(const Module& m) {
  std::vector<std::string> names;
  for (const NamedTensor& e : m.named_parameters()) names.push_back(e.name);
  return names;
}

int64_t Count(const Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

// Gives every parameter random values (LayerNorms start at ones and zeros, attention biases
// at zeros), so that a reference that ignored one would differ.
void Randomise(Module& m) {
  NoGradGuard no_grad;
  for (const Tensor& p : m.parameters()) {
    Tensor t = p;
    t.copy_(randn(t.shape(), TensorOptions().dtype(t.dtype())) * 0.5);
  }
}

// ---- The reference: the layers' formulas written out from ops ---------------------------

Tensor LayerNormRef(const Module& m, const std::string& name, const Tensor& x) {
  const Tensor mean = x.mean({-1}, true);
  const Tensor centred = x - mean;
  const Tensor var = (centred * centred).mean({-1}, true);
  return centred / sqrt(var + 1e-5) * m.parameter(name + ".weight") + m.parameter(name + ".bias");
}

Tensor FeedForwardRef(const Module& m, const Tensor& x, const std::string& activation) {
  Tensor hidden = linear(x, m.parameter("linear1.weight"), m.parameter("linear1.bias"));
  hidden = activation == "gelu" ? gelu(hidden) : relu(hidden);
  return linear(hidden, m.parameter("linear2.weight"), m.parameter("linear2.bias"));
}

// MultiheadAttention has its own reference test (attention_test.cc): trusted here.
Tensor AttentionRef(MultiheadAttention& attention, const Tensor& q, const Tensor& kv,
                    const Tensor& mask, const Tensor& padding) {
  return std::get<0>(attention.forward(q, kv, kv, padding, true, mask));
}

Tensor EncoderLayerRef(TransformerEncoderLayer& layer, const Tensor& src, const Tensor& mask,
                       const Tensor& padding) {
  const std::string act = layer.options().activation();
  const auto sa = [&](const Tensor& x) {
    return AttentionRef(*layer.self_attn(), x, x, mask, padding);
  };
  Tensor x = src;
  if (layer.options().norm_first()) {
    x = x + sa(LayerNormRef(layer, "norm1", x));
    return x + FeedForwardRef(layer, LayerNormRef(layer, "norm2", x), act);
  }
  x = LayerNormRef(layer, "norm1", x + sa(x));
  return LayerNormRef(layer, "norm2", x + FeedForwardRef(layer, x, act));
}

Tensor DecoderLayerRef(TransformerDecoderLayer& layer, const Tensor& tgt, const Tensor& memory,
                       const Tensor& tgt_mask, const Tensor& memory_padding) {
  const std::string act = layer.options().activation();
  const auto sa = [&](const Tensor& x) {
    return AttentionRef(*layer.self_attn(), x, x, tgt_mask, Tensor());
  };
  const auto ca = [&](const Tensor& x) {
    return AttentionRef(*layer.multihead_attn(), x, memory, Tensor(), memory_padding);
  };
  Tensor x = tgt;
  if (layer.options().norm_first()) {
    x = x + sa(LayerNormRef(layer, "norm1", x));
    x = x + ca(LayerNormRef(layer, "norm2", x));
    return x + FeedForwardRef(layer, LayerNormRef(layer, "norm3", x), act);
  }
  x = LayerNormRef(layer, "norm1", x + sa(x));
  x = LayerNormRef(layer, "norm2", x + ca(x));
  return LayerNormRef(layer, "norm3", x + FeedForwardRef(layer, x, act));
}

// True above the diagonal: MultiheadAttention's causal mask (true = not allowed).
Tensor CausalBoolMask(int64_t n) {
  std::vector<bool> blocked(n * n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) blocked[i * n + j] = j > i;
  }
  return from_vector(blocked, {n, n});
}

// ---- Structure -------------------------------------------------------------------------

TEST_F(TransformerTest, EncoderLayerHasPyTorchsParametersAndPrinting) {
  TransformerEncoderLayer big(512, 8);
  // PyTorch's sum(p.numel() for p in nn.TransformerEncoderLayer(512, 8).parameters()).
  EXPECT_EQ(Count(big), 3152384);
  TransformerEncoderLayer layer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16));
  EXPECT_EQ(Names(layer),
            (std::vector<std::string>{
                "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
                "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}));
  EXPECT_EQ(layer.ToString(),
            "TransformerEncoderLayer(\n"
            "  (self_attn): MultiheadAttention(\n"
            "    (out_proj): NonDynamicallyQuantizableLinear(in_features=8, out_features=8, "
            "bias=True)\n"
            "  )\n"
            "  (linear1): Linear(in_features=8, out_features=16, bias=True)\n"
            "  (dropout): Dropout(p=0.1, inplace=False)\n"
            "  (linear2): Linear(in_features=16, out_features=8, bias=True)\n"
            "  (norm1): LayerNorm((8,), eps=1e-05, elementwise_affine=True)\n"
            "  (norm2): LayerNorm((8,), eps=1e-05, elementwise_affine=True)\n"
            "  (dropout1): Dropout(p=0.1, inplace=False)\n"
            "  (dropout2): Dropout(p=0.1, inplace=False)\n"
            ")");
}

TEST_F(TransformerTest, DecoderLayerHasPyTorchsParametersAndPrinting) {
  TransformerDecoderLayer big(512, 8);
  // Two attentions (2 x 1,050,624), linear1 and linear2, three LayerNorms.
  EXPECT_EQ(Count(big),
            2 * (4 * 512 * 512 + 4 * 512) + (512 * 2048 + 2048) + (2048 * 512 + 512) + 3 * 2 * 512);
  TransformerDecoderLayer layer(
      TransformerDecoderLayerOptions(4, 2).dim_feedforward(6).dropout(0.0).activation("gelu"));
  const std::vector<std::string> names = Names(layer);
  EXPECT_EQ(names.size(), 18u);
  EXPECT_EQ(names[4], "multihead_attn.in_proj_weight");
  EXPECT_EQ(names.back(), "norm3.bias");
  const std::string printed = layer.ToString();
  EXPECT_THAT(printed,
              StartsWith("TransformerDecoderLayer(\n  (self_attn): MultiheadAttention(\n"));
  EXPECT_THAT(printed, HasSubstr("  (multihead_attn): MultiheadAttention(\n"));
  EXPECT_THAT(printed, HasSubstr("  (norm3): LayerNorm((4,), eps=1e-05, elementwise_affine=True)\n"
                                 "  (dropout1): Dropout(p=0.0, inplace=False)\n"
                                 "  (dropout2): Dropout(p=0.0, inplace=False)\n"
                                 "  (dropout3): Dropout(p=0.0, inplace=False)\n"
                                 ")"));
}

TEST_F(TransformerTest, RejectsBadOptions) {
  EXPECT_THAT(ErrorOf([] { TransformerEncoderLayer(10, 3); }),
              HasSubstr("d_model (10) must be divisible by nhead (3)"));
  EXPECT_THAT(ErrorOf([] {
                TransformerEncoderLayer(TransformerEncoderLayerOptions(8, 2).activation("tanh"));
              }),
              HasSubstr("activation must be \"relu\" or \"gelu\" but is \"tanh\""));
  EXPECT_THAT(
      ErrorOf([] { TransformerDecoderLayer(TransformerDecoderLayerOptions(8, 2).bias(false)); }),
      HasSubstr("bias=false is not supported yet"));
  TransformerEncoderLayer layer(8, 2);
  EXPECT_THAT(ErrorOf([&] { TransformerEncoder(layer, 0); }),
              HasSubstr("num_layers must be positive but is 0"));
  const Tensor x = randn({5, 3, 8});
  EXPECT_THAT(ErrorOf([&] {
                layer.forward(x, zeros({4, 4}));
              }),
              HasSubstr("expected attn_mask of shape [5, 5] or [6, 5, 5]"));
  EXPECT_THAT(ErrorOf([&] {
                layer.forward(randn({5, 3, 6}));
              }),
              HasSubstr("expected features (last dimension) query 8"));
}

// ---- Values ----------------------------------------------------------------------------

TEST_F(TransformerTest, EncoderLayerMatchesTheReference) {
  for (bool norm_first : {false, true}) {
    for (const char* activation : {"relu", "gelu"}) {
      for (bool batch_first : {false, true}) {
        SCOPED_TRACE(std::string(activation) + (norm_first ? " norm_first" : " post-norm") +
                     (batch_first ? " batch_first" : ""));
        TransformerEncoderLayer layer(TransformerEncoderLayerOptions(8, 2)
                                          .dim_feedforward(12)
                                          .activation(activation)
                                          .norm_first(norm_first)
                                          .batch_first(batch_first));
        layer.to(kFloat64);
        Randomise(layer);
        layer.eval();
        const Tensor src = batch_first ? Randn64({2, 5, 8}) : Randn64({5, 2, 8});
        const Tensor mask = CausalBoolMask(5);
        const Tensor padding = from_vector(
            std::vector<bool>{false, false, false, false, true, false, false, true, false, false},
            {2, 5});
        EXPECT_LT(testing::MaxAbsDiff(layer.forward(src, mask, padding),
                                      EncoderLayerRef(layer, src, mask, padding)),
                  1e-12);
        // is_causal alone is the causal mask.
        EXPECT_LT(testing::MaxAbsDiff(layer.forward(src, Tensor(), Tensor(), /*is_causal=*/true),
                                      EncoderLayerRef(layer, src, mask, Tensor())),
                  1e-12);
      }
    }
  }
}

TEST_F(TransformerTest, DecoderLayerMatchesTheReference) {
  for (bool norm_first : {false, true}) {
    SCOPED_TRACE(norm_first);
    TransformerDecoderLayer layer(
        TransformerDecoderLayerOptions(8, 4).dim_feedforward(10).norm_first(norm_first));
    layer.to(kFloat64);
    Randomise(layer);
    layer.eval();
    const Tensor tgt = Randn64({4, 2, 8}), memory = Randn64({6, 2, 8});
    const Tensor padding = from_vector(std::vector<bool>{false, false, false, false, false, true,
                                                         true, false, false, false, false, false},
                                       {2, 6});
    const Tensor expected = DecoderLayerRef(layer, tgt, memory, CausalBoolMask(4), padding);
    EXPECT_LT(
        testing::MaxAbsDiff(
            layer.forward(tgt, memory, CausalBoolMask(4), Tensor(), Tensor(), padding), expected),
        1e-12);
    EXPECT_LT(testing::MaxAbsDiff(layer.forward(tgt, memory, Tensor(), Tensor(), Tensor(), padding,
                                                /*tgt_is_causal=*/true),
                                  expected),
              1e-12);
    // The generic entry point (DataParallel's) takes the tensors in the same order.
    EXPECT_LT(testing::MaxAbsDiff(layer.forward_tensors({tgt, memory, CausalBoolMask(4), Tensor(),
                                                         Tensor(), padding})[0],
                                  expected),
              1e-12);
  }
}

TEST_F(TransformerTest, StacksStartFromCopiesAndRunTheLayersInTurn) {
  TransformerEncoderLayer layer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16));
  TransformerEncoder encoder(layer, 3, std::make_shared<LayerNorm>(std::vector<int64_t>{8}));
  EXPECT_EQ(encoder.num_layers(), 3);
  const std::vector<std::string> names = Names(encoder);
  EXPECT_EQ(names.size(), 3 * 12 + 2u);
  EXPECT_EQ(names.front(), "layers.0.self_attn.in_proj_weight");
  EXPECT_EQ(names[12], "layers.1.self_attn.in_proj_weight");
  EXPECT_EQ(names.back(), "norm.bias");
  // Every layer starts as a copy of `layer`: equal values, own storage.
  for (size_t i = 0; i < 3; ++i) {
    const Tensor w = encoder.layer(i)->linear1()->weight();
    EXPECT_EQ(testing::MaxAbsDiff(w, layer.linear1()->weight()), 0.0);
    EXPECT_FALSE(w.shares_storage_with(layer.linear1()->weight()));
  }
  const std::string printed = encoder.ToString();
  EXPECT_THAT(printed, StartsWith("TransformerEncoder(\n  (layers): ModuleList(\n"
                                  "    (0): TransformerEncoderLayer(\n"
                                  "      (self_attn): MultiheadAttention(\n"));
  EXPECT_THAT(printed, HasSubstr("    (2): TransformerEncoderLayer(\n"));
  EXPECT_THAT(printed, HasSubstr("  )\n  (norm): LayerNorm((8,), eps=1e-05, "
                                 "elementwise_affine=True)\n)"));

  encoder.to(kFloat64);
  Randomise(encoder);  // layers now differ
  encoder.eval();
  const Tensor src = Randn64({5, 2, 8});
  const Tensor padding = from_vector(std::vector<bool>(10, false), {2, 5});
  Tensor expected = src;
  for (size_t i = 0; i < 3; ++i) {
    expected = EncoderLayerRef(*encoder.layer(i), expected, CausalBoolMask(5), padding);
  }
  expected = LayerNormRef(encoder, "norm", expected);
  EXPECT_LT(testing::MaxAbsDiff(encoder.forward(src, CausalBoolMask(5), padding), expected), 1e-12);
  EXPECT_LT(
      testing::MaxAbsDiff(encoder.forward(src, Tensor(), padding, /*is_causal=*/true), expected),
      1e-12);

  TransformerDecoderLayer dec_layer(TransformerDecoderLayerOptions(8, 2).dim_feedforward(16));
  TransformerDecoder decoder(dec_layer, 2);
  EXPECT_EQ(decoder.norm(), nullptr);
  decoder.to(kFloat64);
  Randomise(decoder);
  decoder.eval();
  const Tensor tgt = Randn64({3, 2, 8});
  Tensor expected_tgt = tgt;
  for (size_t i = 0; i < 2; ++i) {
    expected_tgt =
        DecoderLayerRef(*decoder.layer(i), expected_tgt, src, CausalBoolMask(3), Tensor());
  }
  EXPECT_LT(testing::MaxAbsDiff(decoder.forward(tgt, src, CausalBoolMask(3)), expected_tgt), 1e-12);
}

// ---- Gradients -------------------------------------------------------------------------

void ExpectModuleGradients(Module& module,
                           const std::function<Tensor(const std::vector<Tensor>&)>& forward,
                           std::vector<Tensor> inputs) {
  module.to(kFloat64);
  const std::vector<NamedTensor> params = module.named_parameters();
  const size_t n = inputs.size();
  for (const NamedTensor& p : params) inputs.push_back(p.value.detach().clone());
  for (Tensor& t : inputs) t.set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        for (size_t i = 0; i < params.size(); ++i) {
          module.replace_parameter(params[i].name, in[n + i]);
        }
        return forward(std::vector<Tensor>(in.begin(), in.begin() + n));
      },
      inputs);
  for (const NamedTensor& p : params) module.replace_parameter(p.name, p.value);
}

TEST_F(TransformerTest, GradientsMatchFiniteDifferences) {
  // gelu: no kink inside a finite difference.
  TransformerEncoderLayer encoder(
      TransformerEncoderLayerOptions(4, 2).dim_feedforward(6).dropout(0.0).activation("gelu"));
  encoder.to(kFloat64);
  Randomise(encoder);
  const Tensor padding =
      from_vector(std::vector<bool>{false, false, true, false, false, false}, {2, 3});
  ExpectModuleGradients(encoder,
                        [&](const std::vector<Tensor>& in) {
                          return encoder.forward(in[0], Tensor(), padding, true);
                        },
                        {Randn64({3, 2, 4})});
  TransformerDecoderLayer decoder(TransformerDecoderLayerOptions(4, 2)
                                      .dim_feedforward(6)
                                      .dropout(0.0)
                                      .activation("gelu")
                                      .norm_first(true)
                                      .batch_first(true));
  decoder.to(kFloat64);
  Randomise(decoder);
  ExpectModuleGradients(decoder,
                        [&](const std::vector<Tensor>& in) {
                          return decoder.forward(in[0], in[1], Tensor(), Tensor(), Tensor(),
                                                 Tensor(), true);
                        },
                        {Randn64({2, 3, 4}), Randn64({2, 2, 4})});
}

// ---- Modes and devices -----------------------------------------------------------------

TEST_F(TransformerTest, EvalDisablesDropout) {
  TransformerEncoderLayer layer(
      TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.5));
  TransformerEncoder encoder(layer, 2);
  const Tensor src = randn({4, 2, 8});
  const Tensor first = encoder.forward(src);
  EXPECT_GT(testing::MaxAbsDiff(first, encoder.forward(src)), 1e-3);  // new masks each time
  encoder.eval();
  for (const Module* m : static_cast<const Module&>(encoder).modules()) {
    EXPECT_FALSE(m->is_training());
  }
  const Tensor evaluated = encoder.forward(src);
  EXPECT_EQ(testing::MaxAbsDiff(evaluated, encoder.forward(src)), 0.0);
  EXPECT_GT(testing::MaxAbsDiff(first, evaluated), 1e-3);
}

TEST_F(TransformerTest, ClonesOntoAnotherDevice) {
  TransformerDecoderLayer layer(TransformerDecoderLayerOptions(8, 2).dim_feedforward(16));
  TransformerDecoder decoder(layer, 2, std::make_shared<LayerNorm>(std::vector<int64_t>{8}));
  Randomise(decoder);
  decoder.eval();
  const Tensor tgt = randn({3, 2, 8}), memory = randn({4, 2, 8});
  const Tensor expected =
      decoder.forward(tgt, memory, Tensor(), Tensor(), Tensor(), Tensor(), true);
  std::shared_ptr<Module> copy = decoder.clone(Device::Cpu(1));
  auto typed = std::dynamic_pointer_cast<TransformerDecoder>(copy);
  ASSERT_NE(typed, nullptr);
  EXPECT_EQ(copy->ToString(), decoder.ToString());
  EXPECT_EQ(Names(*copy), Names(decoder));
  EXPECT_FALSE(copy->is_training());
  for (const Tensor& p : copy->parameters()) EXPECT_EQ(p.device(), Device::Cpu(1));
  const Tensor out = typed->forward(tgt.to(Device::Cpu(1)), memory.to(Device::Cpu(1)), Tensor(),
                                    Tensor(), Tensor(), Tensor(), true);
  EXPECT_EQ(out.device(), Device::Cpu(1));
  EXPECT_LT(testing::MaxAbsDiff(out.to(Device::Cpu(0)), expected), 1e-5);
  // The generic entry point of an encoder stack (DataParallel's), on a replica.
  TransformerEncoder encoder(TransformerEncoderLayer(8, 2), 2);
  encoder.eval();
  Module::TensorBindings bindings;
  for (const Tensor& p : encoder.parameters()) bindings.emplace(p.impl(), p.to(Device::Cpu(1)));
  std::shared_ptr<Module> replica = encoder.replicate_structure(bindings);
  const Tensor y = replica->forward_tensors({tgt.to(Device::Cpu(1))})[0];
  EXPECT_LT(testing::MaxAbsDiff(y.to(Device::Cpu(0)), encoder.forward(tgt)), 1e-5);
  y.sum().backward();
  for (const Tensor& p : encoder.parameters()) ASSERT_TRUE(p.grad().defined());
}

TEST_F(TransformerTest, RunsOnCudaAsOnTheCpu) {
  TANDEM_SKIP_WITHOUT_CUDA();
  TransformerEncoderLayer layer(
      TransformerEncoderLayerOptions(16, 4).dim_feedforward(32).batch_first(true).norm_first(true));
  TransformerEncoder encoder(layer, 2, std::make_shared<LayerNorm>(std::vector<int64_t>{16}));
  Randomise(encoder);
  encoder.eval();
  const Tensor x = randn({3, 7, 16});
  const Tensor padding = from_vector(std::vector<bool>(21, false), {3, 7});
  std::shared_ptr<Module> on_gpu = encoder.clone(Device::Cuda(0));
  auto typed = std::dynamic_pointer_cast<TransformerEncoder>(on_gpu);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    const Tensor expected = encoder.forward(x, Tensor(), padding, causal);
    const Tensor out =
        typed->forward(x.to(Device::Cuda(0)), Tensor(), padding.to(Device::Cuda(0)), causal);
    EXPECT_EQ(out.device(), Device::Cuda(0));
    EXPECT_LT(testing::MaxAbsDiff(out.to(Device::Cpu(0)), expected), 1e-4);
  }
}

}  // namespace
}  // namespace tandem::nn
