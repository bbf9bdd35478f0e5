// Tandem's tensor library in one header: the Tensor handle with its factories, random numbers
// and autograd (tensor/core/), every operation (tensor/ops/), devices and dtypes
// (tensor/base/) and the device runtime's configuration (tensor/runtime/devices.h). Depend on
// //tensor and include this; the layers under it are described in README.md ("Architecture").
//
//   #include "tensor/tensor.h"
//   using namespace tandem;
//   Tensor w = randn({784, 10}, TensorOptions().requires_grad(true));
//   Tensor loss = matmul(rand({32, 784}), w).relu().sum();
//   loss.backward();   // w.grad() now holds d loss / d w
#ifndef TANDEM_TENSOR_TENSOR_H_
#define TANDEM_TENSOR_TENSOR_H_

#include "tensor/base/autocast_mode.h"  // IWYU pragma: export
#include "tensor/base/device.h"         // IWYU pragma: export
#include "tensor/base/dtype.h"          // IWYU pragma: export
#include "tensor/base/error.h"          // IWYU pragma: export
#include "tensor/base/grad_mode.h"      // IWYU pragma: export
#include "tensor/core/tensor.h"         // IWYU pragma: export
#include "tensor/ops/attention.h"       // IWYU pragma: export
#include "tensor/ops/autocast.h"        // IWYU pragma: export
#include "tensor/ops/ops.h"             // IWYU pragma: export
#include "tensor/runtime/devices.h"     // IWYU pragma: export

#endif  // TANDEM_TENSOR_TENSOR_H_
