// The checks behind AnomalyMode (tensor/core/anomaly_mode.h), called by the autograd recording
// side (RecordOp) and the engine only when AnomalyMode::IsEnabled(). Not for users.
//
//   if (AnomalyMode::IsEnabled()) internal::CheckForwardAnomaly(*node, inputs, {output});
#ifndef TANDEM_TENSOR_CORE_INTERNAL_ANOMALY_H_
#define TANDEM_TENSOR_CORE_INTERNAL_ANOMALY_H_

#include <vector>

#include "tensor/core/autograd.h"
#include "tensor/core/tensor.h"

namespace tandem::internal {

// Throws tandem::Error if a float32 output of the op recorded as `node` holds a NaN or an
// inf, naming the node and saying whether its inputs were already non-finite.
void CheckForwardAnomaly(const Node& node, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& outputs);

// Throws tandem::Error if a gradient that `node` returned (for its input i) holds a NaN or
// an inf, naming the node and the input and saying whether the gradients it received were
// already non-finite.
void CheckBackwardAnomaly(const Node& node, const std::vector<Tensor>& grad_outputs,
                          const std::vector<Tensor>& grad_inputs);

}  // namespace tandem::internal

#endif  // TANDEM_TENSOR_CORE_INTERNAL_ANOMALY_H_
