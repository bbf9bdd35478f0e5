#include "examples/gpt.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "parallel/data_parallel.h"
#include "tensor/gradcheck.h"
#include "tensor/testing.h"

namespace tandem::examples {
namespace {

using ::testing::HasSubstr;

GptConfig Tiny() {
  return GptConfig().vocab_size(11).block_size(8).n_layer(2).n_head(2).n_embd(8).dropout(0.0);
}

Tensor Tokens(const std::vector<int64_t>& values, int64_t batch) {
  return from_vector(values, {batch, static_cast<int64_t>(values.size()) / batch});
}

TEST(GptTest, ShapesAndNames) {
  manual_seed(1);
  Gpt model(Tiny());
  const Tensor logits = model.forward(Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 2));
  // The vocabulary of 11 padded to 64 (GptConfig::vocab_multiple).
  EXPECT_EQ(logits.shape(), (Shape{2, 5, 64}));
  const Tensor loss = model.loss(logits, Tokens({2, 3, 4, 5, 6, 7, 8, 9, 10, 0}, 2));
  EXPECT_EQ(loss.dim(), 0);
  // A fresh model predicts nearly uniformly: the loss is close to log(vocab).
  EXPECT_NEAR(loss.item<float>(), std::log(11.0), 0.1);
  std::vector<std::string> names;
  for (const auto& named : model.named_parameters()) names.push_back(named.name);
  EXPECT_THAT(names, ::testing::Contains("h.1.attn.c_attn.weight"));
  EXPECT_THAT(names, ::testing::Contains("h.0.mlp.c_proj.bias"));
  EXPECT_THAT(names, ::testing::Contains("ln_f.weight"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains(HasSubstr("lm_head"))));
  EXPECT_EQ(model.parameter("h.0.attn.c_attn.weight").shape(), (Shape{24, 8}));
}

// Builds a model without drawing its weights, as clone() does before copying values in: a
// 124M model's 124M normal draws take tens of seconds in an unoptimised build.
struct UndrawnModel : nn::Module {
  static std::shared_ptr<Gpt> Build(const GptConfig& config) {
    CloningScope skip_draws;
    return std::make_shared<Gpt>(config);
  }
};

TEST(GptTest, Gpt2PresetHasGpt2sParameterCount) {
  const GptConfig config = GptConfig::Gpt2();
  EXPECT_EQ(config.vocab_size(), 50257);
  EXPECT_EQ(config.block_size(), 1024);
  const std::shared_ptr<Gpt> model = UndrawnModel::Build(config);
  // GPT-2's 124,439,808 and wte's 47 padded rows of 768 (nanoGPT's 50304-token figure).
  EXPECT_EQ(config.padded_vocab_size(), 50304);
  EXPECT_EQ(model->num_parameters(), 124439808 + 47 * 768);
  EXPECT_EQ(UndrawnModel::Build(GptConfig::Gpt2().vocab_multiple(1))->num_parameters(), 124439808);
}

TEST(GptTest, SmallPresetIsByteLevel) {
  Gpt model(GptConfig::Small());
  EXPECT_EQ(model.config().vocab_size(), 256);
  EXPECT_LT(model.num_parameters(), 2000000);
  EXPECT_GT(model.num_parameters(), 500000);
}

TEST(GptTest, Gpt2Initialisation) {
  manual_seed(3);
  const GptConfig config = Tiny().n_embd(64).n_head(4).n_layer(8).vocab_size(300);
  Gpt model(config);
  const auto std_of = [](const Tensor& t) {
    return std::sqrt(mean(square(t - mean(t))).item<float>());
  };
  EXPECT_NEAR(std_of(model.wte_weight()), 0.02, 0.002);
  EXPECT_NEAR(std_of(model.parameter("h.0.attn.c_attn.weight")), 0.02, 0.002);
  EXPECT_NEAR(std_of(model.parameter("h.3.mlp.c_fc.weight")), 0.02, 0.002);
  const double residual = 0.02 / std::sqrt(16.0);
  EXPECT_NEAR(std_of(model.parameter("h.5.mlp.c_proj.weight")), residual, residual * 0.1);
  EXPECT_NEAR(std_of(model.parameter("h.5.attn.c_proj.weight")), residual, residual * 0.1);
  EXPECT_EQ(sum(abs(model.parameter("h.2.attn.c_attn.bias"))).item<float>(), 0.0f);
  EXPECT_EQ(sum(model.parameter("ln_f.weight")).item<float>(), 64.0f);
}

// wte is both the embedding and the head: its gradient must carry both contributions. The
// finite differences see every path from wte to the logits; rows of tokens that are absent
// from the input get only the head's part.
TEST(GptTest, TiedHeadGradientMatchesFiniteDifferences) {
  manual_seed(4);
  Gpt model(Tiny());
  model.to(kFloat64);
  const Tensor tokens = Tokens({1, 2, 3, 2, 7, 0}, 2);
  const Tensor wte = model.wte_weight().detach().clone().set_requires_grad(true);
  EXPECT_GRADIENTS_MATCH(
      [&](const std::vector<Tensor>& in) {
        model.replace_parameter("wte.weight", in[0]);
        // The padded logits are a constant -inf, which finite differences cannot take.
        return model.forward(tokens).narrow(2, 0, 11);
      },
      {wte});
}

TEST(GptTest, LaterTokensDoNotChangeEarlierLogits) {
  manual_seed(5);
  Gpt model(Tiny());
  const Tensor a = model.forward(Tokens({1, 2, 3, 4, 5, 6}, 1));
  const Tensor b = model.forward(Tokens({1, 2, 3, 9, 9, 9}, 1));
  EXPECT_TRUE(allclose(a.narrow(1, 0, 3), b.narrow(1, 0, 3), 0, 0));
  EXPECT_FALSE(allclose(a.narrow(1, 3, 1), b.narrow(1, 3, 1)));
}

TEST(GptTest, DropoutOnlyInTraining) {
  manual_seed(11);
  Gpt model(Tiny().dropout(0.5));
  const Tensor tokens = Tokens({1, 2, 3, 4}, 1);
  EXPECT_FALSE(allclose(model.forward(tokens), model.forward(tokens)));
  model.eval();
  EXPECT_TRUE(allclose(model.forward(tokens), model.forward(tokens), 0, 0));
}

TEST(GptTest, CloneOnAnotherDeviceGivesTheSameLogits) {
  manual_seed(6);
  auto model = std::make_shared<Gpt>(Tiny());
  const Tensor tokens = Tokens({3, 1, 4, 1, 5, 9, 2, 6}, 2);
  const auto copy = std::dynamic_pointer_cast<Gpt>(model->clone(Device::Cpu(1)));
  ASSERT_NE(copy, nullptr);
  const Tensor there = copy->forward(tokens.to(Device::Cpu(1)));
  EXPECT_EQ(there.device(), Device::Cpu(1));
  EXPECT_TRUE(allclose(there.to(Device::Cpu(0)), model->forward(tokens), 1e-6, 1e-6));
}

// DataParallel replicas (clones whose wte lookups and tied heads send their gradients back
// through the broadcast) give the single-device loss and gradients.
TEST(GptTest, DataParallelOverTwoDevicesMatchesOneDevice) {
  manual_seed(12);
  auto model = std::make_shared<Gpt>(Tiny());
  const Tensor tokens = Tokens({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, 4);
  const Tensor targets = Tokens({1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9}, 4);
  const Tensor single = model->loss(model->forward(tokens), targets);
  single.backward();
  std::vector<Tensor> expected;
  for (const Tensor& p : model->parameters()) expected.push_back(p.grad().clone());
  model->zero_grad();
  parallel::DataParallel dp(model, {Device::Cpu(0), Device::Cpu(1)});
  GptLoss criterion;
  const Tensor loss = dp.forward_loss(criterion, tokens, targets);
  EXPECT_NEAR(loss.item<float>(), single.item<float>(), 1e-5);
  loss.backward();
  const std::vector<Tensor> params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(allclose(params[i].grad(), expected[i], 1e-4, 1e-6)) << i;
  }
}

// The gradients of one step with dropout, each block checkpointed or not (same seeds), on one
// device or through DataParallel over two.
std::vector<Tensor> StepGradients(bool checkpointed, bool data_parallel) {
  manual_seed(21);
  auto model = std::make_shared<Gpt>(Tiny().dropout(0.2).checkpoint_activations(checkpointed));
  const Tensor tokens = Tokens({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, 4);
  const Tensor targets = Tokens({1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9}, 4);
  manual_seed(22);
  if (data_parallel) {
    parallel::DataParallel dp(model, {Device::Cpu(0), Device::Cpu(1)});
    GptLoss criterion;
    dp.forward_loss(criterion, tokens, targets).backward();
  } else {
    model->loss(model->forward(tokens), targets).backward();
  }
  std::vector<Tensor> grads;
  for (const Tensor& p : model->parameters()) grads.push_back(p.grad());
  return grads;
}

TEST(GptTest, CheckpointedBlocksGiveThePlainGradientsWithDropout) {
  for (bool data_parallel : {false, true}) {
    const std::vector<Tensor> plain = StepGradients(false, data_parallel);
    const std::vector<Tensor> checkpointed = StepGradients(true, data_parallel);
    ASSERT_EQ(plain.size(), checkpointed.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      ASSERT_TRUE(checkpointed[i].defined()) << i;
      EXPECT_EQ(::tandem::testing::MaxAbsDiff(plain[i], checkpointed[i]), 0.0)
          << "parameter " << i << (data_parallel ? " through DataParallel" : "");
    }
  }
}

// The chained form Gpt::forward uses: the block's output left as {stream, mlp} for the next
// norm to add (add_layer_norm), equal to forward of the sum, with the same gradients.
TEST(GptTest, ForwardPendingIsTheBlockOfTheSum) {
  GptBlock block(Tiny());
  Generator gen(5);
  Tensor x = randn({2, 3, 8}, {}, &gen), pending = randn({2, 3, 8}, {}, &gen);
  x.set_requires_grad(true);
  pending.set_requires_grad(true);
  const auto [stream, mlp] = block.forward_pending(x, pending);
  const Tensor chained = stream + mlp;
  const Tensor plain = block.forward(x + pending);
  EXPECT_EQ(::tandem::testing::MaxAbsDiff(chained, plain), 0.0);
  const Tensor weights = randn({2, 3, 8}, {}, &gen);
  const std::vector<Tensor> g_chained = autograd::grad({(chained * weights).sum()}, {x, pending});
  const std::vector<Tensor> g_plain = autograd::grad({(plain * weights).sum()}, {x, pending});
  for (int i = 0; i < 2; ++i) {
    EXPECT_LT(::tandem::testing::MaxAbsDiff(g_chained[i], g_plain[i]), 1e-6) << i;
  }
  // No pending residual: the block itself, split before its last add.
  const auto [alone, alone_mlp] = block.forward_pending(x, Tensor());
  EXPECT_EQ(::tandem::testing::MaxAbsDiff(alone + alone_mlp, block.forward(x)), 0.0);
}

TEST(GptTest, GenerationIsSeededAndCropsTheContext) {
  manual_seed(7);
  Gpt model(Tiny());
  const Tensor prompt = from_vector(std::vector<int64_t>{1, 2, 3}, {3});
  Generator g1(42), g2(42), g3(43);
  const Tensor a = model.Generate(prompt, 12, 1.0, std::nullopt, &g1);  // 15 > block_size 8
  const Tensor b = model.Generate(prompt, 12, 1.0, std::nullopt, &g2);
  const Tensor c = model.Generate(prompt, 12, 1.0, std::nullopt, &g3);
  EXPECT_EQ(a.shape(), (Shape{15}));
  EXPECT_EQ(a.to_vector<int64_t>(), b.to_vector<int64_t>());
  EXPECT_NE(a.to_vector<int64_t>(), c.to_vector<int64_t>());
  const std::vector<int64_t> values = a.to_vector<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(values.begin(), values.begin() + 3),
            (std::vector<int64_t>{1, 2, 3}));
  for (int64_t v : values) EXPECT_TRUE(v >= 0 && v < 11) << v;
  EXPECT_TRUE(model.is_training());  // restored after sampling in evaluation mode
}

TEST(GptTest, GenerationKeepsToTheTopK) {
  manual_seed(8);
  Gpt model(Tiny());
  // Sharper logits than at initialisation, so the top two are a real restriction.
  {
    NoGradGuard no_grad;
    Tensor wte = model.wte_weight();
    wte.copy_(wte * 40.0);
  }
  model.eval();
  Generator gen(9);
  const Tensor out = model.Generate(Tokens({4, 5}, 2), 6, 1.0, 2, &gen);  // [2, 1] prompts
  ASSERT_EQ(out.shape(), (Shape{2, 7}));
  const std::vector<int64_t> values = out.to_vector<int64_t>();
  for (int64_t row = 0; row < 2; ++row) {
    for (int64_t t = 1; t < 7; ++t) {
      const Tensor context = out.narrow(0, row, 1).narrow(1, 0, t);
      const Tensor last = model.forward(context).select(1, t - 1);
      const std::vector<int64_t> top = topk(last, 2, -1).second.to_vector<int64_t>();
      EXPECT_THAT(top, ::testing::Contains(values[row * 7 + t])) << "row " << row << " t " << t;
    }
  }
  // top_k = 1 is greedy decoding.
  Generator any(10);
  const Tensor greedy = model.Generate(Tokens({4}, 1), 5, 1.0, 1, &any);
  const std::vector<int64_t> g = greedy.to_vector<int64_t>();
  for (int64_t t = 1; t < 6; ++t) {
    const Tensor last = model.forward(greedy.narrow(1, 0, t)).select(1, t - 1);
    EXPECT_EQ(g[t], argmax(last, -1).item<int64_t>());
  }
}

TEST(GptTest, Errors) {
  Gpt model(Tiny());
  EXPECT_THAT(testing::ErrorOf([&] {
                model.forward(zeros({1, 9}, TensorOptions(kInt64)));
              }),
              HasSubstr("does not fit the context of 8"));
  EXPECT_THAT(testing::ErrorOf([&] { model.forward(zeros({1, 4})); }), HasSubstr("int64"));
  EXPECT_THAT(testing::ErrorOf([&] {
                model.forward(full({1, 2}, 11, TensorOptions(kInt64)));
              }),
              HasSubstr("out of range"));
  EXPECT_THAT(testing::ErrorOf([&] { Gpt bad(Tiny().n_head(3)); }), HasSubstr("divisible"));
  Generator gen(1);
  const Tensor prompt = zeros({1, 2}, TensorOptions(kInt64));
  EXPECT_THAT(testing::ErrorOf([&] { model.Generate(prompt, 1, 0.0, std::nullopt, &gen); }),
              HasSubstr("temperature"));
  EXPECT_THAT(testing::ErrorOf([&] { model.Generate(prompt, 1, 1.0, 0, &gen); }),
              HasSubstr("top_k"));
}

TEST(GptTest, SavedActivationsCountsBlocksAndLogits) {
  const GptConfig config = GptConfig::Gpt2();
  // 256 tokens: 12 blocks of 256 * (16 * 768 + 4 + 12) floats, then 256 * (2 * 768 + 50304)
  // (the padded vocabulary's logits).
  EXPECT_EQ(GptSavedActivations(config, 4, 64),
            12 * 256 * (16 * 768 + 16) + 256 * (2 * 768 + 50304));
}

// Note [Padded vocabulary]: the padded model is the unpadded one with the same weights, its
// padding never counted: the same loss and the same gradients for every real row, logits
// of -inf in the padding, zero gradients for wte's padded rows; sampling never picks them.
// A model saved before the padding (wte of vocab_size rows) is refused by load_state_dict,
// naming the entry, and loads into a model built with vocab_multiple(1).
TEST(GptTest, PaddedVocabularyIsNeverSampledNorCountedInTheLoss) {
  manual_seed(13);
  Gpt padded(Tiny());
  Gpt plain(Tiny().vocab_multiple(1));
  ASSERT_EQ(padded.wte_weight().size(0), 64);
  ASSERT_EQ(plain.wte_weight().size(0), 11);
  EXPECT_TRUE(allclose(padded.wte_weight().narrow(0, 11, 53), zeros({53, 8}), 0, 0));
  // The unpadded model's weights in the padded one (the padding stays zero).
  const auto state = plain.state_dict();
  EXPECT_THAT(testing::ErrorOf([&] { padded.load_state_dict(state); }), HasSubstr("wte.weight"));
  {
    NoGradGuard no_grad;
    for (const auto& [name, value] : state) {
      Tensor own = padded.parameter(name);
      (name == "wte.weight" ? own.narrow(0, 0, 11) : own).copy_(value);
    }
  }
  const Tensor tokens = Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 2);
  const Tensor targets = Tokens({2, 3, 4, 5, 6, 7, 8, 9, 10, 0}, 2);
  const Tensor logits = padded.forward(tokens);
  const Tensor plain_logits = plain.forward(tokens);
  EXPECT_TRUE(allclose(logits.narrow(2, 0, 11), plain_logits, 1e-6, 1e-6));
  for (float v : logits.narrow(2, 11, 53).contiguous().to_vector<float>()) {
    EXPECT_EQ(v, -std::numeric_limits<float>::infinity());
  }
  const Tensor loss = padded.loss(logits, targets), plain_loss = plain.loss(plain_logits, targets);
  EXPECT_NEAR(loss.item<float>(), plain_loss.item<float>(), 1e-6);
  loss.backward();
  plain_loss.backward();
  for (const auto& [name, value] : plain.named_parameters()) {
    const Tensor grad = padded.parameter(name).grad();
    EXPECT_TRUE(
        allclose(name == "wte.weight" ? grad.narrow(0, 0, 11) : grad, value.grad(), 1e-5, 1e-6))
        << name;
  }
  EXPECT_TRUE(allclose(padded.wte_weight().grad().narrow(0, 11, 53), zeros({53, 8}), 0, 0));
  // Sampling at a high temperature (a flat distribution) never leaves the vocabulary.
  Generator gen(14);
  for (int64_t v :
       padded.Generate(Tokens({1}, 1), 60, 50.0, std::nullopt, &gen).to_vector<int64_t>()) {
    EXPECT_TRUE(v >= 0 && v < 11) << v;
  }
  EXPECT_THAT(testing::ErrorOf([&] { Gpt bad(Tiny().vocab_multiple(0)); }),
              HasSubstr("vocab_multiple must be >= 1"));
}

}  // namespace
}  // namespace tandem::examples
