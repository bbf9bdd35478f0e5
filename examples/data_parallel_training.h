// The trainer's default strategy (examples/train_strategy.h): one process, the model on the
// first device, each batch split across every device by parallel::DataParallel. Without
// --devices and --threads on a CPU-only machine the layout follows the model's size
// (parallel::ChooseCpuLayout).
//
//   auto strategy = examples::MakeDataParallelStrategy();
//   examples::RunTraining(config, *strategy, reporter);
#ifndef TANDEM_EXAMPLES_DATA_PARALLEL_TRAINING_H_
#define TANDEM_EXAMPLES_DATA_PARALLEL_TRAINING_H_

#include <memory>

#include "examples/train_strategy.h"

namespace tandem::examples {

std::unique_ptr<TrainStrategy> MakeDataParallelStrategy();

}  // namespace tandem::examples

#endif  // TANDEM_EXAMPLES_DATA_PARALLEL_TRAINING_H_
