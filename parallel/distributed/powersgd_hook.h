// PowerSGD gradient compression for DistributedDataParallel (Vogels et al., NeurIPS 2019;
// PyTorch's powerSGD_hook): each gradient matrix M (n x m, a parameter's gradient viewed as
// its first dimension by the rest) is sent as two thin factors, M ~= P Q^T with P n x r and
// Q m x r, r = matrix_approximation_rank: (n + m) r numbers instead of n m. Per bucket:
// P = M Q, all-reduce P, orthogonalize P (Gram-Schmidt), Q = M^T P, all-reduce (average) Q,
// M = P Q^T. Tensors of one dimension (biases, LayerNorms) and matrices too small to gain
// min_compression_rate are all-reduced uncompressed, together in one batch. Error feedback
// adds what compression lost in a bucket to the same bucket's next gradients; warm start
// begins each iteration's power step from the last iteration's Q. Q starts from a generator
// seeded with random_seed, so it is the same on every rank. The first start_powerSGD_iter
// iterations all-reduce plainly (PyTorch's advice: compress after the warm-up of training).
// It works in its bucket's dtype (DDP's buckets hold their parameters' dtype): P, Q and the
// error of a float64 bucket are float64, of a bfloat16 one bfloat16 (bfloat16's precision).
//
//   auto state = std::make_shared<PowerSGDState>(
//       group, PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(10));
//   ddp->register_comm_hook(state, powersgd_hook);
#ifndef TANDEM_PARALLEL_DISTRIBUTED_POWERSGD_HOOK_H_
#define TANDEM_PARALLEL_DISTRIBUTED_POWERSGD_HOOK_H_

#include <cstdint>
#include <map>
#include <memory>

#include "parallel/distributed/comm_hooks.h"
#include "parallel/distributed/process_group.h"
#include "tensor/base/arg.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {

struct PowerSGDOptions {
  TANDEM_ARG(int64_t, matrix_approximation_rank) = 1;
  // Iterations (backward passes) all-reduced uncompressed before compression starts.
  TANDEM_ARG(int64_t, start_powerSGD_iter) = 1000;
  // A matrix is compressed only when n m > (n + m) r min_compression_rate.
  TANDEM_ARG(double, min_compression_rate) = 2.0;
  TANDEM_ARG(bool, use_error_feedback) = true;
  TANDEM_ARG(bool, warm_start) = true;
  // Added to the norm in Gram-Schmidt (0: a zero column stays zero).
  TANDEM_ARG(double, orthogonalization_epsilon) = 0.0;
  TANDEM_ARG(uint64_t, random_seed) = 0;
};

// The hook's state across iterations: the iteration count, each bucket's error and P, Q.
class PowerSGDState {
 public:
  PowerSGDState(std::shared_ptr<ProcessGroup> group, PowerSGDOptions options = {});

  const PowerSGDOptions& options() const { return options_; }
  ProcessGroup& group() const { return *group_; }
  // Backward passes seen so far (counted at each last bucket).
  int64_t iteration() const { return iteration_; }
  // What compression left out of bucket `index`'s last reduced gradients (undefined before
  // compression began, or without error feedback).
  Tensor error(int index) const;
  // Gradient elements seen and elements all-reduced since compression began (their ratio is
  // the compression rate).
  int64_t numel_before_compression() const { return numel_before_; }
  int64_t numel_after_compression() const { return numel_after_; }

 private:
  friend std::shared_ptr<CommFuture> powersgd_hook(PowerSGDState& state, GradBucket& bucket);
  struct BucketState {
    Tensor error;     // error feedback
    Tensor p_memory;  // every compressed matrix's P, flat
    Tensor q_memory;  // and Q
  };

  std::shared_ptr<ProcessGroup> group_;
  PowerSGDOptions options_;
  Generator generator_;  // Q's initialisation, the same on every rank
  int64_t iteration_ = 0;
  int64_t numel_before_ = 0;
  int64_t numel_after_ = 0;
  std::map<int, BucketState> buckets_;
};

std::shared_ptr<CommFuture> powersgd_hook(PowerSGDState& state, GradBucket& bucket);

// Orthonormalizes the columns of the n x r matrix `m` in place (Gram-Schmidt); a column whose
// norm is zero stays zero unless `epsilon` > 0.
void OrthogonalizeColumns(Tensor& m, double epsilon = 0.0);

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_POWERSGD_HOOK_H_
