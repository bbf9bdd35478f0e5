// DistributedDataParallel: PyTorch's torch.nn.parallel.DistributedDataParallel in C++. One
// process per device (started by mpirun), each holding a full copy of the model and training
// on its own share of the data (data::DistributedSampler); after backward every rank holds
// the average of all ranks' gradients, so the optimizers take the same step everywhere.
//
//   auto group = std::make_shared<parallel::distributed::ProcessGroupMpi>();
//   auto model = std::make_shared<nn::Sequential>(nn::Linear(784, 256), nn::ReLU(),
//                                                 nn::Linear(256, 10));
//   auto ddp = std::make_shared<parallel::distributed::DistributedDataParallel>(model, group);
//   nn::SGD optimizer(model->parameters(), nn::SGDOptions(0.1));
//   Tensor loss = cross_entropy(ddp->forward(x), y);   // x, y: this rank's batch
//   optimizer.zero_grad();
//   loss.backward();      // gradients averaged over the ranks when this returns
//   optimizer.step();
//
//   $ mpirun -np 2 ./train
//
// What it does, as PyTorch does:
// - Construction (collective) checks that every rank holds the same parameters and buffers
//   (names, shapes, dtypes, in order; the error names the first difference and the ranks),
//   then copies rank 0's values to every rank.
// - Gradients are all-reduced (averaged) in buckets of about bucket_cap_mb (default 25 MB),
//   filled in reverse registration order (roughly the order backward produces them; the
//   first bucket holds 1 MiB at most, as in PyTorch, so that reduction starts early). Each
//   bucket holds one dtype and is reduced in it, as PyTorch's: a float64 model is averaged in
//   float64, a bfloat16 one in bfloat16 (2 bytes a gradient), and parameters of different
//   dtypes fill separate buckets (each dtype its own sequence, its first one 1 MiB). A
//   bucket is launched on the process group's thread the moment its last gradient has been
//   accumulated (a gradient-accumulated hook), so communication overlaps the rest of
//   backward; buckets launch in index order on every rank. At the end of backward (an engine
//   callback) the pass waits for every bucket and writes the averages into .grad.
// - no_sync() (a guard) skips the reduction: gradients accumulate locally and the first
//   backward after it reduces the sum, for gradient accumulation over micro-batches.
// - A parameter that got no gradient in a backward pass is an error at the end of that
//   pass, naming it, unless find_unused_parameters: then each forward finds the parameters
//   its outputs do not depend on and marks them ready at once (a parameter unused on every
//   rank keeps its .grad untouched). The walk sees inside nn::checkpoint regions: their
//   forward records then which parameters they use (nn::RecordCheckpointedParameters), where
//   PyTorch's reentrant checkpoint would hide them and fail.
// - register_comm_hook(state, hook) (before the first forward) replaces the all-reduce of each
//   bucket with the hook (comm_hooks.h: all-reduce, fp16/bf16 compression, PowerSGD in
//   powersgd_hook.h, or one's own). The hook starts its collectives when the bucket is ready;
//   DDP waits for its result at the end of backward and writes it into .grad.
// - gradient_compression(kBFloat16) is shorthand for bf16_compress_hook (kFloat16:
//   fp16_compress_hook): each bucket is rounded to that dtype, the all-reduce moves half the
//   bytes of float32, and its average is written back into the bucket's dtype (.grad's). Over
//   ProcessGroupMpi the sum is taken in float32 and rounded once (each rank adds its block of
//   every rank's bucket); NCCL adds in float32 but rounds the partial sums of its ring at every
//   hop. Expect bfloat16's precision: about 3 significant digits (float16: about 4, and
//   gradients beyond 65504 become inf: use GradScaler's scale small enough, or bfloat16).
// - A parameter whose gradient arrives twice in one backward (the same layer checkpointed
//   twice with reentrant checkpointing, a node that runs a backward of its own) is an error,
//   PyTorch's "Expected to mark a variable ready only once", unless static_graph: then the
//   first iteration counts how many times each gradient arrives (and reduces only at its
//   end), and later iterations reduce a parameter once its count is reached: the sum of its
//   parts, averaged over the ranks.
// - gradient_as_bucket_view(true) makes each .grad a view of its place in the bucket: the
//   average is written there by the all-reduce itself, and the gradient tensors that backward
//   made are freed once copied in (a gradient's bytes a parameter less between steps).
// - Construction checks that every rank passed the same options (they decide the buckets
//   and the collectives each backward runs): ranks that disagree all throw, naming them.
// - In training mode each forward first broadcasts rank 0's buffers (broadcast_buffers,
//   default on), e.g. BatchNorm's running statistics. In eval mode, or with grad mode off,
//   forward is the module's alone (no collective): rank 0 may evaluate by itself.
// Parameters must stay the same tensors (move the module to its device before wrapping it).
#ifndef TANDEM_PARALLEL_DISTRIBUTED_DISTRIBUTED_DATA_PARALLEL_H_
#define TANDEM_PARALLEL_DISTRIBUTED_DISTRIBUTED_DATA_PARALLEL_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "nn/module.h"
#include "parallel/distributed/comm_hooks.h"
#include "parallel/distributed/no_sync_guard.h"
#include "parallel/distributed/process_group.h"
#include "tensor/base/arg.h"
#include "tensor/base/error.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {

