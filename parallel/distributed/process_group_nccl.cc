#include "parallel/distributed/process_group_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "parallel/distributed/internal/hang_diagnosis.h"
#include "parallel/internal/nccl_types.h"
#include "tensor/base/error.h"
#include "tensor/cuda/cuda.h"
#include "tensor/runtime/profiler.h"
#include "tensor/runtime/stream.h"
#include "tensor/tensor.h"

namespace tandem::parallel::distributed {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t NcclType(DType dtype) {
  return ::tandem::parallel::internal::NcclType(dtype, "ProcessGroupNccl");
}

std::string NcclMessage(ncclResult_t result) {
  const char* last = ncclGetLastError(nullptr);
  return std::string(ncclGetErrorString(result)) +
         (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : "");
}

std::string Elements(const Tensor& t) {
  return tandem::internal::Concat(t.numel(), " ", DTypeName(t.dtype()), " elements");
}

}  // namespace

struct ProcessGroupNccl::Impl {
  // A collective on the GPU: finished by the thread that first sees its event complete (a
  // waiter or the watchdog), or failed by the watchdog.
  class NcclWork final : public Work {
   public:
    NcclWork(Impl* impl, std::string description) : Work(std::move(description)), impl_(impl) {}
    // Finishes the work unless another thread has; returns whether this call did.
    bool TryFinish(std::exception_ptr error) {
      if (claimed_.exchange(true)) return false;
      Finish(std::move(error));
      return true;
    }
    Event done;            // recorded on the side stream after the collective
    int64_t sequence = 0;  // 1 for the group's first collective
    Clock::time_point deadline;

   private:
    void RunIfNotStarted() override { impl_->WaitOnCaller(*this); }
    Impl* const impl_;  // the group's destructor waits for its collectives
    std::atomic<bool> claimed_{false};
  };

  // The watchdog looks at the oldest collective this often (and at once when one is issued):
  // the resolution of the timeout, and how soon a peer's question about a hang is answered
  // (askers wait a second).
  static constexpr std::chrono::milliseconds kWatchdogPoll{10};
  // A thread in wait() polls the event itself this often: its core is idle meanwhile.
  static constexpr std::chrono::microseconds kCallerPoll{50};
  // How long a rank whose collective timed out waits for the others to answer.
  static constexpr std::chrono::seconds kAnswerWait{1};

  ncclComm_t comm = nullptr;  // null once aborted
  int rank = 0;
  int size = 1;
  Device device;
  ProcessGroupNcclOptions options;
  std::string prefix;  // "ProcessGroupNccl rank 0 of 2 on cuda:0: "
  // Over a ProcessGroupMpi bootstrap: names the ranks that did not answer. Used by the
  // watchdog alone.
  std::unique_ptr<internal::HangDiagnosis> diagnosis;

  std::mutex mutex;  // guards what follows, and comm once the watchdog runs
  std::condition_variable watchdog_cv;
  std::condition_variable caller_cv;              // the watchdog failed a collective
  std::deque<std::shared_ptr<NcclWork>> pending;  // issued, not yet seen finished, in order
  int64_t issued_count = 0;
  std::string failure;  // the first error; the communicator is aborted and the group unusable
  bool stop = false;
  std::thread watchdog;

  void Check(ncclResult_t result, const char* call, const std::string& what) const {
    TANDEM_CHECK(result == ncclSuccess, prefix, what, " failed: ", call, ": ", NcclMessage(result));
  }

  void CheckTensor(const Tensor& t, const char* collective, const char* role) const {
    TANDEM_CHECK(t.defined(), prefix, collective, ": the ", role, " tensor is undefined");
    TANDEM_CHECK(t.device() == device, prefix, collective, " takes tensors on ", device,
                 " (this group's device) but the ", role, " tensor is on ", t.device(),
                 "; move it there (or use ProcessGroupMpi for CPU tensors)");
    TANDEM_CHECK(t.numel() == 0 || t.is_contiguous(), prefix, collective, ": the ", role,
                 " tensor must be contiguous; call .contiguous() and copy the result back");
  }

  // Refuses a collective after a failure. Called with `mutex` held.
  void CheckUsable(const std::string& description) const {
    TANDEM_CHECK(failure.empty(), prefix, "cannot run ", description,
                 ": the group failed earlier and its NCCL communicator was aborted: ", failure,
                 "; create a new group to go on");
  }

