// The optimizers, as torch.optim: nn::SGD (nn/sgd.h), nn::Adam and nn::AdamW (nn/adam.h),
// nn::RMSprop (nn/rmsprop.h), on the base of nn/optimizer.h (parameter groups, state dicts).
// Include this for all of them, or the one header you use.
//
//   #include "nn/optim.h"
//   nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1).momentum(0.9));
#ifndef TANDEM_NN_OPTIM_H_
#define TANDEM_NN_OPTIM_H_

#include "nn/adam.h"       // IWYU pragma: export
#include "nn/optimizer.h"  // IWYU pragma: export
#include "nn/rmsprop.h"    // IWYU pragma: export
#include "nn/sgd.h"        // IWYU pragma: export

#endif  // TANDEM_NN_OPTIM_H_
