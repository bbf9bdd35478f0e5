#include "parallel/distributed/powersgd_hook.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "tensor/base/error.h"

namespace tandem::parallel::distributed {
namespace {

// One gradient that is compressed: its matrix view and its P and Q (views of the bucket's
// memories).
struct Compressed {
  Tensor matrix, p, q;
};

}  // namespace

PowerSGDState::PowerSGDState(std::shared_ptr<ProcessGroup> group, PowerSGDOptions options)
    : group_(std::move(group)), options_(options), generator_(options.random_seed()) {
  TANDEM_CHECK(group_ != nullptr, "PowerSGDState: the process group is null");
  TANDEM_CHECK(options_.matrix_approximation_rank() >= 1,
               "PowerSGDState: matrix_approximation_rank must be at least 1 but is ",
               options_.matrix_approximation_rank());
  TANDEM_CHECK(options_.start_powerSGD_iter() >= 0,
               "PowerSGDState: start_powerSGD_iter must be at least 0 but is ",
               options_.start_powerSGD_iter());
  TANDEM_CHECK(options_.min_compression_rate() >= 0 && options_.orthogonalization_epsilon() >= 0,
               "PowerSGDState: min_compression_rate and orthogonalization_epsilon must not be "
               "negative but are ",
               options_.min_compression_rate(), " and ", options_.orthogonalization_epsilon());
  // Error feedback begins with the compression; PyTorch recommends plain all-reduce first.
}

Tensor PowerSGDState::error(int index) const {
  auto it = buckets_.find(index);
  return it == buckets_.end() ? Tensor() : it->second.error;
}

void OrthogonalizeColumns(Tensor& m, double epsilon) {
  NoGradGuard no_grad;
  const int64_t columns = m.shape()[1];
  for (int64_t i = 0; i < columns; ++i) {
    Tensor column = m.narrow(1, i, 1);
    const double norm = std::sqrt(sum(mul(column, column)).item());
    if (norm + epsilon > 0) column.mul_(1.0 / (norm + epsilon));
    if (i + 1 < columns) {
      Tensor rest = m.narrow(1, i + 1, columns - i - 1);
      // rest -= column (column^T rest): removes each later column's part along this one.
      rest.sub_(matmul(column, sum(mul(column, rest), {0}, /*keepdim=*/true)));
    }
  }
}

std::shared_ptr<CommFuture> powersgd_hook(PowerSGDState& state, GradBucket& bucket) {
  NoGradGuard no_grad;
  ProcessGroup& group = *state.group_;
  const PowerSGDOptions& o = state.options_;
  Tensor buffer = bucket.buffer();
  if (state.iteration_ < o.start_powerSGD_iter()) {
    if (bucket.is_last()) ++state.iteration_;
    return allreduce_hook(group, bucket);
  }
  PowerSGDState::BucketState& saved = state.buckets_[bucket.index()];
  Tensor before;  // the gradients to send, error included, before compression
  if (o.use_error_feedback()) {
    if (saved.error.defined()) {
      TANDEM_CHECK(saved.error.numel() == buffer.numel(), "powersgd_hook: bucket ", bucket.index(),
                   " holds ", buffer.numel(), " elements but held ", saved.error.numel(),
                   " last iteration; one PowerSGDState serves one DistributedDataParallel");
      buffer.add_(saved.error);
    }
    before = buffer.clone();
  }

  // Which gradients to compress: matrices that gain min_compression_rate at this rank.
  const std::vector<Tensor> grads = bucket.gradients();
  std::vector<Compressed> compressed;
  std::vector<Tensor> uncompressed;
  int64_t p_numel = 0, q_numel = 0;
  for (const Tensor& grad : grads) {
    const int64_t n = grad.dim() >= 1 ? grad.shape()[0] : 1;
    const int64_t m = n == 0 ? 0 : grad.numel() / n;
    const int64_t rank = std::min({n, m, o.matrix_approximation_rank()});
    const bool compress =
        grad.dim() > 1 &&
        static_cast<double>(n * m) > static_cast<double>((n + m) * rank) * o.min_compression_rate();
    state.numel_before_ += grad.numel();
    if (compress) {
      compressed.push_back(Compressed{grad.view({n, m}), Tensor(), Tensor()});
      p_numel += n * rank;
      q_numel += m * rank;
      state.numel_after_ += (n + m) * rank;
    } else {
      uncompressed.push_back(grad);
      state.numel_after_ += grad.numel();
    }
  }

  // P and Q memories, kept across iterations (Q: the warm start).
  const TensorOptions like = TensorOptions(buffer.dtype()).device(buffer.device());
  const bool fresh_q =
      !o.warm_start() || !saved.q_memory.defined() || saved.q_memory.numel() != q_numel;
  if (!saved.p_memory.defined() || saved.p_memory.numel() != p_numel) {
    saved.p_memory = zeros({p_numel}, like);
  }
  if (fresh_q) saved.q_memory = zeros({q_numel}, like);
  int64_t p_at = 0, q_at = 0;
  for (Compressed& c : compressed) {
    const int64_t n = c.matrix.shape()[0], m = c.matrix.shape()[1];
    const int64_t rank = std::min({n, m, o.matrix_approximation_rank()});
    c.p = saved.p_memory.narrow(0, p_at, n * rank).view({n, rank});
    c.q = saved.q_memory.narrow(0, q_at, m * rank).view({m, rank});
    p_at += n * rank;
    q_at += m * rank;
    if (fresh_q) {
      c.q.copy_(randn({m, rank}, TensorOptions(buffer.dtype()), &state.generator_));
      OrthogonalizeColumns(c.q, o.orthogonalization_epsilon());
    }
    c.p.copy_(matmul(c.matrix, c.q));
  }

  // Both all-reduces start now, so that they overlap the rest of backward: the uncompressed
  // tensors batched into one (average), and every P (sum: it is orthogonalized next).
  std::shared_ptr<CommFuture> plain;
  Tensor batch;
  if (!uncompressed.empty()) {
    std::vector<Tensor> flats;
    for (const Tensor& t : uncompressed) flats.push_back(t.reshape({-1}));
    batch = cat(flats);
    plain = CommFuture::FromWork(group.allreduce(batch, ReduceOp::kAverage), batch);
  }
  std::shared_ptr<CommFuture> ps =
      p_numel > 0
          ? CommFuture::FromWork(group.allreduce(saved.p_memory, ReduceOp::kSum), saved.p_memory)
          : CommFuture::Ready(saved.p_memory);

  ProcessGroup* group_ptr = &group;
  PowerSGDState* state_ptr = &state;
  const int index = bucket.index();
  const bool is_last = bucket.is_last();
  return ps
      ->ThenAsync([compressed, group_ptr, state_ptr, index](Tensor) mutable {
        NoGradGuard no_grad;
        PowerSGDState::BucketState& s = state_ptr->buckets_[index];
        for (Compressed& c : compressed) {
          OrthogonalizeColumns(c.p, state_ptr->options_.orthogonalization_epsilon());
          c.q.copy_(matmul(c.matrix.t(), c.p));
        }
        if (s.q_memory.numel() == 0) return CommFuture::Ready(s.q_memory);
        return CommFuture::FromWork(group_ptr->allreduce(s.q_memory, ReduceOp::kAverage),
                                    s.q_memory);
      })
      ->Then([compressed, uncompressed, plain, batch, before, buffer, state_ptr, index,
              is_last](Tensor) mutable {
        NoGradGuard no_grad;
        for (Compressed& c : compressed) c.matrix.copy_(matmul(c.p, c.q.t()));
        if (plain) {
          plain->wait();
          int64_t at = 0;
          for (Tensor& t : uncompressed) {
            t.copy_(batch.narrow(0, at, t.numel()).view(t.shape()));
            at += t.numel();
          }
        }
        PowerSGDState::BucketState& s = state_ptr->buckets_[index];
        if (before.defined()) s.error = before - buffer;
        if (!state_ptr->options_.warm_start()) {
          s.p_memory = Tensor();
          s.q_memory = Tensor();
        }
        if (is_last) ++state_ptr->iteration_;
        return buffer;
      });
}

}  // namespace tandem::parallel::distributed