  // Issues `collective(stream, side)` on the device's side stream, ordered after the current
  // stream's work so far and before its later work, and hands it to the watchdog. An empty
  // collective (`run` false) moves nothing and no peer waits for it: its work is complete.
  template <typename F>
  std::shared_ptr<Work> Issue(std::string description, bool run, F&& collective) {
    auto work = std::make_shared<NcclWork>(this, std::move(description));
    {
      // Under the lock, so that the watchdog cannot abort the communicator during the call.
      std::lock_guard<std::mutex> lock(mutex);
      CheckUsable(work->description());
      if (!run) {
        work->Start();
        work->TryFinish(nullptr);
        return work;
      }
      const Stream current = CurrentStream(device);
      const Stream side = SideStream(device);
      OnDevice(*work, [&] { side.Wait(current); });
      collective(static_cast<cudaStream_t>(cuda::StreamHandle(side)), side);
      OnDevice(*work, [&] {
        work->done.Record(side);
        current.Wait(side);
      });
      work->sequence = ++issued_count;
      work->deadline = work->Start() + options.timeout();
      pending.push_back(work);
    }
    watchdog_cv.notify_one();
    return work;
  }

  // Runs a stream call of Issue's. A device that failed (an NCCL kernel that a peer's abort
  // ended fails as a launch, which CUDA keeps) fails every later call on it, possibly the very
  // collective being issued, before the watchdog has seen anything: the error then names the
  // collective and NCCL's reason, if it has one. Called with `mutex` held.
  template <typename F>
  void OnDevice(const NcclWork& work, F&& call) const {
    try {
      call();
    } catch (const Error& e) {
      const std::string nccl = comm != nullptr ? AsyncError() : "";
      TANDEM_FAIL(prefix, work.description(), " could not be issued: ", e.what(),
                  nccl.empty() ? "" : "; NCCL reports " + nccl);
    }
  }

  // Called by wait() before it blocks: polls the collective's event until it has finished
  // (and finishes the work) or the watchdog has failed it. An error of the event is left to
  // the watchdog, which aborts the communicator and fails the work, so that a rank's error
  // names the timeout rather than a peer's abort whichever thread sees the event first.
  void WaitOnCaller(NcclWork& work) {
    std::unique_lock<std::mutex> lock(mutex);
    while (!work.is_completed()) {
      lock.unlock();
      bool ready = false;
      try {
        ready = work.done.Query();
      } catch (const std::exception&) {
        return;
      }
      lock.lock();
      if (ready) {
        // Unless NCCL failed (a peer's abort ends the collective early): the watchdog says so.
        if (comm != nullptr && AsyncError().empty()) work.TryFinish(nullptr);
        return;
      }
      caller_cv.wait_for(lock, kCallerPoll);
    }
  }

