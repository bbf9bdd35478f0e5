// Trains an MLP with DataParallel on two logical CPU devices and prints how it went.
//   bazel run //:train_mlp
#include <cstdio>

#include "quadrants.h"
#include "tensor/tensor.h"  // tandem::SetCpuDeviceCount, Device

int main() {
  tandem::SetCpuDeviceCount(2);  // cpu:0 and cpu:1, each with half the cores
  const consumer::TrainResult result =
      consumer::TrainQuadrants({tandem::Device::Cpu(0), tandem::Device::Cpu(1)}, 20, 7);
  std::printf("loss %.4f -> %.4f, test accuracy %.3f, last batch split %lld + %lld\n",
              result.first_loss, result.last_epoch_loss, result.test_accuracy,
              static_cast<long long>(result.last_chunk_sizes.at(0)),
              static_cast<long long>(result.last_chunk_sizes.at(1)));
  return result.test_accuracy > 0.9 ? 0 : 1;
}
