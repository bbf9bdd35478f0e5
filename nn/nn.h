// Tandem's neural-network library in one include: Module and Cloneable, the layers,
// Sequential, the losses, the optimizers, learning-rate schedulers, gradient clipping,
// GradScaler, checkpoints, MultiheadAttention and the transformer layers. Depend on //nn.
//
//   #include "nn/nn.h"
//   auto model = std::make_shared<tandem::nn::Sequential>(
//       tandem::nn::Linear(784, 256), tandem::nn::ReLU(), tandem::nn::Linear(256, 10));
//   tandem::nn::SGD optimizer(model->parameters(), tandem::nn::SGDOptions(0.1));
#ifndef TANDEM_NN_NN_H_
#define TANDEM_NN_NN_H_

#include "nn/activation_checkpoint.h"  // IWYU pragma: export
#include "nn/attention.h"              // IWYU pragma: export
#include "nn/checkpoint.h"             // IWYU pragma: export
#include "nn/clip_grad.h"              // IWYU pragma: export
#include "nn/grad_scaler.h"            // IWYU pragma: export
#include "nn/layers.h"                 // IWYU pragma: export
#include "nn/loss.h"                   // IWYU pragma: export
#include "nn/lr_scheduler.h"           // IWYU pragma: export
#include "nn/module.h"                 // IWYU pragma: export
#include "nn/optim.h"                  // IWYU pragma: export
#include "nn/sequential.h"             // IWYU pragma: export
#include "nn/transformer.h"            // IWYU pragma: export

#endif  // TANDEM_NN_NN_H_
