// Communication hooks for DistributedDataParallel (PyTorch's DDP comm hooks): how a bucket of
// gradients is reduced across the ranks. DDP calls the hook the moment a bucket's gradients are
// all in place (so communication overlaps the rest of backward); the hook starts its
// collectives and returns a CommFuture whose value is the bucket's averaged gradients, which
// DDP writes into .grad at the end of backward. Use a stock hook to all-reduce in a 16-bit
// dtype or compress with PowerSGD (powersgd_hook.h), or write one:
//
//   ddp->register_comm_hook(group, bf16_compress_hook);
//   // A hook of one's own: state (here a process group) and a function of (state, bucket).
//   ddp->register_comm_hook(group, [](ProcessGroup& g, GradBucket& bucket) {
//     return CommFuture::FromWork(g.allreduce(bucket.buffer(), ReduceOp::kAverage),
//                                 bucket.buffer());
//   });
//
// Every rank must register the same hook: the collectives a hook runs are matched across
// ranks by their order.
#ifndef TANDEM_PARALLEL_DISTRIBUTED_COMM_HOOKS_H_
#define TANDEM_PARALLEL_DISTRIBUTED_COMM_HOOKS_H_

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "parallel/distributed/process_group.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {

// A tensor that becomes final once the collectives it waits on have finished and the work
// chained on them (Then) has run (PyTorch's torch.futures.Future of a comm hook). Chained work
// runs on the thread that waits, when it waits: DDP waits for the buckets in index order at
// the end of backward, the same order on every rank, so collectives a continuation issues
// (PowerSGD's second all-reduce) are matched across ranks. Thread-safe.
class CommFuture : public std::enable_shared_from_this<CommFuture> {
 public:
  // A future that is ready at once.
  static std::shared_ptr<CommFuture> Ready(Tensor value);
  // `value` once `work` has finished (the collective writes into it).
  static std::shared_ptr<CommFuture> FromWork(std::shared_ptr<Work> work, Tensor value);

  // A future of fn(this future's value).
  std::shared_ptr<CommFuture> Then(std::function<Tensor(Tensor)> fn);
  // A future of fn(value)'s value: fn may start further collectives.
  std::shared_ptr<CommFuture> ThenAsync(std::function<std::shared_ptr<CommFuture>(Tensor)> fn);

  // Blocks until the value is final and returns it; throws what a collective or a
  // continuation threw (every later wait throws it again).
  Tensor wait();
  // The run time of the collectives waited on so far (after wait(): all of them).
  std::chrono::steady_clock::duration communication_time() const;

 private:
  // Computes the value, adding the works it waited on to `works`.
  using Resolve = std::function<Tensor(std::vector<std::shared_ptr<Work>>& works)>;
  explicit CommFuture(Resolve resolve) : resolve_(std::move(resolve)) {}

  mutable std::mutex mutex_;
  Resolve resolve_;  // cleared once run
  bool done_ = false;
  Tensor value_;
  std::exception_ptr error_;
  std::vector<std::shared_ptr<Work>> works_;  // waited on, this future's and its parents'
};

// One bucket of gradients handed to a hook (PyTorch's dist.GradBucket).
class GradBucket {
 public:
  GradBucket(int index, bool is_last, Tensor buffer, std::vector<Tensor> parameters,
             std::vector<int64_t> offsets)
      : index_(index),
        is_last_(is_last),
        buffer_(std::move(buffer)),
        parameters_(std::move(parameters)),
        offsets_(std::move(offsets)) {}

  // 0 for the first bucket reduced (the last parameters registered).
  int index() const { return index_; }
  // Whether this is the last bucket of the backward pass (PowerSGD counts iterations by it).
  bool is_last() const { return is_last_; }
  // The bucket's gradients, flat and contiguous, in the parameters' dtype. A hook may reduce
  // it in place and return it.
  const Tensor& buffer() const { return buffer_; }
  // The parameters whose gradients the buffer holds, and where each begins (in elements).
  const std::vector<Tensor>& parameters() const { return parameters_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  // Each parameter's gradient: a view of the buffer in the parameter's shape.
  std::vector<Tensor> gradients() const;

 private:
  int index_;
  bool is_last_;
  Tensor buffer_;
  std::vector<Tensor> parameters_;
  std::vector<int64_t> offsets_;
};

// What DDP calls per bucket. The future's value must have the buffer's shape, dtype and device.
using CommHook = std::function<std::shared_ptr<CommFuture>(GradBucket&)>;

// The stock hooks; their state is the process group to reduce over.
// All-reduces the buffer (average): what DDP does without a hook, bit for bit.
std::shared_ptr<CommFuture> allreduce_hook(ProcessGroup& group, GradBucket& bucket);
// All-reduce (average) in float16, the result converted back to the buffer's dtype (the
// parameters': float32, float64, ...): half float32's bytes; about 4 significant digits, and
// values beyond 65504 become inf. A bucket already in float16 is all-reduced as it is.
std::shared_ptr<CommFuture> fp16_compress_hook(ProcessGroup& group, GradBucket& bucket);
// The same in bfloat16: float32's range, about 3 significant digits.
std::shared_ptr<CommFuture> bf16_compress_hook(ProcessGroup& group, GradBucket& bucket);
// The two above by dtype (kFloat16 or kBFloat16).
std::shared_ptr<CommFuture> CompressHook(DType dtype, ProcessGroup& group, GradBucket& bucket);

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_COMM_HOOKS_H_
