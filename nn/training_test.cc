// End to end: a small MLP learns a synthetic problem that no linear model can solve.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "nn/nn.h"
#include "nn/test_util.h"

namespace tandem::nn {
namespace {

struct Dataset {
  Tensor points;  // [N, 2]
  Tensor labels;  // int64 [N]
};

// Points in [-1, 1]^2 labelled by quadrant (0..3), keeping a margin of 0.1 around the axes
// so the classes are separable. Opposite quadrants share no half-plane: a hidden layer is
// needed.
Dataset Quadrants(int64_t n, Generator& gen) {
  std::vector<float> xy;
  std::vector<int64_t> labels;
  while (static_cast<int64_t>(labels.size()) < n) {
    const std::vector<float> candidates = uniform({256, 2}, -1.0, 1.0, {}, &gen).to_vector<float>();
    for (size_t i = 0; i + 1 < candidates.size() && static_cast<int64_t>(labels.size()) < n;
         i += 2) {
      const float x = candidates[i], y = candidates[i + 1];
      if (std::abs(x) < 0.1f || std::abs(y) < 0.1f) continue;
      xy.push_back(x);
      xy.push_back(y);
      labels.push_back((x > 0 ? 1 : 0) + (y > 0 ? 2 : 0));
    }
  }
  return {from_vector(xy, {n, 2}), from_vector(labels, {n}, kInt64)};
}

double Accuracy(Module& model, const Dataset& data) {
  NoGradGuard no_grad;
  model.eval();
  Tensor predictions = argmax(model.forward_tensors({data.points})[0], 1);
  model.train();
  return eq(predictions, data.labels).to(kFloat32).mean().item();
}

void TrainAndExpectAccuracy(Optimizer& optimizer, Module& model, Generator& gen) {
  const Dataset train = Quadrants(2048, gen), test = Quadrants(1024, gen);
  CrossEntropyLoss criterion;
  const int64_t batch = 128;
  double first_loss = 0.0, last_loss = 0.0;
  const std::vector<float> all_points = train.points.to_vector<float>();
  const std::vector<int64_t> all_labels = train.labels.to_vector<int64_t>();
  for (int epoch = 0; epoch < 30; ++epoch) {
    Tensor order = randperm(2048, &gen);
    const std::vector<int64_t> index = order.to_vector<int64_t>();
    for (int64_t start = 0; start < 2048; start += batch) {
      // Gather a shuffled batch on the host (the tensor library has no index_select).
      std::vector<float> xs;
      std::vector<int64_t> ys;
      for (int64_t i = start; i < start + batch; ++i) {
        xs.push_back(all_points[2 * index[i]]);
        xs.push_back(all_points[2 * index[i] + 1]);
        ys.push_back(all_labels[index[i]]);
      }
      optimizer.zero_grad();
      Tensor loss = criterion.forward(model.forward_tensors({from_vector(xs, {batch, 2})})[0],
                                      from_vector(ys, {batch}, kInt64));
      loss.backward();
      optimizer.step();
      if (epoch == 0 && start == 0) first_loss = loss.item();
      last_loss = loss.item();
    }
  }
  EXPECT_LT(last_loss, first_loss / 4);
  EXPECT_GT(Accuracy(model, train), 0.95);
  EXPECT_GT(Accuracy(model, test), 0.95);
}

TEST(TrainingTest, MlpWithSgdLearnsQuadrants) {
  manual_seed(1);
  Generator gen(2);
  Sequential model(Linear(2, 32), ReLU(), Linear(32, 4));
  SGD optimizer(model.parameters(), SGDOptions(0.1).momentum(0.9));
  TrainAndExpectAccuracy(optimizer, model, gen);
}

TEST(TrainingTest, MlpWithAdamAndDropoutLearnsQuadrants) {
  manual_seed(3);
  Generator gen(4);
  Sequential model(Linear(2, 64), ReLU(), Dropout(0.1, 5), Linear(64, 4));
  Adam optimizer(model.parameters(), AdamOptions(0.01));
  TrainAndExpectAccuracy(optimizer, model, gen);
}

}  // namespace
}  // namespace tandem::nn
