// Dropout: masks and scaling, seeds, one generator per device, reproducibility under
// parallel replicas, gradients.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "nn/layers.h"
#include "nn/layers_test_util.h"
#include "nn/sequential.h"
#include "tensor/base/philox.h"
#include "tensor/runtime/threads.h"

namespace tandem::nn {
namespace {

using testing::ErrorOf;
using testing::ExpectLayerGradients;
using ::testing::HasSubstr;
using testing::LayersTest;

// ---- Dropout ---------------------------------------------------------------------------

TEST_F(LayersTest, DropoutZeroesAndRescalesOnlyInTraining) {
  const double p = 0.3;
  Dropout dropout(p, /*seed=*/42);
  Tensor x = ones({100, 100});
  const std::vector<float> y = dropout.forward(x).to_vector<float>();
  int64_t zeros_seen = 0;
  for (float v : y) {
    if (v == 0.0f) {
      ++zeros_seen;
    } else {
      EXPECT_FLOAT_EQ(v, static_cast<float>(1.0 / (1.0 - p)));
    }
  }
  // 10,000 Bernoulli(0.3) draws: within 5 standard deviations of 3,000.
  EXPECT_NEAR(zeros_seen, 3000, 5 * std::sqrt(10000 * p * (1 - p)));

  dropout.eval();
  EXPECT_EQ(dropout.forward(x).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(dropout.ToString(), "Dropout(p=0.3, inplace=False)");
  EXPECT_THAT(ErrorOf([] { Dropout(1.01); }), HasSubstr("must be in [0, 1] but is 1.01"));
  // p = 1 is accepted, as in PyTorch: all zeros in training, the identity in evaluation.
  Dropout all(1.0);
  EXPECT_EQ(all.ToString(), "Dropout(p=1.0, inplace=False)");
  EXPECT_EQ(all.forward(x).to_vector<float>(), std::vector<float>(x.numel(), 0.0f));
  all.eval();
  EXPECT_EQ(all.forward(x).to_vector<float>(), x.to_vector<float>());
}

TEST_F(LayersTest, DropoutIsSeeded) {
  Dropout a(0.5, 7), b(0.5, 7);
  EXPECT_EQ(a.seed(), 7u);
  Tensor x = randn({8, 8});
  const std::vector<float> first = a.forward(x).to_vector<float>();
  EXPECT_EQ(b.forward(x).to_vector<float>(), first);  // same seed, same mask
  EXPECT_NE(a.forward(x).to_vector<float>(), first);  // the stream moves on
  a.manual_seed(7);
  EXPECT_EQ(a.forward(x).to_vector<float>(), first);  // and restarts
  a.generator()->manual_seed(7);                      // (cpu:0's stream alone, the same here)
  EXPECT_EQ(a.forward(x).to_vector<float>(), first);
  // A clone shares the generators: it continues the streams instead of repeating masks.
  std::shared_ptr<Module> clone = a.clone(Device::Cpu(1));
  EXPECT_EQ(std::dynamic_pointer_cast<Dropout>(clone)->generator(Device::Cpu(1)),
            a.generator(Device::Cpu(1)));
}

// The mask that a generator at `state` draws for n elements, as dropout computes it.
std::vector<float> ExpectedDropout(GeneratorState state, int n, double p) {
  std::vector<float> y(n);
  for (int i = 0; i < n; ++i) {
    y[i] = philox::Uniform(state.seed, state.offset + i) >= p ? static_cast<float>(1.0 / (1.0 - p))
                                                              : 0.0f;
  }
  return y;
}

TEST_F(LayersTest, DropoutDrawsFromOneGeneratorPerDevice) {
  // With a seed: the layer's own generators, device d's stream starting at DeviceOffsetBase(d).
  Dropout seeded(0.5, 21);
  EXPECT_NE(seeded.generator(Device::Cpu(0)), seeded.generator(Device::Cpu(1)));
  EXPECT_NE(seeded.generator(Device::Cpu(1)), &default_generator(Device::Cpu(1)));
  for (int index : {1, 2, 0}) {
    SCOPED_TRACE(index);
    const Device device = Device::Cpu(index);
    EXPECT_EQ(seeded.forward(ones({40}, device)).to_vector<float>(),
              ExpectedDropout({21, DeviceOffsetBase(index)}, 40, 0.5));
  }
  // Without a seed: the default generator of the input's device.
  Dropout plain(0.25);
  EXPECT_EQ(plain.generator(), nullptr);
  EXPECT_EQ(plain.seed(), std::nullopt);
  manual_seed(4);
  EXPECT_EQ(plain.forward(ones({40}, Device::Cpu(2))).to_vector<float>(),
            ExpectedDropout({4, DeviceOffsetBase(2)}, 40, 0.25));
  EXPECT_EQ(default_generator(Device::Cpu(2)).state().offset, DeviceOffsetBase(2) + 40);
  EXPECT_EQ(default_generator(Device::Cpu(1)).state().offset, DeviceOffsetBase(1));
  // manual_seed gives a plain layer generators of its own.
  plain.manual_seed(5);
  EXPECT_EQ(plain.seed(), 5u);
  EXPECT_EQ(plain.forward(ones({40}, Device::Cpu(1))).to_vector<float>(),
            ExpectedDropout({5, DeviceOffsetBase(1)}, 40, 0.25));
  EXPECT_EQ(Dropout(0.0).ToString(), "Dropout(p=0.0, inplace=False)");
}

// A model with both kinds of dropout, replicated over cpu:0..2 as DataParallel does, each
// replica's forward on its device's worker, all at once.
class ParallelDropoutModel {
 public:
  ParallelDropoutModel() {
    seeded_ = std::make_shared<Dropout>(0.3, /*seed=*/9);
    model_ = std::make_shared<Sequential>(Linear(8, 32), ReLU(), Dropout(0.5), Linear(32, 32),
                                          seeded_, Linear(32, 4));
    replicas_ = {model_, model_->clone(Device::Cpu(1)), model_->clone(Device::Cpu(2))};
  }

  // Each replica's output for its chunk of `input` (or for the whole `input` when `same`).
  std::vector<std::vector<float>> Run(const Tensor& input, bool same = false) {
    const std::vector<Tensor> chunks = input.chunk(3);
    std::vector<std::future<std::vector<float>>> futures;
    for (int i = 0; i < 3; ++i) {
      const Device device = Device::Cpu(i);
      Tensor x = (same ? input : chunks[i]).to(device);
      std::shared_ptr<Module> replica = replicas_[i];
      futures.push_back(DeviceWorker::For(device).Submit(
          [replica, x] { return replica->forward_tensors({x})[0].to_vector<float>(); }));
    }
    std::vector<std::vector<float>> outputs;
    for (auto& future : futures) outputs.push_back(future.get());
    return outputs;
  }

  Dropout& seeded() { return *seeded_; }

 private:
  std::shared_ptr<Dropout> seeded_;
  std::shared_ptr<Sequential> model_;
  std::vector<std::shared_ptr<Module>> replicas_;
};

TEST_F(LayersTest, DropoutUnderParallelReplicasIsReproducible) {
  ParallelDropoutModel model;
  Tensor input = randn({12, 8});
  auto run = [&] {
    manual_seed(1);
    model.seeded().manual_seed(9);
    // Several steps per run, so that each device's streams move on between them.
    std::vector<std::vector<float>> outputs = model.Run(input);
    for (const std::vector<float>& more : model.Run(input)) outputs.push_back(more);
    return outputs;
  };
  const std::vector<std::vector<float>> first = run();
  EXPECT_NE(first[0], first[3]);  // the second step drew new masks
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(run(), first);
  }
  // Replicas on different devices draw different masks for the same input.
  manual_seed(1);
  const std::vector<std::vector<float>> same = model.Run(input.narrow(0, 0, 4), /*same=*/true);
  EXPECT_NE(same[0], same[1]);
  EXPECT_NE(same[1], same[2]);
  EXPECT_NE(same[0], same[2]);
}

TEST_F(LayersTest, DropoutGradients) {
  Dropout dropout(0.4, 3);
  ExpectLayerGradients(
      dropout,
      [&](const Tensor& x) {
        dropout.generator()->manual_seed(3);  // the same mask at every evaluation
        return dropout.forward(x);
      },
      randn({4, 5}));
}

}  // namespace
}  // namespace tandem::nn
