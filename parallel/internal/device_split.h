// Internal to //parallel: runs the pieces of one job on several devices' workers at once
// (tensor/internal/device_split.h, shared with the optimizers' fused updates in //nn).
#ifndef TANDEM_PARALLEL_INTERNAL_DEVICE_SPLIT_H_
#define TANDEM_PARALLEL_INTERNAL_DEVICE_SPLIT_H_

#include "tensor/internal/device_split.h"

namespace tandem::parallel::internal {

using ::tandem::internal::RunAcrossDevices;

}  // namespace tandem::parallel::internal

#endif  // TANDEM_PARALLEL_INTERNAL_DEVICE_SPLIT_H_
