#include "parallel/distributed/comm_hooks.h"

#include <utility>

#include "tensor/base/error.h"

namespace tandem::parallel::distributed {

std::shared_ptr<CommFuture> CommFuture::Ready(Tensor value) {
  return std::shared_ptr<CommFuture>(
      new CommFuture([value](std::vector<std::shared_ptr<Work>>&) { return value; }));
}

std::shared_ptr<CommFuture> CommFuture::FromWork(std::shared_ptr<Work> work, Tensor value) {
  TANDEM_CHECK(work != nullptr, "CommFuture::FromWork: the work is null");
  return std::shared_ptr<CommFuture>(
      new CommFuture([work, value](std::vector<std::shared_ptr<Work>>& works) {
        works.push_back(work);
        work->wait();
        return value;
      }));
}

std::shared_ptr<CommFuture> CommFuture::Then(std::function<Tensor(Tensor)> fn) {
  TANDEM_CHECK(fn != nullptr, "CommFuture::Then: the function is null");
  return ThenAsync([fn = std::move(fn)](Tensor value) { return Ready(fn(std::move(value))); });
}

std::shared_ptr<CommFuture> CommFuture::ThenAsync(
    std::function<std::shared_ptr<CommFuture>(Tensor)> fn) {
  TANDEM_CHECK(fn != nullptr, "CommFuture::ThenAsync: the function is null");
  std::shared_ptr<CommFuture> parent = shared_from_this();
  return std::shared_ptr<CommFuture>(
      new CommFuture([parent, fn = std::move(fn)](std::vector<std::shared_ptr<Work>>& works) {
        const auto collect = [&works](const CommFuture& future) {
          std::lock_guard<std::mutex> lock(future.mutex_);
          works.insert(works.end(), future.works_.begin(), future.works_.end());
        };
        Tensor value = parent->wait();
        collect(*parent);
        std::shared_ptr<CommFuture> next = fn(std::move(value));
        TANDEM_CHECK(next != nullptr, "CommFuture::ThenAsync: the function returned a null future");
        value = next->wait();
        collect(*next);
        return value;
      }));
}

Tensor CommFuture::wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_) {
    Resolve resolve = std::move(resolve_);
    resolve_ = nullptr;
    done_ = true;
    try {
      value_ = resolve(works_);
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  if (error_) std::rethrow_exception(error_);
  return value_;
}

std::chrono::steady_clock::duration CommFuture::communication_time() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::chrono::steady_clock::duration total{0};
  for (const std::shared_ptr<Work>& work : works_) total += work->run_time();
  return total;
}

std::vector<Tensor> GradBucket::gradients() const {
  std::vector<Tensor> grads;
  grads.reserve(parameters_.size());
  for (size_t i = 0; i < parameters_.size(); ++i) {
    grads.push_back(
        buffer_.narrow(0, offsets_[i], parameters_[i].numel()).view(parameters_[i].shape()));
  }
  return grads;
}

std::shared_ptr<CommFuture> allreduce_hook(ProcessGroup& group, GradBucket& bucket) {
  return CommFuture::FromWork(group.allreduce(bucket.buffer(), ReduceOp::kAverage),
                              bucket.buffer());
}

std::shared_ptr<CommFuture> CompressHook(DType dtype, ProcessGroup& group, GradBucket& bucket) {
  TANDEM_CHECK(dtype == kFloat16 || dtype == kBFloat16,
               "a compression hook all-reduces in float16 or bfloat16, not ", DTypeName(dtype));
  // A bucket in the dtype already (a bfloat16 model's) has nothing to compress.
  if (bucket.buffer().dtype() == dtype) return allreduce_hook(group, bucket);
  NoGradGuard no_grad;
  Tensor compressed = bucket.buffer().to(dtype);
  // The average is converted back into the bucket's own buffer (no new tensor; under
  // gradient_as_bucket_view that is .grad already).
  return CommFuture::FromWork(group.allreduce(compressed, ReduceOp::kAverage), compressed)
      ->Then([buffer = bucket.buffer()](Tensor reduced) mutable {
        NoGradGuard no_grad;
        buffer.copy_(reduced);
        return buffer;
      });
}

std::shared_ptr<CommFuture> fp16_compress_hook(ProcessGroup& group, GradBucket& bucket) {
  return CompressHook(kFloat16, group, bucket);
}

std::shared_ptr<CommFuture> bf16_compress_hook(ProcessGroup& group, GradBucket& bucket) {
  return CompressHook(kBFloat16, group, bucket);
}

}  // namespace tandem::parallel::distributed