struct DistributedDataParallelOptions {
  // MiB of gradients per all-reduce bucket (the first of each dtype: 1 MiB).
  TANDEM_ARG(double, bucket_cap_mb) = 25.0;
  TANDEM_ARG(bool, find_unused_parameters) = false;
  TANDEM_ARG(bool, broadcast_buffers) = true;
  // All-reduce the gradient buckets in this dtype instead of their parameters' dtype:
  // kBFloat16 or kFloat16 (nullopt, the default: the parameters' dtype). .grad keeps the
  // parameters' dtype. Shorthand for registering
  // bf16_compress_hook or fp16_compress_hook (comm_hooks.h); not with register_comm_hook.
  //   DistributedDataParallelOptions().gradient_compression(kBFloat16)
  TANDEM_ARG(std::optional<DType>, gradient_compression) = std::nullopt;
  // PyTorch's gradient_as_bucket_view: each parameter's .grad becomes a view of its place in
  // the bucket once its gradient is copied there, so the average lands in .grad without a copy
  // back and the separate gradient tensors are freed: a rank holds one gradient copy less
  // between steps (4P bytes for P float32 parameters).
  TANDEM_ARG(bool, gradient_as_bucket_view) = false;
  // PyTorch's static_graph: the set of parameters used, and how many times each gradient
  // arrives in a backward, are the same every iteration (learned in the first, which reduces
  // only at its end). Needed when a gradient arrives more than once in a backward. The
  // parameters the first iteration did not use count as unused in every iteration (no need for
  // find_unused_parameters).
  TANDEM_ARG(bool, static_graph) = false;
};

// What the last reduced backward pass spent on communication (for benchmarks).
struct ReductionStats {
  int buckets = 0;
  // The buckets' all-reduce time on the process group's thread, summed.
  double communication_seconds = 0;
  // How long the end of backward waited for them: the part not hidden behind backward, and
  // the time this rank's slower peers took to finish their backward.
  double wait_seconds = 0;
  // When this rank's backward had produced every gradient and began to wait, and when the
  // last bucket was reduced (steady_clock: on one machine comparable across processes, so
  // that reduced - the latest rank's backward_done is the communication no backward hid).
  std::chrono::steady_clock::time_point backward_done;
  std::chrono::steady_clock::time_point reduced;
  // 1 - wait / communication (0 when nothing was hidden, 1 when all of it was).
  double overlap_fraction() const;
};

class DistributedDataParallel : public nn::Module {
 public:
  // Collective: every rank of `process_group` constructs it with the same model. Throws
  // (on every rank alike) for different models, and for parameters on several devices.
  DistributedDataParallel(std::shared_ptr<nn::Module> module,
                          std::shared_ptr<ProcessGroup> process_group,
                          DistributedDataParallelOptions options = {});
  ~DistributedDataParallel() override;

  // The module's first output (forward_tensors for all of them).
  template <typename... Rest,
            typename = std::enable_if_t<(std::is_convertible_v<const Rest&, const Tensor&> && ...)>>
  Tensor forward(const Tensor& input, const Rest&... rest) {
    return forward_tensors({input, rest...}).at(0);
  }
  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override;

  // Reduces each bucket with `hook(*state, bucket)` instead of the plain all-reduce
  // (comm_hooks.h). Once, before the first forward, on every rank alike, and not with
  // options().gradient_compression() (itself a hook).
  //   ddp.register_comm_hook(group, fp16_compress_hook);
  template <typename State, typename Hook>
  void register_comm_hook(std::shared_ptr<State> state, Hook hook) {
    TANDEM_CHECK(state != nullptr,
                 "register_comm_hook: the state is null (pass the process "
                 "group for the stock hooks)");
    RegisterCommHook(CommHook([state, hook](GradBucket& bucket) { return hook(*state, bucket); }));
  }

  // While the guard lives, forwards do not prepare a reduction (no_sync_guard.h).
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(&require_sync_); }

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return process_group_; }
  const DistributedDataParallelOptions& options() const { return options_; }
  // The parameter names in each bucket, bucket 0 (reduced first) first.
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  ReductionStats last_reduction_stats() const;

 private:
  friend class Join;
  struct Reducer;
  void RegisterCommHook(CommHook hook);
  // Copies rank 0's buffers to every rank (when BroadcastsBuffers).
  void SyncBuffers();
  // Whether a training forward broadcasts rank 0's buffers.
  bool BroadcastsBuffers() const;
  // Join: one iteration of the other ranks' collectives, on a rank out of data.
  void ShadowIteration(bool reduces, bool broadcasts_buffers);

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> process_group_;
  DistributedDataParallelOptions options_;
  std::shared_ptr<Reducer> reducer_;  // the hooks hold it weakly
  bool require_sync_ = true;
  bool join_mode_ = false;  // parallel/distributed/join.h
  bool hook_registered_ = false;
  bool forwarded_ = false;
};

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_DISTRIBUTED_DATA_PARALLEL_H_