  // NCCL's asynchronous error of the communicator (a peer's abort, a network failure), or "".
  // Called by the watchdog, or with `mutex` held.
  std::string AsyncError() const {
    ncclResult_t error = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &error) != ncclSuccess || error == ncclSuccess) return "";
    return NcclMessage(error);
  }

  // Aborts the communicator and fails every pending collective: `first` with `message`, the
  // later ones as not completed. Called by the watchdog with `lock` held; returns with it held.
  void FailAll(std::unique_lock<std::mutex>& lock, const std::shared_ptr<NcclWork>& first,
               const std::string& message) {
    if (failure.empty()) failure = message;
    if (comm != nullptr) {
      ncclCommAbort(comm);  // the GPU's waits for the peers end; its result changes nothing
      comm = nullptr;
    }
    std::deque<std::shared_ptr<NcclWork>> failed;
    failed.swap(pending);
    lock.unlock();
    first->TryFinish(std::make_exception_ptr(Error(message)));
    for (const std::shared_ptr<NcclWork>& work : failed) {
      if (work == first) continue;
      work->TryFinish(std::make_exception_ptr(
          Error(prefix + work->description() +
                " was not completed: the group failed earlier: " + message)));
    }
    lock.lock();
    caller_cv.notify_all();
  }

  // What the error of a timed-out collective says about the other ranks.
  std::string WhoWaits(const NcclWork& work) {
    if (diagnosis) {
      return diagnosis->AskWhoWaits(work.sequence, work.description(),
                                    std::min<Clock::duration>(kAnswerWait, options.timeout()));
    }
    if (size == 1) return "this is the group's only rank, so its GPU did not finish the collective";
    return "no rank could be asked which collective it waits in (the group has no "
           "ProcessGroupMpi bootstrap; pass one to have the ranks that did not answer named)";
  }

  // The watchdog: looks at the pending collectives in issue order (one finishes after those
  // before it), finishes those whose event has completed, and fails the group at the first
  // that failed on the GPU or outlived its deadline. Meanwhile it answers other ranks'
  // questions about the oldest one (see HangDiagnosis).
  void Watch() {
    profiler::SetThreadName(tandem::internal::Concat("ProcessGroupNccl rank ", rank, " watchdog"));
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      if (pending.empty()) {
        if (stop) return;
        watchdog_cv.wait(lock);
        continue;
      }
      while (!pending.empty()) {
        const std::shared_ptr<NcclWork> work = pending.front();
        if (work->is_completed()) {  // its waiter saw it finish
          pending.pop_front();
          continue;
        }
        lock.unlock();
        bool ready = false;
        std::string gpu_error;
        try {
          ready = work->done.Query();
        } catch (const std::exception& e) {
          gpu_error = e.what();
        }
        // Only this thread aborts the communicator: it reads it without the lock.
        const std::string nccl_error = gpu_error.empty() ? AsyncError() : "";
        std::string message;
        if (ready && nccl_error.empty()) {
          work->TryFinish(nullptr);
        } else if (Clock::now() > work->deadline) {
          message = internal::TimeoutMessage(prefix, work->description(), options.timeout(),
                                             options.timeout_name(), WhoWaits(*work));
        } else if (!gpu_error.empty()) {
          message = tandem::internal::Concat(prefix, work->description(),
                                             " failed on the GPU: ", gpu_error);
        } else if (!nccl_error.empty()) {
          message = tandem::internal::Concat(prefix, work->description(), " failed: NCCL reports ",
                                             nccl_error);
        } else if (diagnosis) {
          diagnosis->AnswerQuestions(work->sequence, work->description());
        }
        lock.lock();
        if (!message.empty()) {
          if (diagnosis) diagnosis->Abandon();
          FailAll(lock, work, message);
        } else if (ready && nccl_error.empty()) {
          if (!pending.empty() && pending.front() == work) pending.pop_front();
        } else {
          break;
        }
      }
      if (!pending.empty()) watchdog_cv.wait_for(lock, kWatchdogPoll);
    }
  }
};

ProcessGroupNccl::ProcessGroupNccl(Device device, std::shared_ptr<ProcessGroup> bootstrap,
                                   ProcessGroupNcclOptions options)
    : ProcessGroupNccl(device, options, [&] {
        TANDEM_CHECK(device.is_cuda(), "ProcessGroupNccl needs a CUDA device but got ", device,
                     "; use ProcessGroupMpi for CPU tensors");
        TANDEM_CHECK(options.timeout().count() > 0,
                     "ProcessGroupNccl: the timeout must be positive but is ",
                     options.timeout().count(), " ms");
        TANDEM_CHECK(cuda::IsAvailable() && device.index() < cuda::DeviceCount(),
                     "ProcessGroupNccl: ", device, " is not available",
                     cuda::IsAvailable() ? "" : ": ", cuda::UnavailableReason());
        auto impl = std::make_unique<Impl>();
        impl->rank = bootstrap ? bootstrap->rank() : 0;
        impl->size = bootstrap ? bootstrap->size() : 1;
        impl->device = device;
        impl->options = options;
        impl->prefix = tandem::internal::Concat("ProcessGroupNccl rank ", impl->rank, " of ",
                                                impl->size, " on ", device, ": ");
        // Rank 0's unique id reaches every rank through the bootstrap group (as int64s).
        ncclUniqueId id;
        std::memset(&id, 0, sizeof(id));
        if (impl->rank == 0) impl->Check(ncclGetUniqueId(&id), "ncclGetUniqueId", "setup");
        if (bootstrap && impl->size > 1) {
          constexpr int64_t kWords = (sizeof(ncclUniqueId) + 7) / 8;
          std::vector<int64_t> words(kWords, 0);
          std::memcpy(words.data(), &id, sizeof(id));
          Tensor packed = from_vector(words, {kWords});
          bootstrap->broadcast(packed, 0)->wait();
          words = packed.to_vector<int64_t>();
          std::memcpy(&id, words.data(), sizeof(id));
          // ProcessGroupMpi's ranks are MPI_COMM_WORLD's, which the diagnosis asks.
          if (bootstrap->backend() == "mpi") {
            impl->diagnosis = std::make_unique<internal::HangDiagnosis>("ProcessGroupNccl");
            TANDEM_CHECK(
                impl->diagnosis->rank() == impl->rank && impl->diagnosis->size() == impl->size,
                impl->prefix,
                "the bootstrap group's ranks must be MPI_COMM_WORLD's, but "
                "this is rank ",
                impl->diagnosis->rank(), " of ", impl->diagnosis->size(),
                " there; bootstrap over a ProcessGroupMpi");
          }
        }
        const cudaError_t set = cudaSetDevice(cuda::PhysicalDevice(device.index()));
        TANDEM_CHECK(set == cudaSuccess, impl->prefix,
                     "cudaSetDevice failed: ", cudaGetErrorString(set));
        impl->Check(ncclCommInitRank(&impl->comm, impl->size, id, impl->rank), "ncclCommInitRank",
                    "communicator creation");
        return impl;
      }()) {}

