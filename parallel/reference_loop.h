// A perfectly parallel reference loop for scaling benchmarks: independent multiply-add
// chains in registers, split evenly over devices, the first device's share on the calling
// thread and the others' on their workers, the threads a DataParallel step uses
// (parallel_apply runs the first CPU replica on the caller). What it gains from a second
// thread is the most any data-parallel step can gain on the same machine in the same run,
// so speed-ups are reported as a ratio to it (parallel_benchmark, distributed_benchmark,
// tools/bench/train_step). It lives in //parallel, beside the step whose threads it mirrors,
// so that benchmarks depend on the library and never the reverse.
//
//   const int64_t reps = parallel::CalibratedReps(0.01);        // about 10 ms on one thread
//   parallel::ReferenceLoop({Device::Cpu(0)}, reps);             // time this ...
//   parallel::ReferenceLoop({Device::Cpu(0), Device::Cpu(1)}, reps);  // ... against this
#ifndef TANDEM_PARALLEL_REFERENCE_LOOP_H_
#define TANDEM_PARALLEL_REFERENCE_LOOP_H_

#include <cstdint>
#include <vector>

#include "tensor/base/device.h"

namespace tandem::parallel {

// `reps` steps of 16 independent multiply-add chains; touches no shared memory. The result
// also goes to a volatile sink, so no call can be dropped or moved out of a timed region.
float ReferenceKernel(int64_t reps, float seed);

// `reps` kernel steps split evenly over `devices`: the first share on the calling thread
// (unless it is another device's worker), the rest on the devices' workers; waits for all.
float ReferenceLoop(const std::vector<Device>& devices, int64_t reps);

// Kernel steps that take about `seconds` on one thread: the fastest of a few probes of at
// least 20 ms, so that a busy moment does not inflate the estimate.
int64_t CalibratedReps(double seconds);

}  // namespace tandem::parallel

#endif  // TANDEM_PARALLEL_REFERENCE_LOOP_H_
