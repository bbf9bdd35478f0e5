#include "parallel/sync_batch_norm.h"

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/layers.h"
#include "parallel/parallel_apply.h"
#include "tensor/core/autograd.h"

namespace tandem::parallel {
namespace {

// A backstop for replicas whose code diverged in a way no replica can see (one replica's
// output left out of the loss, so its backward never reaches the meeting): every other
// failure releases the waiters at once.
constexpr auto kMeetingTimeout = std::chrono::minutes(5);
constexpr auto kPollInterval = std::chrono::milliseconds(20);

thread_local std::shared_ptr<ReplicaGroup> t_group;
thread_local size_t t_replica = 0;

template <typename Norm>
bool Synchronize(nn::Module* module) {
  auto* norm = dynamic_cast<Norm*>(module);
  if (norm == nullptr) return false;
  TANDEM_CHECK(!norm->synchronized(), "ConvertSyncBatchNorm: ", norm->ToString(),
               " is already synchronized (over a process group: "
               "distributed::ConvertSyncBatchNorm); a layer sums over the replicas of one "
               "process or over the ranks of a group, not both. Convert it once.");
  norm->set_cross_replica_sum(SumOverReplicas);
  return true;
}

}  // namespace

int ConvertSyncBatchNorm(nn::Module& module) {
  int converted = 0;
  for (nn::Module* m : module.modules()) {
    if (Synchronize<nn::BatchNorm2d>(m) || Synchronize<nn::BatchNorm1d>(m)) ++converted;
  }
  return converted;
}

ReplicaGroup::ReplicaGroup(size_t replicas)
    : replicas_(replicas), calls_(replicas, 0), left_(replicas, false) {
  TANDEM_CHECK(replicas > 0, "ReplicaGroup: expected at least one replica");
}

void ReplicaGroup::Abort(size_t replica, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_.empty()) aborted_ = "replica " + std::to_string(replica) + " failed: " + why;
  changed_.notify_all();
}

void ReplicaGroup::Leave(size_t replica) {
  std::lock_guard<std::mutex> lock(mutex_);
  left_[replica] = true;
  changed_.notify_all();
}

Tensor ReplicaGroup::Meet(std::map<uint64_t, Meeting>& meetings, uint64_t key, size_t replica,
                          const Tensor& part, const char* phase) {
  const bool in_backward = InBackwardPass();
  std::shared_ptr<const std::vector<Tensor>> parts;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    Meeting& meeting = meetings[key];
    if (meeting.parts.empty()) meeting.parts.resize(replicas_);
    TANDEM_CHECK(!meeting.parts[replica].defined(), "synchronized BatchNorm: replica ", replica,
                 " reached the ", phase, " meeting of sum ", key,
                 " twice in one round; run one forward (or backward) at a time per "
                 "DataParallel");
    meeting.parts[replica] = part;
    const uint64_t generation = meeting.generation;
    if (++meeting.arrived == replicas_) {
      meeting.published = std::make_shared<const std::vector<Tensor>>(std::move(meeting.parts));
      meeting.parts.assign(replicas_, Tensor());
      meeting.arrived = 0;
      ++meeting.generation;
      changed_.notify_all();
    }
    const auto deadline = std::chrono::steady_clock::now() + kMeetingTimeout;
    while (meeting.generation == generation) {
      if (!aborted_.empty()) {
        throw PeerReplicaFailed(internal::Concat("synchronized BatchNorm: the ", phase,
                                                 " statistics of sum ", key,
                                                 " cannot be computed because ", aborted_));
      }
      if (!in_backward) {
        for (size_t r = 0; r < replicas_; ++r) {
          TANDEM_CHECK(!left_[r] || calls_[r] > key, "synchronized BatchNorm: replica ", replica,
                       " waits in sum ", key, " of its forward, but replica ", r,
                       " finished its forward after ", calls_[r],
                       " synchronized sums; every replica must call the synchronized layers "
                       "the same number of times, in the same order");
        }
      }
      if (in_backward && BackwardPassFailed()) {
        throw PeerReplicaFailed(internal::Concat(
            "synchronized BatchNorm: replica ", replica, " left the backward meeting of sum ", key,
            " because another node of this backward pass failed"));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        std::string missing;
        for (size_t r = 0; r < replicas_; ++r) {
          if (!meeting.parts[r].defined())
            missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        TANDEM_CHECK(false, "synchronized BatchNorm: replica ", replica, " waited ",
                     std::chrono::duration_cast<std::chrono::seconds>(kMeetingTimeout).count(),
                     " s in the ", phase, " meeting of sum ", key, " for replica(s) ", missing,
                     "; every replica must run the synchronized layers in the same order, and "
                     "every replica's output must reach the loss");
      }
      changed_.wait_for(lock, kPollInterval);
    }
    parts = meeting.published;
  }
  // Each replica adds the same parts in the same order: the same bits on every replica.
  const Device device = part.device();
  Tensor total;
  for (const Tensor& p : *parts) {
    const Tensor here = p.device() == device ? p : p.to(device);
    total = total.defined() ? total + here : here.clone();
  }
  return total;
}

Tensor ReplicaGroup::Sum(size_t replica, const Tensor& partial) {
  TANDEM_CHECK(replica < replicas_, "ReplicaGroup::Sum: replica ", replica, " of a group of ",
               replicas_);
  TANDEM_CHECK(partial.defined(), "ReplicaGroup::Sum: replica ", replica,
               " passed an undefined tensor");
  uint64_t key;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    key = calls_[replica]++;
  }
  Tensor out;
  {
    NoGradGuard no_grad;
    out = Meet(forward_, key, replica, partial.detach(), "forward");
  }
  if (NeedsGrad({partial})) {
    // The node keeps the group alive for as long as the graph lives.
    std::shared_ptr<ReplicaGroup> self = t_group;
    TANDEM_CHECK(self.get() == this,
                 "ReplicaGroup::Sum: a differentiable sum must run inside a ReplicaScope of its "
                 "group (the backward meeting outlives the forward)");
    const Shape shape = partial.shape();
    const TensorOptions options = TensorOptions().dtype(partial.dtype()).device(partial.device());
    RecordOp("SumOverReplicasBackward", {partial}, out,
             [self, key, replica, shape, options](const Tensor& grad) {
               const Tensor g = grad.defined() ? grad : zeros(shape, options);
               return std::vector<Tensor>{self->Meet(self->backward_, key, replica, g, "backward")};
             });
  }
  return out;
}

ReplicaScope::ReplicaScope(std::shared_ptr<ReplicaGroup> group, size_t replica)
    : group_(std::move(group)),
      replica_(replica),
      uncaught_at_entry_(std::uncaught_exceptions()),
      previous_group_(std::move(t_group)),
      previous_replica_(t_replica) {
  t_group = group_;
  t_replica = replica;
}

ReplicaScope::~ReplicaScope() {
  if (group_ != nullptr) {
    if (std::uncaught_exceptions() > uncaught_at_entry_) {
      group_->Abort(replica_, "it threw during its forward (DataParallel reports the error)");
    } else {
      group_->Leave(replica_);
    }
  }
  t_group = std::move(previous_group_);
  t_replica = previous_replica_;
}

Tensor SumOverReplicas(const Tensor& partial) {
  if (t_group == nullptr || t_group->size() == 1) return partial;
  return t_group->Sum(t_replica, partial);
}

}  // namespace tandem::parallel