ProcessGroupNccl::ProcessGroupNccl(Device device, ProcessGroupNcclOptions options,
                                   std::unique_ptr<Impl> impl)
    : ProcessGroup(impl->rank, impl->size),
      device_(device),
      options_(std::move(options)),
      impl_(std::move(impl)) {
  impl_->watchdog = std::thread([impl = impl_.get()] { impl->Watch(); });
}

ProcessGroupNccl::~ProcessGroupNccl() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stop = true;
  }
  impl_->watchdog_cv.notify_all();
  impl_->watchdog.join();
  // Every collective has finished or the communicator was aborted.
  if (impl_->comm != nullptr) ncclCommDestroy(impl_->comm);
}

std::shared_ptr<Work> ProcessGroupNccl::allreduce(Tensor tensor, ReduceOp op) {
  impl_->CheckTensor(tensor, "allreduce", "");
  TANDEM_CHECK(tensor.dtype() != kBool, impl_->prefix,
               "allreduce of bool tensors is not defined; convert to uint8 or int32 first");
  // NCCL's bfloat16 and float16 sums add in float32 but round each partial sum of its ring.
  TANDEM_CHECK(op != ReduceOp::kAverage || IsFloatingPoint(tensor.dtype()), impl_->prefix,
               "allreduce: average is defined for floating-point tensors but this one is ",
               tensor.dtype(), "; use ReduceOp::kSum");
  std::string what =
      tandem::internal::Concat("allreduce (", ReduceOpName(op), ") of ", Elements(tensor));
  return impl_->Issue(std::move(what), tensor.numel() > 0, [&](cudaStream_t stream, Stream side) {
    impl_->Check(ncclAllReduce(tensor.raw_data(), tensor.raw_data(),
                               static_cast<size_t>(tensor.numel()), NcclType(tensor.dtype()),
                               op == ReduceOp::kSum ? ncclSum : ncclAvg, impl_->comm, stream),
                 "ncclAllReduce", "allreduce");
    RecordStream(tensor, side);
  });
}

std::shared_ptr<Work> ProcessGroupNccl::broadcast(Tensor tensor, int root) {
  impl_->CheckTensor(tensor, "broadcast", "");
  TANDEM_CHECK(root >= 0 && root < size(), impl_->prefix, "broadcast: root must be a rank in [0, ",
               size(), ") but is ", root);
  std::string what =
      tandem::internal::Concat("broadcast from rank ", root, " of ", Elements(tensor));
  return impl_->Issue(std::move(what), tensor.numel() > 0, [&](cudaStream_t stream, Stream side) {
    impl_->Check(
        ncclBroadcast(tensor.raw_data(), tensor.raw_data(), static_cast<size_t>(tensor.numel()),
                      NcclType(tensor.dtype()), root, impl_->comm, stream),
        "ncclBroadcast", "broadcast");
    RecordStream(tensor, side);
  });
}

