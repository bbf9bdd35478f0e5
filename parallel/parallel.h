// The parallel package in one include: comm (broadcast, reduce-add, scatter, gather across
// devices), differentiable Scatter/Gather, replicate, parallel_apply, DataParallel and
// synchronized BatchNorm across its replicas.
//
//   #include "parallel/parallel.h"
//   auto dp = std::make_shared<tandem::parallel::DataParallel>(model);  // every device
//   Tensor out = dp->forward(batch);
#ifndef TANDEM_PARALLEL_PARALLEL_H_
#define TANDEM_PARALLEL_PARALLEL_H_

#include "parallel/comm.h"             // IWYU pragma: export
#include "parallel/data_parallel.h"    // IWYU pragma: export
#include "parallel/parallel_apply.h"   // IWYU pragma: export
#include "parallel/replicate.h"        // IWYU pragma: export
#include "parallel/scatter_gather.h"   // IWYU pragma: export
#include "parallel/sync_batch_norm.h"  // IWYU pragma: export

#endif  // TANDEM_PARALLEL_PARALLEL_H_
