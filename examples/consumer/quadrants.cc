#include "quadrants.h"

#include <cmath>
#include <random>

#include "data/data.h"
#include "parallel/data_parallel.h"

namespace consumer {

using tandem::Tensor;
namespace data = tandem::data;
namespace nn = tandem::nn;

Points MakeQuadrants(int64_t n, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<float> coordinate(-1.0f, 1.0f);
  std::vector<float> xy;
  std::vector<int64_t> labels;
  while (static_cast<int64_t>(labels.size()) < n) {
    const float x = coordinate(engine), y = coordinate(engine);
    if (std::abs(x) < 0.1f || std::abs(y) < 0.1f) continue;
    xy.push_back(x);
    xy.push_back(y);
    labels.push_back((x > 0 ? 1 : 0) + (y > 0 ? 2 : 0));
  }
  return {tandem::from_vector(xy, {n, 2}), tandem::from_vector(labels, {n})};
}

std::shared_ptr<nn::Sequential> MakeMlp() {
  return std::make_shared<nn::Sequential>(nn::Linear(2, 32), nn::ReLU(), nn::Linear(32, 4));
}

double Accuracy(nn::Module& model, const Points& points) {
  tandem::NoGradGuard no_grad;
  Tensor predictions = tandem::argmax(model.forward_tensors({points.xy})[0], 1);
  return tandem::eq(predictions, points.labels).to(tandem::kFloat32).mean().item();
}

TrainResult TrainQuadrants(const std::vector<tandem::Device>& devices, int epochs, uint64_t seed) {
  tandem::manual_seed(seed);  // the initial weights and the shuffling
  TrainResult result;
  result.model = MakeMlp();
  result.model->to(devices.at(0));
  auto dp = std::make_shared<tandem::parallel::DataParallel>(result.model, devices);

  const Points train = MakeQuadrants(2048, seed);
  data::DataLoader loader(data::TensorDataset({train.xy, train.labels}),
                          data::DataLoaderOptions().batch_size(128).shuffle(true));
  nn::SGD optimizer(result.model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
  nn::CrossEntropyLoss criterion;

  for (int epoch = 0; epoch < epochs; ++epoch) {
    double sum = 0;
    int batches = 0;
    for (data::Batch& batch : loader) {
      Tensor loss = dp->forward_loss(criterion, batch.data(), batch.target());
      optimizer.zero_grad();
      loss.backward();  // every replica's gradients, summed into result.model's
      optimizer.step();
      const double value = loss.item();
      if (epoch == 0 && batches == 0) result.first_loss = value;
      sum += value;
      ++batches;
    }
    result.last_epoch_loss = sum / batches;
  }
  result.last_chunk_sizes = dp->last_chunk_sizes();
  result.test_accuracy = Accuracy(*result.model, MakeQuadrants(1024, seed + 1));
  return result;
}

}  // namespace consumer