std::shared_ptr<Work> ProcessGroupNccl::allgather(Tensor output, Tensor input) {
  impl_->CheckTensor(input, "allgather", "input");
  impl_->CheckTensor(output, "allgather", "output");
  TANDEM_CHECK(output.dtype() == input.dtype(), impl_->prefix,
               "allgather: the output must have the input's dtype, but the input is ",
               input.dtype(), " and the output ", output.dtype(),
               "; convert one of them with .to(dtype)");
  TANDEM_CHECK(output.numel() == input.numel() * size(), impl_->prefix,
               "allgather: the output must hold world size x input = ", size(), " x ",
               input.numel(), " = ", input.numel() * size(), " elements but holds ", output.numel(),
               "; make it empty({world size * input.numel()})");
  std::string what = tandem::internal::Concat("allgather of ", Elements(input));
  return impl_->Issue(std::move(what), input.numel() > 0, [&](cudaStream_t stream, Stream side) {
    impl_->Check(
        ncclAllGather(input.raw_data(), output.raw_data(), static_cast<size_t>(input.numel()),
                      NcclType(input.dtype()), impl_->comm, stream),
        "ncclAllGather", "allgather");
    RecordStream(input, side);
    RecordStream(output, side);
  });
}

std::shared_ptr<Work> ProcessGroupNccl::reduce_scatter(Tensor output, Tensor input, ReduceOp op) {
  impl_->CheckTensor(input, "reduce_scatter", "input");
  impl_->CheckTensor(output, "reduce_scatter", "output");
  const DType dtype = input.dtype();
  TANDEM_CHECK(output.dtype() == dtype, impl_->prefix,
               "reduce_scatter: the output must have the input's dtype, but the input is ", dtype,
               " and the output ", output.dtype(), "; convert one of them with .to(dtype)");
  TANDEM_CHECK(dtype != kBool, impl_->prefix,
               "reduce_scatter of bool tensors is not defined; convert to uint8 or int32 first");
  TANDEM_CHECK(op != ReduceOp::kAverage || IsFloatingPoint(dtype), impl_->prefix,
               "reduce_scatter: average is defined for floating-point tensors but these are ",
               dtype, "; use ReduceOp::kSum");
  const int world = size();
  const int64_t chunk = output.numel();
  TANDEM_CHECK(input.numel() == chunk * world, impl_->prefix,
               "reduce_scatter: the input must hold world size x output = ", world, " x ", chunk,
               " = ", chunk * world, " elements but holds ", input.numel(),
               input.numel() % world == 0
                   ? tandem::internal::Concat("; make the output input.numel() / world size = ",
                                              input.numel() / world, " elements")
                   : tandem::internal::Concat(", not a multiple of the world size; pad the "
                                              "input to a multiple of ",
                                              world, " elements"));
  // NCCL reduces in place only into the input's own chunk (recvbuff == sendbuff + rank *
  // recvcount); any other overlap would read what it has already written.
  TANDEM_CHECK(!output.shares_storage_with(input), impl_->prefix,
               "reduce_scatter: the output must not share storage with the input; reduce into a "
               "tensor of its own");
  std::string what = tandem::internal::Concat("reduce_scatter (", ReduceOpName(op), ") of ",
                                              Elements(input), ", ", chunk, " per rank");
  return impl_->Issue(std::move(what), chunk > 0, [&](cudaStream_t stream, Stream side) {
    impl_->Check(ncclReduceScatter(input.raw_data(), output.raw_data(), static_cast<size_t>(chunk),
                                   NcclType(dtype), op == ReduceOp::kSum ? ncclSum : ncclAvg,
                                   impl_->comm, stream),
                 "ncclReduceScatter", "reduce_scatter");
    RecordStream(input, side);
    RecordStream(output, side);
  });
}

std::shared_ptr<Work> ProcessGroupNccl::barrier() {
  {
    // Before allocating on the device, which an aborted collective may have left failed.
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->CheckUsable("barrier");
  }
  Tensor one = ones({1}, TensorOptions().device(device_));
  return impl_->Issue("barrier", true, [&](cudaStream_t stream, Stream side) {
    impl_->Check(
        ncclAllReduce(one.raw_data(), one.raw_data(), 1, ncclFloat32, ncclSum, impl_->comm, stream),
        "ncclAllReduce", "barrier");
    RecordStream(one, side);
  });
}

}  // namespace tandem::parallel::distributed
