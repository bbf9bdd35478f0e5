// A small problem that needs a hidden layer: points in [-1, 1]^2 labelled by quadrant
// (0..3), learnt by an MLP 2-32-4 under parallel::DataParallel, each batch split across
// the given devices.
#ifndef TANDEM_CONSUMER_QUADRANTS_H_
#define TANDEM_CONSUMER_QUADRANTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "nn/nn.h"
#include "tensor/tensor.h"

namespace consumer {

struct Points {
  tandem::Tensor xy;      // float32 [n, 2]
  tandem::Tensor labels;  // int64 [n], the quadrant: (x > 0) + 2 * (y > 0)
};

// `n` points drawn with `seed`, keeping a margin of 0.1 around the axes.
Points MakeQuadrants(int64_t n, uint64_t seed);

// The model: Linear(2, 32), ReLU, Linear(32, 4), on cpu:0.
std::shared_ptr<tandem::nn::Sequential> MakeMlp();

struct TrainResult {
  std::shared_ptr<tandem::nn::Sequential> model;
  double first_loss = 0;                  // of the first batch
  double last_epoch_loss = 0;             // mean over the last epoch's batches
  double test_accuracy = 0;               // on fresh points
  std::vector<int64_t> last_chunk_sizes;  // how DataParallel split the last batch
};

// Trains MakeMlp() for `epochs` epochs over 2048 points in shuffled batches of 128 (a
// DataLoader over a TensorDataset), with DataParallel over `devices` (the first holds the
// model), SGD with momentum and CrossEntropyLoss computed inside the replicas.
TrainResult TrainQuadrants(const std::vector<tandem::Device>& devices, int epochs, uint64_t seed);

// Fraction of `points` the model classifies right.
double Accuracy(tandem::nn::Module& model, const Points& points);

}  // namespace consumer

#endif  // TANDEM_CONSUMER_QUADRANTS_H_
