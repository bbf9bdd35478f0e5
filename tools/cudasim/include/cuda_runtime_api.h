// cudasim: the runtime API lives in cuda_runtime.h (see there).
#ifndef TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_RUNTIME_API_H_
#define TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_RUNTIME_API_H_

#include "cuda_runtime.h"  // NOLINT

#endif  // TANDEM_TOOLS_CUDASIM_INCLUDE_CUDA_RUNTIME_API_H_
